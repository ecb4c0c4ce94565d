"""The fixed-shape cycle: one host read per cycle (counted at the decoder's one door, `HostReads`, and as
every tensor -> Python conversion of a whole generation), static caches reused across generations, the
device acceptance against a loop over positions, fixed and adaptive verify widths, and the compiled cycle
step giving the eager output."""

import logging

import pytest
import torch
from torch.overrides import TorchFunctionMode

from mtpc import SpeculativeDecoder
from mtpc.decoding.cycle.acceptance import AcceptanceRule, BlockVerification, accept_window
from mtpc.sampling import GREEDY, Sampling
from mtpc.decoding import PlainDecoder
from mtpc.decoding.cycle.decoder import AdaptiveWidth
from mtpc.decoding.drafts.proposals import PromptLookup
from mtpc.decoding.cycle.verify import Places, cache_length
from test_decode import cyclic_lm, oracle_tables, prompts, random_head, tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread")


def reads_per_generation(decoder, ids, budget, **kwargs):
    before = decoder.host_reads.count
    out = decoder.generate(ids, budget, **kwargs)
    return decoder.host_reads.count - before, out


def mostly_right(structure: str, sample: bool):
    """The cyclic verifier (vocabulary 12), a head of n = 4 whose last position is off by one, and the
    generate arguments of greedy or seeded sampling."""
    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    head = random_head(structure, n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n, wrong_last=True))
    kwargs = {"sampling": Sampling(1.0), "generator": torch.Generator().manual_seed(0)} if sample else {}
    return vocab, model, head, kwargs


@pytest.mark.parametrize("structure", ["ff", "btree"])
@pytest.mark.parametrize("sample", [False, True])
def test_one_host_read_per_cycle(structure, sample):
    vocab, model, head, kwargs = mostly_right(structure, sample)
    lookup = PromptLookup(tokens=5, min_ngram=1, max_ngram=2, prefer="lookup")
    for lookup_ in (None, lookup):
        decoder = SpeculativeDecoder(model, head, lookup=lookup_)
        for ids in prompts(vocab, 2, seed=4):
            reads, out = reads_per_generation(decoder, ids, 17, **kwargs)
            assert out.stats.new_tokens == 17 and max(out.stats.accepted_per_cycle) > 1
            # the prefill reads the first window's x_0 and width; an x_0 that is the budget's last needs no
            # backbone call and no read (its cycle commits the token the previous read brought)
            verified = sum(w > 0 for w in out.stats.width_per_cycle)
            assert reads == 1 + verified and verified >= out.stats.cycles - 1, lookup_


class Conversions(TorchFunctionMode):
    """Counts every tensor -> Python conversion made inside the block (ours, transformers' and torch's)."""

    NAMES = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in self.NAMES
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("structure", ["ff", "btree"])
@pytest.mark.parametrize("sample", [False, True])
def test_at_most_two_conversions_to_python_per_cycle(structure, sample):
    vocab, model, head, kwargs = mostly_right(structure, sample)
    decoder = SpeculativeDecoder(model, head)
    ids = prompts(vocab, 1, seed=4)[0]
    decoder.generate(ids, 40, **kwargs)  # first-call work (plans, caches) is not per cycle
    with Conversions() as conversions:
        out = decoder.generate(ids, 40, **kwargs)
    assert out.stats.cycles >= 10
    assert conversions.count <= 2 * out.stats.cycles, (conversions.count, out.stats.cycles)


def test_static_caches_are_reused_and_grown_only_when_needed():
    model = tiny_lm(12, scale=3.0)
    head = random_head("hmm", 3, 12, seed=2, init_from=model.lm_head.weight)
    decoder = SpeculativeDecoder(model, head)
    ids = torch.tensor([[1, 2, 3]])
    first = decoder.generate(ids, 10).sequences
    state = decoder.verifier.state
    assert torch.equal(decoder.generate(ids, 10).sequences, first) and decoder.verifier.state is state
    long = decoder.generate(ids, 300)  # past the first allocation (rounded up to CACHE_ROUNDING = 64 positions)
    assert decoder.verifier.state is not state and decoder.verifier.max_len >= 3 + 300
    assert long.stats.new_tokens == 300


