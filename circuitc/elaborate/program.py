"""The whole program: `elaborate` reads the main file and its includes (`sources`), binds the
parameters, hoists the functions, runs the files' statements in order (`interpreter`) and builds the
`RegionGraph` from the region table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..builders import GraphBuilder
from ..errors import CircuitError, Diagnostic, SourceSpan
from ..graph import RegionGraph
from ..limits import DEFAULT_LIMITS, Limits, limit_error
from ..syntax import Def, Include, Module, Param
from .builtin_functions import BUILTINS
from .interpreter import Interpreter
from .sources import SourceFiles
from .state import ElaborationState
from .values import Function, fail, is_int


def elaborate(module: Module, *, include_paths: Sequence[str | Path] = (), limits: Limits = DEFAULT_LIMITS,
              **bindings: Any) -> RegionGraph:
    """Run `module` with its parameters bound (`n=16`) and return the region graph it describes.

    `include` reads `.pc` files below the main file's folder (the working directory for text
    without a file) or below one of `include_paths`; `limits` bounds the work (`circuitc.Limits`).
    Structural rules (smoothness, decomposability, ...) are left to `circuitc.check.check_graph`.
    """
    files = SourceFiles(module, include_paths, limits)
    state = ElaborationState.start(limits, bindings)
    _declare_parameters(files, state)
    _hoist_functions(files, state)
    _run_file(files.main, files, Interpreter(state, files.modules.values()), executed=set())
    return _build(state, files.main)


def _declare_parameters(files: SourceFiles, state: ElaborationState) -> None:
    """Every file's `param` declarations, each name once, and the caller's values checked against them."""
    for module in files.modules.values():
        for stmt in module.body:
            if isinstance(stmt, Param):
                if stmt.name in state.params:
                    first = state.params[stmt.name].span
                    raise fail(f"parameter {stmt.name} is declared twice (first at {first})", stmt.span)
                state.params[stmt.name] = stmt
    unknown = sorted(set(state.bindings) - set(state.params))
    if unknown:
        known = ", ".join(state.params) or "none"
        where = files.main.file or "this file"
        raise CircuitError(Diagnostic(
            f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"the parameters of {where} are: {known}"))
    for name, value in state.bindings.items():
        if not isinstance(value, (int, str)):
            raise CircuitError(Diagnostic(
                f"parameter {name} = {type(value).__name__}: bound values must be integers, booleans or strings"))
        if is_int(value) and value.bit_length() > state.limits.int_bits:
            raise limit_error("int_bits", f"{value.bit_length():,} bits", state.limits,
                              what=f"parameter {name} is bound to a number too large")


def _hoist_functions(files: SourceFiles, state: ElaborationState) -> None:
    """Functions are visible everywhere in the program, so they may call each other in any order."""
    for module in files.modules.values():
        for stmt in module.body:
            if not isinstance(stmt, Def):
                continue
            if stmt.name in BUILTINS:
                raise fail(f"def {stmt.name} would hide the built-in {stmt.name}; choose another name", stmt.span)
            if stmt.name in state.params:
                raise fail(f"def {stmt.name}: {stmt.name} is already a parameter", stmt.span)
            previous = state.globals.get(stmt.name)
            if isinstance(previous, Function):
                raise fail(f"function {stmt.name} is defined twice (first at {previous.node.span})", stmt.span)
            state.globals[stmt.name] = Function(stmt)


def _run_file(module: Module, files: SourceFiles, interpreter: Interpreter, executed: set[str]) -> None:
    """Run a file's statements in order; an include runs the included file there, the first time only."""
    executed.add(files.key(module))
    for stmt in module.body:
        if isinstance(stmt, Include):
            included = files.included(module, stmt)
            if included not in executed:
                _run_file(files.modules[included], files, interpreter, executed)
        elif not isinstance(stmt, Def):  # hoisted already
            interpreter.run_top(stmt)


def _build(state: ElaborationState, main: Module) -> RegionGraph:
    """The graph: every region used, with its units settled (explicit `.units`, else the root's 1,
    else the declared default), and every partition."""
    declared, end = state.declared, _end_of(main)
    if declared.varset is None:
        raise fail("no variables declared: start with e.g. `vars x[16] states 256 units 8`", end)
    if declared.root is None:
        raise fail(f"no root region: say which region is the circuit, e.g. `root {declared.varset.name}[0:n]`", end)
    b = GraphBuilder(declared.varset.name)
    for rid, info in state.regions.regions.items():
        units = info.units
        if units is None:
            units = 1 if rid == declared.root.id else declared.default_units
        b.region(info.scope, units, name=rid, span=info.span)
    for parent, product, span in state.regions.partitions:
        b.partition(parent, [c.id for c in product.children], product.kind, span=span)
    return b.build(declared.root.id, declared.varset.count, declared.states, declared.default_units,
                   declared.default_product, span=declared.vars_node.span if declared.vars_node else None,
                   source_name=main.file)


def _end_of(main: Module) -> SourceSpan:
    lines = (main.source or "").splitlines() or [""]
    return SourceSpan(main.file, len(lines), 1, source_line=lines[-1])
