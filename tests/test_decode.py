"""The speculative decoder is lossless: greedy output equals plain greedy decoding (float64), sampled
output follows the verifier's exact joint (chi-square against enumeration, with power shown by wrong
acceptance rules failing the same test)."""

import pytest
import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

import circuitc
from circuitc import builders
from circuitc.runtime.draft import DraftProgram
from mtpc import MTPHead, SpeculativeDecoder
from mtpc.lm.lora import attach_draft_lora
from mtpc.decoding.cycle.acceptance import AcceptanceRule, BlockVerification
from mtpc.sampling import GREEDY, Sampling
from mtpc.decoding import PlainDecoder
from mtpc.decoding.cycle.decoder import AdaptiveWidth

D = 32


pytestmark = pytest.mark.usefixtures("one_thread")


def hf_generate(model, ids, **kwargs):
    """transformers' generate with an explicit mask (it would otherwise treat the pad id as padding)."""
    return model.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=model.config.vocab_size - 1,
                          **kwargs)


def tiny_lm(vocab, layers=2, seed=0, scale=1.0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=D, intermediate_size=2 * D, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).to(torch.float64).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)  # larger logits: a more decided (less uniform) verifier
    return model


def cyclic_lm(vocab, noise=0.4, seed=0):
    """A verifier whose greedy continuation is mostly `t -> t + 1 (mod V)`: the LM head is the
    embedding table rolled by one, and the decoder layers (scaled by `noise`) perturb it with context."""
    model = tiny_lm(vocab, seed=seed)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(noise)
            layer.mlp.down_proj.weight.mul_(noise)
        model.lm_head.weight.copy_(4 * model.model.embed_tokens.weight.roll(1, 0))
    return model


def oracle_tables(model, n, wrong_last=False):
    """Per-position output embeddings that make an FF-initialised head draft t+1, t+2, .. (the last
    position deliberately off by one when `wrong_last`)."""
    embed = model.model.embed_tokens.weight
    return [4 * embed.roll(i + 1 + (wrong_last and i == n - 1), 0) for i in range(n)]


def graph(structure, n, v, r=3):
    return {"ff": lambda: builders.ff_graph(n, v), "cp": lambda: builders.cp_graph(n, r, v),
            "hmm": lambda: builders.hmm_graph(n, r, v), "btree": lambda: builders.btree_graph(n, r, v)}[structure]()


def random_head(structure, n, v, seed, std=1.0, init_from=None):
    torch.manual_seed(seed)
    source = graph(structure, n, v)
    head = MTPHead(source, D, init_from=init_from, sum_init_std=std, dtype=torch.float64)
    if init_from is None:
        with torch.no_grad():
            head.weight.mul_(std * 8)  # decided drafts that often disagree with the verifier
    return head


def adapter_head(parameterisation, structure, n, v, seed, scale=1.0, init_from=None):
    """A "shared"/"factorised" head with every parameter random (adapters included), in float64."""
    torch.manual_seed(seed)
    head = MTPHead(graph(structure, n, v), D, init_from=init_from, parameterisation=parameterisation,
                   adapter_rank=2, factor_rank=4, sum_init_std=0.5, dtype=torch.float64)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if init_from is None or name in ("adapter_up", "proj_bias"):
                p.normal_(0, scale)
    return head


def prompts(vocab, count, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (1, int(torch.randint(1, 7, (1,), generator=gen))), generator=gen)
            for _ in range(count)]


# --------------------------------------------------------------------------- greedy equality

