"""`mtpc tiny-lm`: train a small byte-level LlamaForCausalLM from scratch on a local corpus.

The default corpus is the Python standard library's `.py` sources (about 30 MB, present wherever
Python is), so every machine can build the same model without a download. The result is saved with
`save_pretrained` (safetensors + `config.json`) next to the byte tokenizer's description, so it loads
like any local Hugging Face checkpoint: `LlamaForCausalLM.from_pretrained(DIR)`.

Training runs for a wall-clock budget (`minutes`) or a fixed number of `steps`; the learning rate
warms up and then follows a cosine over the budget. Held-out bits per byte count only byte targets
(specials such as `<eos>` are predicted and trained but not counted as bytes).
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .outputs import guarded_output, save_atomically
from .. import checks, loading
from .data import DataStats, EpochSampler, PackedDataset, collate, load_documents, split_documents, target_validity
from .precision import autocast, autocast_dtype
from .progress import advance, progress_bar
from .schedule import cosine_lr
from .distributed import all_sum, barrier, broadcast_from_main, init_distributed, wrap_ddp
from ..errors import InputError
from ..heads.head import PARAMETERISATIONS, MTPHead, save_head
from ..heads.nll_loss import mtp_loss, valid_counts
from ..tokenizer import NUM_BYTES, ByteTokenizer

LN2 = math.log(2.0)
CHECKPOINT = "checkpoint.pt"
MTP_HEAD_DIR = "mtp_head"  # the jointly trained head's folder inside the LM's (mtpc.load_head reads it)


@dataclass
class TinyLMConfig:
    out: str
    data: str | None = None  # None: the Python standard library sources
    minutes: float = 10.0
    steps: int | None = None  # a fixed number of steps instead of the time budget
    context: int = 1024
    d_model: int = 256
    layers: int = 4
    heads: int = 4
    ffn: int = 704
    vocab_size: int | None = None  # None: 256 bytes + the tokenizer's specials
    batch_size: int = 4  # sequences per step (small: a 10-minute CPU budget is step-limited)
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    val_fraction: float = 0.02
    val_tokens: int = 65536  # per periodic evaluation
    final_val_tokens: int = 1 << 18
    eval_every_s: float = 120.0
    precision: str = "auto"  # auto | fp32 | bf16
    seed: int = 0
    progress: bool = True
    save_every: int = 100  # steps between checkpoints (OUT/checkpoint.pt; rerunning the command resumes)
    resume: bool = True
    stop_after: int | None = None  # leave the run at this step with a checkpoint (pre-emptible jobs, tests)
    # MTP-aware pretraining: a circuit head trained jointly, loss = CE + mtp_weight * Eq. 5 loss
    mtp_circuit: str | None = None  # .pc file; None: next-byte loss only
    mtp_bindings: dict = field(default_factory=dict)
    mtp_weight: float = 0.2
    mtp_parameterisation: str = "full"  # full | shared | factorised (see mtpc.heads.head)
    mtp_window_stride: int = 1  # score the windows at every s-th position (shifting with the step)
    mtp_gamma: float = 0.9
    mtp_sum_init_std: float = 0.02


# ------------------------------------------------------------------ model

def build_model(cfg: TinyLMConfig, tok: ByteTokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=tok.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
        max_position_embeddings=cfg.context, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id,
    )
    return LlamaForCausalLM(config)


def lm_nll(model, batch: dict[str, torch.Tensor], dtype: torch.dtype | None
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Next-token NLL over valid targets (same document, in the loss mask).
    Returns (sum over all targets, number of targets, sum over byte targets, number of byte targets)."""
    device = next(model.parameters()).device
    with autocast(device, dtype):
        logits = model(input_ids=batch["tokens"]).logits  # [B, T, V]
    return _nll_sums(logits, batch)


