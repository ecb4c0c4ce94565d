"""Parse `.pc` text into a syntax tree of plain dataclasses that carry source spans.

The grammar lives in `grammars/pc.lark` (the single source of the syntax); this module only maps
lark's parse tree onto the node classes below and turns lark's errors into located diagnostics
(`file:line:col: error: unexpected '}'; expected an expression`). Spans never take part in `==`,
so two trees compare equal when they say the same thing, wherever it was written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Union

import lark
from lark import Lark, Token, v_args
from lark.visitors import Transformer_NonRecursive

from .errors import CircuitError, Diagnostic, SourceSpan
from .limits import DEFAULT_LIMITS, Limits, limit_error


def _span_field():
    return field(default=None, compare=False, repr=False, kw_only=True)


# ----------------------------------------------------------------------------- expressions

@dataclass(frozen=True)
class Int:
    value: int
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class Str:
    value: str
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class Bool:
    value: bool
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class Name:
    id: str
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class BinOp:
    """`left op right`; op is one of + - * // % ** | .. == != < <= > >= and or."""

    op: str
    left: Expr
    right: Expr
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class UnaryOp:
    op: str  # "-" or "not"
    operand: Expr
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class KeywordArg:
    name: str
    value: Expr
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class Call:
    func: Expr
    args: tuple[Expr, ...]
    kwargs: tuple[KeywordArg, ...] = ()
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class Slice:
    """`start:stop` inside brackets; either bound may be omitted."""

    start: Expr | None
    stop: Expr | None
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class Index:
    """`base[s, ...]`: a set of variables when base is the variable set, else list indexing."""

    base: Expr
    subscripts: tuple[Expr | Slice, ...]
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class Tagged:
    """`region@tag`: another region over the same variables, told apart by its tag."""

    base: Expr
    tag: Expr
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class ListLit:
    items: tuple[Expr, ...]
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class ListComp:
    element: Expr
    var: str
    iterable: Expr
    condition: Expr | None = None
    span: SourceSpan | None = _span_field()


Expr = Union[Int, Str, Bool, Name, BinOp, UnaryOp, Call, Index, Tagged, ListLit, ListComp]


# ----------------------------------------------------------------------------- statements

@dataclass(frozen=True)
class Param:
    name: str
    default: Expr
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class Vars:
    """`vars x[n] states v units r product hadamard` (states, units and product are optional)."""

    name: str
    count: Expr
    states: Expr | None = None
    units: Expr | None = None
    product: str | None = None
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class Include:
    path: str
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class DefParam:
    name: str
    default: Expr | None = None
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class Def:
    name: str
    params: tuple[DefParam, ...]
    body: Block
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class For:
    var: str
    iterable: Expr
    body: Block
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class If:
    condition: Expr
    then: Block
    orelse: Block | None = None  # `else if` is an If as the only statement of orelse
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class Return:
    value: Expr
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class Root:
    region: Expr
    definition: Expr | None = None  # `root R = A * B` is `R = A * B` then `root R`
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class Assign:
    """`name = value` binds a name; `x[0:4] = A * B | C` defines the partitions of a region."""

    target: Expr
    value: Expr
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class SetUnits:
    target: Expr
    value: Expr
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class ExprStmt:
    expr: Expr
    span: SourceSpan | None = _span_field()


Stmt = Union[Param, Vars, Include, Def, For, If, Return, Root, Assign, SetUnits, ExprStmt]


@dataclass(frozen=True)
class Block:
    body: tuple[Stmt, ...]
    span: SourceSpan | None = _span_field()  # from `{` to `}`


@dataclass(frozen=True)
class Comment:
    text: str  # including the leading `#`
    span: SourceSpan | None = _span_field()


@dataclass(frozen=True)
class Module:
    body: tuple[Stmt, ...]
    file: str | None = field(default=None, compare=False)
    comments: tuple[Comment, ...] = field(default=(), compare=False)  # kept for `circuitc fmt`
    source: str | None = field(default=None, compare=False, repr=False)


