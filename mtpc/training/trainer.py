"""`mtpc train`: train an MTP circuit head (and optionally LoRA adapters) on a frozen byte-level LM.

    mtpc train --model DIR --circuit FILE.pc [-D k=v]... [--data PATH] [--lora-layers k] --out DIR

- The backbone is frozen; the head (initialised from the LM head, so that it starts as the fully
  factorised product of per-position LM softmaxes) and, with `k > 0`, LoRA adapters on the last `k`
  decoder layers (peft `layers_to_transform`) are trained with AdamW, a warm-up + cosine schedule,
  gradient clipping, gradient accumulation and bf16 autocast where the hardware has it.
- The loss (`--loss`) is `nll`, the windowed likelihood of the gold bytes (`mtpc.heads.nll_loss.mtp_loss`),
  `kl`, the KL from the frozen LM's own next-byte distributions to the head's conditionals
  (`mtpc.heads.kl_loss.kl_loss`, the paper's Appendix J; the teacher is the verifier path, adapters off),
  or `nll+kl`, their plain sum (each term already weighted by gamma and averaged per window
  position, so the two are on the same per-byte nats scale). Every loss is normalised by the counts
  of the whole global batch, so gradient accumulation and data parallelism give the same update as
  one big batch.
- Under `torchrun --nproc_per_node N` the same command trains with DistributedDataParallel (NCCL on
  GPUs, gloo on CPUs); each rank takes every N-th sequence of each micro-batch.
- Validation (rank 0) reports the loss and the teacher-forced mean accepted length of the circuit's
  greedy draft on held-out windows.
- `OUT/checkpoint.pt` holds everything needed to resume exactly (trainable weights, optimizer, step
  and schedule, data position, RNG states: tensors and plain values only, loaded with
  `torch.load(weights_only=True)`, so a planted file cannot run code). Rerunning the same command
  continues from it; a command whose settings differ from the checkpoint's is refused with the list
  of differing settings, except `RESUMABLE` ones (`--steps`/`--minutes` extend or shorten the run:
  the schedule is re-stretched to the new length from the current step on).
- Inputs are checked before any slow work (`mtpc.checks`): model folder, circuit, init head, data,
  output folder. A non-finite loss or gradient stops the run with an `MtpcError` at that step,
  before the optimizer touches the weights; the last checkpoint stays as it was.
- `OUT` is self-describing: `head.safetensors` + `head.json` (graph spec; `mtpc.load_head(OUT)`),
  `lora/` (peft adapter, when `k > 0`), `train_config.json`, `train_log.jsonl`.
- Two-stage schedule: `--init-head DIR` continues from a trained head (and its adapter, if any),
  e.g. adding `--lora-layers k` in the second stage.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from .. import checks, loading
from .data import EpochSampler, PackedDataset, collate, load_documents, split_documents, target_validity, window_targets
from .distributed import Dist, all_sum as _all_sum, barrier as _barrier, init_distributed
from ..heads.kl_loss import kl_loss, lm_teacher
from ..heads.nll_loss import DEFAULT_CHUNK_ELEMENTS, mtp_loss, teacher_forced_accepted, valid_counts
from .precision import autocast, autocast_dtype
from .progress import advance, progress_bar
from .schedule import cosine_lr
from .outputs import guarded_output, save_atomically
from ..errors import InputError, MtpcError

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_FORMAT = "mtpc-train-checkpoint-2"
LORA_DIR = "lora"
LOG = "train_log.jsonl"
# Settings that may differ between a checkpoint and the command resuming it: the length of the run,
# how often it validates and saves, and presentation. Everything else must match.
RESUMABLE = ("steps", "minutes", "val_every", "save_every", "stop_after", "progress", "resume",
             "allow_non_byte_vocab")
LOSSES = ("nll", "kl", "nll+kl")


@dataclass
class TrainConfig:
    model: str
    out: str
    circuit: str | None = None  # .pc/.json path or text; optional with init_head
    bindings: dict = field(default_factory=dict)
    data: str | None = None  # None: the Python standard library sources
    lora_layers: int = 0
    lora_rank: int = 8
    lora_alpha: float = 16.0
    init_head: str | None = None  # a trained head's folder to continue from (two-stage schedule)
    seq_len: int = 512
    batch_size: int = 8  # sequences per optimizer step, over all ranks and micro-batches
    grad_accum: int = 1
    steps: int | None = None
    minutes: float | None = None  # alternatively: a time budget, turned into steps after 2 steps
    lr: float = 2e-3
    lora_lr: float = 2e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    gamma: float = 0.9
    loss: str = "nll"  # nll | kl | nll+kl (see the module docstring)
    window_stride: int = 1  # score the windows at every s-th position (shifting with the step): s x cheaper heads
    sum_init_std: float = 0.02
    parameterisation: str = "full"  # full | shared | factorised (see mtpc.heads.head)
    adapter_rank: int = 16  # shared/factorised: rank of the per-unit adapters
    factor_rank: int = 64  # factorised: rank of the per-position unembedding
    val_fraction: float = 0.02
    val_every: int = 50
    val_sequences: int = 8
    val_windows: int = 1024  # windows scored for the accepted length
    save_every: int = 50
    precision: str = "auto"  # auto | fp32 | bf16
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS
    seed: int = 0
    progress: bool = True
    resume: bool = True
    stop_after: int | None = None  # leave the run at this step with a checkpoint (pre-emptible jobs, tests)
    allow_non_byte_vocab: bool = False  # accept a model whose vocabulary is not bytes (ids 0..255 taken as bytes)


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

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """`[B, T, d]` final-norm hidden states of the draft path."""
        base = self.lm.get_base_model() if hasattr(self.lm, "get_base_model") else self.lm
        with torch.set_grad_enabled(self.trains_lm and torch.is_grad_enabled()), autocast(tokens.device, self.amp):
            return base.get_decoder()(input_ids=tokens).last_hidden_state

    def teacher_hidden(self, tokens: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
        """`[B, T, d]` the verifier path's final hidden states: the draft path's own when it has no
        adapters, else a second forward with the adapters disabled (the LM's true distributions)."""
        if not hasattr(self.lm, "disable_adapter"):
            return draft.detach()
        base = self.lm.get_base_model()
        with torch.no_grad(), self.lm.disable_adapter(), autocast(tokens.device, self.amp):
            return base.get_decoder()(input_ids=tokens).last_hidden_state

    def forward(self, tokens, doc_ids, loss_mask, normalizer, window_mask=None):
        h = self.hidden(tokens)  # [B, T, d]
        kwargs = dict(gamma=self.gamma, normalizer=normalizer, window_mask=window_mask,
                      chunk_elements=self.chunk_elements)
        with autocast(tokens.device, self.amp):
            nll = mtp_loss(self.head, h, tokens, doc_ids, loss_mask, **kwargs) if "nll" in self.loss else None
            if "kl" in self.loss:
                base = self.lm.get_base_model() if hasattr(self.lm, "get_base_model") else self.lm
                teacher = lm_teacher(base.get_output_embeddings(), self.teacher_hidden(tokens, h))
                kl = kl_loss(self.head, h, teacher, tokens, doc_ids, loss_mask, **kwargs)
        if self.loss == "nll":
            return nll.loss, nll.term_sums, nll.counts
        if self.loss == "kl":
            return kl.loss, kl.term_sums, kl.counts
        return nll.loss + kl.loss, nll.term_sums, nll.counts


def load_lm(cfg: TrainConfig, device: torch.device):
    """The frozen backbone, with LoRA adapters when asked (fresh, or the init head's)."""
    from ..decoding.backbone import attach_draft_lora

    model, _ = loading.open_model(cfg.model, allow_non_byte_vocab=cfg.allow_non_byte_vocab)
    previous = _init_adapter(cfg)
    if previous is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(previous), is_trainable=True, local_files_only=True)
    elif cfg.lora_layers > 0:
        model = attach_draft_lora(model, cfg.lora_layers, rank=cfg.lora_rank, alpha=cfg.lora_alpha)
    return model.to(device)


