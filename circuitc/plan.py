"""Lowering: a checked `RegionGraph` becomes a `Plan`, the layered einsum program every runtime
program of `circuitc.runtime` executes.

A region's *depth* is 0 for input regions and 1 + the largest depth of its children otherwise. Layer
`d` (d >= 1) first computes the product units of every partition whose parent has depth `d`, then
the sum units of every region of depth `d`. Same-shaped work is *folded* into one batched tensor
operation:

- a `ProductFold` holds partitions with the same product kind and the same children's unit counts;
- a `SumFold` holds regions with the same unit count `U` and the same number of inputs `K`.

Values live in flat *stores*, one per layer, batch last: store 0 holds the leaves (the input units,
`[Q, B]`), store `d` the sum units of layer `d` (`[F, U, R]` per fold, flattened, then `B`). Every
read between layers is a precomputed flat index over the first dimension (an `index_select` that
copies rows of `B` contiguous values), or nothing at all when the index is a contiguous range
(regions are ordered by their first variable, so a balanced tree's reads are contiguous).

Two *modes* share the folds:

- `full`: one row per region, its value with every variable in its scope observed (or the masked
  leaves summed out);
- `prefix`: a region over `s` variables keeps `s` rows, row `j` being its value with only its first
  `j + 1` variables (in variable order) observed. A product's row reads each child at the row that
  observes the same variables, or a constant zero (log 1: child fully summed out), so all prefix
  marginals `q(x_0..x_i)` come out of the root's `n` rows in one pass (DESIGN.md, the row trick).
  Folds hold regions of unequal scope sizes padded to the largest; padding rows are never read.

Parameter layout (the runtime contract): all input slots first, then all sum slots, blocks row-major
and contiguous. Input slots are ordered by (first variable, graph order); sum slots follow the plan
(layer by layer, fold by fold, region by region), so each sum fold's logits are one contiguous
slice `[F, U, K]` of theta and need no gather.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import opt_einsum
import torch

from .errors import CircuitError
from .graph import RegionGraph
from .plan_file import PLAN_FORMAT

MODES = ("full", "prefix")


@dataclass(frozen=True)
class ParamSlot:
    """One block of the flat parameter vector: `L_in` `[U, v]` (kind "input") or `L_sum` `[U, K]`."""

    kind: str
    region: str
    shape: tuple[int, int]
    offset: int
    variable: int | None = None

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]


@dataclass
class ProductFold:
    """Partitions of one layer computed by one batched op.

    `index[mode]` (`[F * sum(child_units) * R]`, flat into the layer's product source) reads, for
    every partition, child unit and row, the child's value; `rows[mode]` is `R`. Its outputs are
    stored `[F, K_out, R]`."""

    product: str  # "hadamard" or "kronecker"
    child_units: tuple[int, ...]
    partitions: list[int]  # indices into graph.partitions, in fold order
    rows: dict[str, int]
    index: dict[str, torch.Tensor | None]  # None: the contiguous run from start[mode]
    start: dict[str, int]
    einsum: str  # the product in linear space, for reading
    out_offset: dict[str, int] = field(default_factory=dict)  # where its outputs start in the layer's products
    # per mode: rows are a running sum over the children, read once each in variable order
    # (a flat product of single-variable inputs, as in CP and FF: O(n) reads instead of O(n^2))
    cumulative: dict[str, bool] = field(default_factory=lambda: {m: False for m in MODES})
    # per mode: two children with s rows each, the left's variables before the right's (a balanced
    # tree's prefix rows): rows are [left rows | left's last row + right rows], no zero row read
    halves: dict[str, bool] = field(default_factory=lambda: {m: False for m in MODES})

    @property
    def size(self) -> int:
        return len(self.partitions)

    @property
    def outputs(self) -> int:
        """Product units per partition (K contributed to the parent's sums)."""
        if self.product == "hadamard":
            return self.child_units[0]
        return int(np.prod(self.child_units))


@dataclass
class SumFold:
    """Regions of one layer whose sum units are computed by one batched matmul.

    `index[mode]` (`[F * K * R]` into the layer's concatenated products) is `None` when the read is
    the contiguous range starting at `start[mode]`. `child_slot` / `child_unit` (`[F, K, A]`) say, for
    every input `k`, which region slots and units the product behind it selects (the top-down
    tables of sampling and MAP); unused entries point at the sink slot."""

    regions: list[str]
    slots: torch.Tensor  # [F] global region slots (sampling state columns)
    units: int  # U
    inputs: int  # K
    rows: dict[str, int]
    index: dict[str, torch.Tensor | None]
    start: dict[str, int]
    param_offset: int  # offset of the fold's [F, U, K] block in theta
    out_offset: dict[str, int]
    child_slot: torch.Tensor  # [F, K, A]
    child_unit: torch.Tensor  # [F, K, A]
    einsum: str = "bfrk,bfuk->bfru"

    @property
    def size(self) -> int:
        return len(self.regions)

    @property
    def num_params(self) -> int:
        return self.size * self.units * self.inputs


@dataclass
class Layer:
    depth: int
    products: list[ProductFold]
    sums: list[SumFold]
    sources: dict[str, list[int]]  # store ids concatenated (in order) as the products' source
    needs_zero: dict[str, bool]  # a constant 0 appended after the sources (summed-out children)
    product_size: dict[str, int]  # per example, all product folds concatenated
    sum_size: dict[str, int]  # per example, the layer's store


@dataclass
class Plan:
    """Everything the runtime needs, as plain data: layers of folds, index maps, the parameter
    layout, and counts, with the graph it was lowered from. `to_json()` (a plan file, which
    `circuitc.load.load_plan` reads back) and `summary()` show it."""

    num_vars: int
    num_states: int
    layers: list[Layer]
    param_layout: list[ParamSlot]
    input_regions: list[str]  # slot order = leaf order
    input_units: torch.Tensor  # [NI]
    input_variable: torch.Tensor  # [NI]
    leaf_start: torch.Tensor  # [NI] first leaf of each input region
    leaf_variable: torch.Tensor  # [Q]
    num_region_slots: int  # input regions, then sum regions in plan order; column NR is the sink
    root_slot: int
    root_store: int  # 0 when the root is an input region (n = 1)
    root_index: dict[str, torch.Tensor]  # flat index of the root's rows in its store: full [1], prefix [n]
    counts: dict[str, Any]
    # every region has at most one partition and at most one parent partition (FF, CP, HMM, BTree):
    # then every region is reached by every top-down pass, and sampling needs no reachability masks
    always_reached: bool = False
    graph: RegionGraph | None = None  # the checked graph it was lowered from (a head needs it; plan files keep it)

    # -------------------------------------------------------------- sizes

    @property
    def num_leaves(self) -> int:
        return int(self.leaf_variable.numel())

    @property
    def num_input_params(self) -> int:
        return self.num_leaves * self.num_states

    @property
    def num_params(self) -> int:
        last = self.param_layout[-1]
        return last.offset + last.size

    @property
    def sum_folds(self) -> list[SumFold]:
        return [sf for layer in self.layers for sf in layer.sums]

    def store_size(self, store: int, mode: str) -> int:
        return self.num_leaves if store == 0 else self.layers[store - 1].sum_size[mode]

    # -------------------------------------------------------------- views

    def to_json(self) -> dict[str, Any]:
        """The plan as JSON-ready data: the graph spec it was lowered from (inline, first, so that a
        plan file can be loaded back), layers, folds, index maps (a contiguous index as
        `{"start", "length"}`), einsum strings, parameter layout and counts."""
        graph = {} if self.graph is None else {"graph": self.graph.to_json()}
        return {
            "format": PLAN_FORMAT,
            **graph,
            "variables": self.num_vars,
            "states": self.num_states,
            "num_params": self.num_params,
            "num_input_params": self.num_input_params,
            "num_leaves": self.num_leaves,
            "counts": self.counts,
            "param_layout": [
                {"kind": s.kind, "region": s.region, "shape": list(s.shape), "offset": s.offset,
                 "variable": s.variable} for s in self.param_layout
            ],
            "leaf_variable": self.leaf_variable.tolist(),
            "root": {"store": self.root_store, "index": {m: _index_json(t) for m, t in self.root_index.items()}},
            "layers": [_layer_json(layer) for layer in self.layers],
        }

    def summary(self) -> str:
        """A printed table: one line per fold, then totals."""
        head = f"{'layer':>5}  {'op':<10} {'folded':>6} {'units':>6} {'inputs':>6} {'rows':>5} {'params':>9} {'flops':>11}"
        lines = [
            f"plan: {self.num_vars} variables x {self.num_states} states, {len(self.layers)} layers, "
            f"{self.counts['units']} units, {self.num_params} parameters "
            f"({self.num_input_params} input, {self.num_params - self.num_input_params} sum), "
            f"{self.num_leaves} leaves",
            head,
            "-" * len(head),
            f"{0:>5}  {'input':<10} {len(self.input_regions):>6} {'':>6} {self.num_states:>6} {1:>5} "
            f"{self.num_input_params:>9} {2 * self.num_input_params:>11}",
        ]
        for layer in self.layers:
            for pf in layer.products:
                flops = pf.size * pf.rows["full"] * pf.outputs * max(len(pf.child_units) - 1, 0)
                lines.append(f"{layer.depth:>5}  {pf.product:<10} {pf.size:>6} {pf.outputs:>6} "
                             f"{_children_text(pf.child_units):>6} {pf.rows['prefix']:>5} {0:>9} {flops:>11}")
            for sf in layer.sums:
                flops = 2 * sf.size * sf.units * sf.inputs
                lines.append(f"{layer.depth:>5}  {'sum':<10} {sf.size:>6} {sf.units:>6} {sf.inputs:>6} "
                             f"{sf.rows['prefix']:>5} {sf.num_params:>9} {flops:>11}")
        lines.append("-" * len(head))
        for program, flops in self.counts["flops"].items():
            lines.append(f"{program:<22} {flops:>14,} FLOPs per example, {self.counts['ops'][program]} folded ops")
        return "\n".join(lines)


def _children_text(units: tuple[int, ...]) -> str:
    """`32x32` for two children, `16*[1]` for sixteen one-unit children."""
    if len(units) > 2 and len(set(units)) == 1:
        return f"{len(units)}*[{units[0]}]"
    return "x".join(map(str, units))


def _index_json(t: torch.Tensor | None, start: int = 0, length: int = 0) -> Any:
    if t is None:
        return {"start": start, "length": length}
    flat = t.reshape(-1)
    if flat.numel() and torch.equal(flat, torch.arange(int(flat[0]), int(flat[0]) + flat.numel())):
        return {"start": int(flat[0]), "length": flat.numel()}
    return flat.tolist()


def _layer_json(layer: Layer) -> dict[str, Any]:
    return {
        "depth": layer.depth,
        "sources": layer.sources,
        "needs_zero": layer.needs_zero,
        "products": [
            {"product": pf.product, "child_units": list(pf.child_units), "folded": pf.size, "outputs": pf.outputs,
             "rows": pf.rows, "einsum": pf.einsum, "out_offset": pf.out_offset, "cumulative": pf.cumulative,
             "halves": pf.halves,
             "index": {m: _index_json(pf.index[m], pf.start[m], pf.size * pf.rows[m] * sum(pf.child_units))
                       for m in MODES}}
            for pf in layer.products
        ],
        "sums": [
            {"regions": sf.regions, "units": sf.units, "inputs": sf.inputs, "rows": sf.rows, "einsum": sf.einsum,
             "param_offset": sf.param_offset, "out_offset": sf.out_offset,
             "index": {m: _index_json(sf.index[m], sf.start[m], sf.size * sf.rows[m] * sf.inputs) for m in MODES}}
            for sf in layer.sums
        ],
    }


# ====================================================================== lowering


def lower(graph: RegionGraph) -> Plan:
    """Lower a region graph (assumed checked: smooth, decomposable, acyclic) to a `Plan`."""
    if graph.root not in graph.regions:
        raise CircuitError(f"cannot lower: the root {graph.root!r} is not a region")
    depth = _depths(graph)
    order = {rid: (graph.regions[rid].scope[0] if graph.regions[rid].scope else -1, k)
             for k, rid in enumerate(graph.regions)}

    inputs = sorted((rid for rid in graph.regions if graph.is_input(rid)), key=order.__getitem__)
    layout: list[ParamSlot] = []
    offset = 0
    leaf_start, leaf_variable = [], []
    for rid in inputs:
        region = graph.regions[rid]
        if len(region.scope) != 1:
            raise CircuitError(f"cannot lower: input region {graph.describe(rid)} must have a scope of one variable")
        leaf_start.append(len(leaf_variable))
        leaf_variable += [region.scope[0]] * region.units
        layout.append(ParamSlot("input", rid, (region.units, graph.states), offset, region.scope[0]))
        offset += region.units * graph.states

    # Where each region's values live: (store, fold position info) filled in layer by layer.
    loc = _Locations(graph, len(leaf_variable))
    for k, rid in enumerate(inputs):
        loc.set_input(rid, leaf_start[k], slot=k)

    max_depth = max(depth.values())
    by_depth: dict[int, list[str]] = defaultdict(list)
    for rid in sorted(graph.regions, key=order.__getitem__):
        if depth[rid] > 0:
            by_depth[depth[rid]].append(rid)

    layers = []
    next_slot = len(inputs)
    for d in range(1, max_depth + 1):
        layer, offset, next_slot = _lower_layer(graph, d, by_depth[d], loc, layout, offset, next_slot)
        layers.append(layer)

    for layer in layers:  # top-down tables need every region's slot, known only now
        for sf in layer.sums:
            _fill_topdown_tables(graph, sf, loc)

    root_store, _ = loc.store_of(graph.root)
    root_index = {m: torch.tensor(loc.rows_index(graph.root, m), dtype=torch.long) for m in MODES}
    plan = Plan(
        num_vars=graph.variables,
        num_states=graph.states,
        layers=layers,
        param_layout=layout,
        input_regions=inputs,
        input_units=torch.tensor([graph.regions[r].units for r in inputs], dtype=torch.long),
        input_variable=torch.tensor([graph.regions[r].scope[0] for r in inputs], dtype=torch.long),
        leaf_start=torch.tensor(leaf_start, dtype=torch.long),
        leaf_variable=torch.tensor(leaf_variable, dtype=torch.long),
        num_region_slots=next_slot,
        root_slot=loc.slot[graph.root],
        root_store=root_store,
        root_index=root_index,
        counts={},
        graph=graph,
    )
    plan.counts = _counts(graph, plan)
    parents = [c for p in graph.partitions for c in p.children]
    plan.always_reached = (len(parents) == len(set(parents)) and len(parents) == len(graph.regions) - 1
                           and all(len(ks) <= 1 for ks in loc.by_parent.values()))
    return plan


def _depths(graph: RegionGraph) -> dict[str, int]:
    """Depth of every region (0 for inputs), by an iterative post-order walk (no recursion limit,
    no networkx: lowering big graphs stays fast). Raises on a cycle."""
    children: dict[str, list[str]] = defaultdict(list)
    for p in graph.partitions:
        children[p.parent].extend(p.children)
    depth: dict[str, int] = {}
    for top in graph.regions:
        if top in depth:
            continue
        stack, on_path = [(top, False)], set()
        while stack:
            rid, expanded = stack.pop()
            if expanded:
                on_path.discard(rid)
                kids = children.get(rid, [])
                depth[rid] = 1 + max(depth[c] for c in kids) if kids else 0
                continue
            if rid in depth:
                continue
            if rid in on_path:
                raise CircuitError(f"cannot lower: the region graph has a cycle through {graph.describe(rid)}")
            on_path.add(rid)
            stack.append((rid, True))
            for c in children.get(rid, []):
                if c not in graph.regions:
                    raise CircuitError(f"cannot lower: partition of {graph.describe(rid)} names unknown region {c!r}")
                if c not in depth:
                    stack.append((c, False))
    return depth


class _Locations:
    """Where each region's units are stored, per mode: store id, offset of its row 0, rows, units."""

    def __init__(self, graph: RegionGraph, num_leaves: int):
        self.graph = graph
        self.store: dict[str, int] = {}
        self.base: dict[str, dict[str, int]] = {}  # mode -> flat offset of (unit 0, row 0); (u, r) at base + u*R + r
        self.rows: dict[str, dict[str, int]] = {}  # mode -> rows allocated (fold R)
        self.slot: dict[str, int] = {}
        self.store_size: dict[int, dict[str, int]] = {0: {m: num_leaves for m in MODES}}
        # partition indices per parent and K per region, computed once (graph queries are per call)
        self.by_parent: dict[str, list[int]] = defaultdict(list)
        for k, p in enumerate(graph.partitions):
            self.by_parent[p.parent].append(k)
        self.sum_inputs = {rid: sum(graph.num_inputs(graph.partitions[k]) for k in ks)
                           for rid, ks in self.by_parent.items()}

    def set_input(self, rid: str, start: int, slot: int) -> None:
        self.store[rid] = 0
        self.base[rid] = {m: start for m in MODES}
        self.rows[rid] = {m: 1 for m in MODES}
        self.slot[rid] = slot

    def set_sum(self, rid: str, store: int, base: dict[str, int], rows: dict[str, int], slot: int) -> None:
        self.store[rid] = store
        self.base[rid] = base
        self.rows[rid] = rows
        self.slot[rid] = slot

    def store_of(self, rid: str) -> tuple[int, int]:
        return self.store[rid], self.graph.regions[rid].units

    def rows_index(self, rid: str, mode: str) -> list[int]:
        """The root's rows: unit 0 of every row (the root has one unit)."""
        n = len(self.graph.regions[rid].scope) if mode == "prefix" else 1
        return [self.base[rid][mode] + r for r in range(n)]


def _child_rows(parent_scope: tuple[int, ...], child_scopes: list[tuple[int, ...]], mode: str) -> np.ndarray:
    """`[R, k]`: the child row each parent row reads (-1: the child is summed out entirely).

    Full mode: one row, every child fully observed (row 0). Prefix mode: parent row `j` observes its
    first `j + 1` variables, so child `c` observes those of them in its scope."""
    if mode == "full":
        return np.zeros((1, len(child_scopes)), dtype=np.int64)
    owner = {}
    for c, scope in enumerate(child_scopes):
        for var in scope:
            owner[var] = c
    onehot = np.zeros((len(parent_scope), len(child_scopes)), dtype=np.int64)
    for j, var in enumerate(parent_scope):
        onehot[j, owner[var]] = 1
    return np.cumsum(onehot, axis=0) - 1


def _lower_layer(graph: RegionGraph, d: int, regions: list[str], loc: _Locations, layout: list[ParamSlot],
                 param_offset: int, next_slot: int) -> tuple[Layer, int, int]:
    # Sum folds: same units and inputs; regions keep their (first variable, graph) order.
    sum_groups: dict[tuple[int, int], list[str]] = {}
    for rid in regions:
        sum_groups.setdefault((graph.regions[rid].units, loc.sum_inputs[rid]), []).append(rid)

    # Product folds: the partitions of this layer's regions, in parent order. A one-child partition
    # passes its child's units through: a hadamard product of one factor.
    prod_groups: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for rid in (r for group in sum_groups.values() for r in group):
        for k in loc.by_parent[rid]:
            p = graph.partitions[k]
            key = (p.product if len(p.children) > 1 else "hadamard",
                   tuple(graph.regions[c].units for c in p.children))
            prod_groups.setdefault(key, []).append(k)

    def rows_of(rid: str, mode: str) -> int:
        return len(graph.regions[rid].scope) if mode == "prefix" else 1

    # The products read the concatenation of every store they need, then (prefix mode) a zero.
    sources = sorted({loc.store[c] for ks in prod_groups.values() for k in ks for c in graph.partitions[k].children})
    src_offset: dict[str, dict[int, int]] = {m: {} for m in MODES}
    zero_index = {m: 0 for m in MODES}
    for m in MODES:
        for s in sources:
            src_offset[m][s] = zero_index[m]
            zero_index[m] += loc.store_size[s][m]
    needs_zero = {"full": False, "prefix": False}  # set below when some product row reads the zero

    products: list[ProductFold] = []
    part_out: dict[int, dict[str, int]] = {}  # partition -> mode -> flat offset of its row 0 in the products
    prod_total = {m: 0 for m in MODES}
    for (kind, child_units), ks in prod_groups.items():
        rows = {m: max(rows_of(graph.partitions[k].parent, m) for k in ks) for m in MODES}
        outputs = child_units[0] if kind == "hadamard" else int(np.prod(child_units))
        index, start, out_offset = {}, {}, {}
        cumulative = {m: m == "prefix" and kind == "hadamard" and len(child_units) > 1 and all(
            loc.store[c] == 0 and len(graph.regions[c].scope) == 1 for k in ks for c in graph.partitions[k].children)
            for m in MODES}
        halves = {m: m == "prefix" and kind == "hadamard" and not cumulative[m]
                  and _halves(graph, ks, loc, rows[m], child_units)
                  for m in MODES}
        for m in MODES:
            out_offset[m] = prod_total[m]
            if halves[m]:
                # two children, the left's variables all before the right's, s rows each: parent row
                # j < s is left row j, row s + j is left row s-1 (all observed) + right row j. Read
                # the children's rows pair by pair `[F, 2, K, s]`; no row of the zero is needed.
                half = rows[m] // 2
                idx = np.empty((len(ks), 2, child_units[0], half), dtype=np.int64)
                for f, k in enumerate(ks):
                    part_out.setdefault(k, {})[m] = prod_total[m] + f * rows[m] * outputs
                    for c, child in enumerate(_left_right(graph, graph.partitions[k])):
                        at = src_offset[m][loc.store[child]] + loc.base[child][m]
                        idx[f, c] = at + np.arange(child_units[0])[:, None] * half + np.arange(half)
                index[m], start[m] = _contiguous_or_index(idx)
                prod_total[m] += len(ks) * rows[m] * outputs
                continue
            if cumulative[m]:
                # each child once (its only row), read unit-major `[F, K, A]` with the children in
                # variable order, so that a running sum over the last axis gives row j (the sum of
                # the first j+1 children) already in the store's `[F, K, R]` order
                idx = np.empty((len(ks), child_units[0], len(child_units)), dtype=np.int64)
                for f, k in enumerate(ks):
                    p = graph.partitions[k]
                    part_out.setdefault(k, {})[m] = prod_total[m] + f * rows[m] * outputs
                    ordered = sorted(p.children, key=lambda c: graph.regions[c].scope[0])
                    for c, child in enumerate(ordered):
                        idx[f, :, c] = src_offset[m][0] + loc.base[child][m] + np.arange(child_units[0])
                index[m], start[m] = _contiguous_or_index(idx)
                prod_total[m] += len(ks) * rows[m] * outputs
                continue
            # padding rows (parents with fewer variables than the fold's widest) read the zero
            idx = np.full((len(ks), sum(child_units), rows[m]), zero_index[m] if m == "prefix" else 0, dtype=np.int64)
            for f, k in enumerate(ks):
                p = graph.partitions[k]
                part_out.setdefault(k, {})[m] = prod_total[m] + f * rows[m] * outputs
                crow = _child_rows(graph.regions[p.parent].scope, [graph.regions[c].scope for c in p.children], m)
                col = 0
                for c, child in enumerate(p.children):
                    units = graph.regions[child].units
                    at = src_offset[m][loc.store[child]] + loc.base[child][m]
                    child_rows = loc.rows[child][m]
                    read = at + np.arange(units)[:, None] * child_rows + crow[:, c]  # [units, s]
                    idx[f, col:col + units, :crow.shape[0]] = np.where(crow[:, c] < 0, zero_index[m], read)
                    col += units
            needs_zero[m] = needs_zero[m] or (m == "prefix" and bool((idx == zero_index[m]).any()))
            index[m], start[m] = _contiguous_or_index(idx)
            prod_total[m] += len(ks) * rows[m] * outputs
        products.append(ProductFold(kind, child_units, ks, rows, index, start,
                                    _product_einsum(kind, len(child_units)), out_offset, cumulative, halves))
    fold_outputs = {k: pf.outputs for pf in products for k in pf.partitions}
    fold_rows = {k: pf.rows for pf in products for k in pf.partitions}

    # Sum folds read the concatenated products; their params and store entries follow fold order.
    sums: list[SumFold] = []
    store_total = {m: 0 for m in MODES}
    for (units, inputs), group in sum_groups.items():
        rows = {m: max(rows_of(r, m) for r in group) for m in MODES}
        index, start, out_offset = {}, {}, {}
        for m in MODES:
            out_offset[m] = store_total[m]
            idx = np.zeros((len(group), inputs, rows[m]), dtype=np.int64)  # padding rows read entry 0
            for f, rid in enumerate(group):
                col = 0
                s = rows_of(rid, m)
                for k in loc.by_parent[rid]:
                    out = fold_outputs[k]
                    r_p = fold_rows[k][m]
                    idx[f, col:col + out, :s] = part_out[k][m] + np.arange(out)[:, None] * r_p + np.arange(s)
                    col += out
            index[m], start[m] = _contiguous_or_index(idx)
            store_total[m] += len(group) * rows[m] * units
        slots = []
        first_offset = param_offset
        for f, rid in enumerate(group):
            loc.set_sum(rid, d, {m: out_offset[m] + f * rows[m] * units for m in MODES}, rows, slot=next_slot)
            slots.append(next_slot)
            next_slot += 1
            layout.append(ParamSlot("sum", rid, (units, inputs), param_offset))
            param_offset += units * inputs
        sums.append(SumFold(
            regions=list(group), slots=torch.tensor(slots, dtype=torch.long), units=units, inputs=inputs,
            rows=rows, index=index, start=start, param_offset=first_offset, out_offset=out_offset,
            child_slot=torch.empty(0, dtype=torch.long), child_unit=torch.empty(0, dtype=torch.long),
        ))
    loc.store_size[d] = dict(store_total)
    layer = Layer(depth=d, products=products, sums=sums, sources={m: list(sources) for m in MODES},
                  needs_zero=needs_zero, product_size=prod_total, sum_size=store_total)
    return layer, param_offset, next_slot


def _left_right(graph: RegionGraph, p) -> list[str]:
    """A partition's children in variable order (by first variable)."""
    return sorted(p.children, key=lambda c: graph.regions[c].scope[0])


def _halves(graph: RegionGraph, ks: list[int], loc: _Locations, rows: int, child_units: tuple[int, ...]) -> bool:
    """Whether a hadamard fold's prefix rows can be built as [left rows | left last + right rows]:
    every partition has two children of s = rows / 2 variables each (stored with exactly s rows),
    the left child's variables all before the right child's, and its parent has 2s variables."""
    if len(child_units) != 2 or child_units[0] != child_units[1] or rows % 2:
        return False
    half = rows // 2
    for k in ks:
        p = graph.partitions[k]
        left, right = _left_right(graph, p)
        scope_l, scope_r = graph.regions[left].scope, graph.regions[right].scope
        if (len(scope_l) != half or len(scope_r) != half or max(scope_l) >= min(scope_r)
                or len(graph.regions[p.parent].scope) != rows
                or loc.rows[left]["prefix"] != half or loc.rows[right]["prefix"] != half):
            return False
    return True


def _contiguous_or_index(idx: np.ndarray) -> tuple[torch.Tensor | None, int]:
    """`(None, start)` when the flat index is one contiguous run (read as a slice), else `(index, 0)`."""
    flat = idx.reshape(-1)
    if flat.size and flat[-1] - flat[0] == flat.size - 1 and np.array_equal(flat, np.arange(flat[0], flat[0] + flat.size)):
        return None, int(flat[0])
    return torch.from_numpy(flat.copy()), 0


def _product_einsum(kind: str, arity: int) -> str:
    letters = "ijklmnopqstvwxyz"[:arity]
    if kind == "hadamard" or arity == 1:
        return ",".join("bfri" for _ in range(arity)) + "->bfri"
    return ",".join(f"bfr{c}" for c in letters) + "->bfr" + letters


def _fill_topdown_tables(graph: RegionGraph, sf: SumFold, loc: _Locations) -> None:
    """For each region of the fold and each sum input `k`: the (slot, unit) of every child the
    product behind `k` selects. Kronecker outputs decode row-major (first child slowest)."""
    arity = max(len(graph.partitions[k].children) for rid in sf.regions for k in loc.by_parent[rid])
    sink = len(loc.slot)  # one past the last region slot: a column nobody reads
    slot = np.full((sf.size, sf.inputs, arity), sink, dtype=np.int64)
    unit = np.zeros((sf.size, sf.inputs, arity), dtype=np.int64)
    for f, rid in enumerate(sf.regions):
        k0 = 0
        for k in loc.by_parent[rid]:
            p = graph.partitions[k]
            sizes = [graph.regions[c].units for c in p.children]
            kronecker = p.product == "kronecker" and len(sizes) > 1
            count = int(np.prod(sizes)) if kronecker else sizes[0]
            j = np.arange(count)
            digits = np.stack(np.unravel_index(j, sizes), axis=1) if kronecker else np.repeat(j[:, None], len(sizes), 1)
            for c, child in enumerate(p.children):
                slot[f, k0:k0 + count, c] = loc.slot[child]
                unit[f, k0:k0 + count, c] = digits[:, c]
            k0 += count
    sf.child_slot = torch.from_numpy(slot)
    sf.child_unit = torch.from_numpy(unit)


def _counts(graph: RegionGraph, plan: Plan) -> dict[str, Any]:
    """Units, parameters, per-example FLOPs and folds of work per program (an estimate: a product
    unit costs one add per extra child, a sum unit 2K, a leaf read its normalisation over v)."""
    n, v = plan.num_vars, plan.num_states
    units = sum(r.units for r in graph.regions.values())
    leaf_norm = 2 * plan.num_leaves * v

    def layers_flops(mode: str, per_sum: int) -> int:
        total = 0
        for layer in plan.layers:
            for pf in layer.products:
                total += pf.size * pf.rows[mode] * pf.outputs * max(len(pf.child_units) - 1, 0)
            for sf in layer.sums:
                total += per_sum * sf.size * sf.rows[mode] * sf.units * sf.inputs
        return total

    topdown = sum(2 * sf.size * sf.inputs for sf in plan.sum_folds) + n * v
    folds = sum(len(layer.products) + len(layer.sums) for layer in plan.layers)
    sum_params = plan.num_params - plan.num_input_params
    return {
        "units": units,
        "regions": len(graph.regions),
        "partitions": len(graph.partitions),
        "params": plan.num_params,
        "input_params": plan.num_input_params,
        "sum_params": sum_params,
        "flops": {
            "log_prob": leaf_norm + 3 * sum_params + layers_flops("full", 2),
            "prefix_log_marginals": leaf_norm + 3 * sum_params + layers_flops("prefix", 2),
            "sample": 3 * sum_params + topdown,
            "map": leaf_norm + sum_params + layers_flops("full", 2) + topdown,
        },
        "ops": {"log_prob": folds + 1, "prefix_log_marginals": folds + 1, "sample": len(plan.sum_folds) + 1,
                "map": folds + len(plan.sum_folds) + 2},
        "einsum_paths": _einsum_paths(plan),
    }


def _einsum_paths(plan: Plan) -> dict[str, str]:
    """opt_einsum's contraction order for every distinct kronecker product fused with its sum
    (`bfra,bfrb,bfuab->bfru`): the order a fused evaluation follows, reported for inspection."""
    paths = {}
    for layer in plan.layers:
        for pf in layer.products:
            if pf.product != "kronecker":
                continue
            letters = "acdeghijklmnopqstvwxyz"[:len(pf.child_units)]
            expr = ",".join(f"bfr{c}" for c in letters) + f",bfu{letters}->bfru"
            if expr in paths:
                continue
            shapes = [(1, pf.size, 1, k) for k in pf.child_units] + [(1, pf.size, 8, *pf.child_units)]
            path, _ = opt_einsum.contract_path(expr, *shapes, shapes=True, optimize="auto")  # greedy when many children
            paths[expr] = str(path)
    return paths
