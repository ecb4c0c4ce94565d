"""Fuzzing the CLI with mutated example files: whatever the damage, `circuitc check` (and `fmt`)
never shows a traceback; invalid input exits 2 with a located `file:line:col: error:` message.

The subprocess fuzz (`_fuzz_worker.py`) adds hostile fragments (includes of system files, huge
numbers, unbounded loops, exponential recursion) and damaged graph-spec JSON, under a memory limit
(`resource.setrlimit`) and a CPU-time limit per run: zero tracebacks, internal errors or hangs."""

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from circuitc.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SOURCES = {p.name: p.read_text() for p in sorted(EXAMPLES.glob("*.pc"))}
# Fragments people (and typos) put in the wrong place.
FRAGMENTS = ["}", "{", "(", ")", "[", "]", "*", "**", "|", "@", "..", ":", ",", ";", "=", "-", "//", "0", "1",
             "99", "-1", "n", "x", "x[0]", "x[0:99]", "x[3:1]", "root x[0]", "def", "return", "if", "else", "for",
             "in", "units", ".units = 0", "param", "vars", 'include "examples/cp.pc"', '"', "#", "\n", " ",
             "true", "not", "prod(", "btree(x)", "f()", "1 // 0", "2 ** 99999"]
LOCATED = re.compile(r"^\S+:\d+:\d+: error: ", re.MULTILINE)


@st.composite
def mutated_sources(draw):
    name = draw(st.sampled_from(sorted(SOURCES)))
    text = SOURCES[name]
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["insert", "delete", "replace", "drop line", "repeat line"]))
        if kind == "insert":
            text = text[:at] + draw(st.sampled_from(FRAGMENTS)) + text[at:]
        elif kind == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 8)):]
        elif kind == "replace":
            text = text[:at] + draw(st.sampled_from(FRAGMENTS)) + text[at + draw(st.integers(1, 4)):]
        else:
            lines = text.splitlines(keepends=True)
            k = draw(st.integers(0, max(0, len(lines) - 1)))
            lines[k:k + 1] = [] if kind == "drop line" else lines[k:k + 1] * 2
            text = "".join(lines)
    return name, text


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A copy of the examples, so that mutated files find what they include."""
    root = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(EXAMPLES, root / "examples")
    return root / "examples"


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(a) for a in argv])
    return status, out.getvalue(), err.getvalue()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutated_sources())
def test_mutated_examples_never_crash_the_cli(workdir, mutated):
    name, text = mutated
    path = workdir / f"mutated-{name}"
    path.write_text(text)
    for command in (["check", path], ["fmt", path]):
        status, out, err = run(command)
        assert "Traceback" not in out + err
        assert status in (0, 2), err  # 1 would be an internal error
        if status == 2:
            first = err.splitlines()[0]
            assert LOCATED.match(first), err
            assert first.startswith(f"{path}:") or "examples" in first, err


def test_the_fuzzer_sees_invalid_input(workdir):
    path = workdir / "broken.pc"
    path.write_text(SOURCES["btree.pc"].replace("tree(mid, hi)", "tree(mid, hi + 1)"))
    status, _, err = run(["check", path])
    assert status == 2 and LOCATED.match(err)


WORKER = Path(__file__).resolve().parent / "_fuzz_worker.py"
MEMORY_LIMIT = 2 * 2**30  # bytes of address space for the worker
CPU_SECONDS = 15  # per command: the step bound makes the slowest program about a second of CPU


def fuzz_in_subprocess(tmp_path, count: int, seed: int) -> dict:
    workdir = tmp_path / "examples"
    shutil.copytree(EXAMPLES, workdir)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    result = subprocess.run([sys.executable, str(WORKER), str(workdir), str(count), str(seed), str(MEMORY_LIMIT),
                             str(CPU_SECONDS)], capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["mutants"] == count and report["runs"] == 2 * count
    return report


def test_hostile_mutants_under_memory_and_time_limits(tmp_path):
    """200 mutants (400 commands) by default; the slow variant below runs 1,000."""
    report = fuzz_in_subprocess(tmp_path, 200, seed=1)
    assert report["problems"] == [], json.dumps(report["problems"][:3], indent=1)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 3])
def test_many_hostile_mutants_under_memory_and_time_limits(tmp_path, seed):
    report = fuzz_in_subprocess(tmp_path, 500, seed=seed)
    assert report["problems"] == [], json.dumps(report["problems"][:3], indent=1)


def test_the_fuzz_worker_reports_crashes(tmp_path, monkeypatch):
    """A control: the worker's checks see an internal error when there is one (a broken loader)."""
    workdir = tmp_path / "examples"
    shutil.copytree(EXAMPLES, workdir)
    crash = tmp_path / "crash"
    crash.mkdir()
    (crash / "sitecustomize.py").write_text(
        "import circuitc.cli\n"
        "def boom(args, out, err):\n    raise RuntimeError('planted')\n"
        "circuitc.cli._fmt = boom\n")
    env = dict(os.environ, PYTHONPATH=f"{crash}{os.pathsep}{Path(__file__).resolve().parent.parent}")
    result = subprocess.run([sys.executable, str(WORKER), str(workdir), "3", "0", str(MEMORY_LIMIT),
                             str(CPU_SECONDS)], capture_output=True, text=True, env=env, timeout=300)
    problems = json.loads(result.stdout)["problems"]
    assert problems and all(p["status"] == 1 and "planted" in p["output"] for p in problems)
