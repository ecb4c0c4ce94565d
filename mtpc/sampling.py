"""`Sampling`: how every decoder of mtpc chooses its tokens, one value from the command line down.

Greedy is a value of it (`GREEDY`, temperature 0), not an absent argument: a config builds one
`Sampling` (`GenerateConfig.sampling()`, `BenchConfig.sampling()`, `DistillConfig.sampling()`), and
the plain decoder, the speculative decoder, its acceptance rule and the bench's transformers peers all
take it unchanged. It is checked here and nowhere else: `check_temperature`, `check_top_k`, `check_top_p`
(and `check_draft_temperature`, a draft head's) are the rules, which `Sampling` applies to its fields and
`mtpc.checks.check_sampling_settings` to every command's flags right after parsing. Torch-free: the
configs import it; its tensor methods use only the tensors they are given.

The shaped target follows transformers' warpers and their order: logits / temperature, then top-k, then
top-p (the smallest set of most likely tokens whose mass reaches `top_p`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GREEDY", "MIN_TEMPERATURE", "Sampling", "check_draft_temperature", "check_temperature", "check_top_k",
           "check_top_p"]

MIN_TEMPERATURE = 1e-3  # below it 1/T overflows float32 logits into inf/NaN probabilities


@dataclass(frozen=True)
class Sampling:
    """Greedy (`temperature == 0`: the argmax of the logits) or a draw from the softmax of the logits at
    `temperature`, restricted to the `top_k` most likely tokens (None: all) and then to the nucleus of mass
    `top_p` (None: all). Greedy keeps no top-k or top-p (they would not change an argmax), so two greedy
    values are equal whatever they were built from."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        check_temperature(self.temperature)
        check_top_k(self.top_k)
        check_top_p(self.top_p)
        t, k, p = self.temperature, self.top_k, self.top_p
        object.__setattr__(self, "temperature", float(t))
        if t == 0 or k == 0:
            object.__setattr__(self, "top_k", None)
        if t == 0 or p == 1:
            object.__setattr__(self, "top_p", None)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def draft_temperature(self, setting: float | None = None) -> float:
        """The temperature a draft head samples at under this sampling: `setting` (a decoder's
        `draft_temperature`), else the target's own; 1 when greedy (an argmax ignores it)."""
        if self.greedy:
            return 1.0
        return float(setting if setting is not None else self.temperature)

    def probs(self, logits):
        """`[..., V]` logits (a torch tensor) -> `[..., V]` float64 probabilities of the shaped target."""
        if self.greedy:
            raise ValueError("greedy decoding has no sampling distribution (its target is the argmax)")
        scores = logits.double()
        if self.temperature != 1:
            scores = scores / self.temperature
        if self.top_k:
            k = min(self.top_k, scores.shape[-1])
            kth = scores.topk(k, dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < kth, -math.inf)
        if self.top_p is not None:
            sorted_scores, order = scores.sort(dim=-1)  # ascending
            cumulative = sorted_scores.softmax(-1).cumsum(-1)
            remove = cumulative <= 1 - self.top_p
            remove[..., -1] = False  # keep at least the most likely token
            scores = scores.masked_fill(remove.scatter(-1, order, remove), -math.inf)
        return scores.softmax(-1)

    def pick(self, logits, generator=None):
        """`[..., V]` logits -> `[...]` long: the argmax, or one draw per row from the shaped target."""
        if self.greedy:
            return logits.argmax(-1)
        probs = self.probs(logits)
        return probs.reshape(-1, probs.shape[-1]).multinomial(1, generator=generator).reshape(probs.shape[:-1])

    def transformers_kwargs(self) -> dict:
        """The same target as keyword arguments of transformers' `generate` (whose top-k default of 50 is
        switched off unless asked)."""
        if self.greedy:
            return {"do_sample": False}
        return {"do_sample": True, "temperature": self.temperature, "top_k": self.top_k or 0,
                "top_p": self.top_p if self.top_p is not None else 1.0}

    @classmethod
    def from_transformers(cls, do_sample: bool, temperature: float | None, top_k: int | None,
                          top_p: float | None) -> "Sampling":
        """The value of transformers' generation settings (`do_sample`, `temperature`, `top_k`, `top_p`)."""
        if not do_sample:
            return GREEDY
        return cls(1.0 if temperature is None else temperature, top_k, top_p)

    def describe(self) -> str:
        """`greedy`, or `T = 0.7, top-k 50, top-p 0.9` (what a report's line says)."""
        if self.greedy:
            return "greedy"
        parts = [f"T = {self.temperature:g}"]
        if self.top_k:
            parts.append(f"top-k {self.top_k}")
        if self.top_p is not None:
            parts.append(f"top-p {self.top_p:g}")
        return ", ".join(parts)


# The rules of each setting, one function each: `Sampling` checks its fields with them, and a draft
# temperature (what a draft head samples its conditionals at, overflowing as the target's would) with the
# first. Each message starts with the setting's name, so a command line can put `--` before it.

def check_temperature(t) -> None:
    """A temperature: 0 (greedy) or a finite number of at least `MIN_TEMPERATURE`."""
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < math.inf:
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {t!r}")
    if 0 < t < MIN_TEMPERATURE:
        raise ValueError(f"temperature {t:g} is too small to sample with (1/T overflows float32 logits): use at "
                         f"least {MIN_TEMPERATURE:g}")


def check_draft_temperature(t) -> None:
    """A draft head's temperature: a temperature above 0 (a draft of a greedy target is its argmax, no
    temperature)."""
    check_temperature(t)
    if t == 0:
        raise ValueError("temperature must be above 0 (the temperature a draft head samples at), got 0")


def check_top_k(k) -> None:
    """A top-k: None or 0 (no top-k), or a positive integer."""
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
        raise ValueError(f"top-k must be a positive integer (None or 0: no top-k), got {k!r}")


def check_top_p(p) -> None:
    """A nucleus mass: None (no nucleus) or a number in (0, 1]."""
    if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1):
        raise ValueError(f"top-p must be in (0, 1] (None: no nucleus), got {p!r}")


GREEDY = Sampling()
