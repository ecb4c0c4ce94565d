"""The `circuitc` command line, run in-process: every command, its output and exit status, and
located diagnostics (never a traceback) for bad input."""

import json
import shutil
import sys
import types
from pathlib import Path

import pytest

from circuitc import load_graph
from circuitc.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(capsys, *argv):
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return status, out, err


def test_check_prints_a_one_line_summary(capsys):
    status, out, err = run(capsys, "check", EXAMPLES / "btree.pc", "-D", "n=8", "-D", "r=4")
    assert status == 0 and err == ""
    assert out == (f"{EXAMPLES / 'btree.pc'}: ok: 8 variables, 256 states, 15 regions (8 input, 7 inner), "
                   f"7 partitions, root x[0:8]; compiled: 8,292 parameters, largest sum region x[0:2] "
                   f"(4 x 4 weights)\n")
    import circuitc  # the estimate is the parameter count compile gives

    assert circuitc.compile(EXAMPLES / "btree.pc", n=8, r=4).num_params == 8292


def test_check_reports_every_problem_with_location_and_caret(capsys, tmp_path):
    path = tmp_path / "bad.pc"
    path.write_text("vars x[8] states 2 units 3\nx[0:8] = x[0:5] * x[4:8]\nroot x[0:8]\n")
    status, out, err = run(capsys, "check", path)
    assert status == 2 and out == ""
    lines = err.splitlines()
    assert lines[0] == f"{path}:2:1: error: partition of x[0:8] is not decomposable: children x[0:5] and x[4:8] " \
                       f"share x4"
    assert lines[1:3] == ["    x[0:8] = x[0:5] * x[4:8]", "    ^~~~~~~~~~~~~~~~~~~~~~~~"]
    assert sum(line.startswith(f"{path}:") for line in lines) == 3  # two input regions with many variables too


def test_parse_errors_and_unknown_parameters(capsys, tmp_path):
    path = tmp_path / "typo.pc"
    path.write_text("vars x[4] states 2\nroot x[0:4] *\n")
    status, _, err = run(capsys, "check", path)
    assert status == 2 and err.startswith(f"{path}:2:14: error: unexpected end of file; expected an expression")
    status, _, err = run(capsys, "check", EXAMPLES / "hmm.pc", "-D", "m=3")
    assert status == 2 and err == "circuitc: error: unknown parameter m; the parameters of " \
                                  f"{EXAMPLES / 'hmm.pc'} are: n, r, v\n"


def test_binding_values(capsys):
    assert run(capsys, "check", EXAMPLES / "builtin.pc", "-D", "structure=cp", "-D", "n=3")[0] == 0
    assert run(capsys, "check", EXAMPLES / "builtin.pc", "-D", 'structure="hmm"')[0] == 0
    status, _, err = run(capsys, "check", EXAMPLES / "btree.pc", "-D", "n=true")
    assert status == 2 and "parameter n is a number (default 16), but it was bound to true" in err
    status, _, err = run(capsys, "check", EXAMPLES / "btree.pc", "-D", "n")
    assert status == 2 and "circuitc: error: argument -D: expected NAME=VALUE" in err  # a usage error


def test_missing_files(capsys, tmp_path):
    status, _, err = run(capsys, "check", tmp_path / "nope.pc")
    assert status == 2 and err.startswith(f"circuitc: error: cannot read {tmp_path / 'nope.pc'}: No such file")


def test_export_and_json_round_trip(capsys, tmp_path):
    status, out, _ = run(capsys, "export", EXAMPLES / "mixture.pc", "-D", "n=6")
    assert status == 0
    spec = json.loads(out)
    assert spec == load_graph(EXAMPLES / "mixture.pc", n=6).to_json()
    saved = tmp_path / "mixture.json"
    assert run(capsys, "export", EXAMPLES / "mixture.pc", "-D", "n=6", "-o", saved)[0] == 0
    assert json.loads(saved.read_text()) == spec
    # .pc -> JSON -> graph -> JSON is stable, and the JSON file checks and exports the same
    assert load_graph(saved).to_json() == spec
    status, out, _ = run(capsys, "check", saved)
    assert status == 0 and out.startswith(f"{saved}: ok: 6 variables")
    assert json.loads(run(capsys, "export", saved)[1]) == spec


@pytest.mark.parametrize("name", sorted(p.stem for p in EXAMPLES.glob("*.pc")))
def test_every_example_round_trips_through_json(name):
    spec = load_graph(EXAMPLES / f"{name}.pc").to_json()
    assert load_graph(spec).to_json() == spec
    assert load_graph(json.dumps(spec)).to_json() == spec


def test_json_files_take_no_parameters(capsys, tmp_path):
    saved = tmp_path / "g.json"
    saved.write_text(json.dumps(load_graph(EXAMPLES / "ff.pc").to_json()))
    status, _, err = run(capsys, "check", saved, "-D", "n=3")
    assert status == 2 and "parameters (n) apply to .pc sources" in err
    saved.write_text('{"format": "circuitc-graph/1",\n "variables": 2,, }')
    status, _, err = run(capsys, "check", saved)
    assert status == 2 and err.startswith(f"{saved}:2:17: error: invalid JSON")


def test_show_text_tree(capsys):
    status, out, _ = run(capsys, "show", EXAMPLES / "btree.pc", "-D", "n=4", "-D", "r=2")
    assert status == 0
    assert out.splitlines()[1:] == [
        "x[0:4] (1 unit) = x[0:2] * x[2:4]",
        "  x[0:2] (2 units) = x0 * x1",
        "    x0 (2 units, input)",
        "    x1 (2 units, input)",
        "  x[2:4] (2 units) = x2 * x3",
        "    x2 (2 units, input)",
        "    x3 (2 units, input)",
    ]
    out = run(capsys, "show", EXAMPLES / "irregular.pc")[1]
    assert "x[0:6] (1 unit) = x{0,2,4} * x{1,3,5} | x[0:2] ** x[2:6]" in out and "    x0 ^" in out


