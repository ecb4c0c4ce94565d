"""Elaborate a parsed `.pc` module, with its parameters bound, into a `RegionGraph`.

One interpreter walks the syntax tree: statements run in order, expressions evaluate to plain
values (ints, bools, strings, lists, and the three structural values below). A region is named by
its variables (`x[0:4]`, plus an optional `@tag`), so writing the same scope twice means the same
region; it enters the graph when it is used: defined (`x[0:4] = A * B`), used as a child, given
units, or made the root. Unit counts are settled at the end (explicit `.units`, else the root's 1,
else the declared default), so a region may be mentioned before its units are set.

Every error is a `CircuitError` located at the source span of the offending expression.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import builders
from .builders import GraphBuilder
from .errors import CircuitError, Diagnostic, SourceSpan
from .graph import PRODUCTS, RegionGraph, read_source, scope_name
from .limits import DEFAULT_LIMITS, Limits, check_at_most, limit_error
from .syntax import (Assign, BinOp, Block, Bool, Call, Def, ExprStmt, For, If, Include, Index, Int, ListComp,
                     ListLit, Module, Name, Param, Return, Root, SetUnits, Slice, Str, Tagged, UnaryOp, Vars,
                     parse)

# The bounds on a program's work live in `circuitc.limits.Limits`: user recursion is for trees
# (depth log n) and chains are written with `for`, so `call_depth` keeps the interpreter well inside
# Python's own recursion limit; `int_bits` stops `10**10**10` and `k = k * k` from hanging; `steps`
# stops exponential recursion; `loop` stops `for i in 0..10**18` before its first turn.
STEPS_PER_GENERATED_REGION = 4


# ----------------------------------------------------------------------------- values

@dataclass(frozen=True)
class VarSet:
    """The declared variables, `x` in `vars x[16] ...`; subscripting it names a region."""

    name: str
    count: int


@dataclass(frozen=True)
class RegionRef:
    """A region named by its scope (sorted variable indices) and optional tag."""

    id: str
    scope: tuple[int, ...]
    tag: str | None = None
    span: SourceSpan | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Product:
    """One partition-to-be: children multiplied with a hadamard or kronecker product."""

    kind: str
    children: tuple[RegionRef, ...]


@dataclass(frozen=True)
class Mixture:
    """Several partitions of one region: `A * B | C * D`."""

    products: tuple[Product, ...]


@dataclass(frozen=True)
class Function:
    node: Def


@dataclass(frozen=True)
class Builtin:
    name: str
    run: Callable[..., Any]  # run(elaborator, args, kwargs, span)
    signature: str


@dataclass(frozen=True)
class _Returned:
    value: Any


@dataclass
class _RegionInfo:
    scope: tuple[int, ...]
    span: SourceSpan | None
    units: int | None = None  # explicit units; None = settled at the end
    units_span: SourceSpan | None = None


@dataclass
class _Definition:
    key: tuple  # the partitions, compared to tell a harmless repeat from a conflict
    span: SourceSpan | None


def describe_value(value: Any) -> str:
    """A value as messages show it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"the number {value}"
    if isinstance(value, str):
        return f'the string "{value}"'
    if isinstance(value, (tuple, range)):
        return "a list"
    if isinstance(value, RegionRef):
        return f"region {value.id}"
    if isinstance(value, Product):
        return "the product " + (" ** " if value.kind == "kronecker" else " * ").join(c.id for c in value.children)
    if isinstance(value, Mixture):
        return "a mixture of partitions"
    if isinstance(value, VarSet):
        return f"the variable set {value.name}"
    if isinstance(value, Function):
        return f"function {value.node.name}"
    if isinstance(value, Builtin):
        return f"built-in {value.name}"
    return "nothing"


def _fail(message: str, span: SourceSpan | None) -> CircuitError:
    return CircuitError(Diagnostic(message, span))


# ----------------------------------------------------------------------------- entry point

def elaborate(module: Module, *, include_paths: Sequence[str | Path] = (), limits: Limits = DEFAULT_LIMITS,
              **bindings: Any) -> RegionGraph:
    """Run `module` with its parameters bound (`n=16`) and return the region graph it describes.

    `include` reads `.pc` files below the main file's folder (the working directory for text
    without a file) or below one of `include_paths`; `limits` bounds the work (`circuitc.Limits`).
    Structural rules (smoothness, decomposability, ...) are left to `circuitc.check.check_graph`.
    """
    return _Elaborator(module, bindings, include_paths, limits).run()


