"""Structure generators: FF, CP, HMM, BTree (the MtPC paper's four) and a seeded RAT-SPN tree.

Each generator adds its regions to a `GraphBuilder` over a given scope and returns the id of the
region that covers the scope; `.pc` files call them through the elaborator, and the `*_graph`
functions wrap them into a whole `RegionGraph` for Python users and tests.
Region ids name their scope (`x3`, `x[0:8]`); a `prefix` keeps two structures over the same
variables apart when they are mixed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from .errors import CircuitError, SourceSpan
from .graph import Partition, Region, RegionGraph, scope_name


class BuilderLimit(Exception):
    """A generator outgrew its builder's budget; `args[0]` names the bound (`regions` or `steps`)."""


class GraphBuilder:
    """Collects regions and partitions; asking twice for the same region id returns it once.

    `max_regions` and `max_entries` (scope entries of all regions) bound what a generator may add:
    going past them raises `BuilderLimit`, before the structure is generated in full."""

    def __init__(self, variable: str = "x", max_regions: int | None = None, max_entries: int | None = None):
        self.variable = variable
        self.regions: dict[str, Region] = {}
        self.partitions: list[Partition] = []
        self.max_regions = max_regions
        self.entries_left = max_entries

    def region(self, scope: Sequence[int], units: int, *, prefix: str = "", name: str | None = None,
               span: SourceSpan | None = None) -> str:
        scope = tuple(sorted(scope))
        rid = name if name is not None else prefix + scope_name(scope, self.variable)
        existing = self.regions.get(rid)
        if existing is None:
            if self.max_regions is not None and len(self.regions) >= self.max_regions:
                raise BuilderLimit("regions")
            if self.entries_left is not None:
                self.entries_left -= len(scope)
                if self.entries_left < 0:
                    raise BuilderLimit("scope_entries")
            self.regions[rid] = Region(rid, scope, units, span)
        elif existing.scope != scope or existing.units != units:
            raise CircuitError(
                f"region {rid} is declared twice: scope {scope_name(existing.scope, self.variable)} "
                f"with {existing.units} units, then scope {scope_name(scope, self.variable)} with {units} units"
            )
        return rid

    def partition(self, parent: str, children: Sequence[str], product: str = "hadamard",
                  span: SourceSpan | None = None) -> None:
        self.partitions.append(Partition(parent, tuple(children), product, span))

    def build(self, root: str, variables: int, states: int, units: int, product: str = "hadamard",
              span: SourceSpan | None = None, source_name: str | None = None) -> RegionGraph:
        return RegionGraph(variables, states, units, product, root, dict(self.regions), list(self.partitions),
                           span=span, source_name=source_name)


def inputs(b: GraphBuilder, scope: Sequence[int], units: int, prefix: str = "") -> list[str]:
    return [b.region([i], units, prefix=prefix) for i in scope]


def ff(b: GraphBuilder, scope: Sequence[int], prefix: str = "") -> str:
    """Fully factorised: one partition of the single-variable regions, one unit everywhere."""
    top = b.region(scope, 1, prefix=prefix)
    b.partition(top, inputs(b, scope, 1, prefix))
    return top


def cp(b: GraphBuilder, scope: Sequence[int], units: int, top_units: int = 1, prefix: str = "") -> str:
    """Canonical polyadic: a mixture of `units` fully factorised components (one hadamard partition)."""
    top = b.region(scope, top_units, prefix=prefix)
    b.partition(top, inputs(b, scope, units, prefix))
    return top


def hmm(b: GraphBuilder, scope: Sequence[int], units: int, top_units: int = 1, prefix: str = "") -> str:
    """Hidden-Markov chain: region x[i:] = x[i] * x[i+1:], the last variable an input region."""
    scope = sorted(scope)
    if len(scope) == 1:
        return b.region(scope, top_units if top_units != units else units, prefix=prefix)
    rest = b.region(scope[-1:], units, prefix=prefix)
    for k in range(len(scope) - 2, -1, -1):
        region = b.region(scope[k:], top_units if k == 0 else units, prefix=prefix)
        b.partition(region, [b.region([scope[k]], units, prefix=prefix), rest])
        rest = region
    return rest


