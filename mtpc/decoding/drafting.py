"""The draft seam of a cycle: circuit parameters (and the carried target) -> one fixed-width window.

A window is `[x_0, d_1 .. d_{n-1}]` padded to the verify width of its source (`n` for the circuit,
`1 + K` for prompt lookup of `K` tokens, at least 2), so the verifier is called with one shape per
source whatever is drafted. Everything stays on the device: the tokens, the proposal rows the
acceptance needs (`Draft.rows`, sampling only) and, without bonus-conditioned drafting, the decision
whether `x_0` is the circuit's own first token. The only host values read here are the ones that
choose *what* to draft (the committed `x_0` for bonus-conditioned drafting and lookup), and those
come from the previous cycle's one read.
"""

from __future__ import annotations

from typing import Callable

import torch

from .acceptance import AcceptanceRule, Target, first_token
from .proposals import CircuitDrafter, Draft, LookupState

__all__ = ["Drafter"]


class Drafter:
    """Windows of one head. `strategy`: the greedy draft strategy; `bonus`: bonus-conditioned drafting
    (`x_0` is given, the circuit drafts after it); `width` / `lookup_width`: the verify widths;
    `vocab`: the verifier's vocabulary size (proposal rows are `[W, vocab]`)."""

    def __init__(self, circuit: CircuitDrafter, strategy: str, bonus: bool, rule: AcceptanceRule, width: int,
                 lookup_width: int, vocab: int):
        self.circuit, self.strategy, self.bonus, self.rule = circuit, strategy, bonus, rule
        self.width, self.lookup_width, self.vocab = width, lookup_width, vocab

    def draft(self, theta, carried, x0: int | None, target: Target, generator, lookup: LookupState | None,
              read_first: Callable[[torch.Tensor], int]) -> Draft:
        """The cycle's window. `theta` `[1, P]`; `carried` `[V]` the target of position 0; `x0` the
        committed first token when bonus-conditioned (else None: decided here against `carried`).
        `read_first` reads a device token to the host (only lookup without bonus needs it)."""
        if self.bonus:
            own = None
        else:
            own = self._own_window(theta, carried, target, generator)
        if lookup is not None:
            first = x0 if x0 is not None else read_first(own.window[0])
            lookup.extend([first])
            proposal = lookup.propose()
            if proposal is not None and lookup.use(proposal):
                tokens = proposal.tokens[:lookup.length(proposal, self.circuit.n)]
                is_own = own.own if own is not None else theta.new_zeros((), dtype=torch.bool)
                return self._lookup_window(theta, first, tokens, target, generator, is_own)
        return own if own is not None else self._bonus_window(theta, x0, target, generator)

    # ----------------------------------------------------------------- padding and proposal rows

    def _padded(self, tokens: torch.Tensor, width: int) -> torch.Tensor:
        """`[m]` -> `[width]` long (zeros after the tokens: verified, never accepted)."""
        return torch.cat([tokens, tokens.new_zeros(width - tokens.shape[0])]) if tokens.shape[0] < width else tokens

    def _rows(self, window: torch.Tensor, circuit_rows: torch.Tensor | None, point_mass: int) -> torch.Tensor:
        """`[W, V]` float64: the circuit's rows `[n, v]` (zero beyond `v`), point masses at positions
        `1 .. point_mass` (a lookup token `c` is proposed with probability 1)."""
        rows = torch.zeros(window.shape[0], self.vocab, dtype=torch.float64, device=window.device)
        if circuit_rows is not None:
            rows[:circuit_rows.shape[0], :circuit_rows.shape[1]] = circuit_rows
        if point_mass:
            rows[1:point_mass + 1] = 0
            rows[1:point_mass + 1].scatter_(1, window[1:point_mass + 1, None], 1.0)
        return rows

    # ----------------------------------------------------------------- the three windows

    def _bonus_window(self, theta, x0: int, target: Target, generator) -> Draft:
        """The circuit's window after the committed `x_0`, conditioned on it."""
        c, W = self.circuit, self.width
        keep0 = x0 < c.v
        given = [x0] if keep0 else []
        first = torch.tensor([x0], dtype=torch.long, device=theta.device)
        true = theta.new_ones((), dtype=torch.bool)
        if not target.do_sample:
            d = c.greedy(theta, self.strategy, generator, given)
            return Draft(self._padded(torch.cat([first, d[1:]]), W), c.n, ~true)
        if keep0 and c.program is not None:  # x_1.. drawn from q(. | x_0) with their conditionals
            d, rows = c.program.sample(theta[0], generator, first)
            window = self._padded(d, W)
            return Draft(window, c.n, ~true, self._rows(window, rows, 0))
        d = c.sample(theta, generator, given)
        window = torch.cat([first, d[1:]])
        rows = c.rows(theta, window if keep0 else d, keep0)
        window = self._padded(window, W)
        return Draft(window, c.n, ~true, self._rows(window, rows, 0))

    def _own_window(self, theta, carried, target: Target, generator) -> Draft:
        """The circuit's own window; `x_0` is its first token if the verifier accepts it (greedy: equal
        to the argmax; sampling: the speculative rule against `carried`), else the verifier's."""
        c, W = self.circuit, self.width
        if not target.do_sample:
            d = c.greedy(theta, self.strategy, generator, [])
            x0, own = first_token(target, self.rule, carried, d[0], None, generator)
            return Draft(self._padded(torch.cat([x0[None], d[1:]]), W), c.n, own)
        if c.program is not None:
            d, rows = c.program.sample(theta[0], generator)
        else:
            d = c.sample(theta, generator, [])
            rows = c.rows(theta, d, True)
        full = self._rows(self._padded(d, W), rows, 0)  # [W, V]
        x0, own = first_token(target, self.rule, carried, d[0], full[0], generator)
        return Draft(self._padded(torch.cat([x0[None], d[1:]]), W), c.n, own, full)

    def _lookup_window(self, theta, x0: int, tokens: list[int], target: Target, generator, own) -> Draft:
        """`[x_0, lookup tokens]` (point-mass proposals), then, when that is shorter than the circuit's
        window, the circuit's draft conditioned on all of them."""
        c, W = self.circuit, self.lookup_width
        given = [x0] + tokens
        prefix = torch.tensor(given, dtype=torch.long, device=theta.device)
        sample = target.do_sample
        if len(given) >= c.n or max(given) >= c.v:  # no room for the circuit, or a token it cannot observe
            window = self._padded(prefix, W)
            return Draft(window, len(given), own, self._rows(window, None, len(tokens)) if sample else None,
                         len(tokens), "lookup")
        if not sample:
            d = c.greedy(theta, self.strategy, generator, given)
            return Draft(self._padded(d, W), c.n, own, None, len(tokens), "lookup")
        if c.program is not None:
            d, rows = c.program.sample(theta[0], generator, prefix)
        else:
            d = c.sample(theta, generator, given)
            rows = c.rows(theta, d, True)
        window = self._padded(d, W)
        return Draft(window, c.n, own, self._rows(window, rows, len(tokens)), len(tokens), "lookup")
