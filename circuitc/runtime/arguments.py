"""Argument checks for the public programs of a `CompiledCircuit`: one check per program, named
after it, run once at the public boundary before the program's query (`circuit.CompiledCircuit`).

A mistake gets a `TypeError` (not a tensor, wrong dtype) or `ValueError` (wrong shape, a state out
of range, NaN logits where a draw would silently pick a fixed state) naming the argument and what
was expected, instead of an index error deep in a gather (or a device-side assert on a GPU). An empty
batch (`B = 0`) or `num_samples=0` is valid and gets an empty result of the right shape: each check
returns that result, or None when the program should run. `circ` is anything with the circuit's
sizes (`num_vars`, `num_states`, `num_params`, `num_leaves`, `num_sum_params`): the `Executor`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_INTEGER = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _tensor(value, name: str, shape: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {shape}, got {type(value).__name__}"
                        + ("; convert it with torch.tensor(...)" if isinstance(value, (list, tuple)) else ""))
    return value


def theta(circ, value, name: str = "theta") -> int:
    """Logits `[B, P]` or `[P]` (floating point); returns their batch (1 for `[P]`)."""
    shape = f"[B, {circ.num_params}] or [{circ.num_params}]"
    value = _tensor(value, name, shape)
    if not value.is_floating_point():
        raise TypeError(f"{name} must hold floating-point logits, got {value.dtype}")
    if value.dim() not in (1, 2) or value.shape[-1] != circ.num_params:
        raise ValueError(f"{name} must be {shape}, got {list(value.shape)}")
    return 1 if value.dim() == 1 else value.shape[0]


def states(circ, value, name: str, observed=None) -> int:
    """Observed states `[B, n]` or `[n]`, integers in 0 .. v-1 where `observed` (a checked keep
    mask; unobserved entries may hold anything); returns their batch."""
    n, v = circ.num_vars, circ.num_states
    value = _tensor(value, name, f"[B, {n}] or [{n}]")
    if value.dtype not in _INTEGER:
        raise TypeError(f"{name} must hold integer states (torch.long), got {value.dtype}")
    if value.dim() not in (1, 2) or value.shape[-1] != n:
        raise ValueError(f"{name} must be [B, {n}] or [{n}], got {list(value.shape)}")
    if value.numel():
        if observed is not None:
            value = value.masked_fill(~observed.to(value.device), 0)
        if value.numel() <= 1024 and value.device.type == "cpu":  # a few states: Python is quicker than ops
            flat = value.reshape(-1).tolist()
            low, high = min(flat), max(flat)
        else:
            low, high = (int(t) for t in torch.aminmax(value))
        if low < 0 or high >= v:
            raise ValueError(f"{name} holds the state {low if low < 0 else high}; the states of this circuit "
                             f"are 0 .. {v - 1}")
    return 1 if value.dim() == 1 else value.shape[0]


def keep(circ, value, batch: int, name: str = "keep") -> None:
    """A mask `[n]` or `[batch, n]` of bools."""
    n = circ.num_vars
    value = _tensor(value, name, f"[{n}] or [B, {n}]")
    if value.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor (True: observed), got {value.dtype}")
    if value.dim() not in (1, 2) or value.shape[-1] != n or (value.dim() == 2 and value.shape[0] not in (1, batch)):
        raise ValueError(f"{name} must be [{n}] or [{batch}, {n}], got {list(value.shape)}")


def same_batch(theta_batch: int, batch: int, name: str = "x") -> None:
    if theta_batch not in (1, batch):
        raise ValueError(f"theta has batch {theta_batch} but {name} has batch {batch}")


def finite_logits(value: Tensor, program: str) -> None:
    """No NaN or +inf logit: softmax would turn them into NaN weights and every draw into one fixed
    state (-inf is fine: a state or input of probability 0)."""
    if value.numel() and not value.max().item() < math.inf:  # max is NaN if any entry is
        raise ValueError(f"{program}: theta holds NaN or +inf logits; only finite values and -inf are allowed")


def _float(circ, value: Tensor) -> torch.dtype:
    return torch.float64 if value.dtype == torch.float64 else torch.float32


# ------------------------------------------------------------------ one check per public program

def log_prob(circ, x, theta_) -> Tensor | None:
    return _upward(circ, x, theta_)


def log_marginal(circ, x, keep_, theta_) -> Tensor | None:
    return _upward(circ, x, theta_, keep_)


def prefix_log_marginals(circ, x, theta_) -> Tensor | None:
    return _upward(circ, x, theta_, rows=circ.num_vars)


def leaf_log_probs(circ, x, theta_) -> Tensor | None:
    return _upward(circ, x, theta_, rows=circ.num_leaves)


def log_prob_from_leaves(circ, leaf_log_probs_, sum_logits) -> Tensor | None:
    return _from_leaves(circ, leaf_log_probs_, sum_logits)


def prefix_log_marginals_from_leaves(circ, leaf_log_probs_, sum_logits) -> Tensor | None:
    return _from_leaves(circ, leaf_log_probs_, sum_logits, rows=circ.num_vars)


def conditional_log_distribution(circ, x, keep_, theta_, variable) -> Tensor | None:
    if not isinstance(variable, int) or isinstance(variable, bool):
        raise TypeError(f"variable must be an int, got {type(variable).__name__}")
    if not 0 <= variable < circ.num_vars:
        raise ValueError(f"variable {variable} is out of range for a circuit over {circ.num_vars} variables")
    empty = _upward(circ, x, theta_, keep_)
    return None if empty is None else empty.new_empty(0, circ.num_states)


def sample(circ, theta_, num_samples, generator, evidence, keep_) -> Tensor | None:
    bp = theta(circ, theta_)
    if not isinstance(num_samples, int) or isinstance(num_samples, bool):
        raise TypeError(f"num_samples must be an int, got {type(num_samples).__name__}")
    if num_samples < 0:
        raise ValueError(f"num_samples must be at least 0, got {num_samples}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator is not None and generator.device.type != theta_.device.type:
        raise ValueError(f"generator is on device {generator.device}, theta on {theta_.device}; sample draws on "
                         f"theta's device, so give a generator made with torch.Generator({theta_.device.type!r})")
    batch = _evidence(circ, bp, evidence, keep_)
    finite_logits(theta_, "sample")
    if batch == 0 or num_samples == 0:
        return torch.empty(batch, num_samples, circ.num_vars, dtype=torch.long, device=theta_.device)
    return None


def map_(circ, theta_, evidence, keep_) -> Tensor | None:
    batch = _evidence(circ, theta(circ, theta_), evidence, keep_)
    finite_logits(theta_, "map")
    if batch == 0:
        return torch.empty(0, circ.num_vars, dtype=torch.long, device=theta_.device)
    return None


# ------------------------------------------------------------------ shared by several programs

def _upward(circ, x, theta_, keep_=None, rows: int | None = None) -> Tensor | None:
    """The programs over observed states: `rows` columns per example (None: one value)."""
    bp = theta(circ, theta_)
    batch = _batch(circ, x, "x")
    same_batch(bp, batch)
    if keep_ is not None:
        keep(circ, keep_, batch)
    states(circ, x, "x", keep_)
    if batch == 0:
        return theta_.new_empty((0,) if rows is None else (0, rows), dtype=_float(circ, theta_))
    return None


def _from_leaves(circ, leaf_log_probs_, sum_logits, rows: int | None = None) -> Tensor | None:
    q, p = circ.num_leaves, circ.num_sum_params
    leaves = _tensor(leaf_log_probs_, "leaf_log_probs", f"[B, {q}]")
    sums = _tensor(sum_logits, "sum_logits", f"[B, {p}] or [{p}]")
    if not leaves.is_floating_point() or not sums.is_floating_point():
        raise TypeError("leaf_log_probs and sum_logits must be floating point")
    if leaves.dim() != 2 or leaves.shape[1] != q:
        raise ValueError(f"leaf_log_probs must be [B, {q}], got {list(leaves.shape)}")
    if sums.dim() not in (1, 2) or sums.shape[-1] != p:
        raise ValueError(f"sum_logits must be [B, {p}] or [{p}], got {list(sums.shape)}")
    if sums.dim() == 2 and (sums.shape[0] == 0 or leaves.shape[0] % sums.shape[0]):
        raise ValueError(f"sum_logits has batch {sums.shape[0]} but leaf_log_probs has {leaves.shape[0]} "
                         "(a multiple of it: copies that share the sum logits)")
    if leaves.shape[0] == 0:
        dtype = torch.float64 if torch.float64 in (leaves.dtype, sums.dtype) else torch.float32
        return leaves.new_empty((0,) if rows is None else (0, rows), dtype=dtype)
    return None


def _evidence(circ, bp: int, evidence, keep_) -> int:
    """The batch of a sample/map call: the evidence's, else theta's."""
    if evidence is None:
        if keep_ is not None:
            raise ValueError("keep says which variables of evidence are observed; pass evidence too")
        return bp
    batch = _batch(circ, evidence, "evidence")
    same_batch(bp, batch, "evidence")
    if keep_ is not None:
        keep(circ, keep_, batch)
    states(circ, evidence, "evidence", keep_)
    return batch


def _batch(circ, value, name: str) -> int:
    n = circ.num_vars
    value = _tensor(value, name, f"[B, {n}] or [{n}]")
    return 1 if value.dim() == 1 else value.shape[0]
