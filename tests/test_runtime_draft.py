"""Greedy draft programs (`circuitc.runtime.draft.DraftProgram`) against brute-force enumeration: the
sequential argmax of exact conditionals and the per-position marginal argmax, with and without a
given prefix, on trees, kronecker partitions and DAGs (regions shared by several parents)."""

import pytest
import torch

import circuitc
from circuitc import builders
from circuitc.runtime.draft import DraftProgram
from circuitc.load import load_graph


pytestmark = pytest.mark.usefixtures("one_thread")


def graphs(n=4, r=3, v=3):
    return {
        "ff": builders.ff_graph(n, v),
        "cp": builders.cp_graph(n, r, v),
        "hmm": builders.hmm_graph(n, r, v),
        "btree": builders.btree_graph(n, r, v),
        "random_tree": builders.random_tree_graph(n, r, v, repetitions=2, seed=3),
        "kronecker": load_graph("examples/kronecker.pc", n=n, r=2, v=v),
        "mixture": load_graph("examples/mixture.pc", n=n, r=2, v=v),
        "irregular": load_graph("examples/irregular.pc", v=min(v, 3)),
    }


def brute_force(circ, theta, prefix, sequential):
    """Sequential (or marginal) argmax from the enumerated joint."""
    n, v = circ.num_vars, circ.num_states
    states = torch.cartesian_prod(*[torch.arange(v)] * n).view(-1, n)  # [v^n, n]
    joint = circ.log_prob(states, theta).exp()  # [v^n]
    chosen = list(prefix)
    for j in range(len(prefix), n):
        given = chosen if sequential else list(prefix)
        consistent = (states[:, :len(given)] == torch.tensor(given, dtype=torch.long)).all(1)
        marginal = torch.zeros(v, dtype=joint.dtype).index_add_(0, states[consistent, j], joint[consistent])
        chosen.append(int(marginal.argmax()))
    return chosen


@pytest.mark.parametrize("name", list(graphs()))
def test_drafts_match_enumeration(name):
    graph = graphs()[name]
    circ = circuitc.compile(graph)
    program = DraftProgram(graph, circ.param_layout)
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for trial in range(6):
        theta = torch.randn(circ.num_params, generator=gen, dtype=torch.float64) * 3
        for m in (0, 1, 2):
            prefix = torch.randint(0, circ.num_states, (m,), generator=gen)
            for sequential in (True, False):
                expected = brute_force(circ, theta, prefix.tolist(), sequential)
                run = program.greedy if sequential else program.marginal_argmax
                assert run(theta, prefix).tolist() == expected, (trial, m, sequential)
                assert run(theta.float(), prefix).tolist() == expected  # any float dtype in
                checked += 1
    assert checked == 36


def enumerated_conditional(states, joint, consistent, j, v):
    """`[v]` q(x_j | the rows `consistent` selects) from the enumerated joint over `states` `[v^n, n]`."""
    marginal = torch.zeros(v, dtype=joint.dtype).index_add_(0, states[consistent, j], joint[consistent])
    return marginal / marginal.sum()


