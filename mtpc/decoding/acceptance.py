"""What a committed token must follow, and the rule that keeps speculative decoding exact.

`Target` is the verifier's shaped next-token distribution (greedy, or temperature / top-k / top-p in
transformers' order); `AcceptanceRule` is speculative sampling's accept-or-residual rule. The decoder
(`mtpc.decoding.decoder`) applies both to every drafted token, whatever proposed it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Target", "AcceptanceRule", "draw", "uniform"]


# --------------------------------------------------------------------------- the verifier's target

@dataclass(frozen=True)
class Target:
    """The distribution tokens must follow: greedy (argmax of the logits) or the softmax of the logits
    shaped by temperature, then top-k, then top-p (the order and rules of transformers' warpers)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        if not self.do_sample:
            return
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {self.temperature}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 0):
            raise ValueError(f"top_k must be a positive integer (or None/0 for no top-k), got {self.top_k!r}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """`[..., V]` logits -> `[..., V]` float64 probabilities of the shaped target."""
        scores = logits.double() / self.temperature
        if self.top_k:
            k = min(self.top_k, scores.shape[-1])
            kth = torch.topk(scores, k, dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < kth, -torch.inf)
        if self.top_p is not None and self.top_p < 1:
            sorted_scores, order = torch.sort(scores, dim=-1)  # ascending
            cumulative = sorted_scores.softmax(-1).cumsum(-1)
            remove = cumulative <= 1 - self.top_p
            remove[..., -1] = False  # keep at least the most likely token
            scores = scores.masked_fill(remove.scatter(-1, order, remove), -torch.inf)
        return scores.softmax(-1)

    def pick(self, logits: torch.Tensor, generator: torch.Generator | None) -> int:
        """One token from the target at a single position (`logits` `[V]`)."""
        if not self.do_sample:
            return int(logits.argmax())
        return draw(self.probs(logits), generator)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def uniform(generator: torch.Generator | None) -> float:
    """`u ~ U[0, 1)` from `generator` on its own device (a CUDA generator cannot draw on the CPU)."""
    device = generator.device if generator is not None else None
    return float(torch.rand((), generator=generator, dtype=torch.float64, device=device))


# --------------------------------------------------------------------------- acceptance rule

class AcceptanceRule:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): a token `x ~ q` is kept with
    probability `min(1, p(x) / q(x))`; after a rejection the token is drawn from the residual
    `norm(max(0, p - q))`. Together: exactly `p`. Subclass to study other rules (the tests show that
    wrong ones are caught)."""

    def accept(self, p_x: float, q_x: float, u: float) -> bool:
        """`u ~ U[0, 1)`; True with probability `min(1, p_x / q_x)`."""
        return u * q_x < p_x

    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """`[V]`, `[V]` -> `[V]`: the distribution of the token after a rejection."""
        r = (p - q).clamp_min(0)
        total = r.sum()
        return r / total if total > 0 else p  # total = 0 only when p = q, where nothing is ever rejected
