"""`CompiledCircuit`: the public programs of a compiled circuit, each one a `Program` (an argument
check and a query over the `Executor`), all run through one wrapper, `CompiledCircuit._run`:

1. a call below `circuitc.threads.SMALL_WORK` FLOPs runs on one torch thread (the caller's setting
   restored afterwards);
2. the arguments are checked once, eagerly (`arguments`; value checks inside a compiled graph would
   split it), and a `B = 0` call gets its empty result;
3. the query runs: through torch.compile (`fuse.FusedPrograms`) for the likelihood programs of a
   circuit built with `fuse=True`, else eagerly.

Inside a caller's own `torch.compile` trace the wrapper is the query alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn

from ..graph import RegionGraph
from ..plan import ParamSlot, Plan
from ..threads import single_threaded_when_small
from . import arguments, likelihood, marginals, max_product, sampling
from .executor import Executor
from .fuse import FusedPrograms


@dataclass(frozen=True)
class Program:
    """A public program of `CompiledCircuit`."""
    name: str
    check: Callable[..., Tensor | None]  # (executor, *args) -> the empty result for B = 0, or None to run
    query: Callable[..., Tensor]  # (executor, *args) -> the result
    fusable: bool = False  # a likelihood query: compiled when the circuit is built with fuse=True
    draws_argument: int | None = None  # the argument counting draws per row (sample's num_samples)


LOG_PROB = Program("log_prob", arguments.log_prob, likelihood.log_prob, fusable=True)
LOG_MARGINAL = Program("log_marginal", arguments.log_marginal, marginals.log_marginal, fusable=True)
PREFIX_LOG_MARGINALS = Program("prefix_log_marginals", arguments.prefix_log_marginals,
                               marginals.prefix_log_marginals, fusable=True)
LEAF_LOG_PROBS = Program("leaf_log_probs", arguments.leaf_log_probs, likelihood.leaf_log_probs)
LOG_PROB_FROM_LEAVES = Program("log_prob_from_leaves", arguments.log_prob_from_leaves,
                               likelihood.log_prob_from_leaves, fusable=True)
PREFIX_LOG_MARGINALS_FROM_LEAVES = Program("prefix_log_marginals_from_leaves",
                                           arguments.prefix_log_marginals_from_leaves,
                                           marginals.prefix_log_marginals_from_leaves, fusable=True)
CONDITIONAL_LOG_DISTRIBUTION = Program("conditional_log_distribution", arguments.conditional_log_distribution,
                                       marginals.conditional_log_distribution)
SAMPLE = Program("sample", arguments.sample, sampling.sample, draws_argument=1)
MAP = Program("map", arguments.map_, max_product.map_assignment)


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
        self.executor = ex = Executor(plan)
        self.num_vars, self.num_states, self.num_leaves = ex.num_vars, ex.num_states, ex.num_leaves
        self.num_params, self.num_input_params, self.num_sum_params = \
            ex.num_params, ex.num_input_params, ex.num_sum_params
        self.param_layout: list[ParamSlot] = list(plan.param_layout)
        # [Q] each leaf's variable: the contract's buffer (the executor reads its own copy)
        self.register_buffer("leaf_variable", ex.leaf_variable, persistent=False)
        # FLOPs of a call, for running small ones single-threaded: normalising one parameter row,
        # and the per-row work of the most expensive pass (prefix marginals)
        self._param_flops = 2 * self.num_input_params + 3 * self.num_sum_params
        self._row_flops = max(plan.counts["flops"]["prefix_log_marginals"] - self._param_flops, 1)

    @property
    def graph(self) -> RegionGraph | None:
        """The checked `RegionGraph` the circuit was lowered from (None for a hand-built `Plan` without
        one): what an MTP head saves, and what `circuitc compile` writes into the plan file."""
        return self.plan.graph

    def extra_repr(self) -> str:
        return (f"num_vars={self.num_vars}, num_states={self.num_states}, num_params={self.num_params}, "
                f"layers={len(self.executor.layers)}")

    def __repr__(self) -> str:
        # one line, as before the executor became a child module: it is an implementation detail
        return f"{type(self).__name__}({self.extra_repr()})"

    # ================================================================== the one wrapper

    def _work(self, program: Program, args: tuple) -> float:
        """Estimated FLOPs of a call with these (not yet checked) arguments (see `circuitc.threads`)."""
        draws = 1
        if program.draws_argument is not None:
            value = args[program.draws_argument]
            draws = value if isinstance(value, int) and value > 0 else 1
        rows, param_rows = 1, 1
        for a in args:
            if isinstance(a, Tensor):
                shape = a.shape
                if len(shape) == 2:
                    rows = max(rows, shape[0])
                    if shape[1] == self.num_params:
                        param_rows = shape[0]
        return param_rows * self._param_flops + rows * draws * self._row_flops

    @single_threaded_when_small(_work)
    def _run(self, program: Program, args: tuple) -> Tensor:
        """Run a public program: its arguments checked once, then its query, fused or eager (the
        decorator runs small calls on one thread; see the module docstring)."""
        executor = self.executor
        if torch.compiler.is_compiling():  # traced whole by a caller's torch.compile: the query alone
            return program.query(executor, *args)
        if (empty := program.check(executor, *args)) is not None:
            return empty
        if program.fusable and self._fused is not None:
            return self._fused.call(program.name, program.query, executor, args)
        return program.query(executor, *args)

    # ================================================================== public programs

    def log_prob(self, x: Tensor, theta: Tensor) -> Tensor:
        """`[B]` log q(x) for `x` `[B, n]` and logits `theta` `[B, P]` or `[P]`."""
        return self._run(LOG_PROB, (x, theta))

    def log_marginal(self, x: Tensor, keep: Tensor, theta: Tensor) -> Tensor:
        """`[B]` log q(x[keep]): variables where `keep` (`[n]` or `[B, n]`) is False are summed out."""
        return self._run(LOG_MARGINAL, (x, keep, theta))

    def prefix_log_marginals(self, x: Tensor, theta: Tensor) -> Tensor:
        """`[B, n]`: column `i` is log q(x_0..x_i), all columns from one pass (the row trick)."""
        return self._run(PREFIX_LOG_MARGINALS, (x, theta))

    def leaf_log_probs(self, x: Tensor, theta: Tensor) -> Tensor:
        """`[B, Q]`: each leaf's log softmax(L_in[u])[x_variable]."""
        return self._run(LEAF_LOG_PROBS, (x, theta))

    def log_prob_from_leaves(self, leaf_log_probs: Tensor, sum_logits: Tensor) -> Tensor:
        """`[B]` from leaf values `[B, Q]` (0 at a leaf sums its variable out) and sum logits `[P_sum]`
        or `[Bs, P_sum]` with `B` a multiple of `Bs`: row `i` of the leaves uses sum row `i % Bs`, so
        `c` copies of a batch (e.g. under different evidence) share their weights, normalised once
        and mixed by one `[U, K] @ [K, c]` product per example and fold (the same values as
        `sum_logits.repeat(c, 1)`)."""
        return self._run(LOG_PROB_FROM_LEAVES, (leaf_log_probs, sum_logits))

    def prefix_log_marginals_from_leaves(self, leaf_log_probs: Tensor, sum_logits: Tensor) -> Tensor:
        """`[B, n]` prefix marginals from leaf values `[B, Q]` and sum logits (`[Bs, P_sum]` shared by
        copies as in `log_prob_from_leaves`)."""
        return self._run(PREFIX_LOG_MARGINALS_FROM_LEAVES, (leaf_log_probs, sum_logits))

    def conditional_log_distribution(self, x: Tensor, keep: Tensor, theta: Tensor, variable: int) -> Tensor:
        """`[B, v]`: log q(x_variable = s | x[keep]) for every state `s` (`keep[variable]` is ignored).

        The circuit is linear in the leaves of one variable, so q(s, x[keep]) = sum_l g_l p_l(s) with
        g_l the derivative of q(x[keep]) by leaf l. One marginal pass and its backward give every
        `d_l = g_l / q(x[keep])` (the posterior of selecting leaf l; they sum to 1)."""
        return self._run(CONDITIONAL_LOG_DISTRIBUTION, (x, keep, theta, variable))

    def sample(self, theta: Tensor, num_samples: int = 1, generator: torch.Generator | None = None,
               evidence: Tensor | None = None, keep: Tensor | None = None) -> Tensor:
        """`[B, num_samples, n]` samples, top-down and layer-parallel; with `evidence` (`[B, n]`)
        and `keep`, the unobserved variables are drawn from q(. | evidence[keep]) (an upward
        marginal pass weights every choice) and the observed ones copied. NaN or +inf logits raise."""
        return self._run(SAMPLE, (theta, num_samples, generator, evidence, keep))

    def map(self, theta: Tensor, evidence: Tensor | None = None, keep: Tensor | None = None) -> Tensor:
        """`[B, n]`: the max-product assignment, found by an upward max pass and backtracking.

        For non-deterministic circuits this is the usual approximate MAP: the best single induced
        tree, not necessarily the most probable assignment. Optional `evidence`/`keep` fix the
        observed variables. NaN or +inf logits raise."""
        return self._run(MAP, (theta, evidence, keep))

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
