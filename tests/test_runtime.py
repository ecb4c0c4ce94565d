"""Every runtime program against brute-force enumeration of the spec's semantics on many random
small region graphs (several partitions per region, mixed hadamard/kronecker, one-child partitions,
shared regions, inputs with differing units)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

from _circuit_reference import Reference, random_graph
from circuitc.builders import btree_graph, cp_graph, ff_graph, hmm_graph
from circuitc.plan import lower
from circuitc.runtime import CompiledCircuit

SEEDS = range(40)  # random graphs per program (the whole file stays well under a minute)


def compiled(graph):
    return CompiledCircuit(lower(graph))


def all_assignments(n: int, v: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product(range(v), repeat=n)), dtype=torch.long)  # [v^n, n]


def setup(seed: int, batch: int = 3, scale: float = 1.5):
    graph = random_graph(seed)
    circ = compiled(graph)
    gen = torch.Generator().manual_seed(seed)
    theta = scale * torch.randn(batch, circ.num_params, generator=gen, dtype=torch.float64)
    refs = [Reference(graph, circ.param_layout, t.numpy()) for t in theta]
    return graph, circ, theta, refs


@pytest.mark.parametrize("seed", SEEDS)
def test_log_prob_and_normalisation_match_brute_force(seed):
    graph, circ, theta, refs = setup(seed)
    xs = all_assignments(graph.variables, graph.states)
    for b, ref in enumerate(refs):
        joint = ref.joint().reshape(-1)
        assert joint.sum() == pytest.approx(1.0, abs=1e-10)  # the reference itself is normalised
        got = circ.log_prob(xs, theta[b]).exp().numpy()
        np.testing.assert_allclose(got, joint, rtol=1e-9, atol=1e-12)
        # per-example theta [B, P]: every row of a batch uses its own parameters
    x = xs[torch.randint(len(xs), (theta.shape[0],), generator=torch.Generator().manual_seed(seed))]
    got = circ.log_prob(x, theta).exp().numpy()
    want = [ref.prob(tuple(x[b].tolist())) for b, ref in enumerate(refs)]
    np.testing.assert_allclose(got, want, rtol=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
def test_log_marginal_with_per_example_masks(seed):
    graph, circ, theta, refs = setup(seed, batch=6)
    n, v = graph.variables, graph.states
    gen = torch.Generator().manual_seed(1000 + seed)
    x = torch.randint(v, (6, n), generator=gen)
    keep = torch.rand(6, n, generator=gen) < 0.5
    x_junk = x.masked_fill(~keep, 10**6)  # unobserved entries may hold anything
    got = circ.log_marginal(x_junk, keep, theta).exp().numpy()
    want = [ref.prob(tuple(x[b].tolist()), keep[b].tolist()) for b, ref in enumerate(refs)]
    np.testing.assert_allclose(got, want, rtol=1e-9)
    # a shared [n] mask
    shared = keep[0]
    got = circ.log_marginal(x, shared, theta).exp().numpy()
    want = [ref.prob(tuple(x[b].tolist()), shared.tolist()) for b, ref in enumerate(refs)]
    np.testing.assert_allclose(got, want, rtol=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
def test_prefix_log_marginals_match_brute_force(seed):
    graph, circ, theta, refs = setup(seed)
    n, v = graph.variables, graph.states
    x = torch.randint(v, (theta.shape[0], n), generator=torch.Generator().manual_seed(seed))
    got = circ.prefix_log_marginals(x, theta).exp().numpy()  # [B, n]
    assert got.shape == (theta.shape[0], n)
    for b, ref in enumerate(refs):
        want = [ref.prob(tuple(x[b].tolist()), [j <= i for j in range(n)]) for i in range(n)]
        np.testing.assert_allclose(got[b], want, rtol=1e-9)


@pytest.mark.parametrize("seed", SEEDS[:30])
def test_conditional_log_distribution_matches_brute_force(seed):
    graph, circ, theta, refs = setup(seed)
    n, v = graph.variables, graph.states
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(v, (theta.shape[0], n), generator=gen)
    keep = torch.rand(theta.shape[0], n, generator=gen) < 0.6
    for variable in range(n):
        got = circ.conditional_log_distribution(x, keep, theta, variable).exp().numpy()  # [B, v]
        for b, ref in enumerate(refs):
            k = keep[b].tolist()
            k[variable] = False
            evidence = ref.prob(tuple(x[b].tolist()), k)
            k[variable] = True
            want = []
            for s in range(v):
                xs = x[b].tolist()
                xs[variable] = s
                want.append(ref.prob(tuple(xs), k) / evidence)
            np.testing.assert_allclose(got[b], want, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_map_attains_the_max_product_value(seed):
    graph, circ, theta, refs = setup(seed)
    n = graph.variables
    got = circ.map(theta)
    assert got.shape == (theta.shape[0], n) and got.dtype == torch.long
    everything = [True] * n
    for b, ref in enumerate(refs):
        best = ref.max_product((0,) * n, [False] * n)  # max over trees and assignments
        attained = ref.max_product(tuple(got[b].tolist()), everything)
        assert attained == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("seed", SEEDS[:30])
def test_map_with_evidence_keeps_it_and_maximises_the_rest(seed):
    graph, circ, theta, refs = setup(seed)
    n, v = graph.variables, graph.states
    gen = torch.Generator().manual_seed(seed)
    evidence = torch.randint(v, (theta.shape[0], n), generator=gen)
    keep = torch.rand(theta.shape[0], n, generator=gen) < 0.5
    got = circ.map(theta, evidence=evidence, keep=keep)
    assert torch.equal(got[keep], evidence[keep])
    for b, ref in enumerate(refs):
        best = ref.max_product(tuple(evidence[b].tolist()), keep[b].tolist())
        attained = ref.max_product(tuple(got[b].tolist()), [True] * n)
        assert attained == pytest.approx(best, rel=1e-9)


def test_map_is_the_exact_mode_for_a_fully_factorised_circuit():
    circ = compiled(ff_graph(3, v=4))
    theta = torch.randn(5, circ.num_params, dtype=torch.float64)
    xs = all_assignments(3, 4)
    exact = torch.stack([xs[circ.log_prob(xs, t).argmax()] for t in theta])
    assert torch.equal(circ.map(theta), exact)


def chi_square_p(samples: torch.Tensor, probs: np.ndarray, v: int) -> float:
    """p-value of the samples (`[N, n]`) against the distribution `probs` over all assignments."""
    n = samples.shape[1]
    codes = (samples * (v ** torch.arange(n - 1, -1, -1))).sum(-1)
    counts = np.bincount(codes.numpy(), minlength=len(probs))
    expected = probs * counts.sum()
    assert counts[expected == 0].sum() == 0  # never an impossible assignment
    mask = expected > 0
    return stats.chisquare(counts[mask], expected[mask] * counts[mask].sum() / expected[mask].sum()).pvalue


@pytest.mark.parametrize("seed", [1, 4, 7, 12, 21, 33])
def test_sampling_frequencies_match_the_exact_joint(seed):
    graph, circ, theta, refs = setup(seed, batch=2)
    joint = [ref.joint().reshape(-1) for ref in refs]
    samples = circ.sample(theta, num_samples=20000, generator=torch.Generator().manual_seed(seed))
    assert samples.shape == (2, 20000, graph.variables)
    for b in range(2):
        assert chi_square_p(samples[b], joint[b], graph.states) > 1e-4
    # shared theta [P]: one example
    shared = circ.sample(theta[0], num_samples=20000, generator=torch.Generator().manual_seed(seed))
    assert shared.shape == (1, 20000, graph.variables)
    assert chi_square_p(shared[0], joint[0], graph.states) > 1e-4


def test_the_chi_square_check_has_power():
    """The control: samples of one distribution must fail against a slightly different one."""
    circ = compiled(btree_graph(3, 2, v=3))
    theta = torch.randn(2, circ.num_params, dtype=torch.float64)
    samples = circ.sample(theta[0], num_samples=20000, generator=torch.Generator().manual_seed(0))[0]
    xs = all_assignments(3, 3)
    right = circ.log_prob(xs, theta[0]).exp().numpy()
    assert chi_square_p(samples, right, 3) > 1e-4
    wrong = 0.9 * right + 0.1 * circ.log_prob(xs, theta[1]).exp().numpy()
    assert chi_square_p(samples, wrong, 3) < 1e-6


@pytest.mark.parametrize("seed", [2, 5, 9, 14, 30])
def test_conditional_sampling_matches_the_exact_conditional(seed):
    graph, circ, theta, refs = setup(seed, batch=2)
    n, v = graph.variables, graph.states
    if n < 2:
        pytest.skip("needs an observed and an unobserved variable")
    evidence = torch.randint(v, (2, n), generator=torch.Generator().manual_seed(seed))
    keep = torch.zeros(2, n, dtype=torch.bool)
    keep[0, 0] = True
    keep[1, n - 1] = True
    samples = circ.sample(theta, num_samples=20000, generator=torch.Generator().manual_seed(seed),
                          evidence=evidence, keep=keep)
    assert torch.equal(samples[keep.unsqueeze(1).expand_as(samples)].view(2, -1),
                       evidence[keep].view(2, 1).expand(2, 20000))
    xs = all_assignments(n, v)
    for b, ref in enumerate(refs):
        joint = ref.joint().reshape(-1)
        agrees = (xs[:, keep[b]] == evidence[b, keep[b]]).all(-1).numpy()
        conditional = np.where(agrees, joint, 0.0)
        conditional /= conditional.sum()
        assert chi_square_p(samples[b], conditional, v) > 1e-4


def test_sampling_is_reproducible_with_a_generator():
    circ = compiled(btree_graph(6, 4, v=5))
    theta = torch.randn(3, circ.num_params)
    a = circ.sample(theta, 7, generator=torch.Generator().manual_seed(11))
    b = circ.sample(theta, 7, generator=torch.Generator().manual_seed(11))
    c = circ.sample(theta, 7, generator=torch.Generator().manual_seed(12))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (3, 7, 6) and a.dtype == torch.long and 0 <= a.min() and a.max() < 5


@pytest.mark.parametrize("make", [lambda: btree_graph(5, 3, v=4), lambda: hmm_graph(4, 3, v=3),
                                  lambda: cp_graph(4, 3, v=3), lambda: ff_graph(4, v=3)])
def test_named_structures_are_normalised_and_consistent(make):
    graph = make()
    circ = compiled(graph)
    theta = torch.randn(2, circ.num_params, dtype=torch.float64)
    xs = all_assignments(graph.variables, graph.states)
    for t in theta:
        lp = circ.log_prob(xs, t)
        assert lp.logsumexp(0).item() == pytest.approx(0.0, abs=1e-10)
        prefix = circ.prefix_log_marginals(xs, t)
        torch.testing.assert_close(prefix[:, -1], lp)


def test_gradients_flow_and_match_finite_differences():
    graph = random_graph(7)
    circ = compiled(graph)
    theta = torch.randn(2, circ.num_params, dtype=torch.float64, requires_grad=True)
    x = torch.randint(graph.states, (2, graph.variables))
    keep = torch.tensor([[True, False] * graph.variables][0][:graph.variables])
    assert torch.autograd.gradcheck(lambda t: circ.log_prob(x, t), (theta,))
    assert torch.autograd.gradcheck(lambda t: circ.log_marginal(x, keep, t), (theta,))
    assert torch.autograd.gradcheck(lambda t: circ.prefix_log_marginals(x, t), (theta,))


def test_gradients_reach_leaves_and_sum_logits():
    circ = compiled(btree_graph(4, 3, v=5))
    theta = torch.randn(3, circ.num_params)
    x = torch.randint(5, (3, 4))
    leaves = circ.leaf_log_probs(x, theta).detach().requires_grad_()
    sums = theta[:, circ.num_input_params:].clone().requires_grad_()
    (circ.log_prob_from_leaves(leaves, sums).sum() + circ.prefix_log_marginals_from_leaves(leaves, sums).sum()).backward()
    assert leaves.grad.abs().sum() > 0 and sums.grad.abs().sum() > 0
    assert torch.isfinite(leaves.grad).all() and torch.isfinite(sums.grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_extreme_logits_stay_finite(dtype):
    circ = compiled(random_graph(21, max_vars=4))
    n, v = circ.num_vars, circ.num_states
    gen = torch.Generator().manual_seed(0)
    theta = (1e4 * (2 * torch.rand(4, circ.num_params, generator=gen) - 1)).to(dtype).requires_grad_()
    x = torch.randint(v, (4, n), generator=gen)
    keep = torch.rand(4, n, generator=gen) < 0.5
    outputs = [circ.log_prob(x, theta), circ.log_marginal(x, keep, theta), circ.prefix_log_marginals(x, theta),
               circ.conditional_log_distribution(x, keep, theta, 0)]
    for out in outputs:
        assert torch.isfinite(out).all()
    outputs[0].sum().backward()
    assert torch.isfinite(theta.grad.float()).all()
    samples = circ.sample(theta.detach(), 5, generator=gen)
    assert 0 <= samples.min() and samples.max() < v
    assert circ.map(theta.detach()).shape == (4, n)


def test_extreme_but_exact_leaves_give_the_exact_answer():
    """Input logits of +-1e4 make each leaf (near) deterministic; log q stays exact."""
    circ = compiled(ff_graph(3, v=2))
    theta = torch.tensor([1e4, -1e4] * 3 + [0.0])
    x = torch.tensor([[0, 0, 0], [1, 0, 0]])
    torch.testing.assert_close(circ.log_prob(x, theta), torch.tensor([0.0, -2e4]))


def test_dtypes_agree_with_float64():
    graph = random_graph(33)
    circ = compiled(graph)
    theta = torch.randn(4, circ.num_params, dtype=torch.float64)
    x = torch.randint(graph.states, (4, graph.variables))
    want = circ.log_prob(x, theta)
    assert want.dtype == torch.float64
    got32 = circ.log_prob(x, theta.float())
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32.double(), want, rtol=1e-5, atol=1e-5)
    theta16 = theta.bfloat16()
    got16 = circ.log_prob(x, theta16)  # computed in float32 from the bfloat16 values
    torch.testing.assert_close(got16.double(), circ.log_prob(x, theta16.double()), rtol=1e-5, atol=1e-5)


def test_shared_theta_broadcasts_like_an_expanded_batch():
    graph = random_graph(12)
    circ = compiled(graph)
    theta = torch.randn(circ.num_params, dtype=torch.float64)
    x = torch.randint(graph.states, (5, graph.variables))
    keep = torch.rand(5, graph.variables) < 0.5
    expanded = theta.expand(5, -1)
    torch.testing.assert_close(circ.log_prob(x, theta), circ.log_prob(x, expanded))
    torch.testing.assert_close(circ.log_marginal(x, keep, theta), circ.log_marginal(x, keep, expanded))
    torch.testing.assert_close(circ.prefix_log_marginals(x, theta), circ.prefix_log_marginals(x, expanded))
    torch.testing.assert_close(circ.conditional_log_distribution(x, keep, theta, 0),
                               circ.conditional_log_distribution(x, keep, expanded, 0))
    assert torch.equal(circ.map(theta.unsqueeze(0).expand(5, -1)), circ.map(theta).expand(5, -1))


@pytest.mark.parametrize("seed", SEEDS[:20])
def test_leaf_programs_agree_with_the_direct_ones(seed):
    graph, circ, theta, refs = setup(seed)
    n, v = graph.variables, graph.states
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(v, (theta.shape[0], n), generator=gen)
    leaves = circ.leaf_log_probs(x, theta)
    assert leaves.shape == (theta.shape[0], circ.num_leaves)
    sums = theta[:, circ.num_input_params:]
    torch.testing.assert_close(circ.log_prob_from_leaves(leaves, sums), circ.log_prob(x, theta))
    torch.testing.assert_close(circ.prefix_log_marginals_from_leaves(leaves, sums), circ.prefix_log_marginals(x, theta))
    # a leaf value of 0 sums its variable out exactly
    keep = torch.rand(theta.shape[0], n, generator=gen) < 0.5
    masked = leaves.masked_fill(~keep[:, circ.leaf_variable], 0.0)
    torch.testing.assert_close(circ.log_prob_from_leaves(masked, sums), circ.log_marginal(x, keep, theta))
    # leaf values are log softmax of each input unit's logits at the observed state
    logits = theta[:, :circ.num_input_params].view(theta.shape[0], circ.num_leaves, v)
    want = logits.log_softmax(-1).gather(2, x[:, circ.leaf_variable].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(leaves, want)


def test_bad_shapes_are_reported():
    circ = compiled(btree_graph(4, 2, v=3))
    with pytest.raises(ValueError, match="theta must be"):
        circ.log_prob(torch.zeros(1, 4, dtype=torch.long), torch.zeros(3))
    with pytest.raises(ValueError, match="batch"):
        circ.log_prob(torch.zeros(2, 4, dtype=torch.long), torch.zeros(3, circ.num_params))
    with pytest.raises(ValueError, match="x must be"):
        circ.log_prob(torch.zeros(2, 5, dtype=torch.long), torch.zeros(circ.num_params))


@pytest.mark.cuda
def test_cuda_programs_match_cpu():
    graph = random_graph(4)
    circ = compiled(graph)
    theta = torch.randn(3, circ.num_params)
    x = torch.randint(graph.states, (3, graph.variables))
    gpu = compiled(graph).to("cuda")
    torch.testing.assert_close(gpu.log_prob(x.cuda(), theta.cuda()).cpu(), circ.log_prob(x, theta))
    torch.testing.assert_close(gpu.prefix_log_marginals(x.cuda(), theta.cuda()).cpu(), circ.prefix_log_marginals(x, theta))
    samples = gpu.sample(theta.cuda(), 4, generator=torch.Generator("cuda").manual_seed(0))
    assert samples.device.type == "cuda" and samples.shape == (3, 4, graph.variables)
    assert gpu.map(theta.cuda()).device.type == "cuda"


def test_single_draws_from_shared_parameters_match_the_joint():
    """Few draws from shared parameters take the row-gather path (not the global CDF)."""
    graph = btree_graph(3, 3, v=3)
    circ = compiled(graph)
    theta = torch.randn(circ.num_params, dtype=torch.float64)
    gen = torch.Generator().manual_seed(3)
    samples = torch.cat([circ.sample(theta, 1, generator=gen)[0] for _ in range(3000)])
    joint = circ.log_prob(all_assignments(3, 3), theta).exp().numpy()
    assert chi_square_p(samples, joint, 3) > 1e-4


@pytest.mark.slow
def test_torch_compile_matches_eager_without_graph_breaks():
    circ = compiled(btree_graph(8, 4, v=16))
    theta = torch.randn(circ.num_params)
    x = torch.randint(16, (4, 8))
    log_prob = torch.compile(circ.log_prob, dynamic=False, fullgraph=True)
    prefix = torch.compile(circ.prefix_log_marginals, dynamic=False, fullgraph=True)
    torch.testing.assert_close(log_prob(x, theta), circ.log_prob(x, theta))
    torch.testing.assert_close(prefix(x, theta), circ.prefix_log_marginals(x, theta))


def test_map_from_shared_parameters_reads_only_the_selected_leaves():
    circ = compiled(btree_graph(4, 3, v=5))  # 12 leaves: one MAP selects 4 of them
    theta = torch.randn(circ.num_params, dtype=torch.float64)
    shared = circ.map(theta)
    assert torch.equal(shared, circ.map(theta.unsqueeze(0).expand(2, -1))[:1])
    graph = btree_graph(4, 3, v=5)
    ref = Reference(graph, circ.param_layout, theta.numpy())
    assert ref.max_product(tuple(shared[0].tolist()), [True] * 4) == pytest.approx(
        ref.max_product((0,) * 4, [False] * 4), rel=1e-9)


def test_balanced_tree_prefix_rows_from_halves_match_masked_marginals():
    graph = btree_graph(8, 2, v=3)  # halves of 1, 2 and 4 variables: [left rows | left last + right rows]
    circ = compiled(graph)
    assert sum(pf.halves["prefix"] for layer in circ.plan.layers for pf in layer.products) == 2
    theta = torch.randn(4, circ.num_params, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x = torch.randint(3, (4, 8), generator=torch.Generator().manual_seed(1))
    prefix = circ.prefix_log_marginals(x, theta)
    for i in range(8):
        keep = torch.arange(8) <= i
        torch.testing.assert_close(prefix[:, i], circ.log_marginal(x, keep, theta))


@pytest.mark.parametrize("make", [lambda: random_graph(21, max_vars=4), lambda: btree_graph(8, 3, v=5)])
@pytest.mark.parametrize("batch", [1, 3])
def test_extreme_shared_logits_stay_finite(make, batch):
    """Shared theta `[P]` takes its own paths (one normalised leaf table, one CDF table, MAP at batch 1)."""
    circ = compiled(make())
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        theta = (1e4 * (2 * torch.rand(circ.num_params, generator=gen) - 1)).to(dtype).requires_grad_()
        x = torch.randint(circ.num_states, (batch, circ.num_vars), generator=gen)
        keep = torch.rand(batch, circ.num_vars, generator=gen) < 0.5
        outputs = [circ.log_prob(x, theta), circ.log_marginal(x, keep, theta), circ.prefix_log_marginals(x, theta)]
        assert all(torch.isfinite(out).all() for out in outputs)
        outputs[2].sum().backward()
        assert torch.isfinite(theta.grad.float()).all()
        samples = circ.sample(theta.detach(), 5, generator=gen)  # few draws: only the selected leaves' rows
        assert 0 <= samples.min() and samples.max() < circ.num_states
        assert circ.map(theta.detach()).shape == (1, circ.num_vars)
        assert circ.map(theta.detach(), evidence=x, keep=keep).shape == (batch, circ.num_vars)
