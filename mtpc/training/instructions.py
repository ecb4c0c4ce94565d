"""Instructions for `mtpc distill-data --chat`, written from the training documents' own names and docstrings.

A chat model is asked questions, not handed files to continue, so the text a chat decoder verifies is the
model's *answers*. To train a head on such text without borrowing anybody's instruction set, each
instruction is made from one training document (never a held-out one):

- its module name, from the document's path (`json/decoder.py` -> `json.decoder`);
- its public `def` and `class` names with the first line of their docstrings, and the first line of the
  module's own docstring, found by one pass over the document's lines in linear time (the text is data:
  nothing in it is run or imported, and no pattern over it can backtrack: a hostile file costs what its
  length does);

filled into one of the templates below, chosen by the record's own generator, so a record's instruction
depends only on `(seed, index)`, as a continuation prompt does.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

SCAN_BYTES = 1 << 18  # of each document, the first 256 KiB are scanned for names and docstrings
MAX_SUMMARY_CHARS = 160  # a docstring's first line, cut
MAX_DEFINITIONS = 256  # kept per document

MAX_LINE_CHARS = 400  # of a definition's line after its name, of a comment, and of a docstring's first line kept
MAX_SIGNATURE_TAIL = 80  # between a continued signature's last `)` and its `:`
MAX_LEADING_LINES = 32  # comment or blank lines before a module's docstring

# A definition is found line by line: `def name` / `class Name` at the start of a line (the header), then,
# after the signature's last line when it spans lines, a docstring's opening on the next line. No pattern
# below has two repeats that can take the same characters, and each line is tried a bounded number of times,
# so the pass is linear in the text (one pattern spanning three lines, with overlapping repeats, took
# seconds per crafted line).
_HEADER = re.compile(rb'^[ \t]*(?:async[ \t]+)?(def|class)[ \t]+([A-Za-z]\w{0,63})', re.MULTILINE)
_DOCSTRING_OPENING = re.compile(rb'[rRuU]?(?:"""|\'\'\')[ \t]*')  # matched where a line's indentation ends

FUNCTION_TEMPLATES = (
    "Write a Python function named `{name}` that does the following: {summary}",
    "In Python's `{module}` module, what does `{name}` do? Explain briefly and show an example.",
    "Show how to use `{module}.{name}` in a short program, and explain what it prints.",
    "Write a short docstring and an implementation for a function `{name}`: {summary}",
    "Explain in plain words, for a beginner: \"{summary}\"",
)
CLASS_TEMPLATES = (
    "What is the `{name}` class in Python's `{module}` module for? Give a small example.",
    "Write a Python class `{name}`: {summary}",
    "Show how to create and use a `{module}.{name}` object.",
)
MODULE_TEMPLATES = (
    "What is the Python `{module}` module for? Give a short example.",
    "Write a small Python program that uses the `{module}` module.",
    "List the most useful functions of the `{module}` module, with one line on each.",
)


@dataclass(frozen=True)
class Definition:
    kind: str  # "def" or "class"
    name: str
    summary: str  # the docstring's first line ("" when it has none on its first line)


