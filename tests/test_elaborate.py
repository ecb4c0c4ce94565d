"""Elaboration: every language feature, the example files, parameters, includes, and the
located semantic errors."""

import gc
import time
from pathlib import Path

import pytest

from circuitc import CircuitError, elaborate, load_graph, parse
from circuitc.builders import btree_graph, cp_graph, ff_graph, hmm_graph, random_tree_graph

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def graph_of(body, header="vars x[4] states 2 units 3\n", **bindings):
    return elaborate(parse(header + body, file="t.pc"), **bindings)


def structure(graph):
    """Regions (id -> scope, units) and partitions (parent, children, kind) of a graph."""
    regions = {r.id: (r.scope, r.units) for r in graph.regions.values()}
    partitions = [(p.parent, p.children, p.product) for p in graph.partitions]
    return regions, partitions


def same_structure(a, b):
    ra, pa = structure(a)
    rb, pb = structure(b)
    return ra == rb and sorted(pa) == sorted(pb) and (a.root, a.variables, a.states, a.units, a.product) == \
        (b.root, b.variables, b.states, b.units, b.product)


def error_of(body, header="vars x[4] states 2 units 3\n", **bindings):
    with pytest.raises(CircuitError) as info:
        graph_of(body, header, **bindings)
    d, *notes = info.value.diagnostics
    assert all(note.severity == "note" for note in notes)
    return d


# ----------------------------------------------------------------------------- the paper's structures

@pytest.mark.parametrize("n, r, v", [(2, 3, 4), (3, 2, 2), (7, 4, 5), (16, 32, 256)])
def test_examples_match_the_paper_structures_region_by_region(n, r, v):
    loaded = {name: load_graph(EXAMPLES / f"{name}.pc", **({"n": n, "v": v} | ({} if name == "ff" else {"r": r})))
              for name in ("ff", "cp", "hmm", "btree")}
    assert same_structure(loaded["ff"], ff_graph(n, v))
    assert same_structure(loaded["cp"], cp_graph(n, r, v))
    assert same_structure(loaded["hmm"], hmm_graph(n, r, v))
    assert same_structure(loaded["btree"], btree_graph(n, r, v))
    # and the exported JSON of each is exactly the builders' JSON, partition order included
    assert loaded["btree"].to_json() == btree_graph(n, r, v).to_json()


def test_paper_structures_follow_the_design_definitions():
    n, r = 6, 4
    hmm = load_graph(EXAMPLES / "hmm.pc", n=n, r=r)
    # HMM: region x[i:n] = x[i] * x[i+1:n] for every i, r units, root 1 unit
    expected = {(f"x[{i}:{n}]", (f"x{i}", f"x[{i + 1}:{n}]" if i + 1 < n - 1 else f"x{n - 1}")) for i in range(n - 1)}
    assert {(p.parent, p.children) for p in hmm.partitions} == expected
    assert {r_.units for r_ in hmm.regions.values() if r_.id != hmm.root} == {r} and hmm.regions[hmm.root].units == 1
    # CP: root (1 unit) = one hadamard partition of the n input regions with r units
    cp = load_graph(EXAMPLES / "cp.pc", n=n, r=r)
    assert [(p.parent, p.children, p.product) for p in cp.partitions] == \
        [("x[0:6]", tuple(f"x{i}" for i in range(n)), "hadamard")]
    assert [cp.regions[f"x{i}"].units for i in range(n)] == [r] * n
    # FF: one partition of the n input regions, 1 unit everywhere
    ff = load_graph(EXAMPLES / "ff.pc", n=n)
    assert {x.units for x in ff.regions.values()} == {1} and len(ff.partitions) == 1
    # BTree: halves recursively (left half the smaller), r units, root 1 unit
    bt = load_graph(EXAMPLES / "btree.pc", n=5, r=r)
    assert {p.parent: p.children for p in bt.partitions} == {
        "x[0:5]": ("x[0:2]", "x[2:5]"), "x[0:2]": ("x0", "x1"), "x[2:5]": ("x2", "x[3:5]"), "x[3:5]": ("x3", "x4")}


@pytest.mark.parametrize("name, expected", [
    ("ff", lambda: ff_graph(16, 256)), ("cp", lambda: cp_graph(16, 32, 256)),
    ("hmm", lambda: hmm_graph(16, 32, 256)), ("btree", lambda: btree_graph(16, 32, 256)),
])
def test_builtin_generators_match_the_builders(name, expected):
    graph = load_graph(EXAMPLES / "builtin.pc", structure=name)
    regions, partitions = structure(graph)
    expected_regions, expected_partitions = structure(expected())
    assert regions == expected_regions and sorted(partitions) == sorted(expected_partitions)