def test_plain_greedy_matches_transformers_generate():
    model = tiny_lm(16)
    for ids in prompts(16, 3, seed=5):
        ours = PlainDecoder(model).generate(ids, 12).sequences
        theirs = hf_generate(model, ids, max_new_tokens=12, do_sample=False)
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("structure", ["ff", "cp", "hmm", "btree"])
def test_greedy_speculative_equals_plain_greedy(structure):
    vocab, n = 12, 3
    model = cyclic_lm(vocab)
    heads = [random_head(structure, n, vocab, seed=1),  # a random draft: mostly rejected
             random_head(structure, n, vocab, seed=2, std=0.3, init_from=oracle_tables(model, n)),  # mostly right
             random_head(structure, n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n, wrong_last=True))]
    accepted = []
    for head in heads:
        for window in (AdaptiveWidth(), 2, None):  # adaptive widths, the narrowest and the widest fixed one
            decoder = SpeculativeDecoder(model, head, window=window)
            for i, ids in enumerate(prompts(vocab, 3, seed=len(accepted))):
                budget = (1, 5, 17)[i]
                plain = PlainDecoder(model).generate(ids, budget).sequences
                out = decoder.generate(ids, budget, generator=torch.Generator().manual_seed(i))
                assert torch.equal(out.sequences, plain), (window, ids.tolist(), budget)
                assert out.stats.new_tokens == budget and len(out.stats.accepted_per_cycle) == out.stats.cycles
                accepted += out.stats.accepted_per_cycle
    counts = torch.bincount(torch.tensor(accepted), minlength=n + 1)
    assert counts[1] > 20 and counts[2] > 20 and counts[n] > 8, counts  # short, partial and full windows


@pytest.mark.parametrize("parameterisation", ["shared", "factorised"])
def test_greedy_with_adapter_heads_equals_plain_greedy(parameterisation):
    vocab, n = 12, 3
    model = cyclic_lm(vocab)
    heads = [adapter_head(parameterisation, "btree", n, vocab, seed=1, scale=2.0),
             adapter_head(parameterisation, "hmm", n, vocab, seed=2, scale=0.3, init_from=oracle_tables(model, n))]
    accepted = []
    for head in heads:
        decoder = SpeculativeDecoder(model, head)
        for i, ids in enumerate(prompts(vocab, 4, seed=len(accepted))):
            plain = PlainDecoder(model).generate(ids, 13).sequences
            out = decoder.generate(ids, 13)
            assert torch.equal(out.sequences, plain), (parameterisation, ids.tolist())
            accepted += out.stats.accepted_per_cycle
    counts = torch.bincount(torch.tensor(accepted), minlength=n + 1)
    assert counts[1] > 5 and counts[n] > 5, counts


def first_token_head(structure, n, v, seed, scale=2.0, mlp=0, **kwargs):
    """A random head that also reads the window's first token (through a residual MLP of width `mlp` too
    when > 0), its embedding and MLP random too."""
    head = random_head(structure, n, v, seed, **kwargs).read_first_token(mlp)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.first_embedding.normal_(0, scale, generator=generator)
        if mlp:
            head.first_mlp_out.normal_(0, scale, generator=generator)
    return head


def test_greedy_with_a_head_reading_the_first_token_equals_plain_greedy():
    vocab, n = 12, 3
    model = cyclic_lm(vocab)
    heads = [first_token_head("btree", n, vocab, seed=4), first_token_head("btree", n, vocab, seed=6, mlp=5),
             first_token_head("hmm", n, vocab, seed=5, scale=0.3, std=0.3, init_from=oracle_tables(model, n))]
    accepted = []
    for head in heads:
        decoder = SpeculativeDecoder(model, head)
        for i, ids in enumerate(prompts(vocab, 4, seed=7 + len(accepted))):
            plain = PlainDecoder(model).generate(ids, 13).sequences
            assert torch.equal(decoder.generate(ids, 13).sequences, plain), ids.tolist()
            accepted += decoder.generate(ids, 13).stats.accepted_per_cycle
    counts = torch.bincount(torch.tensor(accepted), minlength=n + 1)
    assert counts[1] > 5 and counts[n] > 5, counts


def test_greedy_with_circuit_over_fewer_states_than_the_vocabulary():
    model = tiny_lm(16, scale=3.0)
    head = random_head("hmm", 4, 10, seed=3, init_from=model.lm_head.weight)  # drafts token ids 0..9 only
    decoder = SpeculativeDecoder(model, head)
    for ids in prompts(16, 8, seed=6):  # first tokens 10..15 the circuit cannot observe among them
        assert torch.equal(decoder.generate(ids, 15).sequences, PlainDecoder(model).generate(ids, 15).sequences)


