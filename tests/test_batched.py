"""Batched speculative decoding is exact per row: greedy rows equal plain greedy decoding of each prompt
alone (left-padded prompts of different lengths, with and without EOS, float64), sampled rows follow
each row's exact joint (chi-square against enumeration, a wrong rule as control) and are independent;
bad batches get one clear error."""

import pytest
import torch
from scipy.stats import chisquare

from mtpc import SpeculativeDecoder
from mtpc.sampling import Sampling
from mtpc.decoding import PlainDecoder
from mtpc.decoding.cycle.decoder import AdaptiveWidth
from mtpc.lm.families import LlamaFamily
from mtpc.decoding.drafts.proposals import PromptLookup
from test_decode import (BlockResidualIsTarget, chi_square_pvalue, cyclic_lm, exact_joint, oracle_tables, random_head,
                         sampling_setup, tiny_lm)
from _tiny import family_lm, random_lora

pytestmark = pytest.mark.usefixtures("one_thread")

PAD = 0


def left_padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """`[B, T]` ids and their attention mask, the rows padded on the left to the longest."""
    T = max(len(r) for r in rows)
    ids = torch.tensor([[PAD] * (T - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (T - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def batch_prompts(vocab: int, count: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (int(torch.randint(1, 8, (), generator=gen)),), generator=gen).tolist()
            for _ in range(count)]


def assert_rows_equal_plain(model, decoder, rows, budget, eos=None):
    """Every row of the batch equals plain greedy decoding of its prompt alone; after its end, padding."""
    ids, mask = left_padded(rows)
    out = decoder.generate(ids, budget, attention_mask=mask, eos_token_id=eos, pad_token_id=PAD)
    T = ids.shape[1]
    assert torch.equal(out.sequences[:, :T], ids)  # the prompt columns as given
    longest = 0
    for b, row in enumerate(rows):
        alone = PlainDecoder(model).generate(torch.tensor([row]), budget, eos_token_id=eos).sequences[0, len(row):]
        longest = max(longest, len(alone))
        got = out.sequences[b, T:].tolist()
        assert got[:len(alone)] == alone.tolist(), (b, row)
        assert got[len(alone):] == [PAD] * (len(got) - len(alone))
    assert out.sequences.shape == (len(rows), T + longest)
    return out


# --------------------------------------------------------------------------- greedy: each row is plain greedy

@pytest.mark.parametrize("structure", ["ff", "btree"])
@pytest.mark.parametrize("window", [None, 2, AdaptiveWidth(position_cost=0.3)])
def test_greedy_rows_equal_plain_greedy_of_each_prompt(structure, window):
    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    head = random_head(structure, n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n, wrong_last=True))
    decoder = SpeculativeDecoder(model, head, window=window)
    for seed in range(2):
        out = assert_rows_equal_plain(model, decoder, batch_prompts(vocab, 5, seed), 15)
        assert max(out.stats.accepted_per_cycle) > 5  # rows accept drafted tokens, together
        assert out.stats.mean_accepted > 1.5


def test_greedy_rows_stop_at_their_own_eos_and_the_batch_stops_with_the_last():
    vocab, n = 12, 3
    model = cyclic_lm(vocab)
    head = random_head("btree", n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n))
    decoder = SpeculativeDecoder(model, head)
    rows = [[1, 2], [5], [9, 10, 11, 3], [7, 8, 9]]
    for eos in (6, 0, [4, 11]):  # rows end at different cycles (or never)
        assert_rows_equal_plain(model, decoder, rows, 13, eos=eos)
    ended = assert_rows_equal_plain(model, decoder, [[4], [5]], 13, eos=[6, 7])  # each ends on its next tokens
    assert ended.sequences.shape[1] < 1 + 13


def test_greedy_rows_with_lookup_and_a_lora_draft_path():
    vocab, n = 12, 4
    model = random_lora(cyclic_lm(vocab), 1)
    head = random_head("btree", n, vocab, seed=3, std=0.3, init_from=oracle_tables(model.get_base_model(), n))
    lookup = PromptLookup(tokens=5, min_ngram=1, max_ngram=2, prefer="lookup")
    decoder = SpeculativeDecoder(model, head, lora_layers=1, lookup=lookup)
    rows = [[1, 3, 1, 3, 1], [2, 4], [5, 6, 7, 5, 6, 7, 5]]
    base = model.get_base_model()
    with model.disable_adapter():
        out = assert_rows_equal_plain(base, decoder, rows, 14)
    assert out.stats.lookup_cycles > 0


@pytest.mark.parametrize("model_type", ["mistral", "gpt2"])  # a sliding window; a learned position table
def test_greedy_rows_equal_plain_greedy_in_other_families(model_type):
    vocab, n = 16, 3
    model = family_lm(model_type, vocab, seed=1, layers=2)
    head = random_head("btree", n, vocab, seed=4, std=0.3)
    decoder = SpeculativeDecoder(model, head)
    assert_rows_equal_plain(model, decoder, batch_prompts(vocab, 3, seed=2) + [[1, 2, 3, 4, 5, 6, 7, 8, 9]], 9)


def test_one_host_read_per_cycle_for_the_whole_batch():
    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    head = random_head("ff", n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n, wrong_last=True))
    decoder = SpeculativeDecoder(model, head)
    ids, mask = left_padded(batch_prompts(vocab, 4, seed=7))
    before = decoder.host_reads.count
    out = decoder.generate(ids, 17, attention_mask=mask, sampling=Sampling(1.0), generator=torch.Generator().manual_seed(0))
    verified = sum(w > 0 for w in out.stats.width_per_cycle)
    assert decoder.host_reads.count - before == 1 + verified
    assert out.stats.new_tokens == 4 * 17 and out.stats.rows_per_cycle[0] == 4


