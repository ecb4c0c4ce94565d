"""No class in circuitc/ or mtpc/ is longer than 400 lines (read with `ast`): a class that grows past
that holds several jobs, and is split along them (as the compiled circuit was, into an executor,
queries and one wrapper)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("circuitc", "mtpc")
MAX_CLASS_LINES = 400


def long_classes(root: Path, packages: tuple[str, ...], limit: int) -> list[str]:
    """`path:line Name (N lines)` for every class, nested ones included, longer than `limit` lines."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.ClassDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > limit:
                        found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_class_is_longer_than_the_limit():
    too_long = long_classes(ROOT, PACKAGES, MAX_CLASS_LINES)
    assert not too_long, "classes over 400 lines:\n" + "\n".join(too_long)


def test_the_check_finds_a_long_class_nested_or_not(tmp_path):
    (tmp_path / "pkg").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(6))
    (tmp_path / "pkg" / "a.py").write_text(f"class Short:\n    x = 1\n\n\nclass Long:\n{body}\n")
    (tmp_path / "pkg" / "b.py").write_text(f"def f():\n    class Inner:\n    {body.replace(chr(10), chr(10) + '    ')}\n")
    assert long_classes(tmp_path, ("pkg",), 5) == ["pkg/a.py:5 Long (7 lines)", "pkg/b.py:2 Inner (7 lines)"]
    assert long_classes(tmp_path, ("pkg",), 7) == []


def test_the_speculative_decoder_stays_a_loop_not_a_warehouse():
    """The decoder verifies and accepts; proposers, row state, compiled steps and plain decoding live in their
    own modules (issue: the seams), so its class stays within 250 lines."""
    decoder = ROOT / "mtpc" / "decoding" / "cycle" / "decoder.py"
    assert long_classes(ROOT, ("mtpc/decoding",), 250) == [], decoder
