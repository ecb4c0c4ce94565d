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

import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn

from . import arguments
from .fuse import FusedPrograms
from .plan import MODES, ParamSlot, Plan
from .threads import single_threaded_when_small


@dataclass(frozen=True)
class _ProductOp:
    kind: str
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
class _SumOp:
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
class _LayerOp:
    sources: dict[str, list[int]]
    needs_zero: dict[str, bool]
    products: tuple[_ProductOp, ...]
    sums: tuple[_SumOp, ...]


def _fusable(check: Callable) -> Callable:
    """A likelihood program. `check(self, *args)` validates the arguments eagerly, outside any
    compiled graph (value checks inside one would split it), and returns the empty result for B = 0;
    then a circuit built with `fuse=True` runs the undecorated body through torch.compile."""

    def decorate(method: Callable) -> Callable:
        @functools.wraps(method)
        def run(self: "CompiledCircuit", *args, **kwargs):
            if torch.compiler.is_compiling():
                return method(self, *args, **kwargs)
            if (empty := check(self, *args, **kwargs)) is not None:
                return empty
            if self._fused is None:
                return method(self, *args, **kwargs)
            return self._fused.call(self, method, args, kwargs)

        return run

    return decorate


class CompiledCircuit(nn.Module):
    """A probabilistic circuit compiled to layered tensor programs (see docs/architecture.md).

    `fuse=True` runs the likelihood programs (log_prob, log_marginal, prefix_log_marginals and
    their from-leaves forms) through torch.compile, one compiled graph per input shape; see
    `warm_up` and docs/compiler.md."""

    def __init__(self, plan: Plan, fuse: bool = False):
        super().__init__()
        self.plan = plan
        self.fuse = fuse
        self._fused = FusedPrograms() if fuse else None
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

        self._root_start = {m: int(plan.root_index[m][0]) for m in MODES}
        self._root_rows = {m: int(plan.root_index[m].numel()) for m in MODES}
        self._always_reached = plan.always_reached
        counts = torch.bincount(plan.input_variable, minlength=self.num_vars)
        # leaves variable-major with the same count r per variable (FF, CP, HMM, BTree): r, else None
        r = self.num_leaves // self.num_vars
        grouped = torch.arange(self.num_vars).repeat_interleave(r)
        self._leaf_group = r if r * self.num_vars == self.num_leaves and torch.equal(grouped, plan.leaf_variable) else None
        self.register_buffer("_first_leaf_of_var", torch.arange(self.num_vars) * r, persistent=False)
        self._one_input_per_variable = plan.always_reached and bool((counts == 1).all())
        if self._one_input_per_variable:
            order = torch.empty_like(plan.input_variable)
            order[plan.input_variable] = torch.arange(len(plan.input_regions))
            self.register_buffer("_input_of_variable", order, persistent=False)  # input slot = input region
            self.register_buffer("_leaf_start_of_variable", plan.leaf_start[order], persistent=False)
        # leaves grouped by variable: variable i's leaves are _leaves_by_variable[start[i]:start[i+1]]
        self.register_buffer("_leaves_by_variable", torch.argsort(plan.leaf_variable, stable=True), persistent=False)
        self._leaf_group_start = [0] + torch.bincount(plan.leaf_variable, minlength=self.num_vars).cumsum(0).tolist()
        sink = plan.num_region_slots
        unselected = torch.full((1, sink + 1), -1, dtype=torch.long)
        unselected[0, plan.root_slot] = 0
        self.register_buffer("_unselected", unselected, persistent=False)  # the top-down state before any choice
        layers = []
        table_row = 0  # first row of the next sum fold in the shared [sum(F*U), K] weight table
        for li, layer in enumerate(plan.layers):
            products = []
            for pi, pf in enumerate(layer.products):
                names = {m: self._buffer(f"_p{li}_{pi}_{m}", pf.index[m]) for m in MODES}
                products.append(_ProductOp(pf.product, pf.child_units, pf.size, dict(pf.rows), names, dict(pf.start),
                                           dict(pf.cumulative), dict(pf.halves)))
            sums = []
            for si, sf in enumerate(layer.sums):
                names = {m: self._buffer(f"_s{li}_{si}_{m}", sf.index[m]) for m in MODES}
                # one extra table row per region for "not reached": its children go to the sink
                f, k, a = sf.child_slot.shape
                child_slot = torch.cat([sf.child_slot, torch.full((f, 1, a), sink, dtype=torch.long)], 1)
                child_unit = torch.cat([sf.child_unit, torch.zeros((f, 1, a), dtype=torch.long)], 1)
                children = torch.stack([child_slot.reshape(-1, a), child_unit.reshape(-1, a)])  # one gather reads both
                sums.append(_SumOp(
                    sf.size, sf.units, sf.inputs, dict(sf.rows), names, dict(sf.start),
                    sf.param_offset - plan.num_input_params,
                    self._buffer(f"_s{li}_{si}_slots", sf.slots),
                    self._buffer(f"_s{li}_{si}_children", children),
                    self._buffer(f"_s{li}_{si}_entry_base", torch.arange(f) * (k + 1)),
                    self._buffer(f"_s{li}_{si}_row_base", torch.arange(f) * sf.units),
                    self._buffer(f"_s{li}_{si}_table_base", table_row + torch.arange(f) * sf.units),
                    a,
                ))
                table_row += sf.size * sf.units
            layers.append(_LayerOp({m: list(s) for m, s in layer.sources.items()}, dict(layer.needs_zero),
                                   tuple(products), tuple(sums)))
        self._layers = tuple(layers)
        self._sum_ops = tuple(op for layer in layers for op in layer.sums)
        self._sum_sizes = [op.size * op.units * op.inputs for op in self._sum_ops]
        self._sum_rows = [op.size * op.units for op in self._sum_ops]
        # FLOPs of a call, for running small ones single-threaded: normalising one parameter row,
        # and the per-row work of the most expensive pass (prefix marginals)
        self._param_flops = 2 * self.num_input_params + 3 * self.num_sum_params
        self._row_flops = max(plan.counts["flops"]["prefix_log_marginals"] - self._param_flops, 1)

    def _work(self, samples: int, *args: object) -> float:
        """Estimated FLOPs of a call with these arguments (see `circuitc.threads`)."""
        rows, param_rows = 1, 1
        for a in args:
            if isinstance(a, Tensor):
                shape = a.shape
                if len(shape) == 2:
                    rows = max(rows, shape[0])
                    if shape[1] == self.num_params:
                        param_rows = shape[0]
        return param_rows * self._param_flops + rows * samples * self._row_flops

    def _buffer(self, name: str, tensor: Tensor | None) -> str | None:
        if tensor is None:
            return None
        self.register_buffer(name, tensor, persistent=False)  # shared with the plan; .to() copies
        return name

    def extra_repr(self) -> str:
        return (f"num_vars={self.num_vars}, num_states={self.num_states}, num_params={self.num_params}, "
                f"layers={len(self._layers)}")

    # ================================================================== public programs

    @single_threaded_when_small(lambda self, *args, **kwargs: self._work(1, *args, *kwargs.values()))
    @_fusable(lambda self, x, theta: arguments.upward(self, x, theta))
    def log_prob(self, x: Tensor, theta: Tensor) -> Tensor:
        """`[B]` log q(x) for `x` `[B, n]` and logits `theta` `[B, P]` or `[P]`."""
        theta = self._theta(theta)
        leaves = self._leaves(x, theta, keep=None)
        return self._upward(leaves, self._sum_weights(theta[:, self.num_input_params:]), "full")[:, 0]

    @single_threaded_when_small(lambda self, *args, **kwargs: self._work(1, *args, *kwargs.values()))
    @_fusable(lambda self, x, keep, theta: arguments.upward(self, x, theta, keep))
    def log_marginal(self, x: Tensor, keep: Tensor, theta: Tensor) -> Tensor:
        """`[B]` log q(x[keep]): variables where `keep` (`[n]` or `[B, n]`) is False are summed out."""
        theta = self._theta(theta)
        leaves = self._leaves(x, theta, keep=keep)
        return self._upward(leaves, self._sum_weights(theta[:, self.num_input_params:]), "full")[:, 0]

    @single_threaded_when_small(lambda self, *args, **kwargs: self._work(1, *args, *kwargs.values()))
    @_fusable(lambda self, x, theta: arguments.upward(self, x, theta, rows=self.num_vars))
    def prefix_log_marginals(self, x: Tensor, theta: Tensor) -> Tensor:
        """`[B, n]`: column `i` is log q(x_0..x_i), all columns from one pass (the row trick)."""
        theta = self._theta(theta)
        leaves = self._leaves(x, theta, keep=None)
        return self._upward(leaves, self._sum_weights(theta[:, self.num_input_params:]), "prefix")

    @single_threaded_when_small(lambda self, *args, **kwargs: self._work(1, *args, *kwargs.values()))
    def leaf_log_probs(self, x: Tensor, theta: Tensor) -> Tensor:
        """`[B, Q]`: each leaf's log softmax(L_in[u])[x_variable]."""
        if (empty := arguments.upward(self, x, theta, rows=self.num_leaves)) is not None:
            return empty
        return self._leaves(x, self._theta(theta), keep=None).t().contiguous()

    @single_threaded_when_small(lambda self, *args, **kwargs: self._work(1, *args, *kwargs.values()))
    @_fusable(lambda self, leaf_log_probs, sum_logits: arguments.from_leaves(self, leaf_log_probs, sum_logits))
    def log_prob_from_leaves(self, leaf_log_probs: Tensor, sum_logits: Tensor) -> Tensor:
        """`[B]` from leaf values `[B, Q]` (0 at a leaf sums its variable out) and sum logits `[P_sum]`
        or `[Bs, P_sum]` with `B` a multiple of `Bs`: row `i` of the leaves uses sum row `i % Bs`, so
        `c` copies of a batch (e.g. under different evidence) share their weights, normalised once
        and mixed by one `[U, K] @ [K, c]` product per example and fold (the same values as
        `sum_logits.repeat(c, 1)`)."""
        leaves, sum_logits = self._leaves_and_sums(leaf_log_probs, sum_logits)
        return self._upward(leaves, self._sum_weights(sum_logits), "full")[:, 0]

    @single_threaded_when_small(lambda self, *args, **kwargs: self._work(1, *args, *kwargs.values()))
    @_fusable(lambda self, leaf_log_probs, sum_logits: arguments.from_leaves(self, leaf_log_probs, sum_logits, rows=self.num_vars))
    def prefix_log_marginals_from_leaves(self, leaf_log_probs: Tensor, sum_logits: Tensor) -> Tensor:
        """`[B, n]` prefix marginals from leaf values `[B, Q]` and sum logits (`[Bs, P_sum]` shared by
        copies as in `log_prob_from_leaves`)."""
        leaves, sum_logits = self._leaves_and_sums(leaf_log_probs, sum_logits)
        return self._upward(leaves, self._sum_weights(sum_logits), "prefix")

    @single_threaded_when_small(lambda self, *args, **kwargs: self._work(1, *args, *kwargs.values()))
    def conditional_log_distribution(self, x: Tensor, keep: Tensor, theta: Tensor, variable: int) -> Tensor:
        """`[B, v]`: log q(x_variable = s | x[keep]) for every state `s` (`keep[variable]` is ignored).

        The circuit is linear in the leaves of one variable, so q(s, x[keep]) = sum_l g_l p_l(s) with
        g_l the derivative of q(x[keep]) by leaf l. One marginal pass and its backward give every
        `d_l = g_l / q(x[keep])` (the posterior of selecting leaf l; they sum to 1)."""
        if (empty := arguments.conditional(self, x, keep, theta, variable)) is not None:
            return empty
        theta = self._theta(theta)
        x = self._check_x(x, theta)
        keep = self._keep(keep, x.shape[0], x.device).clone()
        keep[:, variable] = False
        first, last = self._leaf_group_start[variable], self._leaf_group_start[variable + 1]
        own = self._leaves_by_variable[first:last]  # [Qv] this variable's leaves
        create_graph = torch.is_grad_enabled() and theta.requires_grad
        with torch.enable_grad():
            leaves = self._leaves(x, theta, keep=keep)  # [Q, B]
            if not create_graph:
                leaves = leaves.detach()
            at_zero = torch.zeros(own.numel(), leaves.shape[1], dtype=leaves.dtype, device=leaves.device,
                                  requires_grad=True)  # log of the variable's leaf values, all 1
            leaves = leaves.index_add(0, own, at_zero)
            log_q = self._upward(leaves, self._sum_weights(theta[:, self.num_input_params:]), "full")[:, 0]
            (posterior,) = torch.autograd.grad(log_q.sum(), at_zero, create_graph=create_graph)  # [Qv, B]
        logits = theta[:, :self.num_input_params].view(theta.shape[0], self.num_leaves, self.num_states)
        leaf_log_dist = logits.index_select(1, own).log_softmax(-1)  # [Bp, Qv, v]
        return torch.logsumexp(posterior.t().clamp_min(0).log().unsqueeze(-1) + leaf_log_dist, dim=1)

    def warm_up(self, x: Tensor, theta: Tensor, keep: Tensor | None = None,
                repeats: int = 20) -> dict[str, dict[str, Any]]:
        """For a circuit built with `fuse=True`: compile the fused likelihood programs for the shapes,
        dtypes and grad mode of `x` `[B, n]`, `theta` and `keep` (log_marginal only when given),
        time them against eager (medians of `repeats` alternating calls) and keep the faster for
        these shapes. Returns per program `compile_s`, `fused_ms`, `eager_ms` and `uses`. Call it
        under the thread setting you will run with (compiled kernels keep theirs)."""
        if self._fused is None:
            raise ValueError("warm_up needs a circuit compiled with fuse=True")
        programs = {"log_prob": (self.log_prob, (x, theta)),
                    "prefix_log_marginals": (self.prefix_log_marginals, (x, theta))}
        if keep is not None:
            programs["log_marginal"] = (self.log_marginal, (x, keep, theta))
        return self._fused.warm_up(programs, repeats)

    @single_threaded_when_small(lambda self, *args, **kwargs: self._work(_num_samples(args, kwargs), *args, *kwargs.values()))
    @torch.no_grad()
    def sample(self, theta: Tensor, num_samples: int = 1, generator: torch.Generator | None = None,
               evidence: Tensor | None = None, keep: Tensor | None = None) -> Tensor:
        """`[B, num_samples, n]` samples, top-down and layer-parallel; with `evidence` (`[B, n]`)
        and `keep`, the unobserved variables are drawn from q(. | evidence[keep]) (an upward
        marginal pass weights every choice) and the observed ones copied. NaN or +inf logits raise."""
        if (empty := arguments.sample(self, theta, num_samples, generator, evidence, keep)) is not None:
            return empty
        theta = self._theta(theta)
        sum_logits = theta[:, self.num_input_params:]
        if evidence is not None:
            evidence = self._check_x(evidence, theta)
            keep = self._keep(keep if keep is not None else torch.ones_like(evidence, dtype=torch.bool),
                              evidence.shape[0], evidence.device)
        batch = evidence.shape[0] if evidence is not None else theta.shape[0]

        if evidence is None and theta.shape[0] == 1:
            # shared weights, no evidence: one CDF table per fold, each draw a binary search
            cdfs, bases = self._sum_cdfs(sum_logits)

            def choose(fold: int, unit: Tensor, example: Tensor) -> Tensor:
                rows = cdfs[fold].index_select(0, (unit + self._buffers[bases[fold]]).view(-1))  # [B*S*F, K]
                u = torch.rand(rows.shape[0], 1, generator=generator, device=rows.device, dtype=rows.dtype)
                return torch.searchsorted(rows, u, right=True).view(unit.shape)
        else:
            logw = self._sum_weights(sum_logits, log=True)
            saved: list[Tensor] | None = None
            if evidence is not None:
                saved = []
                self._upward(self._leaves(evidence, theta, keep=keep), [w.exp() for w in logw], "full", saved=saved)

            def choose(fold: int, unit: Tensor, example: Tensor) -> Tensor:
                scores = self._weight_rows(fold, logw[fold], unit, example)  # [B*S, F, K]
                if saved is not None:  # times each input's value given the evidence
                    scores = scores + saved[fold].permute(2, 0, 1).index_select(0, example)
                return _categorical(scores, generator)

        leaf_of_var = self._topdown(choose, batch, num_samples, theta.device)  # [B*S, n]
        x = self._draw_leaves(theta, leaf_of_var, num_samples, generator).view(batch, num_samples, self.num_vars)
        if evidence is not None:
            x = torch.where(keep.unsqueeze(1), evidence.unsqueeze(1), x)
        return x

    @single_threaded_when_small(lambda self, *args, **kwargs: self._work(1, *args, *kwargs.values()))
    @torch.no_grad()
    def map(self, theta: Tensor, evidence: Tensor | None = None, keep: Tensor | None = None) -> Tensor:
        """`[B, n]`: the max-product assignment, found by an upward max pass and backtracking.

        For non-deterministic circuits this is the usual approximate MAP: the best single induced
        tree, not necessarily the most probable assignment. Optional `evidence`/`keep` fix the
        observed variables. NaN or +inf logits raise."""
        if (empty := arguments.map_(self, theta, evidence, keep)) is not None:
            return empty
        theta = self._theta(theta)
        if evidence is not None:
            evidence = self._check_x(evidence, theta)
        batch = evidence.shape[0] if evidence is not None else theta.shape[0]
        logw = self._sum_weights(theta[:, self.num_input_params:], log=True)
        leaves = self._max_leaves(theta, batch, evidence, keep)  # [Q, B]
        if batch == 1:
            # few ops: the upward pass keeps every unit's best input [F, U, 1] and the backtracking
            # reads it (at large batch a max with indices over [F, U, K, B] is slower than
            # re-scoring only the selected units, below)
            best: list[Tensor] = []
            self._upward(leaves, logw, "full", best=best, semiring="max")

            def choose(fold: int, unit: Tensor, example: Tensor) -> Tensor:
                return best[fold].take(unit + self._buffers[self._sum_ops[fold].row_base])  # [1, F]
        else:
            saved: list[Tensor] = []
            self._upward(leaves, logw, "full", saved=saved, semiring="max")

            def choose(fold: int, unit: Tensor, example: Tensor) -> Tensor:
                scores = self._weight_rows(fold, logw[fold], unit, example)  # [B, F, K]
                return scores.add_(saved[fold].permute(2, 0, 1)).argmax(-1)  # one draw per example: no gather

        x = self._best_states(theta, self._topdown(choose, batch, 1, theta.device))
        if evidence is not None:
            keep = self._keep(keep if keep is not None else torch.ones_like(evidence, dtype=torch.bool),
                              batch, evidence.device)
            x = torch.where(keep, evidence, x)
        return x

    def _sum_cdfs(self, sum_logits: Tensor) -> tuple[list[Tensor], list[str]]:
        """Cumulative weights of shared parameters, last column exactly 1: per sum fold a table
        and the buffer naming each region's first row in it. With one K for every fold all folds
        share one `[sum(F*U), K]` table (three ops in all); else one `[F*U, K]` table per fold."""
        folds = self._sum_ops
        if self._uniform_k and folds:
            cdf = torch.softmax(sum_logits.reshape(-1, folds[0].inputs), dim=-1).cumsum(-1)
            cdf = cdf / cdf[:, -1:]
            return [cdf] * len(folds), [op.table_base for op in folds]
        cdfs = []
        for w in self._sum_weights(sum_logits):
            cdf = w.cumsum(-1)  # [F, U, K]
            cdfs.append((cdf / cdf[..., -1:]).reshape(-1, cdf.shape[-1]))
        return cdfs, [op.row_base for op in folds]

    # ================================================================== inputs

    def _theta(self, theta: Tensor) -> Tensor:
        """`[Bp, P]` in the compute dtype (float32, or float64 when given float64)."""
        if theta.dim() == 1:
            theta = theta.unsqueeze(0)
        if theta.dim() != 2 or theta.shape[1] != self.num_params:
            raise ValueError(f"theta must be [B, {self.num_params}] or [{self.num_params}], got {list(theta.shape)}")
        return theta if theta.dtype in (torch.float32, torch.float64) else theta.float()

    def _leaves_and_sums(self, leaves: Tensor, sum_logits: Tensor) -> tuple[Tensor, Tensor]:
        """Leaves `[Q, B]` (batch last, as the passes store them) and sum logits `[Bp, P_sum]`."""
        if leaves.dim() != 2 or leaves.shape[1] != self.num_leaves:
            raise ValueError(f"leaf_log_probs must be [B, {self.num_leaves}], got {list(leaves.shape)}")
        if sum_logits.dim() == 1:
            sum_logits = sum_logits.unsqueeze(0)
        if sum_logits.shape[-1] != self.num_sum_params:
            raise ValueError(f"sum_logits must be [B, {self.num_sum_params}] or [{self.num_sum_params}], "
                             f"got {list(sum_logits.shape)}")
        if sum_logits.shape[0] == 0 or leaves.shape[0] % sum_logits.shape[0]:
            raise ValueError(f"sum_logits has batch {sum_logits.shape[0]} but the leaves have {leaves.shape[0]}")
        dtype = torch.float64 if torch.float64 in (leaves.dtype, sum_logits.dtype) else torch.float32
        return leaves.to(dtype).t().contiguous(), sum_logits.to(dtype)

    def _keep(self, keep: Tensor, batch: int, device: torch.device) -> Tensor:
        """`[B, n]` bool."""
        keep = keep.to(device=device, dtype=torch.bool)
        if keep.dim() == 1:
            keep = keep.unsqueeze(0)
        return keep.expand(batch, self.num_vars)

    def _check_x(self, x: Tensor, theta: Tensor) -> Tensor:
        if x.dim() == 1:
            x = x.unsqueeze(0)
        if x.dim() != 2 or x.shape[1] != self.num_vars:
            raise ValueError(f"x must be [B, {self.num_vars}], got {list(x.shape)}")
        if theta.shape[0] not in (1, x.shape[0]):
            raise ValueError(f"theta has batch {theta.shape[0]} but x has batch {x.shape[0]}")
        return x

    def _leaves(self, x: Tensor, theta: Tensor, keep: Tensor | None) -> Tensor:
        """`[Q, B]` leaf log-probabilities at `x` (batch last), 0 where `keep` is False. Shared
        logits: one fused log_softmax of the `[Q, v]` table, then one gather (as cheap as the
        logsumexps alone, in fewer ops). Per-example logits are normalised lazily: the one observed
        logit per leaf minus the leaf's logsumexp, never a `[B, Q, v]` log_softmax."""
        x = self._check_x(x, theta)
        batch, bp = x.shape[0], theta.shape[0]
        if bp == 1 and keep is not None and batch >= EXTRA_COLUMN_MIN_BATCH:
            return self._observed_or(theta, x, keep, lambda table: table.new_zeros(table.shape[0], 1))
        kept = None
        if keep is not None:
            keep = self._keep(keep, batch, x.device)
            kept = keep.t().index_select(0, self.leaf_variable)  # [Q, B]
            x = x.masked_fill(~keep, 0)  # unobserved entries may hold anything
        if bp == 1:  # shared: normalise the [Q, v] table once (one fused op), then read it
            table = theta[0, :self.num_input_params].view(self.num_leaves, self.num_states)  # [Q, v]
            leaves = self._observed(table.log_softmax(-1), x)  # [Q, B]
        else:
            logits = theta[:, :self.num_input_params].view(bp, self.num_leaves, self.num_states)  # [B, Q, v]
            picked = logits.gather(2, x.index_select(1, self.leaf_variable).unsqueeze(-1)).squeeze(-1)  # [B, Q]
            leaves = (picked - _chunked(_logsumexp, logits)).t().contiguous()  # [Q, B]
        return leaves if kept is None else leaves.masked_fill(~kept, 0.0)

    def _observed(self, table: Tensor, x: Tensor) -> Tensor:
        """`[Q, B]`: each leaf's entry of `table` `[Q, v]` at its variable's observed state."""
        return table.gather(1, x.t().contiguous().index_select(0, self.leaf_variable))

    def _observed_or(self, theta: Tensor, x: Tensor, keep: Tensor,
                     unobserved: Callable[[Tensor], Tensor]) -> Tensor:
        """`[Q, B]` from shared logits: each leaf's log-probability at its variable's state where
        `keep`, else `unobserved(table)` (`[Q, 1]`). The value for "unobserved" is one more column of
        the normalised table, read by the same single gather: no masks over `[Q, B]`."""
        table = theta[0, :self.num_input_params].view(self.num_leaves, self.num_states).log_softmax(-1)  # [Q, v]
        table = torch.cat([table, unobserved(table)], dim=1)  # [Q, v+1]
        states = torch.where(self._keep(keep, x.shape[0], x.device), x, self.num_states)  # [B, n]
        return self._observed(table, states)

    def _max_leaves(self, theta: Tensor, batch: int, evidence: Tensor | None, keep: Tensor | None) -> Tensor:
        """`[Q, B]` leaf values of the max-product pass: max_s log p(s), or log p(evidence)."""
        if evidence is not None and theta.shape[0] == 1 and batch >= EXTRA_COLUMN_MIN_BATCH:
            keep = keep if keep is not None else torch.ones_like(evidence, dtype=torch.bool)
            return self._observed_or(theta, evidence, keep, lambda table: table.amax(-1, keepdim=True))
        logits = theta[:, :self.num_input_params].view(theta.shape[0], self.num_leaves, self.num_states)
        best = _chunked(_max_log_prob, logits).t().expand(self.num_leaves, batch)  # [Q, B]
        if evidence is None:
            return best.contiguous()
        keep = self._keep(keep if keep is not None else torch.ones_like(evidence, dtype=torch.bool),
                          batch, evidence.device)
        observed = self._leaves(evidence, theta, keep=keep)
        return torch.where(keep.t().index_select(0, self.leaf_variable), observed, best)

    def _sum_weights(self, sum_logits: Tensor, log: bool = False) -> list[Tensor]:
        """Per sum fold, softmax-normalised weights (log weights if `log`): `[F, U, K]` when shared
        (`sum_logits` `[1, P_sum]`), `[B, F, U, K]` per example."""
        bp = sum_logits.shape[0]
        normalise = torch.log_softmax if log else torch.softmax
        folds = self._sum_ops
        if self._uniform_k and folds:  # one op normalises every fold
            k = folds[0].inputs
            if bp == 1:
                rows = normalise(sum_logits.reshape(-1, k), dim=-1).split(self._sum_rows)  # [F*U, K] each
                return [w.view(op.size, op.units, k) for w, op in zip(rows, folds)]
            flat = normalise(sum_logits.reshape(bp, -1, k), dim=-1).view(bp, -1)
            return [w.view(bp, op.size, op.units, k) for w, op in zip(flat.split(self._sum_sizes, dim=1), folds)]
        lead = (bp,) if bp > 1 else ()
        return [normalise(sum_logits[:, op.param_offset:op.param_offset + op.size * op.units * op.inputs]
                          .reshape(*lead, op.size, op.units, op.inputs), dim=-1) for op in folds]

    # ================================================================== passes

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

    def _upward(self, leaves: Tensor, weights: list[Tensor], mode: str, saved: list[Tensor] | None = None,
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
        for layer in self._layers:
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
                    outputs.append(_log_matmul_exp(inputs, weights[fold], rows, batch))  # [F, U, R*B]
                elif best is not None:
                    value, argmax = _max_plus(inputs, weights[fold], rows, batch, with_argmax=True)
                    outputs.append(value)
                    best.append(argmax)
                else:
                    outputs.append(_max_plus(inputs, weights[fold], rows, batch))
                fold += 1
            stores.append(outputs[0] if len(outputs) == 1 else torch.cat([o.reshape(-1, batch) for o in outputs]))
        root = stores[self._root_store].reshape(-1, batch)
        rows = self._root_rows[mode]
        if root.shape[0] != rows:
            root = root.narrow(0, self._root_start[mode], rows)
        if semiring == "max" or saved is not None:  # no one reads these roots' values
            return root.t()  # [B, rows]
        return _impossible_as_minus_inf(root.t())

    def _product(self, source: Tensor, op: _ProductOp, mode: str, batch: int) -> Tensor:
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

    def _topdown(self, choose: Callable[[int, Tensor, Tensor], Tensor], batch: int, num_samples: int,
                 device: torch.device) -> Tensor:
        """Top-down selection, one sum fold at a time from the root. Each region is reached at
        most once per draw (decomposability), with one unit; `sel[:, slot]` holds it (-1: not
        reached). `choose(fold, unit, example)` picks an input `[B*S, F]` for the units `[B*S, F]`.
        Returns the selected leaf of every variable, `[B*S, n]`."""
        total = batch * num_samples
        sel = self._unselected.repeat(total, 1)  # [B*S, NR+1]: -1 everywhere but the root's unit 0
        example = torch.arange(total, device=device)  # [B*S] the example of each draw
        if num_samples > 1:
            example = example // num_samples
        for fold in range(len(self._sum_ops) - 1, -1, -1):
            op = self._sum_ops[fold]
            unit = sel.index_select(1, self._buffers[op.slots])  # [B*S, F]
            if self._always_reached:
                choice = choose(fold, unit, example)  # [B*S, F]
            else:
                reached = unit >= 0
                choice = choose(fold, unit.clamp_min(0), example).masked_fill(~reached, op.inputs)  # K: none
            entry = (choice + self._buffers[op.entry_base]).view(-1)  # [B*S*F] entries of the child tables
            child_slot, child_unit = self._buffers[op.children].index_select(1, entry).view(2, total, -1)  # [B*S, F*A]
            sel.scatter_(1, child_slot, child_unit)
        if self._one_input_per_variable:  # every variable's single input region is always reached
            return sel.index_select(1, self._input_of_variable) + self._leaf_start_of_variable
        unit = sel[:, :self._num_input_regions]  # [B*S, NI]
        leaf = self._leaf_start + unit.clamp_min(0)
        variable = torch.where(unit >= 0, self._input_variable, self.num_vars)  # unreached -> sink column
        leaf_of_var = torch.zeros(total, self.num_vars + 1, dtype=torch.long, device=device)
        return leaf_of_var.scatter_(1, variable, leaf)[:, :self.num_vars]

    def _weight_rows(self, fold: int, weights: Tensor, unit: Tensor, example: Tensor) -> Tensor:
        """`[B*S, F, K]`: row `unit` of every region's weights `[Bp, F, U, K]` for each draw."""
        op = self._sum_ops[fold]
        row = unit + self._buffers[op.row_base]  # [B*S, F] = f*U + u
        if weights.dim() == 4:  # per example
            row = row + (example * (op.size * op.units)).unsqueeze(1)
        return weights.reshape(-1, op.inputs).index_select(0, row.view(-1)).view(unit.shape[0], op.size, op.inputs)

    def _draw_leaves(self, theta: Tensor, leaf_of_var: Tensor, num_samples: int,
                     generator: torch.Generator | None) -> Tensor:
        """`[B*S, n]` states drawn from each variable's selected leaf."""
        bp, q, v = theta.shape[0], self.num_leaves, self.num_states
        logits = theta[:, :self.num_input_params]
        if bp == 1 and leaf_of_var.numel() >= q and self._leaf_group is not None:
            # Many draws, shared parameters, leaves grouped by variable: one CDF row per variable over
            # its r leaves (leaf j's CDF shifted to [j, j+1], float64), a binary search per draw in
            # its variable's row (shorter and cache-resident, unlike one global CDF).
            n, r = self.num_vars, self._leaf_group
            cdf = torch.softmax(logits.view(q, v).double(), -1).cumsum(-1)
            offsets = torch.arange(r, device=cdf.device, dtype=cdf.dtype).view(1, r, 1)
            rows = (cdf / cdf[:, -1:]).view(n, r, v).add_(offsets).view(n, r * v)  # [n, r*v]
            local = leaf_of_var - self._first_leaf_of_var  # [B*S, n] leaf index within its variable
            u = torch.rand(leaf_of_var.shape, generator=generator, device=cdf.device, dtype=torch.float64)
            found = torch.searchsorted(rows, (local + u).t().contiguous(), right=True).t()  # [B*S, n]
            return (found - local * v).clamp(0, v - 1)
        if bp == 1 and leaf_of_var.numel() >= q:
            # Many draws from shared parameters: one global CDF over all leaves, leaf q's CDF shifted
            # to [q, q+1] (float64 keeps 1/v resolution after the shift); a draw is a binary search.
            cdf = torch.softmax(logits.view(q, v).double(), -1).cumsum(-1)
            cdf = (cdf / cdf[:, -1:] + torch.arange(q, device=cdf.device, dtype=cdf.dtype).unsqueeze(1)).view(-1)
            u = torch.rand(leaf_of_var.shape, generator=generator, device=cdf.device, dtype=torch.float64)
            found = torch.searchsorted(cdf, leaf_of_var + u, right=True)
            return (found - leaf_of_var * v).clamp(0, v - 1)
        row = leaf_of_var
        if bp > 1:
            example = torch.arange(leaf_of_var.shape[0], device=leaf_of_var.device) // num_samples
            row = row + (example * q).unsqueeze(1)
        rows = logits.reshape(bp * q, v).index_select(0, row.reshape(-1))  # [B*S*n, v] only the selected leaves
        return _categorical(rows, generator).view(leaf_of_var.shape)

    def _best_states(self, theta: Tensor, leaf_of_var: Tensor) -> Tensor:
        """`[B, n]` the most likely state of each variable's selected leaf."""
        bp, q, v = theta.shape[0], self.num_leaves, self.num_states
        logits = theta[:, :self.num_input_params]
        if bp == 1 and leaf_of_var.numel() >= q:  # many draws: every leaf's best state once
            return logits.view(q, v).argmax(-1)[leaf_of_var]
        if bp == 1:  # few draws: only the selected leaves' rows
            return logits.view(q, v).index_select(0, leaf_of_var.reshape(-1)).argmax(-1).view(leaf_of_var.shape)
        example = torch.arange(leaf_of_var.shape[0], device=leaf_of_var.device).unsqueeze(1)
        rows = logits.reshape(bp * q, v).index_select(0, (example * q + leaf_of_var).view(-1))  # [B*n, v]
        return rows.argmax(-1).view(leaf_of_var.shape)


LOG2E = 1.4426950408889634
# shared logits with a mask from this batch on: the mask folds into the leaf gather as an extra
# table column (one [Q, v] copy, worth it once the [Q, B] masks it saves are larger than the table)
EXTRA_COLUMN_MIN_BATCH = 64
EXP2_MIN_NUMEL = 16384  # above this, exp2(x * log2 e) beats torch.exp on CPU (measured 2.5-4x; rel. error ~1e-7)


def _num_samples(args: tuple, kwargs: dict) -> int:
    """`num_samples` of a `sample` call (positional or keyword), 1 if absent or malformed."""
    value = kwargs.get("num_samples", args[1] if len(args) > 1 else 1)
    return value if isinstance(value, int) and value > 0 else 1


def _needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _exp_shifted(x: Tensor, shift: Tensor) -> Tensor:
    """exp(x - shift) (shift broadcast); large tensors fuse the shift and the base change into one
    pass before exp2."""
    if x.numel() >= EXP2_MIN_NUMEL:
        scaled = torch.add(shift * -LOG2E, x, alpha=LOG2E)  # (x - shift) * log2(e)
        return scaled.exp2_() if not _needs_grad(x) else scaled.exp2()
    return torch.exp(x - shift)


def _logsumexp(a: Tensor) -> Tensor:
    """logsumexp over the last dim with the max shift (its gradient cancels exactly).
    For large inputs the shift and the base change to 2 are one fused pass before exp2."""
    shift = a.amax(-1, keepdim=True)
    return _exp_shifted(a, shift).sum(-1).log() + shift.squeeze(-1)


CHUNK_NUMEL = 2**20  # per-example leaf normalisation runs in chunks this big: temporaries stay in cache


def _chunked(fn: Callable[[Tensor], Tensor], logits: Tensor) -> Tensor:
    """`fn` over `[B, Q, v]` in slices of examples, so no temporary as large as the input exists."""
    per_example = logits[0].numel()
    if logits.numel() <= CHUNK_NUMEL or logits.shape[0] == 1:
        return fn(logits)
    step = max(1, CHUNK_NUMEL // per_example)
    return torch.cat([fn(part) for part in logits.split(step)], dim=0)


def _max_log_prob(logits: Tensor) -> Tensor:
    """max_s log softmax(logits)[s] over the last dim: max - logsumexp (one shared max pass)."""
    shift = logits.amax(-1, keepdim=True)
    return -_exp_shifted(logits, shift).sum(-1).log()


def _impossible_as_minus_inf(values: Tensor) -> Tensor:
    """The lowest finite value (where a sum's every input was log 0) is a probability of 0: -inf."""
    lowest = torch.finfo(values.dtype).min
    # The batch-1 look reads values into Python, which a `torch.compile` graph cannot hold.
    small = values.numel() <= 64 and values.device.type == "cpu" and not values.requires_grad
    if small and not torch.compiler.is_compiling():
        if min(values.reshape(-1).tolist(), default=0.0) > lowest:  # batch 1: one look, not two ops
            return values
    return values.masked_fill(values <= lowest, float("-inf"))


def _log_matmul_exp(inputs: Tensor, weights: Tensor, rows: int, batch: int) -> Tensor:
    """`[F, U, R*B]`: log sum_k W[u, k] exp(inputs[k]) for `inputs` `[F, K, R*B]` and linear
    weights `[Bp, F, U, K]`, via the max shift and one batched matmul."""
    # [F, 1, R*B]; its gradient cancels exactly. Floored at the dtype's lowest value: when every
    # input is log 0 (a state no unit allows) the sum is that lowest value (read as -inf at the
    # root, `_impossible_as_minus_inf`), not the NaN of -inf - -inf.
    shift = inputs.amax(1, keepdim=True)
    shift = shift.clamp_min(torch.finfo(shift.dtype).min) if _needs_grad(inputs) else \
        shift.clamp_min_(torch.finfo(shift.dtype).min)
    scaled = _exp_shifted(inputs, shift)
    if weights.dim() == 3:  # shared weights: [F, U, K] @ [F, K, R*B]
        mixed = torch.bmm(weights, scaled)
    else:  # per-example weights: batch the matmul over (Bp, F); batch = c copies of Bp examples
        f, k, _ = scaled.shape
        bp = weights.shape[0]
        per_example = scaled.view(f, k, rows * (batch // bp), bp).permute(3, 0, 1, 2)  # [Bp, F, K, R*c]
        mixed = torch.matmul(weights, per_example)  # [Bp, F, U, R*c]
        mixed = mixed.permute(1, 2, 3, 0).reshape(f, -1, rows * batch)  # batch last again
    # floored at the smallest normal number: a sum whose every term underflows stays finite, and
    # the clamp (not an added constant) stops the gradient there (1/tiny would overflow into NaN)
    tiny = torch.finfo(mixed.dtype).tiny
    if _needs_grad(inputs, weights):
        return mixed.clamp_min(tiny).log() + shift
    return mixed.clamp_min_(tiny).log_().add_(shift)  # in place: no fresh large buffers per layer


def _max_plus(inputs: Tensor, log_weights: Tensor, rows: int, batch: int,
              with_argmax: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """`[F, U, R*B]`: max_k (log W[u, k] + inputs[k]), and the maximising k if `with_argmax`."""
    if not with_argmax and inputs.numel() * log_weights.shape[-2] >= MAX_PLUS_LOOP_NUMEL:
        return _max_plus_over_inputs(inputs, log_weights, rows, batch)
    if log_weights.dim() == 3:  # shared
        scores = inputs.unsqueeze(1) + log_weights.unsqueeze(-1)  # [F, U, K, R*B]
        return scores.max(2) if with_argmax else scores.amax(2)
    f, k, _ = inputs.shape
    per_example = log_weights.permute(1, 2, 3, 0).unsqueeze(3)  # [F, U, K, 1, B]
    scores = inputs.view(f, 1, k, rows, batch) + per_example
    if with_argmax:
        value, argmax = scores.max(2)  # [F, U, R, B]
        return value.view(f, -1, rows * batch), argmax.view(f, -1, rows * batch)
    return scores.amax(2).view(f, -1, rows * batch)


MAX_PLUS_LOOP_NUMEL = 65536  # [F, U, K, R*B] scores above this: a running max over k instead


def _max_plus_over_inputs(inputs: Tensor, log_weights: Tensor, rows: int, batch: int) -> Tensor:
    """`_max_plus` without `[F, U, K, R*B]` scores: a running max over the K inputs of `[F, U, R*B]`
    candidates, which stay in cache (a max over the K axis of materialised scores reduces a
    middle axis and ran ~40x slower: 68 vs 1.7 ms for F=8, U=K=32, B=1024, one thread)."""
    f, k, _ = inputs.shape
    if log_weights.dim() == 3:  # shared: [F, U, K]
        def candidate(j: int) -> Tensor:
            return inputs[:, j].unsqueeze(1) + log_weights[:, :, j].unsqueeze(-1)  # [F, U, R*B]
    else:  # per example: [B, F, U, K]
        per_example = log_weights.permute(1, 2, 3, 0).unsqueeze(3)  # [F, U, K, 1, B]
        by_row = inputs.view(f, k, 1, rows, batch)

        def candidate(j: int) -> Tensor:
            return (by_row[:, j] + per_example[:, :, j]).view(f, -1, rows * batch)  # [F, U, R*B]
    best = candidate(0)
    for j in range(1, k):
        torch.maximum(best, candidate(j), out=best)
    return best


def _categorical(logits: Tensor, generator: torch.Generator | None) -> Tensor:
    """One draw per row of `logits` `[..., K]` by inverse CDF (one uniform per row)."""
    cdf = torch.softmax(logits, dim=-1).cumsum(-1)
    u = torch.rand(cdf.shape[:-1] + (1,), generator=generator, device=cdf.device, dtype=cdf.dtype)
    found = torch.searchsorted(cdf, u * cdf[..., -1:], right=True).squeeze(-1)
    return found.clamp_max(logits.shape[-1] - 1)
