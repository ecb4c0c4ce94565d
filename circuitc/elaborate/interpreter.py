"""The interpreter: statements run in order against an environment (the program's globals, or a
call's locals) and expressions evaluate to plain values (`values`), located errors otherwise.
They are one class because they call each other by nature: statements evaluate expressions, and a
call to a user function runs its body's statements. Each syntax node type has one rule, found in a
`dict[type, method]`; operators on values are in `operators`, built-ins in `builtin_functions`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import CircuitError, Diagnostic, SourceSpan
from ..graph import PRODUCTS
from ..limits import check_at_most, limit_error
from ..syntax import (Assign, BinOp, Block, Bool, Call, Def, ExprStmt, For, If, Include, Index, Int, ListComp, ListLit,
                      Module, Name, Param, Return, Root, SetUnits, Slice, Str, Tagged, UnaryOp, Vars)
from .builtin_functions import BUILTINS, BuiltinContext
from .operators import apply_binary, as_partitions
from .state import ElaborationState
from .values import (REQUIRED, Builtin, Function, RegionRef, VarSet, bind_call, describe_value, fail, is_int,
                     kind_name, length, show_argument, show_value)


@dataclass(frozen=True)
class Returned:
    """A `return` ran: the enclosing blocks stop, and the call evaluates to `value`."""

    value: Any


class Interpreter:
    """Runs one program's statements (`run_top` for each top-level one, in order) on `state`."""

    def __init__(self, state: ElaborationState, program: Iterable[Module]):
        self.state = state
        self.program = tuple(program)  # every file, for hints about names declared further on
        self.builtins = BuiltinContext(state.declared, state.regions, state.work, state.limits)
        self.depth = 0  # user function calls in progress
        # Statements inside blocks; declarations are handled by `run_top` only.
        self._exec_by_type = {
            Param: self._not_in_block, Vars: self._not_in_block, Include: self._not_in_block,
            Def: self._not_in_block, For: self._exec_for, If: self._exec_if, Return: self._exec_return,
            Root: self._exec_root, Assign: self._exec_assign, SetUnits: self._exec_set_units,
            ExprStmt: self._exec_expr_stmt,
        }
        self._eval_by_type = {
            Int: self._eval_literal, Str: self._eval_literal, Bool: self._eval_literal, Name: self._eval_name,
            BinOp: self._eval_binop, UnaryOp: self._eval_unary, Call: self._eval_call, Index: self._eval_index,
            Tagged: self._eval_tagged, ListLit: self._eval_list, ListComp: self._eval_list_comp,
        }

    def run_top(self, stmt) -> None:
        """Run a statement at the top level of a file (not an `include` or a `def`: the program
        follows includes, and functions are hoisted before anything runs)."""
        if isinstance(stmt, Return):
            raise fail("return outside a function", stmt.span)
        try:
            if isinstance(stmt, Param):
                self._exec_param(stmt)
            elif isinstance(stmt, Vars):
                self._exec_vars(stmt)
            else:
                self._exec(stmt, self.state.globals)
        except RecursionError:  # nesting far beyond anything written by hand
            raise fail("this statement nests expressions too deeply to evaluate", stmt.span) from None
        except MemoryError:  # the limits should prevent this; if not, a located message still beats a crash
            raise fail("out of memory while evaluating this statement; lower the sizes it asks for",
                       stmt.span) from None

    # ------------------------------------------------------------------ statements

    def _exec(self, stmt, env: dict) -> Returned | None:
        return self._exec_by_type[type(stmt)](stmt, env)

    def _exec_block(self, block: Block, env: dict) -> Returned | None:
        self.state.work.step(len(block.body), block.span)
        for stmt in block.body:
            result = self._exec_by_type[type(stmt)](stmt, env)
            if result is not None:
                return result
        return None

    def _at_top(self, env: dict) -> bool:
        return env is self.state.globals

    def _not_in_block(self, stmt, env: dict) -> None:
        what = {Param: "a parameter declaration", Vars: "the vars declaration", Include: "include",
                Def: "def"}[type(stmt)]
        raise fail(f"{what} belongs at the top level of a file, not inside a block", stmt.span)

    def _exec_param(self, stmt: Param) -> None:
        default = self._eval(stmt.default, self.state.globals)
        value = self.state.bindings.get(stmt.name, default)
        if type(value) is not type(default):
            raise fail(f"parameter {stmt.name} is {kind_name(default)} (default {show_value(default)}), "
                       f"but it was bound to {show_value(value)}", stmt.span)
        self.state.globals[stmt.name] = value

    def _exec_vars(self, stmt: Vars) -> None:
        env, declared, limits = self.state.globals, self.state.declared, self.state.limits
        if declared.vars_node is not None:
            raise fail(f"variables are declared twice (first at {declared.vars_node.span})", stmt.span)
        count = self._positive_int(stmt.count, env, "the number of variables")
        check_at_most("variables", count, limits, stmt.count.span)
        if stmt.states is None:
            raise fail(f"say how many states each variable has: `vars {stmt.name}[...] states 256`", stmt.span)
        declared.states = self._positive_int(stmt.states, env, "the number of states")
        check_at_most("states", declared.states, limits, stmt.states.span)
        if stmt.units is not None:
            declared.default_units = self._positive_int(stmt.units, env, "the default number of units")
            check_at_most("units", declared.default_units, limits, stmt.units.span)
        if stmt.product is not None:
            if stmt.product not in PRODUCTS:
                raise fail(f"unknown product kind {stmt.product!r}: use hadamard or kronecker", stmt.span)
            declared.default_product = stmt.product
        if stmt.name in env or stmt.name in BUILTINS:
            raise fail(f"the variable set {stmt.name} would hide another name; choose another name", stmt.span)
        declared.vars_node = stmt
        declared.varset = VarSet(stmt.name, count)
        env[stmt.name] = declared.varset

    def _exec_for(self, stmt: For, env: dict) -> Returned | None:
        items = self._eval(stmt.iterable, env)
        if not isinstance(items, (range, tuple)):
            raise fail(f"for needs a list or a range like 0..n, got {describe_value(items)}", stmt.iterable.span)
        self.state.work.check_length(items, stmt.iterable.span, "a for loop")
        self._check_assignable(stmt.var, env, stmt.span)
        for item in items:
            self.state.work.step(1, stmt.span)
            env[stmt.var] = item
            result = self._exec_block(stmt.body, env)
            if result is not None:
                return result
        return None

    def _exec_if(self, stmt: If, env: dict) -> Returned | None:
        if self._condition(stmt.condition, env):
            return self._exec_block(stmt.then, env)
        if stmt.orelse is not None:
            return self._exec_block(stmt.orelse, env)
        return None

    def _exec_return(self, stmt: Return, env: dict) -> Returned:
        if self._at_top(env):
            raise fail("return outside a function", stmt.span)
        return Returned(self._eval(stmt.value, env))

    def _exec_root(self, stmt: Root, env: dict) -> None:
        region = self._region(stmt.region, env, "the root")
        declared = self.state.declared
        if declared.root is not None:
            raise fail(f"the root is declared twice (first {declared.root.id} at {declared.root_span})", stmt.span)
        if stmt.definition is not None:
            self._define_from(region, stmt.definition, stmt.span, env)
        self.state.regions.materialize(region)
        declared.root, declared.root_span = region, stmt.span

    def _exec_assign(self, stmt: Assign, env: dict) -> None:
        if isinstance(stmt.target, Name):
            self._check_assignable(stmt.target.id, env, stmt.target.span)
            env[stmt.target.id] = self._eval(stmt.value, env)
            return
        if not isinstance(stmt.target, (Index, Tagged)):
            raise fail("only a name or a region like x[0:4] can be assigned to", stmt.target.span)
        target = self._region(stmt.target, env, "the left side of a definition")
        self._define_from(target, stmt.value, stmt.span, env)

    def _define_from(self, target: RegionRef, expression, span: SourceSpan | None, env: dict) -> None:
        value = self._eval(expression, env)
        if value == target:  # `R = cp(R)`: the built-in has defined R already
            self.state.regions.materialize(target)
            return
        self.state.regions.define(target, as_partitions(value, expression.span, self.state.declared), span)

    def _exec_set_units(self, stmt: SetUnits, env: dict) -> None:
        region = self._region(stmt.target, env, "`.units =`")
        units = self._positive_int(stmt.value, env, "a unit count")
        check_at_most("units", units, self.state.limits, stmt.value.span)
        self.state.regions.materialize(region)
        self.state.regions.set_units(region.id, units, stmt.span)

    def _exec_expr_stmt(self, stmt: ExprStmt, env: dict) -> None:
        if not isinstance(stmt.expr, Call):
            raise fail("this statement does nothing: did you mean to assign it, e.g. `x[0:2] = x[0] * x[1]`?",
                       stmt.span)
        self._eval(stmt.expr, env)

    def _check_assignable(self, name: str, env: dict, span) -> None:
        varset, params = self.state.declared.varset, self.state.params
        if name in BUILTINS or (varset and name == varset.name):
            raise fail(f"cannot assign to {name}: it names {'a built-in' if name in BUILTINS else 'the variables'}",
                       span)
        if self._at_top(env) and (name in params or isinstance(self.state.globals.get(name), Function)):
            raise fail(f"cannot assign to {name}: it is a {'parameter' if name in params else 'function'}", span)

    # ------------------------------------------------------------------ expressions

    def _eval(self, node, env: dict) -> Any:
        return self._eval_by_type[type(node)](node, env)

    def _eval_literal(self, node, env: dict) -> Any:
        return node.value

    def _eval_name(self, node: Name, env: dict) -> Any:
        if node.id in env:
            return env[node.id]
        if node.id in self.state.globals:
            return self.state.globals[node.id]
        if node.id in BUILTINS:
            return BUILTINS[node.id]
        raise fail(f"unknown name {node.id}" + self._name_hint(node.id), node.span)

    def _name_hint(self, name: str) -> str:
        for module in self.program:
            for stmt in module.body:
                if isinstance(stmt, (Param, Vars)) and stmt.name == name:
                    return f" yet (it is declared at {stmt.span}; declarations run in order)"
        return ""

    def _condition(self, node, env: dict) -> bool:
        value = self._eval(node, env)
        if not isinstance(value, bool):
            raise fail(f"a condition must be true or false, got {describe_value(value)}", node.span)
        return value

    def _int(self, node, env: dict, what: str = "a number") -> int:
        value = self._eval(node, env)
        if not is_int(value):
            raise fail(f"{what} must be a number, got {describe_value(value)}", node.span)
        return value

    def _positive_int(self, node, env: dict, what: str) -> int:
        value = self._int(node, env, what)
        if value < 1:
            raise fail(f"{what} must be at least 1, got {value}", node.span)
        return value

    def _region(self, node, env: dict, what: str) -> RegionRef:
        value = self._eval(node, env)
        if not isinstance(value, RegionRef):
            raise fail(f"{what} must be a region like x[0:4], got {describe_value(value)}", node.span)
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
            value = apply_binary(link, value, self._eval(link.right, env), self.state.declared, self.state.work)
        return value

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
                raise fail(f"argument {kw.name} is given twice", kw.span)
            kwargs[kw.name] = (self._eval(kw.value, env), kw.span)
        if isinstance(func, Builtin):
            return func.run(self.builtins, args, kwargs, node)
        if isinstance(func, Function):
            return self._call_function(func.node, args, kwargs, node)
        raise fail(f"{describe_value(func)} is not a function", node.func.span)

    def _call_function(self, fn: Def, args: list, kwargs: dict, node: Call) -> Any:
        env = self._bind_arguments(fn, args, kwargs, node)
        limits = self.state.limits
        if self.depth >= limits.call_depth:
            raise limit_error("call_depth", None, limits, node.span,
                              what=f"recursion too deep: more than {limits.call_depth} nested calls (here "
                                   f"{fn.name}); recursion is meant for trees, write long chains with a for loop")
        self.state.work.step(1, node.span)
        self.depth += 1
        try:
            result = self._exec_block(fn.body, env)
        except CircuitError as e:
            raise _with_call_note(e, fn, env, node) from None
        finally:
            self.depth -= 1
        return result.value if result is not None else None

    def _bind_arguments(self, fn: Def, args: list, kwargs: dict, node: Call) -> dict:
        params = {p.name: REQUIRED if p.default is None else p.default for p in fn.params}
        # A default is an expression, evaluated in the file's globals only when it is used.
        return bind_call(fn.name, params, args, kwargs, node, lambda default: self._eval(default, self.state.globals))

    def _eval_index(self, node: Index, env: dict) -> Any:
        base = self._eval(node.base, env)
        if isinstance(base, VarSet):
            return self.state.regions.ref(self._scope(base, node, env), None, node.span)
        if isinstance(base, (tuple, range)):
            if len(node.subscripts) != 1 or isinstance(node.subscripts[0], Slice):
                raise fail("a list takes one index, like xs[i]", node.span)
            i = self._int(node.subscripts[0], env, "an index")
            if not -length(base) <= i < length(base):
                raise fail(f"index {i} is out of range for a list of {length(base)}", node.subscripts[0].span)
            return base[i]
        raise fail(f"cannot index {describe_value(base)}", node.base.span)

    def _scope(self, varset: VarSet, node: Index, env: dict) -> tuple[int, ...]:
        """The variables a subscript list names: `x[0:4]`, `x[3]`, `x[0, 2, 5:7]`, `x[evens]`."""
        work = self.state.work
        if len(node.subscripts) == 1:  # the common `x[a:b]`: checked by its ends, built in C
            indices = self._subscript_indices(varset, node.subscripts[0], env)
            if isinstance(indices, range) and indices.step == 1 and 0 <= indices.start < indices.stop <= varset.count:
                work.enter(length(indices), node.span)
                return tuple(indices)
        seen: set[int] = set()
        for sub in node.subscripts:
            indices = self._subscript_indices(varset, sub, env)
            work.enter(min(length(indices), varset.count + 1), sub.span)
            for i in indices:
                if not 0 <= i < varset.count:
                    raise fail(f"variable {varset.name}{i} does not exist: there are {varset.count} variables, "
                               f"{varset.name}0 .. {varset.name}{varset.count - 1}", sub.span)
                if i in seen:
                    raise fail(f"{varset.name}{i} is named twice", sub.span)
                seen.add(i)
        if not seen:
            raise fail("a region needs at least one variable", node.span)
        return tuple(sorted(seen))

    def _subscript_indices(self, varset: VarSet, sub, env: dict) -> range | tuple:
        if isinstance(sub, Slice):
            start = 0 if sub.start is None else self._int(sub.start, env, "a slice bound")
            stop = varset.count if sub.stop is None else self._int(sub.stop, env, "a slice bound")
            # a slice past the end names a missing variable: clip it so the message comes at once
            return range(start, min(stop, max(start, varset.count) + 1))
        value = self._eval(sub, env)
        if is_int(value):
            return (value,)
        if isinstance(value, range) or (isinstance(value, tuple) and all(is_int(i) for i in value)):
            return value
        raise fail(f"variables are chosen by numbers, slices or lists of numbers, got {describe_value(value)}",
                   sub.span)

    def _eval_tagged(self, node: Tagged, env: dict) -> RegionRef:
        base = self._eval(node.base, env)
        if isinstance(base, VarSet):  # `x@a`: the region over all variables, tagged
            self.state.work.enter(base.count, node.span)
            base = self.state.regions.ref(tuple(range(base.count)), None, node.span)
        if not isinstance(base, RegionRef):
            raise fail(f"only regions take a tag, got {describe_value(base)}", node.base.span)
        region = base
        if region.tag is not None:
            raise fail(f"region {region.id} already has a tag", node.span)
        tag = self._eval(node.tag, env)
        if not (is_int(tag) or (isinstance(tag, str) and tag)):
            raise fail(f"a tag is a name, a string or a number, got {describe_value(tag)}", node.tag.span)
        return self.state.regions.ref(region.scope, str(tag), node.span)

    def _eval_list(self, node: ListLit, env: dict) -> tuple:
        return tuple(self._eval(item, env) for item in node.items)

    def _eval_list_comp(self, node: ListComp, env: dict) -> tuple:
        items = self._eval(node.iterable, env)
        if not isinstance(items, (range, tuple)):
            raise fail(f"for needs a list or a range like 0..n, got {describe_value(items)}", node.iterable.span)
        self.state.work.check_length(items, node.iterable.span, "a list comprehension")
        inner = dict(env)  # the loop variable stays inside the brackets
        result = []
        for item in items:
            self.state.work.step(1, node.span)
            inner[node.var] = item
            if node.condition is None or self._condition(node.condition, inner):
                result.append(self._eval(node.element, inner))
        return tuple(result)


def _with_call_note(error: CircuitError, fn: Def, env: dict, node: Call) -> CircuitError:
    """Add where the innermost failing call came from (`note: in tree(lo=4, hi=4)`), once."""
    if any(d.severity == "note" for d in error.diagnostics):
        return error
    arguments = ", ".join(f"{p.name}={show_argument(env.get(p.name))}" for p in fn.params)
    note = Diagnostic(f"in {fn.name}({arguments}), called here", node.span, severity="note")
    return CircuitError(error.diagnostics + [note])
