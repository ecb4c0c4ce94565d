"""`mtpc train`, setting up: the checks of its settings (`TrainConfig`, in `config`), and the model pieces the
loop trains (`DraftModel`: the LM's draft path feeding the head; the backbone with its LoRA; the head,
fresh or continued from `--init-head`).

Everything a user can get wrong is checked by `check_inputs` before the model and the data are loaded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.profiler import record_function

from .. import checks
from ..lm import loading, lora
from ..errors import InputError
from ..heads.kl_loss import kl_loss, lm_teacher
from ..heads.nll_loss import mtp_loss
from .config import LOSSES, TrainConfig
from .precision import autocast

# ------------------------------------------------------------------ model pieces


class DraftModel(nn.Module):
    """The LM's draft path (LoRA adapters enabled, if any) feeding the MTP head; `forward` returns
    the loss pieces of a batch so that DistributedDataParallel can wrap the whole computation."""

    def __init__(self, lm: nn.Module, head: nn.Module, gamma: float, chunk_elements: int, amp: torch.dtype | None,
                 loss: str = "nll"):
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")
        self.lm, self.head = lm, head
        self.gamma, self.chunk_elements, self.amp, self.loss = gamma, chunk_elements, amp, loss
        self.trains_lm = any(p.requires_grad for p in lm.parameters())

    @property
    def base(self) -> nn.Module:
        """The causal LM itself (a peft model's base, its LoRA modules injected into it)."""
        return self.lm.get_base_model() if hasattr(self.lm, "get_base_model") else self.lm

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """`[B, T, d]` final-norm hidden states of the draft path."""
        with torch.set_grad_enabled(self.trains_lm and torch.is_grad_enabled()), autocast(tokens.device, self.amp):
            return self.base.get_decoder()(input_ids=tokens).last_hidden_state

    def hidden_from_inner(self, inner: torch.Tensor) -> torch.Tensor:
        """`[B, T, d]` the draft path's final-norm hidden states from `inner` `[B, T, d]`, the cached input of
        its LoRA layers (`mtpc features --draft-layers k`): only those `k` layers run, adapters on."""
        k = lora.lora_depth(self.lm)
        if not k:
            raise ValueError("inner-layer features need a LoRA draft path (--lora-layers k)")
        with torch.set_grad_enabled(self.trains_lm and torch.is_grad_enabled()), autocast(inner.device, self.amp):
            return run_last_layers(self.base, inner, k)

    def draft_hidden(self, tokens: torch.Tensor, hidden: torch.Tensor | None = None,
                     inner: torch.Tensor | None = None) -> torch.Tensor:
        """`[B, T, d]` the head's hidden states of a batch: from the cached input of the LoRA layers
        (`inner`), else the cached final states (`hidden`: the frozen LM's, no adapters), else the live LM."""
        if inner is not None:
            return self.hidden_from_inner(inner)
        return self.hidden(tokens) if hidden is None else hidden

    def teacher_hidden(self, tokens: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
        """`[B, T, d]` the verifier path's final hidden states: the draft path's own when it has no
        adapters, else a second forward with the adapters disabled (the LM's true distributions)."""
        if not hasattr(self.lm, "disable_adapter"):
            return draft.detach()
        base = self.lm.get_base_model()
        with torch.no_grad(), self.lm.disable_adapter(), autocast(tokens.device, self.amp), \
                record_function("mtpc.teacher_lm_forward"):
            return base.get_decoder()(input_ids=tokens).last_hidden_state

    def teacher(self, tokens: torch.Tensor, draft: torch.Tensor, verifier: torch.Tensor | None = None):
        """The KL loss's teacher: flat positions -> the verifier's logits, as the model's own forward
        computes them from its final hidden states (`OutputLayer`: Gemma's soft-capping included), over
        the head's draft vocabulary when it has one (the LM renormalised over the tokens it drafts).
        `verifier` `[B, T, d]`: those final states when cached (`mtpc features`), else computed here."""
        from ..lm.families import OutputLayer

        hidden = self.teacher_hidden(tokens, draft) if verifier is None else verifier
        return lm_teacher(OutputLayer(self.base, rows=self.head.state_tokens), hidden)

    def head_input(self, h: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """`[B, T, d]` what the head reads at each position: `h`, with the embedding of the window's first
        token's state `states[:, t + 1]` when the head reads it (the last position's window has no targets)."""
        following = torch.cat([states[:, 1:], states[:, -1:]], 1)  # [B, T]
        return self.head.with_first_token(h, following)

    def forward(self, tokens, doc_ids, loss_mask, normalizer, window_mask=None, hidden=None, inner=None):
        """The loss pieces of a batch; `hidden` `[B, T, d]`: the LM's cached final hidden states of
        `tokens` (`mtpc features`), which stand in for the LM's forward: the head's input and the KL
        teacher's; with `inner` `[B, T, d]` (`--draft-layers k`), the cached input of the LoRA layers, from
        which the draft path runs its last k layers for the head, `hidden` staying the teacher's."""
        with record_function("mtpc.lm_forward"):  # phase labels: benchmarks/bench_train_step.py
            h = self.draft_hidden(tokens, hidden, inner)  # [B, T, d]
        states = self.head.states_of(tokens)  # [B, T]: a token outside a draft vocabulary is no valid target
        kwargs = dict(gamma=self.gamma, normalizer=normalizer, window_mask=window_mask,
                      chunk_elements=self.chunk_elements, first_given=self.head.reads_first_token)
        with autocast(tokens.device, self.amp), record_function("mtpc.loss"):
            # the head reads its input in its own dtype, whatever the LM's (--dtype) or the store's (mtpc features
            # --dtype) is: autocast leaves float64 as it is, so fp64 states would meet fp32 or bf16 weights; the
            # teacher reads `h` as it came (`lm_teacher` casts it to the output layer's dtype)
            x = self.head_input(h.to(self.head.dtype), states)  # [B, T, d]
            nll = mtp_loss(self.head, x, states, doc_ids, loss_mask, **kwargs) if "nll" in self.loss else None
            if "kl" in self.loss or self.loss == "tv":
                kl = kl_loss(self.head, x, self.teacher(tokens, h, hidden), states, doc_ids, loss_mask,
                             divergence="tv" if self.loss == "tv" else "kl", **kwargs)
        if self.loss == "nll":
            return nll.loss, nll.term_sums, nll.counts
        if self.loss in ("kl", "tv"):
            return kl.loss, kl.term_sums, kl.counts
        return nll.loss + kl.loss, nll.term_sums, nll.counts


def run_last_layers(model: nn.Module, inner: torch.Tensor, k: int) -> torch.Tensor:
    """`[B, T, d]` the final-norm hidden states of causal LM `model` from `inner` `[B, T, d]`, the input of
    its last `k` decoder layers, for sequences at positions 0..T-1 under plain causal attention (how
    `mtpc features` ran them: `features.INNER_POSITIONS`). The layers are called as the split backbone
    calls them (`mtpc.lm.families`: the family's rotary embedding and causal masks, no cache), so
    whatever adapters are enabled in them run."""
    from ..lm.families import split_family

    family = split_family(model.config, "training from inner-layer features")
    parts = family.parts(model)
    n = len(parts.layers)
    positions = torch.arange(inner.shape[1], device=inner.device)[None]  # [1, T]
    h = inner.to(model.dtype)  # a store of another --dtype than the LM's: the layers read their own
    masks = family.masks(model.config, h, None, positions, n)
    rotary = family.position_embeddings(model.config, parts, h, positions, n)
    for i in range(n - k, n):
        h = family.call_layer(parts.layers[i], h, masks[i], rotary[i], positions, None)  # [B, T, d]
    return parts.norm(h)


def load_lm(cfg: TrainConfig, device: torch.device):
    """The frozen backbone, with LoRA adapters when asked (fresh, or the init head's)."""
    # the vocabulary was judged against the head by `check_inputs` (`vocabulary_choice`)
    model, _ = loading.open_model(cfg.model, allow_non_byte_vocab=True, dtype=loading.torch_dtype(cfg.dtype),
                                  trust_remote_code=cfg.trust_remote_code)
    previous = init_adapter(cfg)
    if previous is not None:
        model = lora.load_lora(model, previous, trainable=True)
    elif cfg.lora_layers > 0:
        model = lora.attach_draft_lora(model, cfg.lora_layers, rank=cfg.lora_rank, alpha=cfg.lora_alpha)
    return model.to(device)


def init_adapter(cfg: TrainConfig) -> Path | None:
    """The init head's LoRA adapter folder, if it has one."""
    return lora.head_lora_folder(cfg.init_head) if cfg.init_head else None


def load_init_head(cfg: TrainConfig):
    """The `--init-head` head (an `InputError` for a folder that is not one)."""
    from safetensors import SafetensorError

    from ..heads.head import load_head

    folder = loading.head_folder(cfg.init_head)
    try:
        return load_head(folder)
    except (ValueError, KeyError, OSError, SafetensorError) as e:
        raise InputError(f"--init-head {cfg.init_head}: {e}") from None


def build_head(cfg: TrainConfig, lm: nn.Module, device: torch.device, graph, init=None, vocabulary=None):
    """`init` (the `--init-head` head) continued, or a fresh head over `graph` initialised from the LM head
    (over the draft `vocabulary`'s token ids when given)."""
    from ..heads.head import MTPHead

    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    output = base.get_output_embeddings()
    if init is not None:
        head = init.float().to(device)
        if cfg.first_token or cfg.first_token_mlp:
            head.read_first_token(cfg.first_token_mlp)
        return head.tie_to(output) if head.parameterisation == "tied" else head
    # a tied head references the output layer itself (its bias too); the others copy rows of its weight
    unembed = output if cfg.parameterisation == "tied" else output.weight.detach()  # [V, d]
    head = MTPHead(graph, output.weight.shape[1], init_from=unembed, sum_init_std=cfg.sum_init_std,
                   parameterisation=cfg.parameterisation, adapter_rank=cfg.adapter_rank,
                   factor_rank=cfg.factor_rank, first_token=cfg.first_token,
                   first_token_mlp=cfg.first_token_mlp, vocabulary=vocabulary)
    return head.to(device)


# ------------------------------------------------------------------ checks

SUBWORD_PARAMETERISATIONS = ("tied",)  # heads whose size does not grow with the vocabulary


@dataclass(frozen=True)
class VocabularyChoice:
    """How the head reads the model's vocabulary: `subword` (the model's own tokenizer, a head that
    suits any vocabulary) or bytes; `line` says which and why (None for a byte-level model)."""

    subword: bool
    line: str | None


def vocabulary_choice(cfg: TrainConfig, info, init=None) -> VocabularyChoice:
    """A byte-level model trains any head on bytes. A subword model trains a head whose
    parameterisation suits its vocabulary (`tied`: the LM's own output layer, not copied) on its own
    tokenizer's ids; with `--allow-non-byte-vocab` any head on ids 0..255 taken as bytes; otherwise
    it is refused with the fix."""
    parameterisation = init.parameterisation if init is not None else cfg.parameterisation
    if info.byte_level:
        return VocabularyChoice(False, None)
    vocab = f"{info.vocab_size:,}-token vocabulary"
    if cfg.allow_non_byte_vocab:
        return VocabularyChoice(False, f"mtpc train: a {parameterisation} head over token ids 0..255 read as bytes "
                                       f"(--allow-non-byte-vocab; {cfg.model} has a {vocab} that is not byte-level)")
    if parameterisation in SUBWORD_PARAMETERISATIONS:
        text = "--features holds the model's own tokens" if cfg.features else \
            "--data is tokenized with the model's own tokenizer"
        return VocabularyChoice(True, f"mtpc train: a {parameterisation} head for the {vocab} of {cfg.model} (not "
                                      "byte-level), because a tied head reads the LM's own output layer (not copied) "
                                      f"behind small hidden-space adapters, so its size does not grow with the "
                                      f"vocabulary; {text}")
    raise InputError(f"{cfg.model}: a {vocab} without {loading.TOKENIZER_FILE} is not byte-level, and a "
                     f"{parameterisation} head copies an unembedding row per token; use --parameterisation tied "
                     "(the LM's own output layer: any vocabulary), or pass --allow-non-byte-vocab to take token "
                     "ids 0..255 as bytes")



def check_lora_family(cfg: TrainConfig, info) -> None:
    """A LoRA draft path runs the split layer loop, which needs the family's adapter."""
    from ..lm.families import FAMILIES, has_adapter

    if cfg.lora_layers > 0 and not has_adapter(info.model_type):
        raise InputError(f"--lora-layers {cfg.lora_layers}: no split-backbone adapter for model_type "
                         f"{info.model_type!r} (known: {', '.join(sorted(FAMILIES))}); use --lora-layers 0, or add a "
                         "BackboneFamily in mtpc/lm/families.py")


def check_inputs(cfg: TrainConfig, init, world: int):
    """Check settings, files and how they fit together; returns the circuit's region graph. `init` is
    the `--init-head` head (or None); `world` the number of processes. Sets `cfg.lora_layers` to the
    init head's adapter depth when it has one."""
    import circuitc

    check_numbers(cfg)
    per = cfg.grad_accum * world
    if cfg.batch_size % per:
        raise InputError(f"--batch-size {cfg.batch_size} must be divisible by --grad-accum x world size = {per}")
    checks.output_folder(cfg.out)
    checks.data_source(cfg.data)
    info = loading.model_info(cfg.model, allow_non_byte_vocab=True, trust_remote_code=cfg.trust_remote_code)
    if cfg.features is not None:
        check_features(cfg, init, info)
    vocabulary_choice(cfg, info, init)  # a vocabulary the head's parameterisation does not suit is refused here
    check_lora_family(cfg, info)
    graph = None
    if cfg.circuit is not None:
        graph = circuitc.load_graph(cfg.circuit, **circuit_bindings(cfg))
    elif cfg.bindings:
        raise InputError(f"-D {', '.join(cfg.bindings)} given without --circuit")
    if init is not None:
        checks.hidden_sizes_match(init.hidden_size, info.hidden_size, cfg.init_head, cfg.model)
        if graph is not None and graph_digest(graph) != graph_digest(init.graph):
            raise InputError(f"--circuit differs from the circuit of the head in {cfg.init_head} (omit --circuit "
                             "to continue that head)")
        graph = init.graph
        adapter = init_adapter(cfg)
        k = lora.adapter_layers(adapter) if adapter is not None else 0
        if adapter is not None and cfg.lora_layers and cfg.lora_layers != k:
            raise InputError(f"{cfg.init_head} carries LoRA on the last {k} layers; --lora-layers "
                             f"{cfg.lora_layers} would change them (omit it, or start from a head without an "
                             "adapter)")
        cfg.lora_layers = k or cfg.lora_layers
    if graph is None:
        raise InputError("give --circuit (or --init-head to continue from a trained head)")
    check_draft_vocabulary(cfg, graph, init, info)
    if cfg.draft_vocab is None and (init is None or init.vocabulary is None):
        checks.states_fit_vocabulary(graph.states, info.vocab_size, f"--circuit with model {cfg.model}")
    check_step_memory(cfg, graph, info.hidden_size, world, init)
    config = loading.model_config(info.path)
    context = config.get("max_position_embeddings")
    if context and cfg.seq_len > context:
        raise InputError(f"--seq-len {cfg.seq_len} is more than the {context} positions the model has")
    layers = config.get("num_hidden_layers")
    if isinstance(layers, int) and cfg.lora_layers > layers:
        raise InputError(f"--lora-layers {cfg.lora_layers} is more than the model's {layers} decoder layers")
    return graph


def step_memory(cfg: TrainConfig, graph, hidden: int, world: int, full: bool) -> dict[str, int]:
    """Bytes one training step cannot do without, a lower bound read from the circuit's parameter
    count before anything is built: the collated batch (int64 tokens and document ids, a bool mask:
    17 bytes a token), the float32 sum logits of one rank's micro-batch (every position's `S`; the
    input logits are chunked, so they are not counted), and a full head's weights `[P, d + 1]` with
    their gradient and two AdamW moments (the other parameterisations share theirs: not counted)."""
    from circuitc.limits import compiled_size

    params = compiled_size(graph).parameters  # P
    inputs = sum(r.units * graph.states for rid, r in graph.regions.items()
                 if not any(p.parent == rid for p in graph.partitions))
    micro_tokens = cfg.batch_size // (cfg.grad_accum * world) * cfg.seq_len
    return {"batch": cfg.batch_size * cfg.seq_len * 17, "sum logits": micro_tokens * (params - inputs) * 4,
            "head weights": params * (hidden + 1) * 4 * 4 if full else 0}


def device_memory(device: str) -> tuple[int, str]:
    """(bytes, what) the step must fit: the GPU's memory for a CUDA device, else this machine's memory
    (physical, or the address-space limit when lower)."""
    import os
    import resource

    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        if torch.cuda.is_available():
            index = torch.device(device).index if device.startswith("cuda") else None
            return torch.cuda.get_device_properties(index or 0).total_memory, "GPU"
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return (memory if soft == resource.RLIM_INFINITY else min(memory, soft)), "machine"


def circuit_bindings(cfg: TrainConfig) -> dict:
    """The circuit's `-D` bindings; with `--draft-vocab K` and a `.pc` source, `v = K` unless `-D v=` is
    given (a graph spec or plan file is already elaborated: its `v` is checked against K instead)."""
    if cfg.draft_vocab is None or "v" in cfg.bindings or not str(cfg.circuit).endswith(".pc"):
        return dict(cfg.bindings)
    return {**cfg.bindings, "v": cfg.draft_vocab}


def check_draft_vocabulary(cfg: TrainConfig, graph, init, info) -> None:
    """`--draft-vocab K`: a circuit of `K` states, fewer than the LM's tokens, and not a second vocabulary
    for an `--init-head` head (which keeps its own)."""
    if cfg.draft_vocab is None:
        return
    if init is not None:
        raise InputError(f"--draft-vocab with --init-head: the head in {cfg.init_head} keeps its own vocabulary "
                         "(omit --draft-vocab)")
    if cfg.draft_vocab > info.vocab_size:
        raise InputError(f"--draft-vocab {cfg.draft_vocab} is more than the model's {info.vocab_size:,} tokens")
    if graph.states != cfg.draft_vocab:
        raise InputError(f"--draft-vocab {cfg.draft_vocab}, but the circuit has {graph.states} states per variable "
                         "(a .pc with `param v` takes K itself; otherwise give -D v=K, or compile the .pc with "
                         "-D v=K for a plan file)")


def check_features(cfg: TrainConfig, init, info) -> None:
    """`--features`: the cached hidden states are this frozen LM's (`info`), read at the store's sequence
    length, on the text the store was made from (its shards are checked when they are opened)."""
    from .features import check_model, read_manifest

    if cfg.data is not None:
        raise InputError("--data and --features both name the training text; the features hold their own "
                         "(mtpc features --data), so give one")
    folder = loading.readable_folder(cfg.features, "features folder (--features)")
    stored = read_manifest(folder)["settings"]
    check_model(folder, stored, info, None)
    if stored["seq_len"] != cfg.seq_len:
        raise InputError(f"--seq-len {cfg.seq_len}, but the features in {cfg.features} are of "
                         f"{stored['seq_len']}-token sequences (pass --seq-len {stored['seq_len']})")
    adapter = init_adapter(cfg) if init is not None else None
    check_inner_features(cfg, folder, stored, lora.adapter_layers(adapter) if adapter is not None else cfg.lora_layers)


def check_inner_features(cfg: TrainConfig, folder: Path, stored: dict, k: int) -> None:
    """A LoRA draft path on the last `k` layers changes their output, so it trains from the cached input
    of exactly those layers (`mtpc features --draft-layers k`), computed as it replays them; a store
    without it, or of another `k`, is refused with the command that makes the right one."""
    from .features import INNER_POSITIONS, draft_layers_of

    if not k:
        return
    path = f"--lora-layers {k}" if cfg.lora_layers else f"the LoRA adapter of {cfg.init_head}"
    command = (f"mtpc features --model {cfg.model} --out NEW_DIR --draft-layers {k} --seq-len {cfg.seq_len} (the "
               "same --data and --dtype as this store), then pass --features NEW_DIR")
    have = draft_layers_of(stored)
    if have != k:
        what = "no inner-layer features (made without --draft-layers)" if not have else \
            f"the input of the last {have} layer{'s' if have > 1 else ''}"
        raise InputError(f"{path} (a LoRA draft path) trains from the input of the LM's last {k} layer"
                         f"{'s' if k > 1 else ''}, but {folder} holds {what}; run {command}")
    if stored.get("inner_positions") != INNER_POSITIONS:
        raise InputError(f"{folder}: its inner-layer features were computed another way than mtpc train runs the "
                         f"last layers (inner_positions in its features.json); run {command}")


def check_step_memory(cfg: TrainConfig, graph, hidden: int, world: int, init=None) -> None:
    """Refuse a run whose step cannot fit the device's memory (a huge --batch-size would otherwise hang
    collating, a 1e9-parameter circuit allocate hundreds of GB before failing)."""
    parameterisation = init.parameterisation if init is not None else cfg.parameterisation
    need = step_memory(cfg, graph, hidden, world, parameterisation == "full")
    total = sum(need.values())
    memory, what = device_memory(str(cfg.device))
    if total > memory:
        parts = ", ".join(f"{name} {b / 2**30:,.1f} GiB" for name, b in need.items() if b)
        raise InputError(f"a training step needs at least {total / 2**30:,.1f} GiB ({parts}), more than this "
                         f"{what}'s {memory / 2**30:,.1f} GiB: lower --batch-size or --seq-len (or raise "
                         "--grad-accum), or use a smaller --circuit")


def check_numbers(cfg: TrainConfig) -> None:
    """The numeric settings of the Python API, checked as the command line's parser checks its flags."""
    positive = ("seq_len", "batch_size", "grad_accum", "window_stride", "val_every", "val_sequences", "val_windows",
                "save_every", "lora_rank", "adapter_rank", "factor_rank", "steps", "stop_after")
    for name in positive:
        value = getattr(cfg, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
    if not isinstance(cfg.lora_layers, int) or cfg.lora_layers < 0:
        raise InputError(f"--lora-layers must be an integer >= 0, got {cfg.lora_layers!r}")
    for name in ("lr", "lora_lr", "minutes", "grad_clip"):
        value = getattr(cfg, name)
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise InputError(f"--{name.replace('_', '-')} must be a finite number > 0, got {value!r}")
    if not (isinstance(cfg.gamma, (int, float)) and 0 < cfg.gamma <= 1):
        raise InputError(f"--gamma must be in (0, 1], got {cfg.gamma!r}")
    if cfg.steps is None and cfg.minutes is None:
        raise InputError("give --steps or --minutes")
    if cfg.loss not in LOSSES:
        raise InputError(f"--loss must be one of {', '.join(LOSSES)}, got {cfg.loss!r}")


def graph_digest(graph) -> str:
    """A digest of a region graph's structure (its JSON form), to tell circuits apart."""
    import hashlib

    return hashlib.sha256(json.dumps(graph.to_json(), sort_keys=True).encode()).hexdigest()[:16]
