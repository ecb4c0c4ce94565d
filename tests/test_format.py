"""The canonical printer: parse -> print -> parse is the identity (spans aside), printing is
idempotent, comments survive, and the examples are already canonical."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from circuitc import parse
from circuitc.format import format_module
from circuitc.syntax import (Assign, BinOp, Bool, Call, Index, Int, KeywordArg, ListComp, ListLit, Name, Slice, Str,
                             Tagged, UnaryOp)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXAMPLE_FILES = sorted(EXAMPLES.rglob("*.pc"))


def fmt(text):
    return format_module(parse(text))


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_examples_are_canonical_and_round_trip(path):
    text = path.read_text()
    assert fmt(text) == text
    assert parse(fmt(text)) == parse(text)


def test_layout_is_normalised():
    messy = ("param n=4 vars x[n] states 2 units 2 def f(a,b=1){if a>b{return x[a]}else if a==b{return x[0]} "
             "else{return x[b]}} x[0:4]=x[0:2]*x[2:4]|x[0:1+1]**x[n-2:n];x[0:2].units=(1+2)*3 root f(3)")
    assert fmt(messy) == """\
param n = 4
vars x[n] states 2 units 2
def f(a, b=1) {
    if a > b {
        return x[a]
    } else if a == b {
        return x[0]
    } else {
        return x[b]
    }
}
x[0:4] = x[0:2] * x[2:4] | x[0:1+1] ** x[n-2:n]
x[0:2].units = (1 + 2) * 3
root f(3)
"""


def test_comments_and_blank_lines_are_kept():
    text = """\
# header

param n = 4   # window
for i in 0..n { # loop
  # inside
  y = i


  z = i  # after
  # before the brace
}
if true {} else {  # else
}
# the end
"""
    assert fmt(text) == """\
# header

param n = 4  # window
for i in 0..n {  # loop
    # inside
    y = i

    z = i  # after
    # before the brace
}
if true {} else {  # else
}
# the end
"""
    assert fmt(fmt(text)) == fmt(text)


def test_statements_that_would_join_the_previous_line_are_separated():
    text = "y = 1; -f(2)\ny = 2; (f)(3); [1](0)"
    assert parse(fmt(text)) == parse(text)


def test_parentheses_only_where_needed():
    assert fmt("y = (a + b) * c - (d - e) - f + (-g) ** 2 + -(g ** 2)") == \
        "y = (a + b) * c - (d - e) - f + (-g) ** 2 + -g ** 2\n"
    assert fmt("y = (a ** b) ** c | a ** (b ** c)") == "y = (a ** b) ** c | a ** b ** c\n"
    assert fmt("y = not (a or b) and (c == d) or (0..2 == e)") == "y = not (a or b) and c == d or 0..2 == e\n"
    assert fmt('y = x[0]@"a b" * x[1]@left * x[2]@(t + 1) * x[3]@"if"') == \
        'y = x[0]@"a b" * x[1]@left * x[2]@(t + 1) * x[3]@"if"\n'


# ----------------------------------------------------------------------------- any expression round-trips

names = st.sampled_from(["a", "b", "n", "x", "lo"])
leaves = st.one_of(st.integers(0, 99).map(Int), names.map(Name), st.booleans().map(Bool),
                   st.sampled_from(["s", "a b", "lib.pc"]).map(Str))
BINARY_OPS = ["or", "and", "==", "!=", "<", "<=", ">", ">=", "..", "|", "+", "-", "*", "//", "%", "**"]


def compound(inner):
    subscript = st.one_of(inner, st.builds(Slice, st.none() | inner, st.none() | inner))
    return st.one_of(
        st.builds(BinOp, st.sampled_from(BINARY_OPS), inner, inner),
        st.builds(UnaryOp, st.sampled_from(["-", "not"]), inner),
        st.builds(Call, names.map(Name), st.lists(inner, max_size=2).map(tuple),
                  st.lists(st.builds(KeywordArg, st.sampled_from(["k", "seed"]), inner), max_size=1,
                           unique_by=lambda k: k.name).map(tuple)),
        st.builds(Index, inner, st.lists(subscript, min_size=1, max_size=3).map(tuple)),
        st.builds(Tagged, inner, st.one_of(st.sampled_from(["t", "a b", "if"]).map(Str), st.integers(0, 9).map(Int),
                                           inner)),
        st.builds(ListLit, st.lists(inner, max_size=3).map(tuple)),
        st.builds(ListComp, inner, names, inner, st.none() | inner),
    )


expressions = st.recursive(leaves, compound, max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(expressions)
def test_any_expression_prints_and_parses_back(expression):
    module = parse("")
    module = type(module)((Assign(Name("y"), expression),))
    text = format_module(module)
    assert parse(text).body == module.body, text
    assert format_module(parse(text)) == text