def _nll_sums(logits: torch.Tensor, batch: dict[str, torch.Tensor]
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens = batch["tokens"]  # [B, T]
    valid = target_validity(batch["doc_ids"], batch["loss_mask"], 1)[:, :-1, 0]  # [B, T-1]
    nll = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    nll = nll.view_as(valid) * valid  # [B, T-1]
    is_byte = valid & (tokens[:, 1:] < NUM_BYTES)  # [B, T-1]
    return nll.sum(), valid.sum(), (nll * is_byte).sum(), is_byte.sum()


@torch.no_grad()
def bits_per_byte(model, data: PackedDataset, max_tokens: int, dtype: torch.dtype | None,
                  batch_size: int = 8) -> float:
    """Held-out bits per byte over the first `max_tokens` tokens of `data`."""
    was_training = model.training
    model.eval()
    count = min(len(data), max(1, max_tokens // data.seq_len))
    nll_bytes, n_bytes = 0.0, 0
    for lo in range(0, count, batch_size):
        batch = collate(data[i] for i in range(lo, min(lo + batch_size, count)))
        _, _, s, c = lm_nll(model, batch, dtype)
        nll_bytes, n_bytes = nll_bytes + s.item(), n_bytes + int(c)
    model.train(was_training)
    return nll_bytes / max(1, n_bytes) / LN2


# ------------------------------------------------------------------ training


class JointLM(nn.Module):
    """The LM and, for MTP-aware pretraining, a circuit head on its final hidden states; `forward`
    returns the loss of this rank's share of a batch, so DistributedDataParallel can wrap the whole
    computation. Both normalisers are the *global* batch's counts: the ranks' losses add up to the
    loss of the whole batch (and one process gives the same number)."""

    def __init__(self, model: nn.Module, head: nn.Module | None, mtp_weight: float, gamma: float,
                 amp: torch.dtype | None):
        super().__init__()
        self.model, self.head = model, head
        self.mtp_weight, self.gamma, self.amp = mtp_weight, gamma, amp

    def forward(self, tokens, doc_ids, loss_mask, ce_count, mtp_counts=None, window_mask=None):
        """Returns (loss, cross-entropy share, MTP-loss share); the shares are detached."""
        with autocast(tokens.device, self.amp):
            hidden = self.model.get_decoder()(input_ids=tokens).last_hidden_state  # [B, T, d]
            logits = self.model.get_output_embeddings()(hidden)  # [B, T, V]
        nll, _, _, _ = _nll_sums(logits, {"tokens": tokens, "doc_ids": doc_ids, "loss_mask": loss_mask})
        ce = nll / ce_count.clamp(min=1)
        if self.head is None:
            return ce, ce.detach(), torch.zeros((), device=ce.device)
        with autocast(tokens.device, self.amp):
            mtp = mtp_loss(self.head, hidden, tokens, doc_ids, loss_mask, gamma=self.gamma, normalizer=mtp_counts,
                           window_mask=window_mask).loss
        return ce + self.mtp_weight * mtp, ce.detach(), mtp.detach()


class ShuffledOrder(EpochSampler):
    """The order `tiny-lm` has always used: epoch `e` is the `e + 1`-th shuffle of one
    `random.Random(seed)`, so a resumed run replays the shuffles up to its epoch."""

    def _permutation(self) -> list[int]:
        rng = random.Random(self.seed)
        for _ in range(self.epoch + 1):
            perm = list(range(self.size))
            rng.shuffle(perm)
        return perm


def train_tiny_lm(cfg: TinyLMConfig) -> dict:
    """Train (or resume from `OUT/checkpoint.pt`), evaluate and save; returns the summary also
    written to `OUT/tiny_lm.json` (on rank 0; other ranks return `{}`)."""
    checks.output_folder(cfg.out)
    with guarded_output(cfg.out):  # one run per --out; a full disk is one line (outputs.py)
        return _TinyLMRun(cfg).run()


class _TinyLMRun:
    def __init__(self, cfg: TinyLMConfig):
        _check_config(cfg)
        graph = _mtp_graph(cfg)  # before the slow data loading: a broken circuit fails at once
        self.cfg, self.d = cfg, init_distributed()
        if cfg.batch_size % self.d.world:
            raise InputError(f"--batch-size {cfg.batch_size} must be divisible by the number of processes "
                             f"({self.d.world})")
        self.out = checks.output_folder(cfg.out)
        checks.data_source(cfg.data)
        torch.manual_seed(cfg.seed)
        self.tok = ByteTokenizer(cfg.vocab_size)
        self.model = build_model(cfg, self.tok)  # first: the same initial LM with or without a head
        self.head = _build_mtp_head(cfg, graph, self.model, self.tok) if graph is not None else None
        self.model.to(self.d.device).train()
        if self.head is not None:
            self.head.to(self.d.device).train()
        self.dtype = autocast_dtype(self.d.device, cfg.precision)
        self.joint = JointLM(self.model, self.head, cfg.mtp_weight, cfg.mtp_gamma, self.dtype)
        self.ddp = wrap_ddp(self.joint, self.d)
        self.opt = _optimizer(self.joint, cfg)
        self.train_set, self.val_set, self.stats = _datasets(cfg, self.tok)
        if self.d.main:  # only once the data is known to be usable: a failed start leaves no folder
            self.out.mkdir(parents=True, exist_ok=True)
        self.order = ShuffledOrder(len(self.train_set), cfg.seed)
        self.step, self.tokens_seen, self.elapsed, self.start_bpb = 0, 0, 0.0, None

    # -------------------------------------------------------------- checkpoints

    def save_checkpoint(self) -> None:
        if not self.d.main:
            return
        state = {"step": self.step, "tokens": self.tokens_seen, "elapsed": self.elapsed,
                 "start_bpb": self.start_bpb, "order": self.order.state_dict(), "torch_rng": torch.get_rng_state(),
                 "model": self.model.state_dict(), "optimizer": self.opt.state_dict(), "config": _resume_key(self.cfg)}
        if self.head is not None:
            state["head"] = self.head.state_dict()
        save_atomically(lambda tmp: torch.save(state, tmp), self.out / CHECKPOINT)

    def load_checkpoint(self) -> bool:
        path = self.out / CHECKPOINT
        if not (self.cfg.resume and path.exists()):
            return False
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # a damaged or foreign file: say which, never unpickle it
            raise InputError(f"{path} is not a tiny-lm checkpoint ({type(e).__name__}); remove it or pass --no-resume") from None
        if state.get("config") != _resume_key(self.cfg):
            changed = sorted(k for k in set(state.get("config", {})) | set(_resume_key(self.cfg))
                             if state.get("config", {}).get(k) != _resume_key(self.cfg).get(k))
            raise InputError(f"{path} was written by a run with different settings ({', '.join(changed)}); "
                             "rerun with the same flags, or pass --no-resume to start over")
        self.model.load_state_dict(state["model"])
        if self.head is not None:
            self.head.load_state_dict(state["head"])
        self.opt.load_state_dict(state["optimizer"])
        self.order.load_state_dict(state["order"])
        self.step, self.tokens_seen, self.elapsed = int(state["step"]), int(state["tokens"]), float(state["elapsed"])
        self.start_bpb = state["start_bpb"]
        torch.set_rng_state(state["torch_rng"])
        return True

    # -------------------------------------------------------------- the loop

    def log(self, record: dict) -> None:
        if self.d.main:
            _log(self.out / "train_log.jsonl", record)

    def progress(self) -> float:
        """Fraction of the budget used (rank 0's clock decides a time budget for every rank)."""
        if self.cfg.steps is not None:
            return self.step / self.cfg.steps
        done = torch.tensor([self.elapsed / (self.cfg.minutes * 60)], dtype=torch.float64)
        return broadcast_from_main(done, self.d).item()

    def run(self) -> dict:
        cfg, d = self.cfg, self.d
        log_path = self.out / "train_log.jsonl"
        if self.load_checkpoint():
            if d.main:
                _truncate_log(log_path, self.step)
        else:
            if d.main:
                log_path.write_text("")
                self.start_bpb = bits_per_byte(self.model, self.val_set, cfg.val_tokens, self.dtype)
                self.log({"step": 0, "tokens": 0, "val_bpb": self.start_bpb})
        total = cfg.steps if cfg.steps is not None else int(round(cfg.minutes * 60))
        bar = progress_bar(total, "step" if cfg.steps is not None else "s", cfg.progress and d.main, "tiny-lm")
        advance(bar, self.step if cfg.steps is not None else self.elapsed)
        t0 = time.perf_counter() - self.elapsed
        last_eval = time.perf_counter()
        loss_ema = None
        while True:
            done = self.progress()
            if done >= 1:
                break
            record = self.train_step(done)
            now = time.perf_counter()
            self.elapsed = now - t0
            loss = record["loss_bits"] * LN2
            loss_ema = loss if loss_ema is None else 0.95 * loss_ema + 0.05 * loss
            advance(bar, self.step if cfg.steps is not None else self.elapsed)
            bar.set_postfix_str(f"loss {loss_ema / LN2:.3f} bits, {self.tokens_seen / self.elapsed:,.0f} tok/s, "
                                f"lr {record['lr']:.2e}" + (f", mtp {record['mtp_loss']:.3f}" if self.head else ""))
            record["time_s"] = round(self.elapsed, 2)
            if d.main and now - last_eval >= cfg.eval_every_s:
                record["val_bpb"] = bits_per_byte(self.model, self.val_set, cfg.val_tokens, self.dtype)
                last_eval = time.perf_counter()
            self.log(record)
            stop = cfg.stop_after is not None and self.step >= cfg.stop_after
            if self.step % cfg.save_every == 0 or stop:
                self.save_checkpoint()
            if stop and self.progress() < 1:
                bar.close()
                return {"stopped_at": self.step}
        bar.close()
        self.save_checkpoint()
        summary = self.finish() if d.main else {}
        barrier(d)
        return summary

    def train_step(self, done: float) -> dict:
        cfg, d = self.cfg, self.d
        lr = cosine_lr(cfg.lr, done, self.step, cfg.warmup_steps, cfg.min_lr_ratio)
        for group in self.opt.param_groups:
            group["lr"] = lr
        indices = self.order.take(cfg.batch_size)  # the global batch, the same on every rank
        batch = collate(self.train_set[i] for i in indices)
        ce_count = target_validity(batch["doc_ids"], batch["loss_mask"], 1)[:, :-1, 0].sum()
        mtp_counts = window_mask = None
        if self.head is not None:
            positions = torch.arange(batch["tokens"].shape[1])
            window_mask = ((positions + self.step) % cfg.mtp_window_stride == 0).expand(batch["tokens"].shape)
            mtp_counts = valid_counts(batch["doc_ids"], batch["loss_mask"], batch["tokens"], self.head.num_variables,
                                      self.head.num_states, window_mask).to(d.device)
            batch["window_mask"] = window_mask
        mine = {k: t[d.rank::d.world].to(d.device) for k, t in batch.items()}  # this rank's share
        loss, ce, mtp = self.ddp(mine["tokens"], mine["doc_ids"], mine["loss_mask"], ce_count.to(d.device),
                                 mtp_counts, mine.get("window_mask"))
        self.opt.zero_grad(set_to_none=True)
        (loss * d.world).backward()  # DDP averages over ranks; each rank's loss is a share of the sum
        grad_norm = torch.nn.utils.clip_grad_norm_(self.joint.parameters(), cfg.grad_clip)
        self.opt.step()
        self.step += 1
        self.tokens_seen += batch["tokens"].numel()
        ce, mtp = all_sum(torch.stack([ce, mtp]), d).tolist()
        record = {"step": self.step, "tokens": self.tokens_seen, "lr": lr, "loss_bits": ce / LN2}
        if self.head is not None:
            record["mtp_loss"] = mtp
        record["grad_norm"] = float(grad_norm)
        return record

    def finish(self) -> dict:
        cfg = self.cfg
        final_bpb = bits_per_byte(self.model, self.val_set, cfg.final_val_tokens, self.dtype)
        summary = {
            "val_bits_per_byte": final_bpb, "val_bits_per_byte_at_start": self.start_bpb, "steps": self.step,
            "train_tokens": self.tokens_seen, "train_seconds": round(self.elapsed, 1),
            "tokens_per_second": round(self.tokens_seen / max(self.elapsed, 1e-9)),
            "val_tokens_evaluated": min(self.val_set.num_tokens, cfg.final_val_tokens // cfg.context * cfg.context),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "autocast": str(self.dtype) if self.dtype else "fp32", "device": str(self.d.device),
            "world_size": self.d.world,
            "data": {"source": cfg.data or "python stdlib", **_stats_dict(self.stats),
                     "train_tokens": self.train_set.num_tokens, "val_tokens": self.val_set.num_tokens},
            "config": asdict(cfg),
        }
        if self.head is not None:
            summary["mtp_head"] = {"dir": MTP_HEAD_DIR, "parameters": sum(p.numel() for p in self.head.parameters()),
                                   "val_mtp_loss": mtp_val_loss(self.joint, self.val_set, cfg.val_tokens)}
        _log(self.out / "train_log.jsonl", {"final_val_bpb": final_bpb})
        self.model.save_pretrained(self.out)
        self.tok.save(self.out)
        if self.head is not None:
            save_head(self.head, self.out / MTP_HEAD_DIR)
        (self.out / "tiny_lm.json").write_text(json.dumps(summary, indent=1) + "\n")
        return summary


@torch.no_grad()
def mtp_val_loss(joint: JointLM, data: PackedDataset, max_tokens: int, batch_size: int = 8) -> float:
    """The head's held-out windowed MTP loss (Eq. 5, every window) over the first `max_tokens` tokens."""
    was_training = joint.training
    joint.eval()
    count = min(len(data), max(1, max_tokens // data.seq_len))
    batch = collate(data[i] for i in range(count))
    device = next(joint.parameters()).device
    n, v = joint.head.num_variables, joint.head.num_states
    counts = valid_counts(batch["doc_ids"], batch["loss_mask"], batch["tokens"], n, v).to(device)
    total = 0.0
    for lo in range(0, count, batch_size):
        part = {k: t[lo:lo + batch_size].to(device) for k, t in batch.items()}
        with autocast(device, joint.amp):
            hidden = joint.model.get_decoder()(input_ids=part["tokens"]).last_hidden_state
            total += mtp_loss(joint.head, hidden, part["tokens"], part["doc_ids"], part["loss_mask"],
                              gamma=joint.gamma, normalizer=counts).loss.item()
    joint.train(was_training)
    return total


def _check_config(cfg: TinyLMConfig) -> None:
    """User mistakes, reported before any slow work."""
    if cfg.steps is not None and cfg.steps < 1:
        raise InputError(f"--steps must be at least 1, got {cfg.steps}")
    if cfg.steps is None and not cfg.minutes > 0:
        raise InputError(f"--minutes must be positive, got {cfg.minutes}")
    if cfg.d_model % cfg.heads:
        raise InputError(f"--heads {cfg.heads} must divide --d-model {cfg.d_model}")
    if cfg.vocab_size is not None and cfg.vocab_size < loading.MIN_BYTE_VOCAB:
        raise InputError(f"--vocab-size {cfg.vocab_size} is too small: 256 bytes + 8 special tokens need at least "
                         f"{loading.MIN_BYTE_VOCAB}")
    if cfg.mtp_circuit is None:
        given = [flag for flag, value, default in (("-D", cfg.mtp_bindings, {}), ("--mtp-weight", cfg.mtp_weight, 0.2),
                                                   ("--mtp-window-stride", cfg.mtp_window_stride, 1))
                 if value != default]
        if given:
            raise InputError(f"{', '.join(given)} only apply with --mtp-circuit")
        return
    if cfg.mtp_parameterisation not in PARAMETERISATIONS:
        raise InputError(f"--mtp-parameterisation must be one of {', '.join(PARAMETERISATIONS)}, "
                         f"got {cfg.mtp_parameterisation!r}")
    if not (cfg.mtp_weight >= 0 and math.isfinite(cfg.mtp_weight)):
        raise InputError(f"--mtp-weight must be a finite number >= 0, got {cfg.mtp_weight}")
    if cfg.mtp_window_stride < 1:
        raise InputError(f"--mtp-window-stride must be at least 1, got {cfg.mtp_window_stride}")
    if not 0 < cfg.mtp_gamma <= 1:
        raise InputError(f"--mtp-gamma must be in (0, 1], got {cfg.mtp_gamma}")


def _mtp_graph(cfg: TinyLMConfig):
    """The checked region graph of `--mtp-circuit` (None without one)."""
    if cfg.mtp_circuit is None:
        return None
    import circuitc
    from circuitc.errors import CircuitError

    path = Path(cfg.mtp_circuit)
    if not path.is_file():
        raise InputError(f"--mtp-circuit {cfg.mtp_circuit}: no such file")
    try:
        graph = circuitc.load_graph(path, **cfg.mtp_bindings)
    except CircuitError as e:
        raise InputError(f"--mtp-circuit {cfg.mtp_circuit}: {e}") from None
    vocab = ByteTokenizer(cfg.vocab_size).vocab_size
    states = circuitc.compile(graph).num_states
    if states > vocab:
        raise InputError(f"--mtp-circuit {cfg.mtp_circuit}: {states} states, but the LM has {vocab} tokens")
    return graph


def _build_mtp_head(cfg: TinyLMConfig, graph, model, tok: ByteTokenizer) -> MTPHead:
    """A head on the final hidden states, its units initialised from the (fresh) LM's unembedding,
    as `mtpc train` does, so at step 0 it is the fully factorised product of the LM's softmax."""
    unembed = model.get_output_embeddings().weight.detach()  # [V, d]
    return MTPHead(graph, cfg.d_model, init_from=unembed, sum_init_std=cfg.mtp_sum_init_std,
                   parameterisation=cfg.mtp_parameterisation)


def _resume_key(cfg: TinyLMConfig) -> dict:
    """The settings a checkpoint must agree with to be continued (not the output or logging ones)."""
    skip = {"out", "progress", "resume", "stop_after", "save_every", "eval_every_s"}
    return {k: v for k, v in asdict(cfg).items() if k not in skip}


def _truncate_log(path: Path, step: int) -> None:
    """Drop log records past the checkpoint (written after it by a run that was then interrupted)."""
    if not path.exists():
        return
    keep = [line for line in path.read_text(errors="replace").splitlines() if _step_of(line, step + 1) <= step]
    path.write_text("".join(line + "\n" for line in keep))


def _step_of(line: str, missing: int) -> int:
    """A log record's step (`missing` without one); a line torn by a kill counts as past any step."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return missing
    step = record.get("step", missing) if isinstance(record, dict) else missing
    return step if isinstance(step, int) else missing


def _datasets(cfg: TinyLMConfig, tok: ByteTokenizer) -> tuple[PackedDataset, PackedDataset, DataStats]:
    docs, stats = load_documents(cfg.data, tok)
    train_docs, val_docs = split_documents(docs, cfg.val_fraction)
    return (PackedDataset(train_docs, cfg.context, tok.pad_id), PackedDataset(val_docs, cfg.context, tok.pad_id),
            stats)


def _stats_dict(stats: DataStats) -> dict:
    return {k: getattr(stats, k) for k in ("files", "documents", "tokens", "skipped_empty", "skipped_corrupt",
                                           "skipped_binary")}


def _optimizer(module: nn.Module, cfg: TinyLMConfig) -> torch.optim.Optimizer:
    """AdamW over the LM (and the joint head, same rule): weight decay on matrices only."""
    decay = [p for p in module.parameters() if p.dim() >= 2]
    no_decay = [p for p in module.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))


def _log(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