@pytest.mark.parametrize("k", [1, 2])
def test_greedy_with_lora_draft_path_equals_base_model_greedy(k):
    vocab = 12
    base = tiny_lm(vocab, layers=3, scale=3.0)
    plain = [PlainDecoder(base).generate(ids, 12).sequences for ids in prompts(vocab, 4, seed=7)]
    peft_model = attach_draft_lora(base, k, rank=4)
    torch.manual_seed(k)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # the draft path now differs from the verifier
    peft_model.eval()
    head = random_head("btree", 4, vocab, seed=4, init_from=base.lm_head.weight)
    decoder = SpeculativeDecoder(peft_model, head, lora_layers=k)
    for ids, expected in zip(prompts(vocab, 4, seed=7), plain):
        assert torch.equal(decoder.generate(ids, 12).sequences, expected)
    assert torch.equal(PlainDecoder(peft_model).generate(ids, 12).sequences, expected)
    via_peft = hf_generate(peft_model, ids, custom_generate=decoder.custom_generate, max_new_tokens=12)
    assert torch.equal(via_peft, expected)  # PeftModel.generate hands the base model to custom_generate


def test_stops_at_eos_and_exactly_at_max_new_tokens():
    vocab = 12
    model = tiny_lm(vocab, scale=3.0)
    head = random_head("cp", 4, vocab, seed=5, init_from=model.lm_head.weight)
    decoder = SpeculativeDecoder(model, head)
    ids = torch.tensor([[3, 1, 4]])
    full = PlainDecoder(model).generate(ids, 20).sequences[0, 3:].tolist()
    for budget in range(0, 9):
        assert decoder.generate(ids, budget).sequences.shape == (1, 3 + budget)
    for eos in set(full[2:]):
        cut = full.index(eos) + 1
        out = decoder.generate(ids, 20, eos_token_id=[eos, vocab + 5])
        assert out.sequences[0, 3:].tolist() == full[:cut]
        assert torch.equal(out.sequences, PlainDecoder(model).generate(ids, 20, eos_token_id=eos).sequences)


def test_stats_are_consistent():
    model = tiny_lm(12)
    head = random_head("ff", 3, 12, seed=6, init_from=model.lm_head.weight)
    out = SpeculativeDecoder(model, head).generate(torch.tensor([[1, 2]]), 10, sampling=Sampling(1.0),
                                                   generator=torch.Generator().manual_seed(0))
    s = out.stats
    assert s.new_tokens == 10 == sum(s.accepted_per_cycle) and s.cycles == len(s.cycle_seconds)
    assert all(0 <= d <= a <= 3 for d, a in zip(s.draft_accepted_per_cycle, s.accepted_per_cycle))
    assert s.mean_accepted == 10 / s.cycles and s.tokens_per_second > 0 and s.prefill_seconds > 0
    assert set(s.as_dict()) >= {"cycles", "mean_accepted", "mean_cycle_latency", "tokens_per_second"}


# --------------------------------------------------------------------------- exact in distribution

def exact_joint(model, prompt, target: Sampling, steps=3):
    """`[V] * steps` tensor: p(x_1..x_steps | prompt) under the shaped target, by enumeration."""
    vocab = model.config.vocab_size
    tails = torch.cartesian_prod(*[torch.arange(vocab)] * steps).view(-1, steps)  # [V^steps, steps]
    seqs = torch.cat([prompt.expand(tails.shape[0], -1), tails], 1)
    with torch.no_grad():
        logits = model(seqs).logits[:, prompt.shape[1] - 1:-1]  # [V^steps, steps, V]
    probs = target.probs(logits)
    picked = probs.gather(-1, tails[..., None])[..., 0]  # [V^steps, steps]
    return picked.prod(-1).view(*[vocab] * steps)


def chi_square_pvalue(samples, joint):
    counts = torch.zeros(joint.numel(), dtype=torch.float64)
    for s in samples:
        counts[int(torch.tensor(s) @ torch.tensor([joint.shape[0] ** 2, joint.shape[0], 1]))] += 1
    expected = joint.flatten() * len(samples)
    if counts[expected == 0].sum() > 0:
        return 0.0  # a sample the target gives probability 0 (e.g. outside top-k)
    counts, expected = counts[expected > 0], expected[expected > 0]
    small = expected < 5  # pool rare cells so the chi-square approximation holds
    obs = torch.cat([counts[~small], counts[small].sum()[None]]) if small.any() else counts
    exp = torch.cat([expected[~small], expected[small].sum()[None]]) if small.any() else expected
    return chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue


