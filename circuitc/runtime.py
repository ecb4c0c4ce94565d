"""The runtime: every program of a compiled circuit, executed from a `Plan` fold by fold.

`CompiledCircuit(plan)` is a `torch.nn.Module` with no trainable parameters: the circuit's logits
come with every call (`theta`, `[B, P]` per example or `[P]` shared), as in multi-token prediction
where a neural head produces them. Index maps are buffers, so `.to(device)` moves them.

Conventions (shapes in comments): `B` batch, `Bp` the parameter batch (1 when theta is shared, else
`B`), `Q` leaves (input units), `v` states, `F` regions in a fold, `R` rows per region (1, or the
scope size for prefix marginals), `U` units, `K` sum inputs, `S` samples per example.

All values are log-probabilities. A sum layer uses the max-shift trick: `m + log(W @ exp(x - m))`
with `W` the softmax-normalised weights (one matmul instead of materialising `log W + x`); the
matmul result is floored at the dtype's smallest normal number so that a sum whose every term
underflows (possible only when sum logits differ by more than ~87 nats in float32) stays finite.
bfloat16 and float16 parameters are computed in float32; float64 stays float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from .plan import MODES, ParamSlot, Plan


@dataclass(frozen=True)
class _ProductOp:
    kind: str
    child_units: tuple[int, ...]
    size: int  # F
    rows: dict[str, int]
    index: dict[str, str | None]  # buffer names; None: contiguous from start
    start: dict[str, int]

    @property
    def width(self) -> int:
        return sum(self.child_units)


@dataclass(frozen=True)
class _SumOp:
    size: int  # F
    units: int  # U
    inputs: int  # K
    rows: dict[str, int]
    index: dict[str, str | None]
    start: dict[str, int]
    param_offset: int  # within the sum logits
    slots: str
    child_slot: str
    child_unit: str
    arity: int  # A


@dataclass(frozen=True)
class _LayerOp:
    sources: dict[str, list[int]]
    needs_zero: dict[str, bool]
    products: tuple[_ProductOp, ...]
    sums: tuple[_SumOp, ...]


class CompiledCircuit(nn.Module):
    """A probabilistic circuit compiled to layered tensor programs (see docs/architecture.md)."""

    def __init__(self, plan: Plan):
        super().__init__()
        self.plan = plan
        self.num_vars = plan.num_vars
        self.num_states = plan.num_states
        self.num_params = plan.num_params
        self.num_input_params = plan.num_input_params
        self.num_sum_params = plan.num_params - plan.num_input_params
        self.num_leaves = plan.num_leaves
        self.param_layout: list[ParamSlot] = list(plan.param_layout)
        self._num_region_slots = plan.num_region_slots
        self._num_input_regions = len(plan.input_regions)
        self._root_slot = plan.root_slot
        self._root_store = plan.root_store
        self._uniform_k = len({sf.inputs for sf in plan.sum_folds}) == 1

        self.register_buffer("leaf_variable", plan.leaf_variable.clone(), persistent=False)
        # flat offset of each leaf's logits in theta: leaf q's row starts at q * v
        self.register_buffer("_leaf_row", torch.arange(self.num_leaves) * self.num_states, persistent=False)
        self.register_buffer("_leaf_start", plan.leaf_start.clone(), persistent=False)
        self.register_buffer("_input_variable", plan.input_variable.clone(), persistent=False)
        for m in MODES:
            self.register_buffer(f"_root_{m}", plan.root_index[m].clone(), persistent=False)

        layers = []
        for li, layer in enumerate(plan.layers):
            products = []
            for pi, pf in enumerate(layer.products):
                names = {m: self._buffer(f"_p{li}_{pi}_{m}", pf.index[m]) for m in MODES}
                products.append(_ProductOp(pf.product, pf.child_units, pf.size, dict(pf.rows), names, dict(pf.start)))
            sums = []
            for si, sf in enumerate(layer.sums):
                names = {m: self._buffer(f"_s{li}_{si}_{m}", sf.index[m]) for m in MODES}
                sums.append(_SumOp(
                    sf.size, sf.units, sf.inputs, dict(sf.rows), names, dict(sf.start),
                    sf.param_offset - plan.num_input_params,
                    self._buffer(f"_s{li}_{si}_slots", sf.slots),
                    self._buffer(f"_s{li}_{si}_child_slot", sf.child_slot.reshape(-1, sf.child_slot.shape[-1])),
                    self._buffer(f"_s{li}_{si}_child_unit", sf.child_unit.reshape(-1, sf.child_unit.shape[-1])),
                    int(sf.child_slot.shape[-1]),
                ))
            layers.append(_LayerOp({m: list(s) for m, s in layer.sources.items()}, dict(layer.needs_zero),
                                   tuple(products), tuple(sums)))
        self._layers = tuple(layers)

    def _buffer(self, name: str, tensor: Tensor | None) -> str | None:
        if tensor is None:
            return None
        self.register_buffer(name, tensor, persistent=False)  # shared with the plan; .to() copies
        return name

    def extra_repr(self) -> str:
        return (f"num_vars={self.num_vars}, num_states={self.num_states}, num_params={self.num_params}, "
                f"layers={len(self._layers)}")

    # ================================================================== public programs

    def log_prob(self, x: Tensor, theta: Tensor) -> Tensor:
        """`[B]` log q(x) for `x` `[B, n]` and logits `theta` `[B, P]` or `[P]`."""
        theta = self._theta(theta)
        leaves = self._leaves(x, theta, keep=None)
        return self._upward(leaves, self._sum_weights(theta[:, self.num_input_params:]), "full")[:, 0]

    def log_marginal(self, x: Tensor, keep: Tensor, theta: Tensor) -> Tensor:
        """`[B]` log q(x[keep]): variables where `keep` (`[n]` or `[B, n]`) is False are summed out."""
        theta = self._theta(theta)
        leaves = self._leaves(x, theta, keep=keep)
        return self._upward(leaves, self._sum_weights(theta[:, self.num_input_params:]), "full")[:, 0]

    def prefix_log_marginals(self, x: Tensor, theta: Tensor) -> Tensor:
        """`[B, n]`: column `i` is log q(x_0..x_i), all columns from one pass (the row trick)."""
        theta = self._theta(theta)
        leaves = self._leaves(x, theta, keep=None)
        return self._upward(leaves, self._sum_weights(theta[:, self.num_input_params:]), "prefix")

    def leaf_log_probs(self, x: Tensor, theta: Tensor) -> Tensor:
        """`[B, Q]`: each leaf's log softmax(L_in[u])[x_variable]."""
        return self._leaves(x, self._theta(theta), keep=None)

    def log_prob_from_leaves(self, leaf_log_probs: Tensor, sum_logits: Tensor) -> Tensor:
        """`[B]` from leaf values `[B, Q]` (0 at a leaf sums its variable out) and sum logits."""
        leaves, sum_logits = self._leaves_and_sums(leaf_log_probs, sum_logits)
        return self._upward(leaves, self._sum_weights(sum_logits), "full")[:, 0]

    def prefix_log_marginals_from_leaves(self, leaf_log_probs: Tensor, sum_logits: Tensor) -> Tensor:
        """`[B, n]` prefix marginals from leaf values `[B, Q]` and sum logits."""
        leaves, sum_logits = self._leaves_and_sums(leaf_log_probs, sum_logits)
        return self._upward(leaves, self._sum_weights(sum_logits), "prefix")

    def conditional_log_distribution(self, x: Tensor, keep: Tensor, theta: Tensor, variable: int) -> Tensor:
        """`[B, v]`: log q(x_variable = s | x[keep]) for every state `s` (`keep[variable]` is ignored).

        The circuit is linear in the leaves of one variable, so q(s, x[keep]) = sum_l g_l p_l(s) with
        g_l the derivative of q(x[keep]) by leaf l. One marginal pass and its backward give every
        `d_l = g_l / q(x[keep])` (the posterior of selecting leaf l; they sum to 1)."""
        theta = self._theta(theta)
        n = self.num_vars
        if not 0 <= variable < n:
            raise ValueError(f"variable {variable} is out of range for a circuit over {n} variables")
        keep = self._keep(keep, x.shape[0], x.device).clone()
        keep[:, variable] = False
        own = (self.leaf_variable == variable).nonzero().squeeze(1)  # [Qv] this variable's leaves
        create_graph = torch.is_grad_enabled() and theta.requires_grad
        with torch.enable_grad():
            leaves = self._leaves(x, theta, keep=keep)
            if not create_graph:
                leaves = leaves.detach()
            at_zero = torch.zeros(leaves.shape[0], own.numel(), dtype=leaves.dtype, device=leaves.device,
                                  requires_grad=True)  # log of the variable's leaf values, all 1
            leaves = leaves.index_add(1, own, at_zero)
            log_q = self._upward(leaves, self._sum_weights(theta[:, self.num_input_params:]), "full")[:, 0]
            (posterior,) = torch.autograd.grad(log_q.sum(), at_zero, create_graph=create_graph)  # [B, Qv]
        logits = theta[:, :self.num_input_params].view(theta.shape[0], self.num_leaves, self.num_states)
        leaf_log_dist = logits.index_select(1, own).log_softmax(-1)  # [Bp, Qv, v]
        return torch.logsumexp(posterior.clamp_min(0).log().unsqueeze(-1) + leaf_log_dist, dim=1)

    @torch.no_grad()
    def sample(self, theta: Tensor, num_samples: int = 1, generator: torch.Generator | None = None,
               evidence: Tensor | None = None, keep: Tensor | None = None) -> Tensor:
        """`[B, num_samples, n]` samples; with `evidence` (`[B, n]`) and `keep`, the unobserved
        variables are drawn from q(. | evidence[keep]) and the observed ones copied."""
        theta = self._theta(theta)
        logw = self._sum_weights(theta[:, self.num_input_params:], log=True)
        saved = None
        if evidence is not None:
            keep = self._keep(keep if keep is not None else torch.ones_like(evidence, dtype=torch.bool),
                              evidence.shape[0], evidence.device)
            leaves = self._leaves(evidence, theta, keep=keep)
            saved = []
            self._upward(leaves, [w.exp() for w in logw], "full", saved=saved)
        batch = evidence.shape[0] if evidence is not None else theta.shape[0]

        def draw(logits: Tensor) -> Tensor:
            return _categorical(logits, generator)

        leaf_of_var = self._topdown(logw, saved, batch, num_samples, draw)  # [B*S, n]
        x = self._draw_leaves(theta, leaf_of_var, num_samples, generator)
        x = x.view(batch, num_samples, self.num_vars)
        if evidence is not None:
            x = torch.where(keep.unsqueeze(1), evidence.view(-1, 1, self.num_vars), x)
        return x

    @torch.no_grad()
    def map(self, theta: Tensor, evidence: Tensor | None = None, keep: Tensor | None = None) -> Tensor:
        """`[B, n]`: the max-product assignment, found by an upward max pass and backtracking.

        For non-deterministic circuits this is the usual approximate MAP: the best single induced
        tree, not necessarily the most probable assignment. Optional `evidence`/`keep` fix the
        observed variables."""
        theta = self._theta(theta)
        batch = evidence.shape[0] if evidence is not None else theta.shape[0]
        logw = self._sum_weights(theta[:, self.num_input_params:], log=True)
        leaves = self._max_leaves(theta, batch, evidence, keep)
        saved: list[Tensor] = []
        self._upward(leaves, logw, "full", saved=saved, semiring="max")
        leaf_of_var = self._topdown(logw, saved, batch, 1, lambda rows: rows.argmax(-1))  # [B, n]
        x = self._best_states(theta, leaf_of_var)
        if evidence is not None:
            keep = self._keep(keep if keep is not None else torch.ones_like(evidence, dtype=torch.bool),
                              batch, evidence.device)
            x = torch.where(keep, evidence, x)
        return x

    # ================================================================== inputs

    def _theta(self, theta: Tensor) -> Tensor:
        """`[Bp, P]` in the compute dtype (float32, or float64 when given float64)."""
        if theta.dim() == 1:
            theta = theta.unsqueeze(0)
        if theta.dim() != 2 or theta.shape[1] != self.num_params:
            raise ValueError(f"theta must be [B, {self.num_params}] or [{self.num_params}], got {list(theta.shape)}")
        return theta if theta.dtype in (torch.float32, torch.float64) else theta.float()

    def _leaves_and_sums(self, leaves: Tensor, sum_logits: Tensor) -> tuple[Tensor, Tensor]:
        if leaves.dim() != 2 or leaves.shape[1] != self.num_leaves:
            raise ValueError(f"leaf_log_probs must be [B, {self.num_leaves}], got {list(leaves.shape)}")
        if sum_logits.dim() == 1:
            sum_logits = sum_logits.unsqueeze(0)
        if sum_logits.shape[-1] != self.num_sum_params:
            raise ValueError(f"sum_logits must be [B, {self.num_sum_params}] or [{self.num_sum_params}], "
                             f"got {list(sum_logits.shape)}")
        dtype = torch.float64 if torch.float64 in (leaves.dtype, sum_logits.dtype) else torch.float32
        return leaves.to(dtype), sum_logits.to(dtype)

    def _keep(self, keep: Tensor, batch: int, device: torch.device) -> Tensor:
        """`[B, n]` bool."""
        keep = keep.to(device=device, dtype=torch.bool)
        if keep.dim() == 1:
            keep = keep.unsqueeze(0)
        return keep.expand(batch, self.num_vars)

    def _leaves(self, x: Tensor, theta: Tensor, keep: Tensor | None) -> Tensor:
        """`[B, Q]` leaf log-probabilities at `x`, 0 where `keep` is False. Normalises lazily: reads
        the one observed logit per leaf and subtracts the leaf's logsumexp."""
        if x.dim() == 1:
            x = x.unsqueeze(0)
        batch = x.shape[0]
        bp = theta.shape[0]
        if bp not in (1, batch):
            raise ValueError(f"theta has batch {bp} but x has batch {batch}")
        if x.shape[1] != self.num_vars:
            raise ValueError(f"x must be [B, {self.num_vars}], got {list(x.shape)}")
        state = x.index_select(1, self.leaf_variable)  # [B, Q]
        kept = None
        if keep is not None:
            kept = self._keep(keep, batch, x.device).index_select(1, self.leaf_variable)  # [B, Q]
            state = state.masked_fill(~kept, 0)  # unobserved entries may hold anything
        inputs = theta[:, :self.num_input_params]  # [Bp, Q*v]
        lse = torch.logsumexp(inputs.view(bp, self.num_leaves, self.num_states), dim=-1)  # [Bp, Q]
        flat = self._leaf_row + state  # [B, Q]
        picked = inputs[0][flat] if bp == 1 else inputs.gather(1, flat)  # [B, Q]
        leaves = picked - lse
        return leaves if kept is None else leaves.masked_fill(~kept, 0.0)

    def _max_leaves(self, theta: Tensor, batch: int, evidence: Tensor | None, keep: Tensor | None) -> Tensor:
        """`[B, Q]` leaf values of the max-product pass: max_s log p(s), or log p(evidence)."""
        logits = theta[:, :self.num_input_params].view(theta.shape[0], self.num_leaves, self.num_states)
        best = logits.amax(-1) - torch.logsumexp(logits, -1)  # [Bp, Q]
        best = best.expand(batch, self.num_leaves)
        if evidence is None:
            return best
        keep = self._keep(keep if keep is not None else torch.ones_like(evidence, dtype=torch.bool),
                          batch, evidence.device)
        observed = self._leaves(evidence, theta, keep=keep)
        return torch.where(keep.index_select(1, self.leaf_variable), observed, best)

    def _sum_weights(self, sum_logits: Tensor, log: bool = False) -> list[Tensor]:
        """Per sum fold, `[Bp, F, U, K]` softmax-normalised weights (log weights if `log`)."""
        bp = sum_logits.shape[0]
        normalise = torch.log_softmax if log else torch.softmax
        folds = [op for layer in self._layers for op in layer.sums]
        if self._uniform_k and folds:  # one op normalises every fold
            k = folds[0].inputs
            flat = normalise(sum_logits.reshape(bp, -1, k), dim=-1).reshape(bp, -1)
            return [flat[:, op.param_offset:op.param_offset + op.size * op.units * k]
                    .view(bp, op.size, op.units, k) for op in folds]
        return [normalise(sum_logits[:, op.param_offset:op.param_offset + op.size * op.units * op.inputs]
                          .view(bp, op.size, op.units, op.inputs), dim=-1) for op in folds]

    # ================================================================== passes

    def _read(self, source: Tensor, names: dict[str, str | None], start: dict[str, int], mode: str,
              length: int) -> Tensor:
        """`[B, length]` entries of a flat store: a slice when contiguous, else one index_select."""
        name = names[mode]
        if name is None:
            return source.narrow(1, start[mode], length)
        return source.index_select(1, self._buffers[name])

    def _upward(self, leaves: Tensor, weights: list[Tensor], mode: str, saved: list[Tensor] | None = None,
                semiring: str = "sum") -> Tensor:
        """Bottom-up pass. Returns the root's rows `[B, 1]` (full) or `[B, n]` (prefix); appends each
        sum fold's inputs `[B, F, R, K]` to `saved` when given (top-down programs read them).
        `weights` are linear for the sum semiring and log weights for the max semiring."""
        batch = leaves.shape[0]
        stores = [leaves]
        zero = None
        fold = 0
        for layer in self._layers:
            sources = [stores[s] for s in layer.sources[mode]]
            if layer.needs_zero[mode]:
                if zero is None:
                    zero = leaves.new_zeros(batch, 1)  # log 1: a child summed out entirely
                sources.append(zero)
            source = sources[0] if len(sources) == 1 else torch.cat(sources, dim=1)
            products = [self._product(source, op, mode, batch) for op in layer.products]
            product = products[0] if len(products) == 1 else torch.cat(products, dim=1)
            outputs = []
            for op in layer.sums:
                rows = op.rows[mode]
                inputs = self._read(product, op.index, op.start, mode, op.size * rows * op.inputs)
                inputs = inputs.view(batch, op.size, rows, op.inputs)  # [B, F, R, K]
                if saved is not None:
                    saved.append(inputs)
                if semiring == "sum":
                    out = _log_matmul_exp(inputs, weights[fold])
                else:
                    out = _max_plus(inputs, weights[fold])
                outputs.append(out.reshape(batch, -1))  # [B, F*R*U]
                fold += 1
            stores.append(outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1))
        return stores[self._root_store].index_select(1, self._buffers[f"_root_{mode}"])

    def _product(self, source: Tensor, op: _ProductOp, mode: str, batch: int) -> Tensor:
        """`[B, F*R*K_out]` product units (sums of log values) of one product fold."""
        rows = op.rows[mode]
        read = self._read(source, op.index, op.start, mode, op.size * rows * op.width)
        arity = len(op.child_units)
        if op.kind == "hadamard":
            if arity == 1:
                return read
            return read.view(batch, op.size * rows, arity, op.child_units[0]).sum(2).reshape(batch, -1)
        parts = read.view(batch, op.size * rows, op.width).split(op.child_units, dim=-1)  # [B, F*R, K_c]
        out = parts[0]
        for part in parts[1:]:  # row-major: the first child is the slowest index
            out = (out.unsqueeze(-1) + part.unsqueeze(-2)).flatten(-2)
        return out.reshape(batch, -1)

    def _topdown(self, logw: list[Tensor], saved: list[Tensor] | None, batch: int, num_samples: int,
                 choose: Callable[[Tensor], Tensor]) -> Tensor:
        """Top-down selection, one sum fold at a time from the root. Each region is reached at
        most once per sample (decomposability), with one unit; `sel[:, slot]` holds it (-1: not
        reached). Returns the selected leaf of every variable, `[B*S, n]`."""
        total = batch * num_samples
        device = logw[0].device if logw else self.leaf_variable.device
        sink = self._num_region_slots
        sel = torch.full((total, sink + 1), -1, dtype=torch.long, device=device)
        sel[:, self._root_slot] = 0
        example = torch.arange(total, device=device) // num_samples  # [B*S] the example of each draw
        folds = [op for layer in self._layers for op in layer.sums]
        for fold in range(len(folds) - 1, -1, -1):
            op = folds[fold]
            unit = sel.index_select(1, self._buffers[op.slots])  # [B*S, F]
            reached = unit >= 0
            w = logw[fold]  # [Bp, F, U, K]
            owner = example if w.shape[0] > 1 else torch.zeros_like(example)
            row = (owner.unsqueeze(1) * op.size + torch.arange(op.size, device=device)) * op.units + unit.clamp_min(0)
            scores = w.reshape(-1, op.inputs).index_select(0, row.view(-1)).view(total, op.size, op.inputs)
            if saved is not None:  # weight the inputs by their upward values: [B, F, 1, K] per example
                scores = scores + saved[fold].reshape(batch, -1).index_select(0, example).view(total, op.size, op.inputs)
            choice = choose(scores)  # [B*S, F]
            entry = (torch.arange(op.size, device=device) * op.inputs + choice).view(-1)
            child_slot = self._buffers[op.child_slot].index_select(0, entry).view(total, op.size, op.arity)
            child_unit = self._buffers[op.child_unit].index_select(0, entry).view(total, op.size, op.arity)
            child_slot = child_slot.masked_fill(~reached.unsqueeze(-1), sink)
            sel.scatter_(1, child_slot.view(total, -1), child_unit.view(total, -1))
        unit = sel[:, :self._num_input_regions]  # [B*S, NI]
        leaf = self._leaf_start + unit.clamp_min(0)
        variable = torch.where(unit >= 0, self._input_variable, self.num_vars)  # unreached -> sink column
        leaf_of_var = torch.zeros(total, self.num_vars + 1, dtype=torch.long, device=device)
        return leaf_of_var.scatter_(1, variable, leaf)[:, :self.num_vars]

    def _draw_leaves(self, theta: Tensor, leaf_of_var: Tensor, num_samples: int,
                     generator: torch.Generator | None) -> Tensor:
        """`[B*S, n]` states drawn from each variable's selected leaf."""
        bp, q, v = theta.shape[0], self.num_leaves, self.num_states
        logits = theta[:, :self.num_input_params]
        if bp == 1:
            # Shared parameters: one global CDF over all leaves, leaf q's CDF shifted to [q, q+1]
            # (float64, so 1/v resolution survives the shift); a draw is one binary search.
            cdf = torch.softmax(logits.view(q, v).double(), -1).cumsum(-1)
            cdf = (cdf / cdf[:, -1:] + torch.arange(q, device=cdf.device, dtype=cdf.dtype).unsqueeze(1)).view(-1)
            u = torch.rand(leaf_of_var.shape, generator=generator, device=cdf.device, dtype=torch.float64)
            found = torch.searchsorted(cdf, leaf_of_var.double() + u, right=True)
            return (found - leaf_of_var * v).clamp(0, v - 1)
        example = torch.arange(leaf_of_var.shape[0], device=leaf_of_var.device) // num_samples
        row = (example.unsqueeze(1) * q + leaf_of_var).view(-1)
        rows = logits.reshape(bp * q, v).index_select(0, row)  # [B*S*n, v] only the selected leaves
        return _categorical(rows, generator).view(leaf_of_var.shape)

    def _best_states(self, theta: Tensor, leaf_of_var: Tensor) -> Tensor:
        """`[B, n]` the most likely state of each variable's selected leaf."""
        bp, q, v = theta.shape[0], self.num_leaves, self.num_states
        best = theta[:, :self.num_input_params].view(bp, q, v).argmax(-1)  # [Bp, Q]
        return best[0][leaf_of_var] if bp == 1 else best.gather(1, leaf_of_var)


