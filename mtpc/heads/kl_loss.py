"""The distillation objective of the MtPC paper (Appendix J): the head matches the LM's own conditionals.

At every position `t` and window position `j` (1..n) the frozen LM's next-token distribution on the
gold text, `p_j = p_LM(x_{t+j} | x_{<t+j})`, is the teacher of the head's conditional

    q_{t,j}(s) = q_t(x_{t+j} = s | x_{t+1..t+j-1})   for every state s,

and the loss is the KL divergence, weighted and averaged like the NLL of `mtpc.heads.nll_loss` (Eq. 5):

    L = sum_j gamma^(j-1) * (sum_t valid[t, j] * KL(p_j || q_{t,j})) / N_j.

`divergence="tv"` replaces the KL with the total variation `1 - sum_s min(p_j(s), q_{t,j}(s))`: one minus
the probability that speculative sampling keeps the drafted byte at that position when the bytes before
it were kept (the token-by-token rule's acceptance rate), so it trains what decoding measures; its
gradient reaches `q` only where `q < p`.

Choices (the same as the NLL's where they overlap):
- `valid[t, j]`, `N_j` and the global `normalizer` are those of `mtp_loss`; the conditioning bytes
  `x_{t+1..t+j-1}` that are not valid targets are summed out of `q`, as in the NLL. The teacher
  itself always conditions on the whole gold prefix (it is the LM's forward on the batch).
- The circuit has `v` states (the bytes) while the LM may also put mass on special tokens; the
  teacher is the LM's distribution *renormalised over the `v` circuit states* (its distribution given
  that the next token is a byte), so the KL is finite.
- Only `sum_s p(s) log q(s)` depends on the head; the teacher's entropy is added so that the value
  (and what training logs) is the true KL, >= 0.

How `q_{t,j}` is computed for all `s` without `[N, v]` passes: the circuit is linear in the leaves of
variable `j`, so `q_{t,j}(s) = sum_l d_l p_l(s)` over that variable's leaves `l`, with `d_l` the
posterior of leaf `l` given the prefix (the derivative of `log q_t(prefix)` by the leaf's log value,
taken at 0 = the variable summed out; see `CompiledCircuit.conditional_log_distribution`). One
marginal pass over `n` copies of each window (copy `j` keeps the prefix before `j`) and its backward
give every `d` at once; training differentiates through that backward (double backward).

Memory: like `mtp_loss`, the fused path works on blocks of windows whose leaf logits `[Nb, Q, v]`
fit `chunk_elements`, reads the teacher's `[Nb, n, V]` logits a block at a time from a callable (so
`[B*T, V]` probabilities are never held), and recomputes each block in the backward pass (a
checkpoint, `_Recomputed`). `fused=False` is the plain reference (all windows at once, through
`conditional_log_distribution`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.profiler import record_function

from .windows import window_targets
from .nll_loss import DEFAULT_CHUNK_ELEMENTS, LossOutput, at_least_float32, gamma_weights, window_validity

Teacher = Callable[[torch.Tensor], torch.Tensor]  # flat positions [M] -> the LM's next-token logits [M, V]


def lm_teacher(lm_head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor) -> Teacher:
    """A teacher reading the LM's logits `lm_head(hidden)` at flat positions of `hidden` [B, T, d]
    (the verifier path's final hidden states), only where asked."""
    flat = hidden.detach().flatten(0, 1)  # [B*T, d] (bf16 under autocast: cast to the head's dtype)
    dtype = getattr(getattr(lm_head, "weight", None), "dtype", flat.dtype)
    return lambda positions: lm_head(flat.index_select(0, positions).to(dtype))


def logits_teacher(logits: torch.Tensor) -> Teacher:
    """A teacher from precomputed logits `[B, T, V]` (tests, small batches)."""
    flat = logits.detach().flatten(0, 1)  # [B*T, V]
    return lambda positions: flat.index_select(0, positions)


def kl_loss(head, hidden: torch.Tensor, teacher: Teacher, tokens: torch.Tensor, doc_ids: torch.Tensor,
            loss_mask: torch.Tensor, *, gamma: float = 0.9, fused: bool = True,
            normalizer: torch.Tensor | None = None, window_mask: torch.Tensor | None = None,
            chunk_elements: int = DEFAULT_CHUNK_ELEMENTS, divergence: str = "kl", first_given: bool = False) -> LossOutput:
    """The KL loss of a batch: `hidden` [B, T, d] (draft-path hidden states), `teacher` (e.g.
    `lm_teacher(lm.lm_head, verifier_hidden)`: the logits at position `t` predict `tokens[t + 1]`),
    `tokens`, `doc_ids` [B, T] long, `loss_mask` [B, T] bool; `normalizer` and `window_mask` as in
    `mtpc.heads.nll_loss.mtp_loss`. `term_sums[j]` is the sum of the KLs at window position `j`.
    `divergence`: "kl" or "tv" (the total variation instead, see the module docstring); `first_given` as in
    `mtp_loss` (position 1's term left out: the head reads that token)."""
    if divergence not in DIVERGENCES:
        raise ValueError(f"divergence must be one of {tuple(DIVERGENCES)}, got {divergence!r}")
    measure = DIVERGENCES[divergence]
    n, v = head.num_variables, head.num_states
    B, T = tokens.shape
    valid = window_validity(tokens, doc_ids, loss_mask, n, v, window_mask)  # [B, T, n]
    rows = valid.any(-1).flatten()  # [B*T]
    h = hidden.flatten(0, 1)[rows]  # [N, d]
    x = window_targets(tokens, n).flatten(0, 1)[rows]  # [N, n]
    valid = valid.flatten(0, 1)[rows]  # [N, n]
    x = torch.where(valid & (x < v), x, torch.zeros_like(x))
    # the teacher of (t, j) is the LM's output at t + j - 1 (same row: a valid target is inside it)
    starts = torch.arange(B * T, device=tokens.device)[rows]  # [N]
    positions = (starts.unsqueeze(1) + torch.arange(n, device=tokens.device)).clamp(max=B * T - 1)  # [N, n]
    counts = valid.sum(0)  # [n]
    if h.shape[0] == 0:  # nothing to score: a zero that still reaches every trainable input (for DDP)
        kls = valid.to(h.dtype) + 0 * head.sum_logits(h).sum()  # [0, n]
    elif fused:
        kls = _blocked_kl(head, h, x, valid, positions, teacher, chunk_elements, measure)  # [N, n]
    else:
        kls = _naive_kl(head, h, x, valid, _teacher_log_probs(teacher, positions, v), measure)  # [N, n]
    sums = kls.sum(0)  # [n]
    denom = (counts if normalizer is None else normalizer).to(sums).clamp(min=1)
    loss = (gamma_weights(n, gamma, sums.dtype, sums.device, first_given) * sums / denom).sum()
    return LossOutput(loss, sums.detach(), counts)


@torch.no_grad()
def _teacher_log_probs(teacher: Teacher, positions: torch.Tensor, v: int) -> torch.Tensor:
    """`[N, n, v]` the teacher's log-probabilities renormalised over the circuit's `v` states."""
    N, n = positions.shape
    # window (t, j) reads position t + j - 1: neighbouring windows share n - 1 of their positions, so the
    # LM's output layer runs once per distinct position (about n times less work), then each is gathered
    distinct, where = positions.flatten().unique(return_inverse=True)  # [M], [N*n]
    with torch.autocast(positions.device.type, enabled=False), record_function("mtpc.teacher_logits"):
        logits = at_least_float32(teacher(distinct))[:, :v]  # [M, v]
    return logits.log_softmax(-1)[where].view(N, n, v)


def _kl(teacher_log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """`[..]` KL(p || q) over the last dimension."""
    return (teacher_log_p.exp() * (teacher_log_p - log_q)).sum(-1)


def _tv(teacher_log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """`[..]` total variation `1 - sum min(p, q)` over the last dimension."""
    return 1 - torch.minimum(teacher_log_p, log_q).exp().sum(-1)


DIVERGENCES = {"kl": _kl, "tv": _tv}  # kl_loss(divergence=...) -> the measure of (teacher log p, log q)


# ------------------------------------------------------------------ reference path


def _naive_kl(head, h, x, valid, teacher_log_p, measure=_kl) -> torch.Tensor:
    """`[N, n]` from the full parameter vectors `[N, P]` and `conditional_log_distribution`."""
    n = head.num_variables
    theta = at_least_float32(head(h))  # [N, P]
    out = []
    for j in range(n):
        keep = torch.zeros_like(valid)
        keep[:, :j] = valid[:, :j]
        log_q = head.circ.conditional_log_distribution(x, keep, theta, j)  # [N, v]
        out.append(measure(teacher_log_p[:, j].to(log_q.dtype), log_q))
    kl = torch.stack(out, 1)  # [N, n]
    return torch.where(valid, kl, torch.zeros_like(kl))


# ------------------------------------------------------------------ fused path


def _blocked_kl(head, h, x, valid, positions, teacher: Teacher, chunk_elements: int, measure=_kl) -> torch.Tensor:
    circ = head.circ
    n, v, Q = head.num_variables, head.num_states, head.num_leaves
    size = max(1, chunk_elements // window_elements(head))
    own = [torch.nonzero(circ.leaf_variable == j).flatten() for j in range(n)]  # each variable's leaves
    if Q % n == 0 and torch.equal(circ.leaf_variable, torch.arange(n, device=h.device).repeat_interleave(Q // n)):
        own = None  # variable-major, r leaves each (FF, CP, HMM, BTree): all positions in one op
    out = []
    for t0 in range(0, h.shape[0], size):
        t1 = min(h.shape[0], t0 + size)
        teacher_log_p = _teacher_log_probs(teacher, positions[t0:t1], v)  # [Nb, n, v], no gradient
        params = [p for p in head.parameters() if p.requires_grad]
        out.append(_Recomputed.apply(_KLBlock(head, own, measure), h[t0:t1], x[t0:t1], valid[t0:t1], teacher_log_p,
                                     *params))
    return torch.cat(out, 0)


def window_elements(head) -> int:
    """Values the fused path holds per window: leaf logits, teacher, and the n-copy marginal pass (n
    copies of the leaves and of the activations, each with its gradient; one of the sum weights,
    which the copies share)."""
    n, v, Q = head.num_variables, head.num_states, head.num_leaves
    return Q * v + n * v + 2 * n * (Q + _activations(head.circ)) + 2 * head.circ.num_sum_params


def _activations(circ) -> int:
    """Values one marginal pass stores per example: every sum fold's inputs and outputs."""
    folds = getattr(getattr(circ, "plan", None), "sum_folds", None)
    if folds is None:
        return circ.num_sum_params
    return sum(fold.size * (fold.inputs + fold.units) for fold in folds)


class _Recomputed(torch.autograd.Function):
    """A block run without a graph and rerun in the backward pass (a checkpoint). Written out
    because the block itself takes a gradient (the posteriors): under `torch.utils.checkpoint` that
    inner backward would trigger the recomputation already in the forward pass."""

    @staticmethod
    def forward(ctx, block, h, x, valid, teacher_log_p, *params):
        with torch.no_grad():
            out = block(h, x, valid, teacher_log_p)  # [Nb, n]
        ctx.block = block
        ctx.save_for_backward(h, x, valid, teacher_log_p, *params)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        h, x, valid, teacher_log_p, *params = ctx.saved_tensors
        need_h = ctx.needs_input_grad[1]
        trained = [p for p, need in zip(params, ctx.needs_input_grad[5:]) if need]
        with torch.enable_grad():
            h = h.detach().requires_grad_(need_h)
            out = ctx.block(h, x, valid, teacher_log_p)
            inputs = ([h] if need_h else []) + trained
            grads = iter(torch.autograd.grad(out, inputs, grad_out, allow_unused=True))
        grad_h = next(grads) if need_h else None
        grad_params = [next(grads) if need else None for need in ctx.needs_input_grad[5:]]
        return (None, grad_h, None, None, None, *grad_params)


class _KLBlock:
    """`[Nb, n]` KLs of a block of windows, keeping nothing larger than `[Nb, Q, v]`."""

    def __init__(self, head, own: list[torch.Tensor] | None, measure=_kl):
        self.head, self.own = head, own  # each variable's leaves, or None: variable-major, r leaves each
        self.measure = measure  # _kl or _tv

    def __call__(self, h, x, valid, teacher_log_p):
        head, circ = self.head, self.head.circ
        with torch.autocast(h.device.type, enabled=False):
            with record_function("mtpc.head_forward"):  # phase labels: benchmarks/bench_train_step.py
                h = at_least_float32(h)
                log_p = at_least_float32(head.input_logits(h)).log_softmax(-1)  # [Nb, Q, v]
                var = circ.leaf_variable  # [Q]
                observed = log_p.gather(-1, x.index_select(1, var).unsqueeze(-1)).squeeze(-1)  # [Nb, Q]
                observed = observed.masked_fill(~valid.index_select(1, var), 0.0)
                sum_logits = at_least_float32(head.sum_logits(h))  # [Nb, S]
            with record_function("mtpc.circuit"):
                posterior = self._posteriors(observed, sum_logits)  # [n, Nb, Q]
            kl = self._kls(posterior, log_p, teacher_log_p)  # [Nb, n]
        return torch.where(valid, kl, torch.zeros_like(kl))

    def _kls(self, posterior: torch.Tensor, log_p: torch.Tensor, teacher_log_p: torch.Tensor) -> torch.Tensor:
        """`[Nb, n]`: KL(teacher_j || q_j) with `q_j(s) = sum_l d_l p_l(s)` over variable `j`'s leaves,
        `d` = copy `j`'s posterior `[n, Nb, Q]`, `log p` `[Nb, Q, v]`."""
        n, (Nb, Q, v) = self.head.num_variables, log_p.shape
        tiny = torch.finfo(posterior.dtype).tiny  # a 0 posterior stays finite in the backward
        if self.own is None:  # one op over all positions: per-position slices of log_p would each
            # cost a zero-filled [Nb, Q, v] gradient in the backward (and the double backward)
            d = torch.diagonal(posterior.view(n, Nb, n, Q // n), dim1=0, dim2=2).permute(0, 2, 1)  # [Nb, n, r]
            log_q = torch.logsumexp(d.clamp_min(tiny).log().unsqueeze(-1) + log_p.view(Nb, n, Q // n, v), 2)
            return self.measure(teacher_log_p.to(log_q.dtype), log_q)  # [Nb, n]
        kls = []
        for j in range(n):
            d = posterior[j].index_select(1, self.own[j])  # [Nb, Qv]
            log_q = torch.logsumexp(d.clamp_min(tiny).log().unsqueeze(-1) + log_p.index_select(1, self.own[j]), 1)
            kls.append(self.measure(teacher_log_p[:, j].to(log_q.dtype), log_q))  # [Nb]
        return torch.stack(kls, 1)

    def _posteriors(self, observed: torch.Tensor, sum_logits: torch.Tensor) -> torch.Tensor:
        """`[n, Nb, Q]`: copy `j` is d log q(x_{<j}) / d (log value of each leaf) at the leaves of
        variables >= j summed out; on variable `j`'s leaves this is the posterior of choosing them."""
        circ, n = self.head.circ, self.head.num_variables
        Nb, Q = observed.shape
        before = circ.leaf_variable.unsqueeze(0) < torch.arange(n, device=observed.device).unsqueeze(1)  # [n, Q]
        leaves = torch.where(before.unsqueeze(1), observed.unsqueeze(0), torch.zeros_like(observed))  # [n, Nb, Q]
        differentiable = torch.is_grad_enabled() and (observed.requires_grad or sum_logits.requires_grad)
        with torch.enable_grad():
            at_zero = torch.zeros(n * Nb, Q, dtype=observed.dtype, device=observed.device, requires_grad=True)
            if not differentiable:
                leaves, sum_logits = leaves.detach(), sum_logits.detach()
            # copy j of window b is row j * Nb + b: the n copies share the window's sum logits (row b)
            log_q = circ.log_prob_from_leaves(leaves.reshape(n * Nb, Q) + at_zero, sum_logits)
            (grad,) = torch.autograd.grad(log_q.sum(), at_zero, create_graph=differentiable)  # [n*Nb, Q]
        return grad.view(n, Nb, Q)
