"""Instructions for `mtpc distill-data --chat`, written from the training documents' own names and docstrings.

A chat model is asked questions, not handed files to continue, so the text a chat decoder verifies is the
model's *answers*. To train a head on such text without borrowing anybody's instruction set, each
instruction is made from one training document (never a held-out one):

- its module name, from the document's path (`json/decoder.py` -> `json.decoder`);
- its public `def` and `class` names with the first line of their docstrings, and the first line of the
  module's own docstring, found by one bounded regular-expression pass over the document's text (the text
  is data: nothing in it is run or imported);

filled into one of the templates below, chosen by the record's own generator, so a record's instruction
depends only on `(seed, index)`, as a continuation prompt does.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import numpy as np

SCAN_BYTES = 1 << 18  # of each document, the first 256 KiB are scanned for names and docstrings
MAX_SUMMARY_CHARS = 160  # a docstring's first line, cut
MAX_DEFINITIONS = 256  # kept per document

# `def name(...` or `class Name...:` at the start of a line, then (after the signature's line) a docstring
_DEFINITION = re.compile(
    rb'^[ \t]*(?:async[ \t]+)?(def|class)[ \t]+([A-Za-z]\w{0,63})[^\n]{0,400}\n'
    rb'(?:[ \t]*[^\n]{0,400}\)[^\n]{0,80}:[ \t]*\n)?'  # a signature's last line, when it spans lines
    rb'[ \t]*[rRuU]?(?:"""|\'\'\')[ \t]*([^\n]{0,400})', re.MULTILINE)
_MODULE_DOCSTRING = re.compile(rb'\A(?:[ \t]*#[^\n]{0,400}\n|[ \t]*\n){0,32}[rRuU]?(?:"""|\'\'\')[ \t]*([^\n]{0,400})')

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
    """`json/decoder.py` -> `json.decoder`; `email/__init__.py` -> `email`; `:N` suffixes (jsonl lines) dropped."""
    path = document_name.split(":", 1)[0]
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
    found = _MODULE_DOCSTRING.match(text)
    module_summary = _summary(found.group(1)) if found else ""
    kept = []
    for match in _DEFINITION.finditer(text):
        kind, name, doc = match.group(1).decode(), match.group(2).decode(), _summary(match.group(3))
        if name.startswith("_") or name.startswith("test") or name.startswith("Test"):
            continue
        kept.append(Definition(kind, name, doc))
        if len(kept) >= MAX_DEFINITIONS:
            break
    return module_summary, kept


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
