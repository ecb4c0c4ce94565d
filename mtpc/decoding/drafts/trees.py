"""A tree of drafts per cycle: its budget, and the circuit's choice of it.

A chain verifies one continuation of each drafted prefix; a tree verifies several in the same backbone call
(`N` nodes, each at position `P + depth`, attending to the prefix and its own ancestors only: see
`mtpc.lm.families.slot_mask`), and acceptance keeps the longest path the verifier agrees with
(`mtpc.decoding.cycle.acceptance.accept_tree`). Verifying more positions costs little where a call's cost is
its weights' reads (a GPU), so the tokens a cycle commits grow; on a CPU each verified node still pays
its row of the output layer (docs/results.md, "Trees of drafts on SmolLM2").

The circuit chooses the tree (`choose_tree`), depth by depth as EAGLE-2 does with its draft's confidence,
but with the circuit's exact joint: a node's score is the circuit's probability of the whole path to it,
`q(d_1 .. d_j | h, x_0)`, the product of the exact conditionals `q(d_i | d_<i)` along it
(`circuitc.runtime.draft.DraftProgram.conditionals`). At each depth the `expand` best-scored nodes are
expanded into their `branching` most probable children; of all the nodes expanded the best `nodes - 1`
by score are kept with the root. A child never scores above its parent, so the kept set holds every
kept node's ancestors. For a circuit whose conditionals follow the branch (CP, HMM, BTree) the children
of two siblings differ; a fully factorised head proposes the same children under every node.

Greedy decoding keeps each expanded node's most probable children, a function of the hidden state and
`x_0` alone, and acceptance keeps the deepest path of argmaxes. Sampling draws each expanded node's
children from the circuit's exact conditional (at the draft temperature) without replacement, in
order (`without_replacement`), and acceptance tests them in that order by recursive rejection sampling
(`mtpc.decoding.cycle.acceptance.accept_tree`), which needs every node's tested children to be the first ones
drawn, however many: so a sampled child is scored by its rank, the parent's score plus the log of the
conditional's rank-th largest probability, never by the token drawn, and siblings score strictly by
rank. The proposals travel as the circuit's conditionals over its own states (`[N, v]`, 16 KiB a node
at `v` = 2,048 in float64), never as `[N, V]` rows over the LM's vocabulary.
"""

from __future__ import annotations

import bisect
import sys
from dataclasses import dataclass

import torch

from circuitc.runtime.kernels import inverse_cdf

from ...checks import MAX_TREE_NODES
from ...lm.loading import depth_topk_table
from ...sampling import GREEDY, Sampling
from ..cycle.acceptance import proposal_rows
from .drafting import Drafter, Window, WindowShape

__all__ = ["TreeBudget", "auto_tree", "call_cost", "checked_call_seconds", "choose_tree", "tree_budget", "tree_draws", "with_branch", "without_replacement"]

# a state the circuit gives probability 0 scores this per depth (finite: the tie-break below stays exact)
IMPOSSIBLE = -1e4
# subtracted per depth: a child then scores strictly below its parent, so the best `nodes` hold their ancestors
DEPTH_TIE_BREAK = 1e-9
# subtracted per rank when sampling: siblings score strictly by rank, so the kept ones are the first drawn
# (above the float64 resolution of scores down to n * IMPOSSIBLE)
RANK_TIE_BREAK = 1e-10


@dataclass(frozen=True)
class TreeBudget:
    """A tree's size: `nodes` verified per cycle (`x_0` included), `branching` the children of each expanded
    node, `expand` the nodes expanded per depth. Default branching: about the square root of `nodes`, at
    most the circuit's states (`tree_budget` sets it); default `expand`: the branching. A full `b`-ary tree
    of depth `D`: `TreeBudget(1 + b + .. + b^D, b, b^(D-1))`."""

    nodes: int
    branching: int | None = None
    expand: int | None = None

    def children(self) -> int:  # a budget below 2 nodes (refused by `tree_budget`) has no real square root
        return self.branching if self.branching is not None else max(2, round(max(self.nodes, 0) ** 0.5))

    def expanded(self) -> int:
        return self.expand if self.expand is not None else self.children()


