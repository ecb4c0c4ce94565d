"""Draft vocabularies: a head whose circuit states are K chosen token ids of a larger LM vocabulary. Decoding
stays exact (greedy identical to plain greedy; sampling follows the exact joint, and a wrong rule is
caught), the head saves and loads its vocabulary, the KL teacher is the LM renormalised over it, and
`mtpc train --draft-vocab K` chooses the LM's most frequent greedy tokens from a feature store."""

import json

import pytest
import torch

from _tiny import save_subword_llama, write_source_corpus
from circuitc import builders
from mtpc import MTPHead, SpeculativeDecoder
from circuitc.cli import main as circuitc_main
from mtpc.cli import main
from mtpc.decoding import PlainDecoder
from mtpc.sampling import Sampling
from mtpc.errors import InputError
from mtpc.heads import load_head, save_head
from test_decode import PROMPT, VOCAB, AcceptAlways, batched_samples, chi_square_pvalue, exact_joint, speculative_samples, tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread")


def vocabulary_head(lm, graph, vocabulary, seed=12, std=1.0):
    """A tied head over `vocabulary` with random adapters and sums (drafts that often disagree)."""
    torch.manual_seed(seed)
    head = MTPHead(graph, lm.config.hidden_size, init_from=lm.get_output_embeddings(), parameterisation="tied",
                   adapter_rank=2, sum_init_std=0.5, dtype=torch.float64, vocabulary=vocabulary)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, std)
    return head


def test_states_and_tokens_map_both_ways_and_a_token_outside_has_no_state():
    lm = tiny_lm(40)
    head = vocabulary_head(lm, builders.cp_graph(3, 2, 4), [7, 2, 39, 11])
    tokens = torch.tensor([[7, 2, 39, 11, 0, 38, 1000]])
    assert head.states_of(tokens).tolist() == [[0, 1, 2, 3, 4, 4, 4]]
    assert head.tokens_of(torch.tensor([3, 0, 2])).tolist() == [11, 7, 39]
    assert head.max_token_id == 39
    leaves = head.input_logits(torch.randn(2, lm.config.hidden_size, dtype=torch.float64))  # [2, Q, 4]
    assert leaves.shape[-1] == 4
    with pytest.raises(ValueError, match="distinct"):
        MTPHead(builders.cp_graph(3, 2, 4), 32, parameterisation="tied", vocabulary=[1, 1, 2, 3])
    with pytest.raises(ValueError, match="lists 3 tokens"):
        MTPHead(builders.cp_graph(3, 2, 4), 32, parameterisation="tied", vocabulary=[1, 2, 3])


def test_a_lookup_window_after_a_token_without_a_state_fills_with_the_circuits_draft():
    """A lookup proposal inside the draft vocabulary, after a committed token outside it: the window fills to
    the circuit's `n` positions (as `lookup_length` counts), drafted with `x_0` summed out, and its first
    token is the committed one."""
    lm = tiny_lm(40)
    head = vocabulary_head(lm, builders.cp_graph(4, 2, 4), [7, 2, 39, 11])
    drafter = SpeculativeDecoder(lm, head).drafter
    h = torch.randn(lm.config.hidden_size, dtype=torch.float64)
    assert drafter.lookup_length([2]) == 4
    window = drafter.lookup_window(h, 0, [2], 4, Sampling(0.0))  # token 0 has no state; 2 is state 1
    tokens = window.tokens.tolist()
    assert tokens[:2] == [0, 2] and all(t in (7, 2, 39, 11) for t in tokens[2:4])
    theta = drafter.theta(h[None], torch.tensor([3]))[0]  # the head reads the last state's embedding
    expected = drafter.program.greedy(theta, torch.tensor([4, 1]))  # x_0 unobserved (state v = 4), x_1 = state 1
    assert tokens[2:4] == head.tokens_of(expected[2:]).tolist()


def test_a_head_saves_and_loads_its_vocabulary_and_a_planted_one_is_refused(tmp_path):
    lm = tiny_lm(40)
    head = vocabulary_head(lm, builders.btree_graph(4, 2, 6), [5, 9, 1, 30, 22, 0])
    save_head(head, tmp_path / "h")
    again = load_head(tmp_path / "h").tie_to(lm.get_output_embeddings())
    assert again.vocabulary == [5, 9, 1, 30, 22, 0]
    h = torch.randn(3, lm.config.hidden_size, dtype=torch.float64)
    torch.testing.assert_close(again(h), head(h), rtol=0, atol=0)
    config = json.loads((tmp_path / "h" / "head.json").read_text())
    for bad in ([5, 5, 1, 30, 22, 0], [5, -1, 1, 30, 22, 0], ["a"] * 6):
        (tmp_path / "h" / "head.json").write_text(json.dumps({**config, "vocabulary": bad}))
        with pytest.raises(InputError, match="vocabulary"):
            load_head(tmp_path / "h")
    (tmp_path / "h" / "head.json").write_text(json.dumps({**config, "vocabulary": [5, 9, 1]}))
    with pytest.raises(InputError, match="lists 3 tokens"):
        load_head(tmp_path / "h")


def test_greedy_decoding_with_a_draft_vocabulary_is_plain_greedy():
    lm = tiny_lm(40, scale=3.0, seed=2)
    vocabulary = torch.randperm(40, generator=torch.Generator().manual_seed(1))[:12].tolist()
    head = vocabulary_head(lm, builders.btree_graph(4, 2, 12), vocabulary, std=0.3)
    decoder = SpeculativeDecoder(lm, head)
    for seed in range(3):
        prompt = torch.randint(0, 40, (1, 6), generator=torch.Generator().manual_seed(seed))
        plain = PlainDecoder(lm).generate(prompt, 24)
        out = decoder.generate(prompt, 24)
        assert out.sequences.tolist() == plain.sequences.tolist()


