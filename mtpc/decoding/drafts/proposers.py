"""Proposers: what drafts a cycle's window. They only propose; the decoder verifies and accepts.

Two kinds, one contract each:

- the circuit head (`CircuitProposer`) drafts every row's next window on the device, inside the cycle
  step, right after the acceptance: `draft(h, first, draws, temperature) -> Window` (fixed shapes; the
  compiled step traces it);
- host proposers (`HostProposer`: prompt lookup's `LookupProposer`, or a user's own, say a small draft
  LM) see each live row before a cycle (`propose(row) -> RowWindow | None`) and may replace the circuit's
  window of that row with their own; after the cycle `observe(row, outcome)` tells each of them what
  was kept. The decoder asks them in order; the first window wins, the circuit's stands otherwise.

Exactness asks one thing of a host proposer: its choice to propose may read only the past (the row's
committed text, earlier outcomes), never the circuit's random draft of this cycle. Its window carries
its own proposal rows (a point mass at a deterministic token), so any proposal is verified exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ...sampling import Sampling
from ..cycle.acceptance import TreeProposals
from .drafting import Drafter, Window, WindowShape
from .proposals import LookupState, PromptLookup
from .layout import WindowLayout
from .trees import choose_tree, with_branch

__all__ = ["CircuitProposer", "HostProposer", "LookupProposer", "Outcome", "RowView", "RowWindow", "point_mass_window"]


@dataclass
class RowView:
    """What a host proposer sees of row `row` before a cycle: `first`, its committed `x_0` (the window's first
    token), `hidden` `[d]`, the draft hidden state at its last committed token, `draws` `[n]` float64 uniforms
    it may use for a circuit fill, the generation's `sampling` and the `temperature` the circuit drafts at;
    `circuit`, the batch's windows the circuit drafted for this cycle (a tree decoder's lookup grafts its
    branch onto the row's tree)."""

    row: int
    first: int
    hidden: torch.Tensor
    draws: torch.Tensor | None
    sampling: Sampling
    temperature: float
    circuit: Window | None = None


@dataclass
class RowWindow:
    """A host proposer's window for one row: `window` (one row: tokens `[S]`, rows `[S, V]` or None, width
    `[]`), its verify `width` and how many of its tokens are real (`length`)."""

    window: Window
    width: int
    length: int


@dataclass
class Outcome:
    """What a cycle kept of row `row`: `accepted` tokens committed (`x_0` first), `committed` the ids, and
    which proposer drafted its window (`proposer`: a name; "circuit" for the head)."""

    row: int
    accepted: int
    committed: list[int]
    proposer: str


def point_mass_window(row: RowView, tokens: list[int], vocab: int) -> RowWindow:
    """A window of deterministic proposals for `row`: `[x_0, tokens...]`, each token proposed with probability
    1 (when sampling, a point-mass proposal row; greedy needs none), verified over all of them."""
    device = row.hidden.device
    ids = torch.tensor([row.first, *tokens], dtype=torch.long, device=device)  # [S]
    width, chain = torch.tensor(len(ids), device=device), WindowShape.chain(len(ids), device=device)
    if row.sampling.greedy:
        return RowWindow(Window(ids, None, width, chain), len(ids), len(ids))
    rows = torch.zeros(len(ids), vocab, dtype=torch.float64, device=device)  # [S, V]
    rows[1:].scatter_(1, ids[1:, None], 1.0)
    return RowWindow(Window(ids, rows, width, chain), len(ids), len(ids))


class HostProposer(Protocol):
    """A proposer the decoder asks on the host. `name` (the stats count windows by it), `widths` (every verify
    width its windows may take: each is a compiled variant of the cycle step), `span` (its longest window, in
    tokens, `x_0` included)."""

    name: str
    widths: tuple[int, ...]
    span: int

    def start(self, prompts: list[list[int]]) -> None:
        """A new generation of these prompts (one list of ids per row, padding removed)."""

    def propose(self, row: RowView) -> RowWindow | None:
        """This row's window for the coming cycle, or None to leave it to the others."""

    def observe(self, outcome: Outcome) -> None:
        """What the cycle kept of one row that verified."""


