"""The library on a GPU: every circuit program against the CPU, the training losses and their
gradients, one `mtpc train` and one `mtpc tiny-lm` step under bf16 autocast, greedy speculative
decoding equal to plain greedy decoding (every structure x bonus x lookup x LoRA), speculative
sampling exact in distribution (and a wrong rule caught), compiled decoding equal to eager, the host
synchronisations per cycle, and `mtpc bench` / `mtpc generate` on CUDA.

Every test is marked `cuda` and skips without a GPU (tests/conftest.py); `pytest -m cuda` runs them
(benchmarks/gpu.sh does, on the GPU machine). The decoding helpers are tests/test_decode.py's, the
loss fixtures tests/test_kl_loss.py's, so both devices are checked on the same cases.
"""

from __future__ import annotations

import copy
import inspect
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import circuitc
from _circuit_reference import random_graph
from _tiny import save_tiny_lm, write_source_corpus
from circuitc import builders
from circuitc.plan import lower
from circuitc.runtime import CompiledCircuit
from mtpc import SpeculativeDecoder
from mtpc.sampling import GREEDY, Sampling
from mtpc.lm.lora import attach_draft_lora
from mtpc.decoding import PlainDecoder
from mtpc.decoding.drafts.proposals import PromptLookup
from mtpc.heads.kl_loss import kl_loss, logits_teacher
from mtpc.heads.nll_loss import mtp_loss
from test_decode import (PROMPT, D, BlockResidualIsTarget, chi_square_pvalue, cyclic_lm, exact_joint, oracle_tables,
                         prompts, random_head, sampling_setup, tiny_lm)
from test_kl_loss import GRAPHS, batch, make_head
from test_runtime import all_assignments, chi_square_p

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parent.parent
CUDA = torch.device("cuda")
TOL = dict(rtol=1e-4, atol=1e-4)  # the same float32 arithmetic, summed in another order


def decoder_accepts_compile() -> bool:
    """`SpeculativeDecoder(..., compile=True)` lands separately; until then its tests skip."""
    return "compile" in inspect.signature(SpeculativeDecoder).parameters


def on_cuda(*tensors):
    return [t.to(CUDA) for t in tensors]


