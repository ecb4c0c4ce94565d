"""Cheap greedy drafts from a circuit at batch size 1: the sequential argmax of exact conditionals,
`x_j = argmax_s q(x_j = s | x_<j)` for `j = 0 .. n-1`, and the per-position marginal argmax, each
optionally given the first `m` variables.

Why not the layered programs: a draft needs `n` dependent conditionals, and each one as an upward
pass over `v` candidates costs a whole pass of small ops. Here the circuit is read as a function of
the leaves of one variable at a time. Because it is smooth and decomposable it is linear in them:

    q(x_<j, x_j = s) = sum over input regions I of variable j, units u:  D_I[u] * p_{I,u}(s)

with `D_I = d q / d I` evaluated with `x_<j` observed and every later variable summed out (a summed-out
region has value 1 in every unit). `D` flows top-down (`D_c = sum over c's parents R and partitions
of (D_R W_R[:, partition]) * prod of the siblings' values`, contracted per child for kronecker
partitions), and values `V` flow bottom-up. Fixing `x_j` changes only the values of the ancestors of
its input regions, so most `D` and `V` stay valid from one step to the next: for an HMM in variable
order a step is a handful of vector-matrix products whatever `n`, for a binary tree a few more, for a
CP one product over the fixed siblings. Which regions to recompute at each step is known from the
graph alone, so it is planned once (`DraftProgram(graph, layout)`) and a draft only runs the plan.

Values are probabilities in float64 (no logs: a product of `n` leaf probabilities stays far above
float64's smallest normal number for any realistic window), so the argmax is that of the exact
conditional up to float64 rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..graph import RegionGraph
from ..plan import ParamSlot
from .kernels import inverse_cdf
from ..threads import single_threaded_when_small

__all__ = ["DraftProgram"]


@dataclass(frozen=True)
class _Partition:
    children: tuple[int, ...]
    kind: str  # "hadamard" | "kronecker"
    start: int  # first column of this partition's inputs in the parent's [U, K] weights
    width: int  # K_p
    child_units: tuple[int, ...]


@dataclass(frozen=True)
class _Use:
    """Region `child` is child `position` of partition `partition` of region `parent`."""

    parent: int
    partition: int
    position: int


@dataclass(frozen=True)
class _Op:
    kind: str  # "V": recompute a value bottom-up, "D": recompute a derivative top-down
    region: int
    live: tuple[tuple[int, ...], ...]  # per partition (V) or per use (D): the regions whose value is not all ones


class DraftProgram:
    """Greedy drafts of a compiled circuit (`graph` + its `param_layout`), planned once per circuit.

    `greedy(theta, prefix)` -> `[n]` long: the sequential conditional argmax, with `x_0 .. x_{m-1}`
    = `prefix` (`[m]` long, optional; a prefix state `v`, one past the last, is a variable left unobserved:
    summed out, as for a token the circuit has no state for); `marginal_argmax(theta, prefix)` -> `[n]`:
    per position the argmax of `q(x_j | prefix)`; `conditionals(theta, x)` -> `[n, v]`: every `q(x_j = . | x_<j)` of
    one sequence; `sample(theta, generator, prefix)` -> (`[n]`, `[n, v]`): an exact sample, variable
    by variable, with the conditionals it was drawn from. `theta`: `[P]` (any float dtype; computed
    in float64).
    """

    def __init__(self, graph: RegionGraph, layout: list[ParamSlot]):
        self.n, self.v = graph.variables, graph.states
        ids = list(graph.regions)
        index = {rid: k for k, rid in enumerate(ids)}
        self.num_regions = len(ids)
        self.root = index[graph.root]
        if graph.regions[graph.root].units != 1:
            raise ValueError("the root must have exactly one unit")
        self.units = [graph.regions[rid].units for rid in ids]
        slots = {s.region: s for s in layout}
        self.num_input_params = sum(s.shape[0] * s.shape[1] for s in layout if s.kind == "input")
        self.leaf_start: dict[int, int] = {}  # input region -> its first leaf row in theta's [Q, v] view
        self.weight_slot: dict[int, tuple[int, int, int]] = {}  # inner region -> (offset, U, K)
        self.partitions: dict[int, list[_Partition]] = {}
        self.uses: list[list[_Use]] = [[] for _ in ids]
        self.inputs_of: list[list[int]] = [[] for _ in range(self.n)]
        for k, rid in enumerate(ids):
            slot = slots[rid]
            if graph.is_input(rid):
                self.leaf_start[k] = slot.offset // self.v
                self.inputs_of[graph.regions[rid].scope[0]].append(k)
            else:
                self.weight_slot[k] = (slot.offset, *slot.shape)
                self.partitions[k] = self._partitions_of(graph, rid, index)
                for p, part in enumerate(self.partitions[k]):
                    for i, c in enumerate(part.children):
                        self.uses[c].append(_Use(k, p, i))
        self.scope = [frozenset(graph.regions[rid].scope) for rid in ids]
        self.top_down = [index[rid] for rid in reversed(graph.bottom_up())]
        self._factorised = all(self.units[i] == 1 for i in self.leaf_start) and all(
            len(r) == 1 for r in self.inputs_of)
        order = [self.leaf_start[r[0]] for r in self.inputs_of] if self._factorised else []
        self._leaf_of_variable = None if order == list(range(len(order))) else torch.tensor(order)
        # a draft cuts every region's block of its table with one split, not a slice per use: the input
        # regions' leaf rows tile the leaf table (the layout's contract), and when every sum has the same
        # K the inner regions' weight rows tile one [sum of U, K] table too
        self._leaf_tiling = _tiling({r: (start, self.units[r]) for r, start in self.leaf_start.items()})
        if self._leaf_tiling is None:
            raise ValueError("the layout's input slots must tile theta's first rows (a circuitc param_layout does)")
        widths = {k for _, _, k in self.weight_slot.values()}
        k = widths.pop() if len(widths) == 1 else 0
        self._weight_tiling = _tiling({r: ((o - self.num_input_params) // k, u)
                                       for r, (o, u, _) in self.weight_slot.items()}) if k else None
        self._uniform_k = k if self._weight_tiling is not None else 0
        self._plans: dict[tuple[int, bool], list[list[_Op]]] = {}

    @staticmethod
    def _partitions_of(graph: RegionGraph, rid: str, index: dict[str, int]) -> list[_Partition]:
        parts, start = [], 0
        for p in graph.partitions_of(rid):
            width = graph.num_inputs(p)
            units = tuple(graph.regions[c].units for c in p.children)
            parts.append(_Partition(tuple(index[c] for c in p.children), p.product, start, width, units))
            start += width
        return parts

    @property
    def factorised(self) -> bool:
        """A product of one leaf per variable (an FF circuit): every conditional is its variable's leaf,
        whatever the other variables hold."""
        return self._factorised

    # ----------------------------------------------------------------- public programs

    @single_threaded_when_small(lambda self, theta, *args, **kwargs: self._work(theta))
    @torch.no_grad()
    def greedy(self, theta: Tensor, prefix: Tensor | None = None, with_rows: bool = False):
        """`[n]`: `x_j = argmax_s q(x_j = s | x_<j)` in order, the first `m` taken from `prefix`. With
        `with_rows`, also the conditionals `[n, v]` the argmaxes were taken of (float64; rows `< m` zero),
        as `sample` returns them."""
        prefix = self._prefix(prefix, theta.device)
        if self._factorised:  # a product of one leaf per variable: conditionals are the leaves
            leaves = self._leaf_logits(theta)  # [n, v]
            x = self._with_prefix(leaves.argmax(-1), prefix)
            return (x, self._factorised_rows(leaves, prefix)) if with_rows else x
        return self._run(theta, prefix, True, lambda j, scores: scores.argmax(), keep_rows=with_rows)

    @single_threaded_when_small(lambda self, theta, *args, **kwargs: self._work(theta))
    @torch.no_grad()
    def sample(self, theta: Tensor, generator: torch.Generator | None = None,
               prefix: Tensor | None = None, uniforms: Tensor | None = None,
               temperature: float = 1.0) -> tuple[Tensor, Tensor]:
        """`x` `[n]` drawn from `q(. | prefix)` one variable at a time (exact: the chain rule), and its
        proposal `[n, v]`: row `j >= m` = `q(x_j = . | x_<j)` (float64; rows `< m` are zero).

        `uniforms` `[n]` float64 in [0, 1) (variable `j` is drawn by inverse CDF from `uniforms[j]`)
        replace the draws from `generator`: the program is then a pure function of its tensors, which
        `torch.compile` can trace whole (a `torch.Generator` cannot be traced).

        `temperature` `t` (> 0) draws every variable from its exact conditional raised to `1 / t` and
        renormalised, `q(x_j = . | x_<j) ** (1 / t)`, as a language model samples each token at a
        temperature; the rows are then those tempered conditionals, so the proposal stays exactly known
        (it is not the joint `q ** (1 / t)`: each step is tempered given the draws before it)."""
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        prefix = self._prefix(prefix, theta.device)
        if uniforms is None:
            uniforms = torch.rand(self.n, generator=generator, dtype=torch.float64, device=theta.device)
        elif uniforms.shape != (self.n,):
            raise ValueError(f"uniforms must have shape ({self.n},), got {tuple(uniforms.shape)}")
        u = uniforms if uniforms.dtype == torch.float64 else uniforms.to(torch.float64)
        if self._factorised:
            leaves = self._leaf_logits(theta)  # [n, v]
            if temperature != 1:
                leaves = leaves.double() / temperature
            x = inverse_cdf(leaves.double().softmax(-1), u)  # [n]
            return self._with_prefix(x, prefix), self._factorised_rows(leaves, prefix)
        draws = u.unbind()  # one op for all n, not a select per step
        sharpen = None if temperature == 1 else lambda scores: scores.pow(1 / temperature)
        return self._run(theta, prefix, True, lambda j, scores: inverse_cdf(scores, draws[j]), keep_rows=True,
                         sharpen=sharpen)

    @single_threaded_when_small(lambda self, theta, *args, **kwargs: self._work(theta))
    @torch.no_grad()
    def conditionals(self, theta: Tensor, x: Tensor) -> Tensor:
        """`[n, v]`: row `j` = `q(x_j = . | x_<j)` for the given `x` `[n]` (probabilities, float64; a state
        `v` in `x` leaves that variable unobserved)."""
        x = x.to(device=theta.device, dtype=torch.long).view(-1)
        if x.numel() != self.n:
            raise ValueError(f"x must hold {self.n} states, got {x.numel()}")
        if self._factorised:
            return self._leaf_logits(theta).double().softmax(-1)
        states = x.unbind()
        return self._run(theta, None, True, lambda j, scores: states[j], keep_rows=True, caller_states=self.n)[1]

    @single_threaded_when_small(lambda self, theta, *args, **kwargs: self._work(theta))
    @torch.no_grad()
    def marginal_argmax(self, theta: Tensor, prefix: Tensor | None = None) -> Tensor:
        """`[n]`: per position `argmax_s q(x_j = s | prefix)` (the prefix copied)."""
        prefix = self._prefix(prefix, theta.device)
        if self._factorised:
            return self.greedy(theta, prefix)
        return self._run(theta, prefix, False, lambda j, scores: scores.argmax())

    def _work(self, theta: object) -> float:
        """FLOPs of one draft, for `circuitc.threads`: normalising theta, then per variable about
        one product per weight (an overestimate: most values are reused between steps)."""
        size = theta.numel() if isinstance(theta, Tensor) else 0
        return 3 * size + self.n * (size - self.num_input_params)

    # ----------------------------------------------------------------- planning

    def plan(self, given: int, sequential: bool) -> list[list[_Op]]:
        """Per step `j`, the ops that make every `D` of variable `j`'s input regions valid, given that
        variables `< j` are observed (sequential) or only the first `given` are (marginal). Cached."""
        key = (given, sequential)
        if key not in self._plans:
            self._plans[key] = _Planner(self).steps(given, sequential)
        return self._plans[key]

    # ----------------------------------------------------------------- execution

    def _prefix(self, prefix: Tensor | None, device) -> Tensor | None:
        if prefix is None or prefix.numel() == 0:
            return None
        if prefix.dtype != torch.long or prefix.device != device:
            prefix = prefix.to(device=device, dtype=torch.long)
        if prefix.dim() != 1:
            prefix = prefix.view(-1)
        if prefix.numel() > self.n:
            raise ValueError(f"a prefix of {prefix.numel()} tokens is longer than the circuit's {self.n} variables")
        return prefix

    def _tables(self, theta: Tensor) -> tuple[Tensor, dict[int, Tensor], dict[int, Tensor]]:
        """Leaf probabilities `[Q, v]`, each inner region's sum weights `[U, K]` and the same weights
        transposed `[K, U]` (what a derivative multiplies by), float64 (normalised in float32 unless
        `theta` is float64: one op each, when every sum has the same `K`, and one split into regions
        when they tile the table)."""
        theta = theta if theta.dim() == 1 else theta.reshape(-1)
        theta = theta if theta.dtype in (torch.float32, torch.float64) else theta.float()
        probs = theta[: self.num_input_params].view(-1, self.v).softmax(-1).double()  # [Q, v]
        sums = theta[self.num_input_params:]
        if self._uniform_k:
            rows = sums.view(-1, self._uniform_k).softmax(-1).double()  # [sum of U, K]
            order, sizes = self._weight_tiling
            weights = dict(zip(order, rows.split(sizes)))
            transposed = dict(zip(order, rows.t().split(sizes, dim=1)))
        else:
            weights = {r: theta[o:o + u * k].view(u, k).softmax(-1).double()
                       for r, (o, u, k) in self.weight_slot.items()}
            transposed = {r: w.t() for r, w in weights.items()}
        return probs, weights, transposed

    def _leaf_logits(self, theta: Tensor) -> Tensor:
        """`[n, v]` the leaf logits of a factorised circuit, in variable order."""
        leaves = theta.reshape(-1)[: self.num_input_params].view(-1, self.v)
        if self._leaf_of_variable is not None:
            leaves = leaves.index_select(0, self._leaf_of_variable.to(leaves.device))
        return leaves

    def _factorised_rows(self, leaves: Tensor, prefix: Tensor | None) -> Tensor:
        """`[n, v]` float64 conditionals of a factorised circuit (its leaves), zero rows for the prefix."""
        rows = leaves.double().softmax(-1)
        m = 0 if prefix is None else prefix.numel()
        return torch.cat([rows.new_zeros(m, self.v), rows[m:]])

    @staticmethod
    def _with_prefix(x: Tensor, prefix: Tensor | None) -> Tensor:
        return x if prefix is None else torch.cat([prefix, x[prefix.numel():]])

    def _run(self, theta: Tensor, prefix: Tensor | None, sequential: bool, pick, keep_rows: bool = False,
             sharpen=None, caller_states: int | None = None):
        """Step through the variables: `pick(j, scores)` chooses `x_j` `[]` from `scores` `[v]`
        (proportional to its conditional, or marginal when not `sequential`; passed through `sharpen`
        first when given). Returns `x` `[n]`, and the normalised scores `[n, v]` (zero rows for the
        prefix) when `keep_rows`. Chosen states stay tensors (never read to the host), so a draft makes
        no device synchronisation. `caller_states`: how many leading states come from the caller, not drawn
        (default the prefix's): those may be `v`, unobserved."""
        m = 0 if prefix is None else prefix.numel()
        given_states = m if caller_states is None else caller_states
        state = _State(self, *self._tables(theta))
        steps = self.plan(m, sequential)
        given = prefix.unbind() if m else ()
        chosen, scored = [], []
        for j in range(self.n):
            if j < m:
                s = given[j]
            else:
                for op in steps[j]:
                    state.apply(op)
                scores = state.scores(j)  # [v]
                if sharpen is not None:
                    scores = sharpen(scores)
                s = pick(j, scores)
                scored.append(scores)
            chosen.append(s)
            if sequential or j < m:
                state.observe(j, s, may_be_unobserved=j < given_states)
        x = torch.stack(chosen)
        if not keep_rows:
            return x
        rows = torch.stack(scored)  # [n - m, v], normalised together: two ops, not two per step
        rows = rows / rows.sum(-1, keepdim=True)
        return x, rows if m == 0 else torch.cat([rows.new_zeros(m, self.v), rows])


def _tiling(spans: dict[int, tuple[int, int]]) -> tuple[list[int], list[int]] | None:
    """Regions and their row counts in row order, when their `(first row, rows)` spans tile the rows
    from 0 without gaps or overlaps; else None."""
    ordered = sorted(spans.items(), key=lambda item: item[1][0])
    end = 0
    for _, (start, rows) in ordered:
        if start != end:
            return None
        end += rows
    return [region for region, _ in ordered], [rows for _, (_, rows) in ordered]


class _State:
    """The values `V` and derivatives `D` of one draft (probabilities, float64)."""

    def __init__(self, program: DraftProgram, probs: Tensor, weights: dict[int, Tensor],
                 transposed: dict[int, Tensor]):
        self.p, self.probs, self.weights, self.transposed = program, probs, weights, transposed
        self.V: list[Tensor | None] = [None] * program.num_regions  # None: all ones (nothing observed inside)
        self.D: list[Tensor | None] = [None] * program.num_regions
        self.D[program.root] = probs.new_ones(1)
        order, sizes = program._leaf_tiling
        # input region -> its leaf distributions as columns [v, U]
        self.columns: dict[int, Tensor] = dict(zip(order, probs.t().split(sizes, dim=1)))

    def scores(self, j: int) -> Tensor:
        """`[v]` proportional to q(x_j = s | observed)."""
        total = None
        for region in self.p.inputs_of[j]:
            part = torch.mv(self.columns[region], self.D[region])
            total = part if total is None else total + part
        return total

    def observe(self, j: int, s: Tensor, may_be_unobserved: bool = False) -> None:
        """Variable `j` takes state `s` (`[]` long, on the device: the row lookup reads it there). When
        `may_be_unobserved` (a given state, not a drawn one), `s == v` (one past the last state) leaves it
        unobserved, summed out: its leaves' values are their totals, 1."""
        if not may_be_unobserved:  # a state the draft drew: always one of the v
            for region in self.p.inputs_of[j]:
                self.V[region] = torch.embedding(self.columns[region], s)  # [U]: row s of [v, U]
            return
        v = self.p.v
        index, observed = s.clamp_max(v - 1), s < v  # once per variable, not per input region
        for region in self.p.inputs_of[j]:
            row = torch.embedding(self.columns[region], index)  # [U]: row s of [v, U], s a 0-d index
            # a select, not a branch: the state stays on the device and a compiled draft keeps one graph
            self.V[region] = torch.where(observed, row, torch.ones_like(row))

    def apply(self, op: _Op) -> None:
        if op.kind == "V":
            self.V[op.region] = self._value(op)
        else:
            self.D[op.region] = self._derivative(op)

    def _value(self, op: _Op) -> Tensor:
        """`[U]` of an inner region from its children's current values."""
        parts = [self._product(part, live) for part, live in zip(self.p.partitions[op.region], op.live)]
        inputs = parts[0] if len(parts) == 1 else torch.cat(parts)  # [K]
        return torch.mv(self.weights[op.region], inputs)

    def _product(self, part: _Partition, live: tuple[int, ...]) -> Tensor:
        """`[K_p]` product units of one partition; children not in `live` are all ones."""
        if part.kind == "hadamard":
            if not live:
                return self.probs.new_ones(part.width)
            return _times(self.V[live[0]], [self.V[c] for c in live[1:]])
        out = self.probs.new_ones(1)
        for c, units in zip(part.children, part.child_units):
            value = self.V[c] if c in live else self.probs.new_ones(units)
            out = torch.outer(out, value).view(-1)
        return out

    def _derivative(self, op: _Op) -> Tensor:
        """`[U]` of a region from its parents' derivatives and its siblings' values."""
        total = None
        for use, live in zip(self.p.uses[op.region], op.live):
            part = self.p.partitions[use.parent][use.partition]
            weights = self.transposed[use.parent]  # [K, U]
            if part.width != weights.shape[0]:
                weights = weights[part.start:part.start + part.width]
            g = torch.mv(weights, self.D[use.parent])  # [K_p]
            if part.kind == "hadamard":
                g = _times(g, [self.V[c] for c in live])
            else:
                g = self._contract(g, part, use.position, live)
            total = g if total is None else total + g
        return total

    def _contract(self, g: Tensor, part: _Partition, position: int, live: tuple[int, ...]) -> Tensor:
        """Kronecker: `g` over the product units `[K_1 * .. * K_k]` -> `[K_position]`, each sibling's
        axis contracted with its values (summed where they are all ones)."""
        g = g.view(part.child_units)
        for axis in reversed(range(len(part.children))):  # last axis first: earlier axes keep their index
            if axis == position:
                continue
            c = part.children[axis]
            g = g.movedim(axis, -1)
            g = g @ self.V[c] if c in live else g.sum(-1)
        return g


def _times(first: Tensor, others: list[Tensor]) -> Tensor:
    """Elementwise product: pairwise for a few factors, one stacked product for many."""
    if len(others) > 2:
        return first * torch.stack(others).prod(0)
    for t in others:
        first = first * t
    return first


class _Planner:
    """Simulates which `V`/`D` are stale at each step (from the graph only) and lists the ops."""

    def __init__(self, program: DraftProgram):
        self.p = program
        self.v_valid = [True] * program.num_regions  # nothing observed: every value is all ones
        self.d_valid = [False] * program.num_regions
        self.d_valid[program.root] = True
        self.observed: set[int] = set()

    def steps(self, given: int, sequential: bool) -> list[list[_Op]]:
        out: list[list[_Op]] = []
        for j in range(self.p.n):
            ops: list[_Op] = []
            if j >= given:
                for region in self.p.inputs_of[j]:
                    self._ensure_d(region, ops)
            out.append(ops)
            if sequential or j < given:
                self._observe(j)
        return out

    def _ones(self, region: int) -> bool:
        return not (self.p.scope[region] & self.observed)

    def _live(self, regions) -> tuple[int, ...]:
        return tuple(r for r in regions if not self._ones(r))

    def _ensure_v(self, region: int, ops: list[_Op]) -> None:
        if self.v_valid[region]:
            return
        for part in self.p.partitions[region]:
            for c in part.children:
                self._ensure_v(c, ops)
        ops.append(_Op("V", region, tuple(self._live(part.children) for part in self.p.partitions[region])))
        self.v_valid[region] = True

    def _ensure_d(self, region: int, ops: list[_Op]) -> None:
        if self.d_valid[region]:
            return
        lives = []
        for use in self.p.uses[region]:
            self._ensure_d(use.parent, ops)
            part = self.p.partitions[use.parent][use.partition]
            siblings = [c for i, c in enumerate(part.children) if i != use.position]
            for c in siblings:
                if not self._ones(c):
                    self._ensure_v(c, ops)
            lives.append(self._live(siblings))
        ops.append(_Op("D", region, tuple(lives)))
        self.d_valid[region] = True

    def _observe(self, j: int) -> None:
        """Variable `j` becomes observed: its ancestors' values and every derivative that read one
        of them (or a stale parent derivative) go stale."""
        self.observed.add(j)
        changed = {r for r in range(self.p.num_regions) if j in self.p.scope[r]}
        for r in changed:
            if r not in self.p.inputs_of[j]:  # input regions get their value when j is observed
                self.v_valid[r] = False
        for r in self.p.top_down:
            if r == self.p.root or not self.d_valid[r]:
                continue
            for use in self.p.uses[r]:
                part = self.p.partitions[use.parent][use.partition]
                siblings_changed = any(c in changed for i, c in enumerate(part.children) if i != use.position)
                if siblings_changed or not self.d_valid[use.parent]:
                    self.d_valid[r] = False
                    break
