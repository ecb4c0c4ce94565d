"""The examples of the README and its guides (docs/guide-*.md, docs/reproduce.md) run as written and
print what the docs show.

Fenced blocks are read from those files (`_readme.DOCS`). A block is left out only when the line right above its fence
is `<!-- readme-test: skip (reason) -->` (e.g. blocks that need a trained LM, run elsewhere). Checked:

- every `$ circuitc ...` transcript: run, its output equal to the lines the README shows below it;
- every `circuitc ...` line of a bash block: runs and exits 0;
- every Python block: executed, its output equal to the text block right after it, if any.

The `mtpc` and other commands are run by tests/test_readme_commands.py (each one or its reason to skip).

Everything runs in a copy of `examples/`, so outputs written beside a source stay out of the tree."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch

from circuitc.cli import main as circuitc

import _readme
from _readme import ROOT



def blocks() -> list[tuple[str, str, str]]:
    """(language, text, file:line) of every fenced block of the docs not marked to skip."""
    return [(b.language, b.text, b.where) for b in _readme.blocks()]


def transcripts() -> list[tuple[str, str, str]]:
    """(command, expected output, file:line) of every `$ circuitc ...` in the docs' example blocks."""
    out = []
    for language, text, line in blocks():
        if language not in ("", "text"):
            continue
        parts = re.split(r"^\$ ", text, flags=re.M)
        for part in parts[1:]:
            command, _, shown = part.partition("\n")
            if command.startswith("circuitc "):
                out.append((command, shown, line))
    return out


@pytest.fixture
def examples_copy(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copytree(ROOT / "models", tmp_path / "models")  # the shipped LM and heads the Python blocks load
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_circuitc(command: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = circuitc(shlex.split(command)[1:])
    return status, out.getvalue()


def test_the_readme_has_circuitc_transcripts_and_python_blocks():
    assert len(transcripts()) >= 3
    assert any(language == "python" for language, _, _ in blocks())


@pytest.mark.parametrize("command, shown, line", transcripts(), ids=[t[0] for t in transcripts()])
def test_circuitc_transcripts_print_what_the_readme_shows(command, shown, line, examples_copy):
    _, printed = run_circuitc(command)
    assert printed.rstrip("\n") == shown.rstrip("\n"), f"{line}: {command}"


def bash_circuitc_lines() -> list[str]:
    return [re.sub(r"\s+#.*$", "", line).strip() for language, text, _ in blocks() if language == "bash"
            for line in text.splitlines() if line.startswith("circuitc ")]


@pytest.mark.parametrize("command", bash_circuitc_lines())
def test_circuitc_commands_of_bash_blocks_run(command, examples_copy):
    status, printed = run_circuitc(command)
    assert status == 0, printed
    if command.startswith("circuitc compile examples/"):
        stem = Path(shlex.split(command)[2]).stem
        assert (examples_copy / "examples" / f"{stem}.plan.json").is_file()  # beside the source, as the README says


def python_blocks() -> list[_readme.Block]:
    return [b for b in _readme.blocks() if b.language == "python"]


@pytest.mark.parametrize("block", python_blocks(), ids=lambda b: b.where)
def test_python_blocks_run(block, examples_copy):
    """Each block runs; where the docs show its output (the text block right after it), it prints that."""
    threads = torch.get_num_threads()
    try:
        printed = _readme.printed_by(block)
    finally:
        torch.set_num_threads(threads)  # a block may pin one thread for reproducible sampling
    shown = _readme.output_after(block)
    if shown is not None:
        assert printed.rstrip("\n") == shown.rstrip("\n"), block.where