def speculative_samples(decoder, prompt, count, seed, **target):
    """`count` samples of 3 tokens after `prompt`, one generation each: the decoder as a user runs it (B = 1)."""
    gen = torch.Generator().manual_seed(seed)
    sampling = Sampling(**{"temperature": 1.0, **target})
    return [decoder.generate(prompt, 3, sampling, generator=gen).sequences[0, -3:].tolist() for _ in range(count)]


def batched_samples(decoder, prompt, count, seed, **target):
    """`count` samples of 3 tokens after `prompt` from one batch of the prompt repeated, each row its own draw.
    For the controls: a wrong rule must fail the chi-square whatever the batch (the claim under test itself is
    sampled one generation at a time, `speculative_samples`), at a fraction of the time."""
    gen = torch.Generator().manual_seed(seed)
    sampling = Sampling(**{"temperature": 1.0, **target})
    return decoder.generate(prompt.expand(count, -1), 3, sampling, generator=gen).sequences[:, -3:].tolist()


class ResidualIsTarget(AcceptanceRule):
    """Wrong: after a rejection, draw from p instead of norm(max(0, p - q))."""

    def residual(self, p, q):
        return p


class BlockResidualIsTarget(BlockVerification):
    """Wrong: block verification that draws from p after the kept tokens instead of its residual."""

    def residual(self, p, q):
        return p


class AcceptAlways(AcceptanceRule):
    """Wrong: keep every drafted token."""

    def accept(self, p_x, q_x, u):
        return True


VOCAB = 5
PROMPT = torch.tensor([[1, 3]])


def sampling_setup(n, v, structure="cp"):
    model = tiny_lm(VOCAB, scale=4.0, seed=11)
    return model, random_head(structure, n, v, seed=12, std=0.6)


@pytest.mark.parametrize("n, v, window, target", [
    (2, VOCAB, None, {}),
    (3, 4, None, {"temperature": 0.8, "top_k": 4}),  # x_0 = 4 is no circuit state
    # widths chosen per window (in the default run: test_batched's adaptive widths with top-p)
    pytest.param(3, VOCAB, AdaptiveWidth(position_cost=0.5, widths=(2, 3)), {}, marks=pytest.mark.slow),
])
def test_sampling_is_exact_and_a_wrong_residual_is_caught(n, v, window, target):
    model, head = sampling_setup(n, v)
    joint = exact_joint(model, PROMPT, Sampling(**{"temperature": 1.0, **target}))
    count = 600  # enough: the correct rule gives p ~ 0.9, the wrong residual p < 1e-18 (measured)
    right = SpeculativeDecoder(model, head, window=window)
    samples = speculative_samples(right, PROMPT, count, seed=1, **target)
    assert chi_square_pvalue(samples, joint) > 1e-3
    wrong = batched_samples(SpeculativeDecoder(model, head, window=window, acceptance=BlockResidualIsTarget()),
                            PROMPT, count, seed=1, **target)
    assert chi_square_pvalue(wrong, joint) < 1e-6


@pytest.mark.parametrize("parameterisation, rule, wrong_rule", [
    ("shared", BlockVerification(), BlockResidualIsTarget()),  # the default rule
    ("shared", AcceptanceRule(), ResidualIsTarget()),  # token by token
    pytest.param("factorised", BlockVerification(), BlockResidualIsTarget(), marks=pytest.mark.slow)])
def test_sampling_with_adapter_heads_is_exact(parameterisation, rule, wrong_rule):
    model = tiny_lm(VOCAB, scale=4.0, seed=11)
    head = adapter_head(parameterisation, "btree", 3, VOCAB, seed=12, scale=0.8)
    joint = exact_joint(model, PROMPT, Sampling(1.0))
    right = speculative_samples(SpeculativeDecoder(model, head, acceptance=rule), PROMPT, 600, seed=4)
    assert chi_square_pvalue(right, joint) > 1e-3
    wrong = batched_samples(SpeculativeDecoder(model, head, acceptance=wrong_rule), PROMPT, 600, seed=4)
    assert chi_square_pvalue(wrong, joint) < 1e-6