# ----------------------------------------------------------------------------- parsing

KEYWORDS = ("param", "vars", "states", "units", "product", "include", "def", "for", "in", "if", "else",
            "return", "root", "and", "or", "not", "true", "false")


@lru_cache(maxsize=1)
def _parser() -> Lark:
    grammar = resources.files("circuitc").joinpath("grammars/pc.lark").read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def parse(text: str, file: str | None = None, limits: Limits = DEFAULT_LIMITS) -> Module:
    """Parse `.pc` source text. Raises `CircuitError` with a located diagnostic on a syntax error
    (and on an integer literal larger than `limits.int_bits`)."""
    if not isinstance(text, str):
        raise TypeError(f".pc source must be a str, got {type(text).__name__}")
    lines = text.splitlines()
    try:
        tree = _parser().parse(text)
    except lark.exceptions.UnexpectedInput as e:
        raise CircuitError(_syntax_diagnostic(e, text, lines, file)) from None
    try:
        body = _ToAst(file, lines, limits).transform(tree)
    except lark.exceptions.VisitError as e:  # a rule method rejected its input (a CircuitError)
        raise e.orig_exc from None
    comments = tuple(Comment(t.value.rstrip(), span=_token_span(t, file, lines)) for t in _comment_tokens(text))
    return Module(tuple(body), file=file, comments=comments, source=text)


def _comment_tokens(text: str) -> list[Token]:
    """Comments, found by lexing alone (the parse tree drops them; `circuitc fmt` keeps them)."""
    parser = _parser()
    return [t for t in parser.lex(text, dont_ignore=True) if t.type == "COMMENT"]


def _token_span(token: Token, file: str | None, lines: list[str]) -> SourceSpan:
    return SourceSpan(file, token.line, token.column, token.end_line, token.end_column,
                      _line(lines, token.line))


def _line(lines: list[str], lineno: int | None) -> str | None:
    return lines[lineno - 1] if lineno and 0 < lineno <= len(lines) else None


# What people call the grammar's terminals in "expected ..." messages.
_TERMINAL_WORDS = {
    "NAME": "a name", "INT": "a number", "STRING": "a string", "$END": "end of file",
    "COMPARE": "a comparison", "PLUS": "'+'", "MINUS": "'-'", "STAR": "'*'", "DSLASH": "'//'",
    "PERCENT": "'%'",
}
_EXPRESSION_STARTS = {"NAME", "INT", "STRING", "LPAR", "LSQB", "MINUS", "TRUE", "FALSE", "NOT"}


def _describe_terminal(name: str) -> str:
    if name in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[name]
    try:
        pattern = _parser().get_terminal(name).pattern
    except KeyError:
        return name
    return f"'{pattern.value}'" if pattern.type == "str" else name


_STATEMENT_STARTS = {"PARAM", "VARS", "INCLUDE", "DEF", "FOR", "IF", "RETURN", "ROOT"}
_OPERATORS = {"PLUS", "MINUS", "STAR", "DSLASH", "PERCENT", "COMPARE", "VBAR", "AND", "OR", "AT", "DOT",
              "LSQB", "LPAR", "_DOTDOT", "_DSTAR"}
_CLOSERS = ("RBRACE", "RPAR", "RSQB")


def _expected_text(expected: set[str]) -> str:
    """Summarise lark's set of acceptable terminals the way people think of them."""
    expected = set(expected)
    words = [_describe_terminal(t) for t in _CLOSERS if t in expected]
    expected -= set(_CLOSERS)
    if {"NAME", "INT", "LPAR"} <= expected:
        words.append("an expression")
        expected -= _EXPRESSION_STARTS
    if len(expected & _STATEMENT_STARTS) >= 4:
        words.append("a statement")
        expected -= _STATEMENT_STARTS | {"SEMICOLON", "$END"}
    if len(expected & _OPERATORS) >= 4:
        words.append("an operator")
        expected -= _OPERATORS
    words += sorted(_describe_terminal(t) for t in expected)
    if len(words) > 8:
        words = words[:8] + ["..."]
    return words[0] if len(words) == 1 else "one of " + ", ".join(words)