def test_caches_hold_max_context_from_the_first_generation_on():
    """`max_context`: one allocation for every generation within it (what lets a compiled decoder compile once;
    its compiled run is test_a_compiled_decoder_compiles_once_whatever_the_prompt_lengths), growth past it."""
    model = tiny_lm(12, scale=3.0)
    model.config.max_position_embeddings = 1024  # room for max_context=700 (past the model's context is refused)
    head = random_head("hmm", 3, 12, seed=2, init_from=model.lm_head.weight)
    speculative, plain = SpeculativeDecoder(model, head, max_context=700), PlainDecoder(model, max_context=700)
    for length, budget in GROWING:
        ids = torch.tensor([[1 + i % 11 for i in range(length)]])
        assert torch.equal(speculative.generate(ids, budget).sequences, plain.generate(ids, budget).sequences)
    assert speculative.verifier.allocations == plain.allocations == 1
    assert speculative.verifier.max_len == plain.max_len == 701
    speculative.generate(torch.tensor([[1, 2]]), 800)  # past max_context: the caches grow as before
    assert speculative.verifier.allocations == 2 and speculative.verifier.max_len == 1024
    assert [cache_length(need, 700) for need in (5, 700, 701)] == [701, 701, 1024]
    assert SpeculativeDecoder(model, head).verifier.reserve == 0  # eager: what each generation needs
    assert SpeculativeDecoder(model, head, compile=True).verifier.reserve == 1024  # compiled: the model's context
    for bad in (0, -1, 2.5, True, 2**23):
        with pytest.raises(ValueError, match="max_context must be an integer"):
            PlainDecoder(model, max_context=bad)


def loop_acceptance(target, rule, window, logits, limit, eos, rows, u):
    """The textbook left-to-right loop over positions, with the uniforms given."""
    probs = target.probs(logits) if not target.greedy else logits
    a = 1
    while a < limit and int(window[a - 1]) not in eos:
        token = int(window[a])
        if not target.greedy:
            ok = rule.accept(float(probs[a - 1, token]), float(rows[a, token]), float(u[a - 1]))
        else:
            ok = token == int(logits[a - 1].argmax())
        if not ok:
            return a, True
        a += 1
    return a, False


@pytest.mark.parametrize("sample", [False, True])
def test_device_acceptance_equals_the_loop_over_positions(sample):
    W, V = 5, 6
    target, rule = (Sampling(1.0) if sample else GREEDY), AcceptanceRule()
    for seed in range(200):
        gen = torch.Generator().manual_seed(seed)
        logits = torch.randn(W, V, generator=gen, dtype=torch.float64)
        hidden = torch.randn(W, 3, generator=gen, dtype=torch.float64)
        rows = torch.rand(W, V, generator=gen, dtype=torch.float64)
        rows /= rows.sum(-1, keepdim=True)
        window = torch.randint(0, V, (W,), generator=gen)
        if seed % 3 == 0:  # mostly the verifier's argmax: long accepted runs
            window[1:] = logits[:-1].argmax(-1)
        limit = int(torch.randint(1, W + 1, (), generator=gen))
        eos = {int(window[2])} if seed % 5 == 0 else set()
        eos_ids = torch.tensor(sorted(eos) or [-1])
        u = torch.rand(W, generator=gen, dtype=torch.float64)
        verdict = accept_window(target, rule, window[None], logits[None], hidden[None], torch.tensor([limit]),
                                eos_ids, rows[None], u[None] if sample else None)
        a, rejected = loop_acceptance(target, rule, window, logits, limit, eos, rows, u[:-1])
        assert verdict.accepted.tolist() == [a], seed
        assert torch.equal(verdict.hidden, hidden[a - 1][None])
        probs = target.probs(logits[a - 1]) if sample else logits[a - 1]
        expected = rule.residual(probs, rows[a]) if rejected and sample else probs
        assert torch.allclose(verdict.carried, expected[None]), seed


