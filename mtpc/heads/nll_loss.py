"""The windowed composite log-likelihood of the MtPC paper (Section 4.1, Eq. 5), memory-efficiently.

At every position `t` the head turns the hidden state `h_t` into a circuit `q_t` over the next `n`
bytes. Term `j` (1..n) is the conditional

    log q_t(x_{t+j} | x_{t+1..t+j-1})  =  log q_t(x_{t+1..t+j}) - log q_t(x_{t+1..t+j-1}),

read off the circuit's prefix marginals (one pass gives all `n`). Targets that are invalid (past the
end of the document or the sequence, outside the loss mask, or not a circuit state, e.g. a special
token) are *summed out exactly*: their leaves get the value 0 (= log 1), so every prefix marginal
marginalises them, later terms condition only on the valid bytes, and an invalid term itself is 0.
The loss is

    L = - sum_j gamma^(j-1) * (sum_t valid[t, j] * term[t, j]) / N_j,

with `N_j` the number of valid targets at window position `j` (so each term is a mean over the
positions where it exists, and short windows at document ends are not under-weighted).

Memory: the naive way materialises the leaves' logits `[tokens, Q, v]` (`Q = n*r` input units)
before reading one entry per row. `chunked_leaf_log_probs` computes them a block of leaves (and, for
long batches, a block of tokens) at a time, keeps only the observed entry `[tokens, Q]`, and
recomputes each block in the backward pass (`torch.utils.checkpoint`), so peak memory grows with
`tokens * Q` instead of `tokens * Q * v`.
"""

from __future__ import annotations

from functools import partial
from dataclasses import dataclass

import torch
from torch.profiler import record_function
from torch.utils.checkpoint import checkpoint

from .constants import DEFAULT_CHUNK_ELEMENTS
from .windows import target_validity, window_targets


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar: -sum_j gamma^(j-1) S_j / N_j
    term_sums: torch.Tensor  # [n] S_j = sum over valid (t, j) of the conditional log-likelihood (detached)
    counts: torch.Tensor  # [n] N_j, valid targets per window position (the local batch's)


# ------------------------------------------------------------------ leaves


