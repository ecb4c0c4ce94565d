"""Hostile inputs to circuitc, part 2 (issue 22): data loss (fmt --in-place on a full disk or a
symlink, an output that is the input), a hung `dot`, a full standard output, `-D` given twice, and a
generator on another device. Each case asserts the exact error class (or exit status) and a fragment
of the message, and that the source survives intact."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import circuitc
from circuitc import CircuitError
from circuitc.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
UGLY = "vars   x[4]   states 2\nx[0:4]   =  x[0:2]*x[2:4]\nroot   x[0:4]\n"  # fmt rewrites it


def cli(capsys, *argv) -> tuple[int, str, str]:
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return status, out, err


def run_cli(*argv, limit_bytes: int | None = None, stdout=subprocess.PIPE, env=None) -> subprocess.CompletedProcess:
    """`python -m circuitc.cli argv` in a child; `limit_bytes`: RLIMIT_FSIZE (a full disk in miniature,
    SIGXFSZ ignored so that writes fail with EFBIG instead of killing the process)."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run([sys.executable, "-m", "circuitc.cli", *map(str, argv)], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=60, cwd=ROOT,
                          preexec_fn=limit if limit_bytes is not None else None,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", **(env or {})})


# ----------------------------------------------------------------------------- data loss and leaks

def test_fmt_in_place_on_a_symlink_never_prints_or_replaces_the_target(capsys, tmp_path):
    secret = tmp_path / "credentials.json"
    secret.write_text('{"token": "SECRET-TOKEN-4711"}\n')
    link = tmp_path / "b.pc"
    link.symlink_to(secret)
    status, out, err = cli(capsys, "fmt", "--in-place", link)
    assert status == 2 and "--in-place does not rewrite through a symlink" in err
    assert "SECRET-TOKEN-4711" not in out + err
    assert link.is_symlink() and secret.read_text() == '{"token": "SECRET-TOKEN-4711"}\n'


def test_fmt_in_place_on_a_full_disk_keeps_the_source_and_leaves_no_temp_file(tmp_path):
    source = tmp_path / "b.pc"
    text = UGLY + "".join(f"# comment {i:04d} to make the formatted text longer than the limit\n" for i in range(40))
    source.write_text(text)
    run = run_cli("fmt", "--in-place", source, limit_bytes=512)
    assert run.returncode == 1, run.stderr
    assert "circuitc: error: cannot rewrite" in run.stderr and "File too large" in run.stderr
    assert "Traceback" not in run.stderr
    assert source.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.pc"]


def test_fmt_in_place_still_rewrites_and_keeps_the_file_mode(capsys, tmp_path):
    source = tmp_path / "b.pc"
    source.write_text(UGLY)
    source.chmod(0o640)
    status, _, _ = cli(capsys, "fmt", "--in-place", source)
    assert status == 0 and source.read_text() != UGLY
    assert source.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.pc"]


@pytest.mark.parametrize("command", ["compile", "export", "show"])
def test_an_output_that_is_the_input_is_refused(capsys, tmp_path, command):
    source = tmp_path / "b.pc"
    source.write_text(UGLY)
    (tmp_path / "alias.pc").symlink_to(source)
    for output in (source, tmp_path / "alias.pc", tmp_path / "." / "b.pc"):
        status, _, err = cli(capsys, command, source, "-o", output)
        assert status == 2 and "is the input file" in err, err
    assert source.read_text() == UGLY


def test_show_png_with_a_hung_dot_stops_at_the_timeout(tmp_path):
    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(0o755)
    start = time.monotonic()
    run = run_cli("show", EXAMPLES / "ff.pc", "--format", "png", "-o", tmp_path / "x.png", "--dot-timeout", "1",
                  env={"PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"})
    assert time.monotonic() - start < 20
    assert run.returncode == 1 and "graphviz `dot` did not finish within 1 s" in run.stderr, run.stderr


def test_a_full_standard_output_is_one_clean_line():
    with open("/dev/full", "w") as full:
        run = run_cli("show", EXAMPLES / "btree.pc", "-D", "n=8", "-D", "r=2", stdout=full)
    assert run.returncode == 1
    assert run.stderr.strip() == "circuitc: error: cannot write the output: No space left on device", run.stderr


def test_a_binding_given_twice_is_refused(capsys):
    status, _, err = cli(capsys, "check", EXAMPLES / "btree.pc", "-D", "n=4", "-D", "n=8")
    assert status == 2 and "-D n is given twice (4 and 8)" in err


# ----------------------------------------------------------------------------- the Python API

def test_sample_refuses_a_generator_on_another_device():
    circ = circuitc.compile(EXAMPLES / "btree.pc", n=2, r=2, v=3)
    theta = torch.zeros(circ.num_params, device="meta")
    with pytest.raises(ValueError, match="generator is on device cpu, theta on meta"):
        circ.sample(theta, generator=torch.Generator())
    assert isinstance(CircuitError("x"), ValueError)  # the CLI's error class stays a ValueError
