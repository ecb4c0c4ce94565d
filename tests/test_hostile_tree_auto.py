"""Hostile inputs for `--tree auto` (issue 71, class 2).

`auto_tree` only chooses trees `tree_budget` accepts, whatever the recorded acceptance and the measured verify
costs (falling costs from timing noise, zero costs, acceptance near 1): the record
`benchmarks/depth_acceptance.py` writes for the shipped byte-LM head, saved as the head's `depth_topk.json`,
decodes through `mtpc generate --tree auto`. `mtpc generate` and `mtpc bench` choose the same tree from the same
table and costs, and a malformed table is one `mtpc: error:` line naming its file, before any model loads.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
import re
import shutil
import sys
from pathlib import Path

import pytest

import mtpc.decoding.choice.auto_trees
from mtpc.bench.config import BenchConfig
from mtpc.bench.run import run_bench
from mtpc.checks import MAX_TREE_NODES
from mtpc.cli.commands import main
from mtpc.decoding.drafts.trees import AUTO_TREE_WIDTHS, TreeBudget, auto_tree, tree_budget

ROOT = Path(__file__).resolve().parent.parent
MODEL = str(ROOT / "models" / "byte-lm")
HEAD = ROOT / "models" / "heads" / "ff8"  # 8 variables, 256 states: depths 1..7 recorded, k up to 8
pytestmark = pytest.mark.usefixtures("one_thread")

# verify call seconds by width that fall as the width grows, as timing noise on a tiny model gives them
FALLING = {w: 1.0 / (1 + w) for w in AUTO_TREE_WIDTHS}
RISING = {w: 1.0 + 0.05 * w for w in AUTO_TREE_WIDTHS}


@pytest.fixture
def costs(monkeypatch):
    """`costs(seconds)`: the verify costs every `--tree auto` measures from now on (generate's and bench's alike:
    both measure through `mtpc.decoding.choice.auto_trees`)."""
    def use(seconds: dict[int, float]) -> None:
        monkeypatch.setattr(mtpc.decoding.choice.auto_trees, "verify_call_seconds", lambda backbone, widths: dict(seconds))
    return use


def head_with(tmp_path: Path, record, name: str = "head") -> Path:
    """A copy of the shipped ff8 head whose `depth_topk.json` holds `record` (a dict as JSON, or raw text)."""
    folder = Path(shutil.copytree(HEAD, tmp_path / name))
    (folder / "depth_topk.json").write_text(record if isinstance(record, str) else json.dumps(record))
    return folder


def generate_auto(head: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["generate", "--model", MODEL, "--head", str(head), "--tree", "auto", "--max-new-tokens", "8",
                 "--no-stream", "--compare", "def f(x):"])
    return code, capsys.readouterr().err


def chosen(err: str) -> tuple[int, int] | None:
    """(nodes, children) from generate's `--tree auto` line; None where it decodes chains."""
    if "no tree beats plain decoding" in err:
        return None
    nodes, children = re.search(r"--tree auto: (\d+) nodes \((\d+) children", err).groups()
    return int(nodes), int(children)


# ------------------------------------------------------------------ the record depth_acceptance.py writes

