"""The values a `.pc` program computes with (besides ints, bools, strings and lists), and the
small helpers every part of the elaborator shares: located errors, how values show in messages,
matching a call's arguments to parameters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import CircuitError, Diagnostic, SourceSpan
from ..syntax import Call, Def


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
    run: Callable[..., Any]  # run(context, args, kwargs, call node): see `builtin_functions.BuiltinContext`
    signature: str


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


def fail(message: str, span: SourceSpan | None) -> CircuitError:
    return CircuitError(Diagnostic(message, span))


def show_argument(value: Any) -> str:
    if isinstance(value, (bool, int, str)):
        return show_value(value)
    return value.id if isinstance(value, RegionRef) else describe_value(value)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def length(items: range | tuple) -> int:
    """len() of a list or range, exact however long (len(range(10**70)) overflows in Python)."""
    if isinstance(items, range):
        return max(0, (items.stop - items.start + items.step - (1 if items.step > 0 else -1)) // items.step)
    return len(items)


def is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (text decoded with surrogateescape)
        return False
    return True


def quoted(text: str) -> str:
    """A user-written string in a message: quoted, escaped, cut at 80 characters."""
    shown = text.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
    shown = "".join(ch if ord(ch) >= 32 else f"\\x{ord(ch):02x}" for ch in shown)
    return '"' + (shown if len(shown) <= 80 else shown[:77] + "...") + '"'


def kind_name(value: Any) -> str:
    return {bool: "a boolean", int: "a number", str: "a string"}.get(type(value), "a value")


def show_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else str(value)


def union_scope(regions) -> tuple[int, ...]:
    return tuple(sorted({i for r in regions for i in r.scope}))


def bind_call(name: str, params: dict[str, Any], args: list, kwargs: dict, node: Call,
              resolve_default=lambda default: default) -> dict[str, Any]:
    """Match a call's arguments to a function's parameters (`params`: name -> default; a default
    of `REQUIRED` must be given), for user functions and built-ins alike."""
    names = list(params)
    signature = f"{name}({', '.join(names)})"
    if len(args) > len(names):
        bound_word = "" if all(d is REQUIRED for d in params.values()) else "at most "
        plural = "s" if len(names) != 1 else ""
        raise fail(f"{signature} takes {bound_word}{len(names)} argument{plural}, got {len(args)}", node.span)
    bound = dict(zip(names, args))
    for key, (value, span) in kwargs.items():
        if key not in params:
            raise fail(f"{signature} has no parameter {key}", span)
        if key in bound:
            raise fail(f"{signature}: argument {key} is given twice", span)
        bound[key] = value
    for key, default in params.items():
        if key not in bound:
            if default is REQUIRED:
                raise fail(f"{signature}: missing argument {key}", node.span)
            bound[key] = resolve_default(default)
    return bound


REQUIRED = object()
DEFAULT_UNITS = object()  # stands for the declared default units
