"""docs/language.md's transcripts are what `circuitc` prints.

Each `$ ...` of the doc's text blocks runs in order, in a folder holding a copy of examples/: `$ cat FILE`
shows a file, which must equal the shipped one when FILE is under examples/ and is otherwise written
with the lines shown (a file the doc shows in full, such as a deliberately broken one); `$ circuitc ...`
runs with its output compared to the lines below it (`> FILE` sends it to FILE instead). Each Python
block runs there too, its output compared to the text block that follows it."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
from pathlib import Path

import pytest

from circuitc.cli import main as circuitc

import _readme
from _readme import ROOT

LANGUAGE = ROOT / "docs" / "language.md"


def transcript_blocks() -> list[_readme.Block]:
    return [b for b in _readme.file_blocks(LANGUAGE, include_skipped=True)
            if b.language in ("", "text") and b.text.startswith("$ ")]


def steps(block: _readme.Block) -> list[tuple[str, str]]:
    """(command, the lines shown below it) of a transcript block."""
    return [(command.strip(), shown) for command, _, shown in
            (part.partition("\n") for part in re.split(r"^\$ ", block.text, flags=re.M)[1:])]


def run_circuitc(command: str) -> str:
    words = shlex.split(command)
    target = words[words.index(">") + 1] if ">" in words else None
    args = words[1:words.index(">")] if target else words[1:]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        circuitc(args)
    if target is None:
        return out.getvalue()
    Path(target).write_text(out.getvalue())
    return ""


@pytest.fixture
def examples_copy(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_doc_has_transcripts():
    assert sum(len(steps(b)) for b in transcript_blocks()) >= 10


@pytest.mark.parametrize("block", transcript_blocks(), ids=lambda b: b.where)
def test_transcripts_print_what_the_doc_shows(block, examples_copy):
    for command, shown in steps(block):
        if command.startswith("cat "):
            path = Path(command.split()[1])
            if path.parts[0] == "examples":
                assert path.read_text().rstrip("\n") == shown.rstrip("\n"), f"{block.where}: {command}"
            else:
                path.write_text(shown.rstrip("\n") + "\n")
            continue
        assert command.startswith("circuitc "), f"{block.where}: a transcript runs cat or circuitc: {command}"
        printed = run_circuitc(command)
        assert printed.rstrip("\n") == shown.rstrip("\n"), f"{block.where}: {command}"


def python_blocks() -> list[_readme.Block]:
    return [b for b in _readme.file_blocks(LANGUAGE, include_skipped=True) if b.language == "python"]


@pytest.mark.parametrize("block", python_blocks(), ids=lambda b: b.where)
def test_python_blocks_run_and_print_what_the_doc_shows(block, examples_copy):
    """Run from a folder holding examples/, as the doc says; the text block after it is its output."""
    assert _readme.printed_by(block).rstrip("\n") == _readme.following_text(block).rstrip("\n"), block.where
