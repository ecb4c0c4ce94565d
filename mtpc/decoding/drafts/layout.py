"""A decoder's window layout: one value, built once from the head's `n` and the user's window, tree, lookup and
host proposers, that every part of the cycle asks (the decoder, the proposers, the acceptance, the compiled
steps' keys) instead of sizing windows itself.

A chain and a tree are both layouts: `tree` is None for chains. `widths` are the circuit windows' verify
widths (a tree's: its node budget), `span` the tokens every window holds (the widest window of any
proposer), `depth` the deepest path a tree verifies (its lookup branch included). `draws` says which of a
sampling cycle's uniforms serve which draw; exactness depends on every user reading the same split.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from ...sampling import Sampling
from .drafting import AdaptiveWidth, window_widths
from .trees import TreeBudget, tree_draws

__all__ = ["CycleDraws", "WindowLayout"]


@dataclass(frozen=True)
class CycleDraws:
    """How a sampling cycle's uniforms `[B, draft + fill + decide]` float64 split: `draft` columns draw the
    next windows (a chain's `n`, a tree's children: `trees.tree_draws`), `fill` a host proposer's circuit fill
    after its own tokens, `decide` this cycle's acceptance (a chain's first `W` of them test its verified
    positions and draw the next `x_0`; a tree's walk reads all of them). Each draw has columns of its own; a
    greedy cycle (its `sampling` says so) draws nothing."""

    draft: int
    fill: int
    decide: int
    tree: bool = False

    @property
    def total(self) -> int:
        return self.draft + self.fill + self.decide

    def of_draft(self, sampling: Sampling, uniforms: torch.Tensor | None) -> torch.Tensor | None:
        return None if sampling.greedy else uniforms[:, :self.draft]

    def of_fill(self, sampling: Sampling, uniforms: torch.Tensor | None, row: int) -> torch.Tensor | None:
        return None if sampling.greedy else uniforms[row, self.draft:self.draft + self.fill]

    def of_decide(self, sampling: Sampling, uniforms: torch.Tensor | None, width: int) -> torch.Tensor | None:
        """The acceptance's columns for a verify `width` (all of them for a tree)."""
        start = self.draft + self.fill
        return None if sampling.greedy else uniforms[:, start:start + (self.decide if self.tree else width)]


@dataclass(frozen=True)
class WindowLayout:
    """The windows of one decoder. `n`: the head's positions; `widths`: the circuit windows' verify widths
    (sorted; a tree's node budget alone); `position_cost`: what a verified position costs when choosing among
    `widths` (`AdaptiveWidth`; None: the device's default); `tree`: a tree's checked budget, None for chains;
    `lookup_tokens`: prompt lookup's tokens per match (0: no lookup); `proposer_spans`: each other host
    proposer's longest window."""

    n: int
    widths: tuple[int, ...]
    position_cost: float | None
    tree: TreeBudget | None = None
    lookup_tokens: int = 0
    proposer_spans: tuple[int, ...] = ()

    @classmethod
    def build(cls, n: int, window: int | AdaptiveWidth | None, tree: TreeBudget | None, lookup_tokens: int = 0,
              proposer_spans: tuple[int, ...] = ()) -> WindowLayout:
        """The layout of a checked `tree` (`trees.tree_budget`), else of chains of `window` (`window_widths`)."""
        widths, position_cost = ((tree.nodes,), 0.0) if tree is not None else window_widths(window, n)
        return cls(n, widths, position_cost, tree, lookup_tokens, tuple(proposer_spans))

    @property
    def widest(self) -> int:  # the widest verify width of a circuit window
        return self.widths[-1]

    @property
    def reserve(self) -> int:
        """A tree's nodes after the circuit's, left empty for a lookup branch (0 for chains)."""
        return self.lookup_tokens if self.tree is not None else 0

    @property
    def circuit_depth(self) -> int:
        """The deepest path of the circuit's own tree: `n - 1`, or less in a smaller budget (0 for chains)."""
        return 0 if self.tree is None else min(self.n, self.tree.nodes) - 1

    @property
    def depth(self) -> int:
        """The deepest path a tree verifies, a lookup branch included (0 for chains)."""
        return 0 if self.tree is None else max(self.circuit_depth, self.reserve)

    @property
    def lookup_span(self) -> int:
        """The tokens of prompt lookup's window: a tree's nodes and its branch after them, or a chain's
        window of `x_0` and a match's tokens (whichever is wider)."""
        if self.tree is not None:
            return self.widest + self.lookup_tokens
        return max(self.widest, 1 + self.lookup_tokens)

    @property
    def lookup_widths(self) -> tuple[int, ...]:
        """The verify widths a lookup window may take: the circuit's and its own span."""
        return tuple(sorted(set(self.widths) | {self.lookup_span}))

    @property
    def span(self) -> int:
        """The tokens of every window: the widest any proposer drafts."""
        lookup = self.lookup_span if self.lookup_tokens else 0
        return max(self.widest + self.reserve, lookup, *self.proposer_spans)

    @cached_property
    def draws(self) -> CycleDraws:
        """How a sampling cycle's uniforms split: a chain's draft takes `n`, a tree's `tree_draws`; a host
        proposer's fill `n`; a chain's acceptance up to `span`, a tree's walk `branching + 2` per depth (its
        stages' tests and the final draw)."""
        if self.tree is None:
            return CycleDraws(self.n, self.n, self.span)
        return CycleDraws(tree_draws(self.tree, self.n), self.n, (self.depth + 1) * (self.tree.children() + 2),
                          tree=True)
