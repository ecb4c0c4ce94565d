"""`mtpc serve`'s checks, each one line before any server or engine starts (no vLLM needed: the
server itself is tested in tests/test_vllm_serving.py)."""

from __future__ import annotations

import importlib.util
import shutil
import socket
from pathlib import Path

import pytest

from mtpc.cli import main

ROOT = Path(__file__).resolve().parent.parent
BYTE_LM = ROOT / "models" / "byte-lm"
HEAD = ROOT / "models" / "heads" / "ff8"


def refused(capsys, *argv: str) -> str:
    assert main(["serve", *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtpc: error: "), captured.err
    assert "mtpc: running" not in captured.out  # nothing was started
    return lines[0]


def test_mistakes_are_one_line_before_anything_starts(tmp_path, capsys):
    assert "give --head too" in refused(capsys, "--model", str(BYTE_LM), "--lookup", "4")
    assert "--num-speculative-tokens sets" in refused(capsys, "--model", str(BYTE_LM), "--num-speculative-tokens", "3")
    assert "no such model folder" in refused(capsys, "--model", str(tmp_path / "nothing"))
    assert "no such head folder" in refused(capsys, "--model", str(BYTE_LM), "--head", str(tmp_path / "nohead"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    assert "mtpc export-hf --model" in refused(capsys, "--model", str(gguf))
    assert "in 1..65,535" in refused(capsys, "--model", str(BYTE_LM), "--port", "70000")
    assert "use mtpc serve's --port" in refused(capsys, "--model", str(BYTE_LM), "--", "--port=9000")
    assert "use mtpc serve's --host" in refused(capsys, "--model", str(BYTE_LM), "--", "--host", "0.0.0.0")


def test_a_model_without_tokenizer_files_is_refused(tmp_path, capsys):
    folder = tmp_path / "lm"
    shutil.copytree(BYTE_LM, folder, ignore=shutil.ignore_patterns("tokenizer*", "train_log.jsonl"))
    assert "holds no tokenizer files" in refused(capsys, "--model", str(folder))


def test_a_port_in_use_is_refused(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert "cannot listen on 127.0.0.1 port" in refused(capsys, "--model", str(BYTE_LM), "--port", str(port))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this Python")
def test_without_vllm_serve_says_how_to_install_it(capsys):
    message = refused(capsys, "--model", str(BYTE_LM), "--head", str(HEAD))
    assert "cannot import" in message and "docs/guide-serving.md" in message