def tree_budget(tree: int | TreeBudget | None, n: int, states: int) -> TreeBudget | None:
    """A decoder's checked tree (`tree` an int: its node budget), or None (chains). A tree of depth `n - 1`
    with `b` children per expanded node and `e` nodes expanded per depth holds at most
    `1 + b + (n - 2) e b` candidates to keep from (fewer where a depth has fewer than `e` nodes)."""
    if tree is None:
        return None
    budget = TreeBudget(tree) if isinstance(tree, int) and not isinstance(tree, bool) else tree
    if not isinstance(budget, TreeBudget) or not isinstance(budget.nodes, int) or isinstance(budget.nodes, bool):
        raise ValueError(f"tree must be a node budget (an integer >= 2) or a TreeBudget, got {tree!r}")
    if budget.nodes > MAX_TREE_NODES:  # one verify call over the nodes, and an [N, N] mask per row
        raise ValueError(f"tree must have at most {MAX_TREE_NODES:,} nodes, got {budget.nodes:,}")
    b = budget.branching if budget.branching is not None else min(budget.children(), states)
    if not isinstance(b, int) or isinstance(b, bool) or not 1 <= b <= states:
        raise ValueError(f"tree branching must be an integer from 1 to the circuit's {states} states, got {b!r}")
    e = budget.expand if budget.expand is not None else b
    if not isinstance(e, int) or isinstance(e, bool) or not 1 <= e <= 1 << 16:
        raise ValueError(f"tree expand (nodes expanded per depth) must be an integer from 1 to 65,536, got {e!r}")
    if n < 2:
        raise ValueError("a tree needs a circuit of at least 2 variables (x_0 and one drafted token)")
    most, width = 1, 1  # the candidates, and the nodes expanded at the depth before
    for _ in range(1, n):
        most, width = most + width * b, min(e, width * b)
    if not 2 <= budget.nodes <= most:
        raise ValueError(f"tree must have 2 .. {most} nodes for a circuit of {n} variables with branching {b} and "
                         f"{e} expanded per depth, got {budget.nodes!r}")
    return TreeBudget(budget.nodes, b, e)