def _init_adapter(cfg: TrainConfig) -> Path | None:
    """The init head's LoRA adapter folder, if it has one."""
    return loading.head_lora_folder(cfg.init_head) if cfg.init_head else None


def _adapter_layers(adapter_dir: Path) -> int:
    return loading.adapter_layers(adapter_dir)


def load_init_head(cfg: TrainConfig):
    """The `--init-head` head (an `InputError` for a folder that is not one)."""
    from safetensors import SafetensorError

    from ..heads.head import load_head

    folder = loading.head_folder(cfg.init_head)
    try:
        return load_head(folder)
    except (ValueError, KeyError, OSError, SafetensorError) as e:
        raise InputError(f"--init-head {cfg.init_head}: {e}") from None


def build_head(cfg: TrainConfig, lm: nn.Module, device: torch.device, graph, init=None):
    """`init` (the `--init-head` head) continued, or a fresh head over `graph` initialised from the LM head."""
    from ..heads.head import MTPHead

    if init is not None:
        return init.float().to(device)
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    unembed = base.get_output_embeddings().weight.detach()  # [V, d]
    head = MTPHead(graph, base.config.hidden_size, init_from=unembed, sum_init_std=cfg.sum_init_std,
                   parameterisation=cfg.parameterisation, adapter_rank=cfg.adapter_rank,
                   factor_rank=cfg.factor_rank)
    return head.to(device)


