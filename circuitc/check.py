"""Structural checks of a region graph: every rule of the graph spec (docs/graph-spec.md).

`check_graph` runs every rule and raises one `CircuitError` listing all violations, each naming the
regions and variables involved and located at the source span that created them (`.pc` input).
Each rule is a small function that reads like its definition in the spec.
"""

from __future__ import annotations

from collections.abc import Iterator

import networkx as nx

from .errors import CircuitError, Diagnostic, SourceSpan
from .graph import Partition, RegionGraph, scope_name


def check_graph(graph: RegionGraph) -> RegionGraph:
    """Return `graph` unchanged if it satisfies every structural rule; else raise `CircuitError`
    with one diagnostic per violation, in source order."""
    problems = list(_ids_exist(graph))
    if not problems:  # the other rules look regions up by id
        problems += _cycles(graph)
        problems += _unreachable(graph)
        problems += _root_rules(graph)
        problems += _scopes_in_range(graph)
        problems += _input_scopes(graph)
        for p in graph.partitions:
            problems += _partition_rules(graph, p)
    if problems:
        raise CircuitError(sorted(problems, key=_source_order))
    return graph


def _source_order(d: Diagnostic) -> tuple:
    return (0, "", 0, 0) if d.span is None else (1, d.span.file or "", d.span.line, d.span.column)


def _error(graph: RegionGraph, message: str, span: SourceSpan | None) -> Diagnostic:
    if span is None and graph.source_name:  # JSON input without located regions still names its file
        message = f"{graph.source_name}: {message}"
    return Diagnostic(message, span)


def _region_span(graph: RegionGraph, region_id: str) -> SourceSpan | None:
    region = graph.regions.get(region_id)
    return region.span if region else None


def _name(graph: RegionGraph, region_id: str) -> str:
    """A region in a message: its id, plus its scope when the id does not start with it."""
    region = graph.regions.get(region_id)
    if region is not None and region_id.split("@")[0] == scope_name(region.scope):
        return region_id
    return graph.describe(region_id)


def _vars(scope, shown: int = 8) -> str:
    """Variables in a message: `x4`, `x4, x7`, runs as ranges (`x0..x999999`), at most `shown` items."""
    runs: list[list[int]] = []
    for i in sorted(scope):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    items = [f"x{a}" if a == b else f"x{a}, x{b}" if b == a + 1 else f"x{a}..x{b}" for a, b in runs]
    return _few(items, shown)


def _few(names: list[str], shown: int = 3) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


# ----------------------------------------------------------------------------- the rules

def _ids_exist(graph: RegionGraph) -> Iterator[Diagnostic]:
    """Every id named by the root and by the partitions is a region."""
    if graph.root not in graph.regions:
        yield _error(graph, f"the root {graph.root!r} is not a region", graph.span)
    for p in graph.partitions:
        if p.parent not in graph.regions:
            yield _error(graph, f"a partition's parent {p.parent!r} is not a region", p.span)
        for child in p.children:
            if child not in graph.regions:
                yield _error(graph, f"partition of {p.parent}: child {child!r} is not a region", p.span)


def _cycles(graph: RegionGraph) -> Iterator[Diagnostic]:
    """The graph is acyclic: one diagnostic per strongly connected group of regions."""
    order = {rid: k for k, rid in enumerate(graph.regions)}
    for component in nx.strongly_connected_components(graph.digraph):
        first = min(component, key=order.__getitem__)
        if len(component) == 1 and not graph.digraph.has_edge(first, first):
            continue
        cycle = [u for u, _ in nx.find_cycle(graph.digraph.subgraph(component), first)] + [first]
        yield _error(graph, "regions form a cycle: " + " -> ".join(_name(graph, r) for r in cycle),
                     _region_span(graph, first))


def _unreachable(graph: RegionGraph) -> Iterator[Diagnostic]:
    """Every region is reachable from the root."""
    reachable = nx.descendants(graph.digraph, graph.root) | {graph.root}
    for rid in graph.regions:
        if rid not in reachable:
            yield _error(graph, f"region {_name(graph, rid)} is not reachable from the root {graph.root}",
                         _region_span(graph, rid))


