"""`mtpc bench` end to end on a tiny random LM with heads saved like `mtpc train` saves them: the report
files and fields, the latency breakdown, prompts from files and corpora, and the greedy-equality check
catching a decoder that commits a wrong token."""

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from circuitc import builders
from mtpc import MTPHead, SpeculativeDecoder, save_head
from mtpc.backbone import attach_draft_lora
from mtpc.bench import BenchConfig, format_table, load_prompts, run_bench, split_phases
from mtpc.cli import main
from mtpc.tokenizer import ByteTokenizer

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

    def generate(self, input_ids, max_new_tokens, **kw):
        out = super().generate(input_ids, max_new_tokens, **kw)
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
    report = run_bench(config(setup, mode="sample", bonus=(False, True), temperature=0.8, top_p=0.95))
    labels = [r["label"] for r in report["heads"]]
    assert labels == ["ff4", "ff4/bonus", "cp4", "cp4/bonus"]
    assert report["greedy_identical"] is None and all("greedy_check" not in r for r in report["heads"])
    assert {r["ff_reference"] for r in report["heads"]} == {"ff4", "ff4/bonus"}
    greedy = run_bench(config(setup, heads=[setup["heads"]["cp"]], drafts=("conditional", "marginal", "map")))
    assert [r["label"] for r in greedy["heads"]] == ["cp4/conditional", "cp4/marginal", "cp4/map"]
    assert greedy["greedy_identical"] is True
    assert all(r["ff_reference"] is None and "speedup_ff" not in r for r in greedy["heads"])


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
    with pytest.raises(ValueError, match="spans"):
        load_prompts(config(setup, prompts=None, corpus=str(corpus), prompt_len=5000), setup["tok"])


def test_bad_configurations_are_refused(setup, tmp_path):
    with pytest.raises(ValueError, match="need 100"):
        run_bench(config(setup, num_prompts=50))
    with pytest.raises(ValueError, match="mode"):
        run_bench(config(setup, mode="beam"))
    with pytest.raises(ValueError, match="draft strategies"):
        run_bench(config(setup, drafts=("best",)))
    with pytest.raises(ValueError, match="distinct names"):
        run_bench(config(setup, heads=[setup["heads"]["ff"], setup["heads"]["ff"]]))
    assert main(["bench", "--model", setup["model"], "--heads", setup["heads"]["ff"]]) == 2  # no prompts
