"""Marginal queries: variables summed out (a leaf value of 0, log 1), all prefix marginals in one
pass (the row trick: the plan's prefix mode), and one variable's conditional distribution given the
others (a marginal pass and its backward).

Every function takes the `Executor` and arguments already checked by `arguments`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .executor import Executor
from .inputs import batched, compute_theta, given_leaves_and_sums, keep_mask, leaves, sum_weights


def log_marginal(ex: Executor, x: Tensor, keep: Tensor, theta: Tensor) -> Tensor:
    """`[B]` log q(x[keep]): variables where `keep` (`[n]` or `[B, n]`) is False are summed out."""
    theta = compute_theta(theta)
    values = leaves(ex, x, theta, keep=keep)
    return ex.upward(values, sum_weights(ex, theta[:, ex.num_input_params:]), "full")[:, 0]


def prefix_log_marginals(ex: Executor, x: Tensor, theta: Tensor) -> Tensor:
    """`[B, n]`: column `i` is log q(x_0..x_i)."""
    theta = compute_theta(theta)
    values = leaves(ex, x, theta, keep=None)
    return ex.upward(values, sum_weights(ex, theta[:, ex.num_input_params:]), "prefix")


def prefix_log_marginals_from_leaves(ex: Executor, leaf_log_probs: Tensor, sum_logits: Tensor) -> Tensor:
    """`[B, n]` prefix marginals from leaf values `[B, Q]` and sum logits `[P_sum]` or `[Bs, P_sum]`."""
    values, sum_logits = given_leaves_and_sums(leaf_log_probs, sum_logits)
    return ex.upward(values, sum_weights(ex, sum_logits), "prefix")


def conditional_log_distribution(ex: Executor, x: Tensor, keep: Tensor, theta: Tensor, variable: int) -> Tensor:
    """`[B, v]`: log q(x_variable = s | x[keep]) for every state `s` (`keep[variable]` is ignored).

    The circuit is linear in the leaves of one variable, so q(s, x[keep]) = sum_l g_l p_l(s) with
    g_l the derivative of q(x[keep]) by leaf l. One marginal pass and its backward give every
    `d_l = g_l / q(x[keep])` (the posterior of selecting leaf l; they sum to 1)."""
    theta = compute_theta(theta)
    x = batched(x)
    keep = keep_mask(ex, keep, x.shape[0], x.device).clone()
    keep[:, variable] = False
    first, last = ex.leaf_group_start[variable], ex.leaf_group_start[variable + 1]
    own = ex.leaves_by_variable[first:last]  # [Qv] this variable's leaves
    create_graph = torch.is_grad_enabled() and theta.requires_grad
    with torch.enable_grad():
        values = leaves(ex, x, theta, keep=keep)  # [Q, B]
        if not create_graph:
            values = values.detach()
        at_zero = torch.zeros(own.numel(), values.shape[1], dtype=values.dtype, device=values.device,
                              requires_grad=True)  # log of the variable's leaf values, all 1
        values = values.index_add(0, own, at_zero)
        log_q = ex.upward(values, sum_weights(ex, theta[:, ex.num_input_params:]), "full")[:, 0]
        (posterior,) = torch.autograd.grad(log_q.sum(), at_zero, create_graph=create_graph)  # [Qv, B]
    logits = theta[:, :ex.num_input_params].view(theta.shape[0], ex.num_leaves, ex.num_states)
    leaf_log_dist = logits.index_select(1, own).log_softmax(-1)  # [Bp, Qv, v]
    return torch.logsumexp(posterior.t().clamp_min(0).log().unsqueeze(-1) + leaf_log_dist, dim=1)
