"""benchmarks/bench_circuits.py end to end on the smallest structure: the table has a row per
program, batch and thread setting, and the JSON holds what the table shows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_circuits.py"


@pytest.mark.slow
def test_bench_circuits_runs_and_writes_its_table(tmp_path):
    out = tmp_path / "circuits.json"
    done = subprocess.run([sys.executable, str(BENCH), "--structures", "FF", "--threads", "1,2",
                           "--fuse-structures", "none", "--no-cirkit", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    rows = [line.split() for line in report["table"].splitlines() if line.startswith("FF ")]
    timed = [r for r in rows if r[1] in ("log_prob", "prefix", "sample", "map")]
    assert {(r[1], r[2], r[3]) for r in timed} == {(p, b, t) for p in ("log_prob", "prefix", "sample", "map")
                                                  for b in ("1", "1024") for t in ("1", "2")}
    run = report["structures"]["FF"]["threads"]["2"]["circuitc"]
    assert all(run["1024"][p] > 0 for p in ("log_prob", "prefix", "sample", "map"))
    assert report["threads"] == [1, 2]


def test_bench_circuits_rejects_unknown_structures():
    done = subprocess.run([sys.executable, str(BENCH), "--structures", "Nope", "--no-cirkit"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "unknown structure(s) Nope" in done.stderr
