"""`--tree auto` for a head folder, the one path `mtpc generate` and `mtpc bench` both take: the head's
recorded per-depth acceptance read and checked when the command starts, before any model loads
(`recorded_acceptance`), the verify call's cost measured on the loaded LM (`verify_costs`), and the tree
`mtpc.decoding.drafts.trees.auto_tree` chooses from the two (`choose_auto_tree`). The same table and costs give
the same tree in both commands, and only a tree `tree_budget` accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ...lm import loading
from ...errors import InputError
from ...lm.backbone import SplitBackbone
from ..drafts.trees import AUTO_TREE_WIDTHS, TreeBudget, auto_tree
from ..cycle.verify import verify_call_seconds

__all__ = ["AutoTree", "choose_auto_tree", "recorded_acceptance", "verify_costs"]


def recorded_acceptance(head: str | Path, label: str, flag: str = "--tree auto") -> dict:
    """The head folder's checked per-depth acceptance (`mtpc.lm.loading.head_depth_topk`: a malformed table is
    an `InputError` naming its file); a head that records none is an `InputError` naming `label` and the `flag`
    that asked for it."""
    table = loading.head_depth_topk(head)
    if table is None:
        raise InputError(f"{flag}: the head {label} records no per-depth acceptance (val_depth_topk in "
                         f"train_config.json, or {loading.DEPTH_TOPK_FILE} from benchmarks/depth_acceptance.py): "
                         f"give {flag.split()[0]} N")
    return table


def verify_costs(model: torch.nn.Module, instead: str) -> dict[int, float]:
    """The LM's verify call seconds by width (`AUTO_TREE_WIDTHS`), measured now; a model without a family
    adapter (no slot caches, so no tree) is an `InputError` that ends with `instead`."""
    backbone = SplitBackbone(model)
    try:
        backbone.require_slot_caches("--tree: a tree of drafts", instead)
    except ValueError as e:
        raise InputError(str(e)) from None
    return verify_call_seconds(backbone, AUTO_TREE_WIDTHS)


@dataclass(frozen=True)
class AutoTree:
    """What `--tree auto` chose for a head: `budget` (None: no tree beats plain decoding, so the head's
    chain), the tokens a cycle it expects, its cost in one-position calls, and the verify seconds by width
    it was chosen from."""

    budget: TreeBudget | None
    tokens: float
    cost: float
    call_seconds: dict[int, float]

    def depth(self) -> int | None:
        """The full tree's depth (None for a chain)."""
        if self.budget is None:
            return None
        depth, nodes, width = 0, 1, 1
        while nodes < self.budget.nodes:
            depth, width = depth + 1, width * self.budget.children()
            nodes += width
        return depth

    def summary(self) -> dict:
        """The choice as `mtpc bench` reports it (a row's `tree_auto`)."""
        return {"nodes": self.budget.nodes if self.budget else None,
                "children": self.budget.children() if self.budget else None,
                "expected_tokens": round(self.tokens, 3), "cost": round(self.cost, 3),
                "call_ms": {w: round(s * 1e3, 3) for w, s in self.call_seconds.items()}}

    def line(self) -> str:
        """The choice as `mtpc generate` says it, one line."""
        curve = ", ".join(f"{w}: {s * 1e3:.1f}" for w, s in self.call_seconds.items())
        if self.budget is None:
            return (f"mtpc: --tree auto: no tree beats plain decoding by the head's recorded acceptance; decoding "
                    f"chains (verify call ms by width: {curve})")
        return (f"mtpc: --tree auto: {self.budget.nodes} nodes ({self.budget.children()} children a node, depth "
                f"{self.depth()}): {self.tokens:.2f} tokens a cycle expected at {self.cost:.2f}x a one-token call "
                f"(the head's held-out top-k acceptance; verify call ms by width, measured now: {curve})")


def choose_auto_tree(depth_topk: dict, call_seconds: dict[int, float], n: int, states: int) -> AutoTree:
    """The tree `auto_tree` chooses for a head of `n` variables and `states` states, with what it expects."""
    budget, tokens, cost = auto_tree(depth_topk, call_seconds, n, states)
    return AutoTree(budget, tokens, cost, dict(call_seconds))
