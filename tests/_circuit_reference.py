"""Test helpers for the compiler back end: a random region-graph generator and a brute-force
evaluator written straight from docs/graph-spec.md (recursion over the graph, no plan).

Only the parameter layout (`circ.param_layout`, the runtime contract) is shared with the code under
test; the evaluator reads each region's logits from its slot and recomputes everything else.
"""

from __future__ import annotations

import itertools
import random

import numpy as np

from circuitc.graph import Partition, Region, RegionGraph


def random_graph(seed: int, max_vars: int = 4, max_states: int = 3, max_units: int = 3) -> RegionGraph:
    """A random smooth, decomposable region graph: several partitions per region, mixed hadamard and
    kronecker products, one-child partitions, regions shared between parents, inputs with differing
    unit counts."""
    rng = random.Random(seed)
    n = rng.randint(1, max_vars)
    v = rng.randint(2, max_states)
    regions: dict[str, Region] = {}
    partitions: list[Partition] = []
    by_scope: dict[tuple[int, ...], list[str]] = {}

    def new_region(scope: tuple[int, ...], units: int) -> str:
        rid = f"r{len(regions)}"
        regions[rid] = Region(rid, scope, units)
        by_scope.setdefault(scope, []).append(rid)
        return rid

    def build(scope: tuple[int, ...], units: int, budget: int, above: frozenset = frozenset()) -> str:
        # reuse an existing region of this scope and unit count now and then (a DAG, not a tree),
        # never one being built above this one (that would be a cycle)
        same = [r for r in by_scope.get(scope, []) if regions[r].units == units and r not in above]
        if same and rng.random() < 0.4:
            return rng.choice(same)
        rid = new_region(scope, units)
        inner = len(scope) > 1 or (budget > 0 and rng.random() < 0.3)
        if not inner:
            return rid
        for _ in range(rng.randint(1, 3 if len(scope) > 1 else 1)):
            parts = _split(scope, rng)
            if len(parts) == 1 and budget <= 0:
                parts = _split(scope, rng, at_least=2) if len(scope) > 1 else parts
            kind = rng.choice(["hadamard", "kronecker"])
            if kind == "hadamard":
                k = rng.randint(1, max_units)
                child_units = [k] * len(parts)
            else:
                child_units = [rng.randint(1, max_units) for _ in parts]
            nested = budget - 1 if len(parts) == 1 else budget
            children = [build(p, u, nested, above | {rid}) for p, u in zip(parts, child_units)]
            partitions.append(Partition(rid, tuple(children), kind))
        return rid

    root = build(tuple(range(n)), 1, budget=1)  # n = 1 may give an input root: valid too
    order = list(regions)
    rng.shuffle(order)  # region order must not matter
    regions = {rid: regions[rid] for rid in order}
    return RegionGraph(variables=n, states=v, units=2, product="hadamard", root=root, regions=regions,
                       partitions=partitions)


def _split(scope: tuple[int, ...], rng: random.Random, at_least: int = 1) -> list[tuple[int, ...]]:
    """A random partition of `scope` into 1..3 non-empty blocks (scattered, not only contiguous)."""
    if len(scope) == 1:
        return [scope]
    k = rng.randint(max(at_least, 1), min(3, len(scope)))
    shuffled = list(scope)
    rng.shuffle(shuffled)
    cuts = sorted(rng.sample(range(1, len(scope)), k - 1))
    blocks = [tuple(sorted(shuffled[a:b])) for a, b in zip([0] + cuts, cuts + [len(scope)])]
    return blocks


class Reference:
    """The spec's semantics, evaluated by direct recursion in float64 numpy."""

    def __init__(self, graph: RegionGraph, layout, theta: np.ndarray):
        self.graph = graph
        self.logits = {}
        for slot in layout:
            block = theta[slot.offset:slot.offset + slot.shape[0] * slot.shape[1]].reshape(slot.shape)
            self.logits[slot.region] = np.asarray(block, dtype=np.float64)

    @staticmethod
    def _softmax(a: np.ndarray) -> np.ndarray:
        e = np.exp(a - a.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def units(self, rid: str, x, keep, maximise: bool = False) -> np.ndarray:
        """The units of region `rid` at assignment `x` (variables with keep False summed out,
        or maximised over with `maximise`)."""
        g = self.graph
        parts = g.partitions_of(rid)
        if not parts:
            (var,) = g.regions[rid].scope
            probs = self._softmax(self.logits[rid])  # [U, v]
            if keep[var]:
                return probs[:, x[var]]
            return probs.max(-1) if maximise else probs.sum(-1)
        inputs = []
        for p in parts:
            vals = [self.units(c, x, keep, maximise) for c in p.children]
            if p.product == "hadamard" or len(vals) == 1:
                out = np.prod(np.stack(vals), axis=0)
            else:
                out = vals[0]
                for val in vals[1:]:
                    out = np.outer(out, val).reshape(-1)
            inputs.append(out)
        stacked = np.concatenate(inputs)  # [K]
        w = self._softmax(self.logits[rid])  # [U, K]
        if maximise:
            return (w * stacked).max(-1)
        return w @ stacked

    def prob(self, x, keep=None) -> float:
        keep = [True] * self.graph.variables if keep is None else list(keep)
        return float(self.units(self.graph.root, x, keep)[0])

    def max_product(self, x, keep) -> float:
        return float(self.units(self.graph.root, x, list(keep), maximise=True)[0])

    def joint(self) -> np.ndarray:
        """`[v] * n` table of q over all assignments."""
        n, v = self.graph.variables, self.graph.states
        table = np.zeros([v] * n)
        for x in itertools.product(range(v), repeat=n):
            table[x] = self.prob(x)
        return table