# --------------------------------------------------------------------------- circuit programs

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seed", range(6))
def test_every_circuit_program_matches_the_cpu(seed, dtype):
    graph = random_graph(seed)
    cpu = CompiledCircuit(lower(graph))
    gpu = CompiledCircuit(lower(graph)).to(CUDA)
    gen = torch.Generator().manual_seed(seed)
    theta = (2 * torch.randn(3, cpu.num_params, generator=gen)).to(dtype)
    x = torch.randint(graph.states, (3, graph.variables), generator=gen)
    keep = torch.rand(3, graph.variables, generator=gen) < 0.5
    sums = theta[:, cpu.num_input_params:]
    leaves = cpu.leaf_log_probs(x, theta)
    cases = {
        "log_prob": lambda c, x, keep, theta, sums, leaves: c.log_prob(x, theta),
        "log_marginal": lambda c, x, keep, theta, sums, leaves: c.log_marginal(x, keep, theta),
        "prefix_log_marginals": lambda c, x, keep, theta, sums, leaves: c.prefix_log_marginals(x, theta),
        "conditional_first": lambda c, x, keep, theta, sums, leaves: c.conditional_log_distribution(x, keep, theta, 0),
        "conditional_last": lambda c, x, keep, theta, sums, leaves: c.conditional_log_distribution(
            x, keep, theta, graph.variables - 1),
        "leaf_log_probs": lambda c, x, keep, theta, sums, leaves: c.leaf_log_probs(x, theta),
        "log_prob_from_leaves": lambda c, x, keep, theta, sums, leaves: c.log_prob_from_leaves(leaves, sums),
        "prefix_from_leaves": lambda c, x, keep, theta, sums, leaves: c.prefix_log_marginals_from_leaves(leaves, sums),
    }
    for name, program in cases.items():
        want = program(cpu, x, keep, theta, sums, leaves)
        got = program(gpu, *on_cuda(x, keep, theta, sums, leaves))
        assert got.device.type == "cuda", name
        torch.testing.assert_close(got.cpu(), want, **TOL, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gradients_of_the_programs_match_the_cpu(dtype):
    graph = random_graph(9)
    cpu = CompiledCircuit(lower(graph))
    gpu = CompiledCircuit(lower(graph)).to(CUDA)
    theta = torch.randn(4, cpu.num_params, generator=torch.Generator().manual_seed(1)).to(dtype)
    x = torch.randint(graph.states, (4, graph.variables), generator=torch.Generator().manual_seed(2))
    grads = []
    for circ, t, xs in ((cpu, theta.clone(), x), (gpu, theta.to(CUDA), x.to(CUDA))):
        t.requires_grad_()
        (circ.log_prob(xs, t).sum() + circ.prefix_log_marginals(xs, t).sum()).backward()
        grads.append(t.grad.float().cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=2e-2 if dtype == torch.bfloat16 else 1e-4, atol=1e-3)


@pytest.mark.parametrize("make", [lambda: builders.btree_graph(3, 2, 3), lambda: builders.hmm_graph(3, 2, 3),
                                  lambda: random_graph(4)], ids=["btree", "hmm", "random"])
def test_cuda_samples_follow_the_exact_joint_and_map_matches_the_cpu(make):
    graph = make()
    cpu = CompiledCircuit(lower(graph))
    gpu = CompiledCircuit(lower(graph)).to(CUDA)
    theta = torch.randn(cpu.num_params, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    joint = cpu.log_prob(all_assignments(graph.variables, graph.states), theta).exp().numpy()
    samples = gpu.sample(theta.to(CUDA), 4000, generator=torch.Generator(CUDA).manual_seed(0))[0]
    assert samples.device.type == "cuda"
    assert chi_square_p(samples.cpu(), joint, graph.states) > 1e-4
    batch_theta = torch.randn(3, cpu.num_params, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    assert torch.equal(gpu.map(batch_theta.to(CUDA)).cpu(), cpu.map(batch_theta))


@pytest.mark.parametrize("structure", ["ff", "cp", "hmm", "btree"])
def test_draft_windows_match_the_cpu(structure):
    """The decoder's circuit window (greedy and sampled from the same uniforms) on CUDA equals the CPU's."""
    from mtpc.decoding.drafts.drafting import Drafter

    head = random_head(structure, 4, 12, seed=7)
    gpu_head = copy.deepcopy(head).to(CUDA)
    cpu_drafter, gpu_drafter = (Drafter(h, (2, 3, 4), 0.08, 4, 12) for h in (head, gpu_head))
    for seed in range(3):
        h = torch.randn(2, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))  # a batch of 2
        first = torch.tensor([seed + 2, seed + 3])
        u = torch.rand(2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        for uniforms in (None, u):
            sampling = GREEDY if uniforms is None else Sampling(1.0)
            want = cpu_drafter.circuit_window(h, first, sampling, uniforms)
            got = gpu_drafter.circuit_window(h.to(CUDA), first.to(CUDA), sampling,
                                             None if uniforms is None else u.to(CUDA))
            assert got.tokens.device.type == "cuda" and torch.equal(got.tokens.cpu(), want.tokens)
            assert got.tokens[:, 0].tolist() == [seed + 2, seed + 3] and torch.equal(got.width.cpu(), want.width)


def test_fused_programs_on_cuda_match_eager():
    graph = builders.btree_graph(8, 4, 16)
    eager = circuitc.compile(graph).to(CUDA)
    fused = circuitc.compile(graph, fuse=True).to(CUDA)
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(64, eager.num_params, generator=gen).to(CUDA)
    x = torch.randint(16, (64, 8), generator=gen).to(CUDA)
    fused.warm_up(x, theta)
    torch.testing.assert_close(fused.log_prob(x, theta), eager.log_prob(x, theta), **TOL)
    torch.testing.assert_close(fused.prefix_log_marginals(x, theta), eager.prefix_log_marginals(x, theta), **TOL)


# --------------------------------------------------------------------------- training losses

def loss_of(name, head, hidden, tokens, doc_ids, mask, logits, **kw):
    if name == "nll":
        return mtp_loss(head, hidden, tokens, doc_ids, mask, **kw).loss
    return kl_loss(head, hidden, logits_teacher(logits), tokens, doc_ids, mask, **kw).loss


@pytest.mark.parametrize("loss", ["nll", "kl"])
@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("parameterisation", ["full", "shared"])
def test_losses_and_gradients_match_the_cpu(loss, graph, parameterisation):
    head = make_head(GRAPHS[graph], d=6, dtype=torch.float32, parameterisation=parameterisation)
    tokens, doc_ids, mask, logits = batch(seed=2)
    hidden = torch.randn(2, 9, 6, generator=torch.Generator().manual_seed(3))
    results = []
    for device in ("cpu", CUDA):
        h = copy.deepcopy(head).to(device)
        x = hidden.to(device).requires_grad_()
        value = loss_of(loss, h, x, tokens.to(device), doc_ids.to(device), mask.to(device), logits.float().to(device))
        value.backward()
        results.append((value.detach().cpu(), x.grad.cpu(),
                        [None if p.grad is None else p.grad.cpu() for p in h.parameters()]))
    (want, want_h, want_p), (got, got_h, got_p) = results
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(got_h, want_h, **TOL)
    for a, b in zip(got_p, want_p):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("loss", ["nll", "kl"])
def test_losses_under_bf16_autocast_on_cuda_stay_close(loss):
    head = make_head(builders.btree_graph(4, 3, 4), d=6, dtype=torch.float32).to(CUDA)
    tokens, doc_ids, mask, logits = [t.to(CUDA) for t in batch(seed=3)]
    hidden = torch.randn(2, 9, 6, device=CUDA, requires_grad=True)
    exact = loss_of(loss, head, hidden, tokens, doc_ids, mask, logits.float())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        low = loss_of(loss, head, hidden.bfloat16(), tokens, doc_ids, mask, logits.float())
    low.backward()
    assert low.dtype == torch.float32 and low.item() == pytest.approx(exact.item(), rel=3e-2)
    assert torch.isfinite(hidden.grad).all() and all(torch.isfinite(p.grad).all() for p in head.parameters())


# --------------------------------------------------------------------------- the trainers

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_source_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus):
    """A tiny LM and a head (LoRA on the last layer, NLL + KL) trained two steps on CUDA under bf16."""
    from mtpc.training.trainer import TrainConfig, train

    root = tmp_path_factory.mktemp("trained")
    lm = save_tiny_lm(root / "lm", sharpen=3.0)  # decided greedy choices: no float near-ties
    out = root / "head"
    summary = train(TrainConfig(model=lm, out=str(out), circuit=str(ROOT / "examples" / "btree.pc"),
                                bindings={"n": 4, "r": 4}, data=corpus, seq_len=32, batch_size=4, steps=2,
                                val_every=2, val_sequences=2, precision="bf16", device="cuda", lora_layers=1,
                                loss="nll+kl", progress=False, val_fraction=0.2))
    return lm, str(out), summary


def test_one_train_step_under_bf16_autocast_on_cuda(trained):
    _, out, summary = trained
    assert summary["steps"] == 2 and np.isfinite(summary["val_loss"])
    records = [json.loads(line) for line in (Path(out) / "train_log.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r["loss"]) for r in records if "loss" in r)
    assert (Path(out) / "head.safetensors").is_file() and (Path(out) / "lora").is_dir()


def test_one_tiny_lm_step_under_bf16_autocast_on_cuda(tmp_path, corpus):
    from mtpc.training.tiny_lm import TinyLMConfig, train_tiny_lm

    summary = train_tiny_lm(TinyLMConfig(out=str(tmp_path / "lm"), data=corpus, steps=2, context=48, d_model=32,
                                         layers=2, heads=2, ffn=64, batch_size=4, precision="bf16", device="cuda",
                                         val_fraction=0.2, val_tokens=256, final_val_tokens=512, progress=False,
                                         mtp_circuit=str(ROOT / "examples" / "ff.pc"), mtp_bindings={"n": 4}))
    assert summary["device"].startswith("cuda") and summary["autocast"] == "torch.bfloat16"
    assert np.isfinite(summary["val_bits_per_byte"]) and np.isfinite(summary["mtp_head"]["val_mtp_loss"])


# --------------------------------------------------------------------------- greedy equality

def lora_model(base, k=1):
    model = attach_draft_lora(base, k, rank=4)
    torch.manual_seed(k)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # the draft path now differs from the verifier
    return model.eval()


@pytest.mark.parametrize("structure", ["ff", "cp", "hmm", "btree"])
@pytest.mark.parametrize("window", [None, 2], ids=["adaptive", "w2"])
@pytest.mark.parametrize("lookup", [False, True], ids=["circuit", "lookup"])
@pytest.mark.parametrize("lora", [False, True], ids=["no-lora", "lora"])
def test_greedy_speculative_on_cuda_equals_plain_greedy(structure, window, lookup, lora):
    vocab, n = 12, 3
    cpu_base = cyclic_lm(vocab)
    heads = [random_head(structure, n, vocab, seed=1),  # mostly rejected
             random_head(structure, n, vocab, seed=3, std=0.3, init_from=oracle_tables(cpu_base, n, wrong_last=True))]
    base = copy.deepcopy(cpu_base).to(CUDA)
    model = lora_model(base) if lora else base
    finder = PromptLookup(tokens=4, min_ngram=1, max_ngram=2, prefer="lookup") if lookup else None
    for head in heads:
        decoder = SpeculativeDecoder(model, head.to(CUDA), lora_layers=int(lora), window=window, lookup=finder)
        for i, ids in enumerate(prompts(vocab, 3, seed=0)):
            budget = (1, 6, 19)[i]
            plain = PlainDecoder(model).generate(ids.to(CUDA), budget).sequences  # a PeftModel: adapters off
            out = decoder.generate(ids.to(CUDA), budget)
            assert out.sequences.device.type == "cuda"
            assert torch.equal(out.sequences, plain), (structure, window, lookup, lora, ids.tolist(), budget)
            assert torch.equal(plain.cpu(), PlainDecoder(cpu_base).generate(ids, budget).sequences)


# --------------------------------------------------------------------------- exact in distribution

def cuda_samples(decoder, prompt, count, seed):
    gen = torch.Generator(CUDA).manual_seed(seed)
    return [decoder.generate(prompt, 3, sampling=Sampling(1.0), generator=gen).sequences[0, -3:].tolist()
            for _ in range(count)]


@pytest.mark.parametrize("n, v", [(2, 5), (3, 4)])
def test_speculative_sampling_on_cuda_is_exact_and_a_wrong_residual_is_caught(n, v):
    model, head = sampling_setup(n, v)
    joint = exact_joint(model, PROMPT, Sampling(1.0))  # on the CPU, by enumeration
    model, head, prompt = model.to(CUDA), head.to(CUDA), PROMPT.to(CUDA)
    right = cuda_samples(SpeculativeDecoder(model, head), prompt, 600, seed=1)
    assert chi_square_pvalue(right, joint) > 1e-3
    wrong = cuda_samples(SpeculativeDecoder(model, head, acceptance=BlockResidualIsTarget()), prompt, 600,
                         seed=1)
    assert chi_square_pvalue(wrong, joint) < 1e-6


# --------------------------------------------------------------------------- compiled decoding

def oracle_setup(structure: str, vocab: int, n: int):
    """The cyclic verifier and a head that mostly drafts its continuation, both on CUDA."""
    model = cyclic_lm(vocab)
    head = random_head(structure, n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n))
    return model.to(CUDA), head.to(CUDA)


def test_compiled_plain_decoding_on_cuda_equals_eager():
    model = tiny_lm(16, scale=3.0).to(CUDA)
    compiled = PlainDecoder(model, compile=True)
    for ids in prompts(16, 3, seed=5):
        ids = ids.to(CUDA)
        want = PlainDecoder(model).generate(ids, 20).sequences
        assert torch.equal(compiled.generate(ids, 20).sequences, want)


@pytest.mark.skipif(not decoder_accepts_compile(), reason="SpeculativeDecoder has no compile= yet")
@pytest.mark.parametrize("structure", ["ff", "btree"])
@pytest.mark.parametrize("lookup", [False, True], ids=["circuit", "lookup"])
def test_compiled_speculative_decoding_on_cuda_equals_eager(structure, lookup):
    vocab, n = 12, 3
    model, head = oracle_setup(structure, vocab, n)
    finder = PromptLookup(tokens=4, min_ngram=1, max_ngram=2) if lookup else None
    eager = SpeculativeDecoder(model, head, lookup=finder)
    compiled = SpeculativeDecoder(model, head, lookup=finder, compile=True)
    for ids in prompts(vocab, 3, seed=2):
        ids = ids.to(CUDA)
        want = eager.generate(ids, 24).sequences
        assert torch.equal(compiled.generate(ids, 24).sequences, want)
        assert torch.equal(want, PlainDecoder(model).generate(ids, 24).sequences)


def test_calls_on_cuda_attend_over_the_whole_cache():
    """On CUDA every call attends over all the cache's slots but its spare one: one shape, one CUDA graph
    per compiled step."""
    from mtpc.decoding.cycle.verify import attended_slots

    assert torch.equal(attended_slots(10, 128, torch.device(CUDA)).cpu(), torch.arange(127))


@pytest.mark.skipif(not decoder_accepts_compile(), reason="SpeculativeDecoder has no compile= yet")
def test_one_host_synchronisation_per_cycle():
    """Designed value: each cycle reads its committed tokens back once; the prefill and the final
    sequence add at most two more."""
    vocab, n = 12, 4
    model, head = oracle_setup("btree", vocab, n)
    decoder = SpeculativeDecoder(model, head, compile=True)
    ids = prompts(vocab, 1, seed=1)[0].to(CUDA)
    decoder.generate(ids, 32)  # compile and warm up outside the count
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = decoder.generate(ids, 32)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    assert out.stats.cycles > 1
    assert syncs <= out.stats.cycles + 2, f"{syncs} host synchronisations in {out.stats.cycles} cycles"


# --------------------------------------------------------------------------- the commands on CUDA

def test_bench_on_cuda_times_every_decoder_and_checks_greedy_equality(trained, tmp_path):
    from mtpc.cli.commands import main

    lm, head, _ = trained
    out = tmp_path / "bench"
    status = main(["bench", "--model", lm, "--heads", head, "--corpus", str(ROOT / "mtpc" / "training"),
                   "--num-prompts", "2", "--repeats", "1", "--prompt-len", "16", "--max-new-tokens", "24",
                   "--dtype", "fp64", "--device", "cuda", "--compile", "--peers", "prompt-lookup:4",
                   "--lookup", "both", "--out", str(out), "--no-progress"])
    assert status == 0
    report = json.loads((out / "bench.json").read_text())
    assert report["greedy_identical"] is True
    text = (out / "bench.md").read_text()
    assert "plain (static + compile)" in text and "prompt-lookup" in text


def test_generate_samples_on_cuda(trained, capsys):
    from mtpc.cli.commands import main

    lm, head, _ = trained
    assert main(["generate", "--model", lm, "--head", head, "--device", "cuda", "--temperature", "1",
                 "--max-new-tokens", "16", "--no-stream", "def "]) == 0
    assert capsys.readouterr().out
