"""The inputs of a pass, from checked arguments: logits in the compute dtype, leaf values `[Q, B]`
(batch last, as the passes store them) and per-fold sum weights.

The arguments were checked once at the public boundary (`arguments`); these functions only bring
them into shape (a `[n]` row becomes `[1, n]`, a `[P]` theta `[1, P]`).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from .executor import Executor
from .kernels import chunked, logsumexp, max_log_prob

# shared logits with a mask from this batch on: the mask folds into the leaf gather as an extra
# table column (one [Q, v] copy, worth it once the [Q, B] masks it saves are larger than the table)
EXTRA_COLUMN_MIN_BATCH = 64


def compute_theta(theta: Tensor) -> Tensor:
    """`[Bp, P]` in the compute dtype (float32, or float64 when given float64)."""
    if theta.dim() == 1:
        theta = theta.unsqueeze(0)
    return theta if theta.dtype in (torch.float32, torch.float64) else theta.float()


def batched(x: Tensor) -> Tensor:
    """States `[B, n]` (a single `[n]` row as a batch of one)."""
    return x.unsqueeze(0) if x.dim() == 1 else x


def keep_mask(ex: Executor, keep: Tensor, batch: int, device: torch.device) -> Tensor:
    """`[B, n]` bool."""
    keep = keep.to(device=device, dtype=torch.bool)
    if keep.dim() == 1:
        keep = keep.unsqueeze(0)
    return keep.expand(batch, ex.num_vars)


def all_observed(evidence: Tensor, keep: Tensor | None) -> Tensor:
    """`keep`, or every variable of `evidence` observed when it is None."""
    return keep if keep is not None else torch.ones_like(evidence, dtype=torch.bool)


def leaves(ex: Executor, x: Tensor, theta: Tensor, keep: Tensor | None) -> Tensor:
    """`[Q, B]` leaf log-probabilities at `x` (batch last), 0 where `keep` is False. Shared
    logits: one fused log_softmax of the `[Q, v]` table, then one gather (as cheap as the
    logsumexps alone, in fewer ops). Per-example logits are normalised lazily: the one observed
    logit per leaf minus the leaf's logsumexp, never a `[B, Q, v]` log_softmax."""
    x = batched(x)
    batch, bp = x.shape[0], theta.shape[0]
    if bp == 1 and keep is not None and batch >= EXTRA_COLUMN_MIN_BATCH:
        return _observed_or(ex, theta, x, keep, lambda table: table.new_zeros(table.shape[0], 1))
    kept = None
    if keep is not None:
        keep = keep_mask(ex, keep, batch, x.device)
        kept = keep.t().index_select(0, ex.leaf_variable)  # [Q, B]
        x = x.masked_fill(~keep, 0)  # unobserved entries may hold anything
    if bp == 1:  # shared: normalise the [Q, v] table once (one fused op), then read it
        table = theta[0, :ex.num_input_params].view(ex.num_leaves, ex.num_states)  # [Q, v]
        values = _observed(ex, table.log_softmax(-1), x)  # [Q, B]
    else:
        logits = theta[:, :ex.num_input_params].view(bp, ex.num_leaves, ex.num_states)  # [B, Q, v]
        picked = logits.gather(2, x.index_select(1, ex.leaf_variable).unsqueeze(-1)).squeeze(-1)  # [B, Q]
        values = (picked - chunked(logsumexp, logits)).t().contiguous()  # [Q, B]
    return values if kept is None else values.masked_fill(~kept, 0.0)


def max_leaves(ex: Executor, theta: Tensor, batch: int, evidence: Tensor | None, keep: Tensor | None) -> Tensor:
    """`[Q, B]` leaf values of the max-product pass: max_s log p(s), or log p(evidence)."""
    if evidence is not None and theta.shape[0] == 1 and batch >= EXTRA_COLUMN_MIN_BATCH:
        return _observed_or(ex, theta, evidence, all_observed(evidence, keep),
                            lambda table: table.amax(-1, keepdim=True))
    logits = theta[:, :ex.num_input_params].view(theta.shape[0], ex.num_leaves, ex.num_states)
    best = chunked(max_log_prob, logits).t().expand(ex.num_leaves, batch)  # [Q, B]
    if evidence is None:
        return best.contiguous()
    keep = keep_mask(ex, all_observed(evidence, keep), batch, evidence.device)
    observed = leaves(ex, evidence, theta, keep=keep)
    return torch.where(keep.t().index_select(0, ex.leaf_variable), observed, best)


def _observed(ex: Executor, table: Tensor, x: Tensor) -> Tensor:
    """`[Q, B]`: each leaf's entry of `table` `[Q, v]` at its variable's observed state."""
    return table.gather(1, x.t().contiguous().index_select(0, ex.leaf_variable))


def _observed_or(ex: Executor, theta: Tensor, x: Tensor, keep: Tensor,
                 unobserved: Callable[[Tensor], Tensor]) -> Tensor:
    """`[Q, B]` from shared logits: each leaf's log-probability at its variable's state where
    `keep`, else `unobserved(table)` (`[Q, 1]`). The value for "unobserved" is one more column of
    the normalised table, read by the same single gather: no masks over `[Q, B]`."""
    table = theta[0, :ex.num_input_params].view(ex.num_leaves, ex.num_states).log_softmax(-1)  # [Q, v]
    table = torch.cat([table, unobserved(table)], dim=1)  # [Q, v+1]
    states = torch.where(keep_mask(ex, keep, x.shape[0], x.device), x, ex.num_states)  # [B, n]
    return _observed(ex, table, states)


def given_leaves_and_sums(leaf_log_probs: Tensor, sum_logits: Tensor) -> tuple[Tensor, Tensor]:
    """Leaves `[Q, B]` (batch last, as the passes store them) and sum logits `[Bs, P_sum]`, both
    in the compute dtype, from a caller's `[B, Q]` leaf values and `[P_sum]` or `[Bs, P_sum]` logits."""
    if sum_logits.dim() == 1:
        sum_logits = sum_logits.unsqueeze(0)
    dtype = torch.float64 if torch.float64 in (leaf_log_probs.dtype, sum_logits.dtype) else torch.float32
    return leaf_log_probs.to(dtype).t().contiguous(), sum_logits.to(dtype)


def sum_weights(ex: Executor, sum_logits: Tensor, log: bool = False) -> list[Tensor]:
    """Per sum fold, softmax-normalised weights (log weights if `log`): `[F, U, K]` when shared
    (`sum_logits` `[1, P_sum]`), `[B, F, U, K]` per example."""
    bp = sum_logits.shape[0]
    normalise = torch.log_softmax if log else torch.softmax
    folds = ex.sum_ops
    if ex.uniform_k and folds:  # one op normalises every fold
        k = folds[0].inputs
        if bp == 1:
            rows = normalise(sum_logits.reshape(-1, k), dim=-1).split(ex.sum_rows)  # [F*U, K] each
            return [w.view(op.size, op.units, k) for w, op in zip(rows, folds)]
        flat = normalise(sum_logits.reshape(bp, -1, k), dim=-1).view(bp, -1)
        return [w.view(bp, op.size, op.units, k) for w, op in zip(flat.split(ex.sum_sizes, dim=1), folds)]
    lead = (bp,) if bp > 1 else ()
    return [normalise(sum_logits[:, op.param_offset:op.param_offset + op.size * op.units * op.inputs]
                      .reshape(*lead, op.size, op.units, op.inputs), dim=-1) for op in folds]

