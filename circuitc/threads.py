"""Small calls run on one thread, whatever the caller's torch thread setting.

A batch-1 circuit program is ~60-100 tensor ops of a few microseconds each. With more than one
intra-op thread, torch hands every op above its grain size (and the BLAS calls) to the OpenMP pool;
with `OMP_WAIT_POLICY=PASSIVE` (recommended on shared machines) the pool's threads sleep between ops,
so each of those ops pays a wake-up that costs more than the op itself: BTree n=16 r=32 programs at
B=1 ran 2-5x slower at 2 threads than at 1 (docs/compiler.md). `single_threaded(work)` runs a call
with one thread when its work is below `SMALL_WORK` and restores the caller's setting afterwards.
`torch.set_num_threads` itself costs well under a microsecond here (measured: a 1 -> 2 -> 1 round
trip, 0.2 us), so the scope is cheap enough for every call.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

import torch

__all__ = ["SMALL_WORK", "single_threaded", "single_threaded_when_small"]

# Below this many floating-point operations per call one thread is faster than two (measured on
# the BTree n=16 r=32 log-likelihood at batch 1..256, 1 vs 2 threads, OMP_WAIT_POLICY=PASSIVE:
# see docs/compiler.md); above it the pool's parallelism pays for its wake-ups.
SMALL_WORK = 4_000_000

F = TypeVar("F", bound=Callable)


@contextmanager
def single_threaded(work: float) -> Iterator[None]:
    """Run the block with one torch intra-op thread when `work` (FLOPs) is below `SMALL_WORK`;
    the caller's thread count is restored on exit, also on error. Inside `torch.compile` tracing
    it does nothing (the setting is not part of a graph)."""
    # `is_compiling()` first: under tracing `get_num_threads` is an op dynamo cannot put in a graph.
    if torch.compiler.is_compiling():
        yield
        return
    threads = torch.get_num_threads()
    if threads == 1 or work >= SMALL_WORK:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def single_threaded_when_small(work: Callable[..., float]) -> Callable[[F], F]:
    """Decorator: run the method as under `single_threaded(work(self, *args, **kwargs))`. Inlined
    rather than through the context manager, and the work is only estimated when the caller runs
    more than one thread: at one thread the wrapper costs one `get_num_threads` (a batch-1 program
    is ~250 us, and a context manager plus the estimate measured ~20 us of it)."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def scoped(self, *args, **kwargs):
            # `is_compiling()` before the thread query: under `torch.compile(fullgraph=True)` tracing,
            # `get_num_threads` returns a non-tensor dynamo cannot trace and the compile fails.
            if torch.compiler.is_compiling():
                return method(self, *args, **kwargs)
            threads = torch.get_num_threads()
            if threads == 1 or work(self, *args, **kwargs) >= SMALL_WORK:
                return method(self, *args, **kwargs)
            torch.set_num_threads(1)
            try:
                return method(self, *args, **kwargs)
            finally:
                torch.set_num_threads(threads)

        return scoped  # type: ignore[return-value]

    return wrap
