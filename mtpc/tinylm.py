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
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from . import checks
from .data import DataStats, PackedDataset, collate, load_documents, split_documents, target_validity
from .tokenizer import NUM_BYTES, ByteTokenizer

LN2 = math.log(2.0)


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


# ------------------------------------------------------------------ helpers shared with mtpc.train

def autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """The autocast dtype for `precision` ("auto": bf16 where the hardware runs it natively)."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if precision != "auto":
        raise ValueError(f"precision must be auto, fp32 or bf16, got {precision!r}")
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    return torch.bfloat16 if _cpu_has_bf16() else None


def _cpu_has_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def autocast(device: torch.device, dtype: torch.dtype | None):
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def cosine_lr(base: float, progress: float, step: int, warmup: int, min_ratio: float) -> float:
    """Linear warm-up over `warmup` steps, then a cosine from `base` to `base * min_ratio` as
    `progress` goes from 0 to 1."""
    warm = min(1.0, (step + 1) / max(1, warmup))
    progress = min(max(progress, 0.0), 1.0)
    return base * warm * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def progress_bar(total: int, unit: str, enabled: bool, desc: str):
    return tqdm(total=total, unit=unit, desc=desc, disable=not enabled, dynamic_ncols=True, mininterval=1.0)


def advance(bar, value: float) -> None:
    """Move `bar` to `value` (whole units, never past its total)."""
    target = min(int(value), bar.total)
    if target > bar.n:
        bar.update(target - bar.n)


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
    tokens = batch["tokens"]  # [B, T]
    valid = target_validity(batch["doc_ids"], batch["loss_mask"], 1)[:, :-1, 0]  # [B, T-1]
    device = next(model.parameters()).device
    with autocast(device, dtype):
        logits = model(input_ids=tokens).logits  # [B, T, V]
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

def train_tiny_lm(cfg: TinyLMConfig) -> dict:
    """Train, evaluate and save; returns the summary also written to `OUT/tiny_lm.json`."""
    torch.manual_seed(cfg.seed)
    out = checks.output_folder(cfg.out)
    checks.data_source(cfg.data)
    tok = ByteTokenizer(cfg.vocab_size)
    train_set, val_set, stats = _datasets(cfg, tok)
    out.mkdir(parents=True, exist_ok=True)  # only once the data is known to be usable
    model = build_model(cfg, tok)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).train()
    dtype = autocast_dtype(device, cfg.precision)
    opt = _optimizer(model, cfg)
    log_path = out / "train_log.jsonl"
    log_path.write_text("")

    start_bpb = bits_per_byte(model, val_set, cfg.val_tokens, dtype)
    _log(log_path, {"step": 0, "tokens": 0, "val_bpb": start_bpb})
    order = _order(len(train_set), cfg.seed)
    step = tokens_seen = 0
    t0 = last_eval = time.perf_counter()
    total = cfg.steps if cfg.steps is not None else int(round(cfg.minutes * 60))
    bar = progress_bar(total, "step" if cfg.steps is not None else "s", cfg.progress, "tiny-lm")
    loss_ema = None
    while True:
        elapsed = time.perf_counter() - t0
        done = step / cfg.steps if cfg.steps is not None else elapsed / (cfg.minutes * 60)
        if done >= 1:
            break
        lr = cosine_lr(cfg.lr, done, step, cfg.warmup_steps, cfg.min_lr_ratio)
        for group in opt.param_groups:
            group["lr"] = lr
        idx = [next(order) for _ in range(cfg.batch_size)]
        batch = {k: v.to(device) for k, v in collate(train_set[i] for i in idx).items()}
        loss = _train_step(model, opt, batch, dtype, cfg.grad_clip)
        step += 1
        tokens_seen += batch["tokens"].numel()
        loss_ema = loss if loss_ema is None else 0.95 * loss_ema + 0.05 * loss
        now = time.perf_counter()
        advance(bar, step if cfg.steps is not None else now - t0)
        bar.set_postfix_str(f"loss {loss_ema / LN2:.3f} bits, {tokens_seen / (now - t0):,.0f} tok/s, lr {lr:.2e}")
        record = {"step": step, "tokens": tokens_seen, "time_s": round(now - t0, 2), "lr": lr, "loss_bits": loss / LN2}
        if now - last_eval >= cfg.eval_every_s:
            record["val_bpb"] = bits_per_byte(model, val_set, cfg.val_tokens, dtype)
            last_eval = time.perf_counter()
        _log(log_path, record)
    bar.close()
    train_time = time.perf_counter() - t0
    final_bpb = bits_per_byte(model, val_set, cfg.final_val_tokens, dtype)
    summary = {
        "val_bits_per_byte": final_bpb, "val_bits_per_byte_at_start": start_bpb, "steps": step,
        "train_tokens": tokens_seen, "train_seconds": round(train_time, 1),
        "tokens_per_second": round(tokens_seen / max(train_time, 1e-9)),
        "val_tokens_evaluated": min(val_set.num_tokens, cfg.final_val_tokens // cfg.context * cfg.context),
        "parameters": sum(p.numel() for p in model.parameters()),
        "autocast": str(dtype) if dtype else "fp32", "device": str(device),
        "data": {"source": cfg.data or "python stdlib", **_stats_dict(stats),
                 "train_tokens": train_set.num_tokens, "val_tokens": val_set.num_tokens},
        "config": asdict(cfg),
    }
    _log(log_path, {"final_val_bpb": final_bpb})
    model.save_pretrained(out)
    tok.save(out)
    (out / "tiny_lm.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _datasets(cfg: TinyLMConfig, tok: ByteTokenizer) -> tuple[PackedDataset, PackedDataset, DataStats]:
    docs, stats = load_documents(cfg.data, tok)
    train_docs, val_docs = split_documents(docs, cfg.val_fraction)
    return (PackedDataset(train_docs, cfg.context, tok.pad_id), PackedDataset(val_docs, cfg.context, tok.pad_id),
            stats)


def _stats_dict(stats: DataStats) -> dict:
    return {k: getattr(stats, k) for k in ("files", "documents", "tokens", "skipped_empty", "skipped_corrupt",
                                           "skipped_binary")}


def _optimizer(model, cfg: TinyLMConfig) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))


def _order(n: int, seed: int):
    """Sequence indices, a fresh seeded permutation per epoch, forever."""
    rng = random.Random(seed)
    while True:
        perm = list(range(n))
        rng.shuffle(perm)
        yield from perm


def _train_step(model, opt, batch, dtype, grad_clip: float) -> float:
    nll, count, _, _ = lm_nll(model, batch, dtype)
    loss = nll / count.clamp(min=1)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return loss.item()


def _log(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
