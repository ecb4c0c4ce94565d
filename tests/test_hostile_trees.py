"""Trees are lossless on any head: a draft head whose weights overflow (inf, NaN, finite x1e30 in float32, a
float16 head past its range) or a draft path with a NaN LoRA adapter drafts trees the verifier rejects, never
a wrong commit and never a crash. Greedy rows of a batch equal plain greedy, with and without lookup branches;
sampled rows follow the verifier's exact joint (chi-square against enumeration over a batch of one prompt
repeated, each row its own sample, with a wrong acceptance rule caught as the control); `accept_tree` tests
no child of a proposal that is no distribution."""

import functools
import json

import pytest
import torch

from mtpc import SpeculativeDecoder
from mtpc.decoding import PlainDecoder, TreeBudget
from mtpc.decoding.cycle.acceptance import AcceptanceRule, TreeProposals, accept_tree
from mtpc.decoding.drafts.proposals import PromptLookup
from mtpc.heads import load_head
from mtpc.sampling import Sampling
from test_batched import PAD, left_padded
from test_decode import PROMPT, chi_square_pvalue, cyclic_lm, exact_joint, random_head, sampling_setup
from test_trees import SecondChance
from _tiny import random_lora

pytestmark = pytest.mark.usefixtures("one_thread")


def corrupted(kind: str, head, model, tmp_path):
    """(the decoder's model, its head, its LoRA layers) with `kind` of damage: the head's weights NaN or inf in
    part, all of them x1e30 in float32, a float16 head (head.json's compute_dtype) whose weights overflow it,
    or a clean head over a draft path whose LoRA adapter is NaN."""
    with torch.no_grad():
        if kind in ("nan", "inf"):
            head.weight.view(-1)[::7] = float(kind)
        elif kind == "overflow":
            head = head.float()
            head.weight.mul_(1e30)
        elif kind == "float16":
            head = head.float()
            head.weight.mul_(1e5)  # finite in float32, past float16's 65,504
            head.save_pretrained(tmp_path / "head")
            config = json.loads((tmp_path / "head" / "head.json").read_text())
            (tmp_path / "head" / "head.json").write_text(json.dumps({**config, "compute_dtype": "float16"}))
            head = load_head(tmp_path / "head")
            assert head.dtype == torch.float16
        elif kind == "nan-lora":
            model = random_lora(model, 1)
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.fill_(float("nan"))
            return model, head, 1
    return model, head, 0


def corrupt_last_variable(head, value: float):
    """The head's parameters of its last variable's leaves set to `value`: its deepest conditionals are
    non-finite, the ones before stay the head's own."""
    last = head.num_variables - 1
    slots = [s for s in head.circ.param_layout if s.kind == "input" and s.variable == last]
    with torch.no_grad():
        for slot in slots:
            head.bias[slot.offset:slot.offset + torch.Size(slot.shape).numel()] = value
    return head


# --------------------------------------------------------------------------- greedy

VOCAB = 12
ROWS = [list(range(VOCAB)) + [0, 1], [5, 7], [3, 4, 5, 3, 4]]  # the first and last repeat: lookup branches