def _root_rules(graph: RegionGraph) -> Iterator[Diagnostic]:
    """The root covers all n variables and has exactly one unit."""
    root = graph.regions[graph.root]
    span = root.span or graph.span
    missing = set(range(graph.variables)) - set(root.scope)
    if missing:
        yield _error(graph, f"the root {_name(graph, root.id)} does not cover all {graph.variables} variables: "
                            f"{_vars(missing)} {'is' if len(missing) == 1 else 'are'} missing", span)
    if root.units != 1:
        yield _error(graph, f"the root {_name(graph, root.id)} has {root.units} units; "
                            f"the root must have exactly 1", span)


def _scopes_in_range(graph: RegionGraph) -> Iterator[Diagnostic]:
    """Every variable index is in 0 .. n-1 (and every scope names at least one)."""
    for region in graph.regions.values():
        outside = [i for i in region.scope if not 0 <= i < graph.variables]
        if outside:
            yield _error(graph, f"region {region.id} uses {_vars(outside)}, but the variables are "
                                f"x0 .. x{graph.variables - 1}", region.span)
        if not region.scope:
            yield _error(graph, f"region {region.id} has an empty scope", region.span)


def _input_scopes(graph: RegionGraph) -> Iterator[Diagnostic]:
    """An input region (one without partitions) has exactly one variable."""
    for region in graph.input_regions():
        if len(region.scope) > 1:
            yield _error(graph, f"input region {_name(graph, region.id)} has {len(region.scope)} variables; "
                                f"a region without partitions must have exactly one (give it a partition)",
                         region.span)


def _partition_rules(graph: RegionGraph, p: Partition) -> Iterator[Diagnostic]:
    parent = graph.regions[p.parent]
    name = f"partition of {_name(graph, p.parent)}"
    span = p.span or parent.span
    if not p.children:
        yield _error(graph, f"{name} has no children; a partition has at least one", span)
        return
    yield from _smooth(graph, p, name, span)
    yield from _decomposable(graph, p, name, span)
    yield from _hadamard_units(graph, p, name, span)


def _smooth(graph: RegionGraph, p: Partition, name: str, span) -> Iterator[Diagnostic]:
    """Smoothness: the children together cover exactly the parent's scope."""
    parent = set(graph.regions[p.parent].scope)
    covered = {i for c in p.children for i in graph.regions[c].scope}
    if covered - parent:
        extra = covered - parent
        culprits = ", ".join(_name(graph, c) for c in p.children if extra & set(graph.regions[c].scope))
        yield _error(graph, f"{name} is not smooth: children {culprits} cover {_vars(extra)}, "
                            f"outside {scope_name(parent)}", span)
    if parent - covered:
        yield _error(graph, f"{name} is not smooth: no child covers {_vars(parent - covered)}", span)


def _decomposable(graph: RegionGraph, p: Partition, name: str, span) -> Iterator[Diagnostic]:
    """Decomposability: the children's scopes are pairwise disjoint.

    One pass over the variables (not over pairs of children): a partition may have thousands."""
    owner: dict[int, int] = {}  # variable -> position of the first child that has it
    shared: dict[tuple[int, int], list[int]] = {}  # (first child, later child) -> shared variables
    for k, child in enumerate(p.children):
        for i in graph.regions[child].scope:
            if i in owner:
                shared.setdefault((owner[i], k), []).append(i)
            else:
                owner[i] = k
    for (j, k), variables in sorted(shared.items()):
        a, b = p.children[j], p.children[k]
        pair = f"child {_name(graph, a)} appears twice" if a == b else \
            f"children {_name(graph, a)} and {_name(graph, b)} share {_vars(variables)}"
        yield _error(graph, f"{name} is not decomposable: {pair}", span)


def _hadamard_units(graph: RegionGraph, p: Partition, name: str, span) -> Iterator[Diagnostic]:
    """A hadamard product multiplies unit j of every child, so all children have equal units."""
    by_units: dict[int, list[str]] = {}
    for c in p.children:
        by_units.setdefault(graph.regions[c].units, []).append(_name(graph, c))
    if p.product == "hadamard" and len(by_units) > 1:
        listed = "; ".join(f"{_few(names)} {'has' if len(names) == 1 else 'have'} {u} unit{'s' if u != 1 else ''}"
                           for u, names in by_units.items())
        yield _error(graph, f"hadamard {name} needs children with equal units: {listed} "
                            f"(use ** for a kronecker product, or set .units)", span)
