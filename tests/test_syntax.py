"""The parser: every construct of the grammar becomes the right dataclass, spans locate it, and
syntax errors are located diagnostics saying what was expected."""

import re
from importlib import resources

import pytest

from circuitc import CircuitError, parse
from circuitc.syntax import (Assign, BinOp, Block, Bool, Call, Def, DefParam, ExprStmt, For, If, Include, Index, Int,
                             KeywordArg, ListComp, ListLit, Name, Param, Return, Root, SetUnits, Slice, Str, Tagged,
                             UnaryOp, Vars)


def expr(text):
    """The expression of `y = <text>`."""
    (stmt,) = parse(f"y = {text}").body
    return stmt.value


def syntax_error(text, file="f.pc"):
    with pytest.raises(CircuitError) as info:
        parse(text, file=file)
    (diagnostic,) = info.value.diagnostics
    return diagnostic


def test_grammar_ships_inside_the_package():
    assert resources.files("circuitc").joinpath("grammars/pc.lark").is_file()


def test_keywords_are_reserved_everywhere_but_units_is_an_argument_name():
    from circuitc.syntax import KEYWORDS, _parser
    reserved = re.search(r"\(\?!\((.*?)\)", _parser().get_terminal("NAME").pattern.value).group(1).split("|")
    assert sorted(reserved) == sorted(KEYWORDS)
    assert parse("rooty = iff").body == (Assign(Name("rooty"), Name("iff")),)
    assert "unexpected keyword 'root'" in syntax_error("y = 1 + root").message
    assert expr("btree(x, units=2)") == Call(Name("btree"), (Name("x"),), (KeywordArg("units", Int(2)),))


def test_declarations():
    body = parse('include "lib/a.pc"\nparam n = 16\nvars x[n] states 256 units 8 product kronecker\n').body
    assert body == (Include("lib/a.pc"), Param("n", Int(16)),
                    Vars("x", Name("n"), states=Int(256), units=Int(8), product="kronecker"))
    assert parse("vars y[4] states 2").body == (Vars("y", Int(4), states=Int(2)),)


def test_statements():
    (d,) = parse("""
        def f(a, b=2) {
            for i in 0..a { x[i].units = b }
            if a > 1 { return x[0:a] } else if a == 1 { g(a) } else { root x[0] }
        }""").body
    assert d == Def("f", (DefParam("a"), DefParam("b", Int(2))), Block((
        For("i", BinOp("..", Int(0), Name("a")), Block((
            SetUnits(Index(Name("x"), (Name("i"),)), Name("b")),))),
        If(BinOp(">", Name("a"), Int(1)),
           Block((Return(Index(Name("x"), (Slice(Int(0), Name("a")),))),)),
           Block((If(BinOp("==", Name("a"), Int(1)),
                     Block((ExprStmt(Call(Name("g"), (Name("a"),))),)),
                     Block((Root(Index(Name("x"), (Int(0),))),))),))),
    )))


def test_root_may_define_its_region():
    assert parse("root x[0:2] = x[0] * x[1]").body == (
        Root(Index(Name("x"), (Slice(Int(0), Int(2)),)),
             BinOp("*", Index(Name("x"), (Int(0),)), Index(Name("x"), (Int(1),)))),)


def test_statements_may_share_a_line_and_use_semicolons():
    assert parse("a = 1; b = 2 c = 3").body == (Assign(Name("a"), Int(1)), Assign(Name("b"), Int(2)),
                                                Assign(Name("c"), Int(3)))


def test_arithmetic_precedence_and_associativity():
    assert expr("1 + 2 * 3") == BinOp("+", Int(1), BinOp("*", Int(2), Int(3)))
    assert expr("8 - 4 - 2") == BinOp("-", BinOp("-", Int(8), Int(4)), Int(2))
    assert expr("(1 + 2) // 3 % 4") == BinOp("%", BinOp("//", BinOp("+", Int(1), Int(2)), Int(3)), Int(4))
    assert expr("-2 ** 2") == UnaryOp("-", BinOp("**", Int(2), Int(2)))
    assert expr("2 ** 3 ** 2") == BinOp("**", Int(2), BinOp("**", Int(3), Int(2)))
    assert expr("0..n-1") == BinOp("..", Int(0), BinOp("-", Name("n"), Int(1)))
    assert expr("not a and b or c < 2") == BinOp("or", BinOp("and", UnaryOp("not", Name("a")), Name("b")),
                                                 BinOp("<", Name("c"), Int(2)))
    assert expr("true != false") == BinOp("!=", Bool(True), Bool(False))


