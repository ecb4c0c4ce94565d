"""How far along a training run is, and the learning rate that follows from it.

A budget turns where the run stands (its step and its seconds of training, resumed runs included)
into `done`, the fraction of the run behind it: the loop stops at 1 and the trainers feed it to
`cosine_lr`, a linear warm-up then a cosine decay.

- `StepBudget`: a number of steps (`--steps`). With `minutes` (`mtpc train --minutes`) the number is
  re-sized after every step from the mean time per step so far, so the cosine spans the steps the
  time allows; it is unknown (`done` stays 0) until step 2.
- `ClockBudget`: the wall clock itself (`mtpc tiny-lm --minutes`): `done` is the share of the
  seconds spent, so the cosine follows the clock.

Rank 0's clock decides a time budget for every rank (`broadcast_from_main`), so all ranks stop at
the same step.
"""

from __future__ import annotations

import math

import torch

from .distributed import Dist, broadcast_from_main

__all__ = ["cosine_lr", "StepBudget", "ClockBudget"]


def cosine_lr(base: float, progress: float, step: int, warmup: int, min_ratio: float) -> float:
    """Linear warm-up over `warmup` steps, then a cosine from `base` to `base * min_ratio` as
    `progress` goes from 0 to 1."""
    warm = min(1.0, (step + 1) / max(1, warmup))
    progress = min(max(progress, 0.0), 1.0)
    return base * warm * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class StepBudget:
    """`total` steps (None: not sized yet); with `minutes`, `total` is re-sized after every step."""

    unit = "step"

    def __init__(self, total: int | None, minutes: float | None = None):
        self.total, self.minutes, self.done = total, minutes, 0.0

    def update(self, step: int, elapsed: float, d: Dist) -> None:
        if self.minutes is not None and step >= 2:
            self.total = self._sized(step, elapsed, d)
        self.done = step / self.total if self.total else 0.0

    def _sized(self, step: int, elapsed: float, d: Dist) -> int:
        """Steps the budget allows at the mean time per step so far, re-sized after every step: the
        time per step drifts over a run (slow first steps, the other jobs on the machine), and a count
        fixed after two steps ended a 15-minute run in 12."""
        per_step = broadcast_from_main(torch.tensor([elapsed / step], dtype=torch.float64, device=d.device),
                                       d)  # NCCL: on the GPU
        return max(step, int(self.minutes * 60 / per_step.item()))

    @property
    def bar_total(self) -> int:
        return self.total or 0

    def bar_value(self, step: int, elapsed: float) -> float:
        return step


class ClockBudget:
    """`minutes` of training, the schedule following the clock."""

    unit = "s"

    def __init__(self, minutes: float):
        self.seconds, self.done = minutes * 60, 0.0

    def update(self, step: int, elapsed: float, d: Dist) -> None:
        done = torch.tensor([elapsed / self.seconds], dtype=torch.float64, device=d.device)
        self.done = broadcast_from_main(done, d).item()

    @property
    def bar_total(self) -> int:
        return int(round(self.seconds))

    def bar_value(self, step: int, elapsed: float) -> float:
        return elapsed
