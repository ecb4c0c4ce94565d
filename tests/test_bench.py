"""`mtpc bench` end to end on a tiny random LM with heads saved like `mtpc train` saves them: the report
files and fields, the latency breakdown, prompts from files and corpora, and the greedy-equality check
catching a decoder that commits a wrong token."""

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from circuitc import builders
from mtpc import MTPHead, SpeculativeDecoder, save_head
from mtpc.lm.lora import attach_draft_lora
from mtpc.bench.config import BenchConfig
from mtpc.bench.report import format_table
from mtpc.bench.prompts import load_prompts
from mtpc.bench.run import run_bench
from mtpc.decoding.clock import split_phases
from mtpc.errors import InputError
from mtpc.cli.commands import main
from mtpc.lm.tokenizer import ByteTokenizer

D, N = 32, 4


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_model(tok: ByteTokenizer):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=tok.vocab_size, hidden_size=D, intermediate_size=2 * D, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    return LlamaForCausalLM(config).eval()


def save_trained_like(head: MTPHead, folder, circuit: str, bindings: dict, model=None) -> str:
    """A head folder as `mtpc train` writes it: head files, train_config.json, lora/ when adapted."""
    save_head(head, folder)
    lora = 0
    if model is not None:
        model.save_pretrained(str(folder / "lora"))
        lora = 1
    (folder / "train_config.json").write_text(json.dumps({"circuit": circuit, "bindings": bindings,
                                                          "lora_layers": lora, "steps": 3}))
    return str(folder)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    tok = ByteTokenizer()
    model = tiny_model(tok)
    model.save_pretrained(root / "lm")
    tok.save(root / "lm")
    unembed = model.lm_head.weight.detach()
    torch.manual_seed(1)
    ff = MTPHead(builders.ff_graph(N, 256), D, init_from=unembed)
    cp = MTPHead(builders.cp_graph(N, 2, 256), D, init_from=unembed, sum_init_std=0.5)
    heads = {"ff": save_trained_like(ff, root / "ff4", "examples/ff.pc", {"n": N}),
             "cp": save_trained_like(cp, root / "cp4", "examples/cp.pc", {"n": N, "r": 2})}
    adapted = attach_draft_lora(tiny_model(tok), 1, rank=2)
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)  # a draft path that differs from the verifier
    btree = MTPHead(builders.btree_graph(N, 2, 256), D, init_from=unembed, sum_init_std=0.5)
    heads["lora"] = save_trained_like(btree, root / "btree4-lora1", "examples/btree.pc", {"n": N, "r": 2}, adapted)
    prompts = root / "prompts.txt"
    prompts.write_text("def main():\n\nimport os\nclass A:\nfor i in range(3):\n# comment\nx = 1\nreturn x\n")
    return {"root": root, "model": str(root / "lm"), "heads": heads, "prompts": str(prompts), "tok": tok}


def config(setup, **kw) -> BenchConfig:
    base = dict(model=setup["model"], heads=[setup["heads"]["ff"], setup["heads"]["cp"]], prompts=setup["prompts"],
                num_prompts=2, repeats=2, max_new_tokens=10, warmup_tokens=4, progress=False)
    return BenchConfig(**{**base, **kw})


