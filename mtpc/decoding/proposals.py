"""Proposal sources of the speculative decoder: the circuit head's window and prompt lookup.

A cycle's window is `[x_0, d_1 .. d_{w-1}]` (`x_0` already decided against the carried target). The
drafted tokens come from one of two sources, chosen per cycle by `LookupState.use`:

- the circuit (`CircuitDrafter`): `d_j` drawn or argmax-ed from the circuit's exact conditionals
  `q(x_j | x_<j)`, which are also the proposal probabilities used in acceptance;
- prompt lookup (`PromptLookup`, `LookupState`): the tokens that followed the most recent earlier
  occurrence of the text's last few tokens (prompt + generated so far). A deterministic candidate is
  a point-mass proposal `q = delta_c`: it is accepted with probability `p(c)` and after a rejection the
  token is drawn from `norm(max(0, p - delta_c))`, i.e. `p` with `c` removed and renormalised. When
  the lookup continuation is shorter than the circuit's window, the circuit fills the rest, conditioned
  on `x_0` and the lookup tokens (its exact conditionals remain the proposal there: every position's
  proposal may depend on the tokens before it, and those are the committed ones when it is verified).

Exactness in sampling needs the source choice to depend only on what is known before the cycle's
draws: `LookupState.use` reads the past (running acceptance of each source) and the lookup match,
never the circuit's random draft.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..heads.head import MTPHead

__all__ = ["CircuitDrafter", "Draft", "LookupProposal", "LookupState", "PromptLookup", "LOOKUP_PREFERENCES"]

LOOKUP_PREFERENCES = ("adaptive", "lookup")


# --------------------------------------------------------------------------- one window

@dataclass
class Draft:
    """One window, on the device: `window[0]` is the committed token `x_0`, `window[1 .. length-1]` the
    drafted tokens, the rest padding (the verify call has one width per source, whatever is drafted).

    `rows[j]` (sampling only) is the proposal of position `j` over the vocabulary: the circuit's exact
    conditional `q(x_j = . | window[:j])` (zero beyond its `v` states), a point mass at lookup tokens
    (positions `1 .. point_mass`). `own` `[]` bool: `window[0]` is the circuit's own (accepted) token."""

    window: torch.Tensor  # [W] long
    length: int  # real tokens in `window`
    own: torch.Tensor  # [] bool
    rows: torch.Tensor | None = None  # [W, V] float64
    point_mass: int = 0
    source: str = "circuit"  # "circuit" or "lookup"


# --------------------------------------------------------------------------- the circuit

