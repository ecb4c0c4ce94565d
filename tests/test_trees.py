"""A tree of drafts per cycle is lossless: greedy output equals plain greedy decoding (each row of a batch,
with a LoRA draft path, compiled), sampled output follows the verifier's exact joint (chi-square against
enumeration, a second test of a rejected child caught); the tree's verify call gives each node the logits of its own path;
the circuit's choice is the best prefixes by its exact joint."""

import itertools
import json
import re

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mtpc import SpeculativeDecoder
from mtpc.decoding import PlainDecoder, TreeBudget
from mtpc.decoding.cycle.acceptance import AcceptanceRule
from mtpc.lm.backbone import SplitBackbone
from mtpc.lm.lora import attach_draft_lora
from mtpc.decoding.drafts.drafting import WindowShape
from mtpc.decoding.drafts.trees import auto_tree, choose_tree, tree_draws, without_replacement
from mtpc.decoding.cycle.verify import Verifier
from mtpc.sampling import Sampling
from test_batched import assert_rows_equal_plain, batch_prompts, left_padded
from test_decode import (PROMPT, batched_samples, chi_square_pvalue, cyclic_lm, exact_joint, oracle_tables, prompts,
                         random_head, sampling_setup, speculative_samples, tiny_lm)

pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- greedy

@pytest.mark.parametrize("structure", ["ff", "cp", "hmm", "btree"])
def test_greedy_tree_equals_plain_greedy(structure):
    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    heads = [random_head(structure, n, vocab, seed=1),  # a random draft: the tree's other branches matter
             random_head(structure, n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n, wrong_last=True))]
    per_budget = {}
    for head, tree in itertools.product(heads, (2, 6, TreeBudget(13, branching=3))):
        decoder = SpeculativeDecoder(model, head, tree=tree)
        for i, ids in enumerate(prompts(vocab, 3, seed=7)):
            budget = (1, 6, 17)[i]
            out = decoder.generate(ids, budget)
            assert torch.equal(out.sequences, PlainDecoder(model).generate(ids, budget).sequences), (tree, budget)
            assert out.stats.new_tokens == budget
            per_budget.setdefault(getattr(tree, "nodes", tree), []).extend(out.stats.accepted_per_cycle)
    mean = {nodes: sum(a) / len(a) for nodes, a in per_budget.items()}
    assert mean[13] > mean[2] and max(per_budget[13]) == n, mean  # a wider tree keeps more, up to whole paths


def test_greedy_tree_rows_of_a_batch_and_a_lora_draft_path_equal_plain_greedy():
    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    head = random_head("btree", n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n, wrong_last=True))
    out = assert_rows_equal_plain(model, SpeculativeDecoder(model, head, tree=9), batch_prompts(vocab, 5, seed=2), 15)
    assert out.stats.mean_accepted > 1.5
    torch.manual_seed(0)
    lora = attach_draft_lora(cyclic_lm(vocab), 1)  # the draft path's cache moves its path's slots too
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    decoder = SpeculativeDecoder(lora, head, 1, tree=9)
    assert_rows_equal_plain(model, decoder, batch_prompts(vocab, 3, seed=3), 15)


def test_eos_inside_a_tree_ends_the_row_there():
    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    head = random_head("cp", n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n))
    ids = torch.tensor([[1, 2]])
    plain = PlainDecoder(model).generate(ids, 12).sequences[0, 2:].tolist()
    eos = plain[4]
    out = SpeculativeDecoder(model, head, tree=8).generate(ids, 12, eos_token_id=eos)
    assert out.sequences[0, 2:].tolist() == plain[:plain.index(eos) + 1]


def test_prompt_lookup_matches_become_branches_of_the_tree():
    """With `lookup=K` a row's match is grafted under the root of its tree, in `K` nodes after the circuit's:
    whole matches commit `1 + K` tokens in a cycle (deeper than the circuit's `n`), a cycle without one
    verifies the circuit's nodes only, and the output stays plain greedy's."""
    vocab, n = 12, 3
    model = cyclic_lm(vocab)
    head = random_head("hmm", n, vocab, seed=1)  # a poor draft: the lookup branch carries the long cycles
    ids = torch.tensor([list(range(vocab)) * 2 + [0, 1]])  # the cyclic LM repeats what it saw
    decoder = SpeculativeDecoder(model, head, tree=5, lookup=6)
    assert decoder.layout.depth == 6 and decoder.layout.span == 5 + 6
    out = decoder.generate(ids, 40)
    assert torch.equal(out.sequences, PlainDecoder(model).generate(ids, 40).sequences)
    assert out.stats.proposer_windows.get("lookup", 0) > 3 and max(out.stats.accepted_per_cycle) == 7
    assert set(out.stats.width_per_cycle) == {11}  # a match every cycle: the branch's nodes are verified
    unmatched = decoder.generate(torch.tensor([[5, 7]]), 4)  # nothing repeats yet: no branch, N nodes verified
    assert set(unmatched.stats.width_per_cycle) - {0} == {5}  # (0: a last token committed without verifying)
    rows = [list(range(vocab)) + [0, 1], [5, 7], [3, 4, 5, 3, 4]]
    assert_rows_equal_plain(model, decoder, rows, 20)