def test_the_kl_teacher_is_the_lm_renormalised_over_the_draft_vocabulary():
    from mtpc.training.trainer_setup import DraftModel

    lm = tiny_lm(40, scale=3.0)
    vocabulary = [3, 17, 8, 25]
    head = vocabulary_head(lm, builders.cp_graph(3, 2, 4), vocabulary)
    module = DraftModel(lm, head, gamma=0.9, chunk_elements=10_000, amp=None, loss="kl")
    tokens = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        h = module.hidden(tokens)
        teacher = module.teacher(tokens, h)(torch.arange(14))  # [14, 4]
        full = lm(tokens).logits.flatten(0, 1)[:, vocabulary]  # [14, 4]
    torch.testing.assert_close(teacher.softmax(-1), full.softmax(-1), rtol=0, atol=1e-9)


def test_sampling_with_a_draft_vocabulary_is_exact_and_a_wrong_rule_is_caught():
    """A 5-token LM, a head drafting 3 of its tokens (1 and 2 have no state: their draft probability is 0):
    3 sampled tokens follow the exact joint; keeping every drafted token fails. Measured: p = 0.84 for
    the right rule, 1e-47 for the wrong one (500 samples: fewer leave most cells pooled, and no power)."""
    lm = tiny_lm(VOCAB, scale=4.0, seed=11)
    head = vocabulary_head(lm, builders.btree_graph(3, 2, 3), [3, 0, 4])
    joint = exact_joint(lm, PROMPT, Sampling(1.0))
    right = speculative_samples(SpeculativeDecoder(lm, head), PROMPT, 500, seed=4)
    assert chi_square_pvalue(right, joint) > 1e-3
    wrong = batched_samples(SpeculativeDecoder(lm, head, acceptance=AcceptAlways()), PROMPT, 500, seed=4)
    assert chi_square_pvalue(wrong, joint) < 1e-6


@pytest.fixture(scope="module")
def subword(tmp_path_factory):
    from mtpc.training.bpe import train_bpe

    data = tmp_path_factory.mktemp("data")
    write_source_corpus(data, parts=6, length=600, overlap=200)
    tok = train_bpe([p.read_text() for p in sorted(data.iterdir())], 600)
    return save_subword_llama(tmp_path_factory.mktemp("lm"), tok, len(tok), context=128), str(data)


def test_train_chooses_the_lms_most_frequent_greedy_tokens_and_decodes_exactly(subword, tmp_path, capsys):
    from mtpc.lm import loading
    from mtpc.training.features import FeatureSet

    model, data = subword
    store = tmp_path / "features"
    assert main(["features", "--model", model, "--data", data, "--out", str(store), "--seq-len", "64",
                 "--val-sequences", "2", "--no-progress"]) == 0
    out = tmp_path / "head"
    assert main(["train", "--model", model, "--features", str(store), "--draft-vocab", "48", "--circuit",
                 "examples/btree.pc", "-D", "n=4", "-D", "r=2", "--parameterisation", "tied", "--steps", "2",
                 "--seq-len", "64", "--batch-size", "2", "--val-sequences", "2", "--loss", "nll+kl", "--out", str(out),
                 "--no-progress"]) == 0
    capsys.readouterr()
    head = load_head(out)
    counts = FeatureSet(store, "train", loading.model_info(model, allow_non_byte_vocab=True)).greedy_counts(600)
    chosen = counts[head.vocabulary].tolist()  # the most frequent first
    assert head.num_states == 48 and chosen == torch.topk(counts, 48).values.tolist()
    summary = json.loads((out / "train_config.json").read_text())["draft_vocabulary"]
    assert summary["size"] == 48 and 0 < summary["train_coverage"] <= 1 and "greedy" in summary["chosen_from"]
    assert main(["generate", "def load(", "--model", model, "--head", str(out), "--max-new-tokens", "16",
                 "--compare", "--no-stream"]) == 0
    assert "greedy outputs identical: yes" in capsys.readouterr().err


def test_a_draft_vocabulary_that_does_not_fit_is_refused_before_any_work(subword, tmp_path, capsys):
    model, data = subword
    base = ["train", "--model", model, "--data", data, "--circuit", "examples/btree.pc", "-D", "n=4", "-D", "r=2",
            "--parameterisation", "tied", "--steps", "1", "--out", str(tmp_path / "h")]
    assert main([*base, "--draft-vocab", "5000"]) == 2
    assert "more than the model's 600 tokens" in capsys.readouterr().err
    assert main([*base, "--draft-vocab", "32", "-D", "v=16"]) == 2
    assert "the circuit has 16 states" in capsys.readouterr().err
    plan = tmp_path / "btree.plan.json"  # `circuitc compile` elaborated it: its v is fixed, and checked
    assert circuitc_main(["compile", "examples/btree.pc", "-D", "n=4", "-D", "r=2", "-D", "v=32", "-o", str(plan)]) == 0
    capsys.readouterr()
    plan_base = [a for a in base if a not in ("-D", "n=4", "r=2")]
    plan_base[plan_base.index("examples/btree.pc")] = str(plan)
    assert main([*plan_base, "--draft-vocab", "48"]) == 2
    assert "the circuit has 32 states" in capsys.readouterr().err
    assert main([*plan_base, "--draft-vocab", "32", "--seq-len", "64", "--val-sequences", "2", "--no-progress"]) == 0
    assert load_head(tmp_path / "h").num_states == 32  # the plan's circuit, over the 32 chosen tokens