def test_random_tree_example_matches_the_builder():
    graph = load_graph(EXAMPLES / "random_tree.pc", seed=3)
    expected = random_tree_graph(16, 8, 256, depth=3, repetitions=4, seed=3)
    assert structure(graph)[0] == structure(expected)[0]
    assert sorted(structure(graph)[1]) == sorted(structure(expected)[1])
    assert len(graph.partitions_of(graph.root)) == 4


def test_mixture_example_has_two_partitions_at_the_root():
    graph = load_graph(EXAMPLES / "mixture.pc")
    (chain,), (tree,) = (p.children for p in graph.partitions_of(graph.root))
    assert (chain, tree) == ("x[0:8]@chain", "x[0:8]@tree")
    assert graph.regions["x[1:8]@chain"].scope == tuple(range(1, 8))
    assert graph.partitions_of("x[4:8]@tree")[0].children == ("x[4:6]@tree", "x[6:8]@tree")
    assert "x3" in graph.regions and "x3@tree" not in graph.regions  # the inputs are shared


def test_every_example_loads():
    for path in EXAMPLES.glob("*.pc"):
        load_graph(path)


@pytest.mark.parametrize("source", [
    "vars x[n] states 2 units 3\ndef t(lo, hi) { if hi - lo > 1 { m = (lo + hi) // 2\n"
    "x[lo:hi] = t(lo, m) * t(m, hi) }\nreturn x[lo:hi] }\nroot t(0, n)",
    "vars x[n] states 2 units 3\nroot btree(x)",
    "vars x[n] states 2 units 3\nroot random_tree(x, repetitions=2, seed=1)",
])
def test_elaborating_4096_variables_takes_under_a_second(source):
    module = parse("param n = 4\n" + source)
    gc.collect()
    gc.disable()  # times the elaborator, not collections of the objects earlier tests left in this process
    try:
        start = time.perf_counter()
        graph = elaborate(module, n=4096)
        seconds = time.perf_counter() - start
    finally:
        gc.enable()
    assert seconds < 1.0
    assert len(graph.regions[graph.root].scope) == 4096


# ----------------------------------------------------------------------------- language features

def test_parameters_defaults_bindings_and_expressions_over_earlier_parameters():
    source = parse("param n = 4\nparam r = n * 2\nparam kind = \"a\"\nparam deep = false\n"
                   "vars x[n] states 2 units r\nroot x[0:n]\nx[0:n] = prod([x[i] for i in 0..n])")
    assert elaborate(source).regions["x0"].units == 8
    assert elaborate(source, n=3).regions["x0"].units == 6
    assert elaborate(source, n=3, r=5, kind="b", deep=True).regions["x0"].units == 5


def test_unknown_bindings_list_the_parameters():
    source = parse("param n = 4\nparam r = 2\nvars x[n] states 2\nroot x[0]", file="p.pc")
    with pytest.raises(CircuitError, match=r"unknown parameter m; the parameters of p.pc are: n, r"):
        elaborate(source, m=3)


def test_bindings_must_have_the_parameters_type():
    d = error_of("", header='param n = 4\nvars x[n] states 2\n', n="four")
    assert d.line == 1 and 'parameter n is a number (default 4), but it was bound to "four"' in d.message


def test_vars_declaration_sets_defaults():
    graph = graph_of("x[0:2] = x[0] * x[1]\nroot x[0:2]", header="vars x[2] states 7 units 5 product kronecker\n")
    assert (graph.variables, graph.states, graph.units, graph.product) == (2, 7, 5, "kronecker")
    assert graph.partitions[0].product == "kronecker"  # `*` uses the declared kind
    assert graph.to_json()["partitions"][0].get("product") is None
    assert graph_of("root x[0]", header="vars x[1] states 2\n").units == 1


def test_integer_arithmetic_comparisons_and_logic():
    graph = graph_of("""
        a = 7 // 2 + 7 % 3 * 2 - 2 ** 3      # 3 + 2 - 8 = -3
        b = -a
        ok = (b == 3) and not (b != 3) and 1 < 2 and 2 <= 2 and 3 > 2 and 3 >= 3 and (false or true)
        if ok { x[0:4] = x[0:2] * x[2:4] } else { x[0:4] = x[0] * x[1:4] }
        x[0:2] = x[0] * x[1]
        x[2:4] = x[2] * x[3]
        root x[0:4]""")
    assert graph.partitions_of("x[0:4]")[0].children == ("x[0:2]", "x[2:4]")