def test_region_expressions():
    assert expr("x[0:4] * x[4:8] | x[0, 2:4, :1] ** x[5:]@left") == BinOp(
        "|",
        BinOp("*", Index(Name("x"), (Slice(Int(0), Int(4)),)), Index(Name("x"), (Slice(Int(4), Int(8)),))),
        BinOp("**", Index(Name("x"), (Int(0), Slice(Int(2), Int(4)), Slice(None, Int(1)))),
              Tagged(Index(Name("x"), (Slice(Int(5), None),)), Str("left"))))
    assert expr('x[0]@"a b"') == Tagged(Index(Name("x"), (Int(0),)), Str("a b"))
    assert expr("x[0]@3") == Tagged(Index(Name("x"), (Int(0),)), Int(3))
    assert expr("x[0]@(t)") == Tagged(Index(Name("x"), (Int(0),)), Name("t"))


def test_calls_lists_and_comprehensions():
    assert expr("f(1, [2, 3], k=[i * 2 for i in 0..4 if i != 1])") == Call(
        Name("f"), (Int(1), ListLit((Int(2), Int(3)))),
        (KeywordArg("k", ListComp(BinOp("*", Name("i"), Int(2)), "i", BinOp("..", Int(0), Int(4)),
                                  BinOp("!=", Name("i"), Int(1)))),))
    assert expr("[]") == ListLit(())
    assert expr('"lib.pc"') == Str("lib.pc")


def test_spans_locate_nodes_and_do_not_take_part_in_equality():
    module = parse("param n = 4\n\nx[0:2] = x[0] * x[1]\n", file="s.pc")
    assign = module.body[1]
    assert (assign.span.file, assign.span.line, assign.span.column) == ("s.pc", 3, 1)
    assert assign.span.source_line == "x[0:2] = x[0] * x[1]"
    assert assign.value.right.span.column == 17
    assert parse("param   n=4 x[0:2]=x[0]*x[1]").body == module.body


def test_comments_are_kept_aside():
    module = parse('# top\nparam n = 4  # window\nx = "#not a comment"\n')
    assert [(c.text, c.span.line) for c in module.comments] == [("# top", 1), ("# window", 2)]
    assert module.body[1] == Assign(Name("x"), Str("#not a comment"))


@pytest.mark.parametrize("text, line, column, message", [
    ("x = ", 1, 5, "unexpected end of file; expected an expression"),
    ("x = 3 +* 2", 1, 8, "unexpected '*'; expected an expression"),
    ("def f(a { }", 1, 9, "unexpected '{'; expected one of ')', ',', '='"),
    ("if n > 1 {\n  y = 1\n", 2, 8, "unexpected end of file; expected one of '}', an expression, a statement"),
    ("y = (1 + 2", 1, 11, "unexpected end of file; expected ')'"),
    ('y = "abc', 1, 5, "unterminated string"),
    ("y = 1 $ 2", 1, 7, "unexpected character '$'"),
    ("root = 3", 1, 6, "unexpected '='; expected an expression"),
    ("vars x[3] states 2 states 3", 1, 20, "'states' is given twice in one vars declaration"),
    ("f(a=1, 2)", 1, 8, "a positional argument cannot follow a keyword argument"),
])
def test_syntax_errors_are_located_and_say_what_was_expected(text, line, column, message):
    d = syntax_error(text)
    assert (d.file, d.line, d.column) == ("f.pc", line, column)
    assert message in d.message
    rendered = d.render()
    assert rendered.startswith(f"f.pc:{line}:{column}: error: ")
    source_line, caret = rendered.splitlines()[1:3]
    assert source_line.strip() == text.splitlines()[line - 1].strip()
    assert caret.index("^") - 4 == column - 1  # the caret sits under the column
