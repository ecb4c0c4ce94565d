"""The tensor kernels of the passes: one sum layer in log space (the sum semiring, with the max
shift and one matmul) or in the max semiring, and the few log-space reductions the leaves need.

Shapes as in the package docstring: `F` regions in a fold, `U` units, `K` sum inputs, `R` rows per
region, `B` batch, `Bp` the parameter batch.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

LOG2E = 1.4426950408889634
EXP2_MIN_NUMEL = 16384  # above this, exp2(x * log2 e) beats torch.exp on CPU (measured 2.5-4x; rel. error ~1e-7)
CHUNK_NUMEL = 2**20  # per-example leaf normalisation runs in chunks this big: temporaries stay in cache
MAX_PLUS_LOOP_NUMEL = 65536  # [F, U, K, R*B] scores above this: a running max over k instead


def needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def exp_shifted(x: Tensor, shift: Tensor) -> Tensor:
    """exp(x - shift) (shift broadcast); large tensors fuse the shift and the base change into one
    pass before exp2."""
    if x.numel() >= EXP2_MIN_NUMEL:
        scaled = torch.add(shift * -LOG2E, x, alpha=LOG2E)  # (x - shift) * log2(e)
        return scaled.exp2_() if not needs_grad(x) else scaled.exp2()
    return torch.exp(x - shift)


def logsumexp(a: Tensor) -> Tensor:
    """logsumexp over the last dim with the max shift (its gradient cancels exactly).
    For large inputs the shift and the base change to 2 are one fused pass before exp2."""
    shift = a.amax(-1, keepdim=True)
    return exp_shifted(a, shift).sum(-1).log() + shift.squeeze(-1)


def max_log_prob(logits: Tensor) -> Tensor:
    """max_s log softmax(logits)[s] over the last dim: max - logsumexp (one shared max pass)."""
    shift = logits.amax(-1, keepdim=True)
    return -exp_shifted(logits, shift).sum(-1).log()


def chunked(fn: Callable[[Tensor], Tensor], logits: Tensor) -> Tensor:
    """`fn` over `[B, Q, v]` in slices of examples, so no temporary as large as the input exists."""
    per_example = logits[0].numel()
    if logits.numel() <= CHUNK_NUMEL or logits.shape[0] == 1:
        return fn(logits)
    step = max(1, CHUNK_NUMEL // per_example)
    return torch.cat([fn(part) for part in logits.split(step)], dim=0)


def impossible_as_minus_inf(values: Tensor) -> Tensor:
    """The lowest finite value (where a sum's every input was log 0) is a probability of 0: -inf."""
    lowest = torch.finfo(values.dtype).min
    # The batch-1 look reads values into Python, which a `torch.compile` graph cannot hold.
    small = values.numel() <= 64 and values.device.type == "cpu" and not values.requires_grad
    if small and not torch.compiler.is_compiling():
        if min(values.reshape(-1).tolist(), default=0.0) > lowest:  # batch 1: one look, not two ops
            return values
    return values.masked_fill(values <= lowest, float("-inf"))


def log_matmul_exp(inputs: Tensor, weights: Tensor, rows: int, batch: int) -> Tensor:
    """`[F, U, R*B]`: log sum_k W[u, k] exp(inputs[k]) for `inputs` `[F, K, R*B]` and linear
    weights `[F, U, K]` (shared) or `[Bp, F, U, K]`, via the max shift and one batched matmul."""
    # [F, 1, R*B]; its gradient cancels exactly. Floored at the dtype's lowest value: when every
    # input is log 0 (a state no unit allows) the sum is that lowest value (read as -inf at the
    # root, `impossible_as_minus_inf`), not the NaN of -inf - -inf.
    shift = inputs.amax(1, keepdim=True)
    shift = shift.clamp_min(torch.finfo(shift.dtype).min) if needs_grad(inputs) else \
        shift.clamp_min_(torch.finfo(shift.dtype).min)
    scaled = exp_shifted(inputs, shift)
    if weights.dim() == 3:  # shared weights: [F, U, K] @ [F, K, R*B]
        mixed = torch.bmm(weights, scaled)
    else:  # per-example weights: batch the matmul over (Bp, F); batch = c copies of Bp examples
        f, k, _ = scaled.shape
        bp = weights.shape[0]
        per_example = scaled.view(f, k, rows * (batch // bp), bp).permute(3, 0, 1, 2)  # [Bp, F, K, R*c]
        mixed = torch.matmul(weights, per_example)  # [Bp, F, U, R*c]
        mixed = mixed.permute(1, 2, 3, 0).reshape(f, -1, rows * batch)  # batch last again
    # floored at the smallest normal number: a sum whose every term underflows stays finite, and
    # the clamp (not an added constant) stops the gradient there (1/tiny would overflow into NaN)
    tiny = torch.finfo(mixed.dtype).tiny
    if needs_grad(inputs, weights):
        return mixed.clamp_min(tiny).log() + shift
    return mixed.clamp_min_(tiny).log_().add_(shift)  # in place: no fresh large buffers per layer


def max_plus(inputs: Tensor, log_weights: Tensor, rows: int, batch: int,
             with_argmax: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """`[F, U, R*B]`: max_k (log W[u, k] + inputs[k]), and the maximising k if `with_argmax`."""
    if not with_argmax and inputs.numel() * log_weights.shape[-2] >= MAX_PLUS_LOOP_NUMEL:
        return max_plus_over_inputs(inputs, log_weights, rows, batch)
    if log_weights.dim() == 3:  # shared
        scores = inputs.unsqueeze(1) + log_weights.unsqueeze(-1)  # [F, U, K, R*B]
        return scores.max(2) if with_argmax else scores.amax(2)
    f, k, _ = inputs.shape
    per_example = log_weights.permute(1, 2, 3, 0).unsqueeze(3)  # [F, U, K, 1, B]
    scores = inputs.view(f, 1, k, rows, batch) + per_example
    if with_argmax:
        value, argmax = scores.max(2)  # [F, U, R, B]
        return value.view(f, -1, rows * batch), argmax.view(f, -1, rows * batch)
    return scores.amax(2).view(f, -1, rows * batch)


def max_plus_over_inputs(inputs: Tensor, log_weights: Tensor, rows: int, batch: int) -> Tensor:
    """`max_plus` without `[F, U, K, R*B]` scores: a running max over the K inputs of `[F, U, R*B]`
    candidates, which stay in cache (a max over the K axis of materialised scores reduces a
    middle axis and ran ~40x slower: 68 vs 1.7 ms for F=8, U=K=32, B=1024, one thread)."""
    f, k, _ = inputs.shape
    if log_weights.dim() == 3:  # shared: [F, U, K]
        def candidate(j: int) -> Tensor:
            return inputs[:, j].unsqueeze(1) + log_weights[:, :, j].unsqueeze(-1)  # [F, U, R*B]
    else:  # per example: [B, F, U, K]
        per_example = log_weights.permute(1, 2, 3, 0).unsqueeze(3)  # [F, U, K, 1, B]
        by_row = inputs.view(f, k, 1, rows, batch)

        def candidate(j: int) -> Tensor:
            return (by_row[:, j] + per_example[:, :, j]).view(f, -1, rows * batch)  # [F, U, R*B]
    best = candidate(0)
    for j in range(1, k):
        torch.maximum(best, candidate(j), out=best)
    return best


def inverse_cdf(weights: Tensor, u: Tensor) -> Tensor:
    """A draw from the distribution proportional to `weights` `[..., v]` (non-negative, any total) by
    inverse CDF: the state whose CDF interval holds `u * total`, for `u` `[...]` in [0, 1). Exactly a
    draw when `u ~ U[0, 1)`, and a pure function of its tensors (`torch.compile` traces it; a
    `torch.Generator` cannot be). Returns `[...]` long."""
    cdf = weights.cumsum(-1)  # [..., v]
    if u.dtype != cdf.dtype:
        u = u.to(cdf.dtype)
    point = u * cdf[..., -1]  # [...]
    if point.dim() == 0:  # one distribution (a draft's step): searchsorted takes the scalar as it is
        return torch.searchsorted(cdf, point, right=True).clamp_max(weights.shape[-1] - 1)
    return torch.searchsorted(cdf, point.unsqueeze(-1), right=True).squeeze(-1).clamp_max(weights.shape[-1] - 1)