def test_lists_ranges_and_builtins():
    graph = graph_of("""
        evens = [i for i in 0..4 if i % 2 == 0]
        odds = range(3, 0, -2)
        n = len(evens + odds) + min(1, 2) + max([0, 1])   # 4 + 1 + 1
        x[evens] = hadamard(x[0], x[2])
        x[odds].units = n
        x[odds] = kron([x[1], x[3]])
        x[0:4] = x[evens] ** x[odds]
        root x[0:4]""")
    assert graph.regions["x{1,3}"].units == 6
    assert [(p.parent, p.children, p.product) for p in graph.partitions] == [
        ("x{0,2}", ("x0", "x2"), "hadamard"), ("x{1,3}", ("x1", "x3"), "kronecker"),
        ("x[0:4]", ("x{0,2}", "x{1,3}"), "kronecker")]


def test_region_literals_slices_sets_and_tags():
    graph = graph_of("""
        x[:] = x[0, 1] * x[2:]
        x[0, 1] = x[0] * x[1]@a
        x[2:] = x[2] * x[3]
        x[1]@a.units = 2
        root x[0:4]""")
    assert set(graph.regions) == {"x[0:4]", "x[0:2]", "x[2:4]", "x0", "x1@a", "x2", "x3"}
    assert graph.regions["x1@a"].scope == (1,) and graph.regions["x1@a"].units == 2
    assert graph.regions["x[0:4]"].units == 1  # the root defaults to one unit


def test_functions_recursion_defaults_and_keywords():
    graph = graph_of("""
        def split(lo, hi, tag="t") {
            if hi - lo == 1 { return x[lo] }
            mid = (lo + hi) // 2
            x[lo:hi]@(tag) = split(lo, mid, tag=tag) * split(mid, hi, tag)
            return x[lo:hi]@(tag)
        }
        root split(hi=4, lo=0)""")
    assert graph.root == "x[0:4]@t"
    assert graph.partitions_of("x[0:4]@t")[0].children == ("x[0:2]@t", "x[2:4]@t")


def test_root_with_a_definition():
    graph = graph_of("root x[0:4] = x[0:2] * x[2:4] | x[0] * x[1:4]\nx[0:2] = cp(x[0:2], top=3)\n"
                     "x[2:4] = cp(x[2:4], top=3)\nx[1:4] = cp(x[1:4], top=3)")
    assert graph.root == "x[0:4]" and len(graph.partitions_of("x[0:4]")) == 2


def test_functions_may_be_called_before_their_definition():
    graph = graph_of("root f()\ndef f() { x[0:4] = x[0] * x[1] * x[2] * x[3]; return x[0:4] }")
    assert graph.partitions[0].children == ("x0", "x1", "x2", "x3")


def test_several_partitions_single_child_partitions_and_identical_redefinition():
    graph = graph_of("""
        x[0:4] = x[0:2] * x[2:4] | x[0] * x[1:4] | x[0:4]@inner
        x[0:4]@inner = x[0:2] * x[2:4]
        x[0:2] = x[0] * x[1]; x[0:2] = x[0] * x[1]     # the same definition again is harmless
        x[2:4] = x[2] * x[3]; x[1:4] = x[1] * x[2:4]
        root x[0:4]""")
    assert [p.children for p in graph.partitions_of("x[0:4]")] == [("x[0:2]", "x[2:4]"), ("x0", "x[1:4]"),
                                                                 ("x[0:4]@inner",)]
    assert len(graph.partitions_of("x[0:2]")) == 1


def test_builtin_generators_with_tags_and_options():
    graph = graph_of("x[0:4] = btree(x@b, units=2, top=3) | hmm(x[0:4]@h, top=3)\nroot x[0:4]")
    assert graph.regions["x[0:4]@b"].units == 3 and graph.regions["x[0:2]@b"].units == 2
    assert graph.regions["x[1:4]@h"].units == 3  # hmm's default units are the declared 3
    assert "x0@b" in graph.regions and "x0@h" in graph.regions
    assert graph_of("root ff(x)").regions["x0"].units == 1
    assert structure(graph_of("x[0:4] = hmm(x[0:4])\nroot x[0:4]")) == structure(graph_of("root hmm(x)"))
    rat = graph_of("root random_tree(x, units=2, depth=1, repetitions=2, seed=5)")
    assert len(rat.partitions_of(rat.root)) == 2


