"""A paced generation (`mtpc.decoding.pace`): speculative cycles asked against a plain step, the rest handed to
plain decoding when they fall behind. Greedy output equals plain greedy output wherever the hand-over falls
(chains, trees, lookup windows); sampled output is exactly the target's (chi-square against enumeration, with a
wrong rule that must fail); the stats, the streamer and the errors."""

from __future__ import annotations

import pytest
import torch

from mtpc import SpeculativeDecoder
from mtpc.decoding import PlainDecoder, PromptLookup
from mtpc.decoding.pace import PaceCheck, generate_paced
from mtpc.decoding.stats import DecodeStats
from mtpc.sampling import Sampling
from test_decode import (BlockResidualIsTarget, PROMPT, VOCAB, chi_square_pvalue, cyclic_lm, exact_joint,
                         oracle_tables, prompts, random_head, sampling_setup)
from test_trees import SecondChance

pytestmark = pytest.mark.usefixtures("one_thread")

NEVER = PaceCheck(plain_step=1e9)  # plain decoding at a token in 30 years: never ahead


def after(cycles: int) -> PaceCheck:
    """A check that hands over after `cycles` cycles whatever they measured (plain at 1e12 tokens a second)."""
    return PaceCheck(plain_step=1e-12, cycles=cycles)


def decoders(model, head, **options):
    return SpeculativeDecoder(model, head, **options), PlainDecoder(model)


@pytest.mark.parametrize("options", [{}, {"tree": 5}, {"lookup": PromptLookup(tokens=4, min_ngram=1, max_ngram=2)}],
                         ids=["chain", "tree", "lookup"])
def test_greedy_paced_equals_plain_greedy_wherever_it_hands_over(options):
    vocab, n = 12, 3
    model = cyclic_lm(vocab)
    head = random_head("cp", n, vocab, seed=2, std=0.3, init_from=oracle_tables(model, n, wrong_last=True))
    speculative, plain = decoders(model, head, **options)
    handed = 0
    for i, ids in enumerate(prompts(vocab, 4, seed=3)):
        budget = (5, 9, 14, 20)[i]
        expected = plain.generate(ids, budget).sequences
        for cycles in (1, 2, 3):
            out = generate_paced(speculative, plain, ids, budget, pace=after(cycles))
            assert torch.equal(out.sequences, expected), (options, ids.tolist(), budget, cycles)
            stats = out.stats
            assert stats.new_tokens == budget
            if stats.handover is not None:
                handed += 1
                assert stats.handover.cycles == cycles and stats.width_per_cycle[cycles] == 0  # x_0 committed
                assert sum(stats.accepted_per_cycle[:cycles + 1]) == stats.handover.tokens < budget
                assert stats.accepted_per_cycle[cycles + 1:] == [1] * (budget - stats.handover.tokens)  # plain
                assert stats.handover.seconds > 0 and stats.as_dict()["handover"]["tokens"] == stats.handover.tokens
        unpaced = speculative.generate(ids, budget)
        never = generate_paced(speculative, plain, ids, budget, pace=NEVER)
        assert torch.equal(never.sequences, expected) and never.stats.handover is None
        assert never.stats.accepted_per_cycle == unpaced.stats.accepted_per_cycle
    assert handed >= 9  # most runs handed over (a run whose first cycles finish it does not)


# the tree's (8 s on 2 cores) waits for `pytest -m slow`; the default run samples a chain's hand-over
@pytest.mark.parametrize("options, wrong_rule", [
    ({}, BlockResidualIsTarget()), pytest.param({"tree": 3}, SecondChance(), marks=pytest.mark.slow)],
    ids=["chain", "tree"])
def test_paced_sampling_is_exact_and_a_wrong_rule_is_caught(options, wrong_rule):
    model, head = sampling_setup(2, VOCAB)
    joint = exact_joint(model, PROMPT, Sampling(temperature=1.0))
    plain = PlainDecoder(model)
    count = 400  # measured on the chain: the right rule p = 0.59, the wrong residual p = 5e-9 (at 300: 4e-7)

    def samples(speculative, seed):
        gen, sampling = torch.Generator().manual_seed(seed), Sampling(temperature=1.0)
        outs = [generate_paced(speculative, plain, PROMPT, 3, sampling, pace=after(1), generator=gen)
                for _ in range(count)]
        return [o.sequences[0, -3:].tolist() for o in outs], sum(o.stats.handover is not None for o in outs)

    right, handed = samples(SpeculativeDecoder(model, head, **options), seed=4)
    assert chi_square_pvalue(right, joint) > 1e-3 and handed > count // 6  # the hand-over is what is tested
    wrong, _ = samples(SpeculativeDecoder(model, head, acceptance=wrong_rule, **options), seed=4)
    assert chi_square_pvalue(wrong, joint) < 1e-6