def _syntax_diagnostic(e: lark.exceptions.UnexpectedInput, text: str, lines: list[str],
                       file: str | None) -> Diagnostic:
    line, column = getattr(e, "line", None), getattr(e, "column", None)
    at_end = isinstance(e, lark.exceptions.UnexpectedEOF) or (
        isinstance(e, lark.exceptions.UnexpectedToken) and e.token.type == "$END")
    if at_end or not isinstance(line, int) or line < 1:  # point just past the last character
        line = max(1, len(lines))
        column = len(lines[-1]) + 1 if lines else 1
    if isinstance(e, lark.exceptions.UnexpectedCharacters):
        char = text[e.pos_in_stream]
        message = "unterminated string" if char == '"' else f"unexpected character {char!r}"
        if e.allowed and char != '"':
            message += f"; expected {_expected_text(e.allowed)}"
    elif isinstance(e, lark.exceptions.UnexpectedToken):
        token = e.token
        found = "end of file" if token.type == "$END" else f"'{token.value}'"
        if token.type == "NAME" or token.value in KEYWORDS:
            found = f"{'keyword' if token.value in KEYWORDS else 'name'} '{token.value}'"
        message = f"unexpected {found}; expected {_expected_text(e.expected)}"
    else:  # UnexpectedEOF
        message = f"unexpected end of file; expected {_expected_text(set(getattr(e, 'expected', ())))}"
    return Diagnostic(message, SourceSpan(file, line, column, source_line=_line(lines, line)))