def test_spans_travel_into_regions_and_partitions():
    graph = graph_of("x[0:4] = x[0:2] * cp(x[2:4], top=3)\nx[0:2] = x[0] * x[1]\nroot x[0:4]")
    assert graph.partitions_of("x[0:4]")[0].span.line == 2 and graph.regions["x[0:4]"].span.line == 2
    assert graph.regions["x0"].span.line == 3 and graph.regions["x0"].span.column == 10
    assert graph.partitions_of("x[2:4]")[0].span.line == 2  # made by a built-in: its call
    assert graph.regions["x2"].span.column == 19


# ----------------------------------------------------------------------------- includes

def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_include_is_relative_to_the_including_file_and_runs_once(tmp_path):
    write(tmp_path / "lib" / "defs.pc", 'param r = 5\ninclude "more.pc"\ndef leaf(i) { return x[i] }\n')
    write(tmp_path / "lib" / "more.pc", "def pair(i) { x[i:i+2] = leaf(i) * leaf(i + 1); return x[i:i+2] }\n")
    main = write(tmp_path / "main.pc", 'include "lib/defs.pc"\ninclude "lib/more.pc"\ninclude "lib/defs.pc"\n'
                                       "vars x[4] states 2 units r\nx[0:4] = pair(0) * pair(2)\nroot x[0:4]\n")
    graph = load_graph(main, r=7)  # parameters of included files are bindable
    assert graph.regions["x0"].units == 7
    # text without a file reads includes below the working directory or an include path only
    absolute = main.read_text().replace('"lib/', f'"{tmp_path}/lib/')
    assert load_graph(absolute, include_paths=[tmp_path]).regions["x0"].units == 5
    with pytest.raises(CircuitError, match="is outside .* and the include paths"):
        load_graph(absolute)


def test_include_cycles_and_missing_files_are_located(tmp_path):
    write(tmp_path / "a.pc", 'include "b.pc"\n')
    write(tmp_path / "b.pc", '\ninclude "a.pc"\n')
    with pytest.raises(CircuitError) as info:
        load_graph(tmp_path / "a.pc")
    (d,) = info.value.diagnostics
    assert d.line == 2 and d.file.endswith("b.pc") and "include cycle: a.pc -> b.pc -> a.pc" in d.message
    write(tmp_path / "c.pc", 'vars x[1] states 2\ninclude "nope.pc"\n')
    with pytest.raises(CircuitError, match='cannot include "nope.pc"') as info:
        load_graph(tmp_path / "c.pc")
    assert info.value.diagnostics[0].line == 2


def test_errors_in_included_files_point_into_them(tmp_path):
    write(tmp_path / "lib.pc", "def f() {\n  return 1 // 0\n}\n")
    main = write(tmp_path / "main.pc", 'include "lib.pc"\nvars x[1] states 2\ny = f()\nroot x[0]\n')
    with pytest.raises(CircuitError, match="division by zero") as info:
        load_graph(main)
    d, note = info.value.diagnostics
    assert d.file.endswith("lib.pc") and (d.line, d.column) == (2, 15)
    assert note.render().startswith(f"{main}:3:5: note: in f(), called here")


def test_errors_inside_functions_say_which_call_failed():
    with pytest.raises(CircuitError) as info:
        graph_of("def t(lo, hi) {\n  if hi - lo > 1 { x[lo:hi] = t(lo, lo + 1) * t(lo + 2, hi) }\n"
                 "  return x[lo:hi]\n}\nroot t(0, 4)")
    error, note = info.value.diagnostics
    assert (error.line, error.message) == (4, "a region needs at least one variable")
    assert (note.line, note.column, note.message) == (3, 47, "in t(lo=4, hi=4), called here")


# ----------------------------------------------------------------------------- semantic errors

