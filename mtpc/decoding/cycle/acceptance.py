"""What a committed token must follow, and the rule that keeps speculative decoding exact.

The verifier's target is `mtpc.sampling.Sampling` (greedy, or temperature / top-k / top-p in
transformers' order); `AcceptanceRule` is speculative sampling's accept-or-residual rule, token by
token, and `BlockVerification` (the decoder's default) the rule that decides a drafted window as a
whole and keeps at least as many tokens in expectation. The decoder (`mtpc.decoding.cycle.decoder`) applies
them to every drafted token, whatever proposed it.

`accept_window` decides a batch of verified windows at once on the tensors' device (no host reads):
every position of every row is tested at once, each row's kept count found by tensor ops (a
cumulative product, or block verification's running weights), the residual formed at the first
position not kept only, and the next cycle's target, first token and hidden state gathered at each
row's accepted index. `Verdict.accepted` is what the host needs per cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from circuitc.runtime.kernels import inverse_cdf

from ...sampling import Sampling

__all__ = ["AcceptanceRule", "BlockVerification", "TreeProposals", "Verdict", "accept_tree", "accept_window",
           "cycle_uniforms", "proposal_rows"]


# --------------------------------------------------------------------------- acceptance rule

class AcceptanceRule:
    """Speculative sampling token by token (Leviathan et al. 2023; Chen et al. 2023): a token `x ~ q` is
    kept with probability `min(1, p(x) / q(x))`; after a rejection the token is drawn from the residual
    `norm(max(0, p - q))`. Together: exactly `p`. Subclass to study other rules (the tests show that
    wrong ones are caught)."""

    def accept(self, p_x, q_x, u):
        """`u ~ U[0, 1)`; True with probability `min(1, p_x / q_x)`. Elementwise on tensors `[W]` (the
        decoder tests a whole window at once)."""
        return u * q_x < p_x

    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """`[..., V]`, `[..., V]` -> `[..., V]`: the distribution of the token after a rejection (per row).
        `p` may be scaled by a weight in (0, 1] (block verification's)."""
        r = (p - q).clamp_min(0)
        total = r.sum(-1, keepdim=True)
        # total = 0 only when p = q, where nothing is ever rejected; `where` keeps it on the device
        return torch.where(total > 0, r / total.clamp_min(torch.finfo(r.dtype).tiny), p)

    def keep(self, p_x: torch.Tensor, q_x: torch.Tensor, probs: torch.Tensor, rows: torch.Tensor,
             tested: torch.Tensor, tests: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Decide a batch of windows: `p_x`, `q_x` `[B, W-1]` the target's and the proposal's
        probability of each drafted token, `probs` `[B, W, V]` the targets, `rows` `[B, W, V]` the
        proposals, `tested` `[B, W-1]` (a prefix per row), `tests` `[B, W-1]` uniforms. Returns the
        drafted tokens each row keeps `[B]` long and the weight of `p` in the residual after them `[B]`
        (None: 1, the plain residual)."""
        ok = torch.as_tensor(self.accept(p_x, q_x, tests), device=p_x.device).expand_as(tested)
        kept = (ok & tested).long().cumprod(1).sum(1)  # [B] up to the first rejection
        return kept, None


class BlockVerification(AcceptanceRule):
    """Block verification (Sun et al. 2024, "Block Verification Accelerates Speculative Decoding"): the
    window is decided as a whole, not token by token. With `w_0 = 1`, `w_i = min(1, w_{i-1} p(x_i) /
    q(x_i))` and `r_i = sum_x max(0, w_i p_{i+1}(x) - q_{i+1}(x))` (the residual mass after `i` kept
    tokens), the row keeps the longest `i` whose test `u_i < h_i` passes, with `h_i = r_i / (r_i + 1 -
    w_i)` before the last tested position `g`, `h_g = w_g` and `h_0 = 1`; the next token is drawn from
    `norm(max(0, w_i p - q))` after `i < g` kept tokens, from `p` after all `g`. Exactly `p` like the
    token-wise rule, and never fewer tokens kept in expectation (the paper proves it optimal for one
    drafted window). Every quantity is a tensor op over the window: no loop over positions."""

    def keep(self, p_x, q_x, probs, rows, tested, tests):
        # w_i = min over k <= i of prod_{k < j <= i} p/q, by window position: a cumulative sum of log ratios
        # less its running maximum (w_0 = 1 enters as log 1 = 0, so the maximum is never below 0); an
        # untested position's ratio is 1
        ratio = torch.nn.functional.pad(torch.where(tested, p_x / q_x, 1.0), (1, 0), value=1.0)  # [B, W]
        log_w = ratio.log().cumsum(1)
        w = (log_w - log_w.cummax(1).values).exp()  # [B, W] w_0 .. w_{W-1}
        # h_i = r_i / (r_i + 1 - w_i) for i = 1 .. W-2, with r_i the residual mass after i kept tokens (the
        # target then is probs[:, i], its proposal rows[:, i + 1]); 0/0 (r_i = 0, w_i = 1) passes no test
        mass = (w[:, 1:-1, None] * probs[:, 1:-1] - rows[:, 2:]).clamp_min(0).sum(-1)  # [B, W-2]
        stop = torch.cat([mass / (mass + 1 - w[:, 1:-1]), w[:, -1:]], 1)  # [B, W-1] h_1 .. h_{W-1}
        position = torch.arange(1, stop.shape[1] + 1, device=tested.device)  # [W-1]
        stop = torch.where(position == tested.sum(1, keepdim=True), w[:, 1:], stop)  # h_g = w_g at the last tested g
        kept = (((tests < stop) & tested) * position).amax(1)  # [B] the longest passing i; 0: none (h_0 = 1)
        return kept, w.gather(1, kept[:, None])[:, 0]


# --------------------------------------------------------------------------- a whole window at once

@dataclass
class Verdict:
    """A batch of verified windows, decided on the device. `accepted` `[B]` long: tokens each row
    committed (1..W); `next_first` `[B]` long: each row's next first token, drawn from (or the argmax of)
    `carried`, its next target `[B, V]` (logits when greedy, probabilities when sampling); `hidden`
    `[B, d]` the draft hidden state at each row's last committed token; `path` `[B, D + 1]` long (a tree's
    verdict; None for a chain): the window's node at each depth of the accepted path (the first
    `accepted[b]` are row `b`'s, the rest repeat its last)."""

    accepted: torch.Tensor
    carried: torch.Tensor
    next_first: torch.Tensor
    hidden: torch.Tensor
    path: torch.Tensor | None = None


def accept_window(sampling: Sampling, rule: AcceptanceRule, window: torch.Tensor, logits: torch.Tensor,
                  hidden: torch.Tensor, limit: torch.Tensor, eos: torch.Tensor, rows: torch.Tensor | None,
                  uniforms: torch.Tensor | None, widths: torch.Tensor | None = None) -> Verdict:
    """Accept a prefix of every row of `window` `[B, W]` (`window[:, 0]` already committed) against the
    verifier's `logits` `[B, W, V]` (`logits[b, j]` is the target of `window[b, j + 1]`) and `hidden`
    `[B, W, d]`. Rows are independent: each accepts its own count.

    Only `window[b, 1 .. limit[b] - 1]` are tested (`limit` `[B]` long: the row's real window length,
    capped by its budget; 1 tests nothing), and none after an EOS (`eos` `[E]` long ids). Sampling:
    `rows` `[B, W, V]` is the proposal row of every position (a point mass at lookup tokens),
    `uniforms` `[B, W]` float64 in [0, 1) are the windows' randomness (`uniforms[b, j - 1]` tests
    `window[b, j]`, `uniforms[b, widths[b] - 1]`, which no test uses, draws the next first token by
    inverse CDF; `widths` `[B]` long: each row's own verify width, None: all `W`, so a row draws as it
    would in a batch of its own). `rule.keep` says how many drafted tokens each row keeps; when it keeps
    fewer than it tested, `a` tokens in all, the next target is `rule.residual(w * p_{a-1}, rows[b, a])`
    with the rule's weight `w` (1 token by token).
    Randomness comes in as a tensor, not a generator, so the function is pure and `torch.compile`
    traces it whole (`cycle_uniforms` draws them).
    """
    B, W = window.shape
    drafted = window[:, 1:]  # [B, W-1]
    position = torch.arange(1, W, device=window.device)  # [W-1] window index of each tested token
    before_eos = torch.isin(window[:, :-1], eos).cumsum(1) == 0  # [B, W-1] no EOS at or before j - 1
    tested = (position < limit[:, None]) & before_eos  # [B, W-1] a prefix of each row
    batch = torch.arange(B, device=window.device)  # [B]
    if not sampling.greedy:
        probs = sampling.probs(logits)  # [B, W, V] float64
        rows = rows if rows.dtype == probs.dtype else rows.to(probs.dtype)
        index = drafted[..., None]  # [B, W-1, 1]
        p_x = probs[:, :-1].gather(2, index)[..., 0]  # [B, W-1]
        q_x = rows[:, 1:].gather(2, index)[..., 0]  # [B, W-1]
        kept, weight = rule.keep(p_x, q_x, probs, rows, tested, uniforms[:, :-1])  # [B], [B]
    else:
        probs = logits
        kept = ((drafted == logits[:, :-1].argmax(-1)) & tested).long().cumprod(1).sum(1)  # [B]
    accepted = 1 + kept  # [B]
    # `x[b, index[b]]` for every row with the indices on the device (reading them to the host would be a
    # device sync, and a graph break under `torch.compile`)
    carried = probs[batch, kept]  # [B, V]
    if not sampling.greedy:
        rejected = kept < tested.sum(1)  # [B] a tested token after the kept ones was not kept
        scaled = carried if weight is None else weight[:, None] * carried
        residual = rule.residual(scaled, rows[batch, accepted.clamp_max(W - 1)])
        carried = torch.where(rejected[:, None], residual, carried)
        if widths is None:
            draw = uniforms[:, -1]  # [B]
        else:
            draw = uniforms[batch, (widths - 1).clamp_max(W - 1)]  # [B] (a finished row's width may be stale)
        next_first = inverse_cdf(carried, draw)
    else:
        next_first = carried.argmax(-1)
    return Verdict(accepted, carried, next_first, hidden[batch, kept])


def proposal_rows(rows: torch.Tensor) -> torch.Tensor:
    """`[..., v]` proposal distributions with every row that is none (a NaN, an infinity or a negative entry: a
    draft head whose weights overflow) emptied to zeros. A child drawn from an empty row has probability 0 and
    is never tested, so the target draws the token as after a rejected draft: a draft the verifier rejects,
    never a wrong commit. (A chain's NaN row is rejected by its NaN tests; a tree chooses and tests by these.)"""
    usable = (rows.isfinite() & (rows >= 0)).all(-1, keepdim=True)  # [..., 1]
    return torch.where(usable, rows, 0.0)


@dataclass(frozen=True)
class TreeProposals:
    """What a sampled tree was drawn from (`mtpc.decoding.drafts.trees.choose_tree`): `rows` `[B, N, v]` float64, node
    `i`'s children drawn in node order without replacement from `rows[b, i]`, a distribution over the circuit's
    states; `row_tokens` `[v]` long the LM token of each state; `nodes` the circuit's nodes (later ones, a lookup
    branch's, are point masses); `branching` the most children a circuit node has; `depth` the deepest node
    the circuit drafts."""

    rows: torch.Tensor
    row_tokens: torch.Tensor
    nodes: int
    branching: int
    depth: int


def accept_tree(sampling: Sampling, rule: AcceptanceRule, tokens: torch.Tensor, parents: torch.Tensor,
                depths: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor, limit: torch.Tensor, eos: torch.Tensor,
                uniforms: torch.Tensor | None, max_depth: int, proposals: TreeProposals | None = None) -> Verdict:
    """Accept a path of every row's tree: `tokens` `[B, N]` (node 0, `x_0`, already committed), `parents`
    and `depths` `[B, N]` long (its `WindowShape`), the verifier's `logits` `[B, N, V]` (`logits[b, i]` the
    target after the path to node `i`) and `hidden` `[B, N, d]`; `max_depth` bounds the depths.

    A node is tested only at a depth below `limit[b]` and under no EOS. Greedy: the deepest node whose
    every node on the way is the target's argmax at its parent. Sampling (`proposals`, `uniforms`
    `[B, (max_depth + 1) * (branching + 2)]`): recursive rejection sampling down the tree (`sampled_walk`).
    Fixed shapes, no host reads."""
    B, N = tokens.shape
    batch = torch.arange(B, device=tokens.device)  # [B]
    clear = ~torch.isin(tokens, eos)  # [B, N] the path down to the node holds no EOS
    for _ in range(max_depth):
        clear = clear & clear.gather(1, parents)
    tested = (depths > 0) & (depths < limit[:, None]) & clear.gather(1, parents)  # [B, N]
    if sampling.greedy:
        match = tested & (tokens == logits.argmax(-1).gather(1, parents))  # [B, N]
        good = depths == 0
        for _ in range(max_depth):
            good = (depths == 0) | (match & good.gather(1, parents))
        final = (depths * good).argmax(1)  # [B] the deepest good node (siblings hold distinct tokens)
        carried = logits[batch, final]  # [B, V]
        next_first = carried.argmax(-1)
    else:
        final, carried, next_first = sampled_walk(sampling, rule, tokens, parents, tested, logits, uniforms,
                                                  max_depth, proposals)
    accepted = 1 + depths[batch, final]  # [B]
    # the node at each depth of the path: walk up from the final node, one step per depth
    path, node = [final], final
    for _ in range(max_depth):
        node = parents[batch, node]
        path.append(node)
    path = torch.stack(path[::-1], 1)  # [B, D + 1] right-aligned: the root repeated before the deepest
    shift = (max_depth + 1 - accepted)[:, None]  # [B, 1] left-align: depth j at column j, then the final node
    column = torch.arange(max_depth + 1, device=tokens.device)  # [D + 1]
    path = path.gather(1, (column + shift).clamp_max(max_depth))
    return Verdict(accepted, carried, next_first, hidden[batch, final], path)


def sampled_walk(sampling: Sampling, rule: AcceptanceRule, tokens: torch.Tensor, parents: torch.Tensor,
                 tested: torch.Tensor, logits: torch.Tensor, uniforms: torch.Tensor, max_depth: int,
                 proposals: TreeProposals) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Recursive rejection sampling down a sampled tree (Jeon et al. 2024; SpecInfer's multi-step speculative
    sampling), from the root: at the current node the target `p` is tested against its children one by one,
    a lookup branch's point mass first, then the circuit's in the order they were drawn. A child `x` drawn
    from `q` is kept with probability `min(1, p(x) / q(x))` (`rule.accept`); after a rejection `p` becomes
    `rule.residual(p, q)` and, for the circuit's child, `q` loses `x` (it was drawn without replacement). A kept
    child is the next node; when none is kept the next `x_0` is drawn from `p` as it stands. Each stage is
    speculative sampling of the stage's target, so every committed token follows its target exactly.
    Returns each row's final node `[B]`, the distribution its next `x_0` came from `[B, V]` and that token `[B]`."""
    B, N = tokens.shape
    batch, index = torch.arange(B, device=tokens.device), torch.arange(N, device=tokens.device)
    circuit = index < proposals.nodes  # [N] the circuit's nodes; later ones are a lookup branch's point masses
    order = torch.where(circuit, index + N, index)  # [N] testing order: point masses first
    stride = proposals.branching + 2  # uniforms per depth: the stages' tests and the final draw
    states = proposals.row_tokens.expand(B, -1)  # [B, v]
    final = torch.zeros(B, dtype=torch.long, device=tokens.device)  # [B] the current node
    going = torch.ones(B, dtype=torch.bool, device=tokens.device)
    carried = next_first = None
    for depth in range(max_depth + 1):
        p = sampling.probs(logits[batch, final])  # [B, V] float64, the target at the current node
        # [B, V] the current node's children's distribution (empty where it is none: those children are never tested)
        q = p.new_zeros(p.shape).scatter(1, states, proposal_rows(proposals.rows[batch, final].to(p.dtype)))
        untried = tested & (parents == final[:, None])  # [B, N] the current node's children
        kept = torch.full((B,), -1, dtype=torch.long, device=tokens.device)  # [B] the kept child, -1: none yet
        stages = (proposals.branching if depth < proposals.depth else 0) + int(N > proposals.nodes)
        for stage in range(stages):
            pick = torch.where(untried, order, 2 * N).argmin(1)  # [B] the next child to test
            live = going & (kept < 0) & untried.any(1)
            x = tokens[batch, pick][:, None]  # [B, 1]
            point = ~circuit[pick]  # [B]
            stage_q = torch.where(point[:, None], torch.zeros_like(p).scatter(1, x, 1.0), q)  # [B, V]
            p_x, q_x = p.gather(1, x)[:, 0], stage_q.gather(1, x)[:, 0]
            tests = (q_x > 0) & live  # a child of probability 0 was drawn past the support: never tested
            ok = torch.as_tensor(rule.accept(p_x, q_x, uniforms[:, depth * stride + stage]), device=p.device) & tests
            kept = torch.where(ok, pick, kept)
            rejected = tests & ~ok
            p = torch.where(rejected[:, None], rule.residual(p, stage_q), p)
            fewer = q.scatter(1, x, 0.0)
            fewer = fewer / fewer.sum(-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)
            q = torch.where((rejected & ~point)[:, None], fewer, q)
            untried = untried & ~(live[:, None] & (index == pick[:, None]))
        descend = going & (kept >= 0)
        stops = going & ~descend
        draw = inverse_cdf(p, uniforms[:, depth * stride + stride - 1])  # [B]
        carried = p if carried is None else torch.where(stops[:, None], p, carried)
        next_first = draw if next_first is None else torch.where(stops, draw, next_first)
        final = torch.where(descend, kept, final)
        going = descend
    return final, carried, next_first


def cycle_uniforms(rows: int, size: int, generator, device) -> torch.Tensor:
    """`[rows, size]` float64 uniforms in [0, 1): every draw of one sampling cycle (the circuit's windows
    and the acceptance's tests) comes from them, eager and compiled alike. `generator`: None (torch's
    default), one `torch.Generator` (one draw for the whole batch) or a list of one per row (each row
    draws its own: a row's text then depends only on its own generator)."""
    if isinstance(generator, (list, tuple)):
        return torch.stack([torch.rand(size, generator=g, dtype=torch.float64, device=device) for g in generator])
    return torch.rand(rows, size, generator=generator, dtype=torch.float64, device=device)