def choose_tree(drafter: Drafter, budget: TreeBudget, h: torch.Tensor, first: torch.Tensor,
                sampling: Sampling = GREEDY, reserve: int = 0, draws: torch.Tensor | None = None,
                temperature: float = 1.0) -> Window:
    """Every row's tree after its committed `first` `[B]` long, from the draft hidden state `h` `[B, d]`:
    tokens `[B, N + R]` (node 0 = `first`), its `WindowShape`, width `N`. Fixed shapes: the compiled
    cycle step traces it. `reserve` `R`: nodes `N .. N + R - 1` are left empty (depth 0, never tested) for
    a branch the host may graft before the cycle (`with_branch`: prompt lookup's tokens, which widens the
    row to `N + R`); a cycle in which no row has one verifies the first `N` only. `sampling` greedy: the most
    probable children, no rows; else `draws` `[B, tree_draws(budget, n)]` float64 uniforms: the children are
    drawn from the circuit's conditionals at `temperature`, and the window's `rows` `[B, N + R, v]` float64
    hold each node's (zero where it has no children)."""
    head, program = drafter.head, drafter.program
    n, b, e, N = drafter.n, budget.children(), budget.expanded(), budget.nodes
    B = h.shape[0]
    prefix = head.states_of(first).clamp_max(drafter.v)  # [B] as `circuit_window` conditions on it (v: none)
    theta = drafter.theta(h, prefix)  # [B, P]
    if program.factorised:  # every path's conditionals are the leaves: one program per row, not per path
        leaves = torch.func.vmap(program.conditionals)(theta, paths_of_root(prefix, n))  # [B, n, v]
        conditional = lambda theta, paths: leaves[:, None].expand(-1, paths.shape[1], -1, -1)  # noqa: E731
    else:
        conditional = torch.func.vmap(torch.func.vmap(program.conditionals, in_dims=(None, 0)))  # rows x paths

    paths = paths_of_root(prefix, n)[:, None]  # [B, 1, n] the root's path: x_0
    scores = torch.zeros(B, 1, dtype=torch.float64, device=h.device)  # [B, 1] log q of each path
    parents = torch.zeros(B, 1, dtype=torch.long, device=h.device)  # [B, C] each candidate's parent candidate
    states = prefix[:, None]  # [B, C] each candidate's state
    all_scores = scores.new_full((B, 1), float("inf"))  # [B, C] the root is always kept
    depths = torch.zeros(B, 1, dtype=torch.long, device=h.device)  # [B, C]
    expanded = torch.zeros(B, 1, dtype=torch.long, device=h.device)  # [B, E] candidate ids of `paths`
    drawn_from, column = [], 0  # sampling: (expanded candidate ids [B, E], their children's distribution [B, E, v])
    for depth in range(1, n):
        # [B, E, v] q(d_depth | the path), empty where the head's is no distribution (a NaN or an overflow): its
        # children then score IMPOSSIBLE, never NaN (which `topk` ranks first), and are never tested
        rows = proposal_rows(conditional(theta, paths)[:, :, depth])
        if sampling.greedy:
            top, child = rows.clamp_min(0).log().clamp_min(IMPOSSIBLE).topk(b, dim=-1)  # [B, E, b]
        else:
            q = tempered(rows, temperature)  # [B, E, v]
            E = q.shape[1]
            child = without_replacement(q, draws[:, column:column + E * b].reshape(B, E, b))  # [B, E, b]
            column += E * b
            rank = torch.arange(b, device=h.device) * RANK_TIE_BREAK
            top = q.topk(b, dim=-1).values.log().clamp_min(IMPOSSIBLE) - rank  # by rank, not by the token drawn
            drawn_from.append((expanded, q))
        child_scores = (scores[..., None] + top - DEPTH_TIE_BREAK).flatten(1)  # [B, E*b]
        child_paths = paths[:, :, None].expand(-1, -1, b, -1).clone()  # [B, E, b, n]
        child_paths[..., depth] = child
        first_id = states.shape[1]
        parents = torch.cat([parents, expanded[..., None].expand(-1, -1, b).flatten(1)], 1)
        states = torch.cat([states, child.flatten(1)], 1)
        all_scores = torch.cat([all_scores, child_scores], 1)
        depths = torch.cat([depths, depths.new_full(child_scores.shape, depth)], 1)
        # the next depth expands this depth's `e` best children
        keep = child_scores.topk(min(e, child_scores.shape[1]), dim=1).indices  # [B, E']
        paths = child_paths.flatten(1, 2).gather(1, keep[..., None].expand(-1, -1, n))
        scores = child_scores.gather(1, keep)
        expanded = first_id + keep
    chosen = all_scores.topk(N, dim=1).indices.sort(dim=1).values  # [B, N] candidate ids, parents first
    node_of = torch.zeros_like(all_scores, dtype=torch.long).scatter_(
        1, chosen, torch.arange(N, device=h.device).expand(B, N))  # [B, C] candidate -> node
    node_parents = node_of.gather(1, parents.gather(1, chosen))  # [B, N]
    tokens = head.tokens_of(states.gather(1, chosen).clamp_max(drafter.v - 1))  # [B, N] (the root's may be v)
    tokens = torch.cat([first[:, None], tokens[:, 1:]], 1)  # node 0 is x_0 itself, even off the vocabulary
    depths = depths.gather(1, chosen)
    node_rows = None
    if not sampling.greedy:  # each kept node's children's distribution: the one expanded candidate it is, or none
        node_rows = sum(torch.bmm((chosen[:, :, None] == ids[:, None, :]).to(q.dtype), q) for ids, q in drawn_from)
    if reserve:  # empty nodes N .. N + R - 1: token 0 at depth 0 under the root, never tested
        empty = torch.zeros(B, reserve, dtype=torch.long, device=h.device)
        tokens, depths, node_parents = (torch.cat([t, empty], 1) for t in (tokens, depths, node_parents))
        if node_rows is not None:
            node_rows = torch.nn.functional.pad(node_rows, (0, 0, 0, reserve))
    width = torch.full((B,), N, dtype=torch.long, device=h.device)
    return Window(tokens, node_rows, width, WindowShape(node_parents, depths))


