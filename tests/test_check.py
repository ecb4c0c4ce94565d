"""Structural checks: one failing graph per rule of the graph spec, each message naming the right
regions and variables at the right line; all violations reported together."""

import json

import pytest

from circuitc import CircuitError, check_graph, load_graph
from circuitc.builders import btree_graph, hmm_graph


def diagnostics(source, **bindings):
    with pytest.raises(CircuitError) as info:
        load_graph(source, **bindings)
    return info.value.diagnostics


def only(source):
    (d,) = diagnostics(source)
    return d


def pc(body, header="vars x[4] states 2 units 3\n"):
    return header + body


def spec(**changes):
    """A valid 4-variable graph spec, with some entries changed."""
    data = {"format": "circuitc-graph/1", "variables": 4, "states": 2, "units": 2, "product": "hadamard",
            "root": "r", "regions": {"r": {"scope": [0, 1, 2, 3], "units": 1}, "a": {"scope": [0, 1]},
                                     "b": {"scope": [2, 3]}, "x0": {"scope": [0]}, "x1": {"scope": [1]},
                                     "x2": {"scope": [2]}, "x3": {"scope": [3]}},
            "partitions": [{"parent": "r", "children": ["a", "b"]}, {"parent": "a", "children": ["x0", "x1"]},
                           {"parent": "b", "children": ["x2", "x3"], "product": "kronecker"}]}
    data.update(changes)
    return data


def test_valid_graphs_pass_unchanged():
    graph = btree_graph(8, 4)
    assert check_graph(graph) is graph
    assert check_graph(hmm_graph(5, 2)) is not None
    assert load_graph(spec()).regions["a"].scope == (0, 1)


def test_decomposability_names_the_children_and_the_shared_variable():
    d = only(pc("x[0:8] = x[0:5] * x[4:8]\nx[0:5] = cp(x[0:5], top=3)\nx[4:8] = cp(x[4:8]@b, top=3)\nroot x[0:8]",
                header="vars x[8] states 2 units 3\n"))
    assert d.render().splitlines()[0] == \
        "<string>:2:1: error: partition of x[0:8] is not decomposable: children x[0:5] and x[4:8] share x4"


def test_decomposability_in_a_file_points_at_the_line(tmp_path):
    path = tmp_path / "btree.pc"
    path.write_text("vars x[8] states 2 units 3\n\n\n# halves that overlap\nx[0:8] = x[0:5] * x[4:8]@b\n"
                    "x[0:5] = cp(x[0:5], top=3)\nx[4:8]@b = cp(x[4:8]@b, top=3)\nroot x[0:8]\n")
    d = only(path)
    assert d.render() == (
        f"{path}:5:1: error: partition of x[0:8] is not decomposable: children x[0:5] and x[4:8]@b share x4\n"
        "    x[0:8] = x[0:5] * x[4:8]@b\n"
        "    ^~~~~~~~~~~~~~~~~~~~~~~~~~")


def test_a_child_listed_twice_is_not_decomposable():
    d = only(pc("x[0:4] = x[0:2] * x[0:2] * x[2:4]\nx[0:2] = x[0] * x[1]\nx[2:4] = x[2] * x[3]\nroot x[0:4]"))
    assert "partition of x[0:4] is not decomposable: child x[0:2] appears twice" in d.message and d.line == 2


def test_smoothness_missing_variables():
    d = only(pc("x[0:4] = x[0] * x[1:3]\nx[1:3] = x[1] * x[2]\nroot x[0:4]"))
    assert d.line == 2 and d.message == "partition of x[0:4] is not smooth: no child covers x3"


def test_smoothness_variables_outside_the_parent():
    d = only(pc("x[0:4] = x[0:2] * x[2:4]\nx[0:2] = x[0] * x[1:3]\nx[1:3] = x[1] * x[2]@b\nx[2:4] = x[2] * x[3]\n"
                "root x[0:4]"))
    assert d.line == 3
    assert d.message == "partition of x[0:2] is not smooth: children x[1:3] cover x2, outside x[0:2]"


def test_input_regions_have_one_variable():
    d = only(pc("x[0:4] = x[0:2] * x[2:4]\nx[0:2] = x[0] * x[1]\nroot x[0:4]"))
    assert d.message.startswith("input region x[2:4] has 2 variables; a region without partitions must have "
                                "exactly one")
    assert (d.line, d.column) == (2, 19)  # where x[2:4] was first used