def test_streaming_follows_row_0():
    class Recorder:
        def __init__(self):
            self.puts, self.ended = [], 0

        def put(self, value):
            self.puts.append(value.tolist())

        def end(self):
            self.ended += 1

    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    head = random_head("ff", n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n))
    ids, mask = left_padded([[1, 2], [3, 4, 5, 6]])
    recorder = Recorder()
    out = SpeculativeDecoder(model, head).generate(ids, 9, attention_mask=mask, streamer=recorder)
    assert recorder.puts[0] == [[1, 2]] and recorder.ended == 1  # row 0's prompt without its padding
    assert sum((p[0] for p in recorder.puts[1:]), []) == out.sequences[0, ids.shape[1]:].tolist()


def test_a_padded_batch_through_transformers_custom_generate():
    model = tiny_lm(12, scale=3.0)
    head = random_head("btree", 4, 12, seed=8, init_from=model.lm_head.weight)
    decoder = SpeculativeDecoder(model, head)
    ids, mask = left_padded([[2, 7, 1], [3, 4, 5, 6], [9]])
    kwargs = {"attention_mask": mask, "pad_token_id": PAD, "max_new_tokens": 7, "do_sample": False}
    ours = model.generate(ids, custom_generate=decoder.custom_generate, **kwargs)
    assert torch.equal(ours, model.generate(ids, **kwargs))


# --------------------------------------------------------------------------- sampling: exact per row, independent

ROWS = [[1, 3], [4, 0, 2]]  # two prompts of different lengths


def batched_samples(decoder, count, seed, steps=3, generators=None, **target):
    """`count` batched generations of `ROWS`: per row, the `steps` sampled tokens."""
    ids, mask = left_padded(ROWS)
    gen = torch.Generator().manual_seed(seed)
    out = [[], []]
    for _ in range(count):
        seqs = decoder.generate(ids, steps, Sampling(**{"temperature": 1.0, **target}), attention_mask=mask,
                                generator=generators or gen).sequences
        for b in range(2):
            out[b].append(seqs[b, -steps:].tolist())
    return out


