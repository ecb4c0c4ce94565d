"""The binary operators on evaluated values: integer arithmetic and comparisons (each result's size
bounded before it is computed, `int_bits`), products of regions (`*`, `**`) that become partitions,
mixtures of partitions (`|`), equality, and joining lists (`+`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import SourceSpan
from ..graph import scope_name
from ..limits import check_at_most, limit_error
from ..syntax import BinOp
from .declarations import Declarations
from .regions import WorkMeter
from .values import Mixture, Product, RegionRef, describe_value, fail, is_int, length, union_scope


def apply_binary(node: BinOp, left: Any, right: Any, declared: Declarations, work: WorkMeter) -> Any:
    """`left op right`, both evaluated already (`and` and `or` short-circuit, so they never get here)."""
    op = node.op
    if is_int(left) and is_int(right):
        return _int_op(op, left, right, node, work)
    if op in ("*", "**"):
        return _multiply(op, left, right, node, declared)
    if op == "|":
        return Mixture(as_partitions(left, node.left.span, declared) + as_partitions(right, node.right.span, declared))
    if op == "==":
        return left == right
    if op == "!=":
        return left != right
    if op == "+" and isinstance(left, (tuple, range)) and isinstance(right, (tuple, range)):
        total = length(left) + length(right)
        check_at_most("loop", total, work.limits, node.span, what="a list is too long")
        work.enter(total, node.span)
        return tuple(left) + tuple(right)
    raise fail(f"cannot apply {op} to {describe_value(left)} and {describe_value(right)}", node.span)


def as_partitions(value: Any, span: SourceSpan | None, declared: Declarations) -> tuple[Product, ...]:
    """A region's definition as its partitions: `A * B | C ** D`, a product, or a single region."""
    if isinstance(value, RegionRef):  # a single child passes its units through
        return (Product(declared.default_product, (value,)),)
    if isinstance(value, Product):
        return (value,)
    if isinstance(value, Mixture):
        return value.products
    raise fail(f"a region is defined by products of regions (A * B | C ** D), got {describe_value(value)}", span)


def _int_op(op: str, a: int, b: int, node: BinOp, work: WorkMeter) -> Any:
    limits = work.limits
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
            bits = 0 if abs(a) <= 1 else min(b, limits.int_bits + 1) * (la - 1)
        else:
            bits = la + lb if op == "*" else max(la, lb) + 1
        if bits > limits.int_bits:
            shown = f"{a} {op} {b}" if la + lb < 200 else f"the result of {op}"
            raise limit_error("int_bits", f"at least {bits:,} bits", limits, node.span, what=f"{shown} is too large")
    return _INT_OPS[op](a, b)


def _multiply(op: str, left: Any, right: Any, node: BinOp, declared: Declarations) -> Product:
    """`A * B * C` is one partition with three children (`*` uses the declared product kind,
    `**` is always kronecker); nesting the other kind inside needs a named region."""
    kind = "kronecker" if op == "**" else declared.default_product
    children: list[RegionRef] = []
    for operand, side in ((left, node.left), (right, node.right)):
        if isinstance(operand, RegionRef):
            children.append(operand)
        elif isinstance(operand, Product) and (operand.kind == kind or len(operand.children) == 1):
            children.extend(operand.children)
        elif isinstance(operand, Product):
            raise fail(f"cannot use a {operand.kind} product inside a {kind} product: make it a region first, "
                       f"e.g. `{scope_name(union_scope(operand.children), declared.variable_name())} = ...`",
                       side.span)
        else:
            raise fail(f"cannot apply {op} to {describe_value(left)} and {describe_value(right)}", node.span)
    return Product(kind, tuple(children))


_INT_OPS: dict[str, Callable[[int, int], Any]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "//": lambda a, b: a // b,
    "%": lambda a, b: a % b, "**": lambda a, b: a ** b, "..": range,
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}
