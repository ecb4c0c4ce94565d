"""Expressions: every syntax node of an expression evaluates to a plain value (`values`), located
errors otherwise. Arithmetic is bounded before it is computed (`int_bits`), products of regions
become partitions, calls run built-ins or user functions (whose bodies are statements)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import CircuitError, Diagnostic
from ..graph import scope_name
from ..limits import check_at_most, limit_error
from ..syntax import BinOp, Call, Def, Index, ListComp, ListLit, Name, Param, Slice, Tagged, UnaryOp, Vars
from .builtin_functions import BUILTINS
from .values import (REQUIRED, Builtin, Function, Mixture, Product, RegionRef, VarSet, bind_call, describe_value, fail,
                     is_int, length, show_argument, union_scope)


class Expressions:
    """Part of `Elaborator`: evaluating expressions (uses `Regions` and, for calls, `Statements`)."""

    def _eval(self, node, env: dict) -> Any:
        return self._eval_by_type[type(node)](node, env)

    def _eval_literal(self, node, env: dict) -> Any:
        return node.value

    def _eval_name(self, node: Name, env: dict) -> Any:
        if node.id in env:
            return env[node.id]
        if node.id in self.globals:
            return self.globals[node.id]
        if node.id in BUILTINS:
            return BUILTINS[node.id]
        raise fail(f"unknown name {node.id}" + self._name_hint(node.id), node.span)

    def _name_hint(self, name: str) -> str:
        for module in self.modules.values():
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
            value = self._apply(link, value, self._eval(link.right, env))
        return value

    def _apply(self, node: BinOp, left: Any, right: Any) -> Any:
        op = node.op
        if is_int(left) and is_int(right):
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
            total = length(left) + length(right)
            check_at_most("loop", total, self.limits, node.span, what="a list is too long")
            self._entries(total, node.span)
            return tuple(left) + tuple(right)
        raise fail(f"cannot apply {op} to {describe_value(left)} and {describe_value(right)}", node.span)

    def _int_op(self, op: str, a: int, b: int, node: BinOp) -> Any:
        if op in ("//", "%") and b == 0:
            raise fail("division by zero", node.right.span)
        if op == "|":
            raise fail("| separates partitions of a region; it does not apply to numbers", node.span)
        if op == "**" and b < 0:
            raise fail(f"negative exponent {b}: numbers here are integers", node.right.span)
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
                raise fail(f"cannot use a {operand.kind} product inside a {kind} product: make it a region "
                           f"first, e.g. `{scope_name(union_scope(operand.children), self.varset.name)} = ...`",
                           side.span)
            else:
                raise fail(f"cannot apply {op} to {describe_value(left)} and {describe_value(right)}", node.span)
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
                raise fail(f"argument {kw.name} is given twice", kw.span)
            kwargs[kw.name] = (self._eval(kw.value, env), kw.span)
        if isinstance(func, Builtin):
            return func.run(self, args, kwargs, node)
        if isinstance(func, Function):
            return self._call_function(func.node, args, kwargs, node)
        raise fail(f"{describe_value(func)} is not a function", node.func.span)

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
        params = {p.name: REQUIRED if p.default is None else p.default for p in fn.params}
        # A default is an expression, evaluated in the file's globals only when it is used.
        return bind_call(fn.name, params, args, kwargs, node, lambda default: self._eval(default, self.globals))

    def _eval_index(self, node: Index, env: dict) -> Any:
        base = self._eval(node.base, env)
        if isinstance(base, VarSet):
            return self._region_ref(self._scope(base, node, env), None, node.span)
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
        if len(node.subscripts) == 1:  # the common `x[a:b]`: checked by its ends, built in C
            indices = self._subscript_indices(varset, node.subscripts[0], env)
            if isinstance(indices, range) and indices.step == 1 and 0 <= indices.start < indices.stop <= varset.count:
                self._entries(length(indices), node.span)
                return tuple(indices)
        seen: set[int] = set()
        for sub in node.subscripts:
            indices = self._subscript_indices(varset, sub, env)
            self._entries(min(length(indices), varset.count + 1), sub.span)
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
            self._entries(base.count, node.span)
            base = self._region_ref(tuple(range(base.count)), None, node.span)
        if not isinstance(base, RegionRef):
            raise fail(f"only regions take a tag, got {describe_value(base)}", node.base.span)
        region = base
        if region.tag is not None:
            raise fail(f"region {region.id} already has a tag", node.span)
        tag = self._eval(node.tag, env)
        if not (is_int(tag) or (isinstance(tag, str) and tag)):
            raise fail(f"a tag is a name, a string or a number, got {describe_value(tag)}", node.tag.span)
        return self._region_ref(region.scope, str(tag), node.span)

    def _eval_list(self, node: ListLit, env: dict) -> tuple:
        return tuple(self._eval(item, env) for item in node.items)

    def _eval_list_comp(self, node: ListComp, env: dict) -> tuple:
        items = self._eval(node.iterable, env)
        if not isinstance(items, (range, tuple)):
            raise fail(f"for needs a list or a range like 0..n, got {describe_value(items)}", node.iterable.span)
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
    arguments = ", ".join(f"{p.name}={show_argument(env.get(p.name))}" for p in fn.params)
    note = Diagnostic(f"in {fn.name}({arguments}), called here", node.span, severity="note")
    return CircuitError(error.diagnostics + [note])


_INT_OPS: dict[str, Callable[[int, int], Any]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "//": lambda a, b: a // b,
    "%": lambda a, b: a % b, "**": lambda a, b: a ** b, "..": range,
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}
