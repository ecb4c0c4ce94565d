"""Reading the fenced blocks of README.md and the guides it links (docs/guide-*.md, docs/reproduce.md),
and the commands in them, for the tests that run them.

A block is marked to leave out of the generic runs by `<!-- readme-test: skip (reason) -->` on the
line right above its fence; `blocks(include_skipped=True)` still returns it (with the reason), so a
dedicated test can run it."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# the user docs whose commands and transcripts are run: the README, then its task guides
DOCS = (README, *sorted((ROOT / "docs").glob("guide-*.md")), *sorted((ROOT / "docs").glob("reproduce.md")))
SKIP = re.compile(r"<!-- readme-test: skip\b\s*(.*?)\s*-->")
ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")
NUMBER = re.compile(r"\d[\d,]*(\.\d+)?(e[-+]?\d+)?")


@dataclass(frozen=True)
class Block:
    language: str
    text: str
    line: int  # line of the opening fence in its file
    skip: str | None  # the reason of a skip marker, or None
    path: Path = README  # the file holding it

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def all_text() -> str:
    """All the user docs' text, for checks that a sentence is somewhere in them."""
    return "\n".join(path.read_text() for path in DOCS)


def blocks(include_skipped: bool = False) -> list[Block]:
    """Every fenced block of the user docs, file by file in DOCS order (the skip-marked ones only when
    asked)."""
    return [block for path in DOCS for block in file_blocks(path, include_skipped)]


def file_blocks(path: Path, include_skipped: bool) -> list[Block]:
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = re.match(r"\s*```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        start, indent = i, len(lines[i]) - len(lines[i].lstrip())
        i += 1
        while not lines[i].strip().startswith("```"):
            i += 1
        marker = SKIP.search(lines[start - 1]) if start > 0 else None
        if include_skipped or not marker:
            text = "\n".join(line[indent:] for line in lines[start + 1:i])
            found.append(Block(fence.group(1), text, start + 1, marker.group(1) if marker else None, path))
        i += 1
    return found


def bash_lines(block: Block) -> list[str]:
    """A bash block's lines, continuations (`\\` at the end) joined and `  # comments` dropped."""
    joined, pending = [], ""
    for raw in block.text.splitlines():
        line = re.sub(r"\s+#\s.*$", "", raw).rstrip()
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        line = " ".join((pending + line.strip()).split()) if pending else line.strip()
        pending = ""
        if line:
            joined.append(line)
    return joined


def is_assignment(line: str) -> bool:
    """`export X=1` or `P=$'...'`: a line of a bash block's prelude (`X=1 mtpc ...` is a command)."""
    words = shlex.split(line)
    words = words[1:] if words[:1] == ["export"] else words
    return bool(words) and all(ASSIGNMENT.match(w) for w in words)


@dataclass(frozen=True)
class Command:
    text: str  # as the README writes it (continuations joined, comments dropped)
    block: Block
    index: int  # its position among the commands of its block
    prelude: tuple[str, ...]  # the block's assignments before it (`export ...`, `P=...`)
    shown: str | None = None  # for a `$ command` transcript: the lines the README shows below it


def commands() -> list[Command]:
    """Every command of the user docs: each non-assignment line of a bash block (skipped ones included),
    and each `$ command` of a text block with the output shown under it."""
    found = []
    for block in blocks(include_skipped=True):
        if block.language == "bash":
            prelude, index = [], 0
            for line in bash_lines(block):
                if is_assignment(line):
                    prelude.append(line)
                    continue
                found.append(Command(line, block, index, tuple(prelude)))
                index += 1
        elif block.language in ("", "text", "console"):
            parts = re.split(r"^\$ ", block.text, flags=re.M)
            for index, part in enumerate(parts[1:]):
                command, _, shown = part.partition("\n")
                found.append(Command(command.strip(), block, index, (), shown.rstrip("\n")))
    return found


def following_text(block: Block) -> str:
    """The text block right after `block` in its file: what its commands print."""
    later = [b for b in file_blocks(block.path, include_skipped=True) if b.line > block.line]
    assert later and later[0].language == "text", f"{block.where}: no output block follows"
    return later[0].text


def printed_by(block: Block) -> str:
    """What a Python block prints when run as a script (its standard output)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.text, block.where, "exec"), {"__name__": "__main__"})
    return out.getvalue()


def output_after(block: Block) -> str | None:
    """The output the docs show for a Python block: the next fenced block of its file when that is a
    `text` block and not a `$ command` transcript, else None (the block's output is not shown)."""
    later = [b for b in file_blocks(block.path, include_skipped=True) if b.line > block.line]
    if later and later[0].language == "text" and not later[0].text.startswith("$ "):
        return later[0].text
    return None


def argv(command: Command) -> list[str]:
    """The arguments bash passes to the command's program (variables, quoting and `$'...'` expanded by
    bash itself, after the block's prelude; an `ENV=x` prefix dropped)."""
    program = re.sub(r"^([A-Za-z_]\w*=\S+\s+)*", "", command.text).split()[0]
    script = "\n".join([*command.prelude, f'{program}() {{ printf "%s\\0" "$@"; }}', command.text])
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True, timeout=30).stdout
    return out.decode().split("\0")[:-1]


def shape(line: str) -> re.Pattern:
    """A pattern for a printed line with timings or sizes: the README's line with every number free (a
    run on another machine or at a tiny budget prints other numbers in the same words)."""
    parts, last = [], 0
    for m in NUMBER.finditer(line):
        parts += [re.escape(line[last:m.start()]), r"\d[\d,]*(\.\d+)?(e[-+]?\d+)?"]
        last = m.end()
    return re.compile("".join(parts) + re.escape(line[last:]))
