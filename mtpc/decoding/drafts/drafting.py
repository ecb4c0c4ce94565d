"""The draft seam of a cycle: a draft hidden state and a committed first token -> one window.

A `Window` is `[x_0, d_1 .. d_{S-1}]` on the device, padded to one span `S` for every window of a
decoder (the circuit's `n` positions, or a prompt-lookup window's `1 + K` when that is longer), with
the proposal rows the acceptance needs (sampling) and the verify width chosen for it. `x_0` is
already committed; the verifier tests `d_1 .. d_{width-1}`.

The circuit's window (`Drafter.circuit_window`, one fixed-shape function the decoder's cycle step
runs after its acceptance) is head -> `circuitc.runtime.draft.DraftProgram` conditioned on `x_0` (the
sequential argmax of the circuit's exact conditionals when greedy; when sampling, a draw from the
cycle's uniforms of each conditional at the draft temperature, the verifier's own temperature by
default: a circuit distilled at T = 1 proposes what a sampler at T = 0.7 would draw only when it is
sharpened like the verifier) -> the conditionals it drew from. Its verify width is the decoder's fixed
width or, with `AdaptiveWidth`, read off the draft's own probabilities: the width that maximises the
tokens a cycle expects to commit per unit of cycle cost, by the circuit's own account. The width reads only the draft and the past,
so every position's test is unchanged and decoding stays exact; only where the window stops moves.

A lookup window (`Drafter.lookup_window`, drafted eagerly on the host's choice) is `x_0`, then the
lookup tokens as point-mass proposals, then (when they end inside the circuit's `n` positions) the
circuit's draft conditioned on all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from circuitc.runtime.draft import DraftProgram

from ...heads import MTPHead
from ...sampling import Sampling

__all__ = ["AdaptiveWidth", "Drafter", "Window", "WindowShape", "window_widths"]


@dataclass
class WindowShape:
    """Where each of a window's `N` tokens hangs: `parents` `[B, N]` long (node 0, the committed `x_0`, is its
    own parent; every other node's parent comes before it) and `depths` `[B, N]` long (0 at `x_0`). A chain is
    the special case `parents[j] = j - 1`, `depths[j] = j` (`chain`); a tree verifies several continuations
    of each prefix in one call (`mtpc.decoding.drafts.trees`). Every row of a batch has its own shape. Whether a
    decoder verifies chains or trees is its layout's to say (`WindowLayout.tree`), never the shape's."""

    parents: torch.Tensor
    depths: torch.Tensor

    @staticmethod
    def chain(*size: int, device=None) -> "WindowShape":
        """A chain of `size[-1]` tokens, for a batch (`B, N`) or one row (`N`): each token under the one before."""
        depths = torch.arange(size[-1], device=device).expand(*size)  # [B, N] or [N]
        return WindowShape((depths - 1).clamp_min(0), depths)

    def first(self, nodes: int) -> "WindowShape":
        """The shape of the first `nodes` nodes (their parents all among them: parents come first)."""
        return WindowShape(self.parents[:, :nodes], self.depths[:, :nodes])

    def ancestors(self, max_depth: int) -> torch.Tensor:
        """`[B, N, N]` bool: `[b, i, j]` is True where node `j` is node `i` or one of its ancestors (what node `i`
        may attend to of the window); `max_depth` bounds the depths (a window's drafted positions)."""
        B, N = self.parents.shape
        node = torch.arange(N, device=self.parents.device).expand(B, N)  # [B, N]
        seen = torch.zeros(B, N, N, dtype=torch.bool, device=node.device).scatter_(2, node[..., None], True)
        for _ in range(max_depth):
            node = self.parents.gather(1, node)  # [B, N] one step up (the root stays the root)
            seen = seen.scatter(2, node[..., None], True)
        return seen


torch.utils._pytree.register_dataclass(WindowShape)


@dataclass
class Window:
    """A batch of windows on the device, one per row. `tokens` `[B, S]` long (`tokens[:, 0]` = the
    committed `x_0`, padding after the real tokens); `rows` `[B, S, V]` float64 (sampling; None when
    greedy): `rows[b, j]` is the proposal of position `j` (the circuit's exact conditional, or a point
    mass at a lookup token); `width` `[B]` long: how many positions each row verifies (2 .. S); `shape`: where
    each token hangs (`WindowShape`: a tree's, or a chain's, the tokens in order)."""

    tokens: torch.Tensor
    rows: torch.Tensor | None
    width: torch.Tensor
    shape: WindowShape

    def with_row(self, b: int, row: "Window") -> "Window":
        """This batch with row `b` replaced by `row` (a one-row window: `[S]`, `[S, V]`, `[]`, a shape's `[S]`).
        Eager."""
        tokens, width = self.tokens.clone(), self.width.clone()
        tokens[b], width[b] = row.tokens, row.width
        rows = None
        if self.rows is not None:
            rows = self.rows.clone()
            rows[b] = row.rows
        shape = WindowShape(self.shape.parents.clone(), self.shape.depths.clone())
        shape.parents[b], shape.depths[b] = row.shape.parents, row.shape.depths
        return Window(tokens, rows, width, shape)

    def padded(self, span: int) -> "Window":
        """One row's window `[m]` (a host proposer's) padded to `span` tokens (zeros, and zero proposal rows; as a
        tree's empty nodes, each under the root at depth 0: never verified, the width ends before them)."""
        missing = span - self.tokens.shape[-1]
        if missing <= 0:
            return self
        tokens = torch.cat([self.tokens, self.tokens.new_zeros(missing)])
        rows = None if self.rows is None else torch.cat([self.rows, self.rows.new_zeros(missing, self.rows.shape[-1])])
        shape = WindowShape(*(torch.cat([t, t.new_zeros(missing)]) for t in (self.shape.parents, self.shape.depths)))
        return Window(tokens, rows, self.width, shape)


torch.utils._pytree.register_dataclass(Window)  # a compiled step takes and returns it as one graph's tensors


@dataclass(frozen=True)
class AdaptiveWidth:
    """Choose each circuit window's verify width from the draft's own probabilities.

    With `c_j` the circuit's probability of its drafted token `d_j` (its most likely continuation when
    greedy: the probability the circuit gives that its draft is right), a width `w` is expected to
    commit `1 + sum_{j < w} c_1 .. c_j` tokens and to cost `1 + position_cost * (w - 1)` units of a
    one-position cycle; the decoder verifies the width (of `widths`) with the most tokens per unit.
    `position_cost`: a verified position's share of a cycle's cost (None: 0.08 on a CPU, where a
    verified position costs ~0.3-0.6 ms of a ~5-7 ms cycle; 0.01 on a GPU, where it costs next to
    nothing). `widths`: the candidate widths (None: about 2, n/2, 3n/4 and n); each is one compiled
    variant of the cycle step."""

    position_cost: float | None = None
    widths: tuple[int, ...] | None = None

    def __post_init__(self):
        cost = self.position_cost
        if cost is not None and (isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 <= cost < 10):
            raise ValueError(f"position_cost must be a number in [0, 10), got {cost!r}")
        if self.widths is not None and not isinstance(self.widths, (tuple, list)):
            raise ValueError(f"AdaptiveWidth widths must be a tuple of verify widths (None: about 2, n/2, 3n/4 and n), "
                             f"got {self.widths!r}")


def window_widths(window: int | AdaptiveWidth | None, n: int) -> tuple[tuple[int, ...], float | None]:
    """The verify widths a decoder's circuit windows may take (each 2 .. max(n, 2)) and the position
    cost that chooses among them (None: the device's default): `window` an int -> that width alone; None -> the widest alone; an
    `AdaptiveWidth` -> its widths (default about 2, n/2, 3n/4, n)."""
    widest = max(n, 2)
    if window is None:
        return (widest,), 0.0
    if isinstance(window, int) and not isinstance(window, bool):
        if not 2 <= window <= widest:
            raise ValueError(f"window must be an integer from 2 to the circuit's {widest} positions, got {window!r}")
        return (window,), 0.0
    if not isinstance(window, AdaptiveWidth):
        raise ValueError(f"window must be an integer from 2 to the circuit's {widest} positions or an "
                         f"AdaptiveWidth, got {window!r}")
    adaptive = window
    widths = adaptive.widths or tuple(max(2, w) for w in (2, -(-widest // 2), -(-3 * widest // 4), widest))
    if any(not isinstance(w, int) or not 2 <= w <= widest for w in widths):
        raise ValueError(f"AdaptiveWidth widths must be integers from 2 to the circuit's {widest}, got {widths!r}")
    return tuple(sorted(set(widths))), adaptive.position_cost


class Drafter:
    """Windows of one head. `widths`: the circuit windows' verify widths; `position_cost`: what a
    verified position costs (see `AdaptiveWidth`; None: the device's default); `span`: the token count of
    every window; `vocab`: the verifier's vocabulary (proposal rows are `[span, vocab]`)."""

    def __init__(self, head: MTPHead, widths: tuple[int, ...], position_cost: float | None, span: int, vocab: int):
        if head.graph is None:
            raise ValueError("the head's circuit has no region graph (build the head from a RegionGraph, a .pc/.json "
                             "source or a compiled circuit that keeps `.graph`): the decoder drafts with its "
                             "circuitc.runtime.draft.DraftProgram")
        self.head, self.n, self.v = head, head.num_variables, head.num_states
        self.program = DraftProgram(head.graph, head.circ.param_layout)
        self.widths, self.span, self.vocab = widths, span, vocab
        self._weight = next(head.parameters())  # the head's dtype and device, as `head.to(...)` leaves them
        self._vocabulary = None if head.vocabulary is None else frozenset(head.vocabulary)  # host-side lookups
        device = self._weight.device
        self.position_cost = position_cost if position_cost is not None else (0.01 if device.type == "cuda" else 0.08)
        # made once on the head's device: `.to(h.device)` per window is then a no-op, not a copy per cycle
        self._candidates = torch.tensor(widths, device=device)
        self._fixed_width = torch.tensor(widths[-1], device=device)

    def theta(self, h: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """`[..., P]` the circuit's parameters at the draft hidden states `h` `[..., d]` of windows whose first
        token is `first` `[...]` long (read when the head reads it: `MTPHead.read_first_token`)."""
        if h.dtype != self._weight.dtype:
            h = h.to(self._weight.dtype)
        return self.head(self.head.with_first_token(h, first))

    def circuit_window(self, h: torch.Tensor, first: torch.Tensor, sampling: Sampling,
                       uniforms: torch.Tensor | None = None, temperature: float = 1.0) -> Window:
        """One fixed-shape draft per row: `h` `[B, d]`, `first` `[B]` long (each row's committed `x_0`) -> the
        circuit's windows after them: greedy, its sequential argmax; sampling, each drafted token drawn with
        `uniforms` `[B, n]` float64 from the circuit's conditional at `temperature` (see `DraftProgram.sample`)."""
        # a first token the circuit has no state for (a special token past its `v`, a token outside its draft
        # vocabulary) is state `v`: the draft programs leave it unobserved, summed out of the conditionals (as
        # training's windows do; 35 against 27 first drafted tokens right of 119 such positions on SmolLM2's
        # code, benchmarks/first_token_gap.py), and the head reads its last state's embedding
        prefix = self.head.states_of(first).clamp_max(self.v)  # [B] states, or v
        theta = self.theta(h, prefix)  # [B, P]
        uniforms = None if sampling.greedy else uniforms  # the draft programs' own convention: None draws nothing
        drafted, conditionals = self._drafts(theta, prefix, uniforms, temperature)  # [B, n], [B, n, v] or None
        tokens = self._padded(torch.cat([first[:, None], self.head.tokens_of(drafted[:, 1:])], 1))  # [B, S]
        if len(self.widths) > 1:
            width = self._width(conditionals[:, 1:].gather(2, drafted[:, 1:, None])[..., 0])  # from c_j, [B, n-1]
        else:
            width = self._fixed_width
            if width.device != h.device:  # made on the head's device at first, where `h` is
                width = width.to(h.device)
            width = width.expand(h.shape[0])
        chain = WindowShape.chain(*tokens.shape, device=tokens.device)
        if sampling.greedy:
            return Window(tokens, None, width, chain)
        return Window(tokens, self._rows(conditionals, h.device), width, chain)

    def _drafts(self, theta: torch.Tensor, prefix: torch.Tensor, uniforms: torch.Tensor | None, temperature: float):
        """Every row's draft `[B, n]` and, when sampling or choosing widths, its conditionals `[B, n, v]`.
        The draft program drafts one row; a batch runs it under `torch.func.vmap` (B = 1 calls it as is)."""
        # `x`: one row's prefix `[1]` (the program's own shape: no view per call)
        if uniforms is None and len(self.widths) == 1:  # a fixed width needs no probabilities: the cheapest draft
            draft = lambda t, x: (self.program.greedy(t, x), None)  # noqa: E731
        elif uniforms is None:
            draft = lambda t, x: self.program.greedy(t, x, with_rows=True)  # noqa: E731
        else:
            draft = lambda t, x, u: self.program.sample(t, None, x, u, temperature)  # noqa: E731
        if theta.shape[0] == 1:
            drafted, conditionals = draft(theta[0], prefix, *(() if uniforms is None else (uniforms[0],)))
            return drafted[None], None if conditionals is None else conditionals[None]
        args = (theta, prefix[:, None]) if uniforms is None else (theta, prefix[:, None], uniforms)
        if uniforms is None and len(self.widths) == 1:
            return torch.func.vmap(lambda *a: draft(*a)[0])(*args), None
        return torch.func.vmap(draft)(*args)

    def lookup_window(self, h: torch.Tensor, first: int, proposal: list[int], width: int, sampling: Sampling,
                      uniforms: torch.Tensor | None = None, temperature: float = 1.0) -> Window:
        """One row's window (`tokens` `[S]`, `rows` `[S, V]`, `width` `[]`; the decoder puts it in its
        batch): `[x_0, proposal]` (point-mass proposals), then the circuit's draft after them up to its
        `n` positions when they end earlier and the circuit can observe them all. `h` `[d]`; `width`: the
        verify width; `sampling`, `uniforms` `[n]` and `temperature` as for `circuit_window`. Eager (a lookup
        window's prefix length varies)."""
        given = [first] + proposal
        device = h.device
        prefix = torch.tensor(given, dtype=torch.long, device=device)
        if len(given) >= self.n or not self._has_states(proposal):
            tokens, conditionals = prefix, None
        else:
            states = self.head.states_of(prefix).clamp_max(self.v)  # x_0 may have none (v), as in circuit_window
            theta = self.theta(h, states[0])
            if sampling.greedy:
                drafted, conditionals = self.program.greedy(theta, states, with_rows=True)
            else:
                drafted, conditionals = self.program.sample(theta, None, states, uniforms, temperature)
            tokens = torch.cat([prefix[:1], self.head.tokens_of(drafted[1:])])
        tokens = self._padded(tokens)
        width_t = torch.tensor(width, device=device)
        chain = WindowShape.chain(tokens.shape[-1], device=device)
        if sampling.greedy:
            return Window(tokens, None, width_t, chain)
        rows = self._rows(conditionals, device)
        rows[1:len(given)] = 0
        rows[1:len(given)].scatter_(1, tokens[1:len(given), None], 1.0)
        return Window(tokens, rows, width_t, chain)

    def lookup_length(self, proposal: list[int]) -> int:
        """The real tokens of the lookup window of `proposal`: `x_0` and the proposal, or the circuit's
        `n` positions when it fills after them."""
        given = 1 + len(proposal)
        fills = given < self.n and self._has_states(proposal)
        return max(given, self.n) if fills else given

    def _has_states(self, tokens: list[int]) -> bool:
        """Every token is one of the circuit's states (`0 .. v-1`, or its draft vocabulary)."""
        if self._vocabulary is None:
            return max(tokens, default=0) < self.v
        return all(t in self._vocabulary for t in tokens)

    # ----------------------------------------------------------------- helpers

    def _width(self, own: torch.Tensor) -> torch.Tensor:
        """`[B]` long: per row, the verify width, of `widths`, with the most expected tokens per unit of cost."""
        candidates = self._candidates.to(own.device)  # [K]
        survive = own.double().cumprod(-1)  # [B, n-1] the circuit's probability that d_1 .. d_j are all right
        # [B, n] tokens a width of j + 1 commits
        expected = 1 + torch.cat([survive.new_zeros(*survive.shape[:-1], 1), survive.cumsum(-1)], -1)
        gain = expected[..., candidates - 1] / (1 + self.position_cost * (candidates - 1))  # [B, K]
        return candidates[gain.argmax(-1)]

    def _padded(self, tokens: torch.Tensor) -> torch.Tensor:
        """`[..., m]` -> `[..., span]` long: zeros after the tokens (verified only past the width's real ones: never)."""
        m = tokens.shape[-1]
        if m >= self.span:
            return tokens[..., :self.span]
        return torch.cat([tokens, tokens.new_zeros(*tokens.shape[:-1], self.span - m)], -1)

    def _rows(self, conditionals: torch.Tensor | None, device, batch: tuple[int, ...] = ()) -> torch.Tensor:
        """`[..., span, V]` float64: the circuit's conditionals `[..., n, v]` (zero beyond `v` and `n`);
        all zero for `batch` rows when there are none."""
        shape = conditionals.shape[:-2] if conditionals is not None else batch
        rows = torch.zeros(*shape, self.span, self.vocab, dtype=torch.float64, device=device)
        if conditionals is not None:
            n, v = conditionals.shape[-2:]
            if self.head.state_tokens is None:
                rows[..., :n, :v] = conditionals[..., :self.span, :]
            else:  # state s proposes token state_tokens[s]; every other token has probability 0
                rows[..., :n, self.head.state_tokens] = conditionals[..., :self.span, :]
        return rows