# ------------------------------------------------------------------ the trainer


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg, self.d = cfg, init_distributed()
        torch.manual_seed(cfg.seed)
        self.out = Path(cfg.out)
        # Everything a user can get wrong is checked here, before the model and the data are loaded.
        self.init = load_init_head(cfg) if cfg.init_head else None
        self.graph = self._check_inputs()
        self.resume_state = self._read_checkpoint()
        self.tok = loading.byte_tokenizer(cfg.model)
        self.lm = load_lm(cfg, self.d.device)
        self.head = build_head(cfg, self.lm, self.d.device, self.graph, self.init)
        self.saved_step = self.resume_state["step"] if self.resume_state else None
        self.amp = autocast_dtype(self.d.device, cfg.precision)
        self.module = DraftModel(self.lm, self.head, cfg.gamma, cfg.chunk_elements, self.amp, cfg.loss)
        self.ddp = self._wrap(self.module)
        self.train_set, self.val_set = self._data()
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.opt = self._optimizer()
        self.sampler = EpochSampler(len(self.train_set), cfg.seed)
        self.step, self.total_steps, self.tokens, self.elapsed = 0, cfg.steps, 0, 0.0

    # -------------------------------------------------------------- setup

    def _wrap(self, module: nn.Module) -> nn.Module:
        if self.d.world == 1:
            return module
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.d.device.index] if self.d.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=ids)

    def _data(self) -> tuple[PackedDataset, PackedDataset]:
        docs, self.data_stats = load_documents(self.cfg.data, self.tok)
        train_docs, val_docs = split_documents(docs, self.cfg.val_fraction)
        L = self.cfg.seq_len
        return PackedDataset(train_docs, L, self.tok.pad_id), PackedDataset(val_docs, L, self.tok.pad_id)

    def _optimizer(self) -> torch.optim.Optimizer:
        head = [p for p in self.head.parameters() if p.requires_grad]
        lora = [p for p in self.lm.parameters() if p.requires_grad]
        groups = [{"params": head, "lr": self.cfg.lr, "base_lr": self.cfg.lr}]
        if lora:
            groups.append({"params": lora, "lr": self.cfg.lora_lr, "base_lr": self.cfg.lora_lr})
        return torch.optim.AdamW(groups, weight_decay=self.cfg.weight_decay)

    def _check_batch(self) -> None:
        per = self.cfg.grad_accum * self.d.world
        if self.cfg.batch_size % per:
            raise InputError(f"--batch-size {self.cfg.batch_size} must be divisible by --grad-accum x world size "
                             f"= {per}")

    def _check_inputs(self):
        """Check settings, files and how they fit together; returns the circuit's region graph."""
        import circuitc

        cfg = self.cfg
        _check_numbers(cfg)
        self._check_batch()
        checks.output_folder(cfg.out)
        checks.data_source(cfg.data)
        info = loading.model_info(cfg.model, allow_non_byte_vocab=cfg.allow_non_byte_vocab)
        graph = None
        if cfg.circuit is not None:
            graph = circuitc.load_graph(cfg.circuit, **cfg.bindings)
        elif cfg.bindings:
            raise InputError(f"-D {', '.join(cfg.bindings)} given without --circuit")
        if self.init is not None:
            checks.hidden_sizes_match(self.init.hidden_size, info.hidden_size, cfg.init_head, cfg.model)
            if graph is not None and _graph_digest(graph) != _graph_digest(self.init.graph):
                raise InputError(f"--circuit differs from the circuit of the head in {cfg.init_head} (omit --circuit "
                                 "to continue that head)")
            graph = self.init.graph
            adapter = _init_adapter(cfg)
            k = _adapter_layers(adapter) if adapter is not None else 0
            if adapter is not None and cfg.lora_layers and cfg.lora_layers != k:
                raise InputError(f"{cfg.init_head} carries LoRA on the last {k} layers; --lora-layers "
                                 f"{cfg.lora_layers} would change them (omit it, or start from a head without an "
                                 "adapter)")
            cfg.lora_layers = k or cfg.lora_layers
        if graph is None:
            raise InputError("give --circuit (or --init-head to continue from a trained head)")
        checks.states_fit_vocabulary(graph.states, info.vocab_size, f"--circuit with model {cfg.model}")
        config = loading.model_config(info.path)
        context = config.get("max_position_embeddings")
        if context and cfg.seq_len > context:
            raise InputError(f"--seq-len {cfg.seq_len} is more than the {context} positions the model has")
        layers = config.get("num_hidden_layers")
        if isinstance(layers, int) and cfg.lora_layers > layers:
            raise InputError(f"--lora-layers {cfg.lora_layers} is more than the model's {layers} decoder layers")
        return graph

    # -------------------------------------------------------------- one step

    def train_step(self) -> dict:
        cfg, d = self.cfg, self.d
        indices = self.sampler.take(cfg.batch_size)  # the global batch, the same on every rank
        batch = collate(self.train_set[i] for i in indices)
        n, v = self.head.num_variables, self.head.num_states
        batch["window_mask"] = self._window_mask(batch["tokens"].shape)
        normalizer = valid_counts(batch["doc_ids"], batch["loss_mask"], batch["tokens"], n, v,
                                  batch["window_mask"]).to(d.device)
        progress = self.step / self.total_steps if self.total_steps else 0.0  # unknown until a time budget is sized
        for group in self.opt.param_groups:
            group["lr"] = cosine_lr(group["base_lr"], progress, self.step, cfg.warmup_steps, cfg.min_lr_ratio)
        self.opt.zero_grad(set_to_none=True)
        micro = cfg.batch_size // cfg.grad_accum
        loss_sum = torch.zeros((), device=d.device)
        for m in range(cfg.grad_accum):
            mine = list(range(m * micro + d.rank, (m + 1) * micro, d.world))  # this rank's share
            part = {k: t[mine].to(d.device) for k, t in batch.items()}
            sync = m == cfg.grad_accum - 1 or d.world == 1
            with self._no_sync(not sync):
                loss, _, _ = self.ddp(part["tokens"], part["doc_ids"], part["loss_mask"], normalizer,
                                      part["window_mask"])
                (loss * d.world).backward()  # DDP averages over ranks; each loss is a share of the sum
            loss_sum += loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
        total = _all_sum(loss_sum, d).item()  # the same on every rank, so all ranks stop together
        if not (math.isfinite(total) and math.isfinite(float(grad_norm))):
            what = f"loss {total}" if not math.isfinite(total) else f"gradient norm {float(grad_norm)}"
            raise MtpcError(f"non-finite {what} at step {self.step + 1}; training stopped before the update. "
                            f"{self._kept()} (lower --lr, or check the model's weights and the data)")
        self.opt.step()
        self.step += 1
        self.tokens += int(batch["tokens"].numel())
        return {"step": self.step, "loss": total, "grad_norm": float(grad_norm), "lr": self.opt.param_groups[0]["lr"]}

    def _window_mask(self, shape: torch.Size) -> torch.Tensor:
        """`[B, T]`: positions `t` with `(t + step) % window_stride == 0` (all with stride 1)."""
        s = self.cfg.window_stride
        positions = torch.arange(shape[1])
        return ((positions + self.step) % s == 0).expand(shape)

    def _no_sync(self, skip: bool):
        import contextlib

        return self.ddp.no_sync() if skip and self.d.world > 1 else contextlib.nullcontext()

    # -------------------------------------------------------------- validation

    @torch.no_grad()
    def validate(self) -> dict:
        """Loss and teacher-forced mean accepted length on `val_sequences` held-out sequences spread
        evenly over the validation set, and `val_windows` of their full windows, also evenly spread."""
        cfg, n = self.cfg, self.head.num_variables
        picks = _spread(len(self.val_set), cfg.val_sequences)
        batch = {k: t.to(self.d.device) for k, t in collate(self.val_set[i] for i in picks).items()}
        self.module.eval()
        loss, _, _ = self.module(batch["tokens"], batch["doc_ids"], batch["loss_mask"], None)
        h = self.module.hidden(batch["tokens"]).float()  # [B, T, d]
        valid = target_validity(batch["doc_ids"], batch["loss_mask"], n)  # [B, T, n]
        valid &= window_targets(batch["tokens"], n, fill=-1) < self.head.num_states
        full = valid.all(-1).flatten()  # windows whose n targets all exist
        x = window_targets(batch["tokens"], n).flatten(0, 1)[full]  # [W, n]
        hw = h.flatten(0, 1)[full]  # [W, d]
        chosen = torch.tensor(_spread(len(x), cfg.val_windows), dtype=torch.long, device=x.device)
        x, hw = x[chosen], hw[chosen]
        accepted = torch.cat([teacher_forced_accepted(self.head, hw[i:i + 128], x[i:i + 128])
                              for i in range(0, len(x), 128)]) if len(x) else torch.zeros(0, dtype=torch.long)
        return {"val_loss": loss.item(), "val_accepted": accepted.float().mean().item() if len(x) else float("nan"),
                "val_windows": len(x), "val_accept_hist": torch.bincount(accepted, minlength=n + 1).tolist()}

    # -------------------------------------------------------------- checkpoints

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {k: p.detach().cpu().clone() for k, p in self.module.named_parameters() if p.requires_grad}

    def settings(self) -> dict:
        """The settings a checkpoint must share with the command resuming it (paths resolved, the
        circuit as a digest of its region graph, so a moved file or equal bindings still match)."""
        cfg = asdict(self.cfg)
        for name in (*RESUMABLE, "circuit", "bindings"):
            cfg.pop(name)
        for name in ("model", "data", "init_head"):
            if cfg[name] is not None and Path(cfg[name]).exists():
                cfg[name] = str(Path(cfg[name]).resolve())
        return {**cfg, "circuit_graph": _graph_digest(self.graph)}

    def save_checkpoint(self) -> None:
        if not self.d.main:
            return
        self._check_finite()
        state = {
            "format": CHECKPOINT_FORMAT, "step": self.step, "total_steps": self.total_steps,
            "budget": {"steps": self.cfg.steps, "minutes": self.cfg.minutes}, "tokens": self.tokens,
            "elapsed": self.elapsed, "trainable": self.trainable_state(), "optimizer": self.opt.state_dict(),
            "sampler": self.sampler.state_dict(), "rng": _rng_state(), "settings": self.settings(),
        }
        save_atomically(lambda tmp: torch.save(state, tmp), self.out / CHECKPOINT)
        self.saved_step = self.step

    def _read_checkpoint(self) -> dict | None:
        """The checkpoint to resume from (None: start afresh), loaded without unpickling code and
        checked against this command's settings."""
        path = self.out / CHECKPOINT
        if not (self.cfg.resume and path.is_file()):
            return None
        again = "pass --no-resume to start over (the checkpoint is then overwritten)"
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 -- any unreadable file is the same user-facing problem
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise InputError(f"{path} cannot be loaded as an mtpc checkpoint ({reason}); {again}") from None
        fields = {"step", "total_steps", "budget", "tokens", "elapsed", "trainable", "optimizer", "sampler", "rng",
                  "settings"}
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT or not fields <= state.keys() \
                or not isinstance(state["settings"], dict):
            raise InputError(f"{path} is not an mtpc training checkpoint of this version; {again}")
        mine, theirs = self.settings(), state["settings"]
        differing = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        if differing:
            changes = "; ".join("circuit: another region graph" if k == "circuit_graph" else
                                f"{k}: {theirs.get(k)!r} -> {mine.get(k)!r}" for k in differing)
            raise InputError(f"{path} was written with other settings ({changes}); rerun with the checkpoint's "
                             f"settings to resume, or {again} (only {', '.join(RESUMABLE[:5])} may change across "
                             "a resume)")
        if self.cfg.steps is not None and self.cfg.steps < state["step"]:
            raise InputError(f"--steps {self.cfg.steps} is below the checkpoint's step {state['step']}; give at "
                             f"least {state['step']}, or {again}")
        return state

    def load_checkpoint(self) -> bool:
        state = self.resume_state
        if state is None:
            return False
        params = dict(self.module.named_parameters())
        wanted = {k: tuple(p.shape) for k, p in params.items() if p.requires_grad}
        stored = {k: tuple(t.shape) for k, t in state["trainable"].items()}
        if wanted != stored:
            raise InputError(f"{self.out / CHECKPOINT} holds the weights of another head ({len(stored)} tensors, "
                             f"{len(wanted)} expected, or other shapes); pass --no-resume to start over")
        with torch.no_grad():
            for k, t in state["trainable"].items():
                params[k].copy_(t)
        self.opt.load_state_dict(state["optimizer"])
        self.sampler.load_state_dict(state["sampler"])
        self.step, self.tokens, self.elapsed = state["step"], state["tokens"], state["elapsed"]
        self.total_steps = self._resumed_total(state)
        _set_rng_state(state["rng"])
        return True

    def _resumed_total(self, state: dict) -> int | None:
        """The run's length after a resume: `--steps` as given now; `--minutes` as before if unchanged,
        else re-sized from the checkpoint's time per step (unknown before step 2)."""
        cfg = self.cfg
        if cfg.steps is not None:
            return cfg.steps
        if cfg.minutes == state["budget"]["minutes"]:
            return state["total_steps"]
        if self.step < 2:
            return None
        return max(self.step, int(cfg.minutes * 60 / (self.elapsed / self.step)))

    def _check_finite(self) -> None:
        bad = [k for k, p in self.module.named_parameters() if p.requires_grad and not torch.isfinite(p).all()]
        if bad:
            raise MtpcError(f"non-finite weights ({', '.join(bad[:3])}) at step {self.step}; nothing saved. "
                            f"{self._kept()}")

    def _kept(self) -> str:
        if self.saved_step is None:
            return (f"No checkpoint was written yet (the first is due at step {self.cfg.save_every}, "
                    "see --save-every).")
        return f"{self.out / CHECKPOINT} keeps step {self.saved_step}."

    def _trim_log(self) -> None:
        """Drop log records after the checkpoint's step (written before a kill; the resumed run writes
        them again) and a last line cut short by the kill."""
        path = self.out / LOG
        if not path.exists():
            return
        kept = []
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= self.step:
                kept.append(line)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)

    def save_outputs(self, summary: dict) -> None:
        if not self.d.main:
            return
        from ..heads.head import save_head

        self._check_finite()
        save_head(self.head, self.out)
        if self.cfg.lora_layers > 0:
            self.lm.save_pretrained(str(self.out / LORA_DIR))
        config = {**asdict(self.cfg), "model": str(Path(self.cfg.model).resolve()), "lora_dir": LORA_DIR
                  if self.cfg.lora_layers > 0 else None, "world_size": self.d.world, **summary}
        (self.out / "train_config.json").write_text(json.dumps(config, indent=1) + "\n")

    # -------------------------------------------------------------- the loop

    def log(self, record: dict) -> None:
        if self.d.main:
            with (self.out / LOG).open("a") as f:
                f.write(json.dumps(record) + "\n")

    def run(self) -> dict:
        cfg, d = self.cfg, self.d
        resumed = self.load_checkpoint()
        if d.main:
            self.out.mkdir(parents=True, exist_ok=True)
            if resumed:
                self._trim_log()
            else:
                (self.out / LOG).write_text("")
                self.log({"step": 0, **self.validate()})
        _barrier(d)
        bar = progress_bar(self.total_steps or 0, "step", cfg.progress and d.main, "mtpc train")
        advance(bar, self.step)
        start = time.perf_counter() - self.elapsed
        last_val = None  # the validation of the final step, reused for the summary
        while self.total_steps is None or self.step < self.total_steps:
            record = self.train_step()
            self.elapsed = time.perf_counter() - start
            if self.total_steps is None and self.step == 2:
                self.total_steps = self._steps_for_budget()
                bar.reset(total=self.total_steps)
                advance(bar, self.step)
            record.update(tokens=self.tokens, time_s=round(self.elapsed, 2))
            if self.step % cfg.val_every == 0 or self.step == self.total_steps:
                if d.main:
                    val = self.validate()
                    record.update(val)
                    last_val = val if self.step == self.total_steps else None
                _barrier(d)
            self.log(record)
            advance(bar, self.step)
            bar.set_postfix_str(f"loss {record['loss']:.3f}, {self.tokens / max(self.elapsed, 1e-9):,.0f} tok/s"
                                + (f", accepted {record['val_accepted']:.2f}" if "val_accepted" in record else ""))
            stop = cfg.stop_after is not None and self.step >= cfg.stop_after
            if self.step % cfg.save_every == 0 or self.step == self.total_steps or stop:
                self.save_checkpoint()
                _barrier(d)
            if stop and self.step != self.total_steps:
                bar.close()
                return {"stopped_at": self.step}
        bar.close()
        final = (last_val if last_val is not None else self.validate()) if d.main else {}
        stats = self.data_stats
        summary = {"steps": self.step, "train_tokens": self.tokens, "train_seconds": round(self.elapsed, 1),
                   "data": {"documents": stats.documents, "skipped_empty": stats.skipped_empty,
                            "skipped_corrupt": stats.skipped_corrupt, "skipped_binary": stats.skipped_binary},
                   **final}
        self.save_outputs(summary)
        _barrier(d)
        return summary

    def _steps_for_budget(self) -> int:
        per_step = torch.tensor([self.elapsed / self.step], dtype=torch.float64)
        if self.d.world > 1:
            dist.broadcast(per_step, 0)
        return max(self.step, int(self.cfg.minutes * 60 / per_step.item()))