def depth_acceptance_script():
    spec = importlib.util.spec_from_file_location("benchmark_depth_acceptance_tree_auto",
                                                  ROOT / "benchmarks" / "depth_acceptance.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_record_depth_acceptance_writes_decodes_through_tree_auto(tmp_path, capsys, costs):
    """The script's record, written as the head's depth_topk.json, with falling costs (every large tree costs
    one call: before the fix the 8-ary tree of depth 5, 37,449 nodes, won and the decoder refused it)."""
    corpus, store = tmp_path / "corpus", tmp_path / "store"
    corpus.mkdir()
    (corpus / "a.py").write_text((ROOT / "mtpc" / "decoding" / "drafts" / "trees.py").read_text()[:4000])
    assert main(["features", "--model", MODEL, "--data", str(corpus), "--out", str(store), "--seq-len", "32",
                 "--max-tokens", "32", "--val-sequences", "2", "--no-progress"]) == 0
    head = Path(shutil.copytree(HEAD, tmp_path / "ff8"))
    record = depth_acceptance_script().main(["--model", MODEL, "--head", str(head), "--features", str(store),
                                             "--sequences", "2", "--windows", "16",
                                             "--out", str(head / "depth_topk.json")])
    assert record["val_depth_topk"]["depth"] == list(range(1, 8)) and record["val_windows"] > 0
    for seconds in (FALLING, RISING):
        costs(seconds)
        code, err = generate_auto(head, capsys)
        assert code == 0 and "greedy outputs identical: yes" in err and "error" not in err, err
        tree = chosen(err)
        assert tree is None or 2 <= tree[0] <= MAX_TREE_NODES, err


def test_every_table_the_project_writes_decodes_through_tree_auto(tmp_path, capsys, costs):
    """`mtpc train`'s default head drafts x_0 too (its table starts at depth 0), a store too small for a window
    leaves null rates, and a depth_topk.json may hold the table alone; train_config.json's table is read where
    the folder has no depth_topk.json."""
    costs(FALLING)
    tables = {"from depth 0": {"k": [1, 2, 4, 8], "depth": [0, 1, 2, 3],
                               "path": [[0.9, 0.95, 1.0, 1.0], [0.8, 0.9, 1.0, 1.0], [0.7, 0.85, 1.0, 1.0],
                                        [0.6, 0.8, 1.0, 1.0]]},
              "no window": {"k": [1, 2, 4, 8], "depth": [1, 2], "windows": 0, "token": [[None] * 4] * 2,
                            "path": [[None] * 4] * 2}}
    for i, (name, table) in enumerate(tables.items()):
        for record in ({"val_depth_topk": table}, table):  # the script's record, or the table alone
            code, err = generate_auto(head_with(tmp_path, record, f"h{i}-{len(record)}"), capsys)
            assert code == 0 and "greedy outputs identical: yes" in err, (name, err)
            assert (chosen(err) is None) == (name == "no window"), (name, err)
    trained = Path(shutil.copytree(HEAD, tmp_path / "trained"))
    config = json.loads((trained / "train_config.json").read_text())
    (trained / "train_config.json").write_text(json.dumps({**config, "val_depth_topk": tables["from depth 0"]}))
    code, err = generate_auto(trained, capsys)
    assert code == 0 and chosen(err) is not None and chosen(err)[0] <= MAX_TREE_NODES, err


# ------------------------------------------------------------------ auto_tree within tree_budget's rules

def random_table(rng: random.Random) -> dict:
    """A well-formed table: increasing k, consecutive depths from 0 or 1, path rates that fall with depth and
    grow with k, often near 1."""
    ks = sorted(rng.sample([1, 2, 3, 4, 8, 16, 32, 64, 100, 255, 256, 1000, 1023, 1024, 4096, 65536],
                           rng.randint(1, 6)))
    first, count = rng.choice((0, 1)), rng.randint(1, 40)
    top = rng.choice((1.0, 0.9999, 0.99, 0.5, 0.0))
    rows, previous = [], [top] * len(ks)
    for _ in range(count):
        row = sorted(rng.uniform(0.9, 1.0) * p for p in previous)  # grows with k (sorted), falls with depth
        rows.append([min(r, p) for r, p in zip(row, previous)])
        previous = rows[-1]
    return {"k": ks, "depth": list(range(first, first + count)), "path": rows}


def random_costs(rng: random.Random) -> dict[int, float]:
    widths = sorted(rng.sample(AUTO_TREE_WIDTHS, rng.randint(1, len(AUTO_TREE_WIDTHS))))
    shape = rng.choice(("falling", "zero", "flat", "rising", "noisy", "huge"))
    return {w: {"falling": 1.0 / w, "zero": 0.0, "flat": 1e-3, "rising": 1e-3 * (1 + w),
                "noisy": rng.uniform(0.0, 1.0), "huge": rng.uniform(0.0, 1.7e308)}[shape] for w in widths}


def test_auto_tree_only_chooses_budgets_tree_budget_accepts():
    rng = random.Random(71)
    for _ in range(400):
        table, seconds = random_table(rng), random_costs(rng)
        n, states = rng.randint(1, 70), rng.choice((1, 2, 3, 8, 256, 2048, 65536))
        budget, tokens, cost = auto_tree(table, seconds, n, states)
        assert math.isfinite(tokens) and math.isfinite(cost) and cost >= 1.0
        if budget is not None:
            assert tree_budget(budget, n, states) == budget and 2 <= budget.nodes <= MAX_TREE_NODES, (table, seconds)
            assert budget.children() <= states and 1 <= tokens <= budget.nodes


@pytest.mark.parametrize("seconds", [FALLING, {w: 0.0 for w in AUTO_TREE_WIDTHS}, {1: 0.0}, {64: 0.0}])
def test_acceptance_near_one_with_falling_or_zero_costs_stays_within_the_limit(seconds):
    """Every large tree costs one call here: the largest within MAX_TREE_NODES is the best (before the fix:
    the 4-ary tree of depth 5, 1,365 nodes, or the 8-ary tree of depth 7, 2,396,745)."""
    for ks, n in (([4], 6), ([1, 2, 4, 8], 8)):
        table = {"k": ks, "depth": list(range(1, n)), "path": [[1.0] * len(ks)] * (n - 1)}
        budget, tokens, _ = auto_tree(table, seconds, n, 256)
        assert budget is not None and budget.nodes <= MAX_TREE_NODES
        assert tree_budget(budget, n, 256) == budget


def test_a_table_of_a_head_that_drafts_x0_is_read_from_depth_1():
    """`mtpc train`'s default head drafts `x_0` too: its table starts at depth 0, which a tree never drafts
    (the root is the verifier's token)."""
    table = {"k": [1, 2], "depth": [0, 1, 2, 3], "path": [[1.0, 1.0]] * 4}
    budget, tokens, _ = auto_tree(table, RISING, 4, 256)
    assert budget == TreeBudget(4, 1, 1) and tokens == 4.0  # the chain of depth 3: 1 + three rows, not four


# ------------------------------------------------------------------ generate and bench agree

def bench_choice(head: Path, prompts: Path) -> tuple[int, int] | None:
    report = run_bench(BenchConfig(model=MODEL, heads=[str(head)], prompts=str(prompts), num_prompts=1, repeats=1,
                                   max_new_tokens=4, warmup_tokens=2, trees=("auto",), progress=False))
    (row,) = report["heads"]
    return None if row["tree"] is None else (row["tree"], row["tree_auto"]["children"])


def test_generate_and_bench_choose_the_same_tree_for_the_same_table(tmp_path, capsys, costs):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def f(x):\n")
    table = {"k": [1, 2, 4, 8], "depth": [1, 2, 3, 4, 5, 6, 7],
             "path": [[0.9, 0.95, 0.99, 1.0], [0.8, 0.9, 0.98, 1.0], [0.7, 0.85, 0.97, 1.0], [0.6, 0.8, 0.96, 1.0],
                      [0.5, 0.75, 0.95, 1.0], [0.4, 0.7, 0.94, 1.0], [0.3, 0.65, 0.93, 1.0]]}
    head = head_with(tmp_path, {"val_depth_topk": table})
    seen = []
    for seconds in (FALLING, RISING, {w: 1e-3 * w for w in AUTO_TREE_WIDTHS}):
        costs(seconds)
        code, err = generate_auto(head, capsys)
        assert code == 0, err
        assert chosen(err) == bench_choice(head, prompts), (seconds, err)
        seen.append(chosen(err))
    assert seen[0] is not None and seen[0][0] <= MAX_TREE_NODES and len(set(seen)) > 1  # the costs matter


# ------------------------------------------------------------------ malformed tables

GOOD = {"k": [1, 2], "depth": [1, 2], "path": [[0.5, 0.6], [0.3, 0.4]]}
MALFORMED = {
    "NaN rate": {**GOOD, "path": [[float("nan"), 0.6], [0.3, 0.4]]},
    "negative rate": {**GOOD, "path": [[-0.5, 0.6], [0.3, 0.4]]},
    "rate above 1": {**GOOD, "path": [[0.5, 1e308], [0.3, 0.4]]},
    "a path that grows with depth": {**GOOD, "path": [[0.3, 0.4], [0.5, 0.6]]},
    "a path that falls with k": {**GOOD, "path": [[0.6, 0.5], [0.4, 0.3]]},
    "k not increasing": {**GOOD, "k": [2, 1]},
    "k repeated": {**GOOD, "k": [2, 2]},
    "k zero": {**GOOD, "k": [0, 2]},
    "huge k": {**GOOD, "k": [1, 10**30]},
    "depths with a gap": {**GOOD, "depth": [1, 3]},
    "depths repeated": {**GOOD, "depth": [1, 1]},
    "depths falling": {**GOOD, "depth": [2, 1]},
    "depths from 2": {**GOOD, "depth": [2, 3]},
    "negative depth": {**GOOD, "depth": [-1, 0]},
    "too many depths": {"k": [1], "depth": list(range(1, 1001)), "path": [[0.5]] * 1000},
    "too many k": {"k": list(range(1, 101)), "depth": [1], "path": [[0.5] * 100]},
    "a row per depth missing": {**GOOD, "path": [[0.5, 0.6]]},
    "a short row": {**GOOD, "path": [[0.5], [0.3]]},
    "k missing": {"depth": [1], "path": [[0.5]]},
    "path missing": {"k": [1], "depth": [1]},
    "empty table": {},
    "k a string": {**GOOD, "k": "1,2"},
    "depth of strings": {**GOOD, "depth": ["1", "2"]},
    "booleans": {**GOOD, "path": [[True, True], [0.3, 0.4]]},
    "a row that is a number": {**GOOD, "path": [0.5, 0.3]},
    "table a list": [1, 2],
}


def test_a_malformed_table_is_one_line_naming_its_file_before_the_model_loads(tmp_path, capsys, costs):
    costs(FALLING)
    records = {**{name: {"val_depth_topk": table} for name, table in MALFORMED.items()},
               "not JSON": "{'val_depth_topk': ", "a JSON list": "[1, 2]", "NaN table": '{"val_depth_topk": NaN}',
               "no table in depth_topk.json": {"val_accepted": 1.5}}
    for i, (name, record) in enumerate(records.items()):
        head = head_with(tmp_path, record, f"h{i}")
        code, err = generate_auto(head, capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("mtpc: error:"), (name, err)
        assert str(head / "depth_topk.json") in err and "internal error" not in err, (name, err)
        assert "verify call" not in err  # refused before the model loaded (no costs measured)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def f(x):\n")
    capsys.readouterr()
    assert main(["bench", "--model", MODEL, "--heads", str(head), "--prompts", str(prompts), "--tree", "auto",
                 "--no-progress"]) == 2  # mtpc bench: the same line, before its models load
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtpc: error:") and str(head / "depth_topk.json") in lines[0]


def test_auto_tree_refuses_a_malformed_table_or_cost_curve_with_a_value_error():
    for name, table in MALFORMED.items():
        with pytest.raises(ValueError, match="val_depth_topk"):
            auto_tree(table, RISING, 8, 256)
    for seconds in ({}, {0: 1.0}, {1: -1.0}, {1: float("nan")}, {1: float("inf")}, {1: 10**400}, {10**400: 1.0},
                    {"1": 1.0}, {1: True}, [1.0]):
        with pytest.raises(ValueError, match="call_seconds"):
            auto_tree(GOOD, seconds, 8, 256)
