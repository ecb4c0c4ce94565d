"""Hostile inputs to circuitc, one test per class of issue 11: reading files it must not read,
asking for unbounded work, flooding the output, inputs that used to end in an internal error, CLI
mistakes, and misuse of a compiled circuit's Python API. Each case asserts the exact error class and
a fragment of the message, and (CLI) that no traceback is printed and the exit status is 2."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import circuitc
from circuitc import CircuitError, Limits, load_graph
from circuitc.builders import btree_graph, hmm_graph
from circuitc.cli import main
from circuitc.decompile import decompile, decompile_names

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def cli(capsys, *argv) -> tuple[int, str, str]:
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return status, out, err


def error_of(source, **kwargs) -> str:
    with pytest.raises(CircuitError) as info:
        load_graph(source, **kwargs)
    return str(info.value)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


TAIL = "vars x[1] states 2\nroot x[0]\n"


# ----------------------------------------------------------------------------- reading files

@pytest.mark.parametrize("target, fragment", [
    ("/etc/passwd", "only .pc files can be included"),
    ("/proc/self/environ", "only .pc files can be included"),
    ("/dev/zero", "only .pc files can be included"),
    ("../../../../../../../etc/passwd", "only .pc files can be included"),
])
def test_include_reads_only_pc_files(tmp_path, target, fragment):
    main_file = write(tmp_path / "main.pc", f'include "{target}"\n{TAIL}')
    message = error_of(main_file)
    assert fragment in message and "root:" not in message  # never a line of the file


def test_include_stays_inside_the_folder_tree_or_the_include_paths(tmp_path):
    write(tmp_path / "outside" / "lib.pc", "def f() { return 1 }\n")
    main_file = write(tmp_path / "project" / "main.pc", f'include "../outside/lib.pc"\n{TAIL}')
    assert re.search(r'cannot include "../outside/lib.pc": .*lib.pc is outside .*project and the include paths '
                     r"\(add its folder with -I DIR", error_of(main_file))
    assert load_graph(main_file, include_paths=[tmp_path / "outside"]).variables == 1
    # relative to an include path, when not next to the including file
    write(tmp_path / "project" / "other.pc", f'include "lib.pc"\n{TAIL}')
    assert load_graph(tmp_path / "project" / "other.pc", include_paths=[tmp_path / "outside"]).variables == 1
    # a symlink inside the tree that points outside it is judged by its target
    (tmp_path / "project" / "link.pc").symlink_to(tmp_path / "outside" / "lib.pc")
    write(tmp_path / "project" / "via_link.pc", f'include "link.pc"\n{TAIL}')
    assert "is outside" in error_of(tmp_path / "project" / "via_link.pc")


def test_include_refuses_devices_and_fifos_without_blocking(tmp_path):
    (tmp_path / "zero.pc").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo.pc")
    for name in ("zero.pc", "fifo.pc"):
        main_file = write(tmp_path / f"main-{name}", f'include "{name}"\n{TAIL}')
        assert "not a regular file" in error_of(main_file, include_paths=["/dev"])


@pytest.mark.parametrize("path, fragment", [
    ("a\x00b.pc", "not a valid file name"),
    ("\udcff.pc", "not a valid file name"),  # text decoded with surrogateescape
    ("a\nb.pc", None),  # a string literal cannot hold a newline: a syntax error
])
def test_include_paths_that_are_not_file_names(path, fragment):
    with pytest.raises(CircuitError) as info:
        load_graph(f'include "{path}"\n{TAIL}')
    assert fragment is None or fragment in str(info.value)


def test_include_of_a_non_utf8_or_oversized_file(tmp_path):
    (tmp_path / "bad.pc").write_bytes(b"# \xff\xfe\n")
    assert "not UTF-8 text" in error_of(write(tmp_path / "a.pc", f'include "bad.pc"\n{TAIL}'))
    write(tmp_path / "big.pc", "#" * 5000 + "\n")
    message = error_of(write(tmp_path / "b.pc", f'include "big.pc"\n{TAIL}'), limits=Limits(file_bytes=1000))
    assert "is too large" in message and "--max-file-bytes" in message


def test_the_include_example_still_works(capsys):
    status, out, _ = cli(capsys, "check", EXAMPLES / "include.pc")
    assert status == 0 and "16 variables" in out


def test_cli_reads_only_pc_and_json_files_and_never_echoes_others(capsys, tmp_path):
    status, out, err = cli(capsys, "check", "/etc/passwd")
    assert status == 2 and err == "circuitc: error: cannot read /etc/passwd: a structure file ends in .pc or .json\n"
    os.mkfifo(tmp_path / "pipe.pc")
    status, _, err = cli(capsys, "check", tmp_path / "pipe.pc")
    assert status == 2 and "not a regular file" in err
    status, _, err = cli(capsys, "fmt", "/etc/passwd")
    assert status == 2 and "fmt reads a .pc file or a graph-spec .json file" in err


def test_from_json_reads_only_json_files(tmp_path):
    from circuitc.graph import RegionGraph

    with pytest.raises(CircuitError, match="a graph spec file ends in .json") as info:
        RegionGraph.from_json("/etc/passwd")
    assert "root:" not in str(info.value)
    path = write(tmp_path / "g.json", json.dumps(load_graph(EXAMPLES / "cp.pc").to_json()))
    assert RegionGraph.from_json(path).variables == 16


def test_cli_include_paths(capsys, tmp_path):
    write(tmp_path / "lib" / "defs.pc", "def leaf() { return x[0] }\n")
    main_file = write(tmp_path / "src" / "main.pc", 'include "defs.pc"\nvars x[1] states 2\nroot leaf()\n')
    assert cli(capsys, "check", main_file)[0] == 2
    status, out, _ = cli(capsys, "check", main_file, "-I", tmp_path / "lib")
    assert status == 0 and "1 variable" in out


# ----------------------------------------------------------------------------- bounded work

def test_bound_variables_from_a_binding(capsys):
    start = time.perf_counter()
    status, _, err = cli(capsys, "check", EXAMPLES / "btree.pc", "-D", "n=100000000")
    assert status == 2 and "too many variables (100,000,000; the limit is 100,000)" in err
    assert "raise it with --max-variables or circuitc.Limits(variables=...)" in err
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("body, limit, fragment", [
    ("vars x[10**9] states 2\nroot x[0]", "--max-variables", "too many variables"),
    ("vars x[2] states 10**9\nroot x[0:2] = x[0] * x[1]", "--max-states", "too many states"),
    ("vars x[3] states 2 units 10000\nroot x[0:3] = x[0] ** x[1] ** x[2]", "--max-parameters",
     "the compiled circuit would have too many parameters (1,000,000,060,000"),
    ("vars x[2] states 2\nfor i in 0..10**18 { y = i }\nroot x[0:2] = x[0] * x[1]", "--max-loop",
     "a for loop is too long"),
    ("vars x[2] states 2\ny = [i for i in 0..10**18]\nroot x[0:2] = x[0] * x[1]", "--max-loop",
     "a list comprehension is too long"),
    ("vars x[2] states 2\nk = 2\n" + "k = k * k\n" * 40 + "root x[0:2] = x[0] * x[1]", "--max-int-bits",
     "is too large"),
    ("vars x[2] states 2\ny = 10 ** 10 ** 10\nroot x[0:2] = x[0] * x[1]", "--max-int-bits", "is too large"),
    ("vars x[8] states 2\nroot random_tree(x, repetitions=10**9)", "--max-repetitions",
     "random_tree: repetitions is too large"),
    ("vars x[2] states 2 units 10**6\nroot x[0:2] = x[0] * x[1]", "--max-units", "too many units in one region"),
    ("vars x[1] states 2\ny = " + "1" * 5000 + "\nroot x[0]", "--max-int-bits",
     "integer literal of 5,000 digits is too large"),
    ("vars x[2] states 2\ndef f(k) { if k == 0 { return 0 } return f(k - 1) + f(k - 1) }\ny = f(40)\n"
     "root x[0:2] = x[0] * x[1]", "--max-steps", "too many evaluation steps"),
    ("vars x[2] states 2\ndef f(k) { return f(k + 1) }\ny = f(0)\nroot x[0:2] = x[0] * x[1]", "--max-call-depth",
     "recursion too deep"),
    ("vars x[2] states 2\nroot x[0..10**18]", None, "variable x2 does not exist"),
    ("vars x[2] states 2\nroot x[0..10**18, 0]", None, "variable x2 does not exist"),
])
def test_bounded_work_in_pc_programs(body, limit, fragment):
    start = time.perf_counter()
    message = error_of(body + "\n")
    assert fragment in message and (limit is None or limit in message), message
    assert re.match(r"<string>:\d+:\d+: error: ", message)  # located
    assert time.perf_counter() - start < 20  # the step bound is about a second of work


def test_len_of_a_huge_range_is_exact_and_a_loop_over_it_is_bounded():
    graph = load_graph("vars x[1] states 2\nn = len(0..10**70)\nm = min(0..10**70) + max(range(5, 10**70, 3))\n"
                       "root x[m - 10**70 + 2 - (n - 10**70)]\n")
    assert graph.variables == 1 and graph.root == "x0"  # len, min and max computed exactly, none walked
    assert "a for loop is too long (10,000,000,000" in error_of(
        "vars x[1] states 2\nfor i in 0..len(0..10**10) { y = i }\nroot x[0]\n")


def test_limits_can_be_raised_and_lowered():
    source = "param n = 4\nvars x[n] states 2\nroot btree(x)\n"
    assert "too many variables (20; the limit is 16)" in error_of(source, n=20, limits=Limits(variables=16))
    assert load_graph(source, n=20, limits=Limits(variables=20)).variables == 20
    assert "too many regions" in error_of(source, n=64, limits=Limits(regions=50))
    assert "the regions' scopes name too many variables" in error_of(
        "vars x[64] states 2\nfor i in 0..63 { x[i:64] = x[i] * x[i+1:64] }\nroot x[0:64]\n",
        limits=Limits(scope_entries=500))
    # repeating work that adds nothing new is still work
    assert "too many evaluation steps" in error_of(
        "vars x[100] states 2\nfor i in 0..10**6 { y = btree(x@(i)) }\nroot x\n", limits=Limits(steps=50_000))
    assert "the regions' scopes name too many variables in all" in error_of(
        "vars x[10000] states 2\nfor i in 0..100000 { y = x@a }\nroot x\n", limits=Limits(scope_entries=200_000))
    start = time.perf_counter()
    graph = load_graph("vars x[64] states 2\nfor i in 0..10**5 { y = btree(x) }\nroot btree(x)\n")
    assert len(graph.regions) == 127 and time.perf_counter() - start < 20  # one call, remembered
    assert "this structure has too many regions" in error_of(
        "vars x[1000] states 2\nroot random_tree(x, repetitions=100)\n", limits=Limits(regions=10_000))
    with pytest.raises(ValueError, match="Limits.steps must be a positive integer"):
        Limits(steps=0)
    with pytest.raises(TypeError, match="limits must be a circuitc.Limits"):
        load_graph(source, limits={"steps": 5})


def test_cli_limit_flags(capsys):
    status, _, err = cli(capsys, "check", EXAMPLES / "btree.pc", "--max-variables", "8")
    assert status == 2 and "too many variables (16; the limit is 8)" in err
    status, _, err = cli(capsys, "check", EXAMPLES / "btree.pc", "--max-steps", "0")
    assert status == 2 and "circuitc: error: argument --max-steps: expected a positive whole number" in err
    status, _, err = cli(capsys, "check", EXAMPLES / "btree.pc", "-D", "n=" + "9" * 5000)
    assert status == 2 and "has 5,000 digits; at most 100 are accepted" in err


@pytest.mark.parametrize("spec_change, fragment", [
    ({"variables": 1e18}, '"variables" must be a positive integer or a list of names, got 1e+18'),
    ({"variables": 10**18}, "too many variables (1,000,000,000,000,000,000"),
    ({"units": 10**100}, 'the default "units" is too large'),
    ({"states": 10**12}, "too many states"),
    ({"regions": {"r": {"scope": [0, 1], "units": 10**100}}}, 'region "r" has too many units'),
])
def test_bounded_graph_specs(spec_change, fragment):
    spec = {"format": "circuitc-graph/1", "variables": 2, "states": 2, "units": 1, "root": "r",
            "regions": {"r": {"scope": [0, 1]}, "a": {"scope": [0]}, "b": {"scope": [1]}},
            "partitions": [{"parent": "r", "children": ["a", "b"]}]}
    spec.update(spec_change)
    with pytest.raises(CircuitError) as info:
        load_graph(spec)
    assert fragment in str(info.value)
    with pytest.raises(CircuitError):  # the same through JSON text
        load_graph(json.dumps(spec))


def test_a_kronecker_of_three_large_regions_in_json_is_refused_before_compiling():
    regions = {"r": {"scope": [0, 1, 2], "units": 1}, **{f"x{i}": {"scope": [i]} for i in range(3)}}
    spec = {"format": "circuitc-graph/1", "variables": 3, "states": 2, "units": 10_000, "product": "kronecker",
            "root": "r", "regions": regions, "partitions": [{"parent": "r", "children": ["x0", "x1", "x2"]}]}
    start = time.perf_counter()
    with pytest.raises(CircuitError, match="--max-parameters"):
        circuitc.compile(spec)
    assert time.perf_counter() - start < 5


# ----------------------------------------------------------------------------- bounded output

def test_thousands_of_problems_on_one_line_print_a_short_report(capsys, tmp_path):
    n = 6000  # 3000 two-variable input regions, all on one 60 KB line
    line = f"vars x[{n}] states 2; root x[0:{n}] = " + " * ".join(f"x[{i}:{i + 2}]" for i in range(0, n, 2))
    path = write(tmp_path / "flood.pc", line + "\n")
    status, _, err = cli(capsys, "check", path)
    assert status == 2 and err.rstrip().endswith("... and 2,980 more errors")
    assert len(err) < 20 * 400
    assert all(len(row) < 250 for row in err.splitlines())  # source lines echoed as a window


def test_variable_lists_are_ranges(capsys):
    message = error_of("vars x[100000] states 2\nroot x[0]\n")
    assert "x1..x99999 are missing" in message and len(message) < 400


# ----------------------------------------------------------------------------- no internal errors

def test_deeply_nested_json_is_an_input_error(capsys, tmp_path):
    text = '{"format": "circuitc-graph/1", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(CircuitError, match="arrays or objects nest too deeply"):
        load_graph(text)
    path = write(tmp_path / "deep.json", text)
    status, _, err = cli(capsys, "check", path)
    assert status == 2 and "nest too deeply" in err


def test_duplicate_json_keys_are_an_error(capsys, tmp_path):
    text = ('{"format": "circuitc-graph/1", "variables": 1, "states": 2, "root": "a", "root": "b", '
            '"regions": {"a": {"scope": [0]}, "b": {"scope": [0]}}, "partitions": []}')
    with pytest.raises(CircuitError, match='the key "root" appears twice in one object'):
        load_graph(text)
    path = write(tmp_path / "dup.json", text)
    assert cli(capsys, "check", path)[0] == 2


def test_surrogate_and_non_string_region_ids(capsys, tmp_path):
    path = write(tmp_path / "s.json", '{"format": "circuitc-graph/1", "variables": 1, "states": 2, "root": "a", '
                                      '"regions": {"a": {"scope": [0]}, "\\ud800": {"scope": [0]}}, '
                                      '"partitions": []}')
    status, _, err = cli(capsys, "show", path)
    assert status == 2 and 'region ids must be non-empty strings of valid Unicode, got "\\ud800"' in err
    spec = {"format": "circuitc-graph/1", "variables": 1, "states": 2, "root": "a",
            "regions": {"a": {"scope": [0]}, 0: {"scope": [0]}}, "partitions": []}
    with pytest.raises(CircuitError, match="region ids must be non-empty strings of valid Unicode, got 0"):
        load_graph(spec)
    spec["regions"] = {"a": {"scope": [0]}}
    spec["partitions"] = [{"parent": 3, "children": ["a"]}]
    with pytest.raises(CircuitError, match='"parent" must be a region id'):
        load_graph(spec)


# ----------------------------------------------------------------------------- the command line

def test_version_and_defaults_in_help(capsys):
    assert main(["--version"]) == 0 and re.fullmatch(r"circuitc \S+\n", capsys.readouterr().out)
    assert main(["--help"]) == 0 and "--version" in capsys.readouterr().out
    for argv in (["check", "--help"], ["export", "--help"], ["show", "--help"], ["fmt", "--help"],
                 ["compile", "--help"]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "(default:" in out, argv
    assert main(["show", "--help"]) == 0
    out = capsys.readouterr().out
    assert "(default: text)" in out and "--max-steps N" in out and "(default: 1000000)" in out


@pytest.mark.parametrize("argv, status, fragment", [
    ([], 2, "circuitc: error: the following arguments are required: COMMAND"),
    (["frobnicate"], 2, "circuitc: error: argument COMMAND: invalid choice"),
    (["check"], 2, "circuitc: error: the following arguments are required: FILE"),
    (["check", "nope.pc"], 2, "circuitc: error: cannot read nope.pc: No such file"),
    (["check", str(EXAMPLES / "btree.pc"), "--bogus"], 2, "circuitc: error: unrecognized arguments: --bogus"),
    (["show", str(EXAMPLES / "btree.pc"), "--format", "gif"], 2, "invalid choice: 'gif'"),
    (["export", str(EXAMPLES / "btree.pc"), "-o", "/nonexistent/dir/x.json"], 1,
     "circuitc: error: cannot write /nonexistent/dir/x.json"),
])
def test_cli_mistakes_are_one_line(capsys, argv, status, fragment):
    got, _, err = cli(capsys, *argv)
    assert got == status and fragment in err, err


def test_the_installed_command_prints_no_traceback(tmp_path):
    """Through a real process: the exit status and stderr a shell sees."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    bad = write(tmp_path / "bad.pc", 'include "/etc/passwd"\n')
    result = subprocess.run([sys.executable, "-m", "circuitc.cli", "check", str(bad)], capture_output=True,
                            text=True, env=env, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "only .pc files can be included" in result.stderr and "root:" not in result.stderr


def test_a_closed_pipe_ends_the_command_quietly(capsys, monkeypatch):
    """`circuitc show big.pc | head -1`: the reader leaves, the command stops without a message."""
    class ClosedPipe(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["show", str(EXAMPLES / "btree.pc")]) == 1
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- fmt: JSON back to .pc

def _normalised(spec: dict, names: dict[str, str] | None = None) -> tuple:
    """A graph spec up to region renaming, region order and the order of different parents' partitions."""
    names = names or {}
    rename = lambda rid: names.get(rid, rid)  # noqa: E731
    regions = {rename(rid): (tuple(e["scope"]), e.get("units", 1 if rid == spec["root"] else spec["units"]))
               for rid, e in spec["regions"].items()}
    partitions: dict[str, list] = {}
    for p in spec["partitions"]:
        partitions.setdefault(rename(p["parent"]), []).append(
            (tuple(map(rename, p["children"])), p.get("product", spec["product"])))
    variables = spec["variables"] if isinstance(spec["variables"], int) else len(spec["variables"])
    return variables, spec["states"], rename(spec["root"]), regions, partitions


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.pc")))
def test_fmt_decompiles_every_example_back_to_the_same_graph(capsys, tmp_path, example):
    graph = load_graph(EXAMPLES / example)
    path = write(tmp_path / "g.json", json.dumps(graph.to_json()))
    status, out, _ = cli(capsys, "fmt", path)
    assert status == 0 and out == decompile(load_graph(path))
    back = load_graph(out)
    assert _normalised(back.to_json()) == _normalised(graph.to_json(), decompile_names(graph))
    if example in ("btree.pc", "hmm.pc", "kronecker.pc", "mixture.pc"):  # ids a .pc file writes: exact
        assert back.to_json() == graph.to_json()


def test_fmt_decompiles_json_ids_that_pc_cannot_write():
    spec = {"format": "circuitc-graph/1", "variables": ["a", "b", "c"], "states": 3, "units": 2,
            "product": "kronecker", "root": "r",
            "regions": {"r": {"scope": [0, 1, 2], "units": 1}, 'q"uote': {"scope": [0, 2]},
                        "x[0:3]": {"scope": [0, 2]}, "x0": {"scope": [0]}, "x1": {"scope": [1], "units": 3},
                        "x2": {"scope": [2]}},
            "partitions": [{"parent": "r", "children": ['q"uote', "x1"]},
                           {"parent": "r", "children": ["x[0:3]", "x1"]},
                           {"parent": 'q"uote', "children": ["x0", "x2"]},
                           {"parent": "x[0:3]", "children": ["x2", "x0"], "product": "hadamard"},
                           {"parent": "x[0:3]", "children": ["x0", "x2"]}]}
    graph = load_graph(spec, limits=Limits())
    text = decompile(graph)
    assert 'x[0:3]@"r" = x{0,2}@"r"' not in text and "vars x[3] states 3 units 2 product kronecker" in text
    names = decompile_names(graph)
    assert len(set(names.values())) == len(names)
    assert _normalised(load_graph(text).to_json()) == _normalised(graph.to_json(), names)


def test_fmt_in_place_refuses_json(capsys, tmp_path):
    path = write(tmp_path / "g.json", json.dumps(load_graph(EXAMPLES / "cp.pc").to_json()))
    status, _, err = cli(capsys, "fmt", path, "--in-place")
    assert status == 2 and "--in-place rewrites a .pc file" in err


# ----------------------------------------------------------------------------- the compiled circuit's API

@pytest.fixture(scope="module", params=["btree", "hmm"])
def circ(request):
    graph = {"btree": btree_graph, "hmm": hmm_graph}[request.param](4, 2, 3)
    return circuitc.compile(graph)


def test_empty_batches_give_empty_results(circ):
    theta = torch.randn(0, circ.num_params)
    x = torch.zeros(0, 4, dtype=torch.long)
    keep = torch.ones(4, dtype=torch.bool)
    assert circ.log_prob(x, theta).shape == (0,)
    assert circ.log_prob(x, torch.randn(circ.num_params)).shape == (0,)
    assert circ.log_marginal(x, keep, theta).shape == (0,)
    assert circ.prefix_log_marginals(x, theta).shape == (0, 4)
    assert circ.leaf_log_probs(x, theta).shape == (0, circ.num_leaves)
    assert circ.conditional_log_distribution(x, keep, theta, 1).shape == (0, 3)
    assert circ.log_prob_from_leaves(torch.zeros(0, circ.num_leaves), torch.zeros(circ.num_sum_params)).shape == (0,)
    assert circ.prefix_log_marginals_from_leaves(torch.zeros(0, circ.num_leaves),
                                                 torch.zeros(circ.num_sum_params)).shape == (0, 4)
    assert circ.sample(theta, 5).shape == (0, 5, 4) and circ.map(theta).shape == (0, 4)
    assert circ.sample(theta.new_zeros(circ.num_params), num_samples=0).shape == (1, 0, 4)
    assert circ.sample(torch.randn(2, circ.num_params), num_samples=0, evidence=torch.zeros(2, 4, dtype=torch.long),
                       keep=keep).shape == (2, 0, 4)


@pytest.mark.parametrize("call, error, fragment", [
    (lambda c, t, x: c.sample(t, num_samples=-1), ValueError, "num_samples must be at least 0, got -1"),
    (lambda c, t, x: c.sample(t, num_samples=2.0), TypeError, "num_samples must be an int"),
    (lambda c, t, x: c.log_prob(x + 3, t), ValueError, "x holds the state 5; the states of this circuit are 0 .. 2"),
    (lambda c, t, x: c.log_prob(x - 1, t), ValueError, "x holds the state -1"),
    (lambda c, t, x: c.log_prob(x.float(), t), TypeError, "x must hold integer states (torch.long), got torch.float32"),
    (lambda c, t, x: c.log_prob(x.tolist(), t), TypeError, "x must be a torch.Tensor of shape [B, 4] or [4], got list"),
    (lambda c, t, x: c.log_prob(x, t.tolist()), TypeError, "theta must be a torch.Tensor"),
    (lambda c, t, x: c.log_prob(x, t.long()), TypeError, "theta must hold floating-point logits"),
    (lambda c, t, x: c.log_prob(x[:, :3], t), ValueError, "x must be [B, 4] or [4], got [2, 3]"),
    (lambda c, t, x: c.log_prob(x, t[:, 1:]), ValueError, "theta must be [B, "),
    (lambda c, t, x: c.log_prob(x[:1].expand(3, -1), t), ValueError, "theta has batch 2 but x has batch 3"),
    (lambda c, t, x: c.log_marginal(x, torch.ones(3, dtype=torch.bool), t), ValueError,
     "keep must be [4] or [2, 4], got [3]"),
    (lambda c, t, x: c.log_marginal(x, torch.ones(5, 4, dtype=torch.bool), t), ValueError, "keep must be [4] or [2, 4]"),
    (lambda c, t, x: c.log_marginal(x, torch.ones(4), t), TypeError, "keep must be a bool tensor"),
    (lambda c, t, x: c.log_marginal(x, [True] * 4, t), TypeError, "keep must be a torch.Tensor"),
    (lambda c, t, x: c.conditional_log_distribution(x, torch.ones(4, dtype=torch.bool), t, 4), ValueError,
     "variable 4 is out of range"),
    (lambda c, t, x: c.conditional_log_distribution(x, torch.ones(4, dtype=torch.bool), t, 1.0), TypeError,
     "variable must be an int"),
    (lambda c, t, x: c.sample(t, evidence=x + 5), ValueError, "evidence holds the state 7"),
    (lambda c, t, x: c.sample(t, generator=3), TypeError, "generator must be a torch.Generator"),
    (lambda c, t, x: c.map(t, keep=torch.ones(4, dtype=torch.bool)), ValueError, "pass evidence too"),
    (lambda c, t, x: c.log_prob_from_leaves(torch.zeros(2, 1), t[:, c.num_input_params:]), ValueError,
     "leaf_log_probs must be [B, "),
])
def test_api_misuse_names_the_argument(circ, call, error, fragment):
    theta = torch.randn(2, circ.num_params)
    x = torch.tensor([[0, 1, 2, 1], [2, 2, 0, 0]])
    with pytest.raises(error) as info:
        call(circ, theta, x)
    assert fragment in str(info.value)


def test_unobserved_entries_may_hold_anything(circ):
    theta = torch.randn(2, circ.num_params, dtype=torch.float64)
    keep = torch.tensor([True, True, False, False])
    x = torch.tensor([[0, 1, 99, -5], [2, 2, 0, 0]])
    clean = x.masked_fill(~keep, 0)
    assert torch.equal(circ.log_marginal(x, keep, theta), circ.log_marginal(clean, keep, theta))


def test_a_state_every_unit_forbids_has_log_probability_minus_inf(circ):
    for theta in (torch.randn(circ.num_params, dtype=torch.float64), torch.randn(2, circ.num_params)):
        theta = theta.clone()
        leaves = theta[..., :circ.num_input_params].reshape(*theta.shape[:-1], circ.num_leaves, 3)
        leaves[..., 0] = float("-inf")  # state 0 impossible for every unit of every variable
        theta[..., :circ.num_input_params] = leaves.reshape(*theta.shape[:-1], -1)
        x = torch.tensor([[0, 1, 2, 1], [1, 1, 2, 2]])
        lp = circ.log_prob(x, theta)
        assert lp[0] == float("-inf") and torch.isfinite(lp[1])
        prefix = circ.prefix_log_marginals(x, theta)
        assert torch.isinf(prefix[0]).all() and torch.isfinite(prefix[1]).all()
        assert (circ.sample(theta, 50)[..., :] != 0).all()  # never drawn


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_sample_and_map_refuse_nan_and_inf_logits(circ, bad):
    theta = torch.randn(circ.num_params)
    theta[-1] = bad
    with pytest.raises(ValueError, match="sample: theta holds NaN or \\+inf logits"):
        circ.sample(theta, 4)
    with pytest.raises(ValueError, match="map: theta holds NaN or \\+inf logits"):
        circ.map(theta)
    theta[-1] = float("-inf")  # a probability of 0 is fine
    assert circ.sample(theta, 4).shape == (1, 4, 4)