def btree(b: GraphBuilder, scope: Sequence[int], units: int, top_units: int = 1, prefix: str = "") -> str:
    """Balanced binary tree: split the scope in halves recursively (the left half the smaller one)."""
    scope = sorted(scope)
    return _split(b, scope, units, top_units, prefix)


def _split(b: GraphBuilder, scope: list[int], units: int, region_units: int, prefix: str) -> str:
    region = b.region(scope, region_units, prefix=prefix)
    if len(scope) > 1:
        mid = len(scope) // 2
        b.partition(region, [_split(b, scope[:mid], units, units, prefix),
                             _split(b, scope[mid:], units, units, prefix)])
    return region


def random_tree(b: GraphBuilder, scope: Sequence[int], units: int, top_units: int = 1, *, depth: int | None = None,
                repetitions: int = 1, seed: int = 0, prefix: str = "") -> str:
    """RAT-SPN style: `repetitions` random balanced binary splits of a random permutation of the
    scope, mixed at the top; below `depth` splits a region is fully factorised. Input regions are
    shared by all repetitions. Deterministic for a given seed. Inner regions are named by their
    path from the top (`r1/LR`: repetition 1, left then right), since their scopes are scattered."""
    rng = random.Random(seed)
    scope = sorted(scope)
    if len(scope) == 1:
        return b.region(scope, top_units, prefix=prefix)
    top = b.region(scope, top_units, prefix=prefix)
    for rep in range(repetitions):
        order = list(scope)
        rng.shuffle(order)
        mid = len(order) // 2
        b.partition(top, [_random_split(b, part, units, 1, depth, rng, f"{prefix}r{rep}/{side}", prefix)
                          for side, part in (("L", order[:mid]), ("R", order[mid:]))])
    return top


def _random_split(b: GraphBuilder, order: list[int], units: int, level: int, depth: int | None,
                  rng: random.Random, path: str, input_prefix: str) -> str:
    if len(order) == 1:
        return b.region(order, units, prefix=input_prefix)
    region = b.region(order, units, name=path)
    if depth is not None and level >= depth:
        b.partition(region, [b.region([i], units, prefix=input_prefix) for i in sorted(order)])
        return region
    shuffled = list(order)
    rng.shuffle(shuffled)
    mid = len(shuffled) // 2
    b.partition(region, [_random_split(b, part, units, level + 1, depth, rng, path + side, input_prefix)
                         for side, part in (("L", shuffled[:mid]), ("R", shuffled[mid:]))])
    return region


# ------------------------------------------------------------------ whole graphs, for Python users

def ff_graph(n: int, v: int = 256) -> RegionGraph:
    b = GraphBuilder()
    return b.build(ff(b, range(n)), n, v, units=1)


def cp_graph(n: int, r: int, v: int = 256) -> RegionGraph:
    b = GraphBuilder()
    return b.build(cp(b, range(n), r), n, v, units=r)


def hmm_graph(n: int, r: int, v: int = 256) -> RegionGraph:
    b = GraphBuilder()
    return b.build(hmm(b, range(n), r), n, v, units=r)


def btree_graph(n: int, r: int, v: int = 256) -> RegionGraph:
    b = GraphBuilder()
    return b.build(btree(b, range(n), r), n, v, units=r)


def random_tree_graph(n: int, r: int, v: int = 256, *, depth: int | None = None, repetitions: int = 1,
                      seed: int = 0) -> RegionGraph:
    b = GraphBuilder()
    top = random_tree(b, range(n), r, depth=depth, repetitions=repetitions, seed=seed)
    return b.build(top, n, v, units=r)