@pytest.mark.parametrize("name", list(graphs(v=4)))
def test_conditionals_match_enumeration(name):
    """Every `q(x_j | x_<j)` of random sequences, compared as distributions (stale values or
    derivatives, or a wrong kronecker contraction, change them even where the argmax survives)."""
    graph = graphs(v=4)[name]
    circ = circuitc.compile(graph)
    n, v = circ.num_vars, circ.num_states
    program = DraftProgram(graph, circ.param_layout)
    states = torch.cartesian_prod(*[torch.arange(v)] * n).view(-1, n)  # [v^n, n]
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        theta = torch.randn(circ.num_params, generator=gen, dtype=torch.float64) * 2
        joint = circ.log_prob(states, theta).exp()  # [v^n]
        x = states[torch.randint(0, states.shape[0], (1,), generator=gen)][0]
        for j, row in enumerate(program.conditionals(theta, x)):
            expected = enumerated_conditional(states, joint, (states[:, :j] == x[:j]).all(1), j, v)
            torch.testing.assert_close(row, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", list(graphs(v=4)))
def test_an_unobserved_prefix_state_is_summed_out(name):
    """A prefix state `v` (a token the circuit has no state for) leaves `x_0` unobserved: the greedy draft's
    conditionals, the sampled draft's and `conditionals`' are the enumerated joint's with `x_0` summed out."""
    graph = graphs(v=4)[name]
    circ = circuitc.compile(graph)
    n, v = circ.num_vars, circ.num_states
    program = DraftProgram(graph, circ.param_layout)
    states = torch.cartesian_prod(*[torch.arange(v)] * n).view(-1, n)  # [v^n, n]
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        theta = torch.randn(circ.num_params, generator=gen, dtype=torch.float64) * 2
        joint = circ.log_prob(states, theta).exp()  # [v^n]
        drafted, rows = program.greedy(theta, torch.tensor([v]), with_rows=True)
        sampled, sampled_rows = program.sample(theta, None, torch.tensor([v]), torch.rand(n, generator=gen,
                                                                                         dtype=torch.float64))
        assert drafted[0] == v and sampled[0] == v and (drafted[1:] < v).all()
        for x, got in ((drafted, rows), (sampled, sampled_rows)):
            x = x.clone()
            x[0] = v
            for j in range(1, n):
                consistent = (states[:, 1:j] == x[1:j]).all(1)  # x_0 any state: summed out
                expected = enumerated_conditional(states, joint, consistent, j, v)
                torch.testing.assert_close(got[j], expected, rtol=1e-9, atol=1e-12)
                assert j > 1 or drafted[1] == int(expected.argmax())
            torch.testing.assert_close(program.conditionals(theta, x)[1:], got[1:], rtol=1e-9, atol=1e-12)


def test_plans_reuse_values_and_derivatives():
    """An HMM step recomputes a constant number of regions, whatever the window (not the whole chain)."""
    for n in (8, 16):
        graph = builders.hmm_graph(n, 4, 5)
        program = DraftProgram(graph, circuitc.compile(graph).param_layout)
        ops = [len(step) for step in program.plan(0, sequential=True)]
        assert max(ops[2:]) <= 2, ops
    graph = builders.btree_graph(16, 4, 5)
    program = DraftProgram(graph, circuitc.compile(graph).param_layout)
    assert sum(len(step) for step in program.plan(0, sequential=True)) <= 2 * len(graph.regions)


def test_an_unlikely_prefix_still_drafts():
    graph = builders.hmm_graph(12, 4, 256)
    circ = circuitc.compile(graph)
    theta = torch.randn(circ.num_params) * 8  # leaf probabilities down to ~1e-30
    program = DraftProgram(graph, circ.param_layout)
    rare = int(circ.leaf_log_probs(torch.zeros(1, 12, dtype=torch.long), theta).argmin())  # any leaf's worst
    out = program.greedy(theta, torch.tensor([rare % 256]))
    assert out.shape == (12,) and out[0] == rare % 256 and (out >= 0).all() and (out < 256).all()
    with pytest.raises(ValueError, match="longer than the circuit's 12 variables"):
        program.greedy(theta, torch.zeros(13, dtype=torch.long))


@pytest.mark.parametrize("name", ["ff", "hmm", "irregular"])
def test_samples_follow_the_circuit_and_report_their_conditionals(name):
    """Variable-by-variable samples against the enumerated joint (chi-square), given x_0 or not; the
    returned rows are the conditionals each variable was drawn from."""
    from scipy.stats import chisquare

    graph = {"ff": builders.ff_graph(3, 4), "hmm": builders.hmm_graph(3, 3, 4),
             "irregular": load_graph("examples/irregular.pc", v=2)}[name]
    circ = circuitc.compile(graph)
    n, v = circ.num_vars, circ.num_states
    program = DraftProgram(graph, circ.param_layout)
    states = torch.cartesian_prod(*[torch.arange(v)] * n).view(-1, n)
    theta = torch.randn(circ.num_params, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    joint = circ.log_prob(states, theta).exp()  # [v^n]
    gen = torch.Generator().manual_seed(3)
    for prefix in (None, torch.tensor([1])):
        counts = torch.zeros(states.shape[0])
        for k in range(1000):
            x, rows = program.sample(theta, gen, prefix)
            counts[int((x * v ** torch.arange(n - 1, -1, -1)).sum())] += 1
            if k < 3:
                start = 0 if prefix is None else 1
                expected = program.conditionals(theta, x)
                torch.testing.assert_close(rows[start:], expected[start:], rtol=1e-12, atol=0)
                assert (rows[:start] == 0).all() and (prefix is None or x[0] == 1)
        target = joint if prefix is None else joint * (states[:, 0] == 1)
        keep = target > 0
        expected = (target[keep] / target[keep].sum() * 1000).numpy()
        assert chisquare(counts[keep].numpy(), expected).pvalue > 1e-3
        assert counts[~keep].sum() == 0


def test_inverse_cdf_draws_the_state_whose_interval_holds_u():
    """One distribution (`u` a scalar) and a batch give the same draws: the state whose CDF interval
    holds `u * total` (weights need not sum to 1), never a zero-weight state, never past the last."""
    from circuitc.runtime.kernels import inverse_cdf

    weights = torch.tensor([[0.0, 2.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0, 3.0]], dtype=torch.float64)
    u = torch.tensor([[0.0, 0.49, 0.5, 0.74, 0.75, 0.999999], [0.0, 0.24, 0.25, 0.5, 0.9, 1 - 1e-17]],
                     dtype=torch.float64)
    expected = [[1, 1, 3, 3, 4, 4], [0, 0, 4, 4, 4, 4]]
    batched = inverse_cdf(weights[:, None].expand(2, 6, 5), u)  # [2, 6]
    assert batched.tolist() == expected
    for b in range(2):
        assert [int(inverse_cdf(weights[b], u[b, k])) for k in range(6)] == expected[b]
        assert inverse_cdf(weights[b], u[b, 0]).dim() == 0


@pytest.mark.parametrize("name", ["ff", "btree"])
def test_samples_at_a_temperature_follow_their_tempered_conditionals(name):
    """At temperature t every variable is drawn from its exact conditional raised to 1 / t (against the
    enumerated joint), the rows say so, and the sequences follow the product of those rows (chi-square,
    with the untempered joint as a control that must fail)."""
    from scipy.stats import chisquare

    graph = {"ff": builders.ff_graph(3, 3), "btree": builders.btree_graph(3, 2, 3)}[name]
    circ = circuitc.compile(graph)
    n, v = circ.num_vars, circ.num_states
    program = DraftProgram(graph, circ.param_layout)
    states = torch.cartesian_prod(*[torch.arange(v)] * n).view(-1, n)  # [v^n, n]
    theta = torch.randn(circ.num_params, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 1.5
    joint = circ.log_prob(states, theta).exp()  # [v^n]

    def tempered(x, t):  # [n, v] each conditional of x raised to 1 / t, renormalised (row 0 given: zero)
        rows = torch.zeros(n, v, dtype=torch.float64)
        for j in range(1, n):
            consistent = (states[:, :j] == x[:j]).all(1)
            marginal = torch.zeros(v, dtype=joint.dtype).index_add_(0, states[consistent, j], joint[consistent])
            rows[j] = marginal.pow(1 / t) / marginal.pow(1 / t).sum()
        return rows

    gen = torch.Generator().manual_seed(5)
    for t in (0.5, 2.0):
        counts = torch.zeros(states.shape[0])
        for k in range(1500):
            x, rows = program.sample(theta, gen, torch.tensor([2]), temperature=t)
            counts[int((x * v ** torch.arange(n - 1, -1, -1)).sum())] += 1
            if k < 3:
                torch.testing.assert_close(rows, tempered(x, t), rtol=1e-9, atol=1e-12)
        given = states[:, 0] == 2
        expected = torch.stack([tempered(s, t)[1:].gather(1, s[1:, None]).prod() for s in states[given]])
        assert chisquare(counts[given].numpy(), (expected / expected.sum() * 1500).numpy()).pvalue > 1e-3
        untempered = joint[given] / joint[given].sum() * 1500  # the control: the circuit as trained
        assert chisquare(counts[given].numpy(), untempered.numpy()).pvalue < 1e-6
        assert counts[~given].sum() == 0
    with pytest.raises(ValueError, match="temperature must be > 0"):
        program.sample(theta, gen, temperature=0.0)


def test_a_layout_whose_input_slots_leave_a_gap_is_refused():
    """A draft cuts each input region's leaves out of theta by one split, so the layout's input slots
    must tile its first rows, as every circuitc layout does."""
    import dataclasses

    graph = builders.btree_graph(4, 2, 3)
    circ = circuitc.compile(graph)
    layout = circ.param_layout
    assert DraftProgram(graph, layout).greedy(torch.randn(circ.num_params)).shape == (4,)
    shifted = [dataclasses.replace(s, offset=s.offset + 3) if s.kind == "input" and s.offset else s for s in layout]
    with pytest.raises(ValueError, match="input slots must tile"):
        DraftProgram(graph, shifted)
