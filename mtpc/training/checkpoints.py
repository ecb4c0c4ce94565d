"""What the training loop (`loop`) and both trainers (`mtpc train`, `mtpc tiny-lm`) do with files while
they run: write a checkpoint so a kill never leaves half of one, keep the RNG states in a form
`torch.load(weights_only=True)` reads back, append to and trim the JSONL training log.

What goes *into* a checkpoint, and which settings must match to resume, is each trainer's own.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import torch

from .outputs import save_atomically

__all__ = ["write_checkpoint", "rng_state", "set_rng_state", "append_log", "trim_log"]


def write_checkpoint(state: dict, path: Path) -> None:
    """`torch.save(state)` to a temporary file beside `path`, fsynced, then renamed over it: a run
    killed while saving, or a full disk, keeps the previous checkpoint whole and leaves no litter."""
    save_atomically(lambda buffer: torch.save(state, buffer), path)


def rng_state() -> dict:
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


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state` returned."""
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"].tolist()), py["gauss_next"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def append_log(path: Path, record: dict) -> None:
    """One JSON line at the end of the training log."""
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def trim_log(path: Path, step: int) -> None:
    """Drop log records after the checkpoint's `step` (written before a kill; the resumed run writes
    them again), records without a step, and a last line cut short by the kill."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # JSONDecodeError, or an integer too long to convert
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step:
            kept.append(line)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)