@v_args(meta=True)
class _ToAst(Transformer_NonRecursive):
    """lark tree -> dataclasses, one method per grammar rule (same names as in pc.lark).
    Non-recursive: generated files hold chains like `x[0] * x[1] * ... * x[4095]`."""

    def __init__(self, file: str | None, lines: list[str], limits: Limits):
        super().__init__()
        self.file = file
        self.lines = lines
        self.limits = limits

    def _span(self, meta) -> SourceSpan | None:
        if getattr(meta, "empty", True):
            return None
        return SourceSpan(self.file, meta.line, meta.column, meta.end_line, meta.end_column,
                          _line(self.lines, meta.line))

    # statements
    def start(self, meta, children):
        return [c for c in children if c is not None and not isinstance(c, Token)]

    def block(self, meta, children):
        return Block(tuple(c for c in children if not isinstance(c, Token)), span=self._span(meta))

    def param(self, meta, c):
        return Param(str(c[0]), c[1], span=self._span(meta))

    def vars(self, meta, c):
        clauses: dict[str, object] = {}
        for kind, value, span in c[2:]:
            if kind in clauses:
                raise CircuitError(Diagnostic(f"'{kind}' is given twice in one vars declaration", span))
            clauses[kind] = value
        return Vars(str(c[0]), c[1], states=clauses.get("states"), units=clauses.get("units"),
                    product=clauses.get("product"), span=self._span(meta))

    def states_clause(self, meta, c):
        return ("states", c[0], self._span(meta))

    def units_clause(self, meta, c):
        return ("units", c[0], self._span(meta))

    def product_clause(self, meta, c):
        return ("product", str(c[0]), self._span(meta))

    def include(self, meta, c):
        return Include(c[0][1:-1], span=self._span(meta))

    def def_param(self, meta, c):
        return DefParam(str(c[0]), c[1], span=self._span(meta))

    def def_stmt(self, meta, c):
        params = tuple(p for p in c[1:-1] if p is not None)
        return Def(str(c[0]), params, c[-1], span=self._span(meta))

    def for_stmt(self, meta, c):
        return For(str(c[0]), c[1], c[2], span=self._span(meta))

    def if_stmt(self, meta, c):
        orelse = c[2]
        if isinstance(orelse, If):
            orelse = Block((orelse,), span=orelse.span)
        return If(c[0], c[1], orelse, span=self._span(meta))

    def return_stmt(self, meta, c):
        return Return(c[0], span=self._span(meta))

    def root(self, meta, c):
        return Root(c[0], c[1], span=self._span(meta))

    def assign(self, meta, c):
        return Assign(c[0], c[1], span=self._span(meta))

    def set_units(self, meta, c):
        return SetUnits(c[0], c[1], span=self._span(meta))

    def expr_stmt(self, meta, c):
        return ExprStmt(c[0], span=self._span(meta))

    # expressions
    def int(self, meta, c):
        digits = str(c[0]).lstrip("0") or "0"
        # decimal digits of the largest allowed integer, with one to spare; checked before int()
        # so that a 100,000-digit literal costs nothing (and never meets Python's own digit limit)
        if len(digits) > self.limits.int_bits * 0.302 + 2 or int(digits).bit_length() > self.limits.int_bits:
            raise limit_error("int_bits", f"about {int(len(digits) * 3.32):,} bits", self.limits,
                              self._span(meta), what=f"integer literal of {len(digits):,} digits is too large")
        return Int(int(digits), span=self._span(meta))

    def string(self, meta, c):
        token = c[0]
        value = token[1:-1] if token.type == "STRING" else str(token)
        return Str(value, span=self._span(meta))

    def true(self, meta, c):
        return Bool(True, span=self._span(meta))

    def false(self, meta, c):
        return Bool(False, span=self._span(meta))

    def name(self, meta, c):
        return Name(str(c[0]), span=self._span(meta))

    def _binary(self, op, meta, left, right):
        return BinOp(op, left, right, span=self._span(meta))

    def or_op(self, meta, c):
        return self._binary("or", meta, c[0], c[1])

    def and_op(self, meta, c):
        return self._binary("and", meta, c[0], c[1])

    def not_op(self, meta, c):
        return UnaryOp("not", c[0], span=self._span(meta))

    def compare(self, meta, c):
        return self._binary(str(c[1]), meta, c[0], c[2])

    def range_op(self, meta, c):
        return self._binary("..", meta, c[0], c[1])

    def mix_op(self, meta, c):
        return self._binary("|", meta, c[0], c[1])

    def binop(self, meta, c):
        return self._binary(str(c[1]), meta, c[0], c[2])

    def kron_op(self, meta, c):
        return self._binary("**", meta, c[0], c[1])

    def neg(self, meta, c):
        return UnaryOp("-", c[1], span=self._span(meta))

    def call(self, meta, c):
        args, kwargs = [], []
        for arg in c[1:]:
            if arg is None:
                continue
            if isinstance(arg, KeywordArg):
                kwargs.append(arg)
            elif kwargs:
                raise CircuitError(Diagnostic("a positional argument cannot follow a keyword argument",
                                              _expr_span(arg)))
            else:
                args.append(arg)
        return Call(c[0], tuple(args), tuple(kwargs), span=self._span(meta))

    def keyword_arg(self, meta, c):
        return KeywordArg(str(c[0]), c[1], span=self._span(meta))

    def units_keyword_arg(self, meta, c):
        return KeywordArg("units", c[0], span=self._span(meta))

    def index(self, meta, c):
        return Index(c[0], tuple(c[1:]), span=self._span(meta))

    def slice(self, meta, c):
        return Slice(c[0], c[1], span=self._span(meta))

    def tagged(self, meta, c):
        return Tagged(c[0], c[1], span=self._span(meta))

    def list(self, meta, c):
        return ListLit(tuple(x for x in c if x is not None), span=self._span(meta))

    def list_comp(self, meta, c):
        return ListComp(c[0], str(c[1]), c[2], c[3], span=self._span(meta))


def _expr_span(node) -> SourceSpan | None:
    return getattr(node, "span", None)
