"""The executor: a `Plan`'s index maps as tensors, and the two passes every program is made of.

`Executor(plan)` is a `torch.nn.Module` whose buffers are the plan's gather indices and top-down
tables (so `.to(device)` moves them); it runs

- `upward`: leaves `[Q, B]` to the root, fold by fold, in the sum semiring (log-likelihoods,
  marginals, prefix marginals) or the max semiring (MAP), optionally saving each sum fold's inputs
  or best inputs for a top-down pass;
- `topdown`: from the root to the leaves, one sum fold at a time, each draw's selected unit picking
  an input through a `choose` callback (sampling draws it, MAP takes the best).

The queries (`likelihood`, `marginals`, `sampling`, `max_product`) prepare the leaves and weights
(`inputs`) and combine the passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from ..plan import MODES, Plan, SumFold
from .kernels import impossible_as_minus_inf, log_matmul_exp, max_plus


Choose = Callable[[int, Tensor, Tensor], Tensor]  # (fold, unit [B*S, F], example [B*S]) -> input [B*S, F]


@dataclass(frozen=True)
class ProductOp:
    """One product fold of a layer: `F` regions' product units over children of `child_units`."""
    kind: str  # "hadamard" or "kronecker"
    child_units: tuple[int, ...]
    size: int  # F
    rows: dict[str, int]
    index: dict[str, str | None]  # buffer names; None: contiguous from start
    start: dict[str, int]
    cumulative: dict[str, bool]
    halves: dict[str, bool]

    @property
    def width(self) -> int:
        return sum(self.child_units)


@dataclass(frozen=True)
class SumOp:
    """One sum fold of a layer: `F` regions of `U` units over `K` inputs each."""
    size: int  # F
    units: int  # U
    inputs: int  # K
    rows: dict[str, int]
    index: dict[str, str | None]
    start: dict[str, int]
    param_offset: int  # within the sum logits
    slots: str
    children: str  # [2, F*(K+1), A]: (slot, unit) of each child the input f*(K+1)+k selects;
    #                entry f*(K+1)+K (not reached) points at the sink
    entry_base: str  # [F] f*(K+1)
    row_base: str  # [F] f*U
    table_base: str  # [F] this fold's first row in the shared CDF table (uniform K), + f*U
    arity: int  # A


@dataclass(frozen=True)
class LayerOp:
    sources: dict[str, list[int]]
    needs_zero: dict[str, bool]
    products: tuple[ProductOp, ...]
    sums: tuple[SumOp, ...]


