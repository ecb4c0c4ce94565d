"""A non-editable wheel carries every subpackage: built here, unpacked outside the repository, and
every stage imported from there (not from the source tree)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
STAGES = ["mtpc", "mtpc.errors", "mtpc.checks", "mtpc.lm.tokenizer", "mtpc.lm.loading", "mtpc.lm.backbone", "mtpc.heads",
          "mtpc.decoding", "mtpc.decoding.cycle.decoder", "mtpc.decoding.drafts.trees", "mtpc.decoding.choice.costs",
          "mtpc.training.trainer", "mtpc.training.tiny_lm", "mtpc.training.distill", "mtpc.bench", "mtpc.cli",
          "mtpc.cli.generate", "circuitc", "circuitc.elaborate.program", "circuitc.cli"]


def test_the_wheel_carries_every_stage(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("*.whl"))
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    packages = {p.parent.relative_to(site).as_posix() for p in site.rglob("__init__.py")}
    source = {p.parent.relative_to(ROOT).as_posix() for package in ("mtpc", "circuitc")
              for p in (ROOT / package).rglob("__init__.py")}
    assert source <= packages, f"missing from the wheel: {source - packages}"
    code = ("import importlib, sys\n"
            f"for name in {STAGES!r}:\n"
            "    module = importlib.import_module(name)\n"
            f"    assert module.__file__.startswith({str(site)!r}), (name, module.__file__)\n"
            "import mtpc; mtpc.SpeculativeDecoder; mtpc.MTPHead; mtpc.train; print('ok', mtpc.__version__)\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("ok")
