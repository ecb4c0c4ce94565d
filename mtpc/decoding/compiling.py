"""`torch.compile` of one cycle step (draft, verify or accept), the same way for every step.

A step is a pure function of fixed-shape tensors (randomness comes in as uniforms, positions as a
tensor), so it compiles once per shape, but for one dimension left dynamic on purpose: the number of cache
slots a call attends over grows cycle by cycle (`dynamic_length`), and one graph serves every length. It
compiles inductor on the CPU (with its C++ wrapper: at batch 1 the
Python wrapper's per-call cost is a visible part of a step); on CUDA `mode="reduce-overhead"`, i.e.
CUDA graphs, whose outputs live in memory the next replay overwrites, so they are copied out.
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["CPU_OPTIONS", "compile_step", "dynamic_length"]


# Each compiled step keeps its own variants (`isolate_recompiles`): by default dynamo files every variant of
# a code object in one list, checks their guards in turn on every call and stops compiling at 8, so the
# decoders of a bench (one `cycle_step` code object, a few variants each) would fall back to eager.
ISOLATED = {"dynamic": False, "isolate_recompiles": True, "recompile_limit": 64}

# Inductor options on a CPU. `cpp_wrapper`: a C++ wrapper around the kernels (measured 0.14-0.20 ms a call
# where the Python one took 0.21-0.31). `cpp.vec_isa_ok`: inductor otherwise proves, in every process, that
# the C++ compiler builds and loads code for each vector ISA the CPU reports, one child Python per check
# (three on our CPU, a few tenths of a second each, in every `mtpc generate --compile`). The ISAs it
# would check are the CPU's own (read from cpuinfo either way), and any g++ or clang of the last several
# years builds for them; the narrower checks (AVX-512 VNNI and bf16, AMX) still run.
CPU_OPTIONS = {"cpp_wrapper": True, "cpp.vec_isa_ok": True}


def compile_step(step: Callable, cuda: bool) -> Callable:
    """`step` compiled for fixed shapes (`dynamic=False`), with its own cache of compiled variants; on CUDA
    its tensor outputs are cloned."""
    if not cuda:
        return torch.compile(step, options=CPU_OPTIONS, **ISOLATED)
    compiled = torch.compile(step, mode="reduce-overhead", **ISOLATED)

    def call(*args):
        return copied(compiled(*args))

    return call


def copied(out):
    """A step's outputs (a tensor, None, or tuples of them) with every tensor cloned."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, tuple):
        return tuple(copied(x) for x in out)
    return out


def dynamic_length(t: torch.Tensor) -> torch.Tensor:
    """`t` with its first dimension marked dynamic: the compiled step traced on it keeps that length symbolic
    (one graph for every length, where `dynamic=False` would compile one per length)."""
    torch._dynamo.mark_dynamic(t, 0)
    return t
