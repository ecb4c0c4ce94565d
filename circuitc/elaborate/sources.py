"""The files of a program: the main file and every file it includes, each parsed once (depth first,
cycles refused) and nothing read outside the allowed folders."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..graph import read_source
from ..limits import Limits
from ..syntax import Include, Module, parse
from .values import fail, is_text, quoted


class SourceFiles:
    """The parsed files of one program, by resolved path; `included` answers which file an
    `include` statement names."""

    def __init__(self, main: Module, include_paths: Sequence[str | Path], limits: Limits):
        self.main = main
        self.limits = limits
        main_folder = Path(main.file).parent if main.file else Path.cwd()
        self.roots = [main_folder.resolve()] + [Path(p).resolve() for p in include_paths]
        self.modules: dict[str, Module] = {}  # in the order they were read: the main file first
        self.targets: dict[tuple[str, str], str] = {}  # (including file, written path) -> file
        self._load(main, ())

    @staticmethod
    def key(module: Module) -> str:
        return str(Path(module.file).resolve()) if module.file else "<string>"

    def included(self, module: Module, stmt: Include) -> str:
        """The key of the file `stmt` (in `module`) includes: one of `modules`."""
        return self.targets[(self.key(module), stmt.path)]

    def _load(self, module: Module, stack: tuple[str, ...]) -> None:
        """Parse every included file once (depth first), detecting include cycles."""
        key = self.key(module)
        self.modules[key] = module
        stack = stack + (key,)
        for stmt in module.body:
            if not isinstance(stmt, Include):
                continue
            path = self._resolve(module, stmt)
            if path in stack:
                cycle = " -> ".join(Path(p).name for p in stack[stack.index(path):] + (path,))
                raise fail(f"include cycle: {cycle}", stmt.span)
            if path in self.modules:
                continue
            text = read_source(Path(path), self.limits, stmt.span, shown=f'"{stmt.path}" ({path})')
            self._load(parse(text, file=display_path(path), limits=self.limits), stack)

    def _resolve(self, module: Module, stmt: Include) -> str:
        """The file an include names: relative to the including file, else to an include path; it
        must be a `.pc` file below the main file's folder or an include path (no `/etc/passwd`,
        `../../..`, `/dev/zero`), so a structure file can read nothing else."""
        written = stmt.path
        if not written or any(ord(ch) < 32 for ch in written) or not is_text(written):
            raise fail(f"include {quoted(written)}: not a valid file name", stmt.span)
        if not written.endswith(".pc"):
            raise fail(f"include {quoted(written)}: only .pc files can be included", stmt.span)
        base = Path(module.file).parent if module.file else Path.cwd()
        try:
            candidates = [(folder / written).resolve() for folder in [base, *self.roots[1:]]]
            found = next((c for c in candidates if c.exists()), None)
        except (OSError, RuntimeError) as e:  # a name too long, a symlink loop
            raise fail(f"cannot include {quoted(written)}: {getattr(e, 'strerror', None) or e}", stmt.span) from None
        if found is None:
            where = " or the include paths" if len(self.roots) > 1 else ""
            raise fail(f"cannot include {quoted(written)}: no such file in {display_path(str(base))}{where}",
                       stmt.span)
        if not any(found.is_relative_to(root) for root in self.roots):
            raise fail(f"cannot include {quoted(written)}: {display_path(str(found))} is outside "
                       f"{display_path(str(self.roots[0]))} and the include paths "
                       f"(add its folder with -I DIR on the command line, or include_paths=[...])", stmt.span)
        self.targets[(self.key(module), written)] = str(found)
        return str(found)


def display_path(path: str) -> str:
    """Paths in messages: relative to the working directory when below it."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path
