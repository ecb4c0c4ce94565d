"""The house rules of the mtpc package, read from its source with `ast`:

- imports run only downward: ground floor (errors, checks, settings, tokenizer, loading) < heads < decoding <
  training < bench < cli; a module may import its own stage and any stage below it;
- no import cycle between modules (lazy imports inside functions count too);
- no module imports a private name (`_x`) of another module.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mtpc"
FLOORS = {"errors": 0, "files": 0, "checks": 0, "settings": 0, "lazy": 0, "tokenizer": 0, "loading": 0, "chat": 0, "heads": 1, "decoding": 2, "training": 3,
          "bench": 4, "cli": 5}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def stage(module: str) -> str | None:
    """The stage a module belongs to: its subpackage, or its own name on the ground floor."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def imports(module: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, imported names, line) for every mtpc import in the file, lazy ones included."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "mtpc":
                continue
            names = [a.name for a in node.names]
            submodules = [n for n in names if f"{target}.{n}" in modules()]  # `from . import checks`
            found += [(f"{target}.{n}", [], node.lineno) for n in submodules]
            attributes = [n for n in names if n not in submodules]  # `from .. import __version__`
            if attributes:
                found.append((target, attributes, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "mtpc"]
    return found


def edges() -> list[tuple[str, str, list[str], int]]:
    return [(m, target, names, line) for m, p in modules().items() for target, names, line in imports(m, p)]


def test_the_stages_are_the_documented_ones():
    stages = {stage(m) for m in modules()} - {None}
    assert stages == set(FLOORS), f"a stage without a floor (or a floor without a stage): {stages ^ set(FLOORS)}"


def test_imports_only_run_downward():
    upward = []
    for source, target, _, line in edges():
        a, b = stage(source), stage(target)
        if a is None or b is None or a == b:
            continue  # mtpc/__init__ exports from every stage; a stage may use itself
        if FLOORS[b] > FLOORS[a]:
            upward.append(f"{source}:{line} imports {target} (stage {b} is above {a})")
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    graph = nx.DiGraph()
    known = modules()
    for source, target, _, _ in edges():
        if source == "mtpc":
            continue  # the package's lazy public API
        while target not in known and "." in target:
            target = target.rpartition(".")[0]
        if target != source and not known[target].name == "__init__.py":
            graph.add_edge(source, target)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import cycles: {cycles}"


def test_no_private_names_cross_modules():
    private = [f"{source}:{line} imports {name} from {target}" for source, target, names, line in edges()
               for name in names if name.startswith("_") and not name.startswith("__") and target != source]
    assert not private, "\n".join(private)


@pytest.mark.parametrize("broken", ["upward", "private"])
def test_the_checks_see_a_planted_violation(tmp_path, monkeypatch, broken):
    """A planted upward or private import is found (so the checks above can fail)."""
    root = tmp_path / "mtpc"
    for name in ("heads", "cli"):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "cli" / "commands.py").write_text("def _helper():\n    pass\n")
    line = "from ..cli import commands\n" if broken == "upward" else "from ..cli.commands import _helper\n"
    (root / "heads" / "head.py").write_text(line)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", root)
    with pytest.raises(AssertionError):
        (test_imports_only_run_downward if broken == "upward" else test_no_private_names_cross_modules)()