def loop_block_verification(probs, rows, window, tested, u):
    """Sun et al. 2024's block verification as a loop over the `g` tested positions in Python floats:
    (tokens committed, next target)."""
    g = tested
    w, stop = [1.0], [1.0]
    for i in range(1, g + 1):
        token = int(window[i])
        w.append(min(1.0, w[-1] * float(probs[i - 1, token]) / float(rows[i, token])))
    for i in range(1, g + 1):
        if i == g:
            stop.append(w[g])
        else:
            mass = float((w[i] * probs[i] - rows[i + 1]).clamp_min(0).sum())
            stop.append(mass / (mass + 1 - w[i]) if mass > 0 else 0.0)
    kept = max(i for i in range(g + 1) if i == 0 or float(u[i - 1]) < stop[i])
    if kept == g:
        return 1 + kept, probs[kept]
    residual = (w[kept] * probs[kept] - rows[kept + 1]).clamp_min(0)
    return 1 + kept, residual / residual.sum()


def test_block_verification_equals_the_loop_over_positions():
    """The tensor form of block verification (running weights by a cumulative maximum, every stop
    probability at once) against the algorithm written as a loop, on random windows with budgets and EOS."""
    W, V = 6, 5
    target, rule = Sampling(1.0), BlockVerification()
    kept_more = 0
    for seed in range(300):
        gen = torch.Generator().manual_seed(seed)
        logits = 2 * torch.randn(W, V, generator=gen, dtype=torch.float64)
        hidden = torch.randn(W, 3, generator=gen, dtype=torch.float64)
        rows = torch.softmax(2 * torch.randn(W, V, generator=gen, dtype=torch.float64), -1)
        window = torch.multinomial(rows, 1, generator=gen)[:, 0]  # drafted from the rows, as the circuit does
        if seed % 4 == 0:
            rows[2] = torch.nn.functional.one_hot(window[2], V).double()  # a point-mass (lookup) proposal
        limit = int(torch.randint(1, W + 1, (), generator=gen))
        eos = {int(window[3])} if seed % 5 == 0 else set()
        u = torch.rand(W, generator=gen, dtype=torch.float64)
        verdict = accept_window(target, rule, window[None], logits[None], hidden[None], torch.tensor([limit]),
                                torch.tensor(sorted(eos) or [-1]), rows[None], u[None])
        probs = target.probs(logits)
        tested = next((j - 1 for j in range(1, limit) if int(window[j - 1]) in eos), limit - 1)
        accepted, carried = loop_block_verification(probs, rows, window, tested, u)
        assert verdict.accepted.tolist() == [accepted], seed
        assert torch.equal(verdict.hidden, hidden[accepted - 1][None])
        assert torch.allclose(verdict.carried, carried[None]), seed
        token_wise = accept_window(target, AcceptanceRule(), window[None], logits[None], hidden[None],
                                   torch.tensor([limit]), torch.tensor(sorted(eos) or [-1]), rows[None], u[None])
        kept_more += int(verdict.accepted) > int(token_wise.accepted)
    assert kept_more > 10  # the same uniforms often keep more tokens as a block


@pytest.mark.parametrize("structure", ["ff", "btree"])
def test_a_shorter_window_is_lossless_and_verifies_fewer_tokens(structure):
    vocab, n = 12, 5
    model = cyclic_lm(vocab)
    head = random_head(structure, n, vocab, seed=2, std=0.3, init_from=oracle_tables(model, n))  # mostly right
    lookup = PromptLookup(tokens=3, min_ngram=1, max_ngram=2, prefer="lookup")
    for window in (2, 3):
        for lookup_ in (None, lookup):
            decoder = SpeculativeDecoder(model, head, window=window, lookup=lookup_)
            longest = []
            for ids in prompts(vocab, 2, seed=5):
                out = decoder.generate(ids, 17)
                assert torch.equal(out.sequences, PlainDecoder(model).generate(ids, 17).sequences)
                longest.append(max(out.stats.accepted_per_cycle))
            assert max(longest) == (max(window, 1 + 3) if lookup_ else window), (window, lookup_, longest)


