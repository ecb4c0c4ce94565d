"""One timed generation for `mtpc bench`: the decoder's output and the phase clock's sums, as a `Run`."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..decoding.clock import PhaseClock, split_phases

__all__ = ["Run", "run_one", "synchronized"]


@contextlib.contextmanager
def synchronized(cuda: bool):
    """A timed region on a GPU: the work queued before it is finished before it starts, and its own
    work is finished before it ends (kernels run asynchronously; the host's clock alone would stop
    when the last kernel was queued, not run)."""
    if cuda:
        torch.cuda.synchronize()
    try:
        yield
    finally:
        if cuda:
            torch.cuda.synchronize()


@dataclass
class Run:
    """One generation's numbers: tokens, cycles, decoding seconds, seconds per phase, the output."""

    tokens: int
    cycles: int
    seconds: float
    phases: dict[str, float]
    sequence: list[int]  # prompt + continuation
    prompt_tokens: int
    lookup_cycles: int = 0  # cycles whose draft came from prompt lookup
    accepted_per_cycle: list[int] = field(default_factory=list)  # tokens each cycle committed
    width_per_cycle: list[int] = field(default_factory=list)  # positions each cycle verified (speculative only)
    handed_over_after: int | None = None  # a paced run's tokens before it handed over to plain decoding


def run_one(generate: Callable, clock: PhaseClock, stats_clock: bool, prompt_tokens: int) -> Run:
    """Run `generate()` under `clock`. `stats_clock`: take the decoding time from the decoder's own
    cycle clock (CPU); otherwise from the clock's stamps (CUDA events)."""
    with synchronized(clock.cuda), clock:
        out = generate()
    phases, hooked = split_phases(clock.times())
    stats = out.stats
    seconds = sum(stats.cycle_seconds) if stats_clock else hooked
    return Run(stats.new_tokens, stats.cycles, seconds, phases, out.sequences[0].tolist(), prompt_tokens,
               stats.lookup_cycles, list(stats.accepted_per_cycle), list(stats.width_per_cycle),
               stats.handover.tokens if stats.handover is not None else None)