def test_hadamard_children_have_equal_units():
    d = only(pc("x[0:4] = x[0:2] * x[2:4]\nx[0:2] = x[0] * x[1]\nx[2:4] = x[2] * x[3]\nx[2:4].units = 5\n"
                "root x[0:4]"))
    assert d.line == 2
    assert d.message.startswith("hadamard partition of x[0:4] needs children with equal units: "
                                "x[0:2] has 3 units; x[2:4] has 5 units")
    # a kronecker product takes any units
    load_graph(pc("x[0:4] = x[0:2] ** x[2:4]\nx[0:2] = x[0] * x[1]\nx[2:4] = x[2] * x[3]\nx[2:4].units = 5\n"
                  "root x[0:4]"))


def test_root_has_one_unit():
    d = only(pc("x[0:4] = cp(x@c, top=3)\nx[0:4].units = 2\nroot x[0:4]"))
    assert d.message == "the root x[0:4] has 2 units; the root must have exactly 1" and d.line == 2


def test_root_covers_all_variables():
    d = only(pc("x[0:2] = x[0] * x[1]\nroot x[0:2]"))
    assert d.message == "the root x[0:2] does not cover all 4 variables: x2, x3 are missing" and d.line == 2


def test_every_region_is_reachable_from_the_root():
    d = only(pc("x[0:4] = cp(x[0:4])\nx[0:2]@lost = x[0] * x[1]\nroot x[0:4]"))
    assert d.message == "region x[0:2]@lost is not reachable from the root x[0:4]" and d.line == 3


def test_the_graph_is_acyclic():
    d = only(pc("x[0:4] = x[0:4]@a\nx[0:4]@a = x[0:4]@b\nx[0:4]@b = x[0:4]@a\nroot x[0:4]"))
    assert d.message == "regions form a cycle: x[0:4]@a -> x[0:4]@b -> x[0:4]@a" and d.line == 3


def test_ids_exist():
    problems = [d.message for d in diagnostics(spec(root="nope", partitions=[
        {"parent": "r", "children": ["a", "zz"]}, {"parent": "ghost", "children": ["x0"]}]))]
    assert problems == ["the root 'nope' is not a region", "partition of r: child 'zz' is not a region",
                        "a partition's parent 'ghost' is not a region"]


def test_variable_indices_in_range():
    regions = spec()["regions"] | {"x3": {"scope": [7]}}
    messages = [d.message for d in diagnostics(spec(regions=regions))]
    assert "region x3 uses x7, but the variables are x0 .. x3" in messages


def test_a_partition_has_at_least_one_child():
    partitions = spec()["partitions"] + [{"parent": "x3", "children": []}]
    (d,) = diagnostics(spec(partitions=partitions))
    assert d.message == "partition of x3 has no children; a partition has at least one"


def test_all_violations_are_reported_at_once_in_source_order():
    problems = diagnostics(pc("x[0:4] = x[0:3] * x[2:4]\nx[0:3] = x[0] * x[1]\nx[2:4] = x[2] * x[3]\n"
                              "x[2:4].units = 4\nx[3]@far = x[3]\nroot x[0:4]"))
    assert [(d.line, d.message.split(": ")[0]) for d in problems] == [
        (2, "partition of x[0:4] is not decomposable"),
        (2, "hadamard partition of x[0:4] needs children with equal units"),
        (3, "partition of x[0:3] is not smooth"),
        (6, "region x3@far is not reachable from the root x[0:4]"),
    ]


def test_json_input_is_located_in_the_file(tmp_path):
    data = spec(partitions=[{"parent": "r", "children": ["a", "b"]}, {"parent": "a", "children": ["x0", "x0"]},
                            {"parent": "b", "children": ["x2", "x3"]}])
    path = tmp_path / "g.json"
    path.write_text(json.dumps(data, indent=1))
    problems = diagnostics(path)
    text = path.read_text().splitlines()
    by_message = {d.message.split(": ")[0]: d for d in problems}
    decomposable = by_message["partition of a (scope x[0:2]) is not decomposable"]
    assert decomposable.file == str(path) and '"parent": "a"' in text[decomposable.line - 1]
    smooth = by_message["partition of a (scope x[0:2]) is not smooth"]
    assert smooth.message.endswith("no child covers x1")
    unreachable = by_message["region x1 is not reachable from the root r"]
    assert text[unreachable.line - 1].strip().startswith('"x1"')


def test_json_region_ids_are_kept(tmp_path):
    graph = load_graph(spec())
    assert list(graph.regions) == ["r", "a", "b", "x0", "x1", "x2", "x3"]
    assert graph.to_json() == spec()
