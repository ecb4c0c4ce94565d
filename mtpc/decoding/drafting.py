"""The draft seam of a cycle: circuit parameters (and the carried target) -> one fixed-width window.

A window is `[x_0, d_1 .. d_{W-1}]` fitted to the verify width of its source (`W` for the circuit, at
most its `n`: a shorter window verifies fewer drafted tokens per cycle; `1 + K` for prompt lookup of `K`
tokens; at least 2), so the verifier is called with one shape per source whatever is drafted.
Everything stays on the device: the tokens, the proposal rows the acceptance needs (`Draft.rows`,
sampling only) and, without bonus-conditioned drafting, the decision whether `x_0` is the circuit's
own first token. The only host values read here are the ones that choose *what* to draft (the
committed `x_0` for bonus-conditioned drafting and lookup), and those come from the previous cycle's
one read.

The common window, the circuit's after a committed `x_0` (bonus-conditioned drafting, a head that keeps
its region graph), is one fixed-shape function, `Drafter.circuit_window`: hidden state -> head ->
`circuitc.draft.DraftProgram` (a sample from given uniforms, or the conditional / marginal argmax) ->
the fitted window and its proposal rows. `Drafter.draft` returns None for it: the decoder runs it
inside its cycle step, so that with `compile=True` draft, verify and accept are one graph. The other
windows (lookup, the circuit's own first token, heads without a graph) are drafted here, eagerly.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..heads import MTPHead
from .acceptance import AcceptanceRule, Target, first_token
from .proposals import CircuitDrafter, Draft, LookupState

__all__ = ["Drafter"]


class Drafter:
    """Windows of one head. `strategy`: the greedy draft strategy; `bonus`: bonus-conditioned drafting
    (`x_0` is given, the circuit drafts after it); `width` / `lookup_width`: the verify widths of a
    circuit window (at most the circuit's `n`, or 2 for `n = 1`) and of a lookup window; `vocab`: the
    verifier's vocabulary size (proposal rows are `[W, vocab]`)."""

    def __init__(self, head: MTPHead, strategy: str, bonus: bool, rule: AcceptanceRule, width: int,
                 lookup_width: int, vocab: int):
        self.head, self.circuit = head, CircuitDrafter(head)
        self.strategy, self.bonus, self.rule = strategy, bonus, rule
        self.width, self.lookup_width, self.vocab = width, lookup_width, vocab
        self.length = min(self.circuit.n, width)  # real tokens in a circuit window


    def draft(self, h, carried, x0: int | None, target: Target, generator, lookup: LookupState | None,
              read_first: Callable[[torch.Tensor], int]) -> Draft | None:
        """The cycle's window, or None when it is `circuit_window`'s (the decoder's cycle step drafts
        it). `h` `[d]` the draft hidden state at the last committed token; `carried` `[V]` the target of
        position 0; `x0` the committed first token when bonus-conditioned (else None: decided here
        against `carried`). `read_first` reads a device token to the host (only lookup without bonus
        needs it)."""
        theta = None if self.bonus else self.theta(h)
        own = None if self.bonus else self._own_window(theta, carried, target, generator)
        if lookup is not None:
            committed_first = x0 if x0 is not None else read_first(own.window[0])
            lookup.extend([committed_first])
            proposal = lookup.propose()
            if proposal is not None and lookup.use(proposal):
                tokens = proposal.tokens[:lookup.length(proposal, self.length)]
                is_own = own.own if own is not None else h.new_zeros((), dtype=torch.bool)
                theta = theta if theta is not None else self.theta(h)
                return self._lookup_window(theta, committed_first, tokens, target, generator, is_own)
        if own is not None:
            return own
        if self.is_fused(x0, target):
            return None
        return self._bonus_window(self.theta(h), x0, target, generator)

    def theta(self, h: torch.Tensor) -> torch.Tensor:
        """`[1, P]` the circuit's parameters at draft hidden state `h` `[d]`."""
        return self.head(h.to(self.head.dtype))[None]

    def is_fused(self, x0: int | None, target: Target) -> bool:
        """Whether the window after `x0` is `circuit_window`'s (else one of the eager windows)."""
        c = self.circuit
        strategy_fits = target.do_sample or self.strategy in ("conditional", "marginal")
        return x0 is not None and x0 < c.v and c.program is not None and strategy_fits

    def circuit_window(self, h: torch.Tensor, first: torch.Tensor, uniforms: torch.Tensor | None,
                       do_sample: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One fixed-shape draft: `h` `[d]`, `first` `[1]` long (`x_0 < v`), `uniforms` `[n]` float64
        (sampling) -> the window `[W]` long (`x_0`, then `d_1 .. d_{W-1}` from `q(. | x_0)`) and, when
        sampling, its proposal rows `[W, V]` float64 (None when greedy)."""
        theta = self.head(h.to(self.head.dtype))  # [P]
        program = self.circuit.program
        if do_sample:
            d, rows = program.sample(theta, None, first, uniforms)  # [n], [n, v]
            window = self._fitted(d, self.width)
            return window, self._rows(window, rows, 0)
        run = program.greedy if self.strategy == "conditional" else program.marginal_argmax
        return self._fitted(run(theta, first), self.width), None

    # ----------------------------------------------------------------- padding and proposal rows

    def _fitted(self, tokens: torch.Tensor, width: int) -> torch.Tensor:
        """`[m]` -> `[width]` long: the first `width` tokens, or zeros after them (verified, never accepted)."""
        if tokens.shape[0] >= width:
            return tokens[:width]
        return torch.cat([tokens, tokens.new_zeros(width - tokens.shape[0])])

    def _rows(self, window: torch.Tensor, circuit_rows: torch.Tensor | None, point_mass: int) -> torch.Tensor:
        """`[W, V]` float64: the circuit's rows `[n, v]` (the first `W`; zero beyond `v`), point masses at
        positions `1 .. point_mass` (a lookup token `c` is proposed with probability 1)."""
        W = window.shape[0]
        rows = torch.zeros(W, self.vocab, dtype=torch.float64, device=window.device)
        if circuit_rows is not None:
            kept = circuit_rows[:W]
            rows[:kept.shape[0], :kept.shape[1]] = kept
        if point_mass:
            rows[1:point_mass + 1] = 0
            rows[1:point_mass + 1].scatter_(1, window[1:point_mass + 1, None], 1.0)
        return rows

    # ----------------------------------------------------------------- the three windows

    def _bonus_window(self, theta, x0: int, target: Target, generator) -> Draft:
        """The circuit's window after the committed `x_0`, conditioned on it, where `circuit_window`
        does not apply (a head without its region graph, a first token the circuit cannot observe, the
        "map" and "sample" greedy strategies)."""
        c, W = self.circuit, self.width
        keep0 = x0 < c.v
        given = [x0] if keep0 else []
        first = torch.tensor([x0], dtype=torch.long, device=theta.device)
        true = theta.new_ones((), dtype=torch.bool)
        if not target.do_sample:
            d = c.greedy(theta, self.strategy, generator, given)
            return Draft(self._fitted(torch.cat([first, d[1:]]), W), self.length, ~true)
        d = c.sample(theta, generator, given)
        window = torch.cat([first, d[1:]])
        rows = c.rows(theta, window if keep0 else d, keep0)
        window = self._fitted(window, W)
        return Draft(window, self.length, ~true, self._rows(window, rows, 0))

    def _own_window(self, theta, carried, target: Target, generator) -> Draft:
        """The circuit's own window; `x_0` is its first token if the verifier accepts it (greedy: equal
        to the argmax; sampling: the speculative rule against `carried`), else the verifier's."""
        c, W = self.circuit, self.width
        if not target.do_sample:
            d = c.greedy(theta, self.strategy, generator, [])
            x0, own = first_token(target, self.rule, carried, d[0], None, generator)
            return Draft(self._fitted(torch.cat([x0[None], d[1:]]), W), self.length, own)
        if c.program is not None:
            d, rows = c.program.sample(theta[0], generator)
        else:
            d = c.sample(theta, generator, [])
            rows = c.rows(theta, d, True)
        full = self._rows(self._fitted(d, W), rows, 0)  # [W, V]
        x0, own = first_token(target, self.rule, carried, d[0], full[0], generator)
        return Draft(self._fitted(torch.cat([x0[None], d[1:]]), W), self.length, own, full)

    def _lookup_window(self, theta, x0: int, tokens: list[int], target: Target, generator, own) -> Draft:
        """`[x_0, lookup tokens]` (point-mass proposals), then, when that is shorter than the circuit's
        window, the circuit's draft conditioned on all of them."""
        c, W = self.circuit, self.lookup_width
        given = [x0] + tokens
        prefix = torch.tensor(given, dtype=torch.long, device=theta.device)
        sample = target.do_sample
        if len(given) >= c.n or max(given) >= c.v:  # no room for the circuit, or a token it cannot observe
            window = self._fitted(prefix, W)
            return Draft(window, len(given), own, self._rows(window, None, len(tokens)) if sample else None,
                         len(tokens), "lookup")
        if not sample:
            d = c.greedy(theta, self.strategy, generator, given)
            return Draft(self._fitted(d, W), min(c.n, W), own, None, len(tokens), "lookup")
        if c.program is not None:
            d, rows = c.program.sample(theta[0], generator, prefix)
        else:
            d = c.sample(theta, generator, given)
            rows = c.rows(theta, d, True)
        window = self._fitted(d, W)
        return Draft(window, min(c.n, W), own, self._rows(window, rows, len(tokens)), len(tokens), "lookup")
