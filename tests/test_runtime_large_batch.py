"""The large-batch paths of the runtime against brute-force enumeration: MAP's running max over
sum inputs (no `[F, U, K, B]` scores) and shared logits whose mask folds into the leaf gather as an
extra table column. The thresholds that select them are lowered so that small random graphs,
which brute force can enumerate, take them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from circuitc.runtime import inputs as pass_inputs
from circuitc.runtime import kernels
from _circuit_reference import Reference, random_graph
from circuitc.plan import lower
from circuitc.runtime import CompiledCircuit

SEEDS = range(20)


@pytest.fixture(params=["large-batch paths", "default paths"])
def paths(request, monkeypatch):
    if request.param == "large-batch paths":
        monkeypatch.setattr(kernels, "MAX_PLUS_LOOP_NUMEL", 0)
        monkeypatch.setattr(pass_inputs, "EXTRA_COLUMN_MIN_BATCH", 1)
    return request.param


def setup(seed: int, batch: int, shared: bool):
    graph = random_graph(seed)
    circ = CompiledCircuit(lower(graph))
    gen = torch.Generator().manual_seed(seed)
    theta = 1.5 * torch.randn(1 if shared else batch, circ.num_params, generator=gen, dtype=torch.float64)
    refs = [Reference(graph, circ.param_layout, t.numpy()) for t in theta]
    x = torch.randint(graph.states, (batch, graph.variables), generator=gen)
    keep = torch.rand(batch, graph.variables, generator=gen) < 0.5
    return graph, circ, (theta[0] if shared else theta), refs * (batch if shared else 1), x, keep


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shared", [True, False])
def test_map_with_evidence(seed, shared, paths):
    graph, circ, theta, refs, x, keep = setup(seed, 5, shared)
    got = circ.map(theta, evidence=x, keep=keep)
    assert torch.equal(got[keep], x[keep])
    for b, ref in enumerate(refs):
        best = ref.max_product(tuple(x[b].tolist()), keep[b].tolist())
        assert ref.max_product(tuple(got[b].tolist()), [True] * graph.variables) == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
def test_map_without_evidence(seed, paths):
    graph, circ, theta, refs, _, _ = setup(seed, 4, False)
    got = circ.map(theta)
    for b, ref in enumerate(refs):
        best = ref.max_product((0,) * graph.variables, [False] * graph.variables)
        assert ref.max_product(tuple(got[b].tolist()), [True] * graph.variables) == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
def test_shared_log_marginal_with_masks(seed, paths):
    graph, circ, theta, refs, x, keep = setup(seed, 6, True)
    got = circ.log_marginal(x.masked_fill(~keep, 10**6), keep, theta).exp().numpy()  # unobserved: anything
    want = [ref.prob(tuple(x[b].tolist()), keep[b].tolist()) for b, ref in enumerate(refs)]
    np.testing.assert_allclose(got, want, rtol=1e-9)


def test_large_batch_paths_are_taken_by_default_at_large_batches():
    """At the defaults a BTree at B=1024 runs the running max (no [F, U, K, B] scores), and the
    result equals the broadcast max-plus path's."""
    from circuitc.builders import btree_graph

    circ = CompiledCircuit(lower(btree_graph(8, 8, 16)))
    inputs, log_w = torch.randn(4, 8, 1024), torch.randn(4, 8, 8).log_softmax(-1)
    assert inputs.numel() * log_w.shape[-2] >= kernels.MAX_PLUS_LOOP_NUMEL
    assert torch.equal(kernels.max_plus(inputs, log_w, 1, 1024),
                       (inputs.unsqueeze(1) + log_w.unsqueeze(-1)).amax(2))
    theta = torch.randn(circ.num_params)
    x = torch.randint(16, (1024, 8))
    keep = torch.rand(1024, 8) < 0.5
    got = circ.map(theta, evidence=x, keep=keep)
    assert torch.equal(got[keep], x[keep])
    # the same MAP from per-example (expanded) parameters, which take the masked path
    assert torch.equal(got[:64], circ.map(theta.expand(64, -1), evidence=x[:64], keep=keep[:64]))