def test_show_dot(capsys, tmp_path):
    status, out, _ = run(capsys, "show", EXAMPLES / "kronecker.pc", "-D", "n=2", "--format", "dot")
    assert status == 0 and out.startswith("digraph circuit {")
    assert '"x[0:2]" -> p0;' in out and 'p0 -> "x0";' in out and 'label="⊗"' in out
    run(capsys, "show", EXAMPLES / "kronecker.pc", "--format", "dot", "-o", tmp_path / "k.dot")
    assert (tmp_path / "k.dot").read_text().startswith("digraph circuit {")


def test_show_png_without_graphviz_says_so(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    status, _, err = run(capsys, "show", EXAMPLES / "cp.pc", "--format", "png", "-o", tmp_path / "cp.png")
    assert status == 1 and "the graphviz program `dot` is not installed" in err


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz is not installed")
def test_show_png_with_graphviz(capsys, tmp_path):
    status, out, _ = run(capsys, "show", EXAMPLES / "cp.pc", "--format", "png", "-o", tmp_path / "cp.png")
    assert status == 0 and (tmp_path / "cp.png").read_bytes()[:4] == b"\x89PNG"


def test_fmt_prints_and_rewrites_in_place(capsys, tmp_path):
    path = tmp_path / "messy.pc"
    path.write_text("vars x[2]   states 2 # two\nx[0:2]=x[0]*x[1];root x[0:2]\n")
    status, out, _ = run(capsys, "fmt", path)
    assert status == 0 and out == "vars x[2] states 2  # two\nx[0:2] = x[0] * x[1]\nroot x[0:2]\n"
    assert run(capsys, "fmt", path, "--in-place") == (0, "", "")
    assert path.read_text() == out
    path.write_text("vars x[2] states\n")
    status, _, err = run(capsys, "fmt", path)
    assert status == 2 and err.startswith(f"{path}:1:17: error: unexpected end of file")


def test_compile_writes_the_plan_and_prints_its_summary(capsys, monkeypatch, tmp_path):
    class FakePlan:
        def __init__(self, graph):
            self.graph = graph

        def to_json(self):
            return {"regions": len(self.graph.regions)}

        def summary(self):
            return "a table"

    monkeypatch.setitem(sys.modules, "circuitc.plan", types.SimpleNamespace(lower=FakePlan))
    source = tmp_path / "src" / "btree.pc"  # the plan goes beside its source, not into the current folder
    source.parent.mkdir()
    source.write_text((EXAMPLES / "btree.pc").read_text())
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    status, out, _ = run(capsys, "compile", source, "-D", "n=4")
    assert status == 0 and out == f"a table\nwrote {tmp_path / 'src' / 'btree.plan.json'}\n"
    assert json.loads((tmp_path / "src" / "btree.plan.json").read_text()) == {"regions": 7}
    assert list((tmp_path / "elsewhere").iterdir()) == []
    monkeypatch.chdir(tmp_path / "src")
    status, out, _ = run(capsys, "compile", "btree.pc", "-D", "n=4")  # a bare name: the current folder
    assert status == 0 and out == "a table\nwrote btree.plan.json\n"
    status, out, _ = run(capsys, "compile", EXAMPLES / "btree.pc", "-o", tmp_path / "p.json")
    assert status == 0 and json.loads((tmp_path / "p.json").read_text()) == {"regions": 31}


def test_compile_with_the_real_back_end(capsys, tmp_path):
    pytest.importorskip("circuitc.plan")
    status, out, err = run(capsys, "compile", EXAMPLES / "hmm.pc", "-D", "n=4", "-D", "r=2", "-D", "v=3",
                           "-o", tmp_path / "hmm.plan.json")
    assert status == 0, err
    assert isinstance(json.loads((tmp_path / "hmm.plan.json").read_text()), dict)
    assert out.endswith(f"wrote {tmp_path / 'hmm.plan.json'}\n")


def test_internal_errors_are_reported_without_a_traceback(capsys, monkeypatch):
    def broken(args, out, err):
        raise RuntimeError("boom")

    monkeypatch.setattr("circuitc.cli._check", broken)
    status, _, err = run(capsys, "check", EXAMPLES / "ff.pc")
    assert status == 1 and "circuitc: error: internal error (RuntimeError: boom); rerun with --debug" in err
    assert "Traceback" not in err
    status = main(["check", str(EXAMPLES / "ff.pc"), "--debug"])
    assert status == 1 and "Traceback" in capsys.readouterr().err


def test_generated_files_with_long_chains_and_deep_nesting(capsys, tmp_path):
    n = 1500  # well past Python's recursion limit
    chain = tmp_path / "chain.pc"
    chain.write_text(f"vars x[{n}] states 2\nroot x[0:{n}] = " + " * ".join(f"x[{i}]" for i in range(n)) + "\n")
    status, out, _ = run(capsys, "check", chain)
    assert status == 0 and "1 partition, root x[0:1500]" in out
    status, out, _ = run(capsys, "fmt", chain)
    assert status == 0 and out == chain.read_text()
    deep = tmp_path / "deep.pc"
    deep.write_text("vars x[2] states 2\ny = " + "-" * 5000 + "1\nroot x[0:2] = x[0] * x[1]\n")
    status, _, err = run(capsys, "check", deep)
    assert status == 2 and err.startswith(f"{deep}:2:1: error: this statement nests expressions too deeply")
    status, _, err = run(capsys, "fmt", deep)
    assert status == 2 and err.startswith(f"{deep}:1:1: error: expressions nest too deeply to format")
