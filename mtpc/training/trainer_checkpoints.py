"""`mtpc train`, its checkpoint: which settings a checkpoint must share with the command resuming
it, and reading one back (refused when damaged or of other settings). A resumed `--minutes` run re-sizes its
step count from the checkpoint's time per step (`schedule.StepBudget`); `--steps` is taken as given now.

`OUT/checkpoint.pt` holds only tensors and plain values, read with `torch.load(weights_only=True)`,
so a planted file cannot run code; `mtpc.training.checkpoints` writes it (temporary file + rename).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from ..errors import InputError
from .trainer_setup import TrainConfig, graph_digest

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_FORMAT = "mtpc-train-checkpoint-2"
# Settings that may differ between a checkpoint and the command resuming it: the length of the run,
# how often it validates and saves, and presentation. Everything else must match.
RESUMABLE = ("steps", "minutes", "val_every", "save_every", "stop_after", "progress", "resume",
             "allow_non_byte_vocab", "trust_remote_code", "device")
AGAIN = "pass --no-resume to start over (the checkpoint is then overwritten)"


# Not settings of the run: the checkpoint lies in OUT, so a copied or moved run folder resumes where it
# now is (checkpoints written before this recorded it; it is ignored there too).
PLACE = ("out",)


def settings(cfg: TrainConfig, graph) -> dict:
    """The settings a checkpoint must share with the command resuming it (paths resolved, the
    circuit as a digest of its region graph, so a moved file or equal bindings still match)."""
    cfg = asdict(cfg)
    for name in (*RESUMABLE, *PLACE, "circuit", "bindings"):
        cfg.pop(name)
    for name in ("model", "data", "init_head"):
        if cfg[name] is not None and Path(cfg[name]).exists():
            cfg[name] = str(Path(cfg[name]).resolve())
    return {**cfg, "circuit_graph": graph_digest(graph)}


def read_checkpoint(out: Path, cfg: TrainConfig, graph) -> dict | None:
    """The checkpoint to resume from (None: start afresh), loaded without unpickling code and
    checked against this command's settings."""
    path = out / CHECKPOINT
    if not (cfg.resume and path.is_file()):
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 -- any unreadable file is the same user-facing problem
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{path} cannot be loaded as an mtpc checkpoint ({reason}); {AGAIN}") from None
    fields = {"step", "total_steps", "budget", "tokens", "elapsed", "trainable", "optimizer", "sampler", "rng",
              "settings"}
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT or not fields <= state.keys() \
            or not isinstance(state["settings"], dict):
        raise InputError(f"{path} is not an mtpc training checkpoint of this version; {AGAIN}")
    mine = settings(cfg, graph)
    theirs = {k: v for k, v in state["settings"].items() if k not in PLACE}
    differing = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    if differing:
        changes = "; ".join("circuit: another region graph" if k == "circuit_graph" else
                            f"{k}: {theirs.get(k)!r} -> {mine.get(k)!r}" for k in differing)
        raise InputError(f"{path} was written with other settings ({changes}); rerun with the checkpoint's "
                         f"settings to resume, or {AGAIN} (only {', '.join(RESUMABLE[:5])} may change across "
                         "a resume)")
    if cfg.steps is not None and cfg.steps < state["step"]:
        raise InputError(f"--steps {cfg.steps} is below the checkpoint's step {state['step']}; give at "
                         f"least {state['step']}, or {AGAIN}")
    return state


def load_trainable(module: torch.nn.Module, state: dict, path: Path) -> None:
    """Copy the checkpoint's trainable tensors into `module` (refused when they are another head's)."""
    params = dict(module.named_parameters())
    wanted = {k: tuple(p.shape) for k, p in params.items() if p.requires_grad}
    stored = {k: tuple(t.shape) for k, t in state["trainable"].items()}
    if wanted != stored:
        raise InputError(f"{path} holds the weights of another head ({len(stored)} tensors, "
                         f"{len(wanted)} expected, or other shapes); pass --no-resume to start over")
    with torch.no_grad():
        for k, t in state["trainable"].items():
            params[k].copy_(t)


def trainable_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.detach().cpu().clone() for k, p in module.named_parameters() if p.requires_grad}