def test_sampling_with_a_head_reading_the_first_token_is_exact():
    model = tiny_lm(VOCAB, scale=4.0, seed=11)
    # x_0 through the embedding and a residual MLP; x_0 = 4 is no circuit state: the last state's row
    head = first_token_head("btree", 3, 4, seed=13, std=0.6, mlp=5)
    joint = exact_joint(model, PROMPT, Sampling(1.0))
    right = speculative_samples(SpeculativeDecoder(model, head), PROMPT, 600, seed=5)
    assert chi_square_pvalue(right, joint) > 1e-3
    wrong = batched_samples(SpeculativeDecoder(model, head, acceptance=BlockResidualIsTarget()), PROMPT, 600,
                            seed=5)
    assert chi_square_pvalue(wrong, joint) < 1e-6


class TemperedDrawsUntemperedRows(DraftProgram):
    """Wrong: draws at the draft temperature, but rows that claim the circuit's untempered conditionals."""

    def sample(self, theta, generator=None, prefix=None, uniforms=None, temperature=1.0):
        x, rows = super().sample(theta, generator, prefix, uniforms, temperature)
        return x, torch.where(rows.sum(-1, keepdim=True) > 0, self.conditionals(theta, x), rows)


@pytest.mark.parametrize("draft_temperature, target", [
    # the default: the draft tempered as the target is (in the default run: the T = 0.8 case above)
    pytest.param(None, {"temperature": 3.0}, marks=pytest.mark.slow),
    pytest.param(3.0, {}, marks=pytest.mark.slow),  # a draft flatter than the T = 1 target
])
def test_sampling_at_a_draft_temperature_is_exact_and_untempered_rows_are_caught(draft_temperature, target):
    """(A sharpened draft is exact too: the T = 0.8 case above drafts at 0.8. Its wrong rows are caught
    less surely by 600 samples, so the controls here temper the other way.)"""
    model = tiny_lm(VOCAB, scale=4.0, seed=11)
    head = random_head("btree", 3, VOCAB, seed=12, std=1.0)
    joint = exact_joint(model, PROMPT, Sampling(**{"temperature": 1.0, **target}))
    right = SpeculativeDecoder(model, head, draft_temperature=draft_temperature)
    assert Sampling(**{"temperature": 1.0, **target}).draft_temperature(right.settings.draft_temperature) == 3.0
    assert GREEDY.draft_temperature(right.settings.draft_temperature) == 1.0  # greedy: an argmax ignores it
    assert chi_square_pvalue(speculative_samples(right, PROMPT, 600, seed=6, **target), joint) > 1e-3
    wrong = SpeculativeDecoder(model, head, draft_temperature=draft_temperature)
    wrong.drafter.program = TemperedDrawsUntemperedRows(head.graph, head.circ.param_layout)
    assert chi_square_pvalue(batched_samples(wrong, PROMPT, 600, seed=6, **target), joint) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("structure", ["ff", "hmm", "btree"])
def test_sampling_is_exact_for_every_structure_and_accept_always_is_caught(structure):
    model, head = sampling_setup(3, VOCAB, structure)
    joint = exact_joint(model, PROMPT, Sampling(1.0, top_p=0.9))
    right = speculative_samples(SpeculativeDecoder(model, head), PROMPT, 4000, seed=2, top_p=0.9)
    assert chi_square_pvalue(right, joint) > 1e-3
    wrong = batched_samples(SpeculativeDecoder(model, head, acceptance=AcceptAlways()),
                            PROMPT, 1500, seed=2, top_p=0.9)
    assert chi_square_pvalue(wrong, joint) < 1e-6


def test_plain_sampling_follows_the_target():
    model, _ = sampling_setup(2, VOCAB)
    joint = exact_joint(model, PROMPT, Sampling(1.0, top_p=0.8))
    gen = torch.Generator().manual_seed(3)
    samples = [PlainDecoder(model).generate(PROMPT, 3, sampling=Sampling(1.0, top_p=0.8), generator=gen)
               .sequences[0, -3:].tolist() for _ in range(1000)]
    assert chi_square_pvalue(samples, joint) > 1e-3


# --------------------------------------------------------------------------- transformers integration

