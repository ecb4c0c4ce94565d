"""What a committed token must follow, and the rule that keeps speculative decoding exact.

`Target` is the verifier's shaped next-token distribution (greedy, or temperature / top-k / top-p in
transformers' order); `AcceptanceRule` is speculative sampling's accept-or-residual rule. The decoder
(`mtpc.decoding.decoder`) applies both to every drafted token, whatever proposed it.

`accept_window` decides a whole verified window at once on the tensors' device (no host reads): every
position is tested, the first rejection found by a cumulative product, the residual formed at that
position only, and the next cycle's target, first token and hidden state gathered at the accepted
index. `Verdict.accepted` is the one number the host needs per cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from circuitc.draft import inverse_cdf

__all__ = ["Target", "AcceptanceRule", "Verdict", "accept_window", "cycle_uniforms", "draw"]


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


# --------------------------------------------------------------------------- acceptance rule

class AcceptanceRule:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): a token `x ~ q` is kept with
    probability `min(1, p(x) / q(x))`; after a rejection the token is drawn from the residual
    `norm(max(0, p - q))`. Together: exactly `p`. Subclass to study other rules (the tests show that
    wrong ones are caught)."""

    def accept(self, p_x, q_x, u):
        """`u ~ U[0, 1)`; True with probability `min(1, p_x / q_x)`. Elementwise on tensors `[W]` (the
        decoder tests a whole window at once)."""
        return u * q_x < p_x

    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """`[V]`, `[V]` -> `[V]`: the distribution of the token after a rejection."""
        r = (p - q).clamp_min(0)
        total = r.sum()
        # total = 0 only when p = q, where nothing is ever rejected; `where` keeps it on the device
        return torch.where(total > 0, r / total.clamp_min(torch.finfo(r.dtype).tiny), p)


# --------------------------------------------------------------------------- a whole window at once

@dataclass
class Verdict:
    """One verified window, decided on the device. `accepted` `[]` long: tokens committed (1..W);
    `next_first` `[]` long: the next cycle's first token, drawn from (or the argmax of) `carried`, the
    next cycle's target `[V]` (logits when greedy, probabilities when sampling); `hidden` `[d]` the
    draft hidden state at the last committed token."""

    accepted: torch.Tensor
    carried: torch.Tensor
    next_first: torch.Tensor
    hidden: torch.Tensor


def accept_window(target: Target, rule: AcceptanceRule, window: torch.Tensor, logits: torch.Tensor,
                  hidden: torch.Tensor, limit: torch.Tensor, eos: torch.Tensor, rows: torch.Tensor | None,
                  uniforms: torch.Tensor | None) -> Verdict:
    """Accept a prefix of `window` `[W]` (`window[0]` already committed) against the verifier's
    `logits` `[W, V]` (row `j` is the target of `window[j + 1]`) and `hidden` `[W, d]`.

    Only `window[1 .. limit - 1]` are tested (`limit` `[]` long: the real window length, capped by the
    budget), and none after an EOS (`eos` `[E]` long ids). Sampling: `rows` `[W, V]` is the proposal
    row of every position (a point mass at lookup tokens), `uniforms` `[W]` float64 in [0, 1) are the
    window's randomness (`uniforms[j - 1]` tests `window[j]`, `uniforms[W - 1]` draws the next first
    token by inverse CDF), and after a rejection at `a` the next target is `rule.residual(p_{a-1},
    rows[a])`. Randomness comes in as a tensor, not a generator, so the function is pure and
    `torch.compile` traces it whole (`cycle_uniforms` draws them).
    """
    W = window.shape[0]
    drafted = window[1:]  # [W-1]
    position = torch.arange(1, W, device=window.device)  # [W-1] window index of each tested token
    after_eos = torch.isin(window[:-1], eos).long().cumsum(0) > 0  # [W-1] an EOS at or before j - 1
    tested = (position < limit) & ~after_eos  # [W-1]
    if target.do_sample:
        probs = target.probs(logits)  # [W, V] float64
        p_x = probs[:-1].gather(1, drafted[:, None])[:, 0]  # [W-1]
        q_x = rows[1:].gather(1, drafted[:, None])[:, 0].to(probs.dtype)  # [W-1]
        ok = torch.as_tensor(rule.accept(p_x, q_x, uniforms[:-1]), device=window.device).expand(W - 1)
    else:
        probs = logits
        ok = drafted == logits[:-1].argmax(-1)
    run = (ok & tested).long().cumprod(0)  # [W-1] 1 while every token so far was accepted
    accepted = 1 + run.sum()  # []
    last = accepted - 1  # index of the last committed token
    rejected = (accepted < W) & at(tested, last.clamp_max(W - 2))  # the token after `last` was tested and failed
    carried = at(probs, last)  # [V]
    if target.do_sample:
        residual = rule.residual(carried, at(rows, accepted.clamp_max(W - 1)).to(carried.dtype))
        carried = torch.where(rejected, residual, carried)
        next_first = inverse_cdf(carried, uniforms[-1])
    else:
        next_first = carried.argmax()
    return Verdict(accepted, carried, next_first, at(hidden, last))


def at(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`x[index]` for a 0-d device index without reading it to the host (`x[t]` with a 0-d tensor `t`
    converts it to a Python int: a device sync, and a graph break under `torch.compile`)."""
    return x.index_select(0, index.view(1))[0]


def cycle_uniforms(size: int, generator: torch.Generator | None, device) -> torch.Tensor:
    """`[size]` float64 uniforms in [0, 1): every draw of one sampling cycle (the circuit's window and
    the acceptance's tests) comes from them, eager and compiled alike (one draw from `generator`)."""
    return torch.rand(size, generator=generator, dtype=torch.float64, device=device)
