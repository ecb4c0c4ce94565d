"""Per-depth top-k acceptance (`teacher_forced_ranks`, `depth_topk`, `val_depth_topk`) against brute force."""

import itertools
import json
import re
from pathlib import Path

import pytest
import torch

from _tiny import save_tiny_lm, write_source_corpus
from circuitc import builders, compile as compile_circuit
from mtpc.heads.head import MTPHead
from mtpc.heads.nll_loss import DEPTH_TOPK, depth_topk, teacher_forced_accepted, teacher_forced_ranks
from mtpc.training.trainer_validation import depth_line, depth_table

ROOT = Path(__file__).resolve().parent.parent
N_VARS, STATES, D = 4, 5, 6
GRAPHS = {"btree": builders.btree_graph(N_VARS, 2, STATES), "hmm": builders.hmm_graph(N_VARS, 2, STATES),
          "ff": builders.ff_graph(N_VARS, STATES)}


def make_head(name, seed, first_given=False):
    torch.manual_seed(seed)
    head = MTPHead(compile_circuit(GRAPHS[name]), D, sum_init_std=0.8, dtype=torch.float64)
    with torch.no_grad():
        head.weight.mul_(6)  # decided conditionals: ranks spread over 0..v-1
        head.bias.normal_(0, 0.5)
    if first_given:
        head = head.read_first_token()
        with torch.no_grad():
            head.first_embedding.normal_(0, 1)
    return head


def brute_force_ranks(head, h, x, first_given):
    """Each rank from the whole joint: q(z) of all v^n assignments z (`log_prob`, no marginal program),
    the conditional at depth j the sum over the z agreeing with the true tokens before j (those that are
    states; the others summed out), grouped by z_j."""
    n, v = head.num_variables, head.num_states
    every = torch.tensor(list(itertools.product(range(v), repeat=n)))  # [v^n, n]
    out = []
    for hi, xi in zip(h, x):
        theta = head(hi).detach()
        joint = head.circ.log_prob(every, theta).exp()  # [v^n]
        row = []
        for j in range(int(first_given), n):
            if not 0 <= int(xi[j]) < v:
                row.append(v)
                continue
            agree = torch.ones(len(every), dtype=torch.bool)
            for i in range(j):
                if 0 <= int(xi[i]) < v:
                    agree &= every[:, i] == xi[i]
            cond = [float(joint[agree & (every[:, j] == s)].sum()) for s in range(v)]
            row.append(sum(c > cond[int(xi[j])] for c in cond))
        out.append(row)
    return torch.tensor(out)


def windows(head, count, seed, off_vocabulary=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, head.num_states, (count, head.num_variables), generator=g)
    if off_vocabulary:  # a token outside the states (a draft vocabulary's miss) here and there
        x[::3, 1] = head.num_states
        x[1::4, 2] = -1
    h = torch.randn(count, D, dtype=torch.float64, generator=g)
    return h, x


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("first_given", [False, True])
def test_ranks_and_fractions_equal_brute_force(name, first_given):
    head = make_head(name, seed=3, first_given=first_given)
    h, x = windows(head, 24, seed=5)
    h = head.with_first_token(h, x[:, 0])
    ranks = teacher_forced_ranks(head, h, x, first_given)
    expect = brute_force_ranks(head, h, x, first_given)
    assert ranks.tolist() == expect.tolist()
    assert len(set(expect.flatten().tolist())) > 2  # the heads are decided enough to test every k
    table = depth_topk(ranks, int(first_given))
    first = int(first_given)
    assert table["k"] == list(DEPTH_TOPK) and table["depth"] == list(range(first, N_VARS)) and table["windows"] == 24
    for d in range(N_VARS - first):
        for i, k in enumerate(DEPTH_TOPK):
            token = sum(int(r[d]) < k for r in expect.tolist()) / 24
            path = sum(all(int(r[e]) < k for e in range(d + 1)) for r in expect.tolist()) / 24
            assert table["token"][d][i] == round(token, 4) and table["path"][d][i] == round(path, 4)
    for token, path in zip(table["token"], table["path"]):  # top-8 >= top-4 >= top-2 >= top-1; path <= token
        assert token == sorted(token) and path == sorted(path) and all(p <= t for p, t in zip(path, token))
    # top-1's path, summed over depths, is the greedy teacher-forced accepted length (less a given x_0)
    accepted = teacher_forced_accepted(head, h, x, first_given).double().mean().item()
    assert sum(row[0] for row in table["path"]) == pytest.approx(accepted - first, abs=1e-3)