def _log_matmul_exp(inputs: Tensor, weights: Tensor) -> Tensor:
    """`[B, F, R, U]`: log sum_k W[u, k] exp(inputs[k]) for `inputs` `[B, F, R, K]` and linear
    weights `[Bp, F, U, K]`, via the max shift and one batched matmul."""
    shift = inputs.amax(-1, keepdim=True).detach()  # [B, F, R, 1]; its gradient cancels exactly
    scaled = torch.exp(inputs - shift)
    if weights.shape[0] == 1:  # shared weights: one [F, B*R, K] x [F, K, U] batched matmul
        mixed = torch.einsum("bfrk,fuk->bfru", scaled, weights[0])
    else:
        mixed = torch.einsum("bfrk,bfuk->bfru", scaled, weights)
    return mixed.clamp_min(torch.finfo(mixed.dtype).tiny).log() + shift


def _max_plus(inputs: Tensor, log_weights: Tensor) -> Tensor:
    """`[B, F, R, U]`: max_k (log W[u, k] + inputs[k])."""
    return (inputs.unsqueeze(-2) + log_weights.unsqueeze(2)).amax(-1)


def _categorical(logits: Tensor, generator: torch.Generator | None) -> Tensor:
    """One draw per row of `logits` `[..., K]` by inverse CDF (one uniform per row)."""
    cdf = torch.softmax(logits, dim=-1).cumsum(-1)
    u = torch.rand(cdf.shape[:-1] + (1,), generator=generator, device=cdf.device, dtype=cdf.dtype)
    found = torch.searchsorted(cdf, u * cdf[..., -1:], right=True).squeeze(-1)
    return found.clamp_max(logits.shape[-1] - 1)