class Recorder:
    """A transformers-style streamer that keeps what it was fed."""

    def __init__(self):
        self.prompts, self.tokens, self.ends = [], [], 0

    def put(self, value):
        if not self.prompts and not self.tokens:
            self.prompts.append(value.reshape(-1).tolist())
        else:
            self.tokens += value.reshape(-1).tolist()

    def end(self):
        self.ends += 1


@pytest.mark.parametrize("pace", [after(1), NEVER], ids=["hands over", "never"])
def test_a_streamer_sees_one_generation(pace):
    model = cyclic_lm(12)
    speculative, plain = decoders(model, random_head("cp", 3, 12, seed=1))
    ids = torch.tensor([[3, 4, 5]])
    recorder = Recorder()
    out = generate_paced(speculative, plain, ids, 10, pace=pace, streamer=recorder)
    assert recorder.prompts == [[3, 4, 5]] and recorder.ends == 1
    assert recorder.tokens == out.sequences[0, 3:].tolist() and len(recorder.tokens) == 10
    assert (out.stats.handover is not None) == (pace is not NEVER)


def test_the_check_judges_every_cycle_so_far_and_the_latest_against_a_margin():
    stats = DecodeStats()
    pace = PaceCheck(plain_step=0.01, cycles=2)  # plain: 100 tokens a second; behind below 90
    assert pace.rate(stats) is None and not pace.behind(stats)
    stats.record(0.01, [[1, 2, 3]], 3)  # 300 tokens a second
    assert not pace.behind(stats)  # one cycle: not judged yet
    stats.record(0.03, [[4]], 3)
    assert pace.rate(stats) == pytest.approx(100.0) and not pace.behind(stats)  # even
    stats.record(0.0155, [[5]], 3)  # every cycle so far: 5 tokens in 55.5 ms, 90.1 a second: within the margin
    assert pace.rate(stats) == pytest.approx(5 / 0.0555) and pace.recent_rate(stats) < 90 and not pace.behind(stats)
    stats.record(0.0245, [[6]], 3)  # 6 tokens in 80 ms: 75 a second; the latest two 50 a second
    assert pace.rate(stats) == pytest.approx(75.0) and pace.rate(stats, upto=2) == pytest.approx(100.0)
    assert pace.behind(stats) and not PaceCheck(plain_step=0.01, cycles=2, margin=0.7).behind(stats)
    assert not PaceCheck(plain_step=0.01, cycles=5).behind(stats)  # four cycles: too few
    latest = PaceCheck(plain_step=0.01, cycles=1)  # the latest cycle: 1 token in 24.5 ms
    assert latest.recent_rate(stats) == pytest.approx(1 / 0.0245) and latest.behind(stats)
    stats.record(0.005, [[7]], 3)  # all: 7 tokens in 85 ms, 82 a second; the latest: 200 a second
    assert latest.rate(stats) < 90 < latest.recent_rate(stats) and not latest.behind(stats)  # getting better


@pytest.mark.parametrize("fields, message", [
    ({"plain_step": 0.0}, "plain_step must be a positive"), ({"plain_step": float("nan")}, "plain_step"),
    ({"plain_step": "1"}, "plain_step"), ({"plain_step": 1.0, "cycles": 0}, "cycles must be an int >= 1"),
    ({"plain_step": 1.0, "cycles": True}, "cycles"), ({"plain_step": 1.0, "margin": -1.0}, "margin must be"),
])
def test_a_bad_check_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        PaceCheck(**fields)


def test_bad_arguments_get_clear_errors():
    model = cyclic_lm(12)
    speculative, plain = decoders(model, random_head("cp", 3, 12, seed=1))
    with pytest.raises(ValueError, match="one prompt at a time, got a batch of 2"):
        generate_paced(speculative, plain, torch.tensor([[1, 2], [3, 4]]), 4, pace=NEVER)
    with pytest.raises(TypeError, match="pace must be a mtpc.decoding.pace.PaceCheck"):
        generate_paced(speculative, plain, torch.tensor([[1, 2]]), 4, pace=0.01)
    with pytest.raises(TypeError, match="plain must be a mtpc.decoding.PlainDecoder"):
        generate_paced(speculative, speculative, torch.tensor([[1, 2]]), 4, pace=NEVER)