class Executor(nn.Module):
    """A plan's tensors and its upward and top-down passes (see the module docstring)."""

    def __init__(self, plan: Plan):
        super().__init__()
        self.num_vars = plan.num_vars
        self.num_states = plan.num_states
        self.num_params = plan.num_params
        self.num_input_params = plan.num_input_params
        self.num_sum_params = plan.num_params - plan.num_input_params
        self.num_leaves = plan.num_leaves
        self.num_input_regions = len(plan.input_regions)
        self.always_reached = plan.always_reached
        self.root_store = plan.root_store
        self.root_start = {m: int(plan.root_index[m][0]) for m in MODES}
        self.root_rows = {m: int(plan.root_index[m].numel()) for m in MODES}
        self._register_leaf_maps(plan)
        self.layers = self._lower_layers(plan)
        self.sum_ops = tuple(op for layer in self.layers for op in layer.sums)
        self.uniform_k = len({op.inputs for op in self.sum_ops}) == 1
        self.sum_sizes = [op.size * op.units * op.inputs for op in self.sum_ops]  # logits per fold
        self.sum_rows = [op.size * op.units for op in self.sum_ops]  # weight rows per fold

    def _register_leaf_maps(self, plan: Plan) -> None:
        """The leaves' variables and, for the top-down pass, the way from selected units to leaves."""
        n = self.num_vars
        self.register_buffer("leaf_variable", plan.leaf_variable.clone(), persistent=False)  # [Q]
        self.register_buffer("leaf_start", plan.leaf_start.clone(), persistent=False)  # [NI]
        self.register_buffer("input_variable", plan.input_variable.clone(), persistent=False)  # [NI]
        # leaves variable-major with the same count r per variable (FF, CP, HMM, BTree): r, else None
        r = self.num_leaves // n
        grouped = torch.arange(n).repeat_interleave(r)
        self.leaf_group = r if r * n == self.num_leaves and torch.equal(grouped, plan.leaf_variable) else None
        self.register_buffer("first_leaf_of_variable", torch.arange(n) * r, persistent=False)
        counts = torch.bincount(plan.input_variable, minlength=n)
        self.one_input_per_variable = plan.always_reached and bool((counts == 1).all())
        if self.one_input_per_variable:
            order = torch.empty_like(plan.input_variable)
            order[plan.input_variable] = torch.arange(self.num_input_regions)
            self.register_buffer("input_of_variable", order, persistent=False)  # input slot = input region
            self.register_buffer("leaf_start_of_variable", plan.leaf_start[order], persistent=False)
        # variable i's leaves are leaves_by_variable[leaf_group_start[i]:leaf_group_start[i+1]]
        self.register_buffer("leaves_by_variable", torch.argsort(plan.leaf_variable, stable=True), persistent=False)
        self.leaf_group_start = [0] + torch.bincount(plan.leaf_variable, minlength=n).cumsum(0).tolist()
        unselected = torch.full((1, plan.num_region_slots + 1), -1, dtype=torch.long)
        unselected[0, plan.root_slot] = 0
        self.register_buffer("unselected", unselected, persistent=False)  # the top-down state before any choice

    def _lower_layers(self, plan: Plan) -> tuple[LayerOp, ...]:
        layers = []
        table_row = 0  # first row of the next sum fold in the shared [sum(F*U), K] weight table
        for li, layer in enumerate(plan.layers):
            products = []
            for pi, pf in enumerate(layer.products):
                names = {m: self._buffer(f"p{li}_{pi}_{m}", pf.index[m]) for m in MODES}
                products.append(ProductOp(pf.product, pf.child_units, pf.size, dict(pf.rows), names, dict(pf.start),
                                          dict(pf.cumulative), dict(pf.halves)))
            sums = []
            for si, sf in enumerate(layer.sums):
                sums.append(self._sum_op(f"s{li}_{si}", sf, plan, table_row))
                table_row += sf.size * sf.units
            layers.append(LayerOp({m: list(s) for m, s in layer.sources.items()}, dict(layer.needs_zero),
                                  tuple(products), tuple(sums)))
        return tuple(layers)

    def _sum_op(self, name: str, sf: SumFold, plan: Plan, table_row: int) -> SumOp:
        sink = plan.num_region_slots
        # one extra table row per region for "not reached": its children go to the sink
        f, k, a = sf.child_slot.shape
        child_slot = torch.cat([sf.child_slot, torch.full((f, 1, a), sink, dtype=torch.long)], 1)
        child_unit = torch.cat([sf.child_unit, torch.zeros((f, 1, a), dtype=torch.long)], 1)
        children = torch.stack([child_slot.reshape(-1, a), child_unit.reshape(-1, a)])  # one gather reads both
        return SumOp(
            sf.size, sf.units, sf.inputs, dict(sf.rows),
            {m: self._buffer(f"{name}_{m}", sf.index[m]) for m in MODES}, dict(sf.start),
            sf.param_offset - plan.num_input_params,
            self._buffer(f"{name}_slots", sf.slots),
            self._buffer(f"{name}_children", children),
            self._buffer(f"{name}_entry_base", torch.arange(f) * (k + 1)),
            self._buffer(f"{name}_row_base", torch.arange(f) * sf.units),
            self._buffer(f"{name}_table_base", table_row + torch.arange(f) * sf.units),
            a,
        )

    def _buffer(self, name: str, tensor: Tensor | None) -> str | None:
        if tensor is None:
            return None
        self.register_buffer(name, tensor, persistent=False)  # shared with the plan; .to() copies
        return name

    def extra_repr(self) -> str:
        return f"layers={len(self.layers)}, sum_folds={len(self.sum_ops)}"

    # ================================================================== upward

    def upward(self, leaves: Tensor, weights: list[Tensor], mode: str, saved: list[Tensor] | None = None,
               semiring: str = "sum", best: list[Tensor] | None = None) -> Tensor:
        """Bottom-up pass over leaves `[Q, B]`. Returns the root's rows `[B, 1]` (full) or `[B, n]`
        (prefix); appends each sum fold's inputs `[F, K, R*B]` to `saved` when given, and for the
        max semiring each sum unit's best input `[F, U, R*B]` to `best`.
        `weights` are linear for the sum semiring and log weights for the max semiring.
        A store keeps the shape its op made (`[F, U, R*B]`); readers view it as they need."""
        batch = leaves.shape[1]
        stores = [leaves]
        zero = None
        fold = 0
        for layer in self.layers:
            sources = [stores[s] for s in layer.sources[mode]]
            if layer.needs_zero[mode]:
                if zero is None:
                    zero = leaves.new_zeros(1, batch)  # log 1: a child summed out entirely
                sources.append(zero)
            source = sources[0] if len(sources) == 1 else torch.cat([s.reshape(-1, batch) for s in sources])
            products = [self._product(source, op, mode, batch) for op in layer.products]
            product = products[0] if len(products) == 1 else torch.cat([p.reshape(-1, batch) for p in products])
            outputs = []
            for op in layer.sums:
                rows = op.rows[mode]
                inputs = self._read(product, op.index, op.start, mode, op.size * op.inputs * rows, batch)
                inputs = inputs.reshape(op.size, op.inputs, rows * batch)  # [F, K, R*B]
                if saved is not None:
                    saved.append(inputs)
                if semiring == "sum":
                    outputs.append(log_matmul_exp(inputs, weights[fold], rows, batch))  # [F, U, R*B]
                elif best is not None:
                    value, argmax = max_plus(inputs, weights[fold], rows, batch, with_argmax=True)
                    outputs.append(value)
                    best.append(argmax)
                else:
                    outputs.append(max_plus(inputs, weights[fold], rows, batch))
                fold += 1
            stores.append(outputs[0] if len(outputs) == 1 else torch.cat([o.reshape(-1, batch) for o in outputs]))
        root = stores[self.root_store].reshape(-1, batch)
        rows = self.root_rows[mode]
        if root.shape[0] != rows:
            root = root.narrow(0, self.root_start[mode], rows)
        if semiring == "max" or saved is not None:  # no one reads these roots' values
            return root.t()  # [B, rows]
        return impossible_as_minus_inf(root.t())

    def _read(self, source: Tensor, names: dict[str, str | None], start: dict[str, int], mode: str,
              length: int, batch: int) -> Tensor:
        """Rows of a store (`length` rows of `B` values): the store itself, in whatever shape it
        was made, when the read is all of it in order; else a `[length, B]` slice or index_select."""
        name = names[mode]
        if name is None and start[mode] == 0 and source.numel() == length * batch:
            return source  # the whole store, in order: nothing to do
        flat = source.reshape(-1, batch)
        if name is None:
            return flat.narrow(0, start[mode], length)
        return flat.index_select(0, self._buffers[name])

    def _product(self, source: Tensor, op: ProductOp, mode: str, batch: int) -> Tensor:
        """Product units (sums of log values) of one product fold: `F*K_out*R` rows of `B` values,
        flat or `[F, K_out*R*B]`."""
        rows = op.rows[mode]
        arity = len(op.child_units)
        if op.cumulative[mode]:  # prefix rows of a flat product: running sums over the children
            read = self._read(source, op.index, op.start, mode, op.size * op.width, batch)  # [F*K*A, B]
            return read.reshape(op.size, op.child_units[0], arity, batch).cumsum(2)  # [F, K, R=A, B]
        if op.halves[mode]:  # prefix rows of two children over consecutive variables, s rows each
            half = rows // 2
            read = self._read(source, op.index, op.start, mode, op.size * op.width * half, batch)  # [F*2*K*s, B]
            left, right = read.reshape(op.size, 2, op.child_units[0], half, batch).unbind(1)  # [F, K, s, B]
            return torch.cat([left, left[:, :, half - 1:] + right], dim=2)  # [F, K, 2s, B]
        read = self._read(source, op.index, op.start, mode, op.size * op.width * rows, batch)  # [F*width*R, B]
        if op.kind == "hadamard":
            if arity == 1:
                return read
            return read.reshape(op.size, arity, -1).sum(1)  # [F, A, K*R*B] -> [F, K*R*B]
        parts = read.reshape(op.size, op.width, rows * batch).split(op.child_units, dim=1)  # [F, K_c, R*B]
        out = parts[0]
        for part in parts[1:]:  # row-major: the first child is the slowest index
            out = (out.unsqueeze(2) + part.unsqueeze(1)).flatten(1, 2)
        return out

    # ================================================================== top-down

    def topdown(self, choose: Choose, batch: int, num_samples: int,
                device: torch.device) -> Tensor:
        """Top-down selection, one sum fold at a time from the root. Each region is reached at
        most once per draw (decomposability), with one unit; `sel[:, slot]` holds it (-1: not
        reached). `choose(fold, unit, example)` picks an input `[B*S, F]` for the units `[B*S, F]`.
        Returns the selected leaf of every variable, `[B*S, n]`."""
        total = batch * num_samples
        sel = self.unselected.repeat(total, 1)  # [B*S, NR+1]: -1 everywhere but the root's unit 0
        example = torch.arange(total, device=device)  # [B*S] the example of each draw
        if num_samples > 1:
            example = example // num_samples
        for fold in range(len(self.sum_ops) - 1, -1, -1):
            op = self.sum_ops[fold]
            unit = sel.index_select(1, self._buffers[op.slots])  # [B*S, F]
            if self.always_reached:
                choice = choose(fold, unit, example)  # [B*S, F]
            else:
                reached = unit >= 0
                choice = choose(fold, unit.clamp_min(0), example).masked_fill(~reached, op.inputs)  # K: none
            entry = (choice + self._buffers[op.entry_base]).view(-1)  # [B*S*F] entries of the child tables
            child_slot, child_unit = self._buffers[op.children].index_select(1, entry).view(2, total, -1)  # [B*S, F*A]
            sel.scatter_(1, child_slot, child_unit)
        if self.one_input_per_variable:  # every variable's single input region is always reached
            return sel.index_select(1, self.input_of_variable) + self.leaf_start_of_variable
        unit = sel[:, :self.num_input_regions]  # [B*S, NI]
        leaf = self.leaf_start + unit.clamp_min(0)
        variable = torch.where(unit >= 0, self.input_variable, self.num_vars)  # unreached -> sink column
        leaf_of_var = torch.zeros(total, self.num_vars + 1, dtype=torch.long, device=device)
        return leaf_of_var.scatter_(1, variable, leaf)[:, :self.num_vars]

    def row_bases(self) -> list[Tensor]:
        """Per sum fold `[F]`: `f*U`, the first row of each region's units in the fold's `[F*U, K]` weights."""
        return [self._buffers[op.row_base] for op in self.sum_ops]

    def weight_rows(self, fold: int, weights: Tensor, unit: Tensor, example: Tensor) -> Tensor:
        """`[B*S, F, K]`: row `unit` of every region's weights `[Bp, F, U, K]` for each draw."""
        op = self.sum_ops[fold]
        row = unit + self._buffers[op.row_base]  # [B*S, F] = f*U + u
        if weights.dim() == 4:  # per example
            row = row + (example * (op.size * op.units)).unsqueeze(1)
        return weights.reshape(-1, op.inputs).index_select(0, row.view(-1)).view(unit.shape[0], op.size, op.inputs)

    def cdf_row_bases(self) -> list[Tensor]:
        """Per sum fold `[F]`: each region's first row in the CDF tables of `sampling.sum_cdfs` (one
        shared `[sum(F*U), K]` table when every fold has the same K, else one `[F*U, K]` per fold)."""
        return [self._buffers[op.table_base if self.uniform_k else op.row_base] for op in self.sum_ops]