def module_name(document_name: str) -> str:
    """`json/decoder.py` -> `json.decoder`; `email/__init__.py` -> `email`; `:N` suffixes (jsonl lines) and
    `#train`/`#val` (the halves of a document cut in two by `split_documents`) dropped."""
    path = document_name.split(":", 1)[0]
    for half in ("#train", "#val"):
        if path.endswith(half):
            path = path[: -len(half)]
            break
    for suffix in (".py", ".pyi", ".txt", ".md"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    parts = [p for p in path.replace("\\", "/").split("/") if p and p != "__init__"]
    if parts[:1] == ["site-packages"]:
        parts = parts[1:]
    return ".".join(parts[-3:]) or "builtins"


def definitions(text: bytes) -> tuple[str, list[Definition]]:
    """(the module docstring's first line, the public definitions with their docstrings' first lines)."""
    text = text[:SCAN_BYTES]
    module_doc = _module_docstring(text)
    module_summary = _summary(module_doc) if module_doc is not None else ""
    kept = []
    for kind, name, doc in _documented_definitions(text):
        if name.startswith("_") or name.startswith("test") or name.startswith("Test"):
            continue
        kept.append(Definition(kind, name, _summary(doc)))
        if len(kept) >= MAX_DEFINITIONS:
            break
    return module_summary, kept


def _documented_definitions(text: bytes) -> Iterator[tuple[str, str, bytes]]:
    """(kind, name, the docstring's first line) of each header whose docstring opens on the next line, or on
    the line after a continued signature's last line; the search goes on after that docstring's line."""
    at = 0
    while (header := _HEADER.search(text, at)) is not None:
        at = header.end()  # a header without a docstring: the search goes on from its next line
        rest_end = text.find(b"\n", at)
        if rest_end < 0:
            return  # the last line: no docstring can follow
        if rest_end - at > MAX_LINE_CHARS:
            continue
        second, third_at = _line(text, rest_end + 1)
        doc, after = None, None
        if third_at is not None and _ends_signature(second):
            third, after = _line(text, third_at)
            doc = _docstring_first_line(third)
        if doc is None:
            doc, after = _docstring_first_line(second), third_at
        if doc is not None:
            yield header.group(1).decode(), header.group(2).decode(), doc
            at = len(text) if after is None else after


def _line(text: bytes, start: int) -> tuple[bytes, int | None]:
    """The line beginning at `start` (without its newline), and where the next begins (None: none does)."""
    end = text.find(b"\n", start)
    return (text[start:], None) if end < 0 else (text[start:end], end + 1)


def _indentation(line: bytes) -> int:
    return len(line) - len(line.lstrip(b" \t"))


def _ends_signature(line: bytes) -> bool:
    """Whether `line` ends a signature that spans lines: a last non-blank `:` at most `MAX_SIGNATURE_TAIL`
    characters after a `)`, that `)` at most `MAX_LINE_CHARS` characters after the indentation."""
    code = line.rstrip(b" \t")
    if not code.endswith(b":"):
        return False
    colon = len(code) - 1
    paren = code.find(b")", max(0, colon - MAX_SIGNATURE_TAIL - 1), colon)  # the first: the furthest from `:`
    return 0 <= paren <= _indentation(line) + MAX_LINE_CHARS


def _docstring_first_line(line: bytes, indented: bool = True) -> bytes | None:
    """What follows a docstring's opening quotes on `line` (cut), or None when the line opens none."""
    opening = _DOCSTRING_OPENING.match(line, _indentation(line) if indented else 0)
    return None if opening is None else line[opening.end():opening.end() + MAX_LINE_CHARS]


def _module_docstring(text: bytes) -> bytes | None:
    """The first line of a docstring opening at the first column after at most `MAX_LEADING_LINES` comment
    or blank lines, or None."""
    at = 0
    for _ in range(MAX_LEADING_LINES):
        line, following = _line(text, at)
        code = line.lstrip(b" \t")
        comment = code.startswith(b"#") and len(code) - 1 <= MAX_LINE_CHARS
        if following is None or not (comment or not code):
            break
        at = following
    return _docstring_first_line(_line(text, at)[0], indented=False)


def _summary(line: bytes) -> str:
    text = line.decode("utf-8", errors="replace").replace('"""', "").replace("'''", "").strip()
    if len(text) > MAX_SUMMARY_CHARS:
        text = text[:MAX_SUMMARY_CHARS].rsplit(" ", 1)[0] + " ..."
    return text if sum(c.isalpha() for c in text) >= 8 else ""


class Instructions:
    """`instructions[rng]` -> one instruction, from the documents given (name, bytes) (see the module doc)."""

    def __init__(self, documents: list[tuple[str, bytes]]):
        self.documents = []  # [(module, module summary, definitions)]
        for name, text in documents:
            summary, found = definitions(text)
            self.documents.append((module_name(name), summary, found))
        if not self.documents:
            raise ValueError("no training document to write instructions from")

    def __getitem__(self, rng: random.Random) -> str:
        module, module_summary, found = self.documents[rng.randrange(len(self.documents))]
        with_summary = [d for d in found if d.summary]
        if with_summary and rng.random() < 0.75:
            chosen = with_summary[rng.randrange(len(with_summary))]
            templates = CLASS_TEMPLATES if chosen.kind == "class" else FUNCTION_TEMPLATES
            return templates[rng.randrange(len(templates))].format(module=module, name=chosen.name,
                                                                    summary=chosen.summary)
        if module_summary and rng.random() < 0.3:
            return f"The Python module `{module}` describes itself as: \"{module_summary}\" What does that mean?"
        return MODULE_TEMPLATES[rng.randrange(len(MODULE_TEMPLATES))].format(module=module)


def document_bytes(tokens: np.ndarray) -> bytes:
    """A byte document's text (its specials, `<bos>`/`<eos>`, dropped)."""
    return bytes(tokens[(tokens >= 0) & (tokens < 256)].astype(np.uint8))
