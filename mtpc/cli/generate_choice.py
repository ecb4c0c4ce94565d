"""`mtpc generate`'s measured choices, each stated in one line on stderr:

- `--dtype auto` (the default): float32 for a checkpoint stored in float32, else bf16 where the device runs bf16
  matrix products natively (CUDA, or a CPU with AVX-512 BF16 or AMX) and float32 elsewhere; a forced `--dtype
  bf16` on a CPU without native bf16 is a warning when a head verifies several positions a cycle (each then
  costs about a step);
- with a head and neither `--window` nor `--tree`: plain decoding, a chain of some width or a tree, whichever
  `mtpc.decoding.choice.auto_decoding` expects to be fastest from the head's recorded per-depth acceptance and this
  machine's verify costs (kept in the step store: measured once per model shape, dtype, device and threads);
  a forced `--window` or `--tree` that the same costs expect to be slower than plain decoding is a warning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TextIO

import torch

from .. import hardware
from ..lm import loading

__all__ = ["resolved_dtype", "HeadPlan", "plan_head"]


def resolved_dtype(name: str, device: torch.device, stored: str | None = None) -> tuple[str, str | None]:
    """`--dtype` with `auto` resolved for `device` and a checkpoint of `stored` weights (`loading.resolve_dtype`),
    and what to say of it: the dtype and why (the checkpoint's dtype, or the machine) when `auto` chose it, else
    None."""
    resolved = loading.resolve_dtype(name, device, stored)
    if name != "auto":
        return resolved, None
    why = "the checkpoint's dtype" if stored == "fp32" else hardware.machine_summary(str(device))
    return resolved, f"{resolved} ({why})"


def bf16_warning(dtype: torch.dtype, device: torch.device) -> str | None:
    """The warning for bf16 forced on a CPU without native bf16 kernels, where a head's verify of k positions
    costs about k steps; else None."""
    if dtype != torch.bfloat16 or hardware.native_bf16(str(device)):
        return None
    return (f"mtpc: warning: --dtype bf16 on a CPU without native bf16 kernels "
            f"({hardware.machine_summary(str(device))}): a verify over k positions costs about k steps here, so "
            "speculative decoding may be slower than plain; --dtype auto (fp32 here) is faster\n")


@dataclass(frozen=True)
class HeadPlan:
    """How the head decodes: `plain` (not at all: plain decoding is expected to be faster), else its `window`
    and `tree` (None: the decoder's defaults)."""

    plain: bool
    window: int | None
    tree: object | None


def plan_head(base: torch.nn.Module, head, depth_topk: dict | None, window: int | None, tree, lookup: int | None,
              dtype: torch.dtype, device: torch.device, dtype_note: str | None, err: TextIO) -> HeadPlan:
    """The head's decoding on this machine. Without a recorded table (`depth_topk` None) or a model mtpc can
    split, the flags as given (the decoder's chain of `n` by default), silently. With one: `auto` (no `window`,
    no `tree`) chooses by `choose_decoding` (plain decoding too with `lookup`, whose matches the table cannot
    foresee: never slower than plain is the rule; `--window` forces the head) and says so in one line, with the dtype `--dtype auto` chose (`dtype_note`); a forced `window` or int `tree`
    is scored, and a warning says when plain decoding is expected to be faster."""
    from ..decoding.choice.auto_decoding import choose_decoding, expected_choice
    from ..lm.backbone import SplitBackbone
    from ..decoding.choice.costs import cycle_costs, machine_costs
    from ..decoding.drafts.trees import tree_budget

    forced = window is not None or tree is not None
    warning = bf16_warning(dtype, device)
    if warning:
        err.write(warning)
    prefix = f"mtpc: auto: {dtype_note}" if dtype_note else "mtpc: auto"
    backbone = SplitBackbone(base)
    if depth_topk is None or backbone.whole_model:  # nothing to score a choice by: the flags, said by no line
        return HeadPlan(False, window, tree)
    costs = machine_costs(backbone, dtype, device)
    if head.parameterisation == "tied":  # its input units are the model's output layer (the decoder ties it again)
        head.tie_to(base.get_output_embeddings())
    cycle = cycle_costs(base, head, costs.call_seconds)
    measured = (f"a plain step {cycle.step * 1e3:.1f} ms, a cycle's work besides its verify call "
                f"{cycle.overhead:.2f} steps; {costs.describe()}")
    n, states = head.num_variables, head.num_states
    if forced:
        budget = tree_budget(tree, n, states) if isinstance(tree, int) and not isinstance(tree, bool) else None
        expected = expected_choice(depth_topk, costs.call_seconds, cycle.overhead, window=window or max(n, 2),
                                   tree=budget) if budget is not None or tree is None else None
        if expected is not None and expected.rate() < 1.0:
            err.write(f"mtpc: warning: {expected.describe()}: slower than plain decoding on this machine by the "
                      f"head's recorded acceptance ({measured}); without --window and --tree mtpc chooses\n")
        return HeadPlan(False, window, tree)
    choice = choose_decoding(depth_topk, costs.call_seconds, cycle.overhead, n, states)
    with_lookup = ""
    if choice.kind == "plain" and lookup is not None:  # the table cannot foresee matches: plain is the safe side
        with_lookup = "; --lookup's matches go with the head: --window N decodes with both"
    err.write(f"{prefix}; {choice.describe()}{with_lookup} (the head's recorded acceptance; {measured})\n")
    return HeadPlan(choice.kind == "plain", choice.window, choice.tree)
