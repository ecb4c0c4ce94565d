"""The lowering: parameter layout (the runtime contract), folding, index maps, JSON and summary."""

from __future__ import annotations

import json

import pytest
import torch

from _circuit_reference import random_graph
from circuitc.builders import btree_graph, cp_graph, ff_graph, hmm_graph, random_tree_graph
from circuitc.errors import CircuitError
from circuitc.graph import RegionGraph
from circuitc.plan import lower
from circuitc.runtime import CompiledCircuit


@pytest.mark.parametrize("seed", range(30))
def test_param_layout_is_inputs_first_contiguous_and_row_major(seed):
    graph = random_graph(seed)
    plan = lower(graph)
    layout = plan.param_layout
    kinds = [s.kind for s in layout]
    assert kinds == sorted(kinds, key=lambda k: k != "input")  # all inputs, then all sums
    offset = 0
    for slot in layout:
        assert slot.offset == offset
        offset += slot.shape[0] * slot.shape[1]
        region = graph.regions[slot.region]
        assert slot.shape[0] == region.units
        if slot.kind == "input":
            assert graph.is_input(slot.region) and slot.shape[1] == graph.states
            assert slot.variable == region.scope[0]
        else:
            assert slot.shape[1] == graph.sum_inputs(slot.region) and slot.variable is None
    assert offset == plan.num_params
    assert sorted(s.region for s in layout) == sorted(graph.regions)  # one slot per region
    # leaves: input units in layout order
    leaf_vars = [s.variable for s in layout if s.kind == "input" for _ in range(s.shape[0])]
    assert plan.leaf_variable.tolist() == leaf_vars
    assert plan.num_input_params == len(leaf_vars) * graph.states


def test_compiled_circuit_exposes_the_contract_attributes():
    graph = btree_graph(6, 3, v=5)
    circ = CompiledCircuit(lower(graph))
    assert (circ.num_vars, circ.num_states) == (6, 5)
    assert circ.num_params == circ.num_input_params + circ.num_sum_params
    assert circ.num_input_params == circ.param_layout[sum(s.kind == "input" for s in circ.param_layout)].offset
    assert circ.num_leaves == 6 * 3 and circ.leaf_variable.dtype == torch.long
    assert circ.leaf_variable.tolist() == sorted(circ.leaf_variable.tolist())  # btree inputs in variable order
    assert "leaf_variable" in dict(circ.named_buffers())
    assert list(circ.parameters()) == []


def test_btree_folds_one_product_and_one_sum_per_layer_with_contiguous_reads():
    plan = lower(btree_graph(16, 32, v=256))
    assert len(plan.layers) == 4
    for layer, folded in zip(plan.layers, [8, 4, 2, 1]):
        assert len(layer.products) == 1 and len(layer.sums) == 1
        assert layer.sums[0].size == folded
        assert layer.products[0].index["full"] is None  # children stored adjacent: a slice
        assert layer.sums[0].index["full"] is None
        assert layer.sums[0].rows["prefix"] == 16 // folded
    assert plan.counts["units"] == 961
    assert plan.num_params == 16 * 32 * 256 + 14 * 32 * 32 + 32


def test_btree_prefix_rows_need_no_zero_row_and_no_gather():
    """Layer 1 builds its rows as a running sum over the two leaves, layers 2-4 as [left rows | left
    last + right rows] read as one slice; no layer concatenates the zero row."""
    plan = lower(btree_graph(16, 32, v=256))
    assert [pf.cumulative["prefix"] for layer in plan.layers for pf in layer.products] == [True, False, False, False]
    assert [pf.halves["prefix"] for layer in plan.layers for pf in layer.products] == [False, True, True, True]
    assert not any(layer.needs_zero["prefix"] for layer in plan.layers)
    assert all(pf.index["prefix"] is None for layer in plan.layers[1:] for pf in layer.products)
    assert json.loads(json.dumps(plan.to_json()))["layers"][1]["products"][0]["halves"] == {"full": False, "prefix": True}


def test_hmm_and_cp_and_ff_lower():
    assert len(lower(hmm_graph(8, 4, v=3)).layers) == 7
    cp = lower(cp_graph(8, 4, v=3))
    assert len(cp.layers) == 1 and cp.layers[0].products[0].child_units == (4,) * 8
    ff = lower(ff_graph(5, v=3))
    assert ff.num_params == 5 * 3 + 1