@pytest.mark.parametrize("body, line, column, message", [
    ("y = z + 1", 2, 5, "unknown name z"),
    ("y = q\nparam q = 1", 2, 5, "unknown name q yet (it is declared at t.pc:3:1; declarations run in order)"),
    ("y = 1 // (2 - 2)", 2, 11, "division by zero"),
    ("y = 5 % 0", 2, 9, "division by zero"),
    ("y = 2 ** 1000", 2, 5, "2 ** 1000 is too large"),
    ("y = x[4]", 2, 7, "variable x4 does not exist: there are 4 variables, x0 .. x3"),
    ("y = x[0, 0]", 2, 10, "x0 is named twice"),
    ("y = x[2:2]", 2, 5, "a region needs at least one variable"),
    ('y = x["a"]', 2, 7, "variables are chosen by numbers, slices or lists of numbers"),
    ("def f(a) { return a }\ny = f(1, 2)", 3, 5, "f(a) takes 1 argument, got 2"),
    ("def f(a) { return a }\ny = f()", 3, 5, "f(a): missing argument a"),
    ("def f(a) { return a }\ny = f(b=1)", 3, 7, "f(a) has no parameter b"),
    ("def f(i) { return f(i + 1) }\ny = f(0)", 2, 19, "recursion too deep: more than 64 nested calls"),
    ("return 1", 2, 1, "return outside a function"),
    ("x[0] * x[1]", 2, 1, "this statement does nothing"),
    ("y = 1\ny(2)", 3, 1, "the number 1 is not a function"),
    ("y = x[0] + x[1]", 2, 5, "cannot apply + to region x0 and region x1"),
    ("y = x[0] * 2", 2, 5, "cannot apply * to region x0 and the number 2"),
    ("y = (x[0] ** x[1]) * x[2]", 2, 6, "cannot use a kronecker product inside a hadamard product"),
    ("if 1 { }", 2, 4, "a condition must be true or false, got the number 1"),
    ("for i in 3 { }", 2, 10, "for needs a list or a range like 0..n"),
    ("x[0:2] = 3", 2, 10, "a region is defined by products of regions"),
    ("x[0:2] = x[0] * x[1]\nx[0:2] = x[1] * x[0]@b", 3, 1, "region x[0:2] is already defined at t.pc:2:1"),
    ("x[0].units = 2\nx[0].units = 3", 3, 1, "region x0 gets 3 units here, but 2 at t.pc:2:1"),
    ("x[0].units = 0", 2, 14, "a unit count must be at least 1, got 0"),
    ("root x[0:4]\nroot x[0:4]", 3, 1, "the root is declared twice"),
    ("root 3", 2, 6, "the root must be a region like x[0:4], got the number 3"),
    ("def f() { param q = 1 }\ny = f()", 2, 11, "a parameter declaration belongs at the top level"),
    ("for i in 0..2 { vars y[2] states 2 }", 2, 17, "the vars declaration belongs at the top level"),
    ('if true { include "a.pc" }', 2, 11, "include belongs at the top level"),
    ("def f() { def g() { return 1 } }\ny = f()", 2, 11, "def belongs at the top level"),
    ("x = 3", 2, 1, "cannot assign to x: it names the variables"),
    ("def btree() { return 1 }", 2, 1, "def btree would hide the built-in btree"),
    ("def f() { return 1 }\ndef f() { return 2 }", 3, 1, "function f is defined twice (first at t.pc:2:1)"),
    ("y = x[0]@a@b", 2, 5, "region x0@a already has a tag"),
    ("y = btree(3)", 2, 11, "btree builds over a region like x[0:n]"),
    ("y = btree(x, units=0)", 2, 5, "btree: units must be a number of at least 1"),
    ("y = random_tree(x, colour=2)", 2, 20, "random_tree(region, units, top, depth, repetitions, seed) has no "
                                            "parameter colour"),
    ("y = prod([1, 2])", 2, 5, "prod multiplies regions"),
    ("vars y[2] states 2", 2, 1, "variables are declared twice (first at t.pc:1:1)"),
])
def test_semantic_errors_are_located_at_the_offending_span(body, line, column, message):
    d = error_of(body + "\n")
    assert (d.file, d.line, d.column) == ("t.pc", line, column), d.render()
    assert message in d.message
    assert d.render().startswith(f"t.pc:{line}:{column}: error: ")


def test_missing_declarations_are_located_at_the_end_of_the_file():
    d = error_of("y = 1\n", header="")
    assert "no variables declared" in d.message and (d.line, d.column) == (1, 1)
    d = error_of("y = 1\n")
    assert "no root region" in d.message and d.line == 2
    d = error_of("", header="vars x[2] units 2\n")
    assert "say how many states each variable has" in d.message
    d = error_of("", header="vars x[2] states 2 product tucker\n")
    assert "unknown product kind 'tucker'" in d.message