def test_sampled_rows_are_exact_and_a_wrong_residual_is_caught():
    model, head = sampling_setup(3, 5)
    joints = [exact_joint(model, torch.tensor([row]), Sampling(1.0)) for row in ROWS]
    right = batched_samples(SpeculativeDecoder(model, head), 600, seed=1)
    wrong = batched_samples(SpeculativeDecoder(model, head, acceptance=BlockResidualIsTarget()), 600, seed=1)
    for b in range(2):
        assert chi_square_pvalue(right[b], joints[b]) > 1e-3, b
        assert chi_square_pvalue(wrong[b], joints[b]) < 1e-6, b


def test_sampled_rows_with_adaptive_widths_and_top_p_are_exact():
    model, head = sampling_setup(3, 5)
    target = {"temperature": 0.9, "top_p": 0.9}
    joints = [exact_joint(model, torch.tensor([row]), Sampling(**target)) for row in ROWS]
    decoder = SpeculativeDecoder(model, head, window=AdaptiveWidth(position_cost=0.5, widths=(2, 3)))
    samples = batched_samples(decoder, 600, seed=3, **target)
    for b in range(2):
        assert chi_square_pvalue(samples[b], joints[b]) > 1e-3, b


def test_a_row_with_its_own_generator_gives_the_text_it_gives_alone():
    """With one generator per row, a row's draws are its own: its text is the one it samples alone
    with the same seed, whatever the other rows do (lookup windows and EOS included)."""
    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    head = random_head("btree", n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n, wrong_last=True))
    decoder = SpeculativeDecoder(model, head, lookup=PromptLookup(tokens=3, min_ngram=1, max_ngram=2))
    rows = [[1, 2, 1, 2], [5], [7, 8, 9]]
    ids, mask = left_padded(rows)
    batch = decoder.generate(ids, 16, sampling=Sampling(1.0), attention_mask=mask, eos_token_id=3, pad_token_id=PAD,
                             generator=[torch.Generator().manual_seed(10 + b) for b in range(3)]).sequences
    for b, row in enumerate(rows):
        alone = decoder.generate(torch.tensor([row]), 16, sampling=Sampling(1.0), eos_token_id=3,
                                 generator=torch.Generator().manual_seed(10 + b)).sequences[0, len(row):].tolist()
        got = batch[b, ids.shape[1]:].tolist()
        assert got[:len(alone)] == alone and set(got[len(alone):]) <= {PAD}, b


def test_rows_of_one_batch_are_independent():
    """Two rows of the same prompt: the pairs of their first sampled tokens follow the product of the
    exact marginals. Control: rows given generators of the same seed draw the same tokens."""
    model, head = sampling_setup(3, 5)
    prompt = torch.tensor([[1, 3], [1, 3]])
    marginal = exact_joint(model, prompt[:1], Sampling(1.0), steps=1)  # [V]
    product = (marginal[:, None] * marginal[None, :]).flatten()  # [V * V]
    decoder = SpeculativeDecoder(model, head)

    def pair_pvalue(generator_for):
        counts = torch.zeros(product.numel(), dtype=torch.float64)
        for i in range(800):
            seqs = decoder.generate(prompt, 1, sampling=Sampling(1.0), generator=generator_for(i)).sequences
            counts[int(seqs[0, -1]) * marginal.numel() + int(seqs[1, -1])] += 1
        expected = product * counts.sum()
        keep = expected >= 5
        observed, wanted = counts[keep], expected[keep]
        if not keep.all():  # pool the rare cells so the chi-square approximation holds
            observed = torch.cat([observed, counts[~keep].sum()[None]])
            wanted = torch.cat([wanted, expected[~keep].sum()[None]])
        return chisquare(observed.numpy(), wanted.numpy()).pvalue

    shared = torch.Generator().manual_seed(5)
    assert pair_pvalue(lambda i: shared) > 1e-3
    assert pair_pvalue(lambda i: [torch.Generator().manual_seed(i) for _ in range(2)]) < 1e-6


# --------------------------------------------------------------------------- bad batches

