"""MAP: an upward pass in the max semiring, then backtracking from the root along every unit's best
input, and each reached leaf's most likely state.

For non-deterministic circuits this is the usual approximate MAP: the best single induced tree,
not necessarily the most probable assignment. `map_assignment` takes the `Executor` and arguments
already checked by `arguments`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .executor import Choose, Executor
from .inputs import all_observed, batched, compute_theta, keep_mask, max_leaves, sum_weights


@torch.no_grad()
def map_assignment(ex: Executor, theta: Tensor, evidence: Tensor | None, keep: Tensor | None) -> Tensor:
    """`[B, n]`: the max-product assignment; optional `evidence`/`keep` fix the observed variables."""
    theta = compute_theta(theta)
    if evidence is not None:
        evidence = batched(evidence)
    batch = evidence.shape[0] if evidence is not None else theta.shape[0]
    logw = sum_weights(ex, theta[:, ex.num_input_params:], log=True)
    leaves = max_leaves(ex, theta, batch, evidence, keep)  # [Q, B]
    choose = _read_best_inputs(ex, leaves, logw) if batch == 1 else _rescore_selected(ex, leaves, logw)
    x = _best_states(ex, theta, ex.topdown(choose, batch, 1, theta.device))
    if evidence is not None:
        x = torch.where(keep_mask(ex, all_observed(evidence, keep), batch, evidence.device), evidence, x)
    return x


def _read_best_inputs(ex: Executor, leaves: Tensor, logw: list[Tensor]) -> Choose:
    """Few ops: the upward pass keeps every unit's best input `[F, U, 1]` and backtracking reads it
    (at large batch a max with indices over `[F, U, K, B]` is slower than re-scoring only the
    selected units, `_rescore_selected`)."""
    best: list[Tensor] = []
    ex.upward(leaves, logw, "full", best=best, semiring="max")
    row_bases = ex.row_bases()

    def choose(fold: int, unit: Tensor, example: Tensor) -> Tensor:
        return best[fold].take(unit + row_bases[fold])  # [1, F]: unit u of region f is entry f*U + u

    return choose


def _rescore_selected(ex: Executor, leaves: Tensor, logw: list[Tensor]) -> Choose:
    """The upward pass saves each sum fold's inputs; backtracking scores only the selected units'
    inputs (one draw per example: the saved inputs are added as a view, no gather)."""
    saved: list[Tensor] = []
    ex.upward(leaves, logw, "full", saved=saved, semiring="max")

    def choose(fold: int, unit: Tensor, example: Tensor) -> Tensor:
        scores = ex.weight_rows(fold, logw[fold], unit, example)  # [B, F, K]
        return scores.add_(saved[fold].permute(2, 0, 1)).argmax(-1)

    return choose


def _best_states(ex: Executor, theta: Tensor, leaf_of_var: Tensor) -> Tensor:
    """`[B, n]` the most likely state of each variable's selected leaf."""
    bp, q, v = theta.shape[0], ex.num_leaves, ex.num_states
    logits = theta[:, :ex.num_input_params]
    if bp == 1 and leaf_of_var.numel() >= q:  # many draws: every leaf's best state once
        return logits.view(q, v).argmax(-1)[leaf_of_var]
    if bp == 1:  # few draws: only the selected leaves' rows
        return logits.view(q, v).index_select(0, leaf_of_var.reshape(-1)).argmax(-1).view(leaf_of_var.shape)
    example = torch.arange(leaf_of_var.shape[0], device=leaf_of_var.device).unsqueeze(1)
    rows = logits.reshape(bp * q, v).index_select(0, (example * q + leaf_of_var).view(-1))  # [B*n, v]
    return rows.argmax(-1).view(leaf_of_var.shape)