def test_adaptive_widths_follow_the_drafts_confidence_and_stay_lossless():
    """A confident draft verifies wide windows, an unsure one narrow ones; output equals plain greedy."""
    vocab, n = 12, 6
    model = cyclic_lm(vocab)
    confident = [3 * t for t in oracle_tables(model, n)]
    right = random_head("btree", n, vocab, seed=2, std=0.3, init_from=confident)  # decided, mostly right
    unsure = random_head("btree", n, vocab, seed=2, std=0.3, init_from=[0.05 * t for t in oracle_tables(model, n)])
    widths = {}
    for name, head in (("right", right), ("unsure", unsure)):
        decoder = SpeculativeDecoder(model, head, window=AdaptiveWidth(position_cost=0.3))
        assert decoder.layout.widths == (2, 3, 5, 6)
        used = []
        for ids in prompts(vocab, 3, seed=5):
            out = decoder.generate(ids, 23)
            assert torch.equal(out.sequences, PlainDecoder(model).generate(ids, 23).sequences)
            used += [w for w in out.stats.width_per_cycle if w]
        widths[name] = sum(used) / len(used)
    assert widths["right"] > 4.5 and widths["unsure"] < 3, widths
    with pytest.raises(ValueError, match="AdaptiveWidth widths must be integers from 2 to the circuit's 6"):
        SpeculativeDecoder(model, right, window=AdaptiveWidth(widths=(2, 7)))
    with pytest.raises(ValueError, match="position_cost"):
        AdaptiveWidth(position_cost=-1)


@pytest.mark.slow  # 13 s; the default run samples width-2 windows exactly in test_batched's adaptive widths
def test_sampling_with_a_shorter_window_is_exact_and_a_wrong_rule_is_caught():
    from test_decode import PROMPT, BlockResidualIsTarget, chi_square_pvalue, exact_joint, sampling_setup, speculative_samples

    model, head = sampling_setup(3, 5)
    joint = exact_joint(model, PROMPT, Sampling(1.0))
    right = SpeculativeDecoder(model, head, window=2)
    assert chi_square_pvalue(speculative_samples(right, PROMPT, 600, seed=1), joint) > 1e-3
    wrong = SpeculativeDecoder(model, head, window=2, acceptance=BlockResidualIsTarget())
    assert chi_square_pvalue(speculative_samples(wrong, PROMPT, 600, seed=1), joint) < 1e-6


def test_a_window_outside_the_circuit_is_refused():
    vocab = 12
    model = cyclic_lm(vocab)
    head = random_head("ff", 4, vocab, seed=1)
    for window in (1, 5, 2.0, True, "3"):
        with pytest.raises(ValueError, match="window must be an integer from 2 to the circuit's 4"):
            SpeculativeDecoder(model, head, window=window)
    assert SpeculativeDecoder(model, head, window=4).layout.widths == (4,)
    assert SpeculativeDecoder(model, head).layout.widths == (4,)
    assert SpeculativeDecoder(model, head, window=AdaptiveWidth()).layout.widths == (2, 3, 4)