def at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """`t` in float32 unless it is already float32 or float64 (bf16/fp16 logits from autocast)."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def naive_leaf_log_probs(head, h: torch.Tensor, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """`[N, Q]` leaf values, materialising all `[N, Q, v]` logits. `h` [N, d], `x`/`valid` [N, n]."""
    var = head.circ.leaf_variable  # [Q]
    logp = at_least_float32(head.input_logits(h)).log_softmax(-1)  # [N, Q, v]
    picked = logp.gather(-1, x.index_select(1, var).unsqueeze(-1)).squeeze(-1)  # [N, Q]
    return picked.masked_fill(~valid.index_select(1, var), 0.0)


def chunked_leaf_log_probs(head, h: torch.Tensor, x: torch.Tensor, valid: torch.Tensor,
                           chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> torch.Tensor:
    """`[N, Q]`, the same values as `naive_leaf_log_probs`, computed in blocks of at most about
    `chunk_elements` logits, each recomputed in the backward pass instead of being stored.

    A head with one flat `[P, d]` matrix (`MTPHead`, parameterisation "full") takes a fused path
    (`_FlatHeadLeaves`) that writes each block's weight gradient straight into its rows; any other
    head goes through `head.input_logits(h, leaves=block)` under `torch.utils.checkpoint` (correct
    for every parameterisation, but autograd's slice backward then allocates a full-size gradient of
    the sliced parameter per block)."""
    var = head.circ.leaf_variable  # [Q]
    states = x.index_select(1, var)  # [N, Q] observed state of each leaf's variable
    kept = valid.index_select(1, var)  # [N, Q]
    if _has_flat_weight(head):
        leaves = _FlatHeadLeaves.apply(h, head.weight, head.bias, states, head.num_states,
                                       _leaves_per_block(h.shape[0], head, chunk_elements), _autocast_dtype(h))
    else:
        leaves = _checkpointed_leaves(head, h, states, chunk_elements)
    return leaves.masked_fill(~kept, 0.0)  # [N, Q]


def _leaves_per_block(N: int, head, chunk_elements: int) -> int:
    return max(1, min(head.num_leaves, chunk_elements // max(1, N * head.num_states)))


def _has_flat_weight(head) -> bool:
    return getattr(head, "parameterisation", None) == "full" and isinstance(getattr(head, "weight", None), torch.Tensor)


def _autocast_dtype(h: torch.Tensor) -> torch.dtype | None:
    kind = h.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None


def _checkpointed_leaves(head, h: torch.Tensor, states: torch.Tensor, chunk_elements: int) -> torch.Tensor:
    N, Q, v = h.shape[0], head.num_leaves, head.num_states
    leaves_per_block = _leaves_per_block(N, head, chunk_elements)
    tokens_per_block = N if leaves_per_block > 1 or N * v <= chunk_elements else max(1, chunk_elements // v)
    rows = []
    for t0 in range(0, N, tokens_per_block):
        t1 = min(N, t0 + tokens_per_block)
        cols = []
        for q0 in range(0, Q, leaves_per_block):
            block = _LeafBlock(head, slice(q0, min(Q, q0 + leaves_per_block)))
            cols.append(checkpoint(block, h[t0:t1], states[t0:t1, q0:q0 + leaves_per_block],
                                   use_reentrant=False))  # [Nb, Qb]
        rows.append(torch.cat(cols, 1))
    return torch.cat(rows, 0)


class _LeafBlock:
    """log softmax(input logits of leaves `leaves`)[observed state], without keeping the logits."""

    def __init__(self, head, leaves: slice):
        self.head, self.leaves = head, leaves

    def __call__(self, h: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        # phase labels (benchmarks/bench_train_step.py), also when recomputed in the backward pass
        with record_function("mtpc.head_forward"):
            return self._picked(h, states)

    def _picked(self, h: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        logits = at_least_float32(self.head.input_logits(h, leaves=self.leaves))  # [Nb, Qb, v]
        picked = logits.gather(-1, states.unsqueeze(-1)).squeeze(-1)  # [Nb, Qb]
        return picked - torch.logsumexp(logits, -1)


class _FlatHeadLeaves(torch.autograd.Function):
    """Leaf log-probs of a head whose leaf `q` has logits `W[q*v:(q+1)*v] @ h + b[q*v:(q+1)*v]`
    (the first `Q*v` rows of `weight` [P, d]), `block` leaves at a time; the backward recomputes each
    block's softmax and accumulates its gradients in place. The matmuls run in `mm_dtype` (the
    autocast dtype, if any); softmax and outputs in float32 (float64 for float64 inputs)."""

    @staticmethod
    def forward(ctx, h, weight, bias, states, v: int, block: int, mm_dtype):
        N, Q = states.shape
        out = torch.empty(N, Q, dtype=_acc_dtype(h, weight), device=h.device)  # [N, Q]
        with torch.autocast(h.device.type, enabled=False), record_function("mtpc.head_forward"):
            for q0 in range(0, Q, block):
                q1 = min(Q, q0 + block)
                logits = _block_logits(h, weight, bias, q0, q1, v, mm_dtype, out.dtype)  # [N, Qb, v]
                picked = logits.gather(-1, states[:, q0:q1].unsqueeze(-1)).squeeze(-1)
                out[:, q0:q1] = picked - torch.logsumexp(logits, -1)
        ctx.save_for_backward(h, weight, bias, states)
        ctx.v, ctx.block, ctx.mm_dtype = v, block, mm_dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):  # grad_out [N, Q]
        h, weight, bias, states = ctx.saved_tensors
        v, block, mm_dtype = ctx.v, ctx.block, ctx.mm_dtype
        N, Q = states.shape
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros(h.shape, dtype=grad_out.dtype, device=h.device) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros_like(bias) if need_b else None
        with torch.autocast(h.device.type, enabled=False), record_function("mtpc.head_forward"):
            for q0 in range(0, Q, block):
                q1 = min(Q, q0 + block)
                g = grad_out[:, q0:q1]  # [N, Qb]
                logits = _block_logits(h, weight, bias, q0, q1, v, mm_dtype, grad_out.dtype)  # [N, Qb, v]
                dlogits = torch.softmax(logits, -1).mul_(-g.unsqueeze(-1))  # d out / d logits = onehot - p
                dlogits.scatter_add_(-1, states[:, q0:q1].unsqueeze(-1), g.unsqueeze(-1))
                d2 = dlogits.view(N, (q1 - q0) * v)  # [N, Qb*v]
                rows = slice(q0 * v, q1 * v)
                if need_h:
                    grad_h += _mm(d2, weight[rows], mm_dtype).to(grad_h.dtype)  # [N, d]
                if need_w:
                    grad_w[rows] = _mm(d2.t(), h, mm_dtype).to(grad_w.dtype)  # [Qb*v, d]
                if need_b:
                    grad_b[rows] = d2.sum(0).to(grad_b.dtype)
        return (grad_h.to(h.dtype) if need_h else None), grad_w, grad_b, None, None, None, None


def _acc_dtype(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _mm(a: torch.Tensor, b: torch.Tensor, mm_dtype) -> torch.Tensor:  # noqa: D401
    """`a @ b` in `mm_dtype` (when given) with the result in `a`'s dtype."""
    if mm_dtype is None:
        return a @ b.to(a.dtype)
    return (a.to(mm_dtype) @ b.to(mm_dtype)).to(a.dtype)


