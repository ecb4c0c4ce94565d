"""Statements: each kind of statement inside a file or a block runs in order against an
environment (the file's globals, or a call's locals); declarations (`param`, `vars`, `include`,
`def`) belong at the top level."""

from __future__ import annotations

from ..errors import SourceSpan
from ..graph import PRODUCTS
from ..limits import check_at_most
from ..syntax import (Assign, Block, Call, Def, ExprStmt, For, If, Include, Index, Name, Param, Return, Root,
                      SetUnits, Tagged, Vars)
from .builtin_functions import BUILTINS
from .values import Function, RegionRef, Returned, VarSet, describe_value, fail, kind_name, show_value


class Statements:
    """Part of `Elaborator`: running statements (uses `Expressions` and `Regions`)."""

    def _exec(self, stmt, env: dict) -> Returned | None:
        return self._exec_by_type[type(stmt)](stmt, env)

    def _exec_block(self, block: Block, env: dict) -> Returned | None:
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
        raise fail(f"{what} belongs at the top level of a file, not inside a block", stmt.span)

    def _exec_param(self, stmt: Param) -> None:
        default = self._eval(stmt.default, self.globals)
        value = self.bindings.get(stmt.name, default)
        if type(value) is not type(default):
            raise fail(f"parameter {stmt.name} is {kind_name(default)} (default {show_value(default)}), "
                       f"but it was bound to {show_value(value)}", stmt.span)
        self.globals[stmt.name] = value

    def _exec_vars(self, stmt: Vars) -> None:
        env = self.globals
        if self.vars_node is not None:
            raise fail(f"variables are declared twice (first at {self.vars_node.span})", stmt.span)
        count = self._positive_int(stmt.count, env, "the number of variables")
        check_at_most("variables", count, self.limits, stmt.count.span)
        if stmt.states is None:
            raise fail(f"say how many states each variable has: `vars {stmt.name}[...] states 256`", stmt.span)
        self.states = self._positive_int(stmt.states, env, "the number of states")
        check_at_most("states", self.states, self.limits, stmt.states.span)
        if stmt.units is not None:
            self.default_units = self._positive_int(stmt.units, env, "the default number of units")
            check_at_most("units", self.default_units, self.limits, stmt.units.span)
        if stmt.product is not None:
            if stmt.product not in PRODUCTS:
                raise fail(f"unknown product kind {stmt.product!r}: use hadamard or kronecker", stmt.span)
            self.default_product = stmt.product
        if stmt.name in self.globals or stmt.name in BUILTINS:
            raise fail(f"the variable set {stmt.name} would hide another name; choose another name", stmt.span)
        self.vars_node = stmt
        self.varset = VarSet(stmt.name, count)
        self.globals[stmt.name] = self.varset

    def _exec_for(self, stmt: For, env: dict) -> Returned | None:
        items = self._eval(stmt.iterable, env)
        if not isinstance(items, (range, tuple)):
            raise fail(f"for needs a list or a range like 0..n, got {describe_value(items)}", stmt.iterable.span)
        self._check_length(items, stmt.iterable.span, "a for loop")
        self._check_assignable(stmt.var, env, stmt.span)
        for item in items:
            self._step(1, stmt.span)
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
        if self.root is not None:
            raise fail(f"the root is declared twice (first {self.root.id} at {self.root_span})", stmt.span)
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
            raise fail("only a name or a region like x[0:4] can be assigned to", stmt.target.span)
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
            raise fail("this statement does nothing: did you mean to assign it, e.g. `x[0:2] = x[0] * x[1]`?",
                       stmt.span)
        self._eval(stmt.expr, env)

    def _check_assignable(self, name: str, env: dict, span) -> None:
        if name in BUILTINS or (self.varset and name == self.varset.name):
            raise fail(f"cannot assign to {name}: it names {'a built-in' if name in BUILTINS else 'the variables'}",
                       span)
        if self._at_top(env) and (name in self.params or isinstance(self.globals.get(name), Function)):
            raise fail(f"cannot assign to {name}: it is a {'parameter' if name in self.params else 'function'}",
                       span)
