"""The benchmark scripts the docs tell a user to run refuse a bad argument as `mtpc` does: one line
`<script>: error: ...` on stderr and a non-zero status, before any model loads: never a traceback, a NaN
record, an empty table with status 0, or minutes of work first.

Each script runs as `python benchmarks/<script> ...` would run it (its `__main__` block, its own argv), in this
process: the refusals come before any model loads, so a case costs milliseconds, not an interpreter and a torch
import each. The scripts that import no torch, and the shell scripts, also run as processes. (The parser and
argument types the scripts share: benchmarks/script_args.py.)"""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# what a collecting script writes: a refused run must leave it as it is
RECORDS = [BENCHMARKS / "results" / name for name in ("smollm2_heads.json", "own_head_smollm2.json", "rq2_smollm2.json")]


def documented_scripts() -> set[str]:
    """The scripts under benchmarks/ that the README and docs/*.md name, e.g. `benchmarks/depth_acceptance.py`."""
    found = set()
    for doc in DOCS:
        found |= set(re.findall(r"benchmarks/([a-z0-9_]+\.(?:py|sh))", doc.read_text()))
    return found


@pytest.fixture
def paths(tmp_path):
    """A folder, a file and a name that is neither."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.json").write_text("{}\n")
    return {"folder": str(tmp_path / "folder"), "file": str(tmp_path / "file.json"), "missing": str(tmp_path / "nope")}


MODEL = ["--model", "no-model-loads", "--head", "no-head-loads"]  # never read: each case is refused before
# script -> bad argument lists ({folder}, {file} and {missing} are filled from `paths`)
CASES = {
    "auto_choice.py": [["--model", "m", "--head", "{missing}", "--code", "{folder}"],
                       ["--model", "m", "--head", "{folder}", "--code", "{missing}"],
                       ["--model", "m", "--head", "{folder}", "--code", "{folder}", "--prompts", "0"],
                       ["--model", "m", "--head", "{folder}", "--code", "{folder}", "--threads", "0"],
                       ["--model", "m", "--head", "{folder}", "--code", "{folder}", "--out", "{folder}"],
                       ["--model", "m", "--head", "{folder}", "--code", "{folder}"]],  # no .py there: no prompts
    "pace_rules.py": [["--model", "m", "--head", "{missing}", "--code", "{folder}"],
                      ["--model", "m", "--head", "{folder}", "--code", "{folder}", "--prompts", "0"],
                      ["--model", "m", "--head", "{folder}", "--code", "{folder}", "--flags", "--no-pace"],
                      ["--model", "m", "--head", "{folder}", "--code", "{folder}", "--flags", "--window 'x"],
                      ["--model", "m", "--head", "{folder}", "--code", "{folder}", "--flags", "--window 1"],
                      ["--model", "m", "--head", "{folder}", "--code", "{folder}", "--flags", "--dtype fp8"],
                      ["--model", "m", "--head", "{folder}", "--code", "{folder}"]],  # no .py there: no prompts
    "vllm_speed.py": [["--model", "{missing}", "--head", "{folder}", "--code", "{folder}", "--out", "{file}"],
                      ["--model", "{folder}", "--head", "{folder}", "--code", "{folder}", "--out", "{folder}"],
                      ["--model", "{folder}", "--head", "{folder}", "--code", "{folder}", "--out", "{file}",
                       "--new-tokens", "0"],
                      ["--model", "{folder}", "--head", "{folder}", "--code", "{folder}", "--out", "{file}",
                       "--methods", "medusa"], ["report", "{missing}"], ["report", "{file}"]],
    "depth_acceptance.py": [
        [*MODEL, "--features", "{folder}", "--sequences", "0"], [*MODEL, "--features", "{folder}", "--threads", "-3"],
        [*MODEL, "--features", "{folder}", "--windows", "0"], [*MODEL, "--features", "{folder}", "--out", "{folder}"],
        [*MODEL, "--features", "{missing}"], [*MODEL, "--features", "{folder}", "--out", "{file}/record.json"]],
    "results_file.py": [["strip-paths", "{missing}"], ["strip-paths", "{folder}"], ["strip-paths"], ["strip", "{folder}"]],
    "smollm2_table.py": [["--readme", "../../.."], ["--reports", "{missing}"], ["--reports", "{file}"],
                         ["--runs", "no-such-run"], ["--reports", "{folder}"]],
    "bench_batch.py": [["--prompts", "{missing}"], ["--corpus", "{folder}", "--batch-sizes", "0"],
                       ["--corpus", "{folder}", "--num-prompts", "6", "--batch-sizes", "1", "4"],
                       ["--corpus", "{folder}", "--out", "{file}"], ["--corpus", "{folder}", "--window", "1"],
                       ["--corpus", "{folder}", "--window", "auto"]],
    "bench_cache.py": [["--mib", "-1"], ["--repeats", "0"], ["--out", "{folder}"]],
    "bench_circuit_targets.py": [["--rounds", "0"], ["--threads", "0"]],
    "bench_circuits.py": [["--threads", "1,x"], ["--threads", "0"], ["--structures", "Nope"]],
    "bench_compile_once.py": [[*MODEL, "--generations", "20"], [*MODEL, "--generations", "0:8"],
                              [*MODEL, "--dtype", "fp8"], [*MODEL, "--max-context", "0"]],
    "bench_cycle.py": [["--repeats", "0"], ["--evict-mib", "-1"], ["--threads", "1e9"]],
    "bench_features.py": [["--model", "m", "--features", "{missing}"], ["--model", "m", "--features", "{folder}", "--steps", "0"],
                          ["--model", "m", "--features", "{folder}", "--dtype", "fp8"]],
    "bench_guards.py": [["--rounds", "0"], ["--calls", "-1"], ["--out", "{folder}"]],
    "bench_loss_memory.py": [["--tokens", "0"], ["--n", "-4"], ["--json", "{folder}"]],
    "bench_startup.py": [["--repeats", "0"], ["--max-new-tokens", "0"], ["--threads", "99999"]],
    "bench_train_step.py": [["--steps", "0"], ["--seq-len", "-1"], ["--out", "{folder}"]],
    "first_token_gap.py": [[*MODEL, "--bench", "{missing}"], [*MODEL, "--features", "{file}"],
                           [*MODEL, "--features", "{folder}", "--sequences", "0"]],
    "gpu.py": [["--budget-s", "nan"], ["--budget-s", "-1"], ["--out", "{file}"]],
    "heldout_bpb.py": [["--fraction", "1.5"], ["--fraction", "nan"], ["--corpus", "{missing}"], ["--context", "0"]],
    "heldout_kl.py": [["--model", "m", "--heads", "h", "--sequences", "0"], ["--model", "m", "--heads", "h", "--val-fraction", "0"],
                      ["--model", "m", "--heads", "h", "--data", "{missing}"]],
    "profile_generate.py": [["--prompt-file", "{missing}"], ["--offset", "-1"], ["--top", "0"]],
    "smollm2_heads.py": [["collect", "--runs", "{missing}"], ["collect", "--runs", "{folder}"]],
    "smollm2_own_head.py": [["collect", "--runs", "{missing}"], ["collect", "--runs", "{folder}"]],
    "smollm2_rq2.py": [["collect", "--runs", "{missing}"], ["collect", "--runs", "{folder}"]],
    "study_figure.py": [["{missing}", "--out", "{folder}/f.png"], ["{file}", "--out", "{folder}"]],
    "study_tables.py": [["{missing}"], ["--lm", "{missing}"], ["--lm", "{folder}"], ["{file}", "--until", "0"]],
}
SHELL_CASES = {  # the shell scripts: a wrong run name is refused before the first (minutes-long) run starts
    "smollm2.sh": [["greedy-bf16", "no-such-run"]],
    "smollm2_trees.sh": [["--dry-run", "greedy", "no-such-run"], ["greedy", "--dry-run"]],
}
ELSEWHERE = {  # the shell scripts whose refusals other tests check, and why
    "gpu.sh": "it hands its arguments to gpu.py (tests/test_first_hour.py), whose cases are above",
    "gpu_wheels.sh": "it takes no arguments; it downloads wheels (bash -n checks it)",
    **{name: "a wrong argument or stage: tests/test_benchmarks.py" for name in (
        "study.sh", "subword.sh", "smollm2_heads.sh", "smollm2_own_text.sh", "smollm2_rq2.sh", "smollm2_own_head.sh",
        "smollm2_hour.sh", "smollm2_chat_adds.sh")},
}
NO_TORCH = ("results_file.py", "smollm2_table.py", "smollm2_heads.py", "smollm2_own_head.py", "smollm2_rq2.py")


def filled(argv: list[str], paths: dict) -> list[str]:
    return [a.format(**paths) for a in argv]


def assert_one_line_refusal(script: str, status, err: str, out: str = "") -> None:
    assert status not in (0, None), f"{script}: status {status}; stderr: {err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: "), err
    assert "Traceback" not in err and "nan" not in out.lower()


def test_every_script_the_docs_name_has_cases():
    """Each `benchmarks/...` script the README or docs/*.md names is tried here or, as said, elsewhere."""
    named = documented_scripts()
    assert {"depth_acceptance.py", "smollm2_table.py", "smollm2.sh"} <= named
    assert named <= set(CASES) | set(SHELL_CASES) | set(ELSEWHERE), sorted(named - set(CASES) - set(SHELL_CASES))


@pytest.mark.parametrize("script, argv", [(s, a) for s, cases in CASES.items() for a in cases],
                         ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_a_bad_argument_is_one_line_and_a_non_zero_status(script, argv, paths, capsys, monkeypatch):
    records = {path: path.read_bytes() for path in RECORDS}
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / script), *filled(argv, paths)])
    monkeypatch.setattr(sys, "path", list(sys.path))  # the scripts put their folders first
    try:
        with pytest.raises(SystemExit) as exit_:
            runpy.run_path(str(BENCHMARKS / script), run_name="__main__")
    finally:
        changed = [path for path, data in records.items() if path.read_bytes() != data]
        for path in changed:
            path.write_bytes(records[path])
    out, err = capsys.readouterr()
    assert_one_line_refusal(script, exit_.value.code, err, out)
    assert not changed, changed  # an empty collection never replaces the recorded run
    assert not os.listdir(paths["folder"])  # nothing written


@pytest.mark.parametrize("script", NO_TORCH)
def test_the_scripts_without_torch_refuse_as_processes(script, paths):
    run = subprocess.run([sys.executable, str(BENCHMARKS / script), *filled(CASES[script][0], paths)],
                         capture_output=True, text=True, timeout=120, cwd=paths["folder"])
    assert_one_line_refusal(script, run.returncode, run.stderr, run.stdout)


@pytest.mark.parametrize("script, argv", [(s, a) for s, cases in SHELL_CASES.items() for a in cases],
                         ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_a_shell_script_refuses_a_wrong_run_before_running_any(script, argv):
    env = {**os.environ, "HEAD": "/nonexistent-head", "OUT": "/nonexistent-out"}  # a run started fails fast
    run = subprocess.run(["bash", str(BENCHMARKS / script), *argv], capture_output=True, text=True, timeout=300,
                         env=env)
    assert_one_line_refusal(script, run.returncode, run.stderr)
    assert "no-such-run" in run.stderr or "--dry-run" in run.stderr
    assert not run.stdout  # no run (nor, with --dry-run, its printed command) came first