def _block_logits(h, weight, bias, q0: int, q1: int, v: int, mm_dtype, out_dtype) -> torch.Tensor:
    rows = slice(q0 * v, q1 * v)
    w, b = weight[rows], bias[rows]  # [Qb*v, d], [Qb*v]
    if mm_dtype is None:
        logits = torch.addmm(b.to(out_dtype), h.to(out_dtype), w.to(out_dtype).t())
    else:
        logits = torch.addmm(b.to(mm_dtype), h.to(mm_dtype), w.to(mm_dtype).t()).to(out_dtype)
    return logits.view(h.shape[0], q1 - q0, v)  # [N, Qb, v]


# ------------------------------------------------------------------ the loss


def gamma_weights(n: int, gamma: float, dtype=torch.float32, device=None, first_given: bool = False) -> torch.Tensor:
    """`[n]` the weight of window position `j`: `gamma^(j-1)`; 0 for `j = 1` when the head is given the
    window's first token (`MTPHead.read_first_token`: its own term would score a token the head reads)."""
    weights = gamma ** torch.arange(n, dtype=dtype, device=device)  # [n]
    if first_given:
        weights[0] = 0
    return weights


def window_terms(head, h: torch.Tensor, x: torch.Tensor, valid: torch.Tensor, *, fused: bool = True,
                 chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> torch.Tensor:
    """`[N, n]` conditional log-likelihoods `term[t, j]` (0 where invalid) for windows `x` [N, n]
    given hidden states `h` [N, d]; `valid` [N, n] bool."""
    v = head.num_states
    valid = valid & (x >= 0) & (x < v)
    x = torch.where(valid, x, torch.zeros_like(x))
    if h.shape[0] == 0:  # no window to score: a zero that still reaches every trainable input (for DDP)
        return valid.to(h.dtype) + 0 * head.sum_logits(h).sum()  # [0, n]
    if fused:
        leaves = chunked_leaf_log_probs(head, h, x, valid, chunk_elements)  # [N, Q]
        prefix = blocked_prefix_log_marginals(head, h, leaves, chunk_elements)  # [N, n]
    else:
        leaves = naive_leaf_log_probs(head, h, x, valid)  # [N, Q]
        prefix = _prefix(head.circ, leaves, head.sum_logits(h))  # [N, n]
    previous = torch.nn.functional.pad(prefix[:, :-1], (1, 0))  # [N, n]: log q of the prefix before j
    return torch.where(valid, prefix - previous, torch.zeros_like(prefix))


def blocked_prefix_log_marginals(head, h: torch.Tensor, leaves: torch.Tensor,
                                 chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> torch.Tensor:
    """`[N, n]` prefix marginals, a block of tokens at a time, each block's sum logits and circuit
    activations recomputed in the backward pass. For a flat-weight head the sum projection is
    sliced once outside the blocks, so each block's weight gradient is only `[S, d]`."""
    N, S = h.shape[0], head.circ.num_sum_params
    tokens_per_block = max(1, chunk_elements // max(1, S))
    if _has_flat_weight(head):
        start = head.num_input_params
        weight, bias = head.weight[start:], head.bias[start:]  # [S, d], [S]
        block_fn = partial(_flat_block_prefix, head.circ)
        per_token, extra = h, (weight, bias)  # blocks compute their sum logits from h [N, d]
    else:
        block_fn = partial(_prefix, head.circ)
        with record_function("mtpc.head_forward"):
            per_token, extra = head.sum_logits(h), ()  # [N, S]: a generic head's sum logits, computed once
    blocks = [checkpoint(block_fn, leaves[t0:t0 + tokens_per_block], per_token[t0:t0 + tokens_per_block], *extra,
                         use_reentrant=False) for t0 in range(0, N, tokens_per_block)]
    return torch.cat(blocks, 0)


def _flat_block_prefix(circ, leaves: torch.Tensor, h: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor) -> torch.Tensor:
    with record_function("mtpc.head_forward"):
        sum_logits = torch.nn.functional.linear(h, weight, bias)  # [Nb, S]
    return _prefix(circ, leaves, sum_logits)


def _prefix(circ, leaves: torch.Tensor, sum_logits: torch.Tensor) -> torch.Tensor:
    """Prefix marginals in float32 (or float64) whatever autocast is active."""
    with torch.autocast(leaves.device.type, enabled=False), record_function("mtpc.circuit"):
        return circ.prefix_log_marginals_from_leaves(leaves, at_least_float32(sum_logits))  # [N, n]


def mtp_loss(head, hidden: torch.Tensor, tokens: torch.Tensor, doc_ids: torch.Tensor, loss_mask: torch.Tensor, *,
             gamma: float = 0.9, fused: bool = True, normalizer: torch.Tensor | None = None,
             window_mask: torch.Tensor | None = None, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
             first_given: bool = False) -> LossOutput:
    """The composite loss of a batch: `hidden` [B, T, d] (draft-path hidden states), `tokens`,
    `doc_ids` [B, T] long, `loss_mask` [B, T] bool (see `mtpc.training.data`).
    `first_given`: the head's input carries each window's first token (`hidden` is then
    `head.with_first_token(h, tokens shifted by one)`), so position 1's term is left out (`gamma_weights`).

    `normalizer` ([n], optional) replaces the batch's own `N_j`: pass the counts of the whole
    (global, accumulated) batch so that micro-batches and data-parallel ranks add up exactly.
    `window_mask` ([B, T] bool, optional) scores only the windows starting where it is True."""
    n = head.num_variables
    valid = window_validity(tokens, doc_ids, loss_mask, n, head.num_states, window_mask)  # [B, T, n]
    rows = valid.any(-1).flatten()  # [B*T] positions with at least one target
    h = hidden.flatten(0, 1)[rows]  # [N, d]
    x = window_targets(tokens, n).flatten(0, 1)[rows]  # [N, n]
    valid = valid.flatten(0, 1)[rows]  # [N, n]
    counts = valid.sum(0)  # [n]
    terms = window_terms(head, h, x, valid, fused=fused, chunk_elements=chunk_elements)  # [N, n]
    sums = terms.sum(0)  # [n]
    denom = (counts if normalizer is None else normalizer).to(sums).clamp(min=1)
    loss = -(gamma_weights(n, gamma, sums.dtype, sums.device, first_given) * sums / denom).sum()
    return LossOutput(loss, sums.detach(), counts)


def window_validity(tokens: torch.Tensor, doc_ids: torch.Tensor, loss_mask: torch.Tensor, n: int, v: int,
                    window_mask: torch.Tensor | None = None) -> torch.Tensor:
    """`[B, T, n]`: target `t + j` is scored (same document, in the loss mask, a circuit state, and
    the window at `t` selected by `window_mask`)."""
    valid = target_validity(doc_ids, loss_mask, n) & (window_targets(tokens, n, fill=-1) < v)
    return valid if window_mask is None else valid & window_mask.unsqueeze(-1)


def valid_counts(doc_ids: torch.Tensor, loss_mask: torch.Tensor, tokens: torch.Tensor, n: int, v: int,
                 window_mask: torch.Tensor | None = None) -> torch.Tensor:
    """`[n]` N_j of a batch without running anything (to build a global `normalizer`)."""
    return window_validity(tokens, doc_ids, loss_mask, n, v, window_mask).flatten(0, 1).sum(0)


# ------------------------------------------------------------------ teacher-forced acceptance


@torch.no_grad()
def teacher_forced_accepted(head, h: torch.Tensor, x: torch.Tensor, first_given: bool = False) -> torch.Tensor:
    """`[N]` accepted draft length per window under greedy verification with the actual next bytes
    `x` [N, n] standing in for the verifier's greedy choices: the number of leading `j` at which the
    circuit's greedy draft (the sequential argmax of its exact conditionals) equals `x_{t+j}`. While
    the draft matches, its prefix *is* `x`, so term `j` only needs `argmax_s q(s | x_{<j}) == x_j`.
    `first_given`: as the decoder drafts, after the verifier's own `x_0 = x[:, 0]`, counted as accepted
    (1 + the leading matches from `j = 1`: the bytes a greedy cycle commits); `h` is the head's input
    (with `x_0`'s embedding when the head reads it)."""
    N, n = x.shape
    accepted = torch.full((N,), int(first_given), dtype=torch.long, device=x.device)
    alive = torch.arange(N, device=x.device)  # windows whose draft matched so far
    theta = at_least_float32(head(h))  # [N, P]
    circ = head.circ
    for j in range(int(first_given), n):
        if alive.numel() == 0:
            break
        keep = torch.zeros(alive.numel(), n, dtype=torch.bool, device=x.device)
        keep[:, :j] = True
        dist = circ.conditional_log_distribution(x[alive], keep, theta[alive], j)  # [A, v]
        hit = dist.argmax(-1) == x[alive, j]
        accepted[alive[hit]] += 1
        alive = alive[hit]
    return accepted


# ------------------------------------------------------------------ per-depth top-k acceptance


DEPTH_TOPK = (1, 2, 4, 8)  # the k of `depth_topk`: top-1, top-2, top-4, top-8


@torch.no_grad()
def teacher_forced_ranks(head, h: torch.Tensor, x: torch.Tensor, first_given: bool = False) -> torch.Tensor:
    """`[N, D]` the rank of the true token at each drafted depth of windows `x` [N, n] (the windows and
    positions `teacher_forced_accepted` scores): depth `j` runs over `first_given .. n-1` (`D = n -
    first_given`; depth 0 is `x_0` itself, drafted only by a head that does not read it), and the rank is
    the number of states strictly more probable than `x_j` under the circuit's exact conditional
    `q(s | x_0..x_{j-1}) = q(x_0..x_{j-1}, s) / q(x_0..x_{j-1})` given the *true* preceding tokens
    (teacher forcing). So `rank < k` is "x_j is among the k most probable states" (ties counted in its
    favour) and `rank == 0` is `teacher_forced_accepted`'s greedy match. A target outside the circuit's
    states (`x < 0` or `>= v`: a token outside a draft vocabulary) has rank `v`, a miss at every `k`,
    and is summed out of the later depths' conditioning rather than conditioned on. `h` is the head's
    input (with `x_0`'s embedding when it reads it); one conditional pass per depth over the `N`
    windows, so callers bound memory by passing a block of windows at a time."""
    N, n = x.shape
    v, first = head.num_states, int(first_given)
    ranks = torch.full((N, n - first), v, dtype=torch.long, device=x.device)
    if N == 0:
        return ranks
    valid = (x >= 0) & (x < v)
    x = torch.where(valid, x, torch.zeros_like(x))
    theta = at_least_float32(head(h))  # [N, P]
    for j in range(first, n):
        keep = valid.clone()
        keep[:, j:] = False  # condition on the true x_0..x_{j-1} (those that are states)
        dist = head.circ.conditional_log_distribution(x, keep, theta, j)  # [N, v]
        true = dist.gather(1, x[:, j:j + 1])  # [N, 1]
        rank = (dist > true).sum(-1)  # [N]
        hit = valid[:, j] & ~true[:, 0].isnan()  # a NaN conditional is a miss, never a match
        ranks[:, j - first] = torch.where(hit, rank, torch.full_like(rank, v))
    return ranks


def depth_topk(ranks: torch.Tensor, first_depth: int, ks: tuple[int, ...] = DEPTH_TOPK) -> dict:
    """Per-depth top-k acceptance from `teacher_forced_ranks` `[N, D]` (depths `first_depth ..`):
    `token[d][i]`, the fraction of windows whose true token at depth `d` is among the `ks[i]` most
    probable under the teacher-forced conditional; `path[d][i]`, the fraction whose true tokens at every
    depth from `first_depth` through `d` all are (what a `ks[i]`-ary draft tree of that depth could at
    most accept; summed over depths, `path[d][0]` is `teacher_forced_accepted`'s mean less
    `first_depth`, exact ties aside). Rounded to 4 decimals; `None` where there is no window."""
    N, D = ranks.shape
    k = torch.tensor(ks, dtype=torch.long, device=ranks.device)

    def fractions(r: torch.Tensor) -> list:  # [N, D] -> [D][K]
        if N == 0:
            return [[None] * len(ks) for _ in range(D)]
        hit = (r.unsqueeze(-1) < k).double().mean(0)  # [D, K]
        return [[round(float(f), 4) for f in row] for row in hit]

    path = ranks.cummax(1).values if D else ranks  # the worst rank so far along the path
    return {"k": list(ks), "depth": list(range(first_depth, first_depth + D)), "windows": N,
            "token": fractions(ranks), "path": fractions(path)}
