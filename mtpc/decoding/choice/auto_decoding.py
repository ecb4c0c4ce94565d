"""How to decode with a head on the machine at hand: plain decoding, a chain of some width, or a tree, whichever
commits the most tokens a second by the head's recorded per-depth acceptance and this machine's measured costs
(`costs.machine_costs`, `costs.cycle_costs`). `mtpc generate` decodes so when the user sets neither `--window`
nor `--tree`, and says what a forced `--window` or `--tree` is expected to give against plain decoding.

A cycle that verifies `w` positions commits `1 + sum_{d < w} path_d(1)` tokens on average (`path_d(1)`: how often
the circuit's greedy draft is right at every depth up to `d`, on held-out text) and costs one verify call over
`w` positions plus the cycle's other work (`overhead`: the draft, the acceptance, the host), in plain steps (the
verify curve's call over one position is one step; `costs.cycle_costs` measures the overhead so). A tree of
`auto_tree`'s choice commits what `auto_tree` expects and costs its call plus the overhead. Plain decoding commits 1 at cost 1.
The expected rate is tokens over cost; the choice is the highest, plain decoding unless a chain or tree is
expected to beat it by `MARGIN`: the table is the head's held-out acceptance on its own kind of text, and a
prompt of another kind accepts less (the README's head kept 1.36 tokens a cycle on chat where its table
expects 1.73), so a choice expected at 1.02x ran 0.75x.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...lm.loading import depth_topk_table
from ..drafts.trees import TreeBudget, auto_tree, call_cost, checked_call_seconds

__all__ = ["DecodingChoice", "choose_decoding", "chain_tokens", "expected_choice", "MARGIN"]

MARGIN = 1.15  # a chain or tree must be expected to beat plain decoding by this factor to be chosen


@dataclass(frozen=True)
class DecodingChoice:
    """`kind` "plain", "chain" (verify `window` positions) or "tree" (`tree`); the tokens a cycle it expects and
    its cost in plain steps (so `rate()` is its expected speed against plain decoding)."""

    kind: str
    window: int | None
    tree: TreeBudget | None
    tokens: float
    cost: float

    def rate(self) -> float:
        return self.tokens / self.cost

    def describe(self) -> str:
        if self.kind == "plain":
            return f"plain decoding (no chain or tree of this head is expected to beat it by {MARGIN:.2f}x here)"
        shape = (f"a chain of {self.window} (x_0 and {self.window - 1} drafted)" if self.kind == "chain" else
                 f"a tree of {self.tree.nodes} nodes ({self.tree.children()} children a node)")
        return (f"{shape}: {self.tokens:.2f} tokens a cycle expected at {self.cost:.2f} plain steps, "
                f"{self.rate():.2f}x plain")


def chain_tokens(table: dict, width: int) -> float | None:
    """Tokens a cycle verifying `width` positions commits on average: 1 + the greedy path acceptance of each
    drafted depth (`table`'s k = 1 column); None when the table has no k = 1 column or misses a depth."""
    if 1 not in table["k"]:
        return None
    column = table["k"].index(1)
    rates = {d: row[column] for d, row in zip(table["depth"], table["path"])}
    if any(rates.get(d) is None for d in range(1, width)):
        return None
    return 1.0 + sum(rates[d] for d in range(1, width))


def choose_decoding(depth_topk: dict, call_seconds: dict[int, float], overhead: float, n: int, states: int,
                    trees: bool = True) -> DecodingChoice:
    """The choice with the highest expected rate among chains of 2 .. max(n, 2) positions and (`trees`) the tree
    `auto_tree` picks, if it beats plain decoding by `MARGIN`, else plain decoding; a `ValueError` for a
    malformed table or costs (as `auto_tree`)."""
    table = depth_topk_table(depth_topk)
    seconds = checked_call_seconds(call_seconds)
    one = call_cost(seconds, 1)
    extra = max(float(overhead), 0.0)  # the cycle's work besides its verify call, in plain steps
    best = DecodingChoice("plain", None, None, 1.0, 1.0)
    bar = MARGIN  # what the best speculative choice must beat: plain by the margin, then each other
    for width in range(2, max(n, 2) + 1):
        tokens = chain_tokens(table, width)
        if tokens is not None:
            choice = DecodingChoice("chain", width, None, tokens, _cost(seconds, width, one) + extra)
            if choice.rate() > bar:
                best, bar = choice, choice.rate()
    if trees:
        budget, tokens, _ = auto_tree(table, seconds, n, states)
        if budget is not None:
            choice = DecodingChoice("tree", None, budget, tokens, _cost(seconds, budget.nodes, one) + extra)
            if choice.rate() > bar:
                best = choice
    return best


def expected_choice(depth_topk: dict, call_seconds: dict[int, float], overhead: float,
                    window: int | None = None, tree: TreeBudget | None = None) -> DecodingChoice | None:
    """What a forced `window` (chain) or `tree` is expected to give, as `choose_decoding` scores it (None: the
    table cannot score it, e.g. a tree deeper or wider than recorded)."""
    table = depth_topk_table(depth_topk)
    seconds = checked_call_seconds(call_seconds)
    one = call_cost(seconds, 1)
    extra = max(float(overhead), 0.0)  # the cycle's work besides its verify call, in plain steps
    if tree is not None:
        tokens = _tree_tokens(table, tree)
        if tokens is None:
            return None
        return DecodingChoice("tree", None, tree, tokens, _cost(seconds, tree.nodes, one) + extra)
    tokens = chain_tokens(table, window)
    if tokens is None:
        return None
    return DecodingChoice("chain", window, None, tokens, _cost(seconds, window, one) + extra)


def _cost(seconds: dict[int, float], width: int, step: float) -> float:
    """A verify call over `width` positions in plain steps, never below one step (timing noise on tiny models)."""
    return max(call_cost(seconds, width) / step, 1.0)


def _tree_tokens(table: dict, tree: TreeBudget) -> float | None:
    """A tree of `tree.nodes` nodes' expected tokens, from below: the most of any full `k`-ary tree the table
    records that fits in as many nodes (the circuit keeps the `nodes` best, which commit at least as much); None
    when none fits."""
    best = None
    for column, k in enumerate(table["k"]):
        tokens, nodes, width = 1.0, 1, 1
        for d, row in zip(table["depth"], table["path"]):
            if d == 0:
                continue
            width *= k
            nodes += width
            if nodes > tree.nodes or row[column] is None:
                break
            tokens += row[column]
            best = tokens if best is None else max(best, tokens)
    return best