# --------------------------------------------------------------------------- the verify call

def test_each_node_of_a_tree_gets_the_logits_of_its_own_path():
    """One tree call at the slots after a prompt gives node `i` exactly the model's logits after the prompt
    and the path to `i` (positions by depth, the mask by ancestry), for every node of a branching tree."""
    model = tiny_lm(10, seed=4)
    backbone = SplitBackbone(model)
    verifier = Verifier(backbone)
    prompt = torch.tensor([[3, 1, 4, 1, 5], [0, 0, 9, 2, 6]])
    pads = [0, 2]
    verifier.start(prompt, pads, 16)
    parents = torch.tensor([[0, 0, 0, 1, 1, 2, 3], [0, 0, 1, 1, 0, 4, 2]])
    depths = torch.tensor([[0, 1, 1, 2, 2, 2, 3], [0, 1, 2, 2, 1, 2, 3]])
    tokens = torch.tensor([[7, 2, 5, 8, 2, 0, 6], [4, 4, 1, 3, 9, 9, 5]])
    shape = WindowShape(parents, depths)
    places = verifier.places(7).for_tree(shape, 3)
    logits, _ = verifier.forward(tokens, places)
    for b, i in itertools.product(range(2), range(7)):
        path, node = [], i
        while True:
            path.append(int(tokens[b, node]))
            if node == 0:
                break
            node = int(parents[b, node])
        text = prompt[b, pads[b]:].tolist() + path[::-1]
        want = model(torch.tensor([text])).logits[0, -1]
        assert torch.allclose(logits[b, i], want, atol=1e-9), (b, i)


def test_a_chain_shape_is_a_chain():
    shape = WindowShape.chain(2, 4, device="cpu")
    assert shape.parents.tolist() == [[0, 0, 1, 2]] * 2 and shape.depths.tolist() == [[0, 1, 2, 3]] * 2
    assert torch.equal(shape.ancestors(3), torch.ones(4, 4).tril().bool().expand(2, 4, 4))


# --------------------------------------------------------------------------- the circuit's choice

@pytest.mark.parametrize("structure", ["ff", "hmm", "btree"])
def test_the_circuit_keeps_its_most_probable_prefixes(structure):
    """With every child expanded (branching = the states) the kept nodes are exactly the `N - 1` prefixes of
    highest probability under the circuit's exact joint (computed by summing the full joint over the rest)."""
    vocab, n, v = 6, 3, 4
    model = tiny_lm(vocab, seed=1)
    head = random_head(structure, n, v, seed=5, std=0.7)
    decoder = SpeculativeDecoder(model, head, tree=TreeBudget(7, branching=v))
    h = torch.randn(2, head.hidden_size, dtype=torch.float64)
    first = torch.tensor([2, 5])  # 5 is no circuit state: x_0 is summed out (the head reads the last state's row)
    window = choose_tree(decoder.drafter, decoder.layout.tree, h, first)
    for b in range(2):
        x0s = [int(first[b])] if first[b] < v else list(range(v))
        theta = decoder.drafter.theta(h[b:b + 1], torch.tensor([min(int(first[b]), v - 1)]))
        rest = torch.tensor(list(itertools.product(range(v), repeat=n - 1)))
        joint = 0
        for x0 in x0s:
            x = torch.cat([torch.full((len(rest), 1), x0), rest], 1)
            with torch.no_grad():
                joint = joint + head.circ.log_prob(x, theta.expand(len(x), -1)).exp().view(*[v] * (n - 1))
        joint = joint / joint.sum()  # q(d_1, d_2 | x_0), or with x_0 summed out
        prefixes = {(a,): float(joint[a].sum()) for a in range(v)}
        prefixes.update({(a, c): float(joint[a, c]) for a in range(v) for c in range(v)})
        best = sorted(prefixes, key=prefixes.get, reverse=True)[:6]
        tokens, parents = window.tokens[b].tolist(), window.shape.parents[b].tolist()
        chosen = set()
        for i in range(1, 7):
            path, node = [], i
            while node:
                path.append(tokens[node])
                node = parents[node]
            chosen.add(tuple(path[::-1]))
        assert tokens[0] == int(first[b]) and chosen == set(best), (chosen, best)
        assert all(parents[i] < i for i in range(1, 7))


