"""`format_module`: print a syntax tree back as canonical `.pc` text (`circuitc fmt`).

Canonical means: one statement per line, blocks indented by four spaces, single spaces around
binary operators, parentheses only where precedence needs them, and at most one blank line
where the source had any. Comments are kept, before the statement they preceded or at the end of
the line they ended. `parse(format_module(m)) == m` (spans aside), and formatting is idempotent.
"""

from __future__ import annotations

import re

from .errors import CircuitError, Diagnostic, SourceSpan
from .syntax import (KEYWORDS, Assign, BinOp, Block, Bool, Call, Comment, Def, ExprStmt, For, If, Include, Index,
                     Int, ListComp, ListLit, Module, Name, Param, Return, Root, SetUnits, Slice, Str, Tagged,
                     UnaryOp, Vars)

INDENT = "    "

# Binding strength of each operator (higher binds tighter), and the least strength each operand
# needs to go without parentheses; mirrors the expression rules of grammars/pc.lark.
_BINARY = {  # op: (strength, left operand needs, right operand needs)
    "or": (1, 1, 2), "and": (2, 2, 3),
    "==": (4, 5, 5), "!=": (4, 5, 5), "<": (4, 5, 5), "<=": (4, 5, 5), ">": (4, 5, 5), ">=": (4, 5, 5),
    "..": (5, 6, 6), "|": (6, 6, 7), "+": (7, 7, 8), "-": (7, 7, 8),
    "*": (8, 8, 9), "//": (8, 8, 9), "%": (8, 8, 9), "**": (10, 11, 9),
}
_NOT, _NEG, _POSTFIX, _ATOM = 3, 9, 11, 12
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def format_module(module: Module) -> str:
    printer = _Printer(module.comments)
    try:
        printer.statements(module.body, 0)
    except RecursionError:  # nesting far beyond anything written by hand
        raise CircuitError(Diagnostic("expressions nest too deeply to format",
                                      SourceSpan(module.file, 1, 1))) from None
    printer.comments_before(None, 0)
    return "\n".join(printer.lines) + "\n" if printer.lines else ""


# ----------------------------------------------------------------------------- expressions

def format_expr(node, need: int = 0, compact: bool = False) -> str:
    """`node` as text, parenthesised if it binds less tightly than `need`. Compact text (ranges,
    subscripts: `0..n-1`, `x[i+1:n]`) drops the spaces around arithmetic."""
    text, strength = _expr(node, compact)
    return f"({text})" if strength < need else text


def _expr(node, compact: bool = False) -> tuple[str, int]:
    if isinstance(node, Int):
        return str(node.value), _ATOM
    if isinstance(node, Str):
        return f'"{node.value}"', _ATOM
    if isinstance(node, Bool):
        return ("true" if node.value else "false"), _ATOM
    if isinstance(node, Name):
        return node.id, _ATOM
    if isinstance(node, BinOp):
        return _binary(node, compact)
    if isinstance(node, UnaryOp):
        if node.op == "not":
            return f"not {format_expr(node.operand, _NOT)}", _NOT
        return f"-{format_expr(node.operand, _NEG, compact)}", _NEG
    if isinstance(node, Call):
        args = [format_expr(a) for a in node.args] + [f"{k.name}={format_expr(k.value)}" for k in node.kwargs]
        return f"{format_expr(node.func, _POSTFIX)}({', '.join(args)})", _POSTFIX
    if isinstance(node, Index):
        subs = ", ".join(_subscript(s) for s in node.subscripts)
        return f"{format_expr(node.base, _POSTFIX)}[{subs}]", _POSTFIX
    if isinstance(node, Tagged):
        return f"{format_expr(node.base, _POSTFIX)}@{_tag(node.tag)}", _POSTFIX
    if isinstance(node, ListLit):
        return "[" + ", ".join(format_expr(i) for i in node.items) + "]", _ATOM
    if isinstance(node, ListComp):
        condition = f" if {format_expr(node.condition)}" if node.condition is not None else ""
        return f"[{format_expr(node.element)} for {node.var} in {format_expr(node.iterable)}{condition}]", _ATOM
    raise TypeError(f"not an expression: {node!r}")