def test_cli_end_to_end_writes_json_markdown_and_plot(setup, capsys):
    out = setup["root"] / "out"
    code = main(["bench", "--model", setup["model"], "--heads", *setup["heads"].values(), "--prompts",
                 setup["prompts"], "--num-prompts", "2", "--repeats", "2", "--max-new-tokens", "12",
                 "--out", str(out), "--no-progress", "--threads", "1"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "plain (autoregressive)" in printed and "cp4" in printed and "btree4-lora1" in printed
    assert "identical to plain greedy decoding for every prompt: yes" in printed
    report = json.loads((out / "bench.json").read_text())
    assert report["greedy_identical"] is True
    assert report["plain"]["mu_acc"]["mean"] == 1.0
    assert 4 <= report["plain"]["tokens"] <= 4 * 12  # 2 sets x 2 prompts (fewer if one ends with EOS)
    rows = {r["label"]: r for r in report["heads"]}
    assert set(rows) == {"ff4", "cp4", "btree4-lora1"}
    for r in rows.values():
        assert len(r["per_set"]) == 2 and r["tokens"] == report["plain"]["tokens"]
        assert 1.0 <= r["mu_acc"]["mean"] <= N
        assert r["mu_lat"]["mean"] > 0 and r["tok_s"]["mean"] > 0
        assert r["max_tok_s"] == pytest.approx(N / r["mu_lat"]["mean"])
        assert r["greedy_check"] == {"compared": 4, "identical": 4, "mismatches": []}
        assert r["ff_reference"] == "ff4" and r["speedup_ff"]["mean"] > 0
        assert set(r["phases_ms"]) == {"head", "circuit", "backbone", "accept"}
        assert all(v > 0 for v in r["phases_ms"].values())
        # the hooked breakdown accounts for the decoder's own cycle time
        assert sum(r["phases_ms"].values()) / 1e3 == pytest.approx(r["mu_lat"]["mean"], rel=0.5)
    assert rows["ff4"]["speedup_ff"]["mean"] == 1.0
    assert rows["btree4-lora1"]["lora_layers"] == 1 and rows["cp4"]["structure"] == "cp"
    markdown = (out / "bench.md").read_text()
    assert "| plain (autoregressive) |" in markdown and "tradeoff.png" in markdown and "**yes**" in markdown
    assert (out / "tradeoff.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class CommitsAWrongDraft(SpeculativeDecoder):
    """A broken decoder: its output has one generated byte replaced, as if a wrong draft had been accepted."""

    def generate(self, input_ids, max_new_tokens, *args, **kw):
        out = super().generate(input_ids, max_new_tokens, *args, **kw)
        out.sequences[0, -1] = (out.sequences[0, -1] + 1) % 256
        return out


def test_greedy_check_flags_a_decoder_that_commits_a_wrong_token(setup):
    report = run_bench(config(setup), decoder_cls=CommitsAWrongDraft)
    assert report["greedy_identical"] is False
    for row in report["heads"]:
        check = row["greedy_check"]
        assert check["identical"] == 0 and len(check["mismatches"]) == 4
        assert all(m["first_difference"] > 0 for m in check["mismatches"])
    assert "MISMATCH" in format_table(report)


def test_sampling_mode_and_decoder_variants(setup):
    report = run_bench(config(setup, mode="sample", windows=(None, "adaptive"), temperature=0.8, top_p=0.95))
    labels = [r["label"] for r in report["heads"]]
    assert labels == ["ff4", "ff4/adaptive", "cp4", "cp4/adaptive"]
    assert report["greedy_identical"] is None and all("greedy_check" not in r for r in report["heads"])
    assert {r["ff_reference"] for r in report["heads"]} == {"ff4", "ff4/adaptive"}
    assert [r["width"] for r in report["heads"]] == [N, "adaptive", N, "adaptive"]
    rules = run_bench(config(setup, mode="sample", heads=[setup["heads"]["ff"], setup["heads"]["cp"]],
                             acceptance=("block", "token")))
    assert [r["label"] for r in rules["heads"]] == ["ff4", "ff4/token", "cp4", "cp4/token"]
    assert [r["acceptance"] for r in rules["heads"]] == ["block", "token"] * 2
    assert [r["ff_reference"] for r in rules["heads"]] == ["ff4", "ff4/token"] * 2  # FF under the same rule
    assert rules["config"]["acceptance"] == ["block", "token"]
    built = []

    class Recorded(SpeculativeDecoder):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self.settings.draft_temperature)

    heats = run_bench(config(setup, mode="sample", temperature=0.7, heads=[setup["heads"]["cp"]],
                             draft_temperatures=(None, 1.0)), decoder_cls=Recorded)
    assert [r["label"] for r in heats["heads"]] == ["cp4", "cp4/draft-t1"] and built == [None, 1.0]
    assert [r["draft_temperature"] for r in heats["heads"]] == [None, 1.0]
    assert heats["config"]["draft_temperatures"] == [None, 1.0]
    greedy = run_bench(config(setup, heads=[setup["heads"]["cp"]]))
    assert [r["label"] for r in greedy["heads"]] == ["cp4"] and greedy["greedy_identical"] is True
    assert all(r["ff_reference"] is None and "speedup_ff" not in r for r in greedy["heads"])


def test_per_position_acceptance_counts_every_drafted_token(setup, tmp_path):
    report = run_bench(config(setup, out=str(tmp_path)))
    for row in report["heads"]:
        for metrics in row["per_set"]:
            counts = metrics["position_counts"]
            assert len(counts) == N - 1 and all(0 <= acc <= tested for tested, acc in counts)
            assert sum(acc for _, acc in counts) == metrics["tokens"] - metrics["cycles"]  # drafted tokens kept
            assert [t for t, _ in counts] == sorted((t for t, _ in counts), reverse=True)  # fewer reach later ones
        rates = row["position_acceptance"]
        assert len(rates) == N - 1 and all(r is None or 0 <= r <= 1 for r in rates)
    assert "| decoder | d1 | d2 | d3 |" in (tmp_path / "bench.md").read_text()


def test_windows_are_compared_side_by_side_and_a_wider_one_is_refused(setup):
    report = run_bench(config(setup, heads=[setup["heads"]["ff"]], windows=(None, 2)))
    rows = {r["label"]: r for r in report["heads"]}
    assert list(rows) == ["ff4", "ff4/w2"] and report["greedy_identical"] is True
    assert (rows["ff4"]["width"], rows["ff4/w2"]["width"]) == (N, 2)
    assert rows["ff4/w2"]["mu_acc"]["mean"] <= 2 and rows["ff4/w2"]["max_tok_s"] > 0
    assert rows["ff4/w2"]["ff_reference"] == "ff4/w2"  # FF is compared with FF at the same settings
    with pytest.raises(InputError, match="--window 5: the head ff4 verifies windows of 2 to 4 tokens"):
        run_bench(config(setup, windows=(5,)))


def test_trees_are_compared_beside_the_chain(setup, tmp_path):
    report = run_bench(config(setup, heads=[setup["heads"]["cp"]], trees=(None, 6), lookup=(False, True),
                              lookup_tokens=3, out=str(tmp_path)))
    rows = {r["label"]: r for r in report["heads"]}
    assert list(rows) == ["cp4/tree6", "cp4/tree6/lookup", "cp4", "cp4/lookup"] and report["greedy_identical"] is True
    assert rows["cp4/tree6"]["tree"] == 6 and rows["cp4"]["tree"] is None
    assert rows["cp4/tree6/lookup"]["lookup"] and max(r["max_tok_s"] for r in rows.values()) > 0
    table = (tmp_path / "bench.md").read_text()
    assert "| cp4/tree6 |" in table and "Tree rows are left out" in table


def test_split_phases_attributes_intervals_and_skips_the_prefill():
    stamps = [("backbone_start", 0.0), ("backbone_end", 1.0), ("backbone_end", 1.5),  # prefill
              ("head_start", 2.0), ("head_end", 2.25), ("backbone_start", 3.0), ("backbone_end", 4.0),
              ("backbone_end", 4.5), ("head_start", 5.0), ("head_end", 5.5), ("end", 6.0)]
    phases, total = split_phases(stamps)
    assert phases == {"head": 0.75, "circuit": 0.75 + 0.5, "backbone": 1.5, "accept": 0.5 + 0.5}
    assert total == 4.5 == sum(phases.values())


def test_prompts_from_a_corpus_are_held_out_spans(setup, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(40):
        (corpus / f"m{i}.py").write_text("".join(f"line {i} {j} = {j * i}\n" for j in range(60)))
    cfg = config(setup, prompts=None, corpus=str(corpus), prompt_len=24, num_prompts=3, repeats=2, val_fraction=0.3)
    prompts = load_prompts(cfg, setup["tok"])
    assert len(prompts) == 6 and all(len(p) == 24 for p in prompts)
    assert len({tuple(p) for p in prompts}) == 6
    from mtpc.training.data import load_documents, split_documents

    train, held_out = split_documents(load_documents(str(corpus), setup["tok"])[0], 0.3)
    text = lambda docs: [d.tokens.tolist() for d in docs]  # noqa: E731
    inside = lambda p, docs: any(str(p)[1:-1] in str(d) for d in docs)  # noqa: E731
    assert all(inside(p, text(held_out)) and not inside(p, text(train)) for p in prompts)  # held-out only
    with pytest.raises(ValueError, match="spans"):
        load_prompts(config(setup, prompts=None, corpus=str(corpus), prompt_len=5000), setup["tok"])


def test_bad_configurations_are_refused(setup, tmp_path):
    with pytest.raises(ValueError, match="need 100"):
        run_bench(config(setup, num_prompts=50))
    with pytest.raises(ValueError, match="mode"):
        run_bench(config(setup, mode="beam"))
    with pytest.raises(ValueError, match="distinct names"):
        run_bench(config(setup, heads=[setup["heads"]["ff"], setup["heads"]["ff"]]))
    assert main(["bench", "--model", setup["model"], "--heads", setup["heads"]["ff"]]) == 2  # no prompts


# --------------------------------------------------------------------------- peers, lookup, repetition

def test_peers_lookup_variants_and_repetition_are_reported_and_checked(setup):
    """transformers' prompt lookup, assisted generation (the LM assisting itself: every candidate is
    accepted) and static-cache generate, heads with and without lookup, all on the same prompts; greedy outputs all identical."""
    report = run_bench(config(setup, heads=[setup["heads"]["ff"]], lookup=(False, True), lookup_tokens=3,
                              peers=("prompt-lookup:3", f"assisted:{setup['model']}", "static"), max_new_tokens=16))
    peers = {r["label"]: r for r in report["peers"]}
    assert set(peers) == {"hf prompt-lookup:3", "hf assisted:lm", "hf static cache"}
    assert peers["hf static cache"]["mu_acc"]["mean"] == 1  # plain decoding: one token per forward
    assert [r["label"] for r in report["heads"]] == ["ff4", "ff4/lookup"]
    assert report["greedy_identical"] is True
    for r in [*peers.values(), *report["heads"]]:
        assert r["greedy_check"]["identical"] == r["greedy_check"]["compared"] == 4
        assert r["tokens"] == report["plain"]["tokens"] and r["speedup_plain"]["mean"] > 0
        assert r["repetition"] == report["plain"]["repetition"]  # greedy: the same outputs
    assert peers["hf assisted:lm"]["mu_acc"]["mean"] >= 2  # its own draft: every candidate accepted
    assert report["heads"][1]["lookup"] and not report["heads"][0]["lookup"]
    assert report["heads"][0]["lookup_share"] == 0 <= report["heads"][1]["lookup_share"] <= 1
    table = format_table(report)
    assert "hf prompt-lookup:3" in table and "rep8" in table and "ff4/lookup" in table


def test_generate_peer_is_transformers_plain_generate_checked_like_every_peer(setup, capsys):
    """`--peers generate`: transformers' own `generate()` with its default (dynamic) cache, the baseline a user
    has: a row of the table and the JSON like the other peers, its greedy output checked against plain
    decoding's; sampling with the same temperature / top-p as the other decoders."""
    out = setup["root"] / "generate-peer"
    code = main(["bench", "--model", setup["model"], "--heads", setup["heads"]["ff"], "--prompts", setup["prompts"],
                 "--num-prompts", "2", "--repeats", "2", "--max-new-tokens", "10", "--peers", "generate", "static",
                 "--out", str(out), "--no-progress", "--threads", "1"])
    assert code == 0 and "hf generate" in capsys.readouterr().out
    report = json.loads((out / "bench.json").read_text())
    peers = {r["label"]: r for r in report["peers"]}
    assert list(peers) == ["hf generate", "hf static cache"] and report["config"]["peers"] == ["generate", "static"]
    plain_generate = peers["hf generate"]
    assert plain_generate["kind"] == "generate" and "dynamic cache" in plain_generate["detail"]
    assert plain_generate["greedy_check"] == {"compared": 4, "identical": 4, "mismatches": []}
    assert plain_generate["mu_acc"]["mean"] == 1 and plain_generate["tokens"] == report["plain"]["tokens"]
    assert plain_generate["speedup_plain"]["mean"] > 0 and report["greedy_identical"] is True
    assert "| hf generate |" in (out / "bench.md").read_text()
    sampled = run_bench(config(setup, heads=[setup["heads"]["ff"]], mode="sample", temperature=0.8, top_p=0.9,
                               peers=("generate",)))
    [row] = sampled["peers"]
    assert row["label"] == "hf generate" and "greedy_check" not in row and row["tokens"] > 0


def test_repetition_filter_drops_prompts_for_every_decoder(setup):
    from mtpc.bench.timing import Run
    from mtpc.bench.report import drop_repetitive

    def run(continuation):
        return Run(len(continuation), len(continuation), 1.0, {}, [0, 1, 2] + continuation, 3)

    loop, fresh = run([7, 8] * 10), run(list(range(10, 30)))
    runs = {"plain": [[loop, fresh], [loop]], "ff": [[fresh, loop], [fresh]]}
    kept, dropped = drop_repetitive(runs, 0.5)
    assert kept == {"plain": [[fresh]], "ff": [[loop]]}  # same prompts left out for every decoder
    assert [(d["set"], d["prompt"]) for d in dropped] == [(0, 0), (1, 0)] and dropped[0]["repetition"] > 0.5
    report = run_bench(config(setup, heads=[setup["heads"]["ff"]], max_repetition=1.0))
    assert report["repetition_filter"] == {"max_repetition": 1.0, "dropped": []}


def test_repetition_counts_repeated_ngrams_of_the_continuation():
    from mtpc.bench.prompts import repetition

    assert repetition(list(range(10)), list(range(10, 30))) == 0.0
    assert repetition([1, 2], [1, 2] * 20, size=2) == pytest.approx(39 / 40)  # all but the first, [2, 1]
    assert repetition(list(range(8)), list(range(8)), size=8) == pytest.approx(1 / 8)  # only the last 8-gram
    assert repetition([5], [], size=8) == 0.0


def test_plain_decoder_equals_transformers_generate_and_draws_by_its_generators(setup):
    from transformers import AutoModelForCausalLM

    from mtpc.decoding import PlainDecoder
    from mtpc.sampling import Sampling

    model = AutoModelForCausalLM.from_pretrained(setup["model"]).eval()
    decoder = PlainDecoder(model)  # reused: its caches are reused from prompt to prompt
    for text in ("def f(x):", "import os\n"):
        ids = torch.tensor([setup["tok"].encode(text, add_bos=True)])
        theirs = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False,
                                eos_token_id=None, pad_token_id=0)
        assert torch.equal(decoder.generate(ids, 20).sequences, theirs)
        one, alone = (decoder.generate(ids, 20, Sampling(0.7), generator=g).sequences
                      for g in (torch.Generator().manual_seed(3), [torch.Generator().manual_seed(3)]))
        assert torch.equal(one, alone)  # one generator for the batch, or one per row: a row of one draws alike


@pytest.mark.slow
def test_compiled_baseline_through_the_cli(setup, capsys):
    out = setup["root"] / "compiled"
    code = main(["bench", "--model", setup["model"], "--heads", setup["heads"]["ff"], "--prompts", setup["prompts"],
                 "--num-prompts", "1", "--repeats", "2", "--max-new-tokens", "8", "--compile", "--out", str(out),
                 "--no-progress", "--threads", "1"])
    assert code == 0
    report = json.loads((out / "bench.json").read_text())
    assert [p["kind"] for p in report["peers"]] == ["plain-static", "plain-compiled"]
    assert all(r["greedy_check"]["identical"] == 2 for r in report["peers"])
    assert report["heads"][0]["speedup_compiled"]["mean"] > 0 and "x compiled" in capsys.readouterr().out
    eager, compiled = report["heads"]  # every head again with its verify call compiled, in the same run
    assert compiled["label"] == eager["label"] + "/compile"
    assert compiled["greedy_check"]["identical"] == 2 and compiled["phases_ms"]["backbone"] > 0


def test_bad_peers_are_refused_before_loading(setup):
    from mtpc.errors import InputError

    for peers, message in [(("prompt-lookup:0",), "K in prompt-lookup"), (("assisted",), "draft LM"),
                           (("assisted:/nonexistent",), "config.json"), (("medusa",), "unknown peer"),
                           (("static:4",), "takes no argument"), (("generate:dynamic",), "generate takes no argument")]:
        with pytest.raises(InputError, match=message):
            run_bench(config(setup, peers=peers))
    with pytest.raises(InputError, match="max repetition"):
        run_bench(config(setup, max_repetition=2.0))


def test_the_llama_cpp_peer_is_refused_without_its_library_or_a_gguf_model(setup, monkeypatch):
    """`--peers llama.cpp` runs the --model GGUF file with llama-cpp-python: without the library, or with a model
    folder, one line says what is missing, before any model is loaded."""
    import importlib.util

    from mtpc.bench import peers

    real = importlib.util.find_spec
    missing = lambda name, *a: None if name == "llama_cpp" else real(name, *a)  # noqa: E731
    monkeypatch.setattr(peers.importlib.util, "find_spec", missing)
    with pytest.raises(InputError, match="needs llama-cpp-python"):
        run_bench(config(setup, peers=("llama.cpp",)))
    present = lambda name, *a: object() if name == "llama_cpp" else real(name, *a)  # noqa: E731
    monkeypatch.setattr(peers.importlib.util, "find_spec", present)
    with pytest.raises(InputError, match="runs the --model GGUF file itself"):
        run_bench(config(setup, peers=("llama.cpp",)))  # setup's model is a checkpoint folder
    assert main(["bench", "--model", setup["model"], "--heads", setup["heads"]["ff"], "--prompts", setup["prompts"],
                 "--peers", "llama.cpp", "--no-progress"]) == 2


def test_a_bf16_greedy_run_says_why_it_may_differ_and_fp32_claims_exactness(setup):
    """bf16 rounds a several-position verify call differently from one-position steps, so a near-tie may go
    the other way: such a run carries the note (and `mtpc bench` does not call a rounding difference a
    failure); an fp32 run has no note, and every mismatch there is one."""
    bf16 = run_bench(config(setup, heads=[setup["heads"]["ff"]], dtype="bf16"))
    assert "check exactness with --dtype fp32" in bf16["greedy_exactness_note"]
    fp32 = run_bench(config(setup, heads=[setup["heads"]["ff"]]))
    assert fp32["greedy_exactness_note"] is None and fp32["greedy_identical"] is True


@pytest.mark.slow
def test_the_compiled_plain_decoder_compiles_outside_its_timed_steps():
    """Compiled plain decoding traces its step before the first timed step, for new caches too (a longer
    generation after a short warm-up), and decodes as the eager one does."""
    from mtpc.decoding import PlainDecoder
    from test_decode import tiny_lm

    model = tiny_lm(12, scale=3.0)
    compiled, eager = PlainDecoder(model, compile=True), PlainDecoder(model)
    ids = torch.tensor([[1, 2, 3]])
    warm = compiled.generate(ids, 4)  # caches of 128 slots
    assert warm.stats.compile_seconds > 0
    long = compiled.generate(ids, 140)  # more than they hold: new caches
    assert compiled.allocations == 2 and long.stats.compile_seconds > 0
    again = compiled.generate(ids, 140)
    assert again.stats.compile_seconds == 0  # the same caches: nothing to trace
    assert max(long.stats.cycle_seconds) < long.stats.compile_seconds
    assert torch.equal(again.sequences, eager.generate(ids, 140).sequences)


def head_without_acceptance(setup, folder: Path) -> Path:
    """A copy of the ff head at `folder` that records no per-depth acceptance."""
    import shutil

    shutil.copytree(setup["heads"]["ff"], folder)
    config_file = folder / "train_config.json"
    if config_file.exists():
        recorded = json.loads(config_file.read_text())
        recorded.pop("val_depth_topk", None)
        config_file.write_text(json.dumps(recorded))
    return folder


def test_window_auto_is_the_row_mtpc_generate_would_decode_with(setup, tmp_path, caplog):
    """`--window auto`: the choice `mtpc generate` makes with neither --window nor --tree (a head always right
    gets a chain or a tree, its row saying what was expected); a head never right chooses plain decoding: no row,
    and one line says so; a head with no record is one input error naming it and the flag."""
    import shutil

    right, wrong = tmp_path / "right", tmp_path / "wrong"
    shutil.copytree(setup["heads"]["ff"], right)
    shutil.copytree(setup["heads"]["cp"], wrong)
    depths = list(range(1, N))
    (right / "depth_topk.json").write_text(json.dumps({"val_depth_topk": {
        "k": [1], "depth": depths, "path": [[1.0] for _ in depths]}}))
    (wrong / "depth_topk.json").write_text(json.dumps({"val_depth_topk": {
        "k": [1], "depth": depths, "path": [[0.0] for _ in depths]}}))
    with caplog.at_level("WARNING", logger="mtpc.bench.variants"):
        report = run_bench(config(setup, heads=[str(right), str(wrong)], windows=("auto",)))
    rows = {r["label"]: r for r in report["heads"]}
    assert len(rows) == 1 and report["greedy_identical"] is True
    label, row = next(iter(rows.items()))
    assert label.startswith(("right/auto-w", "right/auto-tree")) and row["width"] == "auto"
    assert row["auto"]["kind"] in ("chain", "tree") and row["auto"]["expected_speedup"] > 1.15
    assert row["auto"]["expected_tokens"] > 1
    assert row["paced"] is True and all(s["handed_over"] in (0, 1, 2, 3) for s in row["per_set"])  # as generate
    said = [r.getMessage() for r in caplog.records]
    assert said == [m for m in said if m.startswith("mtpc bench: --window auto for wrong: plain decoding (")]
    assert len(said) == 1 and said[0].endswith("; the plain row is its choice")
    bare = head_without_acceptance(setup, tmp_path / "bare")
    with pytest.raises(InputError, match="--window auto: the head bare records no per-depth acceptance.*give --window N"):
        run_bench(config(setup, heads=[str(bare)], windows=("auto",)))


def test_tree_auto_sizes_each_heads_tree_from_its_recorded_acceptance(setup, tmp_path):
    """`--tree auto`: a head that records a high per-depth acceptance gets a tree (its row says what the choice
    expected and the verify costs it was made from); one whose tree cannot beat plain decoding keeps only its
    chain; a head with no record is one input error naming it."""
    import shutil

    good, poor = tmp_path / "good", tmp_path / "poor"
    shutil.copytree(setup["heads"]["cp"], good)
    shutil.copytree(setup["heads"]["ff"], poor)
    (good / "depth_topk.json").write_text(json.dumps({"val_depth_topk": {
        "k": [1, 2], "depth": [1, 2, 3], "path": [[0.95, 1.0], [0.9, 1.0], [0.85, 1.0]]}}))
    (poor / "depth_topk.json").write_text(json.dumps({"val_depth_topk": {
        "k": [1, 2], "depth": [1], "path": [[0.0, 0.0]]}}))
    report = run_bench(config(setup, heads=[str(good), str(poor)], trees=(None, "auto")))
    rows = {r["label"]: r for r in report["heads"]}
    auto = [label for label in rows if label.startswith("good/auto-tree")]
    assert len(auto) == 1 and set(rows) == {auto[0], "good", "poor"} and report["greedy_identical"] is True
    chosen = rows[auto[0]]
    assert chosen["tree"] == int(auto[0].rsplit("tree", 1)[1]) >= 2
    assert chosen["tree_auto"]["expected_tokens"] > 1 and sorted(map(int, chosen["tree_auto"]["call_ms"])) == [
        1, 2, 4, 8, 16, 32, 64]
    assert rows["good"]["tree"] is None and rows["good"]["tree_auto"] is None
    alone = {r["label"]: r for r in run_bench(config(setup, heads=[str(poor)], trees=("auto",)))["heads"]}
    assert list(alone) == ["poor/auto-chain"] and alone["poor/auto-chain"]["tree"] is None  # without 'chain' asked
    assert alone["poor/auto-chain"]["tree_auto"]["nodes"] is None
    bare = head_without_acceptance(setup, tmp_path / "bare")
    with pytest.raises(InputError, match="--tree auto: the head bare records no per-depth acceptance"):
        run_bench(config(setup, heads=[str(bare)], trees=("auto",)))
