"""Progress bars for long work (training, data generation): tqdm, moved to a value rather than by steps."""

from __future__ import annotations

from tqdm.auto import tqdm

__all__ = ["progress_bar", "advance"]


def progress_bar(total: int, unit: str, enabled: bool, desc: str):
    return tqdm(total=total, unit=unit, desc=desc, disable=not enabled, dynamic_ncols=True, mininterval=1.0)


def advance(bar, value: float) -> None:
    """Move `bar` to `value` (whole units, never past its total)."""
    target = min(int(value), bar.total)
    if target > bar.n:
        bar.update(target - bar.n)
