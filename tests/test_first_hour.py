"""What a new user meets in the first hour (issue 21), kept true: the docs cite no machine's paths,
docs/results.md says up front what a new user's own run shows, and every benchmark script has a
smoke test. (The README's commands and blocks: tests/test_readme.py and test_readme_commands.py;
missing folders: test_missing_folders.py; --help and --version: test_help.py.)"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "models" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MACHINE_PATH = re.compile(r"(?<![\w.~])/(work|home|root|Users|mnt|srv|opt|scratch)/\S*")  # /tmp/x in an example is fine


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_cite_no_machine_paths(doc):
    text = doc.read_text()
    assert not MACHINE_PATH.search(text), MACHINE_PATH.search(text).group(0)
    assert not re.search(r"runs/\S*README\.txt", text)  # runs/ is ignored by git: nothing there ships


def test_docs_bench_reports_cite_no_machine_paths():
    for report in (ROOT / "docs" / "bench").rglob("*"):
        if report.is_file() and report.suffix in (".json", ".md", ".txt"):
            found = MACHINE_PATH.search(report.read_text(errors="replace"))
            assert not found, (report, found.group(0))


def test_results_say_first_what_a_new_users_run_shows():
    head = "\n".join((ROOT / "docs" / "results.md").read_text().splitlines()[:12])
    assert "What your own run will show" in head and "models/" in head


SCRIPTS = sorted(p for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh"))
NOT_RUN = {"gpu_wheels.sh": "it downloads wheels from PyPI (tests have no network); bash -n checks it"}


def test_every_benchmark_script_has_a_smoke_test():
    """Each script is named by a test that runs it (`"stem"` for a Python script loaded by name, or
    its file name), unless NOT_RUN says why not."""
    tests = {p.name: p.read_text() for p in (ROOT / "tests").glob("test_*.py") if p.name != Path(__file__).name}
    for script in SCRIPTS:
        if script.name in NOT_RUN:
            continue
        named = (f'"{script.stem}"', script.name) if script.suffix == ".py" else (script.name,)
        users = [name for name, text in tests.items() if any(n in text for n in named)]
        assert users, f"benchmarks/{script.name} is run by no test (add a smoke test at tiny sizes)"


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s.suffix == ".sh"], ids=lambda p: p.name)
def test_shell_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_gpu_sh_runs_gpu_py():
    """benchmarks/gpu.sh (the GPU machine's one command) reaches gpu.py with its arguments."""
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--help"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "WHEELS": "/nonexistent"})
    assert run.returncode == 0, run.stderr
    assert "--dry-run" in run.stdout