@pytest.mark.slow
@pytest.mark.parametrize("window, first_token", [(None, False), (2, True)])  # True: a head that reads x_0
def test_compiled_cycle_equals_eager(window, first_token):
    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    head = random_head("btree", n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n, wrong_last=True))
    if first_token:  # through the embedding and a residual MLP
        generator = torch.Generator().manual_seed(3)
        with torch.no_grad():
            head.read_first_token(4).first_embedding.normal_(0, 0.3, generator=generator)
            head.first_mlp_out.normal_(0, 0.3, generator=generator)
    lookup = PromptLookup(tokens=5, min_ngram=1, max_ngram=2)
    compiled = SpeculativeDecoder(model, head, lookup=lookup, window=window, compile=True)
    eager = SpeculativeDecoder(model, head, lookup=lookup, window=window)
    for i, ids in enumerate(prompts(vocab, 3, seed=9)):
        plain = PlainDecoder(model).generate(ids, 19).sequences
        assert torch.equal(compiled.generate(ids, 19).sequences, plain)
        verify_steps = dict(compiled.compiled.verify.compiled)
        gen = [torch.Generator().manual_seed(i) for _ in range(2)]
        sampled = [d.generate(ids, 19, sampling=Sampling(0.7), generator=g).sequences
                   for d, g in zip((compiled, eager), gen)]
        assert torch.equal(*sampled)  # same draws (the circuit's at 0.7 too), same float64 verdicts
        # the verify steps (the model's call) read no sampling setting: the greedy cycles' serve the sampled ones
        assert compiled.compiled.verify.fresh == 0 and compiled.compiled.verify.compiled == verify_steps
        assert compiled.compiled.decide.fresh == (2 if i == 0 else 0)  # a decide step per width: circuit, lookup


@pytest.mark.slow
def test_compiled_sampling_is_exact_and_a_wrong_rule_is_caught():
    """The compiled cycle (two graphs: the verify call; the acceptance and the next circuit window) against
    exact enumeration, with the wrong residual that must fail on the same compiled path."""
    from test_decode import PROMPT, BlockResidualIsTarget, chi_square_pvalue, exact_joint, sampling_setup, speculative_samples

    model, head = sampling_setup(3, 5)
    decoder = SpeculativeDecoder(model, head, compile=True)
    joint = exact_joint(model, PROMPT, Sampling(1.0))
    assert chi_square_pvalue(speculative_samples(decoder, PROMPT, 600, seed=1), joint) > 1e-3
    wrong = SpeculativeDecoder(model, head, compile=True, acceptance=BlockResidualIsTarget())
    assert chi_square_pvalue(speculative_samples(wrong, PROMPT, 600, seed=1), joint) < 1e-6


@pytest.mark.slow
def test_one_compiled_graph_serves_every_attended_length():
    """Each cycle attends over one more stretch of the cache (`Places.kv_slots`); that length is the
    compiled step's one dynamic dimension, so cycles after the warm-up never compile again."""
    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    head = random_head("btree", n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n, wrong_last=True))
    decoder = SpeculativeDecoder(model, head, compile=True)
    torch._dynamo.reset()  # a torch without isolate_recompiles (2.11) keeps earlier tests' variants in one list
    with torch._dynamo.config.patch(error_on_recompile=True):
        for ids in (torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5, 6, 7, 8, 9]])):  # one cache allocation for both
            out = decoder.generate(ids, 40)
            assert torch.equal(out.sequences, PlainDecoder(model).generate(ids, 40).sequences)
            assert out.stats.cycles > 10
    assert decoder.verifier.allocations == 1


# prompt lengths and budgets whose totals cross 128, 256 and 512 positions
GROWING = ((3, 40), (100, 100), (120, 300), (60, 600))


@pytest.mark.slow
def test_a_compiled_decoder_compiles_once_whatever_the_prompt_lengths(caplog):
    """Caches that hold `max_context` positions from the first generation: totals crossing several powers of
    two never allocate or compile again (they did at each doubling), and the one compile says so in a line."""
    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    model.config.max_position_embeddings = 1024  # room for max_context=1024 (past the model's context is refused)
    head = random_head("btree", n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n))
    decoder = SpeculativeDecoder(model, head, compile=True, max_context=1024)
    torch._dynamo.reset()  # see test_one_compiled_graph_serves_every_attended_length
    with caplog.at_level(logging.WARNING, logger="mtpc.decoding.cycle.decoder"):
        first = decoder.generate(torch.tensor([[1, 2, 3]]), 40)
    notices = [r.getMessage() for r in caplog.records if r.name == "mtpc.decoding.cycle.decoder"]  # not the compile lines
    assert len(notices) == 1 and "for caches of 1,025 positions" in notices[0], notices
    assert "later generations in this process reuse it" in notices[0] and first.stats.compile_seconds > 0
    lines = len(caplog.records)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for length, budget in GROWING[1:]:
            ids = torch.tensor([[1 + i % 11 for i in range(length)]])
            out = decoder.generate(ids, budget)
            assert torch.equal(out.sequences, PlainDecoder(model).generate(ids, budget).sequences)
    assert decoder.verifier.allocations == 1 and len(caplog.records) == lines  # nothing compiled, nothing said