def tempered(rows: torch.Tensor, temperature: float) -> torch.Tensor:
    """`[..., v]` the circuit's conditionals -> float64 raised to `1 / temperature` and normalised (a row
    with no mass stays zero), as `DraftProgram.sample` draws at a temperature."""
    q = rows.double().clamp_min(0)
    if temperature != 1:
        q = q.pow(1 / temperature)
    return q / q.sum(-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)


def without_replacement(q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """`[..., k]` long: `k` states drawn in order without replacement from `q` `[..., v]` with the uniforms
    `u` `[..., k]`: the first from `q`, each next one from `q` less the states drawn before it. (Past the
    support the draws repeat a state of probability 0, which the acceptance never tests.)"""
    weights, drawn = q, []
    for i in range(u.shape[-1]):
        state = inverse_cdf(weights, u[..., i])  # [...]
        drawn.append(state)
        weights = weights.scatter(-1, state[..., None], 0.0)
    return torch.stack(drawn, -1)


def tree_draws(budget: TreeBudget, n: int) -> int:
    """The uniforms `choose_tree` draws a sampled tree with: `branching` per expanded node, every depth."""
    b, e = budget.children(), budget.expanded()
    total, width = 0, 1  # width: the nodes expanded at a depth
    for _ in range(1, n):
        total, width = total + width * b, min(e, width * b)
    return total


AUTO_TREE_WIDTHS = (1, 2, 4, 8, 16, 32, 64)  # the verify widths `--tree auto` measures (its cost curve)


def auto_tree(depth_topk: dict, call_seconds: dict[int, float], n: int, states: int
              ) -> tuple[TreeBudget | None, float, float]:
    """The tree with the most tokens per unit of cycle cost, as Sequoia sizes its trees: for each recorded `k`
    and depth `D` (up to `n - 1`), the full `k`-ary tree of depth `D` (`1 + k + .. + k^D` nodes) keeps
    `1 + sum_{d <= D} path_d(k)` tokens a cycle by the head's held-out per-depth top-k acceptance
    (`depth_topk`, `mtpc train`'s `val_depth_topk`: `path_d(k)`, every depth up to `d` within the circuit's
    top `k`), and costs the verify call over that many positions (`call_seconds`: width -> seconds, measured
    on this machine; linear between and past the widths measured, never below one call), against a
    one-position call for one token. Returns (the budget, None when no tree beats plain decoding; its
    expected tokens per cycle; its cost in one-position calls).

    Only trees `tree_budget` accepts compete (`_full_trees`): `k` up to the circuit's `states`, `D` up to
    `n - 1`, at most `MAX_TREE_NODES` nodes; so costs that fall with the width (timing noise on a small
    model) or acceptance near 1 never choose a larger tree. A depth-0 row (a head that drafts `x_0` too)
    is skipped, the root being the verifier's token; its later rows, which also ask `x_0` to be within
    the top `k`, then bound the tokens from below. A table that breaks `mtpc.lm.loading.depth_topk_table`'s
    rules, costs that are not finite seconds >= 0 by widths in 1..2^31, or an `n` or `states` that is not
    an integer, are a `ValueError`."""
    table = depth_topk_table(depth_topk)
    seconds = checked_call_seconds(call_seconds)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (n, states)):
        raise ValueError(f"auto_tree needs the circuit's variables n and states as integers, got {n!r} and {states!r}")
    one = call_cost(seconds, 1)
    best, best_rate, best_tokens, best_cost = None, 1.0, 1.0, 1.0
    for k_index in range(len(table["k"])):
        for budget, tokens in _full_trees(table, k_index, n, states):
            cost = max(call_cost(seconds, budget.nodes) / one, 1.0)  # never below one call (timing noise on tiny models)
            if tokens / cost > best_rate:
                best, best_rate, best_tokens, best_cost = budget, tokens / cost, tokens, cost
    return (None if best is None else tree_budget(best, n, states)), best_tokens, best_cost


