"""MTP heads: the head contract, FF-equivalent initialisation for every structure, near-identity HMM
initialisation, exact save/load."""

import json

import pytest
import torch

import circuitc
from circuitc import builders
from mtpc import MTPHead, load_head, save_head

D, V_LM = 16, 12


def structures(n, r, v):
    return {
        "ff": builders.ff_graph(n, v),
        "cp": builders.cp_graph(n, r, v),
        "hmm": builders.hmm_graph(n, r, v),
        "btree": builders.btree_graph(n, r, v),
        "random_tree": builders.random_tree_graph(n, r, v, repetitions=2, seed=3),
    }


def all_states(n, v):
    return torch.cartesian_prod(*[torch.arange(v)] * n).view(-1, n)  # [v^n, n]


def test_head_contract_views_and_shapes():
    head = MTPHead(builders.btree_graph(4, 3, 5), D, sum_init_std=0.3)
    h = torch.randn(2, 3, D)
    theta = head(h)
    assert theta.shape == (2, 3, head.circ.num_params)
    inputs = head.input_logits(h)  # [2, 3, Q, v]
    assert inputs.shape == (2, 3, head.circ.num_leaves, 5)
    sums = head.sum_logits(h)
    assert sums.shape == (2, 3, head.circ.num_params - head.circ.num_input_params)
    torch.testing.assert_close(theta, torch.cat([inputs.flatten(-2), sums], -1))
    torch.testing.assert_close(head.input_logits(h, slice(2, 5)), inputs[..., 2:5, :])
    torch.testing.assert_close(head.input_logits(h, torch.tensor([4, 0])), inputs[..., [4, 0], :])
    theta.sum().backward()  # the loss trains the head through theta
    assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name", ["ff", "cp", "hmm", "btree", "random_tree"])
def test_init_from_lm_head_is_exactly_the_ff_distribution(name):
    """Every unit of position i = the LM head restricted to the circuit's states (state s = token s):
    the circuit's joint is the product of per-position softmaxes, whatever the sum weights."""
    n, v = 3, 5  # the circuit drafts token ids 0..4 of a 12-token LM
    torch.manual_seed(0)
    lm_head = torch.randn(V_LM, D, dtype=torch.float64)
    for options in ({}, {"sum_init_std": 0.7}, {"identity_init": 3.0}):
        head = MTPHead(structures(n, 3, v)[name], D, init_from=lm_head, dtype=torch.float64, **options)
        h = torch.randn(4, D, dtype=torch.float64)
        x = all_states(n, v)  # [125, 3]
        theta = head(h)  # [4, P]
        for b in range(4):
            log_q = head.circ.log_prob(x, theta[b])  # [125]
            per_position = torch.log_softmax(lm_head[:v] @ h[b], -1)  # [v]
            expected = per_position[x].sum(-1)
            torch.testing.assert_close(log_q, expected, rtol=0, atol=1e-12)


def test_init_from_one_embedding_per_position():
    n, v = 3, 4
    tables = [torch.randn(V_LM, D, dtype=torch.float64) for _ in range(n)]
    head = MTPHead(builders.hmm_graph(n, 2, v), D, init_from=tables, dtype=torch.float64, sum_init_std=0.5)
    h = torch.randn(D, dtype=torch.float64)
    x = all_states(n, v)
    expected = sum(torch.log_softmax(tables[i][:v] @ h, -1)[x[:, i]] for i in range(n))
    torch.testing.assert_close(head.circ.log_prob(x, head(h)), expected, rtol=0, atol=1e-12)
    stacked = MTPHead(builders.hmm_graph(n, 2, v), D, init_from=torch.stack(tables), dtype=torch.float64)
    torch.testing.assert_close(stacked.input_logits(h), head.input_logits(h))


def test_init_without_lm_head_is_not_degenerate():
    head = MTPHead(builders.cp_graph(3, 4, 6), D)
    units = head.input_logits(torch.randn(D))  # [Q, v]
    assert units.std() > 0.1 and not torch.allclose(units[0], units[3])  # distinct leaves, random init


def test_identity_init_makes_hmm_transitions_near_identity():
    r = 4
    head = MTPHead(builders.hmm_graph(4, r, 5), D, identity_init=4.0)
    offset = head.circ.num_input_params
    squares = [s for s in head.circ.param_layout if s.kind == "sum" and s.shape == (r, r)]
    assert len(squares) == 2  # the chain's transitions: regions x[1:4] and x[2:4] (x[3] is an input)
    for slot in squares:
        sums = head.sum_logits(torch.zeros(D))  # sum projections start at zero: the bias alone
        block = sums[slot.offset - offset: slot.offset - offset + r * r].view(r, r)
        probs = block.softmax(-1)
        torch.testing.assert_close(probs.diagonal(), torch.full((r,), torch.e ** 4 / (torch.e ** 4 + r - 1)))
    root = next(s for s in head.circ.param_layout if s.kind == "sum" and s.shape[0] == 1)
    assert torch.all(head.bias[root.offset: root.offset + r] == 0)  # the root mixture stays uniform


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_save_load_round_trip_is_exact(tmp_path, dtype):
    graph = builders.btree_graph(4, 3, 7)
    head = MTPHead(graph, D, dtype=dtype, sum_init_std=0.2, identity_init=1.5)
    save_head(head, tmp_path / "head")
    config = json.loads((tmp_path / "head" / "head.json").read_text())
    assert config["graph"] == graph.to_json() and config["options"]["identity_init"] == 1.5
    loaded = load_head(tmp_path / "head")
    assert loaded.weight.dtype == dtype
    assert torch.equal(loaded.weight, head.weight) and torch.equal(loaded.bias, head.bias)
    h = torch.randn(3, D, dtype=dtype)
    assert torch.equal(loaded(h), head(h))
    assert loaded.config() == head.config()


def test_errors():
    graph = builders.cp_graph(3, 2, 5)
    with pytest.raises(ValueError, match=r"init_from\[0\] has shape \(12, 8\); expected \[V, 16\]"):
        MTPHead(graph, D, init_from=torch.randn(V_LM, 8))
    with pytest.raises(ValueError, match="has 4 rows but the circuit has 5 states"):
        MTPHead(graph, D, init_from=torch.randn(4, D))
    with pytest.raises(ValueError, match="2 embeddings; the circuit has 3 window positions"):
        MTPHead(graph, D, init_from=[torch.randn(V_LM, D)] * 2)
    with pytest.raises(ValueError, match="unknown head parameterisation"):
        MTPHead(graph, D, parameterisation="nope")


def test_head_from_a_pc_file_keeps_its_graph(tmp_path):
    source = tmp_path / "small.pc"
    source.write_text("vars x[3] states 5 units 2\nx[0:3] = prod([x[i] for i in 0..3])\nroot x[0:3]\n")
    head = MTPHead(str(source), D, sum_init_std=0.1)
    assert head.num_variables == 3 and head.num_states == 5 and head.num_leaves == 6
    loaded = load_head(save_head(head, tmp_path / "head"))
    assert torch.equal(loaded.weight, head.weight) and loaded.graph.to_json() == head.graph.to_json()


def test_save_needs_the_graph_and_load_needs_a_head_dir(tmp_path):
    compiled = circuitc.compile(builders.cp_graph(3, 2, 5))
    head = MTPHead(compiled, D)
    if getattr(compiled, "graph", None) is None:
        with pytest.raises(ValueError, match="cannot be saved"):
            save_head(head, tmp_path / "x")
    with pytest.raises(FileNotFoundError, match="written by save_head"):
        load_head(tmp_path / "nothing")