@pytest.mark.parametrize("structure", ["hmm", "btree"])
def test_a_first_token_without_a_state_is_summed_out_of_the_draft(structure):
    """A committed token the circuit has no state for leaves `x_0` unobserved: the depth-1 proposal of a
    sampled chain and of a sampled tree's root is the circuit's `q(d_1)` with `x_0` summed out (enumerated),
    not its conditional on some state (conditioning on the last state, as before, proposes another)."""
    vocab, n, v = 6, 3, 4
    head = random_head(structure, n, v, seed=5, std=0.7)
    decoder = SpeculativeDecoder(tiny_lm(vocab, seed=1), head, tree=TreeBudget(7, branching=v))
    h = torch.randn(1, head.hidden_size, dtype=torch.float64)
    theta = decoder.drafter.theta(h, torch.tensor([v - 1]))  # the head reads the last state's embedding
    states = torch.tensor(list(itertools.product(range(v), repeat=n)))  # [v^n, n]
    with torch.no_grad():
        joint = head.circ.log_prob(states, theta.expand(len(states), -1)).exp()
    summed = torch.zeros(v, dtype=joint.dtype).index_add_(0, states[:, 1], joint)
    last = torch.zeros(v, dtype=joint.dtype).index_add_(0, states[states[:, 0] == v - 1, 1],
                                                      joint[states[:, 0] == v - 1])
    summed, last = summed / summed.sum(), last / last.sum()
    assert (summed - last).abs().max() > 1e-3  # the two proposals differ: the check below can tell them apart
    first = torch.tensor([5])
    uniforms = torch.rand(1, n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    chain = decoder.drafter.circuit_window(h, first, Sampling(1.0), uniforms)
    torch.testing.assert_close(chain.rows[0, 1, :v], summed, rtol=1e-9, atol=1e-12)
    draws = torch.rand(1, tree_draws(decoder.layout.tree, n), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    tree = choose_tree(decoder.drafter, decoder.layout.tree, h, first, Sampling(1.0), draws=draws)
    torch.testing.assert_close(tree.rows[0, 0], summed, rtol=1e-9, atol=1e-12)
    assert tree.tokens[0, 0] == 5 and chain.tokens[0, 0] == 5


# --------------------------------------------------------------------------- sampling

def test_without_replacement_draws_each_next_state_from_the_rest():
    """Ordered pairs drawn without replacement follow q(a) q(b) / (1 - q(a)) (chi-square), never a repeat."""
    q = torch.tensor([0.5, 0.25, 0.15, 0.1], dtype=torch.float64)
    u = torch.rand(4000, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    pairs = without_replacement(q.expand(4000, 4), u)
    assert (pairs[:, 0] != pairs[:, 1]).all()
    exact = {(a, b): float(q[a] * q[b] / (1 - q[a])) for a in range(4) for b in range(4) if a != b}
    counts = torch.bincount(pairs[:, 0] * 4 + pairs[:, 1], minlength=16)
    observed = torch.tensor([float(counts[a * 4 + b]) for a, b in exact])
    expected = torch.tensor(list(exact.values())) * 4000
    statistic = float(((observed - expected) ** 2 / expected).sum())
    assert statistic < 32.9  # chi-square, 11 degrees of freedom, p = 0.0005


def test_a_sampled_trees_kept_children_are_the_first_drawn():
    """Sampling: the root's children in node order are the first of its draws in order, whatever their
    probabilities (acceptance tests them in that order), and the window carries the root's distribution."""
    vocab, n, v = 12, 3, 10
    model = tiny_lm(vocab, seed=1)
    head = random_head("hmm", n, v, seed=5, std=0.7)
    budget = TreeBudget(5, branching=3)
    decoder = SpeculativeDecoder(model, head, tree=budget)
    h = torch.randn(64, head.hidden_size, dtype=torch.float64)
    first = torch.randint(0, v, (64,), generator=torch.Generator().manual_seed(1))
    draws = torch.rand(64, tree_draws(budget, n), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    window = choose_tree(decoder.drafter, decoder.layout.tree, h, first, Sampling(1.0), draws=draws)
    assert window.rows.shape == (64, 5, v) and torch.allclose(window.rows[:, 0].sum(-1), torch.ones(64).double())
    drawn = without_replacement(window.rows[:, 0], draws[:, :3])  # [64, 3] the root's draws, in order
    kinds = set()
    for b in range(64):
        children = [window.tokens[b, i].item() for i in range(5) if window.shape.parents[b, i] == 0 and i > 0]
        assert children == drawn[b, :len(children)].tolist()
        kinds.add(len(children))
    assert len(kinds) > 1  # some roots keep fewer children than others


class SecondChance(AcceptanceRule):
    """Wrong: a rejected child is tested once more (with a reused uniform) before the residual."""

    def accept(self, p_x, q_x, u):
        return (u * q_x < p_x) | ((u * 7919.0) % 1.0 * q_x < p_x)


# (3, 5, 5) waits for `pytest -m slow` (20 s on an AVX2 core): T = 1 over a tree is sampled exactly by the lookup
# branches' test below, and tests/test_hostile_trees.py, in the default run
@pytest.mark.parametrize("n, v, tree, target", [
    pytest.param(3, 5, 5, {}, marks=pytest.mark.slow),
    (3, 4, 7, {"temperature": 0.8, "top_k": 4}),  # x_0 = 4 is no circuit state
    (2, 5, 3, {"top_p": 0.9}),
])
def test_sampling_over_a_tree_is_exact_and_a_second_chance_is_caught(n, v, tree, target):
    """Recursive rejection sampling over children drawn without replacement; the control gives a rejected child
    a second test."""
    model, head = sampling_setup(n, v)
    joint = exact_joint(model, PROMPT, Sampling(**{"temperature": 1.0, **target}))
    count = 600  # measured: the right rule p = 0.11-0.52, the second chance p < 1e-10
    right = speculative_samples(SpeculativeDecoder(model, head, tree=tree), PROMPT, count, seed=1, **target)
    assert chi_square_pvalue(right, joint) > 1e-3
    wrong = batched_samples(SpeculativeDecoder(model, head, tree=tree, acceptance=SecondChance()), PROMPT,
                            count, seed=1, **target)
    assert chi_square_pvalue(wrong, joint) < 1e-6


# a branch deeper than the circuit's nodes; (3, 4) waits for `pytest -m slow` (25 s on an AVX2 core)
@pytest.mark.parametrize("tree, lookup", [(4, 2), pytest.param(3, 4, marks=pytest.mark.slow)])
def test_sampling_with_lookup_branches_is_exact_and_a_second_chance_is_caught(tree, lookup):
    model, head = sampling_setup(3, 5)
    prompt = torch.tensor([[1, 3, 2, 1, 3]])  # "1 3" was followed by 2: a lookup branch in many cycles
    joint = exact_joint(model, prompt, Sampling(1.0))
    decoder = SpeculativeDecoder(model, head, tree=tree, lookup=lookup)
    gen = torch.Generator().manual_seed(2)
    outs = [decoder.generate(prompt, 3, Sampling(1.0), generator=gen) for _ in range(600)]
    assert sum(o.stats.proposer_windows.get("lookup", 0) for o in outs) > 100  # measured: 162
    assert chi_square_pvalue([o.sequences[0, -3:].tolist() for o in outs], joint) > 1e-3
    wrong = batched_samples(SpeculativeDecoder(model, head, tree=tree, lookup=lookup,
                                               acceptance=SecondChance()), prompt, 600, seed=2)
    assert chi_square_pvalue(wrong, joint) < 1e-6


def test_a_lookup_branch_is_tested_before_the_circuits_children():
    """The circuit's child and a lookup branch's may hold the same token: the branch's point mass is tested first
    (kept with probability p), so a draw the two share follows the branch, which reaches deeper; a circuit child
    drawn past its distribution's support (probability 0) is never tested."""
    from mtpc.decoding.cycle.acceptance import TreeProposals, accept_tree

    V = 8
    tokens = torch.tensor([[2, 5, 4, 5, 6, 7]])  # the circuit's children 5, 4; the branch 5 -> 6 -> 7
    parents = torch.tensor([[0, 0, 0, 0, 3, 4]])
    depths = torch.tensor([[0, 1, 1, 1, 2, 3]])
    target = {0: 5, 1: 1, 2: 1, 3: 6, 4: 7, 5: 0}  # each node's (all but certain) next token
    logits = torch.full((1, 6, V), -30.0, dtype=torch.float64)
    for node, token in target.items():
        logits[0, node, token] = 30.0
    rows = torch.zeros(1, 6, V, dtype=torch.float64)
    rows[0, 0, 5] = rows[0, 0, 4] = 0.5  # the root's children were drawn from q(5) = q(4) = 1/2
    proposals = TreeProposals(rows, torch.arange(V), nodes=3, branching=2, depth=1)
    uniforms = torch.full((1, 4 * 4), 0.5, dtype=torch.float64)
    verdict = accept_tree(Sampling(1.0), AcceptanceRule(), tokens, parents, depths, logits, torch.zeros(1, 6, 4),
                          torch.tensor([4]), torch.tensor([-1]), uniforms, 3, proposals)
    assert verdict.accepted.tolist() == [4] and verdict.path.tolist() == [[0, 3, 4, 5]]
    assert verdict.next_first.tolist() == [0]
    # without the branch, the circuit's child 5 is kept (p(5) / q(5) > 1); with q(5) = 0 it is skipped and 4,
    # rejected (p(4) ~ 0), leaves the residual: the target's own 5
    for q5, accepted in ((0.5, 2), (0.0, 1)):
        rows[0, 0, 5], rows[0, 0, 4] = q5, 1 - q5
        verdict = accept_tree(Sampling(1.0), AcceptanceRule(), tokens[:, :3], parents[:, :3], depths[:, :3],
                              logits[:, :3], torch.zeros(1, 3, 4), torch.tensor([4]), torch.tensor([-1]), uniforms, 1,
                              TreeProposals(rows[:, :3], torch.arange(V), 3, 2, 1))
        assert verdict.accepted.tolist() == [accepted]
        assert verdict.next_first.tolist() == [1 if accepted == 2 else 5]


def test_sampled_rows_of_a_tree_batch_are_exact():
    """The odd rows of a batch of two prompts repeated (each even row a longer, different one) follow their exact
    joint."""
    model, head = sampling_setup(3, 5)
    joint = exact_joint(model, PROMPT, Sampling(1.0))
    decoder = SpeculativeDecoder(model, head, tree=6)
    ids, mask = left_padded([[2, 0, 4, 4], PROMPT[0].tolist()] * 500)  # 500 pairs in one batch: each row its own draw
    gen = torch.Generator().manual_seed(3)
    out = decoder.generate(ids, 3, Sampling(1.0), attention_mask=mask, generator=gen)
    assert chi_square_pvalue(out.sequences[1::2, -3:].tolist(), joint) > 1e-3


# --------------------------------------------------------------------------- settings

def test_trees_the_decoder_cannot_run_are_refused_in_one_line():
    model = tiny_lm(12)
    head = random_head("ff", 3, 12, seed=9)
    for kwargs, message in [
        ({"tree": 1}, r"tree must have 2 \.\. 7 nodes for a circuit of 3 variables with branching 2"),
        ({"tree": TreeBudget(20, branching=3)}, r"tree must have 2 \.\. 13 nodes for a circuit of 3 variables with "
                                                 "branching 3"),
        ({"tree": TreeBudget(4, branching=13)}, "tree branching must be an integer from 1 to the circuit's 12"),
        ({"tree": "8"}, "tree must be a node budget"),
        ({"tree": TreeBudget(10**6, branching=100)}, "tree must have at most 1,024 nodes, got 1,000,000"),
        ({"tree": 4, "window": 2}, "give one of them"),
        ({"tree": 4, "proposers": [object()]}, "tree with host proposers is not supported yet"),
    ]:
        with pytest.raises(ValueError, match=message):
            SpeculativeDecoder(model, head, **kwargs)
    model.config.model_type = "unknown-family"
    with pytest.raises(ValueError, match="a tree of drafts needs the split loop's slot caches"):
        SpeculativeDecoder(model, head, tree=4)


def test_auto_tree_picks_the_most_tokens_per_unit_of_cost():
    """Sequoia's sizing by hand: with path rates p_d(k) and call costs c(w), the full k-ary tree of depth D keeps
    1 + sum p_d(k) tokens at c(1 + k + .. + k^D) / c(1); the best ratio wins, and a machine where every
    verified position costs a whole call gets no tree at all."""
    table = {"k": [1, 2, 4], "depth": [1, 2, 3], "path": [[0.5, 0.7, 0.9], [0.3, 0.5, 0.8], [0.1, 0.3, 0.7]]}
    flat = {1: 1.0, 4: 1.0, 64: 1.0}  # verifying is free: the deepest, widest tree
    budget, tokens, cost = auto_tree(table, flat, 4, 100)
    assert budget == TreeBudget(1 + 4 + 16 + 64, 4, 16) and tokens == pytest.approx(1 + 0.9 + 0.8 + 0.7)
    assert cost == pytest.approx(1.0)
    linear = {1: 1.0, 2: 1.1, 4: 1.3, 8: 1.7, 16: 2.5, 32: 4.1, 64: 7.3, 128: 13.7}  # 0.1 a position more
    rates = {}
    for k_index, k in enumerate(table["k"]):
        tokens_k = 1.0
        for d in range(1, 4):
            tokens_k += table["path"][d - 1][k_index]
            nodes = sum(k ** j for j in range(d + 1))
            rates[(k, d)] = tokens_k / (1 + 0.1 * (nodes - 1))
    k, d = max(rates, key=rates.get)
    budget, tokens, cost = auto_tree(table, linear, 4, 100)
    assert (budget.children(), budget.nodes) == (k, sum(k ** j for j in range(d + 1)))
    assert tokens / cost == pytest.approx(rates[(k, d)])
    assert auto_tree(table, {1: 1.0, 2: 2.0, 64: 64.0}, 4, 100)[0] is None  # a position costs a call
    assert auto_tree(table, flat, 2, 100)[0] == TreeBudget(5, 4, 1)  # n = 2: one drafted depth
    # the chosen budget is one the decoder takes
    model = tiny_lm(12)
    SpeculativeDecoder(model, random_head("btree", 4, 12, seed=9), tree=auto_tree(table, linear, 4, 12)[0])


def test_generate_tree_auto_measures_the_verify_costs_and_says_what_it_chose(tmp_path, capsys):
    from mtpc import save_head
    from mtpc.cli.commands import main
    from _scripted_lm import VOCAB, oracle_head, scripted_lm
    from mtpc.lm.tokenizer import ByteTokenizer

    model = scripted_lm().float()
    model.save_pretrained(tmp_path / "lm")
    ByteTokenizer(VOCAB).save(tmp_path / "lm")
    save_head(oracle_head(model).float(), tmp_path / "head")
    argv = ["generate", "--model", str(tmp_path / "lm"), "--head", str(tmp_path / "head"), "a", "--max-new-tokens",
            "12", "--tree", "auto", "--compare"]
    assert main(argv) == 2
    assert "--tree auto: the head" in capsys.readouterr().err  # nothing recorded: one line, give --tree N
    (tmp_path / "head" / "depth_topk.json").write_text(json.dumps({"val_depth_topk": {
        "k": [1, 2], "depth": [1, 2], "path": [[0.9, 0.95], [0.8, 0.9]]}}))
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert re.search(r"mtpc: --tree auto: \d+ nodes \(\d children a node, depth \d\): [\d.]+ tokens a cycle "
                     r"expected at [\d.]+x a one-token call .*verify call ms by width, measured now: 1: ", err), err
    assert "greedy outputs identical: yes" in err
    (tmp_path / "head" / "depth_topk.json").write_text(json.dumps({"val_depth_topk": {
        "k": [1, 2], "depth": [1], "path": [[0.9, 1.5]]}}))
    assert main(argv) == 2
    assert "val_depth_topk path rows must hold a rate in [0, 1]" in capsys.readouterr().err


@pytest.mark.slow
def test_a_compiled_tree_equals_eager_and_plain():
    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    head = random_head("btree", n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n, wrong_last=True))
    compiled = SpeculativeDecoder(model, head, tree=9, compile=True)
    rows = batch_prompts(vocab, 3, seed=4)
    assert_rows_equal_plain(model, compiled, rows, 12)
    ids, mask = left_padded(rows)
    sampled = [d.generate(ids, 12, sampling=Sampling(1.0), attention_mask=mask,
                          generator=[torch.Generator().manual_seed(b) for b in range(3)]).sequences
               for d in (compiled, SpeculativeDecoder(model, head, tree=9))]
    assert torch.equal(*sampled)