def test_tokens_outside_the_states_are_misses_and_summed_out():
    head = make_head("btree", seed=8)
    h, x = windows(head, 24, seed=9, off_vocabulary=True)
    ranks = teacher_forced_ranks(head, h, x)
    assert ranks.tolist() == brute_force_ranks(head, h, x, False).tolist()
    assert (ranks[::3, 1] == STATES).all() and (ranks[1::4, 2] == STATES).all()


def test_no_window_gives_an_empty_table_and_no_line():
    head = make_head("ff", seed=1)
    empty = torch.zeros(0, D, dtype=torch.float64), torch.zeros(0, N_VARS, dtype=torch.long)
    ranks = teacher_forced_ranks(head, *empty)
    table = depth_topk(ranks, 0)
    assert ranks.shape == (0, N_VARS) and table["windows"] == 0 and table["token"][0] == [None] * len(DEPTH_TOPK)
    assert depth_line({"val_depth_topk": table}) == "" and depth_line({}) == "" and depth_table({}) == ""
    assert "| 0 | - | - |" in depth_table({"val_depth_topk": table})


def test_depth_table_is_markdown():
    summary = {"val_depth_topk": {"k": [1, 2], "depth": [1, 2], "windows": 10,
                                  "token": [[0.5, 0.7], [0.25, 0.6]], "path": [[0.5, 0.7], [0.2, 0.5]]}}
    assert depth_table(summary).splitlines() == [
        "| depth | top-1 | top-2 | path top-1 | path top-2 |", "| ---: | ---: | ---: | ---: | ---: |",
        "| 1 | 0.500 | 0.700 | 0.500 | 0.700 |", "| 2 | 0.250 | 0.600 | 0.200 | 0.500 |"]
    assert depth_line(summary) == "top-1 by depth 1..2: 0.50 0.25"


def test_mtpc_train_records_the_table_and_prints_it(tmp_path, capsys):
    from mtpc.cli.commands import main

    lm = save_tiny_lm(tmp_path / "lm")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_source_corpus(corpus, parts=6)
    out = tmp_path / "head"
    assert main(["train", "--model", lm, "--circuit", str(ROOT / "examples" / "ff.pc"), "-D", "n=3", "--data", str(corpus),
                 "--out", str(out), "--steps", "1", "--seq-len", "32", "--batch-size", "2", "--val-sequences", "2",
                 "--precision", "fp32", "--no-progress", "--first-token"]) == 0
    line = capsys.readouterr().out.splitlines()[-2]  # the summary line follows it
    summary = json.loads((out / "train_config.json").read_text())
    table = summary["val_depth_topk"]
    assert table["k"] == [1, 2, 4, 8] and table["depth"] == [1, 2] and table["windows"] == summary["val_windows"] > 0
    assert all(len(row) == 4 and row == sorted(row) for row in table["token"] + table["path"])
    assert all(p <= t for pr, tr in zip(table["path"], table["token"]) for p, t in zip(pr, tr))
    assert sum(row[0] for row in table["path"]) == pytest.approx(summary["val_accepted"] - 1, abs=1e-3)
    assert re.fullmatch(r"held-out acceptance, top-1 by depth 1\.\.2: \d\.\d\d \d\.\d\d; top-8: \d\.\d\d \d\.\d\d", line), line
    log = [json.loads(r) for r in (out / "train_log.jsonl").read_text().splitlines()]
    assert all("val_depth_topk" in r for r in log if "val_loss" in r)
