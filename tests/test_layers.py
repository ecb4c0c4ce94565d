"""The house rules of the packages, read from their source with `ast`:

- mtpc's imports run only downward: ground floor (errors, checks, settings, files, sampling, lazy, hardware) <
  lm < heads < decoding < training < serving < bench < cli; a module may import its own stage and any stage below it;
- no import cycle between modules (files) anywhere in circuitc or mtpc: imports at module level,
  under `if TYPE_CHECKING:` and inside functions all count; a name imported from a package's
  `__init__` counts as an import of the module the `__init__` re-exports it from;
- no mtpc module imports a private name (`_x`) of another module.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mtpc"
PACKAGES = [PACKAGE.parent / "circuitc", PACKAGE]  # the cycle check covers both
FLOORS = {"errors": 0, "files": 0, "sampling": 0, "checks": 0, "settings": 0, "lazy": 0, "hardware": 0, "step_store": 0, "lm": 1,
          "heads": 2, "decoding": 3, "training": 4, "serving": 5, "bench": 6, "cli": 7}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def stage(module: str) -> str | None:
    """The stage a module belongs to: its subpackage, or its own name on the ground floor."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def import_source(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a `from ... import` reads from, for a file in `package`."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    return ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))


def imports(module: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, imported names, line) for every mtpc import in the file, lazy ones included."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = import_source(node, package)
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


def package_modules(roots: list[Path]) -> dict[str, Path]:
    """Every module (file) of the given packages, by dotted name; a package is its `__init__.py`."""
    found = {}
    for root in roots:
        for path in root.rglob("*.py"):
            parts = path.relative_to(root.parent).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def from_imports(module: str, path: Path) -> list[tuple[str, list[tuple[str, str]]]]:
    """(source module, [(name, bound as)]) for every `from ... import` in the file, at any depth."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return [(import_source(node, package), [(a.name, a.asname or a.name) for a in node.names])
            for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom)]


def defining_module(source: str, name: str, known: dict[str, Path]) -> str | None:
    """The module whose code `from source import name` runs for `name`: a submodule of that name, else
    the module a package's `__init__` re-exports it from (followed through), else `source` itself."""
    if f"{source}.{name}" in known:
        return f"{source}.{name}"
    if source not in known:
        return None  # not one of ours
    if known[source].name == "__init__.py":
        for origin, names in from_imports(source, known[source]):
            for original, bound in names:
                if bound == name and origin != source:
                    return defining_module(origin, original, known) or source
    return source


def import_graph(roots: list[Path]) -> nx.DiGraph:
    """Module -> the modules it imports, module-level and lazy (inside functions) alike."""
    known = package_modules(roots)
    graph = nx.DiGraph()
    for module, path in known.items():
        targets = set()
        for source, names in from_imports(module, path):
            targets |= {defining_module(source, name, known) for name, _ in names}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = alias.name
                    while target not in known and "." in target:
                        target = target.rpartition(".")[0]
                    targets.add(target if target in known else None)
        graph.add_edges_from((module, target) for target in targets - {None, module})
    return graph


def test_no_import_cycles_between_files():
    """No two files of circuitc or mtpc import each other, directly or around a circle (a package's
    re-export counts as an import of the module that defines the name)."""
    cycles = sorted(c[c.index(min(c)):] + c[:c.index(min(c))] for c in nx.simple_cycles(import_graph(PACKAGES)))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c + c[:1]) for c in cycles)


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


def plant(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_cycle_check_sees_a_planted_cycle(tmp_path, monkeypatch):
    """A lazy import that closes a circle is found, across packages too."""
    plant(tmp_path, {"mtpc/__init__.py": "", "mtpc/heads/__init__.py": "", "circuitc/__init__.py": "",
                     "mtpc/heads/head.py": "from circuitc.plan import lower\n",
                     "circuitc/plan.py": "def lower():\n    from mtpc.heads import head\n"})
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", [tmp_path / "circuitc", tmp_path / "mtpc"])
    with pytest.raises(AssertionError, match="circuitc.plan -> mtpc.heads.head -> circuitc.plan"):
        test_no_import_cycles_between_files()


def test_a_re_export_counts_as_an_import_of_its_defining_module(tmp_path, monkeypatch):
    """`stage/__init__` re-exports from `a` and `b`; `b` importing `a`'s name through the package is
    no cycle (it runs `a`, not `b`), but `a` importing `b`'s name through it closes a real one."""
    files = {"mtpc/__init__.py": "", "mtpc/stage/__init__.py": "from .a import A\nfrom .b import B as Bee\n",
             "mtpc/stage/a.py": "A = 1\n", "mtpc/stage/b.py": "from . import A\n"}
    plant(tmp_path, files)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", [tmp_path / "mtpc"])
    test_no_import_cycles_between_files()
    plant(tmp_path, {"mtpc/stage/a.py": "A = 1\nfrom mtpc.stage import Bee\n"})
    with pytest.raises(AssertionError, match="mtpc.stage.a -> mtpc.stage.b -> mtpc.stage.a"):
        test_no_import_cycles_between_files()


OWNED_IMPORTS = {"peft": "mtpc.lm", "gguf": "mtpc.lm"}  # a library: the one package that may import it


def imported_libraries(path: Path) -> set[str]:
    """The top-level names of every library the file imports, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def stray_imports(modules_by_name: dict[str, Path]) -> list[str]:
    return [f"{module} imports {library} (only {OWNED_IMPORTS[library]} may)" for module, path in sorted(modules_by_name.items())
            for library in sorted(imported_libraries(path) & set(OWNED_IMPORTS))
            if not (module == OWNED_IMPORTS[library] or module.startswith(OWNED_IMPORTS[library] + "."))]


def test_peft_and_gguf_are_imported_only_where_a_model_comes_from():
    """Loading a LoRA adapter or reading a GGUF file happens in `mtpc.lm` alone (one place to check what is
    read, and how), so no other module imports peft or gguf."""
    assert stray_imports(modules()) == []


def test_the_library_check_sees_a_planted_import(tmp_path):
    planted = tmp_path / "trainer.py"
    planted.write_text("def load():\n    from peft import PeftModel\n")
    assert stray_imports({"mtpc.training.trainer": planted}) == ["mtpc.training.trainer imports peft (only mtpc.lm may)"]
    assert stray_imports({"mtpc.lm.lora": planted}) == []
