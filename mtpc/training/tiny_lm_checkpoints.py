"""`mtpc tiny-lm`, its checkpoint: which settings must match to continue a run, and reading
`OUT/checkpoint.pt` back (refused when damaged, foreign or of other settings; never unpickled).
`mtpc.training.checkpoints` writes it (temporary file + rename)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from ..errors import InputError
from .tiny_lm_setup import TinyLMConfig

CHECKPOINT = "checkpoint.pt"
FIELDS = ("config", "model", "optimizer", "order", "step", "tokens", "elapsed", "start_bpb", "torch_rng")


def resume_key(cfg: TinyLMConfig) -> dict:
    """The settings a checkpoint must agree with to be continued (not the output or logging ones)."""
    skip = {"out", "progress", "resume", "stop_after", "save_every", "eval_every_s", "device"}
    # settings added later count only when given, so a checkpoint written before them still resumes
    later = {"tokenizer", "bpe_vocab"}
    return {k: v for k, v in asdict(cfg).items() if k not in skip and not (k in later and v is None)}


def read_checkpoint(out: Path, cfg: TinyLMConfig) -> dict | None:
    """The checkpoint to continue from (None: start afresh), checked against this run's settings."""
    path = out / CHECKPOINT
    if not (cfg.resume and path.exists()):
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a damaged or foreign file: say which, never unpickle it
        raise InputError(f"{path} is not a tiny-lm checkpoint ({type(e).__name__}); remove it or pass --no-resume") from None
    # weights_only admits any tensor container: a bare tensor or a list would fail on first use
    missing = [k for k in FIELDS if k not in state] if isinstance(state, dict) else list(FIELDS)
    if missing or not isinstance(state["config"], dict):
        what = f"a {type(state).__name__}" if not isinstance(state, dict) else f"a dict without {', '.join(missing[:3])}"
        raise InputError(f"{path} is not a tiny-lm checkpoint (it holds {what}); remove it or pass --no-resume")
    if state.get("config") != resume_key(cfg):
        changed = sorted(k for k in set(state.get("config", {})) | set(resume_key(cfg))
                         if state.get("config", {}).get(k) != resume_key(cfg).get(k))
        raise InputError(f"{path} was written by a run with different settings ({', '.join(changed)}); "
                         "rerun with the same flags, or pass --no-resume to start over")
    return state