def test_usable_as_transformers_custom_generate():
    model = tiny_lm(12, scale=3.0)
    head = random_head("btree", 4, 12, seed=8, init_from=model.lm_head.weight)
    decoder = SpeculativeDecoder(model, head)
    ids = torch.tensor([[2, 7, 1]])
    ours = hf_generate(model, ids, custom_generate=decoder.custom_generate, max_new_tokens=11, do_sample=False)
    assert torch.equal(ours, hf_generate(model, ids, max_new_tokens=11, do_sample=False))
    assert torch.equal(ours, decoder.generate(ids, 11).sequences)
    eos = int(ours[0, 6])
    stopped = hf_generate(model, ids, custom_generate=decoder.custom_generate, max_new_tokens=11, eos_token_id=eos)
    assert torch.equal(stopped, ours[:, :7])
    sampled = hf_generate(model, ids, custom_generate=decoder.custom_generate, max_new_tokens=6, do_sample=True,
                          top_k=5, return_dict_in_generate=True)
    assert sampled.sequences.shape == (1, 9)
    with pytest.raises(ValueError, match="RepetitionPenaltyLogitsProcessor"):
        hf_generate(model, ids, custom_generate=decoder.custom_generate, max_new_tokens=4, repetition_penalty=1.3)


# --------------------------------------------------------------------------- errors