def test_sum_folds_group_regions_of_equal_shape():
    graph = random_tree_graph(12, 4, v=3, repetitions=3, seed=1)
    plan = lower(graph)
    for layer in plan.layers:
        shapes = [(sf.units, sf.inputs) for sf in layer.sums]
        assert len(shapes) == len(set(shapes))  # one fold per shape per layer
        for sf in layer.sums:
            for rid in sf.regions:
                assert graph.regions[rid].units == sf.units and graph.sum_inputs(rid) == sf.inputs
            # the fold's logits are one contiguous block of theta
            slots = {s.region: s for s in plan.param_layout}
            offsets = [slots[r].offset for r in sf.regions]
            assert offsets == [sf.param_offset + k * sf.units * sf.inputs for k in range(sf.size)]


def test_kronecker_products_report_an_opt_einsum_order():
    data = {"format": "circuitc-graph/1", "variables": 3, "states": 2, "units": 2, "product": "kronecker",
            "root": "r", "regions": {"r": {"scope": [0, 1, 2], "units": 1}, "x0": {"scope": [0]},
                                     "x1": {"scope": [1]}, "x2": {"scope": [2], "units": 3}},
            "partitions": [{"parent": "r", "children": ["x0", "x1", "x2"]}]}
    plan = lower(RegionGraph.from_json(data))
    (pf,) = plan.layers[0].products
    assert pf.product == "kronecker" and pf.outputs == 12
    assert pf.einsum == "bfri,bfrj,bfrk->bfrijk"
    assert plan.counts["einsum_paths"]  # the fused kronecker-sum contraction order
    assert plan.layers[0].sums[0].inputs == 12


def test_to_json_is_plain_json_and_summary_is_a_table():
    plan = lower(random_graph(5))
    data = json.loads(json.dumps(plan.to_json()))
    assert data["format"] == "circuitc-plan/1"
    assert data["num_params"] == plan.num_params
    assert len(data["param_layout"]) == len(plan.param_layout)
    assert len(data["layers"]) == len(plan.layers)
    assert set(data["counts"]["flops"]) == {"log_prob", "prefix_log_marginals", "sample", "map"}
    text = lower(btree_graph(16, 32)).summary()
    assert "hadamard" in text and "sum" in text and "145440 parameters" in text
    assert "log_prob" in text and "FLOPs" in text


def test_single_variable_circuit_with_an_input_root():
    data = {"format": "circuitc-graph/1", "variables": 1, "states": 4, "root": "x0",
            "regions": {"x0": {"scope": [0], "units": 1}}, "partitions": []}
    circ = CompiledCircuit(lower(RegionGraph.from_json(data)))
    theta = torch.randn(4, dtype=torch.float64)
    x = torch.arange(4).unsqueeze(1)
    torch.testing.assert_close(circ.log_prob(x, theta), theta.log_softmax(0))
    torch.testing.assert_close(circ.prefix_log_marginals(x, theta)[:, 0], theta.log_softmax(0))
    assert circ.map(theta).item() == theta.argmax().item()
    assert circ.sample(theta, 3).shape == (1, 3, 1)


def test_cycles_are_reported():
    data = {"format": "circuitc-graph/1", "variables": 1, "states": 2, "root": "a",
            "regions": {"a": {"scope": [0], "units": 1}, "b": {"scope": [0]}},
            "partitions": [{"parent": "a", "children": ["b"]}, {"parent": "b", "children": ["a"]}]}
    with pytest.raises(CircuitError, match="cycle"):
        lower(RegionGraph.from_json(data))


@pytest.mark.slow
def test_a_ten_thousand_region_graph_lowers():
    graph = btree_graph(5000, 32)
    assert len(graph.regions) == 9999
    circ = CompiledCircuit(lower(graph))
    theta = torch.randn(circ.num_params) * 0.1
    x = torch.randint(256, (2, 5000))
    assert torch.isfinite(circ.log_prob(x, theta)).all()


def test_compile_accepts_region_graphs_and_graph_specs():
    pytest.importorskip("circuitc.check")
    pytest.importorskip("circuitc.load")
    import circuitc

    graph = btree_graph(4, 2, v=3)
    a = circuitc.compile(graph)
    b = circuitc.compile(graph.to_json())
    assert a.num_params == b.num_params
    theta = torch.randn(a.num_params)
    x = torch.randint(3, (2, 4))
    torch.testing.assert_close(a.log_prob(x, theta), b.log_prob(x, theta))
