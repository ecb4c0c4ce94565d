"""Sampling: top-down and layer-parallel. Every draw's selected unit of a sum fold picks an input
(by its weights, times each input's upward marginal value under evidence), then each variable's
state is drawn from the leaf the draw reached.

`sample` takes the `Executor` and arguments already checked by `arguments`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .executor import Choose, Executor
from .inputs import all_observed, batched, compute_theta, keep_mask, leaves, sum_weights

@torch.no_grad()
def sample(ex: Executor, theta: Tensor, num_samples: int, generator: torch.Generator | None,
           evidence: Tensor | None, keep: Tensor | None) -> Tensor:
    """`[B, num_samples, n]` samples; with `evidence` (`[B, n]`) and `keep`, the unobserved
    variables are drawn from q(. | evidence[keep]) and the observed ones copied."""
    theta = compute_theta(theta)
    sum_logits = theta[:, ex.num_input_params:]
    if evidence is not None:
        evidence = batched(evidence)
        keep = keep_mask(ex, all_observed(evidence, keep), evidence.shape[0], evidence.device)
    batch = evidence.shape[0] if evidence is not None else theta.shape[0]
    if evidence is None and theta.shape[0] == 1:
        choose = _from_shared_weights(ex, sum_logits, generator)
    else:
        choose = _from_weights(ex, theta, sum_logits, generator, evidence, keep)
    leaf_of_var = ex.topdown(choose, batch, num_samples, theta.device)  # [B*S, n]
    x = _draw_leaves(ex, theta, leaf_of_var, num_samples, generator).view(batch, num_samples, ex.num_vars)
    if evidence is not None:
        x = torch.where(keep.unsqueeze(1), evidence.unsqueeze(1), x)
    return x


def _from_shared_weights(ex: Executor, sum_logits: Tensor, generator: torch.Generator | None) -> Choose:
    """Shared weights, no evidence: one CDF table per fold, each draw a binary search."""
    cdfs, bases = sum_cdfs(ex, sum_logits)

    def choose(fold: int, unit: Tensor, example: Tensor) -> Tensor:
        rows = cdfs[fold].index_select(0, (unit + bases[fold]).view(-1))  # [B*S*F, K]
        u = torch.rand(rows.shape[0], 1, generator=generator, device=rows.device, dtype=rows.dtype)
        return torch.searchsorted(rows, u, right=True).view(unit.shape)

    return choose


def _from_weights(ex: Executor, theta: Tensor, sum_logits: Tensor, generator: torch.Generator | None,
                  evidence: Tensor | None, keep: Tensor | None) -> Choose:
    """Per-example weights, or evidence: each draw's scores are its unit's log weights (plus, under
    evidence, each input's upward marginal value), drawn from by inverse CDF."""
    logw = sum_weights(ex, sum_logits, log=True)
    saved: list[Tensor] | None = None
    if evidence is not None:
        saved = []
        ex.upward(leaves(ex, evidence, theta, keep=keep), [w.exp() for w in logw], "full", saved=saved)

    def choose(fold: int, unit: Tensor, example: Tensor) -> Tensor:
        scores = ex.weight_rows(fold, logw[fold], unit, example)  # [B*S, F, K]
        if saved is not None:  # times each input's value given the evidence
            scores = scores + saved[fold].permute(2, 0, 1).index_select(0, example)
        return categorical(scores, generator)

    return choose


def sum_cdfs(ex: Executor, sum_logits: Tensor) -> tuple[list[Tensor], list[Tensor]]:
    """Cumulative weights of shared parameters, last column exactly 1: per sum fold a table and
    each region's first row in it `[F]`. With one K for every fold all folds share one
    `[sum(F*U), K]` table (three ops in all); else one `[F*U, K]` table per fold."""
    folds = ex.sum_ops
    if ex.uniform_k and folds:
        cdf = torch.softmax(sum_logits.reshape(-1, folds[0].inputs), dim=-1).cumsum(-1)
        cdf = cdf / cdf[:, -1:]
        return [cdf] * len(folds), ex.cdf_row_bases()
    cdfs = []
    for w in sum_weights(ex, sum_logits):
        cdf = w.cumsum(-1)  # [F, U, K]
        cdfs.append((cdf / cdf[..., -1:]).reshape(-1, cdf.shape[-1]))
    return cdfs, ex.cdf_row_bases()


def _draw_leaves(ex: Executor, theta: Tensor, leaf_of_var: Tensor, num_samples: int,
                 generator: torch.Generator | None) -> Tensor:
    """`[B*S, n]` states drawn from each variable's selected leaf."""
    bp, q, v = theta.shape[0], ex.num_leaves, ex.num_states
    logits = theta[:, :ex.num_input_params]
    if bp == 1 and leaf_of_var.numel() >= q and ex.leaf_group is not None:
        # Many draws, shared parameters, leaves grouped by variable: one CDF row per variable over
        # its r leaves (leaf j's CDF shifted to [j, j+1], float64), a binary search per draw in
        # its variable's row (shorter and cache-resident, unlike one global CDF).
        n, r = ex.num_vars, ex.leaf_group
        cdf = torch.softmax(logits.view(q, v).double(), -1).cumsum(-1)
        offsets = torch.arange(r, device=cdf.device, dtype=cdf.dtype).view(1, r, 1)
        rows = (cdf / cdf[:, -1:]).view(n, r, v).add_(offsets).view(n, r * v)  # [n, r*v]
        local = leaf_of_var - ex.first_leaf_of_variable  # [B*S, n] leaf index within its variable
        u = torch.rand(leaf_of_var.shape, generator=generator, device=cdf.device, dtype=torch.float64)
        found = torch.searchsorted(rows, (local + u).t().contiguous(), right=True).t()  # [B*S, n]
        return (found - local * v).clamp(0, v - 1)
    if bp == 1 and leaf_of_var.numel() >= q:
        # Many draws from shared parameters: one global CDF over all leaves, leaf q's CDF shifted
        # to [q, q+1] (float64 keeps 1/v resolution after the shift); a draw is a binary search.
        cdf = torch.softmax(logits.view(q, v).double(), -1).cumsum(-1)
        cdf = (cdf / cdf[:, -1:] + torch.arange(q, device=cdf.device, dtype=cdf.dtype).unsqueeze(1)).view(-1)
        u = torch.rand(leaf_of_var.shape, generator=generator, device=cdf.device, dtype=torch.float64)
        found = torch.searchsorted(cdf, leaf_of_var + u, right=True)
        return (found - leaf_of_var * v).clamp(0, v - 1)
    row = leaf_of_var
    if bp > 1:
        example = torch.arange(leaf_of_var.shape[0], device=leaf_of_var.device) // num_samples
        row = row + (example * q).unsqueeze(1)
    rows = logits.reshape(bp * q, v).index_select(0, row.reshape(-1))  # [B*S*n, v] only the selected leaves
    return categorical(rows, generator).view(leaf_of_var.shape)


def categorical(logits: Tensor, generator: torch.Generator | None) -> Tensor:
    """One draw per row of `logits` `[..., K]` by inverse CDF (one uniform per row)."""
    cdf = torch.softmax(logits, dim=-1).cumsum(-1)
    u = torch.rand(cdf.shape[:-1] + (1,), generator=generator, device=cdf.device, dtype=cdf.dtype)
    found = torch.searchsorted(cdf, u * cdf[..., -1:], right=True).squeeze(-1)
    return found.clamp_max(logits.shape[-1] - 1)