def _binary(node: BinOp, compact: bool) -> tuple[str, int]:
    strength, left, right = _BINARY[node.op]
    if node.op == "..":
        return f"{format_expr(node.left, left, True)}..{format_expr(node.right, right, True)}", strength
    # A left-leaning chain (`x[0] * x[1] * ... * x[4095]`) is printed in a loop, not by recursion.
    chain = [node]
    while (isinstance(chain[-1].left, BinOp) and chain[-1].left.op != ".."
           and _BINARY[chain[-1].left.op][0] >= _BINARY[chain[-1].op][1]):
        chain.append(chain[-1].left)
    pieces = [format_expr(chain[-1].left, _BINARY[chain[-1].op][1], compact)]
    for link in reversed(chain):
        link_strength, _, link_right = _BINARY[link.op]
        gap = "" if compact and link_strength >= _BINARY["+"][0] else " "
        pieces.append(f"{gap}{link.op}{gap}{format_expr(link.right, link_right, compact)}")
    return "".join(pieces), strength


def _subscript(node) -> str:
    if isinstance(node, Slice):
        start = format_expr(node.start, compact=True) if node.start is not None else ""
        stop = format_expr(node.stop, compact=True) if node.stop is not None else ""
        return f"{start}:{stop}"
    return format_expr(node, compact=True)


def _tag(node) -> str:
    if isinstance(node, Str) and _IDENTIFIER.fullmatch(node.value) and node.value not in KEYWORDS:
        return node.value
    if isinstance(node, (Str, Int)):
        return format_expr(node)
    return f"({format_expr(node)})"


# ----------------------------------------------------------------------------- statements