class CircuitDrafter:
    """The decoder's view of one head + compiled circuit at batch size 1 (all shapes `[1, ...]`).

    When the head keeps its region graph, greedy "conditional" and "marginal" drafts and sampling-mode
    drafts run `circuitc.draft.DraftProgram` (planned top-down derivatives: about 0.15 ms for n = 8,
    r = 8, v = 256 where an upward pass over the `v` candidates per position took 1-7 ms; a sampled
    window comes with the exact conditionals it was drawn from, so acceptance and residuals need no
    further circuit pass); otherwise the layered programs. Drafts may be conditioned on a `given`
    prefix (the committed `x_0`, and lookup tokens after it)."""

    def __init__(self, head: MTPHead):
        from circuitc.draft import DraftProgram

        self.circ = head.circ
        self.n, self.v = head.num_variables, head.num_states
        self.program = DraftProgram(head.graph, self.circ.param_layout) if head.graph is not None else None

    def keep(self, upto: int, keep0: bool) -> torch.Tensor:
        """[n] bool: positions `< upto` observed, position 0 only if `keep0`."""
        mask = torch.arange(self.n, device=self.circ.leaf_variable.device) < upto
        if not keep0:
            mask[0] = False
        return mask

    def conditional(self, theta, cond, upto: int, keep0: bool, variable: int) -> torch.Tensor:
        """`[v]` log q(x_variable | cond[:upto]) (`variable >= upto`): one marginal pass over the `v`
        candidate states, normalised (3x faster at batch 1 than the runtime's gradient-based
        `conditional_log_distribution`, same values)."""
        keep = self.keep(upto, keep0)
        keep[variable] = True
        candidates = cond[None].repeat(self.v, 1)  # [v, n]
        candidates[:, variable] = torch.arange(self.v, device=cond.device)
        return self.circ.log_marginal(candidates, keep, theta[0]).log_softmax(-1)

    def marginals(self, theta, x, given: int) -> torch.Tensor:
        """`[n, v]` log q(x_j = s | x_<given), all positions in one pass (for `j >= given`)."""
        n, v = self.n, self.v
        candidates = x[None, None].repeat(n, v, 1)  # [n, v, n]
        positions = torch.arange(n, device=x.device)
        candidates[positions, :, positions] = torch.arange(v, device=x.device)
        keep = torch.eye(n, dtype=torch.bool, device=x.device)  # [n, n] row j observes x_j
        keep[:, :given] = True
        keep = keep[:, None].expand(n, v, n).reshape(n * v, n)
        joint = self.circ.log_marginal(candidates.view(n * v, n), keep, theta[0])  # [n * v]
        return joint.view(n, v).log_softmax(-1)

    def rows(self, theta, cond, keep0: bool) -> torch.Tensor:
        """`[n, v]` probabilities: row `j` = `q(x_j = . | cond[:j])` (position 0 observed iff `keep0`),
        every row from one marginal pass over `n * v` candidates (no per-position host decisions)."""
        n, v = self.n, self.v
        positions = torch.arange(n, device=cond.device)
        candidates = cond[None, None].repeat(n, v, 1)  # [n, v, n]
        candidates[positions, :, positions] = torch.arange(v, device=cond.device)
        keep = positions[None, :] <= positions[:, None]  # [n, n] row j observes x_0 .. x_j
        if not keep0:
            keep[1:, 0] = False
        keep = keep[:, None].expand(n, v, n).reshape(n * v, n)
        joint = self.circ.log_marginal(candidates.view(n * v, n), keep, theta[0])  # [n * v]
        return joint.view(n, v).double().log_softmax(-1).exp()

    def _evidence(self, theta, given: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        evidence = torch.zeros((1, self.n), dtype=torch.long, device=theta.device)
        evidence[0, :len(given)] = torch.tensor(given, dtype=torch.long, device=theta.device)
        return evidence, self.keep(len(given), True)

    def sample(self, theta, generator, given: list[int]) -> torch.Tensor:
        """`[n]` a circuit sample, conditioned on `x_<m = given` (`m = len(given) < n`)."""
        if not given:
            return self.circ.sample(theta, num_samples=1, generator=generator)[0, 0]
        evidence, keep = self._evidence(theta, given)
        d = self.circ.sample(theta, num_samples=1, generator=generator, evidence=evidence, keep=keep)[0, 0]
        return torch.cat([evidence[0, :len(given)], d[len(given):]])

    def greedy(self, theta, strategy: str, generator, given: list[int]) -> torch.Tensor:
        """`[n]` a deterministic (or sampled, for "sample") draft, conditioned on `x_<m = given`."""
        if strategy == "sample":
            return self.sample(theta, generator, given)
        if strategy == "map":
            if not given:
                return self.circ.map(theta)[0]
            evidence, keep = self._evidence(theta, given)
            return torch.cat([evidence[0, :len(given)], self.circ.map(theta, evidence=evidence, keep=keep)[0, len(given):]])
        if self.program is not None:
            prefix = torch.tensor(given, dtype=torch.long, device=theta.device) if given else None
            run = self.program.greedy if strategy == "conditional" else self.program.marginal_argmax
            return run(theta[0], prefix)
        x = torch.zeros(self.n, dtype=torch.long, device=theta.device)
        start = len(given)
        x[:start] = torch.tensor(given, dtype=torch.long, device=theta.device)
        if strategy == "marginal":
            best = self.marginals(theta, x, start).argmax(-1)  # [n]
            return torch.cat([x[:start], best[start:]])
        for j in range(start, self.n):
            x[j] = self.conditional(theta, x, j, True, j).argmax()
        return x


# --------------------------------------------------------------------------- prompt lookup

@dataclass(frozen=True)
class PromptLookup:
    """Prompt-lookup drafting inside `SpeculativeDecoder` (`lookup=PromptLookup(...)` or `lookup=K`).

    `tokens`: how many tokens a match proposes (the window is then up to `1 + tokens` long, and may be
    longer than the circuit's `n`). The text's last `max_ngram .. min_ngram` tokens are matched (longest
    first) against every earlier position of the prompt + generated text; the most recent match wins,
    and its continuation is extended periodically when it runs into the present (so `abab` proposes
    `abab..`); it drafts all `tokens` only while its running acceptance reaches past the circuit's window
(`LookupState.length`). `prefer`: "adaptive" (default) proposes the lookup tokens when their running acceptance
    for this match length beats the circuit's running acceptance; "lookup" proposes them whenever
    there is a match (transformers' prompt lookup, with the circuit as fallback). `decay`: weight of
    the newest cycle in the running means."""

    tokens: int = 10
    max_ngram: int = 4
    min_ngram: int = 2
    prefer: str = "adaptive"
    decay: float = 0.25

    def __post_init__(self):
        if not isinstance(self.tokens, int) or isinstance(self.tokens, bool) or self.tokens < 1:
            raise ValueError(f"lookup tokens must be an integer >= 1, got {self.tokens!r}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"lookup n-gram sizes need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, "
                             f"{self.max_ngram}")
        if self.prefer not in LOOKUP_PREFERENCES:
            raise ValueError(f"lookup prefer must be one of {LOOKUP_PREFERENCES}, got {self.prefer!r}")
        if not 0 < self.decay <= 1:
            raise ValueError(f"lookup decay must be in (0, 1], got {self.decay}")

    @classmethod
    def of(cls, value) -> "PromptLookup | None":
        """`None`/`0`/`False` -> off; an int `K` -> `PromptLookup(tokens=K)`; a `PromptLookup` as is."""
        if value is None or value is False or value == 0:
            return None
        if isinstance(value, cls):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(tokens=value)
        raise ValueError(f"lookup must be None, a token count or a PromptLookup, got {value!r}")


@dataclass
class LookupProposal:
    tokens: list[int]  # the proposed continuation
    ngram: int  # the length of the matched suffix
    start: int  # text position of tokens[0]


@dataclass
class _Pending:
    proposal: LookupProposal
    resolved: bool = False


@dataclass
class LookupState:
    """One generation's lookup: the text so far, an index from n-grams to where their latest earlier
    occurrence continues, and the running acceptance of each source.

    The lookup's acceptance is measured on every proposal, used or not: once the text has moved past
    it, the number of its leading tokens that match the text is exactly how many would have been
    accepted (greedy: the text is the verifier's argmax chain; sampling: a point-mass proposal of `c`
    is accepted with probability `p(c)`, the probability that the text continues with `c`). The
    circuit's is measured on the cycles that use it. Everything read is in the past."""

    config: PromptLookup
    text: list[int] = field(default_factory=list)
    index: dict[tuple[int, ...], int] = field(default_factory=dict)
    lookup_score: dict[int, float] = field(default_factory=dict)  # per match length
    circuit_score: float | None = None
    pending: list[LookupProposal] = field(default_factory=list)
    indexed: int = 0  # n-grams ending before this position are in `index`

    def extend(self, tokens: list[int]) -> None:
        """Append committed tokens; index the n-grams whose continuation is now known; score the
        lookup proposals the text has moved past."""
        self.text.extend(tokens)
        cfg = self.config
        for end in range(self.indexed, len(self.text) - 1):  # n-gram text[end-g+1 .. end], continuation end+1
            for g in range(cfg.min_ngram, cfg.max_ngram + 1):
                if end - g + 1 >= 0:
                    self.index[tuple(self.text[end - g + 1:end + 1])] = end + 1
        self.indexed = max(self.indexed, len(self.text) - 1)
        self.pending = [p for p in self.pending if not self._resolve(p)]

    def _resolve(self, p: LookupProposal) -> bool:
        known = self.text[p.start:p.start + len(p.tokens)]
        agree = 0
        while agree < len(known) and known[agree] == p.tokens[agree]:
            agree += 1
        if agree == len(known) and len(known) < len(p.tokens):
            return False  # still agreeing, not all known yet
        old = self.lookup_score.get(p.ngram)
        self.lookup_score[p.ngram] = agree if old is None else old + self.config.decay * (agree - old)
        return True

    def propose(self) -> LookupProposal | None:
        """The continuation of the longest suffix n-gram seen before (latest occurrence), or None."""
        cfg, text = self.config, self.text
        for g in range(min(cfg.max_ngram, len(text)), cfg.min_ngram - 1, -1):
            start = self.index.get(tuple(text[len(text) - g:]))
            if start is None:
                continue
            tokens: list[int] = []
            for j in range(cfg.tokens):  # past the present, repeat with period len(text) - start
                i = start + j
                tokens.append(text[i] if i < len(text) else tokens[i - len(text)])
            proposal = LookupProposal(tokens, g, len(text))
            self.pending.append(proposal)
            return proposal
        return None

    def use(self, proposal: LookupProposal) -> bool:
        """Propose the lookup tokens this cycle (rather than the circuit's window)?"""
        if self.config.prefer == "lookup":
            return True
        score = self.lookup_score.get(proposal.ngram)
        if score is None:
            return False
        return self.circuit_score is None or score > self.circuit_score

    def length(self, proposal: LookupProposal, window: int) -> int:
        """How many of the proposal's tokens to draft, for a circuit window of `window` positions. A
        verified position costs backbone time, so the lookup goes past the circuit's window only when
        its running acceptance for this match length says it reaches that far; otherwise it drafts one
        token more than it usually gets right, and the circuit fills the window after it."""
        score = self.lookup_score.get(proposal.ngram)
        if score is None or score + 1 >= window - 1:
            return len(proposal.tokens)
        return min(len(proposal.tokens), max(1, math.ceil(score) + 1))

    def record_circuit(self, accepted: int) -> None:
        """A cycle that used the circuit accepted `accepted` drafted tokens after `x_0`."""
        old = self.circuit_score
        self.circuit_score = accepted if old is None else old + self.config.decay * (accepted - old)
