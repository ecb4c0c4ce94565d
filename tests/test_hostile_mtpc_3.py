"""Hostile inputs for `mtpc`, part 3 (issue 33).

A garbage `tokenizer.json` beside a byte tokenizer is said to be ignored; the chat-template sandbox
stops far below 2 GiB; Ctrl-C exits 130 with one line; a tiny-lm checkpoint holding a bare tensor, a
huge `--batch-size`, a 1e9-parameter circuit and a `--prompts` line nested 100,000 deep are one clean
error before any slow work; an unreadable sub-folder of `--data` is warned about. (`circuitc show`
under a hung `dot` is tests/test_hostile_circuitc_2.py's.)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mtpc.lm.chat import render
from mtpc.cli.commands import describe_error, main
from mtpc.errors import InputError
from test_hostile_mtpc import fails, train_args
from test_hostile_mtpc_2 import corpus, lm  # noqa: F401  the same module-scoped LM and corpus fixtures

ROOT = Path(__file__).resolve().parent.parent
CP = str(ROOT / "examples" / "cp.pc")
pytestmark = pytest.mark.usefixtures("one_thread")




# ------------------------------------------------------------------ model folders

def test_a_garbage_tokenizer_json_beside_a_byte_tokenizer_is_said_to_be_ignored(capsys, caplog, lm, tmp_path):
    model = Path(shutil.copytree(lm, tmp_path / "m"))
    (model / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "Garbage"}}))
    with caplog.at_level(logging.WARNING, logger="mtpc.lm.loading"):
        assert main(["generate", "--model", str(model), "hi", "--max-new-tokens", "2", "--no-stream"]) == 0
    warnings = [r.getMessage() for r in caplog.records if "tokenizer.json" in r.getMessage()]
    assert len(warnings) == 1 and "model type 'Garbage' is not a tokenizer" in warnings[0], warnings
    assert "ignored (mtpc reads mtpc_tokenizer.json)" in warnings[0]


def test_the_chat_template_sandbox_stops_far_below_2_gib():
    # a 400 MB string with a one-character output: only the memory cap can stop it
    with pytest.raises(InputError, match=r"T failed: it ran out of memory \(more than 256 MiB\)"):
        render("{% set s = 'a' * 400000000 %}{{ s[:1] }}", {}, "T")
    assert render("{% set s = 'a' * 1000000 %}{{ s[:3] }}", {}, "T") == "aaa"  # room for ordinary work


# ------------------------------------------------------------------ Ctrl-C

def blocked_reading_stdin(pid: int, seconds: float = 60) -> bool:
    """Whether process `pid` sits in read(0, ...) (x86-64 syscall 0 on fd 0) within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            fields = Path(f"/proc/{pid}/syscall").read_text().split()
        except OSError:
            return False
        if fields[:2] == ["0", "0x0"]:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not Path("/proc/self/syscall").exists() or os.uname().machine != "x86_64",
                    reason="reads the blocking system call from /proc (Linux x86-64)")
def test_ctrl_c_exits_130_with_one_line(lm):
    # the prompt comes from a pipe that never ends: the run waits in read() until Ctrl-C
    child = subprocess.Popen([sys.executable, "-m", "mtpc.cli", "generate", "--model", lm], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert blocked_reading_stdin(child.pid)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 130 and err.strip().splitlines() == ["mtpc: interrupted"] and not out


# ------------------------------------------------------------------ training inputs

def test_a_tiny_lm_checkpoint_holding_a_bare_tensor_is_a_clean_error(capsys, corpus, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    torch.save(torch.zeros(3), out / "checkpoint.pt")
    fails(capsys, ["tiny-lm", "--out", str(out), "--data", corpus, "--steps", "1", "--d-model", "16", "--layers", "1",
                   "--heads", "2", "--ffn", "32", "--context", "32", "--no-progress"],
          2, "checkpoint.pt is not a tiny-lm checkpoint (it holds a Tensor); remove it or pass --no-resume")


def test_a_huge_batch_size_is_refused_before_any_work(capsys, lm, corpus, tmp_path):
    err = fails(capsys, train_args(lm, corpus, tmp_path / "o", "--batch-size", str(10**12)), 2,
                "a training step needs at least", "batch ", "lower --batch-size or --seq-len")
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


def test_a_billion_parameter_circuit_is_refused_before_allocating(capsys, lm, corpus, tmp_path):
    start = time.perf_counter()
    argv = train_args(lm, corpus, tmp_path / "o", circuit=None) + ["--circuit", CP, "-D", "n=56", "-D", "r=65536"]
    fails(capsys, argv, 2, "a training step needs at least", "head weights", "use a smaller --circuit")
    assert time.perf_counter() - start < 20 and not (tmp_path / "o").exists()


def test_the_memory_bound_lets_the_ordinary_heads_train(lm, corpus, tmp_path):
    # the control: the same check with the suite's own small settings passes and the run trains
    assert main(train_args(lm, corpus, tmp_path / "o")) == 0


# ------------------------------------------------------------------ files

def test_a_prompts_line_nested_100000_deep_is_one_clean_error(tmp_path):
    from mtpc.bench.prompts import prompts_from_file
    from mtpc.lm.tokenizer import ByteTokenizer

    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps("fine") + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(InputError) as caught:
        prompts_from_file(path, ByteTokenizer())
    assert describe_error(caught.value) == (2, f"{path}:2: JSON nested too deeply")


def walk_warnings(folder: Path) -> str:
    """The warnings `find_files(folder)` logs, run where the folder's permissions hold: as root, a child
    without the capabilities that bypass them (setpriv)."""
    code = ("import logging, sys; logging.basicConfig(format='%(message)s'); "
            "from mtpc.training.data import find_files; print([p.name for p in find_files(sys.argv[1])])")
    command = [sys.executable, "-c", code, str(folder)]
    if os.geteuid() == 0:
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout + run.stderr


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root without setpriv")
def test_an_unreadable_sub_folder_of_data_is_warned_about(tmp_path):
    (tmp_path / "ok.py").write_text("x = 1\n")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "hidden.py").write_text("y = 2\n")
    locked.chmod(0)
    try:
        text = walk_warnings(tmp_path)
    finally:
        locked.chmod(0o755)
    assert "['ok.py']" in text and f"skipping unreadable folder {locked}: Permission denied" in text, text


def test_ctrl_c_while_decoding_exits_130_with_one_line():
    """Ctrl-C in the middle of a speculative generation (text already streamed): status 130, one line."""
    root = Path(__file__).resolve().parent.parent
    child = subprocess.Popen([sys.executable, "-m", "mtpc.cli", "generate", "--model", str(root / "models/byte-lm"),
                              "--head", str(root / "models/heads/ff8"), "--max-new-tokens", "1000", "--threads", "1",
                              "def f(x):"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert child.stdout.read(1)  # decoding has started: its first text is out
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 130 and err.decode().strip().splitlines() == ["mtpc: interrupted"]
