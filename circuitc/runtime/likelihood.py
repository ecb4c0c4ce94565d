"""Log-likelihood queries: log q(x) from observed states and logits, from leaf values a caller
computed itself, and the leaf values alone. Each is one upward pass in the sum semiring.

Every function takes the `Executor` and arguments already checked by `arguments`.
"""

from __future__ import annotations

from torch import Tensor

from .executor import Executor
from .inputs import compute_theta, given_leaves_and_sums, leaves, sum_weights


def log_prob(ex: Executor, x: Tensor, theta: Tensor) -> Tensor:
    """`[B]` log q(x) for `x` `[B, n]` and logits `theta` `[B, P]` or `[P]`."""
    theta = compute_theta(theta)
    values = leaves(ex, x, theta, keep=None)
    return ex.upward(values, sum_weights(ex, theta[:, ex.num_input_params:]), "full")[:, 0]


def leaf_log_probs(ex: Executor, x: Tensor, theta: Tensor) -> Tensor:
    """`[B, Q]`: each leaf's log softmax(L_in[u])[x_variable]."""
    return leaves(ex, x, compute_theta(theta), keep=None).t().contiguous()


def log_prob_from_leaves(ex: Executor, leaf_log_probs: Tensor, sum_logits: Tensor) -> Tensor:
    """`[B]` from leaf values `[B, Q]` and sum logits `[P_sum]` or `[Bs, P_sum]` (row `i` of the
    leaves uses sum row `i % Bs`)."""
    values, sum_logits = given_leaves_and_sums(leaf_log_probs, sum_logits)
    return ex.upward(values, sum_weights(ex, sum_logits), "full")[:, 0]