def test_bad_input_gets_a_clear_error():
    model = tiny_lm(12)
    head = random_head("cp", 3, 12, seed=9)
    decoder = SpeculativeDecoder(model, head)
    with pytest.raises(ValueError, match="prompt is empty"):
        decoder.generate(torch.zeros(1, 0, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="0..11"):
        decoder.generate(torch.tensor([[3, 12]]), 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoder.generate(torch.tensor([[3]]), -1)
    for temperature, top_k, top_p in ((-1.0, None, None), (float("nan"), None, None), (1e-9, None, None),
                                      (1.0, -2, None), (1.0, 2.5, None), (1.0, None, 0.0), (1.0, None, 1.5)):
        with pytest.raises(ValueError, match="temperature|top-k|top-p"):
            Sampling(temperature, top_k, top_p)
    for plain_or_not in (decoder, PlainDecoder(model)):
        with pytest.raises(TypeError, match="sampling must be a mtpc.sampling.Sampling"):
            plain_or_not.generate(torch.tensor([[3]]), 2, sampling={"do_sample": True})
    assert Sampling(0.0, top_k=5, top_p=0.5) == GREEDY  # greedy keeps no shaping: one greedy value
    for bad in (0, -1.0, float("inf"), float("nan"), "1", True, 1e-9):
        with pytest.raises(ValueError, match="draft_temperature "):
            SpeculativeDecoder(model, head, draft_temperature=bad)
    with pytest.raises(ValueError, match="hidden size 16, the model's is 32"):
        SpeculativeDecoder(model, MTPHead(builders.cp_graph(3, 2, 12), 16))
    with pytest.raises(ValueError, match="13 states .* only 12 tokens"):
        SpeculativeDecoder(model, MTPHead(builders.cp_graph(3, 2, 13), D))
    with pytest.raises(ValueError, match="larger than the model's 2 decoder layers"):
        SpeculativeDecoder(model, head, lora_layers=3)
    SpeculativeDecoder(model, MTPHead(circuitc.compile(builders.cp_graph(3, 2, 12)), D))  # a compiled circuit: a head
    with pytest.raises(ValueError, match="window must be an integer from 2 to the circuit's 3 positions or an"):
        SpeculativeDecoder(model, head, window="wide")
    model.train()
    model.model.layers[0].self_attn.attention_dropout = 0.1  # plain attribute, not a module: no dropout module
    model.model.embed_dropout = torch.nn.Dropout(0.1)  # a dropout module in training mode
    with pytest.raises(ValueError, match="model.eval"):
        SpeculativeDecoder(model, head).generate(torch.tensor([[3]]), 2)


# --------------------------------------------------------------------------- prompt lookup inside the loop

def test_lookup_proposes_the_latest_continuation_and_repeats_it_periodically():
    from mtpc.decoding.drafts.proposals import LookupState, PromptLookup

    state = LookupState(PromptLookup(tokens=5, min_ngram=1, max_ngram=3))
    state.extend([7, 1, 2, 9, 1, 2, 3, 1, 2])
    proposal = state.propose()  # suffix [3, 1, 2] seen at 6..8 only (itself): [1, 2] at 4..5 is latest
    assert (proposal.ngram, proposal.tokens) == (2, [3, 1, 2, 3, 1])  # period 3 beyond the present
    state.extend([3, 1, 4])  # two of its tokens agreed
    assert state.lookup_score == {2: 2} and not state.pending
    state.extend([7, 1])
    proposal = state.propose()
    assert (proposal.ngram, proposal.tokens) == (2, [2, 9, 1, 2, 3])
    assert state.use(proposal)  # the circuit is untried
    state.record_circuit(1)
    assert state.use(proposal)  # lookup's running acceptance 2 > the circuit's 1
    state.record_circuit(9)
    assert not state.use(proposal)  # the circuit's is now 1 + 0.25 * (9 - 1) = 3
    assert state.length(proposal, window=8) == 3  # running acceptance 2: one more token, the circuit fills
    assert state.length(proposal, window=4) == 5  # 2 + 1 reaches the window's end: all of it
    assert LookupState(PromptLookup(min_ngram=2)).propose() is None


@pytest.mark.parametrize("structure", ["ff", "cp", "hmm", "btree"])
def test_greedy_with_lookup_equals_plain_greedy(structure):
    from mtpc.decoding.drafts.proposals import PromptLookup

    vocab, n = 12, 3
    model = cyclic_lm(vocab)
    heads = [random_head(structure, n, vocab, seed=1),
             random_head(structure, n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n, wrong_last=True))]
    lookups = [PromptLookup(tokens=1, min_ngram=1, max_ngram=2, prefer="lookup"),  # circuit fills after it
               PromptLookup(tokens=5, min_ngram=1, max_ngram=2, prefer="lookup"),  # windows longer than n
               PromptLookup(tokens=4, min_ngram=1, max_ngram=3)]  # adaptive choice
    lookup_cycles, accepted = 0, []
    for head in heads:
        for lookup in lookups:
            decoder = SpeculativeDecoder(model, head, lookup=lookup)
            for i, ids in enumerate(prompts(vocab, 3, seed=len(accepted))):
                budget = (1, 6, 19)[i]
                plain = PlainDecoder(model).generate(ids, budget).sequences
                out = decoder.generate(ids, budget)
                assert torch.equal(out.sequences, plain), (lookup, ids.tolist(), budget)
                lookup_cycles += out.stats.lookup_cycles
                accepted += out.stats.accepted_per_cycle
    assert lookup_cycles > 12 and max(accepted) > n  # lookup drafted, and past the circuit's window


class PointMassResidualIsTarget(BlockVerification):
    """Wrong only for lookup tokens: after rejecting a point-mass proposal, draw from p itself (which
    can redraw the rejected token) instead of p with the token removed."""

    def residual(self, p, q):
        return p if float(q.max()) == 1.0 else super().residual(p, q)


LOOKUP_PROMPT = torch.tensor([[1, 3, 2, 1, 3, 0, 1, 3]])


# the tempered, top-p target waits for `pytest -m slow` (12 s): the default suite keeps T = 1 here; tempered
# and top-p targets without lookup are covered by test_sampling_is_exact_and_a_wrong_residual_is_caught (T, top-k)
# and tests/test_batched.py::test_sampled_rows_with_adaptive_widths_and_top_p_are_exact
@pytest.mark.parametrize("target", [{}, pytest.param({"temperature": 0.8, "top_p": 0.95}, marks=pytest.mark.slow)])
def test_sampling_with_lookup_is_exact_and_a_wrong_point_mass_residual_is_caught(target):
    from mtpc.decoding.drafts.proposals import PromptLookup

    model, head = sampling_setup(3, VOCAB)
    lookup = PromptLookup(tokens=1, min_ngram=1, max_ngram=2, prefer="lookup")  # 1 lookup token, circuit fills
    joint = exact_joint(model, LOOKUP_PROMPT, Sampling(**{"temperature": 1.0, **target}))
    decoder = SpeculativeDecoder(model, head, lookup=lookup)
    assert decoder.generate(LOOKUP_PROMPT, 3, sampling=Sampling(1.0)).stats.lookup_cycles > 0
    right = speculative_samples(decoder, LOOKUP_PROMPT, 800, seed=1, **target)
    assert chi_square_pvalue(right, joint) > 1e-3
    wrong = speculative_samples(SpeculativeDecoder(model, head, lookup=lookup,
                                                   acceptance=PointMassResidualIsTarget()),
                                LOOKUP_PROMPT, 800, seed=1, **target)
    assert chi_square_pvalue(wrong, joint) < 1e-6