class ScaledStep:
    """A step whose variants share one code object (the guard on `self.k` tells them apart), like the
    `decide_step` of many decoders in one process."""

    def __init__(self, k: int):
        self.k, self.eager_calls = k, 0

    def __call__(self, x):
        if not torch.compiler.is_compiling():  # the body runs in Python only when dynamo fell back to eager
            self.eager_calls += 1
        return x * self.k


@pytest.mark.slow
def test_every_compiled_step_keeps_its_own_variants():
    from mtpc.decoding.compiling import compile_step

    steps = [ScaledStep(k) for k in range(12)]  # past dynamo's default limit of 8 variants per code object
    x = torch.ones(3)
    for step in steps:
        compiled = compile_step(step.__call__, False)
        assert torch.equal(compiled(x), x * step.k) and torch.equal(compiled(x), x * step.k)
    assert [s.eager_calls for s in steps] == [0] * 12


def test_isolation_options_follow_what_torch_compile_takes():
    from mtpc.decoding.compiling import RECOMPILE_LIMIT, isolation_options

    torch_2_11 = ("model", "fullgraph", "dynamic", "backend", "mode", "options", "disable")
    torch_2_13 = (*torch_2_11, "name", "recompile_limit", "isolate_recompiles")
    assert isolation_options(torch_2_11) == {"dynamic": False}  # an unknown keyword would be a TypeError there
    assert isolation_options(torch_2_13) == {"dynamic": False, "isolate_recompiles": True,
                                             "recompile_limit": RECOMPILE_LIMIT}


@pytest.mark.slow
def test_a_raised_recompile_limit_keeps_shared_variants_compiled_where_torch_cannot_isolate_them():
    """What a torch without `isolate_recompiles` (2.11) gets: one code object's variants in dynamo's shared
    list, its limit raised around each call; the control, the default limit, falls back to eager."""
    from mtpc.decoding.compiling import with_recompile_limit

    def run(wrap) -> list[int]:
        torch._dynamo.reset()
        steps = [ScaledStep(k) for k in range(12)]  # past dynamo's default limit of 8 variants per code object
        x = torch.ones(3)
        for step in steps:
            compiled = wrap(torch.compile(step.__call__, dynamic=False))
            assert torch.equal(compiled(x), x * step.k) and torch.equal(compiled(x), x * step.k)
        return [s.eager_calls for s in steps]

    assert run(with_recompile_limit) == [0] * 12
    assert sum(run(lambda compiled: compiled)) > 0


PROBE_COUNT = """
import sys
probes = []
sys.addaudithook(lambda event, args: probes.append(1) if event == "subprocess.Popen" and "LoadLibrary" in str(args[1])
                 else None)
import torch
from mtpc.decoding.compiling import compile_step
function = lambda x: (x * 2).sin()
if sys.argv[1] == "ours":
    step = compile_step(function, False)
else:
    step = torch.compile(function, options={"cpp_wrapper": True}, dynamic=False)
assert torch.allclose(step(torch.ones(3)), torch.ones(3).mul(2).sin())
print(len(probes))
"""