class _Printer:
    """Collects output lines; hands out each source comment once, where it belongs."""

    def __init__(self, comments: tuple[Comment, ...]):
        self.lines: list[str] = []
        self.pending = sorted(comments, key=lambda c: (c.span.line, c.span.column) if c.span else (0, 0))
        self.last_line = 0  # the last source line accounted for, to keep blank lines
        self.block_start = True

    # comments and blank lines
    def _gap(self, source_line: int | None) -> None:
        if source_line is not None and not self.block_start and source_line > self.last_line + 1:
            self.lines.append("")

    def comments_before(self, line: int | None, depth: int) -> None:
        """Emit, as lines of their own, the comments that come before source line `line` (all if None)."""
        while self.pending and (line is None or _line(self.pending[0]) < line):
            comment = self.pending.pop(0)
            self._gap(_line(comment))
            self.lines.append(INDENT * depth + comment.text)
            self.last_line = max(self.last_line, _line(comment) or 0)
            self.block_start = False

    def trailing_comment(self, through_line: int | None, depth: int) -> None:
        """Comments up to `through_line` end the last printed line (all but the last one go above it)."""
        if through_line is None:
            return
        taken = []
        while self.pending and _line(self.pending[0]) <= through_line:
            taken.append(self.pending.pop(0))
        if not taken:
            return
        for comment in taken[:-1]:
            self.lines.insert(len(self.lines) - 1, INDENT * depth + comment.text)
        self.lines[-1] += "  " + taken[-1].text
        self.last_line = max(self.last_line, through_line)

    # statements
    def statements(self, body, depth: int) -> None:
        for stmt in body:
            self.statement(stmt, depth)

    def statement(self, stmt, depth: int) -> None:
        start = stmt.span.line if stmt.span else None
        self.comments_before(start, depth)
        self._gap(start)
        self.block_start = False
        if isinstance(stmt, (Def, For, If)):
            self._compound(stmt, depth)
        else:
            text = _simple(stmt)
            if text[0] in "(-[" and self.lines:  # else the previous statement would swallow it
                text = "; " + text
            self.lines.append(INDENT * depth + text)
            self.trailing_comment(stmt.span.end_line if stmt.span else None, depth)
        if stmt.span and stmt.span.end_line:
            self.last_line = max(self.last_line, stmt.span.end_line)

    def _compound(self, stmt, depth: int) -> None:
        if isinstance(stmt, Def):
            params = ", ".join(p.name + (f"={format_expr(p.default)}" if p.default is not None else "")
                               for p in stmt.params)
            self._block(f"def {stmt.name}({params})", stmt.body, depth)
        elif isinstance(stmt, For):
            self._block(f"for {stmt.var} in {format_expr(stmt.iterable)}", stmt.body, depth)
        else:
            self._if(stmt, depth, prefix="")

    def _if(self, stmt: If, depth: int, prefix: str) -> None:
        self._block(f"{prefix}if {format_expr(stmt.condition)}", stmt.then, depth, continues=stmt.orelse is not None)
        self._else(stmt, depth)

    def _else(self, stmt: If, depth: int) -> None:
        """The rest of an else-if chain, continuing the `}` line."""
        if stmt.orelse is None:
            return
        self.lines[-1] += " else"
        orelse = stmt.orelse
        if len(orelse.body) == 1 and isinstance(orelse.body[0], If):
            nested = orelse.body[0]
            self.lines[-1] += " " + self._header_text(f"if {format_expr(nested.condition)}", nested.then)
            self._body_and_close(nested.then, depth, continues=nested.orelse is not None)
            self._else(nested, depth)
        else:
            self.lines[-1] += " " + self._header_text("", orelse).lstrip()
            self._body_and_close(orelse, depth)

    def _header_text(self, header: str, block: Block) -> str:
        return f"{header} {{}}" if self._empty(block) else f"{header} {{"

    def _empty(self, block: Block) -> bool:
        end = block.span.end_line if block.span else None
        return not block.body and not (self.pending and end is not None and _line(self.pending[0]) < end)

    def _block(self, header: str, block: Block, depth: int, continues: bool = False) -> None:
        self.lines.append(INDENT * depth + self._header_text(header, block))
        self._body_and_close(block, depth, continues)

    def _body_and_close(self, block: Block, depth: int, continues: bool = False) -> None:
        """Print a block's body and its `}`; `continues`: an `else` will follow on the `}` line."""
        empty = self._empty(block)
        if empty and continues:  # `{}` then ` else {`: a comment on this line belongs after the `{`
            return
        self.trailing_comment(block.span.line if block.span else None, depth)
        if empty:
            return
        self.block_start = True
        self.statements(block.body, depth + 1)
        end = block.span.end_line if block.span else None
        self.comments_before(end, depth + 1)
        self.block_start = False
        self.lines.append(INDENT * depth + "}")
        if end is not None:
            self.last_line = max(self.last_line, end)


def _simple(stmt) -> str:
    if isinstance(stmt, Param):
        return f"param {stmt.name} = {format_expr(stmt.default)}"
    if isinstance(stmt, Vars):
        text = f"vars {stmt.name}[{format_expr(stmt.count)}]"
        if stmt.states is not None:
            text += f" states {format_expr(stmt.states)}"
        if stmt.units is not None:
            text += f" units {format_expr(stmt.units)}"
        if stmt.product is not None:
            text += f" product {stmt.product}"
        return text
    if isinstance(stmt, Include):
        return f'include "{stmt.path}"'
    if isinstance(stmt, Return):
        return f"return {format_expr(stmt.value)}"
    if isinstance(stmt, Root):
        if stmt.definition is not None:
            return f"root {format_expr(stmt.region, _POSTFIX)} = {format_expr(stmt.definition)}"
        return f"root {format_expr(stmt.region)}"
    if isinstance(stmt, Assign):
        return f"{format_expr(stmt.target, _POSTFIX)} = {format_expr(stmt.value)}"
    if isinstance(stmt, SetUnits):
        return f"{format_expr(stmt.target, _POSTFIX)}.units = {format_expr(stmt.value)}"
    if isinstance(stmt, ExprStmt):
        return format_expr(stmt.expr)
    raise TypeError(f"not a statement: {stmt!r}")


def _line(comment: Comment) -> int:
    return comment.span.line if comment.span else 0