def test_bad_batches_get_one_clear_error():
    model = tiny_lm(12)
    head = random_head("cp", 3, 12, seed=9)
    decoder = SpeculativeDecoder(model, head)
    ids = torch.tensor([[0, 1, 2], [3, 4, 5]])
    for mask, message in [([[1, 0, 1], [1, 1, 1]], "row 0 is not left padding"),
                          ([[1, 1, 0], [1, 1, 1]], "row 0 is not left padding"),
                          ([[1, 1, 1], [0, 0, 0]], "row 1 is not left padding"),
                          ([[1, 1, 1], [2, 1, 1]], "only 0 .padding. and 1"),
                          ([[1.0, 1, 1], [1, 1, 1]], "only 0 .padding. and 1"),
                          ([[1, 1, 1]], "the shape of input_ids")]:
        with pytest.raises(ValueError, match=message):
            decoder.generate(ids, 4, attention_mask=torch.tensor(mask))
    long = torch.ones(2, 130, dtype=torch.long)  # the tiny LM's context is 128 positions
    with pytest.raises(ValueError, match="prompt row 0 holds 130 tokens, more than the model's context of 128"):
        decoder.generate(long, 4)
    short = torch.cat([torch.zeros(1, 130, dtype=torch.long), long[1:]])
    decoder.generate(short[:, -3:], 2, attention_mask=torch.tensor([[0, 0, 1], [1, 1, 1]]))  # fits
    with pytest.raises(ValueError, match="a list of generators needs one per row, got 1 for 2 rows"):
        decoder.generate(ids, 4, sampling=Sampling(1.0), generator=[torch.Generator()])
    allocations = decoder.verifier.allocations
    huge = torch.zeros(10**7, 1, dtype=torch.long).expand(10**7, 1)
    with pytest.raises(ValueError, match=r"a batch of 10000000 prompts needs about .* GiB .* use a smaller batch"):
        decoder.generate(huge, 64)
    assert decoder.verifier.allocations == allocations  # refused before allocating


def test_a_model_without_a_family_adapter_decodes_one_row_at_a_time():
    model = tiny_lm(12)
    head = random_head("ff", 3, 12, seed=9)
    model.config.model_type = "unknown-family"  # the whole-model path: the model's own forward and cache
    decoder = SpeculativeDecoder(model, head)
    assert decoder.backbone.whole_model
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(decoder.generate(ids, 6).sequences, PlainDecoder(model).generate(ids, 6).sequences)
    padded = {"attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]])}
    refusals = {"a batch of 2 prompts": lambda: decoder.generate(ids.expand(2, 3), 6),
                "a tree of drafts": lambda: SpeculativeDecoder(model, head, tree=4),
                "compiled plain decoding": lambda: PlainDecoder(model, compile=True),
                "a batch of padded prompts": lambda: PlainDecoder(model).generate(ids.expand(2, 3), 2, **padded)}
    for what, refused in refusals.items():  # one rule, one wording (`SplitBackbone.require_slot_caches`)
        with pytest.raises(ValueError, match=f"^{what} needs the split loop's slot caches, and mtpc has no adapter "
                                             "for model_type 'unknown-family': "):
            refused()
    batched = SpeculativeDecoder(model, head, family=LlamaFamily())
    assert_rows_equal_plain(model, batched, [[1, 2, 3], [4]], 6)


# --------------------------------------------------------------------------- compiled

@pytest.mark.slow
def test_compiled_batch_equals_eager_and_plain():
    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    head = random_head("btree", n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n, wrong_last=True))
    compiled = SpeculativeDecoder(model, head, compile=True)
    eager = SpeculativeDecoder(model, head)
    rows = batch_prompts(vocab, 3, seed=4)
    assert_rows_equal_plain(model, compiled, rows, 12)
    ids, mask = left_padded(rows)
    sampled = [d.generate(ids, 12, sampling=Sampling(1.0), attention_mask=mask,
                          generator=[torch.Generator().manual_seed(b) for b in range(3)]).sequences
               for d in (compiled, eager)]
    assert torch.equal(*sampled)
