"""Plan files as circuit sources: what `circuitc compile` writes loads back (`load_graph`, `load_plan`,
`compile`), keeps its graph, and a tampered, old, truncated or garbled plan file is refused with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import circuitc
from circuitc import CircuitError, Limits, load_graph
from circuitc.load import load_plan
from test_hostile_circuitc import cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture
def plan_file(tmp_path, capsys) -> Path:
    """`circuitc compile btree.pc -D n=4 -D r=2`: btree.plan.json beside the source."""
    source = tmp_path / "btree.pc"
    source.write_text((EXAMPLES / "btree.pc").read_text())
    assert cli(capsys, "compile", source, "-D", "n=4", "-D", "r=2")[0] == 0
    return tmp_path / "btree.plan.json"


def edited(path: Path, change, name: str = "edited.plan.json") -> Path:
    data = json.loads(path.read_text())
    change(data)
    out = path.with_name(name)
    out.write_text(json.dumps(data, indent=1))
    return out


def refusal(source) -> str:
    with pytest.raises(CircuitError) as info:
        circuitc.compile(source)
    return str(info.value)


# ----------------------------------------------------------------------------- round trip

def test_a_compiled_circuit_keeps_its_checked_graph_whatever_the_source(tmp_path):
    graph = load_graph(EXAMPLES / "btree.pc", n=4, r=2)
    spec = graph.to_json()
    (tmp_path / "g.json").write_text(json.dumps(spec))
    sources = [graph, EXAMPLES / "btree.pc", str(EXAMPLES / "btree.pc"), spec, tmp_path / "g.json"]
    for source in sources:
        bindings = {"n": 4, "r": 2} if str(source).endswith(".pc") else {}
        circ = circuitc.compile(source, **bindings)
        assert circ.graph is circ.plan.graph and circ.graph.to_json() == spec, source


def test_a_plan_file_round_trips(plan_file):
    stored = json.loads(plan_file.read_text())
    assert stored["format"] == "circuitc-plan/1" and stored["graph"]["format"] == "circuitc-graph/1"
    plan = load_plan(plan_file)
    assert plan.to_json() == stored  # the same plan JSON, counts and graph included
    assert json.dumps(plan.to_json(), indent=1) + "\n" == plan_file.read_text()  # byte for byte
    assert load_graph(plan_file).to_json() == stored["graph"] == load_plan(stored).graph.to_json()
    circ = circuitc.compile(str(plan_file))
    assert circ.num_params == stored["num_params"] and circ.graph.to_json() == stored["graph"]
    assert circuitc.compile(stored).plan.to_json() == stored  # the dict, as the file holds it


def test_a_plan_file_is_a_source_for_every_command(plan_file, capsys):
    status, out, _ = cli(capsys, "check", plan_file)
    assert status == 0 and "4 variables" in out
    status, out, _ = cli(capsys, "compile", plan_file, "-o", plan_file.with_name("again.plan.json"))
    assert status == 0 and plan_file.with_name("again.plan.json").read_text() == plan_file.read_text()
    status, _, err = cli(capsys, "check", plan_file, "-D", "n=3")
    assert status == 2 and "parameters (n) apply to .pc sources" in err


# ----------------------------------------------------------------------------- refused plan files

def test_a_plan_that_disagrees_with_its_graph_is_refused_where_it_differs(plan_file):
    def shift(data):
        data["layers"][0]["sums"][0]["param_offset"] += 1

    message = refusal(edited(plan_file, shift))
    assert "edited.plan.json: the plan disagrees with its graph at layers[0].sums[0].param_offset" in message
    assert "recompile its source with `circuitc compile`" in message and "\n" not in message
    with pytest.raises(CircuitError, match="at param_layout"):
        load_graph(edited(plan_file, lambda d: d["param_layout"].pop()))  # load_graph checks the plan too
    with pytest.raises(CircuitError, match='at "extra" \\(not a key of a plan\\)'):
        load_plan(edited(plan_file, lambda d: d.update(extra=1)))
    with pytest.raises(CircuitError, match=r"at layers \(missing\)"):
        load_plan(edited(plan_file, lambda d: d.pop("layers")))


def test_a_plan_whose_graph_was_changed_is_refused(plan_file):
    def more_units(data):  # a valid graph: its plan is another one
        data["graph"]["units"] = 3

    assert "the plan disagrees with its graph at num_params" in refusal(edited(plan_file, more_units))

    def unsmooth(data):  # the graph is checked as any graph spec, located in the plan file
        data["graph"]["partitions"][0]["children"] = data["graph"]["partitions"][0]["children"][:1]

    message = refusal(edited(plan_file, unsmooth))
    assert "edited.plan.json:" in message and "is not smooth" in message


def test_counts_are_estimates_recomputed_not_compared(plan_file):
    plan = load_plan(edited(plan_file, lambda d: d["counts"].update(units=99)))
    assert plan.counts["units"] != 99 and plan.to_json() == json.loads(plan_file.read_text())


def test_an_old_plan_file_without_its_graph_says_to_recompile(plan_file, capsys):
    old = edited(plan_file, lambda d: d.pop("graph"), "old.plan.json")
    status, _, err = cli(capsys, "check", old)
    assert status == 2 and err.count("\n") == 1
    assert err.startswith("circuitc: error: ") and "old.plan.json: this plan file holds no graph" in err
    assert "recompile its source with `circuitc compile` of this version" in err


def test_a_plan_of_another_format_or_a_graph_given_by_name_is_refused(plan_file, tmp_path):
    message = refusal(edited(plan_file, lambda d: d.update(format="circuitc-plan/9")))
    assert 'the plan\'s format is "circuitc-plan/9"; this circuitc reads "circuitc-plan/1"' in message
    secret = tmp_path / "secret.json"
    secret.write_text('{"token": "SECRET-4711"}')
    message = refusal(edited(plan_file, lambda d: d.update(graph=str(secret))))
    assert "the plan's graph must be the inline graph-spec JSON object, got str" in message
    assert "SECRET" not in message  # never read as a path


@pytest.mark.parametrize("damage", ["truncated", "garbled", "empty", "cut in the format"])
def test_a_truncated_or_garbled_plan_file_is_one_clean_line(plan_file, capsys, damage):
    text = plan_file.read_text()
    broken = {"truncated": text[:len(text) // 2], "garbled": text[:300] + "\x00\x01 garbage" + text[310:],
              "empty": "", "cut in the format": text[:12]}[damage]
    plan_file.write_text(broken)
    for command in ("check", "compile"):
        status, out, err = cli(capsys, command, plan_file)
        assert status == 2 and out == "" and err.count("\n") == 1, err
        assert err.startswith(f"circuitc: error: {plan_file}: the plan file is truncated or damaged (invalid JSON")
    with pytest.raises(CircuitError, match="truncated or damaged"):
        circuitc.compile(plan_file)


def test_a_plan_file_is_bounded_as_a_graph_spec_is(plan_file, capsys):
    status, _, err = cli(capsys, "check", plan_file, "--max-file-bytes", "1000")
    assert status == 2 and "is too large" in err and "--max-file-bytes" in err
    with pytest.raises(CircuitError, match="too many regions"):
        load_plan(plan_file, limits=Limits(regions=3))
    digits = plan_file.read_text().replace('"num_params": ', '"num_params": ' + "9" * 5000, 1)
    plan_file.write_text(digits)
    status, _, err = cli(capsys, "check", plan_file)
    assert status == 2 and "invalid JSON: a number of too many digits" in err
