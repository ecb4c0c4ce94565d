"""The whole program: `elaborate` loads the main file and its includes (each parsed once, cycles
refused, nothing read outside the allowed folders), binds the parameters, hoists the functions,
runs the files' statements in order and builds the `RegionGraph`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..builders import GraphBuilder
from ..errors import CircuitError, Diagnostic, SourceSpan
from ..graph import RegionGraph, read_source
from ..limits import DEFAULT_LIMITS, Limits, limit_error
from ..syntax import (Assign, BinOp, Bool, Call, Def, ExprStmt, For, If, Include, Index, Int, ListComp, ListLit,
                      Module, Name, Param, Return, Root, SetUnits, Str, Tagged, UnaryOp, Vars, parse)
from .builtin_functions import BUILTINS
from .expressions import Expressions
from .regions import Regions
from .statements import Statements
from .values import Definition, Function, RegionInfo, Product, RegionRef, VarSet, fail, is_int, is_text, quoted


def elaborate(module: Module, *, include_paths: Sequence[str | Path] = (), limits: Limits = DEFAULT_LIMITS,
              **bindings: Any) -> RegionGraph:
    """Run `module` with its parameters bound (`n=16`) and return the region graph it describes.

    `include` reads `.pc` files below the main file's folder (the working directory for text
    without a file) or below one of `include_paths`; `limits` bounds the work (`circuitc.Limits`).
    Structural rules (smoothness, decomposability, ...) are left to `circuitc.check.check_graph`.
    """
    return Elaborator(module, bindings, include_paths, limits).run()


class Elaborator(Statements, Expressions, Regions):
    """One elaboration: the program's state, and the whole-program steps; statements, expressions
    and the graph's bookkeeping are its parts (`statements`, `expressions`, `regions`)."""

    def __init__(self, module: Module, bindings: dict[str, Any], include_paths: Sequence[str | Path] = (),
                 limits: Limits = DEFAULT_LIMITS):
        self.main = module
        self.bindings = bindings
        self.limits = limits
        self.steps = 0  # statements run, calls and loop turns: every repetition of work is one of these
        self.entries = 0  # scope entries named and held so far (bounded by limits.scope_entries)
        main_folder = Path(module.file).parent if module.file else Path.cwd()
        self.include_roots = [main_folder.resolve()] + [Path(p).resolve() for p in include_paths]
        self.include_targets: dict[tuple[str, str], str] = {}  # (including file, written path) -> file
        self.generated: dict[tuple, RegionRef] = {}  # built-in structure calls already merged
        self.modules: dict[str, Module] = {}  # included files by resolved path
        self.executed: set[str] = set()
        self.params: dict[str, Param] = {}
        self.globals: dict[str, Any] = {}
        self.varset: VarSet | None = None
        self.vars_node: Vars | None = None
        self.states = 0
        self.default_units = 1
        self.default_product = "hadamard"
        self.regions: dict[str, RegionInfo] = {}
        self.definitions: dict[str, Definition] = {}
        self.partitions: list[tuple[str, Product, SourceSpan | None]] = []
        self.root: RegionRef | None = None
        self.root_span: SourceSpan | None = None
        self.depth = 0
        # Statements inside blocks; declarations are handled by `_exec_top` only.
        self._exec_by_type = {
            Param: self._not_in_block, Vars: self._not_in_block, Include: self._not_in_block,
            Def: self._not_in_block, For: self._exec_for, If: self._exec_if, Return: self._exec_return, Root: self._exec_root,
            Assign: self._exec_assign, SetUnits: self._exec_set_units, ExprStmt: self._exec_expr_stmt,
        }
        self._eval_by_type = {
            Int: self._eval_literal, Str: self._eval_literal, Bool: self._eval_literal, Name: self._eval_name,
            BinOp: self._eval_binop, UnaryOp: self._eval_unary, Call: self._eval_call, Index: self._eval_index,
            Tagged: self._eval_tagged, ListLit: self._eval_list, ListComp: self._eval_list_comp,
        }

    # ------------------------------------------------------------------ whole program

    def run(self) -> RegionGraph:
        self._load(self.main, ())
        self._check_bindings()
        self._hoist_definitions()
        self._exec_module(self.main, self._module_key(self.main))
        return self._build()

    def _module_key(self, module: Module) -> str:
        return str(Path(module.file).resolve()) if module.file else "<string>"

    def _load(self, module: Module, stack: tuple[str, ...]) -> None:
        """Parse every included file once (depth first), detecting include cycles."""
        key = self._module_key(module)
        self.modules[key] = module
        stack = stack + (key,)
        for stmt in module.body:
            if not isinstance(stmt, Include):
                continue
            path = self._resolve_include(module, stmt)
            if path in stack:
                cycle = " -> ".join(Path(p).name for p in stack[stack.index(path):] + (path,))
                raise fail(f"include cycle: {cycle}", stmt.span)
            if path in self.modules:
                continue
            text = read_source(Path(path), self.limits, stmt.span, shown=f'"{stmt.path}" ({path})')
            self._load(parse(text, file=self._display_path(path), limits=self.limits), stack)

    def _include_path(self, module: Module, stmt: Include) -> str:
        return self.include_targets[(self._module_key(module), stmt.path)]

    def _resolve_include(self, module: Module, stmt: Include) -> str:
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
            candidates = [(folder / written).resolve() for folder in [base, *self.include_roots[1:]]]
            found = next((c for c in candidates if c.exists()), None)
        except (OSError, RuntimeError) as e:  # a name too long, a symlink loop
            raise fail(f"cannot include {quoted(written)}: {getattr(e, 'strerror', None) or e}", stmt.span) from None
        if found is None:
            where = " or the include paths" if len(self.include_roots) > 1 else ""
            raise fail(f"cannot include {quoted(written)}: no such file in {self._display_path(str(base))}{where}",
                       stmt.span)
        if not any(found.is_relative_to(root) for root in self.include_roots):
            raise fail(f"cannot include {quoted(written)}: {self._display_path(str(found))} is outside "
                       f"{self._display_path(str(self.include_roots[0]))} and the include paths "
                       f"(add its folder with -I DIR on the command line, or include_paths=[...])", stmt.span)
        self.include_targets[(self._module_key(module), written)] = str(found)
        return str(found)

    @staticmethod
    def _display_path(path: str) -> str:
        """Paths in messages: relative to the working directory when below it."""
        try:
            return str(Path(path).relative_to(Path.cwd()))
        except ValueError:
            return path

    def _check_bindings(self) -> None:
        for module in self.modules.values():
            for stmt in module.body:
                if isinstance(stmt, Param):
                    if stmt.name in self.params:
                        first = self.params[stmt.name].span
                        raise fail(f"parameter {stmt.name} is declared twice (first at {first})", stmt.span)
                    self.params[stmt.name] = stmt
        unknown = sorted(set(self.bindings) - set(self.params))
        if unknown:
            known = ", ".join(self.params) or "none"
            where = self.main.file or "this file"
            raise CircuitError(Diagnostic(
                f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                f"the parameters of {where} are: {known}"))
        for name, value in self.bindings.items():
            if not isinstance(value, (int, str)):
                raise CircuitError(Diagnostic(
                    f"parameter {name} = {type(value).__name__}: bound values must be integers, booleans or "
                    f"strings"))
            if is_int(value) and value.bit_length() > self.limits.int_bits:
                raise limit_error("int_bits", f"{value.bit_length():,} bits", self.limits,
                                  what=f"parameter {name} is bound to a number too large")

    def _hoist_definitions(self) -> None:
        """Functions are visible everywhere in the program, so they may call each other in any order."""
        for module in self.modules.values():
            for stmt in module.body:
                if not isinstance(stmt, Def):
                    continue
                if stmt.name in BUILTINS:
                    raise fail(f"def {stmt.name} would hide the built-in {stmt.name}; choose another name",
                               stmt.span)
                if stmt.name in self.params:
                    raise fail(f"def {stmt.name}: {stmt.name} is already a parameter", stmt.span)
                previous = self.globals.get(stmt.name)
                if isinstance(previous, Function):
                    raise fail(f"function {stmt.name} is defined twice (first at {previous.node.span})",
                               stmt.span)
                self.globals[stmt.name] = Function(stmt)

    def _exec_module(self, module: Module, key: str) -> None:
        self.executed.add(key)
        for stmt in module.body:
            self._exec_top(stmt, module)

    def _exec_top(self, stmt, module: Module) -> None:
        if isinstance(stmt, Include):
            key = self._include_path(module, stmt)
            if key not in self.executed:  # each file runs once, however often it is included
                self._exec_module(self.modules[key], key)
            return
        if isinstance(stmt, Return):
            raise fail("return outside a function", stmt.span)
        if isinstance(stmt, Def):  # hoisted already
            return
        try:
            if isinstance(stmt, Param):
                self._exec_param(stmt)
            elif isinstance(stmt, Vars):
                self._exec_vars(stmt)
            else:
                self._exec(stmt, self.globals)
        except RecursionError:  # nesting far beyond anything written by hand
            raise fail("this statement nests expressions too deeply to evaluate", stmt.span) from None
        except MemoryError:  # the limits should prevent this; if not, a located message still beats a crash
            raise fail("out of memory while evaluating this statement; lower the sizes it asks for",
                       stmt.span) from None

    def _build(self) -> RegionGraph:
        end = self._end_of_main()
        if self.varset is None:
            raise fail("no variables declared: start with e.g. `vars x[16] states 256 units 8`", end)
        if self.root is None:
            raise fail(f"no root region: say which region is the circuit, e.g. `root {self.varset.name}[0:n]`",
                       end)
        b = GraphBuilder(self.varset.name)
        for rid, info in self.regions.items():
            units = info.units
            if units is None:
                units = 1 if rid == self.root.id else self.default_units
            b.region(info.scope, units, name=rid, span=info.span)
        for parent, product, span in self.partitions:
            b.partition(parent, [c.id for c in product.children], product.kind, span=span)
        return b.build(self.root.id, self.varset.count, self.states, self.default_units, self.default_product,
                       span=self.vars_node.span if self.vars_node else None, source_name=self.main.file)

    def _end_of_main(self) -> SourceSpan:
        lines = (self.main.source or "").splitlines() or [""]
        return SourceSpan(self.main.file, len(lines), 1, source_line=lines[-1])
