"""Fused programs: the likelihood queries of a `CompiledCircuit` built with `fuse=True` run through
`torch.compile` (inductor), which fuses each log-space sum layer's pointwise passes (the max shift,
exp, the floor and log around the matmul, the products, the leaf gather) into a few loops.

One compiled program per public program and circuit; inside it torch keeps one compiled graph per
input shape, dtype, grad mode and device (`dynamic=False`: exact shapes give the best kernels).
The first call with a new shape compiles (tens of seconds on a small CPU; inductor's on-disk cache
makes it faster in later processes), so call `warm_up` with the shapes you will use, under the
thread setting and grad mode you will use. `warm_up` also times the fused and the eager program
side by side and keeps the faster one for that shape: fusion is a choice measured per program.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

__all__ = ["FusedPrograms", "RECOMPILE_LIMIT"]

# torch.compile keeps at most `recompile_limit` graphs per function (8 by default) and then runs
# eager without a word; circuits called at several batch sizes, and several circuits, need more.
# Raised only around a call that compiles (a scoped `config.patch`).
RECOMPILE_LIMIT = 64


def call_key(name: str, args: tuple, kwargs: dict) -> tuple:
    """What makes torch.compile build a new graph: shapes, dtypes, devices, grad requirements."""

    def describe(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return (tuple(value.shape), value.dtype, value.device.type, value.requires_grad)
        return value if isinstance(value, (int, float, str, bool, type(None))) else type(value).__name__

    return (name, torch.is_grad_enabled(), tuple(describe(a) for a in args),
            tuple(sorted((k, describe(v)) for k, v in kwargs.items())))


class FusedPrograms:
    """The compiled programs of one circuit, and which shapes run eager because eager was faster."""

    def __init__(self) -> None:
        self._compiled: dict[str, Callable] = {}
        self._seen: set[tuple] = set()  # keys compiled already
        self._eager: set[tuple] = set()  # keys where warm_up measured eager faster

    def call(self, name: str, query: Callable, executor: torch.nn.Module, args: tuple) -> Any:
        """`query(executor, *args)` (the public program `name`): compiled, or eager where `warm_up`
        measured eager faster for these arguments."""
        key = call_key(name, args, {})
        if key in self._eager:
            return query(executor, *args)
        program = self._compiled.get(name)
        if program is None:
            program = torch.compile(query, dynamic=False)
            self._compiled[name] = program
        if key in self._seen:
            return program(executor, *args)
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            out = program(executor, *args)
        self._seen.add(key)
        return out

    def warm_up(self, programs: dict[str, tuple[Callable, tuple]], repeats: int) -> dict[str, dict[str, Any]]:
        """Compile every `name: (public method, args)` for its shapes, time fused and eager (medians
        of `repeats` calls, alternating), and keep eager for the shapes where it was faster."""
        report = {}
        for name, (public, args) in programs.items():
            key = call_key(name, args, {})
            self._eager.discard(key)
            start = time.perf_counter()
            public(*args)  # compiles
            compile_s = time.perf_counter() - start
            fused, eager = [], []
            for _ in range(repeats):
                for use_eager, times in ((False, fused), (True, eager)):
                    if use_eager:
                        self._eager.add(key)
                    start = time.perf_counter()
                    public(*args)
                    times.append(time.perf_counter() - start)
                    self._eager.discard(key)
            fused_ms, eager_ms = 1e3 * statistics.median(fused), 1e3 * statistics.median(eager)
            if eager_ms < fused_ms:
                self._eager.add(key)
            report[name] = {"compile_s": compile_s, "fused_ms": fused_ms, "eager_ms": eager_ms,
                            "uses": "eager" if eager_ms < fused_ms else "fused"}
        return report

    def uses(self, name: str, args: tuple) -> str:
        """"fused" or "eager": what a call of `name` with these arguments runs."""
        return "eager" if call_key(name, args, {}) in self._eager else "fused"
