"""Prompt lookup, the speculative decoder's second proposal source (the first is the circuit head,
`mtpc.decoding.drafts.drafting`).

A cycle's window is `[x_0, d_1 .. d_{w-1}]` (`x_0` already decided). Its drafted tokens come from the
circuit's exact conditionals, or, when `LookupState.use` prefers it, from
prompt lookup (`PromptLookup`, `LookupState`): the tokens that followed the most recent earlier
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

from ...checks import MAX_LOOKUP_TOKENS  # the most tokens a match may propose (every command's --lookup bound)

__all__ = ["LookupProposal", "LookupState", "PromptLookup", "LOOKUP_PREFERENCES"]

LOOKUP_PREFERENCES = ("adaptive", "lookup")
MAX_NGRAM = 64  # the longest suffix matched: each committed token indexes every size up to it


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
        if not _integer(self.tokens) or not 1 <= self.tokens <= MAX_LOOKUP_TOKENS:
            raise ValueError(f"lookup tokens must be an integer in 1..{MAX_LOOKUP_TOKENS:,}, got {self.tokens!r}")
        if not (_integer(self.min_ngram) and _integer(self.max_ngram) and 1 <= self.min_ngram <= self.max_ngram <= MAX_NGRAM):
            raise ValueError(f"lookup n-gram sizes need integers 1 <= min_ngram <= max_ngram <= {MAX_NGRAM}, got "
                             f"{self.min_ngram!r}, {self.max_ngram!r}")
        if not isinstance(self.prefer, str) or self.prefer not in LOOKUP_PREFERENCES:
            raise ValueError(f"lookup prefer must be one of {LOOKUP_PREFERENCES}, got {self.prefer!r}")
        if isinstance(self.decay, bool) or not isinstance(self.decay, (int, float)) or not 0 < self.decay <= 1:
            raise ValueError(f"lookup decay must be a number in (0, 1], got {self.decay!r}")

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


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