class CircuitProposer:
    """The head's circuit: every row's window, drafted on the device after its `x_0` (`Drafter.circuit_window`),
    or with a `tree` budget every row's tree of drafts (`mtpc.decoding.drafts.trees.choose_tree`; sampling draws its
    children)."""

    name = "circuit"

    def __init__(self, drafter: Drafter, layout: WindowLayout):
        self.drafter, self.layout = drafter, layout

    def draft(self, h: torch.Tensor, first: torch.Tensor, sampling: Sampling, draws: torch.Tensor | None,
              temperature: float) -> Window:
        """`h` `[B, d]`, `first` `[B]` long, `draws` (sampling) `[B, n]` or a tree's `[B, tree_draws]` -> the
        batch's windows."""
        if self.layout.tree is not None:
            return choose_tree(self.drafter, self.layout.tree, h, first, sampling, self.layout.reserve, draws,
                               temperature)
        return self.drafter.circuit_window(h, first, sampling, draws, temperature)

    def tree_proposals(self, window: Window, width: int, sampling: Sampling) -> TreeProposals | None:
        """What a sampled tree's first `width` nodes were drawn from (None: greedy, or a chain)."""
        if self.layout.tree is None or sampling.greedy:
            return None
        head = self.drafter.head
        row_tokens = head.state_tokens if head.state_tokens is not None else torch.arange(
            head.num_states, device=window.rows.device)
        tree = self.layout.tree
        return TreeProposals(window.rows[:, :width], row_tokens, tree.nodes, tree.children(), self.layout.circuit_depth)


class LookupProposer:
    """Prompt lookup as a host proposer: the tokens that followed the latest earlier occurrence of the row's
    last few tokens, chosen over the circuit by `LookupState.use` (the past only), and the circuit's draft
    after them when they end inside its `n` positions. In a tree's layout every match is a branch of the row's
    tree instead (`trees.with_branch`): no choice between sources, the verifier keeps whichever path it agrees
    with."""

    name = "lookup"

    def __init__(self, lookup: PromptLookup, drafter: Drafter, layout: WindowLayout):
        self.lookup, self.drafter, self.layout = lookup, drafter, layout
        self.span, self.widths = layout.lookup_span, layout.lookup_widths  # a tree's branch: nodes after the circuit's
        self.states: list[LookupState] = []
        self.first_added: list[bool] = []  # per row: this cycle's x_0 is in its text already (`propose` saw it)

    def start(self, prompts: list[list[int]]) -> None:
        self.states = [LookupState(self.lookup) for _ in prompts]
        self.first_added = [False] * len(prompts)
        for state, prompt in zip(self.states, prompts):
            state.extend(prompt)

    def propose(self, row: RowView) -> RowWindow | None:
        state = self.states[row.row]
        state.extend([row.first])  # x_0 is committed: the match may end with it
        self.first_added[row.row] = True
        proposal = state.propose()
        if proposal is not None and self.layout.tree is not None:
            tree = with_branch(row.circuit, row.row, proposal.tokens, self.layout.widest)
            return RowWindow(tree, self.span, self.layout.depth + 1)
        if proposal is None or not state.use(proposal):
            return None
        tokens = proposal.tokens[:state.length(proposal, self.layout.widest)]
        length = self.drafter.lookup_length(tokens)
        width = next((w for w in self.layout.widths if w >= length), self.span)
        window = self.drafter.lookup_window(row.hidden, row.first, tokens, width, row.sampling, row.draws,
                                            row.temperature)
        return RowWindow(window, width, length)

    def observe(self, outcome: Outcome) -> None:
        state = self.states[outcome.row]
        if outcome.proposer == CircuitProposer.name:  # the circuit's running acceptance, which `use` compares with
            state.record_circuit(outcome.accepted - 1)
        state.extend(outcome.committed[1:] if self.first_added[outcome.row] else outcome.committed)
        self.first_added[outcome.row] = False
