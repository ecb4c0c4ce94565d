"""The training-loss speed-ups compute what the old code computed.

- `log_prob_from_leaves` / `prefix_log_marginals_from_leaves` with `c` copies of a batch sharing
  their sum logits (`[Bs, S]` for `c * Bs` leaf rows) equal the old call with
  `sum_logits.repeat(c, 1)`: values, gradients, and the second-order gradients the KL loss takes.
- The KL loss, whose n-copy posterior pass now shares the sum logits, equals its reference path
  (`fused=False`, `conditional_log_distribution` per position) in float64, loss and gradients.
"""

import pytest
import torch

from circuitc import builders
from circuitc import compile as compile_circuit
from mtpc.heads.head import MTPHead
from mtpc.heads.kl_loss import kl_loss, logits_teacher

from _circuit_reference import random_graph

GRAPHS = {"btree": builders.btree_graph(4, 3, 4), "hmm": builders.hmm_graph(4, 2, 3), "cp": builders.cp_graph(3, 3, 4),
          "random": random_graph(7)}


def _leaves_and_sums(circ, copies, batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    leaves = -torch.rand(copies * batch, circ.num_leaves, generator=g, dtype=torch.float64) * 3  # [c*B, Q]
    leaves = leaves.masked_fill(torch.rand(leaves.shape, generator=g) < 0.3, 0.0)  # some variables summed out
    sums = torch.randn(batch, circ.num_sum_params, generator=g, dtype=torch.float64)  # [B, S]
    return leaves.requires_grad_(), sums.requires_grad_()


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("program", ["log_prob_from_leaves", "prefix_log_marginals_from_leaves"])
def test_copies_sharing_sum_logits_equal_repeated_sum_logits(name, program):
    circ = compile_circuit(GRAPHS[name])
    leaves, sums = _leaves_and_sums(circ, copies=3, batch=5)
    results = []
    for shared in (True, False):
        out = getattr(circ, program)(leaves, sums if shared else sums.repeat(3, 1))
        first = torch.autograd.grad(out.square().sum(), (leaves, sums), create_graph=True)
        second = torch.autograd.grad(sum(g.square().sum() for g in first), (leaves, sums))
        results.append([out, *first, *second])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert all(t.abs().sum() > 0 for t in results[0][1:])


def test_copies_must_divide_the_leaf_batch():
    circ = compile_circuit(GRAPHS["btree"])
    leaves, sums = _leaves_and_sums(circ, copies=1, batch=5)
    with pytest.raises(ValueError, match="sum_logits has batch 2 but leaf_log_probs has 5"):
        circ.log_prob_from_leaves(leaves, sums[:2])
    assert circ.log_prob_from_leaves(leaves[:4], sums[:2]).shape == (4,)


def _kl_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 5, (2, 11), generator=g)  # id 4 is not a circuit state: summed out
    doc_ids = torch.tensor([[0] * 6 + [1] * 5, [2] * 9 + [-1] * 2])
    mask = torch.rand(2, 11, generator=g) < 0.8
    logits = 2 * torch.randn(2, 11, 6, generator=g, dtype=torch.float64)
    return tokens, doc_ids, mask, logits


@pytest.mark.parametrize("parameterisation", ["full", "shared"])
@pytest.mark.parametrize("chunk_elements", [1, 2000, 1 << 22])
def test_kl_loss_equals_its_reference_path_in_float64(parameterisation, chunk_elements):
    torch.manual_seed(0)
    head = MTPHead(compile_circuit(builders.btree_graph(4, 3, 4)), 6, sum_init_std=0.7, dtype=torch.float64,
                   parameterisation=parameterisation)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.5 * torch.randn_like(p))
    tokens, doc_ids, mask, logits = _kl_batch()
    hidden = torch.randn(2, 11, 6, dtype=torch.float64, requires_grad=True)
    results = []
    for fused in (True, False):
        head.zero_grad()
        hidden.grad = None
        out = kl_loss(head, hidden, logits_teacher(logits), tokens, doc_ids, mask, fused=fused,
                      chunk_elements=chunk_elements)
        out.loss.backward()
        results.append([out.loss.detach(), out.term_sums, hidden.grad.clone()] + [p.grad.clone() for p in head.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
