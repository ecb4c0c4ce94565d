"""The learning-rate schedule both trainers use: linear warm-up, then a cosine decay."""

from __future__ import annotations

import math

__all__ = ["cosine_lr"]


def cosine_lr(base: float, progress: float, step: int, warmup: int, min_ratio: float) -> float:
    """Linear warm-up over `warmup` steps, then a cosine from `base` to `base * min_ratio` as
    `progress` goes from 0 to 1."""
    warm = min(1.0, (step + 1) / max(1, warmup))
    progress = min(max(progress, 0.0), 1.0)
    return base * warm * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