def _full_trees(table: dict, k_index: int, n: int, states: int):
    """(budget, tokens a cycle) of the full `k`-ary tree of each recorded depth `D` >= 1 (`k` the table's
    `k_index`-th) that `tree_budget` accepts: `k` <= `states`, `D` <= `n - 1` and at most `MAX_TREE_NODES`
    nodes, which bounds the expanded nodes (`k^(D-1)`) too; none past a depth with no rate (no window)."""
    k = table["k"][k_index]
    if k > states:
        return
    nodes, width, tokens = 1, 1, 1.0  # width: the nodes at depth D
    for d, row in zip(table["depth"], table["path"]):
        if d == 0:
            continue  # x_0: the verifier's token, never drafted in a tree
        if d >= n or row[k_index] is None:
            return
        width *= k
        nodes += width
        if nodes > MAX_TREE_NODES:
            return
        tokens += row[k_index]
        yield TreeBudget(nodes, k, width // k), tokens


def checked_call_seconds(call_seconds) -> dict[int, float]:
    """`call_seconds` as floats if it maps verify widths (integers in 1..2^31) to finite seconds >= 0, else a
    `ValueError`."""
    def fine(width, seconds) -> bool:
        return (isinstance(width, int) and not isinstance(width, bool) and 1 <= width <= 2**31
                and isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
                and 0 <= seconds <= sys.float_info.max)  # NaN fails; an integer past it has no float

    if not isinstance(call_seconds, dict) or not call_seconds or not all(fine(w, s) for w, s in call_seconds.items()):
        raise ValueError("call_seconds must map verify widths (integers in 1..2^31) to finite seconds >= 0 "
                         "(`mtpc.decoding.cycle.verify.verify_call_seconds`)")
    return {w: float(s) for w, s in call_seconds.items()}


def call_cost(call_seconds: dict[int, float], w: int) -> float:
    """Seconds of a verify call over `w` positions, linear between (and past) the measured widths; above 0."""
    widths = sorted(call_seconds)
    if len(widths) == 1:
        return max(call_seconds[widths[0]] * w / widths[0], 1e-9)
    i = min(max(bisect.bisect_left(widths, w), 1), len(widths) - 1)  # the segment around w (an end one outside)
    low, high = widths[i - 1], widths[i]
    slope = (call_seconds[high] - call_seconds[low]) / (high - low)
    return max(call_seconds[low] + slope * (w - low), 1e-9)


def with_branch(window: Window, row: int, branch: list[int], nodes: int) -> Window:
    """One row of a tree `window` of `nodes` drafted nodes (tokens `[S]`, its shape's `[S]` rows, width `[]`)
    with `branch` grafted as a chain under the root in its empty nodes from `nodes` on (see `choose_tree`'s
    `reserve`), its width all `S` nodes. Eager: the host's choice."""
    tokens = window.tokens[row].clone()
    rows = None if window.rows is None else window.rows[row]  # a branch's nodes have none: point masses
    parents, depths = window.shape.parents[row].clone(), window.shape.depths[row].clone()
    k = len(branch)
    tokens[nodes:nodes + k] = torch.tensor(branch, dtype=tokens.dtype, device=tokens.device)
    chain = torch.arange(k, device=tokens.device)
    parents[nodes:nodes + k] = torch.where(chain == 0, 0, nodes + chain - 1)
    depths[nodes:nodes + k] = chain + 1
    width = torch.tensor(tokens.shape[0], device=tokens.device)
    return Window(tokens, rows, width, WindowShape(parents, depths))


def paths_of_root(prefix: torch.Tensor, n: int) -> torch.Tensor:
    """`[B, n]` long: each row's path of `n` states holding only its `x_0` state (`prefix` `[B]`), zeros after."""
    return torch.nn.functional.pad(prefix[:, None], (0, n - 1))