@functools.cache
def plain_batch(budget: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rows left-padded (ids, mask) and what a batch of them decodes to: each row's plain greedy alone."""
    model, (ids, mask) = cyclic_lm(VOCAB), left_padded(ROWS)
    alone = [PlainDecoder(model).generate(torch.tensor([row]), budget).sequences[0, len(row):] for row in ROWS]
    return ids, mask, torch.cat([ids, torch.stack(alone)], 1)


# ff: one conditional per variable for every path (factorised); btree: each path's own
@pytest.mark.parametrize("kind, structure", [("nan", "ff"), ("nan", "btree"), ("inf", "btree"), ("overflow", "btree"),
                                             ("float16", "ff"), ("nan-lora", "btree")])
def test_greedy_trees_of_a_corrupted_head_equal_plain_greedy(kind, structure, tmp_path):
    n = 4
    model, head, lora_layers = corrupted(kind, random_head(structure, n, VOCAB, seed=3), cyclic_lm(VOCAB), tmp_path)
    ids, mask, plain = plain_batch(12)
    # 2 nodes: shallower than the circuit's 4 variables (a NaN node of depth 3 once ended in an index error)
    for tree, lookup in ((2, None), (6, None), (TreeBudget(9, branching=3), 4)):
        decoder = SpeculativeDecoder(model, head, lora_layers, tree=tree, lookup=lookup)
        out = decoder.generate(ids, 12, attention_mask=mask, pad_token_id=PAD)
        assert torch.equal(out.sequences, plain), (tree, lookup)
        if lookup:
            assert out.stats.proposer_windows.get("lookup", 0) > 0


# --------------------------------------------------------------------------- sampling

def batch_samples(decoder, prompt, rows: int, seed: int):
    """`rows` samples of 3 tokens after `prompt` (one batch of the prompt repeated, each row its own draw), and
    the run's stats."""
    out = decoder.generate(prompt.expand(rows, -1), 3, Sampling(1.0), generator=torch.Generator().manual_seed(seed))
    return out.sequences[:, -3:].tolist(), out.stats


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_sampled_tree_of_a_partly_corrupted_head_is_exact_and_keeps_its_good_drafts(value):
    """The last variable's conditionals are non-finite: its nodes are drafts the verifier never tests, while
    the first drafted depth is tested as ever (tokens kept, a second chance caught)."""
    model, head = sampling_setup(3, 5)
    corrupt_last_variable(head, value)
    joint = exact_joint(model, PROMPT, Sampling(1.0))
    samples, stats = batch_samples(SpeculativeDecoder(model, head, tree=5), PROMPT, 600, seed=1)
    assert chi_square_pvalue(samples, joint) > 1e-3
    assert stats.mean_accepted > 1.2  # the first drafted depth is kept often (measured: ~1.4)
    wrong, _ = batch_samples(SpeculativeDecoder(model, head, tree=5, acceptance=SecondChance()), PROMPT, 600, seed=1)
    assert chi_square_pvalue(wrong, joint) < 1e-6  # measured: ~5e-10


@pytest.mark.parametrize("kind", ["nan", "overflow", "float16", "nan-lora"])  # inf: the test above
def test_sampled_trees_with_lookup_branches_are_exact_on_a_corrupted_head(kind, tmp_path):
    """The circuit's nodes are never tested; the lookup branches are. The control, a second chance on them, is
    caught (run on the NaN head only: every head whose circuit nodes are never tested draws the same samples)."""
    model, head = sampling_setup(3, 5)
    model, head, lora_layers = corrupted(kind, head, model, tmp_path)
    prompt = torch.tensor([[0, 1, 2, 3, 4, 0, 2, 4, 1, 3]])  # every token was followed by one: a branch every cycle
    joint = exact_joint(sampling_setup(3, 5)[0], prompt, Sampling(1.0))
    lookup = PromptLookup(tokens=2, min_ngram=1)
    samples, stats = batch_samples(SpeculativeDecoder(model, head, lora_layers, tree=4, lookup=lookup), prompt, 600, 2)
    assert chi_square_pvalue(samples, joint) > 1e-3
    assert stats.proposer_windows.get("lookup", 0) > 600
    if kind == "nan":
        wrong = SpeculativeDecoder(model, head, lora_layers, tree=4, lookup=lookup, acceptance=SecondChance())
        assert chi_square_pvalue(batch_samples(wrong, prompt, 600, 2)[0], joint) < 1e-6  # measured: ~5e-10


# --------------------------------------------------------------------------- the acceptance

@pytest.mark.parametrize("damage", [float("nan"), float("inf"), -0.5])
def test_accept_tree_tests_no_child_of_a_proposal_that_is_no_distribution(damage):
    """The root's children 1 and 2 were drawn from a row with one entry non-finite (or negative): their
    proposal probability is unknown, so neither is tested, and the next token comes from the target as it
    stands; with the damaged entry zero the target's own child (1) is kept."""
    V = 6
    tokens, parents, depths = torch.tensor([[0, 1, 2]]), torch.tensor([[0, 0, 0]]), torch.tensor([[0, 1, 1]])
    logits = torch.full((1, 3, V), -30.0, dtype=torch.float64)
    logits[0, :, 1] = 30.0  # the target is all but certain of token 1 at every node
    uniforms = torch.full((1, 2 * 4), 0.5, dtype=torch.float64)
    for entry, accepted in ((damage, 1), (0.0, 2)):
        rows = torch.zeros(1, 3, V, dtype=torch.float64)
        rows[0, 0, 1], rows[0, 0, 2], rows[0, 0, 4] = 0.5, 0.5, entry
        verdict = accept_tree(Sampling(1.0), AcceptanceRule(), tokens, parents, depths, logits, torch.zeros(1, 3, 4),
                              torch.tensor([4]), torch.tensor([-1]), uniforms, 1,
                              TreeProposals(rows, torch.arange(V), nodes=3, branching=2, depth=1))
        assert verdict.accepted.tolist() == [accepted], entry
        assert verdict.next_first.tolist() == [1]