@pytest.mark.slow
def test_a_compiled_step_skips_most_of_inductors_per_process_isa_checks():
    """Inductor checks the C++ compiler against each vector ISA of the CPU in every process, one child
    Python each (a few tenths of a second each, in every `mtpc generate --compile`); compile_step's options skip the
    base checks and keep the narrower ones. Counted in fresh processes, the code still right."""
    import subprocess
    import sys

    def probes(options: str) -> int:
        done = subprocess.run([sys.executable, "-c", PROBE_COUNT, options], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return int(done.stdout.split()[-1])

    assert probes("ours") < probes("inductor's default")


@pytest.mark.parametrize("sample", [False, True])
def test_each_cycle_step_traces_as_one_graph(sample):
    """Window, Places, StepOutput and the packet are pytrees of tensors: dynamo sees the verify step (the
    model's call) as one graph and the decide step (acceptance, next draft) as another, without a break."""
    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    head = random_head("btree", n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n))
    decoder = SpeculativeDecoder(model, head)
    target = Sampling(0.7) if sample else GREEDY  # sampling: the circuit drafts at 0.7 too
    logits, h = decoder.verifier.start(torch.tensor([[1, 2, 3], [0, 4, 5]]), [0, 1], 16)  # a batch of 2
    uniforms = torch.rand(2, 2 * n + decoder.layout.span, dtype=torch.float64) if sample else None
    window = decoder.drafter.circuit_window(h, logits.argmax(-1), target, None if uniforms is None else uniforms[:, :n])
    places = decoder.verifier.places(n)
    verify_args = (window.tokens, window.shape, places)
    logits, hidden = decoder.verify_step(*verify_args)
    decide_args = (target, window, places.slots, logits, hidden, torch.tensor([n, n]), torch.tensor([-1]), uniforms)
    decoder.decide_step(*decide_args)  # the draft program's plans are built on first use
    for step, args in ((decoder.verify_step, verify_args), (decoder.decide_step, decide_args)):
        explained = torch._dynamo.explain(step)(*args)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_a_call_attends_over_the_filled_slots_only():
    """The verify call reads the cache's first `S` slots, `S` the furthest slot a row writes rounded up to
    `ATTENTION_ROUNDING` (at most the whole cache), and its logits are those over the whole cache."""
    from mtpc.decoding.cycle.verify import ATTENTION_ROUNDING, attended_slots

    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    head = random_head("btree", n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n))
    decoder = SpeculativeDecoder(model, head)
    logits, h = decoder.verifier.start(torch.tensor([[1, 2, 3, 4, 5], [0, 0, 4, 5, 6]]), [0, 2], 60)
    decoder.verifier.commit([20, 13])
    places = decoder.verifier.places(n)
    assert ATTENTION_ROUNDING == 16 and decoder.verifier.max_len == 128
    assert torch.equal(places.kv_slots, torch.arange(32))  # row 0 writes slots 25 .. 28
    window = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10]])
    attended = decoder.verifier.forward(window, places)
    whole = decoder.verifier.forward(window, Places(places.slots, places.positions, places.starts, torch.arange(128)))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(attended, whole))
    cut = decoder.verifier.forward(window, Places(places.slots, places.positions, places.starts, torch.arange(26)))
    assert not torch.allclose(cut[0][0, 1:], whole[0][0, 1:], atol=1e-3)  # row 0's later queries lost their slots
    assert attended_slots(120, 128, torch.device("cpu")).shape == (127,)  # never the cache's spare slot
    assert [cache_length(need) for need in (62, 127, 128, 300, 511)] == [128, 128, 256, 512, 512]


@pytest.mark.slow
def test_a_compiled_warm_up_that_reaches_the_end_of_the_cache():
    """A budget that ends within the last rounding of the cache: the warm-up's attended length is as long as
    any later one can be, and it must not become the graph's constant (the spare slot of `cache_length`)."""
    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    head = random_head("btree", n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n))
    decoder = SpeculativeDecoder(model, head, compile=True, max_context=127)
    ids = torch.tensor([[1 + i % 11 for i in range(120)]])
    torch._dynamo.reset()  # see test_one_compiled_graph_serves_every_attended_length
    with torch._dynamo.config.patch(error_on_recompile=True):
        out = decoder.generate(ids, 3)  # 120 + 3 + n = 127 positions: a 128-slot cache
    assert decoder.verifier.max_len == 128
    assert torch.equal(out.sequences, PlainDecoder(model).generate(ids, 3).sequences)