def _spread(size: int, count: int) -> list[int]:
    """`min(size, count)` distinct indices spread evenly over `range(size)`."""
    if size <= count:
        return list(range(size))
    return [int(i * size // count) for i in range(count)]


def train(cfg: TrainConfig) -> dict:
    """Train (or resume) and write the outputs; returns the summary. Bad input raises `InputError`
    before slow work; a run that fails raises `MtpcError`. An output folder this call created is
    removed again if the run fails before writing anything into it."""
    checks.output_folder(cfg.out)
    with guarded_output(cfg.out):  # one run per --out; a full disk is one line (outputs.py)
        return Trainer(cfg).run()


def _check_numbers(cfg: TrainConfig) -> None:
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


def _graph_digest(graph) -> str:
    """A digest of a region graph's structure (its JSON form), to tell circuits apart."""
    import hashlib

    return hashlib.sha256(json.dumps(graph.to_json(), sort_keys=True).encode()).hexdigest()[:16]


# ------------------------------------------------------------------ RNG state


def _rng_state() -> dict:
    """Every RNG's state as tensors and plain values (what `torch.load(weights_only=True)` reads)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {"torch": torch.get_rng_state(),
             "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64),
                        "gauss_next": gauss_next},
             "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos,
                       "has_gauss": has_gauss, "gauss": gauss}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"].tolist()), py["gauss_next"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