@pytest.mark.slow  # the default run's chain chi-square above fails too when the decided token is dropped
def test_a_hand_over_that_drops_the_decided_token_is_caught():
    """The control for the hand-over itself: the speculative decoder's next token, decided before the stop (after
    a rejected draft, the residual's draw), dropped and drawn again from the target by plain decoding."""
    model, head = sampling_setup(2, VOCAB)
    joint = exact_joint(model, PROMPT, Sampling(temperature=1.0))
    speculative, plain = decoders(model, head)
    gen, sampling = torch.Generator().manual_seed(4), Sampling(temperature=1.0)
    samples = []
    for _ in range(600):  # measured: p ~ 1e-8 (the right hand-over, above: p > 1e-3)
        first = speculative.generate(PROMPT, 3, sampling, generator=gen, pace=after(1))
        ids = first.sequences
        if first.stats.width_per_cycle[-1] == 0 and ids.shape[1] < PROMPT.shape[1] + 3:  # stopped: drop its x_0
            ids = ids[:, :-1]
        left = PROMPT.shape[1] + 3 - ids.shape[1]
        samples.append(plain.generate(ids, left, sampling, generator=gen).sequences[0, -3:].tolist() if left else
                       ids[0, -3:].tolist())
    assert chi_square_pvalue(samples, joint) < 1e-6


# --------------------------------------------------------------------------- mtpc generate

def test_generate_hands_a_head_that_drafts_badly_over_to_plain_decoding(tmp_path, capsys):
    """The shipped byte LM with its ff8 head's weights scrambled: every cycle verifies 8 positions and keeps about
    one token, well below a plain step's rate (measured: 0.62x plain unpaced, 0.95x paced), so the generation
    hands over, says so in one line and prints plain decoding's text; `--no-pace` keeps the head to the end."""
    from pathlib import Path

    from mtpc.cli import main
    from mtpc.heads import load_head, save_head

    root = Path(__file__).resolve().parents[1]
    head = load_head(root / "models" / "heads" / "ff8")
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(p[torch.randperm(p.shape[0], generator=torch.Generator().manual_seed(0))] if p.dim() else p)
    save_head(head, tmp_path / "scrambled")

    def generate(*flags):
        capsys.readouterr()
        code = main(["generate", "--model", str(root / "models" / "byte-lm"), "--max-new-tokens", "96", "--no-stream",
                     "--threads", "1", *flags, "import os\nimport sys\n\n\ndef main("])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        return captured.out, captured.err

    plain, _ = generate()
    out, err = generate("--head", str(tmp_path / "scrambled"), "--window", "8", "--stats")
    assert out == plain
    lines = err.splitlines()
    assert lines[0].startswith("mtpc: pace: handed over to plain decoding after ")
    assert "taking over its caches took" in lines[0]
    assert lines[1].startswith("[speculative] 96 bytes in ")
    out, err = generate("--head", str(tmp_path / "scrambled"), "--window", "8", "--no-pace")
    assert out == plain and "mtpc: pace" not in err


def test_a_plain_decoder_refuses_a_cache_it_cannot_continue_from():
    model = cyclic_lm(12)
    speculative, plain = decoders(model, random_head("cp", 3, 12, seed=1))
    speculative.generate(torch.tensor([[1, 2], [3, 4]]), 4)  # a batch of two in its caches
    cache = speculative.verifier.state.verifier
    with pytest.raises(ValueError, match="continues one row"):
        plain.continue_from(cache, 3, 5, 4)
    text = speculative.generate(torch.tensor([[1, 2]]), 4).sequences[0, :3].tolist()  # [1, 2, first new token]
    cache = speculative.verifier.state.verifier
    with pytest.raises(ValueError, match="length must be 1 .. the cache's"):
        plain.continue_from(cache, 0, 5, 4)
    with pytest.raises(ValueError, match="needs the SlotCache of this model's 2 layers"):
        plain.continue_from(object(), 3, 5, 4)
    out = plain.continue_from(cache, 3, 5, 4)  # its caches hold `text`; 5 follows it
    assert out.sequences.shape == (1, 4) and out.stats.new_tokens == 4
    assert out.sequences[0].tolist() == plain.generate(torch.tensor([text + [5]]), 4).sequences[0, 4:].tolist()


@pytest.mark.slow
def test_a_compiled_generation_hands_over_to_compiled_plain_decoding(tmp_path, monkeypatch):
    """Compiled decoders (the speculative cycle and the plain step through torch.compile, in an empty step store):
    the hand-over copies the caches into the compiled plain decoder's, and the text is plain greedy decoding's."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    from mtpc.heads import load_head

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    root = Path(__file__).resolve().parents[1]
    model = AutoModelForCausalLM.from_pretrained(root / "models" / "byte-lm").eval()
    head = load_head(root / "models" / "heads" / "ff8")
    speculative = SpeculativeDecoder(model, head, compile=True, max_context=256)
    plain = PlainDecoder(model, compile=True, max_context=256)
    ids = torch.tensor([list(b"import os\nimport sys\n\n\ndef main(")])
    expected = PlainDecoder(model).generate(ids, 48).sequences
    out = generate_paced(speculative, plain, ids, 48, pace=after(4))
    assert out.stats.handover is not None and out.stats.handover.cycles == 4
    assert torch.equal(out.sequences, expected)
