"""What a committed token must follow, and the rule that keeps speculative decoding exact.

`Target` is the verifier's shaped next-token distribution (greedy, or temperature / top-k / top-p in
transformers' order); `AcceptanceRule` is speculative sampling's accept-or-residual rule. The decoder
(`mtpc.decoding.decoder`) applies both to every drafted token, whatever proposed it.

`accept_window` decides a batch of verified windows at once on the tensors' device (no host reads):
every position of every row is tested, each row's first rejection found by a cumulative product, the
residual formed at that position only, and the next cycle's target, first token and hidden state
gathered at each row's accepted index. `Verdict.accepted` is what the host needs per cycle.
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
        """`[..., V]`, `[..., V]` -> `[..., V]`: the distribution of the token after a rejection (per row)."""
        r = (p - q).clamp_min(0)
        total = r.sum(-1, keepdim=True)
        # total = 0 only when p = q, where nothing is ever rejected; `where` keeps it on the device
        return torch.where(total > 0, r / total.clamp_min(torch.finfo(r.dtype).tiny), p)


# --------------------------------------------------------------------------- a whole window at once

@dataclass
class Verdict:
    """A batch of verified windows, decided on the device. `accepted` `[B]` long: tokens each row
    committed (1..W); `next_first` `[B]` long: each row's next first token, drawn from (or the argmax of)
    `carried`, its next target `[B, V]` (logits when greedy, probabilities when sampling); `hidden`
    `[B, d]` the draft hidden state at each row's last committed token."""

    accepted: torch.Tensor
    carried: torch.Tensor
    next_first: torch.Tensor
    hidden: torch.Tensor


def accept_window(target: Target, rule: AcceptanceRule, window: torch.Tensor, logits: torch.Tensor,
                  hidden: torch.Tensor, limit: torch.Tensor, eos: torch.Tensor, rows: torch.Tensor | None,
                  uniforms: torch.Tensor | None, widths: torch.Tensor | None = None) -> Verdict:
    """Accept a prefix of every row of `window` `[B, W]` (`window[:, 0]` already committed) against the
    verifier's `logits` `[B, W, V]` (`logits[b, j]` is the target of `window[b, j + 1]`) and `hidden`
    `[B, W, d]`. Rows are independent: each accepts its own count.

    Only `window[b, 1 .. limit[b] - 1]` are tested (`limit` `[B]` long: the row's real window length,
    capped by its budget; 1 tests nothing), and none after an EOS (`eos` `[E]` long ids). Sampling:
    `rows` `[B, W, V]` is the proposal row of every position (a point mass at lookup tokens),
    `uniforms` `[B, W]` float64 in [0, 1) are the windows' randomness (`uniforms[b, j - 1]` tests
    `window[b, j]`, `uniforms[b, widths[b] - 1]`, which no test uses, draws the next first token by
    inverse CDF; `widths` `[B]` long: each row's own verify width, None: all `W`, so a row draws as it
    would in a batch of its own), and after a rejection at `a` the next target is
    `rule.residual(p_{a-1}, rows[b, a])`.
    Randomness comes in as a tensor, not a generator, so the function is pure and `torch.compile`
    traces it whole (`cycle_uniforms` draws them).
    """
    B, W = window.shape
    drafted = window[:, 1:]  # [B, W-1]
    position = torch.arange(1, W, device=window.device)  # [W-1] window index of each tested token
    after_eos = torch.isin(window[:, :-1], eos).long().cumsum(1) > 0  # [B, W-1] an EOS at or before j - 1
    tested = (position[None] < limit[:, None]) & ~after_eos  # [B, W-1]
    if target.do_sample:
        probs = target.probs(logits)  # [B, W, V] float64
        p_x = probs[:, :-1].gather(2, drafted[..., None])[..., 0]  # [B, W-1]
        q_x = rows[:, 1:].gather(2, drafted[..., None])[..., 0].to(probs.dtype)  # [B, W-1]
        ok = torch.as_tensor(rule.accept(p_x, q_x, uniforms[:, :-1]), device=window.device).expand(B, W - 1)
    else:
        probs = logits
        ok = drafted == logits[:, :-1].argmax(-1)
    run = (ok & tested).long().cumprod(1)  # [B, W-1] 1 while every token so far was accepted
    accepted = 1 + run.sum(1)  # [B]
    last = accepted - 1  # [B] index of each row's last committed token
    # `x[b, index[b]]` for every row with the indices on the device (reading them to the host would be a
    # device sync, and a graph break under `torch.compile`)
    batch = torch.arange(B, device=window.device)  # [B]
    rejected = (accepted < W) & tested[batch, last.clamp_max(W - 2)]  # [B] the token after `last` failed its test
    carried = probs[batch, last]  # [B, V]
    if target.do_sample:
        residual = rule.residual(carried, rows[batch, accepted.clamp_max(W - 1)].to(carried.dtype))
        carried = torch.where(rejected[:, None], residual, carried)
        if widths is None:
            draw = uniforms[:, -1]  # [B]
        else:
            draw = uniforms[batch, (widths - 1).clamp_max(W - 1)]  # [B] (a finished row's width may be stale)
        next_first = inverse_cdf(carried, draw)
    else:
        next_first = carried.argmax(-1)
    return Verdict(accepted, carried, next_first, hidden[batch, last])


def cycle_uniforms(rows: int, size: int, generator, device) -> torch.Tensor:
    """`[rows, size]` float64 uniforms in [0, 1): every draw of one sampling cycle (the circuit's windows
    and the acceptance's tests) comes from them, eager and compiled alike. `generator`: None (torch's
    default), one `torch.Generator` (one draw for the whole batch) or a list of one per row (each row
    draws its own: a row's text then depends only on its own generator)."""
    if isinstance(generator, (list, tuple)):
        return torch.stack([torch.rand(size, generator=g, dtype=torch.float64, device=device) for g in generator])
    return torch.rand(rows, size, generator=generator, dtype=torch.float64, device=device)