class _Elaborator:
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
        self.regions: dict[str, _RegionInfo] = {}
        self.definitions: dict[str, _Definition] = {}
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
                raise _fail(f"include cycle: {cycle}", stmt.span)
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
        if not written or any(ord(ch) < 32 for ch in written) or not _is_text(written):
            raise _fail(f"include {_quoted(written)}: not a valid file name", stmt.span)
        if not written.endswith(".pc"):
            raise _fail(f"include {_quoted(written)}: only .pc files can be included", stmt.span)
        base = Path(module.file).parent if module.file else Path.cwd()
        try:
            candidates = [(folder / written).resolve() for folder in [base, *self.include_roots[1:]]]
            found = next((c for c in candidates if c.exists()), None)
        except (OSError, RuntimeError) as e:  # a name too long, a symlink loop
            raise _fail(f"cannot include {_quoted(written)}: {getattr(e, 'strerror', None) or e}", stmt.span) from None
        if found is None:
            where = " or the include paths" if len(self.include_roots) > 1 else ""
            raise _fail(f"cannot include {_quoted(written)}: no such file in {self._display_path(str(base))}{where}",
                        stmt.span)
        if not any(found.is_relative_to(root) for root in self.include_roots):
            raise _fail(f"cannot include {_quoted(written)}: {self._display_path(str(found))} is outside "
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
                        raise _fail(f"parameter {stmt.name} is declared twice (first at {first})", stmt.span)
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
            if _is_int(value) and value.bit_length() > self.limits.int_bits:
                raise limit_error("int_bits", f"{value.bit_length():,} bits", self.limits,
                                  what=f"parameter {name} is bound to a number too large")

    def _hoist_definitions(self) -> None:
        """Functions are visible everywhere in the program, so they may call each other in any order."""
        for module in self.modules.values():
            for stmt in module.body:
                if not isinstance(stmt, Def):
                    continue
                if stmt.name in BUILTINS:
                    raise _fail(f"def {stmt.name} would hide the built-in {stmt.name}; choose another name",
                                stmt.span)
                if stmt.name in self.params:
                    raise _fail(f"def {stmt.name}: {stmt.name} is already a parameter", stmt.span)
                previous = self.globals.get(stmt.name)
                if isinstance(previous, Function):
                    raise _fail(f"function {stmt.name} is defined twice (first at {previous.node.span})",
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
            raise _fail("return outside a function", stmt.span)
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
            raise _fail("this statement nests expressions too deeply to evaluate", stmt.span) from None
        except MemoryError:  # the limits should prevent this; if not, a located message still beats a crash
            raise _fail("out of memory while evaluating this statement; lower the sizes it asks for",
                        stmt.span) from None

    def _build(self) -> RegionGraph:
        end = self._end_of_main()
        if self.varset is None:
            raise _fail("no variables declared: start with e.g. `vars x[16] states 256 units 8`", end)
        if self.root is None:
            raise _fail(f"no root region: say which region is the circuit, e.g. `root {self.varset.name}[0:n]`",
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

    # ------------------------------------------------------------------ statements

    def _exec(self, stmt, env: dict) -> _Returned | None:
        return self._exec_by_type[type(stmt)](stmt, env)

    def _exec_block(self, block: Block, env: dict) -> _Returned | None:
        self._step(len(block.body), block.span)
        for stmt in block.body:
            result = self._exec_by_type[type(stmt)](stmt, env)
            if result is not None:
                return result
        return None

    def _at_top(self, env: dict) -> bool:
        return env is self.globals

    def _not_in_block(self, stmt, env: dict) -> None:
        what = {Param: "a parameter declaration", Vars: "the vars declaration", Include: "include",
                Def: "def"}[type(stmt)]
        raise _fail(f"{what} belongs at the top level of a file, not inside a block", stmt.span)

    def _exec_param(self, stmt: Param) -> None:
        default = self._eval(stmt.default, self.globals)
        value = self.bindings.get(stmt.name, default)
        if type(value) is not type(default):
            raise _fail(f"parameter {stmt.name} is {_kind(default)} (default {_show(default)}), "
                        f"but it was bound to {_show(value)}", stmt.span)
        self.globals[stmt.name] = value

    def _exec_vars(self, stmt: Vars) -> None:
        env = self.globals
        if self.vars_node is not None:
            raise _fail(f"variables are declared twice (first at {self.vars_node.span})", stmt.span)
        count = self._positive_int(stmt.count, env, "the number of variables")
        check_at_most("variables", count, self.limits, stmt.count.span)
        if stmt.states is None:
            raise _fail(f"say how many states each variable has: `vars {stmt.name}[...] states 256`", stmt.span)
        self.states = self._positive_int(stmt.states, env, "the number of states")
        check_at_most("states", self.states, self.limits, stmt.states.span)
        if stmt.units is not None:
            self.default_units = self._positive_int(stmt.units, env, "the default number of units")
            check_at_most("units", self.default_units, self.limits, stmt.units.span)
        if stmt.product is not None:
            if stmt.product not in PRODUCTS:
                raise _fail(f"unknown product kind {stmt.product!r}: use hadamard or kronecker", stmt.span)
            self.default_product = stmt.product
        if stmt.name in self.globals or stmt.name in BUILTINS:
            raise _fail(f"the variable set {stmt.name} would hide another name; choose another name", stmt.span)
        self.vars_node = stmt
        self.varset = VarSet(stmt.name, count)
        self.globals[stmt.name] = self.varset

    def _exec_for(self, stmt: For, env: dict) -> _Returned | None:
        items = self._eval(stmt.iterable, env)
        if not isinstance(items, (range, tuple)):
            raise _fail(f"for needs a list or a range like 0..n, got {describe_value(items)}", stmt.iterable.span)
        self._check_length(items, stmt.iterable.span, "a for loop")
        self._check_assignable(stmt.var, env, stmt.span)
        for item in items:
            self._step(1, stmt.span)
            env[stmt.var] = item
            result = self._exec_block(stmt.body, env)
            if result is not None:
                return result
        return None

    def _exec_if(self, stmt: If, env: dict) -> _Returned | None:
        if self._condition(stmt.condition, env):
            return self._exec_block(stmt.then, env)
        if stmt.orelse is not None:
            return self._exec_block(stmt.orelse, env)
        return None

    def _exec_return(self, stmt: Return, env: dict) -> _Returned:
        if self._at_top(env):
            raise _fail("return outside a function", stmt.span)
        return _Returned(self._eval(stmt.value, env))

    def _exec_root(self, stmt: Root, env: dict) -> None:
        region = self._region(stmt.region, env, "the root")
        if self.root is not None:
            raise _fail(f"the root is declared twice (first {self.root.id} at {self.root_span})", stmt.span)
        if stmt.definition is not None:
            self._define_from(region, stmt.definition, stmt.span, env)
        self._materialize(region)
        self.root, self.root_span = region, stmt.span

    def _exec_assign(self, stmt: Assign, env: dict) -> None:
        if isinstance(stmt.target, Name):
            self._check_assignable(stmt.target.id, env, stmt.target.span)
            env[stmt.target.id] = self._eval(stmt.value, env)
            return
        if not isinstance(stmt.target, (Index, Tagged)):
            raise _fail("only a name or a region like x[0:4] can be assigned to", stmt.target.span)
        target = self._region(stmt.target, env, "the left side of a definition")
        self._define_from(target, stmt.value, stmt.span, env)

    def _define_from(self, target: RegionRef, expression, span: SourceSpan | None, env: dict) -> None:
        value = self._eval(expression, env)
        if value == target:  # `R = cp(R)`: the built-in has defined R already
            self._materialize(target)
            return
        self._define(target, self._as_partitions(value, expression.span), span)

    def _exec_set_units(self, stmt: SetUnits, env: dict) -> None:
        region = self._region(stmt.target, env, "`.units =`")
        units = self._positive_int(stmt.value, env, "a unit count")
        check_at_most("units", units, self.limits, stmt.value.span)
        self._materialize(region)
        self._set_units(region.id, units, stmt.span)

    def _exec_expr_stmt(self, stmt: ExprStmt, env: dict) -> None:
        if not isinstance(stmt.expr, Call):
            raise _fail("this statement does nothing: did you mean to assign it, e.g. `x[0:2] = x[0] * x[1]`?",
                        stmt.span)
        self._eval(stmt.expr, env)

    def _check_assignable(self, name: str, env: dict, span) -> None:
        if name in BUILTINS or (self.varset and name == self.varset.name):
            raise _fail(f"cannot assign to {name}: it names {'a built-in' if name in BUILTINS else 'the variables'}",
                        span)
        if self._at_top(env) and (name in self.params or isinstance(self.globals.get(name), Function)):
            raise _fail(f"cannot assign to {name}: it is a {'parameter' if name in self.params else 'function'}",
                        span)

    # ------------------------------------------------------------------ regions and partitions

    def _materialize(self, region: RegionRef) -> _RegionInfo:
        info = self.regions.get(region.id)
        if info is None:
            check_at_most("regions", len(self.regions) + 1, self.limits, region.span)
            self._entries(len(region.scope), region.span)  # a region holds its scope
            info = self.regions[region.id] = _RegionInfo(region.scope, region.span)
        elif info.scope != region.scope:
            raise _fail(f"region {region.id} is used for {scope_name(region.scope, self.varset.name)} here, "
                        f"but for {scope_name(info.scope, self.varset.name)} at {info.span}", region.span)
        return info

    def _set_units(self, region_id: str, units: int, span: SourceSpan | None) -> None:
        info = self.regions[region_id]
        if info.units is not None and info.units != units:
            raise _fail(f"region {region_id} gets {units} units here, but {info.units} at {info.units_span}", span)
        info.units, info.units_span = units, span

    def _as_partitions(self, value: Any, span: SourceSpan | None) -> tuple[Product, ...]:
        if isinstance(value, RegionRef):  # a single child passes its units through
            return (Product(self.default_product, (value,)),)
        if isinstance(value, Product):
            return (value,)
        if isinstance(value, Mixture):
            return value.products
        raise _fail(f"a region is defined by products of regions (A * B | C ** D), got {describe_value(value)}",
                    span)

    def _define(self, target: RegionRef, products: tuple[Product, ...], span: SourceSpan | None) -> None:
        """Give a region its partitions. Defining it again identically is harmless (recursive
        definitions often reach a shared region twice); defining it differently is an error."""
        info = self._materialize(target)
        for product in products:
            for child in product.children:
                self._materialize(child)
        key = tuple((p.kind, tuple(c.id for c in p.children)) for p in products)
        previous = self.definitions.get(target.id)
        if previous is not None:
            if previous.key == key:
                return
            raise _fail(f"region {target.id} is already defined at {previous.span} with other partitions; "
                        f"write all its partitions in one definition: R = A * B | C * D", span)
        self.definitions[target.id] = _Definition(key, span)
        info.span = span  # messages about a defined region point at its definition
        for product in products:
            self.partitions.append((target.id, product, span))

    def _region_ref(self, scope: tuple[int, ...], tag: str | None, span) -> RegionRef:
        rid = scope_name(scope, self.varset.name)
        return RegionRef(rid if tag is None else f"{rid}@{tag}", scope, tag, span)

    # ------------------------------------------------------------------ expressions

    def _eval(self, node, env: dict) -> Any:
        return self._eval_by_type[type(node)](node, env)

    def _step(self, cost: int, span: SourceSpan | None) -> None:
        """Count `cost` steps of work (a loop turn, the entries of a scope or a list)."""
        self.steps += cost
        if self.steps > self.limits.steps:
            raise self._too_many_steps(span)

    def _entries(self, count: int, span: SourceSpan | None) -> None:
        self.entries += count
        if self.entries > self.limits.scope_entries:
            raise limit_error("scope_entries", self.entries, self.limits, span,
                              what="the regions' scopes name too many variables in all")

    def _too_many_steps(self, span: SourceSpan | None) -> CircuitError:
        return limit_error("steps", self.steps, self.limits, span,
                           what="the program takes too many evaluation steps (is a recursion exponential?)")

    def _check_length(self, items: range | tuple, span: SourceSpan | None, what: str) -> None:
        check_at_most("loop", _length(items), self.limits, span, what=f"{what} is too long")

    def _eval_literal(self, node, env: dict) -> Any:
        return node.value

    def _eval_name(self, node: Name, env: dict) -> Any:
        if node.id in env:
            return env[node.id]
        if node.id in self.globals:
            return self.globals[node.id]
        if node.id in BUILTINS:
            return BUILTINS[node.id]
        raise _fail(f"unknown name {node.id}" + self._name_hint(node.id), node.span)

    def _name_hint(self, name: str) -> str:
        for module in self.modules.values():
            for stmt in module.body:
                if isinstance(stmt, (Param, Vars)) and stmt.name == name:
                    return f" yet (it is declared at {stmt.span}; declarations run in order)"
        return ""

    def _condition(self, node, env: dict) -> bool:
        value = self._eval(node, env)
        if not isinstance(value, bool):
            raise _fail(f"a condition must be true or false, got {describe_value(value)}", node.span)
        return value

    def _int(self, node, env: dict, what: str = "a number") -> int:
        value = self._eval(node, env)
        if not _is_int(value):
            raise _fail(f"{what} must be a number, got {describe_value(value)}", node.span)
        return value

    def _positive_int(self, node, env: dict, what: str) -> int:
        value = self._int(node, env, what)
        if value < 1:
            raise _fail(f"{what} must be at least 1, got {value}", node.span)
        return value

    def _region(self, node, env: dict, what: str) -> RegionRef:
        value = self._eval(node, env)
        if not isinstance(value, RegionRef):
            raise _fail(f"{what} must be a region like x[0:4], got {describe_value(value)}", node.span)
        return value

    def _eval_binop(self, node: BinOp, env: dict) -> Any:
        if node.op in ("and", "or"):
            left = self._condition(node.left, env)
            if left == (node.op == "or"):  # short-circuit
                return left
            return self._condition(node.right, env)
        # Walk a left-leaning chain (`x[0] * x[1] * ... * x[4095]`, as generated files write it)
        # in a loop rather than by recursion.
        chain = [node]
        while isinstance(chain[-1].left, BinOp) and chain[-1].left.op not in ("and", "or"):
            chain.append(chain[-1].left)
        value = self._eval(chain[-1].left, env)
        for link in reversed(chain):
            value = self._apply(link, value, self._eval(link.right, env))
        return value

    def _apply(self, node: BinOp, left: Any, right: Any) -> Any:
        op = node.op
        if _is_int(left) and _is_int(right):
            return self._int_op(op, left, right, node)
        if op in ("*", "**"):
            return self._multiply(op, left, right, node)
        if op == "|":
            return Mixture(self._as_partitions(left, node.left.span) + self._as_partitions(right, node.right.span))
        if op == "==":
            return left == right
        if op == "!=":
            return left != right
        if op == "+" and isinstance(left, (tuple, range)) and isinstance(right, (tuple, range)):
            total = _length(left) + _length(right)
            check_at_most("loop", total, self.limits, node.span, what="a list is too long")
            self._entries(total, node.span)
            return tuple(left) + tuple(right)
        raise _fail(f"cannot apply {op} to {describe_value(left)} and {describe_value(right)}", node.span)

    def _int_op(self, op: str, a: int, b: int, node: BinOp) -> Any:
        if op in ("//", "%") and b == 0:
            raise _fail("division by zero", node.right.span)
        if op == "|":
            raise _fail("| separates partitions of a region; it does not apply to numbers", node.span)
        if op == "**" and b < 0:
            raise _fail(f"negative exponent {b}: numbers here are integers", node.right.span)
        # the result's size, bounded before it is computed
        if op in ("+", "-", "*", "**"):
            la, lb = a.bit_length(), b.bit_length()
            if op == "**":
                bits = 0 if abs(a) <= 1 else min(b, self.limits.int_bits + 1) * (la - 1)
            else:
                bits = la + lb if op == "*" else max(la, lb) + 1
            if bits > self.limits.int_bits:
                shown = f"{a} {op} {b}" if la + lb < 200 else f"the result of {op}"
                raise limit_error("int_bits", f"at least {bits:,} bits", self.limits, node.span,
                                  what=f"{shown} is too large")
        return _INT_OPS[op](a, b)

    def _multiply(self, op: str, left: Any, right: Any, node: BinOp) -> Product:
        """`A * B * C` is one partition with three children (`*` uses the declared product kind,
        `**` is always kronecker); nesting the other kind inside needs a named region."""
        kind = "kronecker" if op == "**" else self.default_product
        children: list[RegionRef] = []
        for operand, side in ((left, node.left), (right, node.right)):
            if isinstance(operand, RegionRef):
                children.append(operand)
            elif isinstance(operand, Product) and (operand.kind == kind or len(operand.children) == 1):
                children.extend(operand.children)
            elif isinstance(operand, Product):
                raise _fail(f"cannot use a {operand.kind} product inside a {kind} product: make it a region "
                            f"first, e.g. `{scope_name(_union(operand.children), self.varset.name)} = ...`",
                            side.span)
            else:
                raise _fail(f"cannot apply {op} to {describe_value(left)} and {describe_value(right)}", node.span)
        return Product(kind, tuple(children))

    def _eval_unary(self, node: UnaryOp, env: dict) -> Any:
        if node.op == "not":
            return not self._condition(node.operand, env)
        return -self._int(node.operand, env)

    def _eval_call(self, node: Call, env: dict) -> Any:
        func = self._eval(node.func, env)
        args = [self._eval(a, env) for a in node.args]
        kwargs = {}
        for kw in node.kwargs:
            if kw.name in kwargs:
                raise _fail(f"argument {kw.name} is given twice", kw.span)
            kwargs[kw.name] = (self._eval(kw.value, env), kw.span)
        if isinstance(func, Builtin):
            return func.run(self, args, kwargs, node)
        if isinstance(func, Function):
            return self._call_function(func.node, args, kwargs, node)
        raise _fail(f"{describe_value(func)} is not a function", node.func.span)

    def _call_function(self, fn: Def, args: list, kwargs: dict, node: Call) -> Any:
        env = self._bind_arguments(fn, args, kwargs, node)
        if self.depth >= self.limits.call_depth:
            raise limit_error("call_depth", None, self.limits, node.span,
                              what=f"recursion too deep: more than {self.limits.call_depth} nested calls (here "
                                   f"{fn.name}); recursion is meant for trees, write long chains with a for loop")
        self._step(1, node.span)
        self.depth += 1
        try:
            result = self._exec_block(fn.body, env)
        except CircuitError as e:
            raise _with_call_note(e, fn, env, node) from None
        finally:
            self.depth -= 1
        return result.value if result is not None else None

    def _bind_arguments(self, fn: Def, args: list, kwargs: dict, node: Call) -> dict:
        params = {p.name: _REQUIRED if p.default is None else p.default for p in fn.params}
        # A default is an expression, evaluated in the file's globals only when it is used.
        return _bind_call(fn.name, params, args, kwargs, node, lambda default: self._eval(default, self.globals))

    def _eval_index(self, node: Index, env: dict) -> Any:
        base = self._eval(node.base, env)
        if isinstance(base, VarSet):
            return self._region_ref(self._scope(base, node, env), None, node.span)
        if isinstance(base, (tuple, range)):
            if len(node.subscripts) != 1 or isinstance(node.subscripts[0], Slice):
                raise _fail("a list takes one index, like xs[i]", node.span)
            i = self._int(node.subscripts[0], env, "an index")
            if not -_length(base) <= i < _length(base):
                raise _fail(f"index {i} is out of range for a list of {_length(base)}", node.subscripts[0].span)
            return base[i]
        raise _fail(f"cannot index {describe_value(base)}", node.base.span)

    def _scope(self, varset: VarSet, node: Index, env: dict) -> tuple[int, ...]:
        """The variables a subscript list names: `x[0:4]`, `x[3]`, `x[0, 2, 5:7]`, `x[evens]`."""
        if len(node.subscripts) == 1:  # the common `x[a:b]`: checked by its ends, built in C
            indices = self._subscript_indices(varset, node.subscripts[0], env)
            if isinstance(indices, range) and indices.step == 1 and 0 <= indices.start < indices.stop <= varset.count:
                self._entries(_length(indices), node.span)
                return tuple(indices)
        seen: set[int] = set()
        for sub in node.subscripts:
            indices = self._subscript_indices(varset, sub, env)
            self._entries(min(_length(indices), varset.count + 1), sub.span)
            for i in indices:
                if not 0 <= i < varset.count:
                    raise _fail(f"variable {varset.name}{i} does not exist: there are {varset.count} variables, "
                                f"{varset.name}0 .. {varset.name}{varset.count - 1}", sub.span)
                if i in seen:
                    raise _fail(f"{varset.name}{i} is named twice", sub.span)
                seen.add(i)
        if not seen:
            raise _fail("a region needs at least one variable", node.span)
        return tuple(sorted(seen))

    def _subscript_indices(self, varset: VarSet, sub, env: dict) -> range | tuple:
        if isinstance(sub, Slice):
            start = 0 if sub.start is None else self._int(sub.start, env, "a slice bound")
            stop = varset.count if sub.stop is None else self._int(sub.stop, env, "a slice bound")
            # a slice past the end names a missing variable: clip it so the message comes at once
            return range(start, min(stop, max(start, varset.count) + 1))
        value = self._eval(sub, env)
        if _is_int(value):
            return (value,)
        if isinstance(value, range) or (isinstance(value, tuple) and all(_is_int(i) for i in value)):
            return value
        raise _fail(f"variables are chosen by numbers, slices or lists of numbers, got {describe_value(value)}",
                    sub.span)

    def _eval_tagged(self, node: Tagged, env: dict) -> RegionRef:
        base = self._eval(node.base, env)
        if isinstance(base, VarSet):  # `x@a`: the region over all variables, tagged
            self._entries(base.count, node.span)
            base = self._region_ref(tuple(range(base.count)), None, node.span)
        if not isinstance(base, RegionRef):
            raise _fail(f"only regions take a tag, got {describe_value(base)}", node.base.span)
        region = base
        if region.tag is not None:
            raise _fail(f"region {region.id} already has a tag", node.span)
        tag = self._eval(node.tag, env)
        if not (_is_int(tag) or (isinstance(tag, str) and tag)):
            raise _fail(f"a tag is a name, a string or a number, got {describe_value(tag)}", node.tag.span)
        return self._region_ref(region.scope, str(tag), node.span)

    def _eval_list(self, node: ListLit, env: dict) -> tuple:
        return tuple(self._eval(item, env) for item in node.items)

    def _eval_list_comp(self, node: ListComp, env: dict) -> tuple:
        items = self._eval(node.iterable, env)
        if not isinstance(items, (range, tuple)):
            raise _fail(f"for needs a list or a range like 0..n, got {describe_value(items)}", node.iterable.span)
        self._check_length(items, node.iterable.span, "a list comprehension")
        inner = dict(env)  # the loop variable stays inside the brackets
        result = []
        for item in items:
            self._step(1, node.span)
            inner[node.var] = item
            if node.condition is None or self._condition(node.condition, inner):
                result.append(self._eval(node.element, inner))
        return tuple(result)


def _with_call_note(error: CircuitError, fn: Def, env: dict, node: Call) -> CircuitError:
    """Add where the innermost failing call came from (`note: in tree(lo=4, hi=4)`), once."""
    if any(d.severity == "note" for d in error.diagnostics):
        return error
    arguments = ", ".join(f"{p.name}={_show_argument(env.get(p.name))}" for p in fn.params)
    note = Diagnostic(f"in {fn.name}({arguments}), called here", node.span, severity="note")
    return CircuitError(error.diagnostics + [note])


def _show_argument(value: Any) -> str:
    if isinstance(value, (bool, int, str)):
        return _show(value)
    return value.id if isinstance(value, RegionRef) else describe_value(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _length(items: range | tuple) -> int:
    """len() of a list or range, exact however long (len(range(10**70)) overflows in Python)."""
    if isinstance(items, range):
        return max(0, (items.stop - items.start + items.step - (1 if items.step > 0 else -1)) // items.step)
    return len(items)


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (text decoded with surrogateescape)
        return False
    return True


def _quoted(text: str) -> str:
    """A user-written string in a message: quoted, escaped, cut at 80 characters."""
    shown = text.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
    shown = "".join(ch if ord(ch) >= 32 else f"\\x{ord(ch):02x}" for ch in shown)
    return '"' + (shown if len(shown) <= 80 else shown[:77] + "...") + '"'


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "a number", str: "a string"}.get(type(value), "a value")


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else str(value)


def _union(regions) -> tuple[int, ...]:
    return tuple(sorted({i for r in regions for i in r.scope}))


_INT_OPS: dict[str, Callable[[int, int], Any]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "//": lambda a, b: a // b,
    "%": lambda a, b: a % b, "**": lambda a, b: a ** b, "..": range,
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


# ----------------------------------------------------------------------------- built-in functions

def _bind_call(name: str, params: dict[str, Any], args: list, kwargs: dict, node: Call,
               resolve_default=lambda default: default) -> dict[str, Any]:
    """Match a call's arguments to a function's parameters (`params`: name -> default; a default
    of `_REQUIRED` must be given), for user functions and built-ins alike."""
    names = list(params)
    signature = f"{name}({', '.join(names)})"
    if len(args) > len(names):
        bound_word = "" if all(d is _REQUIRED for d in params.values()) else "at most "
        plural = "s" if len(names) != 1 else ""
        raise _fail(f"{signature} takes {bound_word}{len(names)} argument{plural}, got {len(args)}", node.span)
    bound = dict(zip(names, args))
    for key, (value, span) in kwargs.items():
        if key not in params:
            raise _fail(f"{signature} has no parameter {key}", span)
        if key in bound:
            raise _fail(f"{signature}: argument {key} is given twice", span)
        bound[key] = value
    for key, default in params.items():
        if key not in bound:
            if default is _REQUIRED:
                raise _fail(f"{signature}: missing argument {key}", node.span)
            bound[key] = resolve_default(default)
    return bound


_REQUIRED = object()
_DEFAULT_UNITS = object()  # stands for the declared default units


def _structure_builtin(name: str, generator: Callable, options: dict[str, Any], doc: str) -> Builtin:
    """A built-in generator from circuitc.builders: it adds its regions over the scope of its first
    argument (a region or the variable set; a tag on the region tags all of its regions) and
    returns the region covering that scope."""
    params = {"region": _REQUIRED, **options}

    def run(el: _Elaborator, args: list, kwargs: dict, node: Call) -> RegionRef:
        if el.varset is None:
            raise _fail(f"{name}: declare the variables first, e.g. `vars x[16] states 256`", node.span)
        bound = _bind_call(name, params, args, kwargs, node)
        region = bound.pop("region")
        if isinstance(region, VarSet):
            el._entries(region.count, node.span)
            region = el._region_ref(tuple(range(region.count)), None, node.span)
        if not isinstance(region, RegionRef):
            raise _fail(f"{name} builds over a region like x[0:n] (or the variable set), got "
                        f"{describe_value(region)}", node.args[0].span if node.args else node.span)
        for key in ("units", "top", "depth", "repetitions"):
            if key in bound and bound[key] is _DEFAULT_UNITS:
                bound[key] = el.default_units
            if key in bound and bound[key] is not None and not (_is_int(bound[key]) and bound[key] >= 1):
                raise _fail(f"{name}: {key} must be a number of at least 1, got {describe_value(bound[key])}",
                            node.span)
        if "seed" in bound and not _is_int(bound["seed"]):
            raise _fail(f"{name}: seed must be a number, got {describe_value(bound['seed'])}", node.span)
        for key, limit in (("units", "units"), ("top", "units"), ("repetitions", "repetitions")):
            if key in bound:
                check_at_most(limit, bound[key], el.limits, node.span, what=f"{name}: {key} is too large")
        # a generator is deterministic: the same call again adds nothing, so it is not run again
        key = (name, region.id, tuple(sorted(bound.items())))
        if key not in el.generated:
            el.generated[key] = _merge_structure(el, generator, region, bound, node)
        return el.generated[key]

    return Builtin(name, run, f"{name}({', '.join(params)})  {doc}")


def _merge_structure(el: _Elaborator, generator: Callable, region: RegionRef, options: dict[str, Any],
                     node: Call) -> RegionRef:
    # the builder stops at the regions still allowed, before generating more
    b = GraphBuilder(el.varset.name, max_regions=el.limits.regions - len(el.regions) + 1,
                     max_entries=el.limits.scope_entries - el.entries + 1)
    keywords = {"top_units": options.pop("top")} if "top" in options else {}
    try:
        top = generator(b, region.scope, *([options.pop("units")] if "units" in options else []), **keywords,
                        **options)
    except builders.BuilderLimit as e:
        if e.args[0] == "regions":
            raise limit_error("regions", f"more than {el.limits.regions:,}", el.limits, node.span,
                              what="this structure has too many regions") from None
        raise limit_error("scope_entries", f"more than {el.limits.scope_entries:,}", el.limits, node.span,
                          what="this structure's scopes name too many variables in all") from None
    # generating is work even where the regions exist already: its scopes, and steps per region
    # (merging a region costs about as much as running a few statements)
    el._entries(el.limits.scope_entries - el.entries + 1 - b.entries_left, node.span)
    el._step(STEPS_PER_GENERATED_REGION * len(b.regions), node.span)

    def ref(rid: str) -> RegionRef:
        return RegionRef(rid if region.tag is None else f"{rid}@{region.tag}", b.regions[rid].scope, region.tag,
                         node.span)

    for rid, generated in b.regions.items():
        el._materialize(ref(rid))
        el._set_units(ref(rid).id, generated.units, node.span)
    by_parent: dict[str, list[Product]] = {}
    for p in b.partitions:
        by_parent.setdefault(p.parent, []).append(Product(p.product, tuple(ref(c) for c in p.children)))
    for parent, products in by_parent.items():
        el._define(ref(parent), tuple(products), node.span)
    return ref(top)


def _product_builtin(name: str, kind: str | None) -> Builtin:
    def run(el: _Elaborator, args: list, kwargs: dict, node: Call) -> Product:
        if kwargs:
            raise _fail(f"{name} takes no keyword arguments", node.span)
        regions = args[0] if len(args) == 1 and isinstance(args[0], tuple) else tuple(args)
        if not regions or not all(isinstance(r, RegionRef) for r in regions):
            raise _fail(f"{name} multiplies regions: {name}([x[0], x[1]]) or {name}(x[0], x[1])", node.span)
        return Product(kind or el.default_product, tuple(regions))

    what = f"a {kind} product" if kind else "a product of the declared kind"
    return Builtin(name, run, f"{name}(regions)  {what} of a list of regions, like A * B * ...")


def _run_len(el: _Elaborator, args: list, kwargs: dict, node: Call) -> int:
    if kwargs or len(args) != 1 or not isinstance(args[0], (tuple, range, RegionRef)):
        raise _fail("len takes one list or region", node.span)
    return len(args[0].scope) if isinstance(args[0], RegionRef) else _length(args[0])


def _run_range(el: _Elaborator, args: list, kwargs: dict, node: Call) -> range:
    if kwargs or not 1 <= len(args) <= 3 or not all(_is_int(a) for a in args):
        raise _fail("range takes 1 to 3 numbers: range(stop), range(start, stop), range(start, stop, step)",
                    node.span)
    if len(args) == 3 and args[2] == 0:
        raise _fail("range step must not be 0", node.span)
    return range(*args)


def _min_max(name: str, pick: Callable) -> Builtin:
    def run(el: _Elaborator, args: list, kwargs: dict, node: Call) -> int:
        values = args[0] if len(args) == 1 and isinstance(args[0], (tuple, range)) else args
        if isinstance(values, range) and values and not kwargs:  # by its ends: 0..10**70 is not walked
            return pick(values[0], values[-1])
        if kwargs or not values or not all(_is_int(v) for v in values):
            raise _fail(f"{name} takes numbers: {name}(a, b, ...) or {name}(list)", node.span)
        return pick(values)

    return Builtin(name, run, f"{name}(a, b, ...)  the {'smallest' if name == 'min' else 'largest'} number")


BUILTINS: dict[str, Builtin] = {
    "ff": _structure_builtin("ff", builders.ff, {},
                             "fully factorised: one partition into single variables, 1 unit everywhere"),
    "cp": _structure_builtin("cp", builders.cp, {"units": _DEFAULT_UNITS, "top": 1},
                             "canonical polyadic: one hadamard partition into single variables"),
    "hmm": _structure_builtin("hmm", builders.hmm, {"units": _DEFAULT_UNITS, "top": 1},
                              "hidden Markov chain: x[i:] = x[i] * x[i+1:]"),
    "btree": _structure_builtin("btree", builders.btree, {"units": _DEFAULT_UNITS, "top": 1},
                                "balanced binary tree: split in halves recursively"),
    "random_tree": _structure_builtin("random_tree", builders.random_tree,
                                      {"units": _DEFAULT_UNITS, "top": 1, "depth": None, "repetitions": 1, "seed": 0},
                                      "RAT-SPN: random balanced splits of random permutations, mixed at the top"),
    "prod": _product_builtin("prod", None),
    "hadamard": _product_builtin("hadamard", "hadamard"),
    "kron": _product_builtin("kron", "kronecker"),
    "len": Builtin("len", _run_len, "len(list or region)  its length / number of variables"),
    "range": Builtin("range", _run_range, "range(start, stop, step)  like start..stop, with a step"),
    "min": _min_max("min", min),
    "max": _min_max("max", max),
}
