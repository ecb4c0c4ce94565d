"""`mtpc generate` through `mtpc.cli.commands` (and one subprocess for standard input), on a scripted byte
LM saved as `mtpc tiny-lm` saves models and a head saved as `mtpc train` saves heads."""

import io
import os
import re
import subprocess
import sys

import pytest
import torch
from _scripted_lm import TEXT, VOCAB, oracle_head, scripted_lm

from mtpc import save_head
from mtpc.lm.lora import attach_draft_lora
from mtpc.cli.commands import main
from mtpc.cli.generate import GenerateConfig, Utf8Streamer, run_generate
from mtpc.lm.tokenizer import ByteTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

EXPECTED = (TEXT * 3)[1:]  # prompt "a", 20 new bytes: the rest of three repetitions


def refused(argv: list[str], capsys, fragment: str) -> None:
    """`main(argv)` reports an input error as one `mtpc: error:` line with exit status 2."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("mtpc: error:") and fragment in err and "Traceback" not in err, err


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    model = scripted_lm().float()
    model.save_pretrained(root / "lm")
    ByteTokenizer(VOCAB).save(root / "lm")
    head = oracle_head(model).float()
    save_head(head, root / "head")
    save_head(head, root / "lora_head")
    peft = attach_draft_lora(scripted_lm().float(), 1, rank=2)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)  # a draft path that differs from the verifier's
    peft.save_pretrained(str(root / "lora_head" / "lora"))
    return root


def generate(folders, *args, head=True):
    argv = ["generate", "--model", str(folders / "lm"), *(["--head", str(folders / "head")] if head else []), *args]
    return main(argv)


def test_prints_the_continuation_streamed_or_not_with_and_without_head(folders, capsys):
    for head in (True, False):
        for stream in ("--stream", "--no-stream"):
            assert generate(folders, "a", "--max-new-tokens", "20", stream, head=head) == 0
            captured = capsys.readouterr()
            assert captured.out == EXPECTED + "\n" and captured.err == ""


def test_streams_whole_characters_as_cycles_commit(folders):
    class Writes(io.StringIO):
        def __init__(self):
            super().__init__()
            self.pieces = []

        def write(self, s):
            self.pieces.append(s)
            return super().write(s)

    out = Writes()
    summary = run_generate(GenerateConfig(model=str(folders / "lm"), head=str(folders / "head"), prompt="a",
                                          max_new_tokens=20, stats=True), out=out, err=io.StringIO())
    assert out.getvalue() == EXPECTED + "\n"
    assert len([p for p in out.pieces if p]) > 3 and all("\ufffd" not in p for p in out.pieces)
    assert summary["stats"]["accepted_per_cycle"][:3] == [3, 3, 3]  # cycles of 3 bytes split "✓" and "é"


def test_utf8_streamer_holds_split_characters_and_replaces_invalid_bytes():
    out = io.StringIO()
    s = Utf8Streamer(out)
    s.put(torch.tensor([[257, 97]]))  # the prompt: skipped
    for chunk in ([0xFF, 0xE2], [0x9C], [0x93, 258, 0xC3], [0xA9, 0xE2]):
        s.put(torch.tensor([chunk]))
    s.end()
    assert out.getvalue() == "\ufffd✓é\ufffd\n"


def test_stats_and_compare(folders, capsys):
    assert generate(folders, "a", "--max-new-tokens", "20", "--stats", "--compare", "--threads", "1") == 0
    captured = capsys.readouterr()
    assert captured.out == EXPECTED + "\n"
    assert "[speculative] 20 bytes in 7 cycles (2.86 bytes/cycle)" in captured.err
    assert "[plain] 20 bytes in 20 cycles (1.00 bytes/cycle)" in captured.err
    for word in ("tok/s", "head", "circuit", "backbone", "accept", "speed-up (1 torch thread);",
                 "greedy outputs identical: yes"):
        assert word in captured.err


def test_lora_draft_path_is_lossless_and_its_layers_are_checked(folders, capsys):
    lora_head = str(folders / "lora_head")
    base = ["generate", "--model", str(folders / "lm"), "--head", lora_head, "a", "--max-new-tokens", "20"]
    assert main(base + ["--compare"]) == 0
    captured = capsys.readouterr()
    assert captured.out == EXPECTED + "\n" and "greedy outputs identical: yes" in captured.err
    assert main(base + ["--lora", lora_head + "/lora", "--lora-layers", "1"]) == 0
    refused(base + ["--lora-layers", "2"], capsys, "adapts the last 1 layers")
    refused(base + ["--lora", str(folders / "head")], capsys, "no adapter_config.json")


def test_sampling_is_reproducible_with_a_seed(folders, capsys):
    outs = []
    for _ in range(2):
        generate(folders, "a", "--max-new-tokens", "12", "--temperature", "3", "--top-k", "50", "--seed", "7")
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and len(outs[0]) > 1


def test_chat_renders_the_models_chat_template(folders, capsys):
    from mtpc.training.data import chat_template

    tok = ByteTokenizer(VOCAB)
    summary = run_generate(GenerateConfig(model=str(folders / "lm"), head=str(folders / "head"), prompt="hé?",
                                          chat=True, max_new_tokens=5), out=io.StringIO(), err=io.StringIO())
    trained, _ = chat_template([{"role": "user", "content": "hé?"}], tok)
    assert summary["prompt_ids"] == trained[:-1] + [tok.role_id("assistant")]
    bare = folders / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((folders / "lm" / name).read_bytes())
    refused(["generate", "--model", str(bare), "--chat", "hi"], capsys, "save_hf_tokenizer")


def test_prompt_from_a_file_and_from_stdin(folders, tmp_path, capsys):
    (tmp_path / "p.txt").write_bytes(b"a")
    assert generate(folders, "--prompt-file", str(tmp_path / "p.txt"), "--max-new-tokens", "20") == 0
    assert capsys.readouterr().out == EXPECTED + "\n"
    run = subprocess.run([sys.executable, "-m", "mtpc.cli", "generate", "--model", str(folders / "lm"), "--head",
                          str(folders / "head"), "--max-new-tokens", "20"], input=b"a", capture_output=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert run.returncode == 0, run.stderr.decode()
    assert run.stdout.decode() == EXPECTED + "\n"


@pytest.mark.parametrize("args, message", [
    (["--model", "MISSING", "a"], "no such model folder: "),
    (["--head", "MISSING", "a"], "no such head folder"),
    (["--head", "WRONG", "a"], "hidden size 16; the model's is 32"),
    (["a", "--compare"], "--compare compares a draft head"),
    (["a", "--temperature", "-1"], "--temperature"),
    (["a", "--temperature", "nan"], "--temperature"),
    (["a", "--temperature", "1", "--top-p", "2"], "--top-p"),
    (["a", "--top-k", "5"], "give a --temperature"),
    (["a", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["a", "--lora", "x"], "give --head"),
    (["a", "--max-context", "512"], "--max-context sets the room a compiled decoder's caches hold: give --compile"),
    (["a", "--compile", "--max-context", "0"], "--max-context"),
    (["a", "--prompt-file", "p.txt"], "not both"),
    (["--prompt-file", "MISSING.txt"], "no such file"),
])
def test_bad_input_is_refused_before_loading(folders, tmp_path, capsys, args, message):
    from circuitc import builders
    from mtpc import MTPHead

    save_head(MTPHead(builders.ff_graph(2, 256), 16), tmp_path / "wrong")
    args = [{"MISSING": str(tmp_path / "missing"), "WRONG": str(tmp_path / "wrong"),
             "MISSING.txt": str(tmp_path / "missing.txt")}.get(a, a) for a in args]
    model = [] if "--model" in args else ["--model", str(folders / "lm")]
    refused(["generate", *model, *args], capsys, message)


def test_a_tiny_lm_folder_loads_with_auto_tokenizer_and_chats(tmp_path, capsys):
    """End to end: the folder `mtpc tiny-lm` writes has the Hugging Face tokenizer (no remote code) and
    `mtpc generate --chat` runs on it."""
    from transformers import AutoTokenizer

    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("def f(x):\n    return x + 1\n" * 40)
    out = tmp_path / "lm"
    assert main(["tiny-lm", "--out", str(out), "--data", str(tmp_path / "corpus"), "--steps", "2", "--context", "32",
                 "--d-model", "32", "--layers", "1", "--heads", "2", "--ffn", "64", "--no-progress"]) == 0
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.encode("é<|end|>", add_special_tokens=False) == [0xC3, 0xA9, ByteTokenizer().end_of_turn_id]
    capsys.readouterr()
    assert main(["generate", "--model", str(out), "--chat", "hi", "--max-new-tokens", "5", "--no-stream"]) == 0
    assert capsys.readouterr().out.endswith("\n")


def test_refuses_text_that_outgrows_the_models_context(folders, capsys):
    assert generate(folders, "a" * 250, "--max-new-tokens", "10") == 2  # scripted LM: 256 positions
    assert "251 prompt + 10 new tokens exceed the 256 positions the model has (lower --max-new-tokens to 5" \
        in capsys.readouterr().err


def test_lookup_drafting_stays_lossless_and_needs_a_head(folders, capsys):
    """`--lookup K` turns on prompt-lookup drafting in the speculative decoder: the text (scripted to
    repeat, so matches exist) is still plain greedy decoding's, and the report counts lookup cycles."""
    assert generate(folders, "a", "--max-new-tokens", "20", "--lookup", "4", "--compare", "--stats") == 0
    captured = capsys.readouterr()
    assert captured.out == EXPECTED + "\n" and "greedy outputs identical: yes" in captured.err
    summary = run_generate(GenerateConfig(model=str(folders / "lm"), head=str(folders / "head"), prompt="a",
                                          max_new_tokens=20, lookup=4), out=io.StringIO(), err=io.StringIO())
    assert summary["text"] == EXPECTED and "lookup_cycles" in summary["stats"]
    refused(["generate", "--model", str(folders / "lm"), "a", "--lookup", "4"], capsys, "give --head")
    refused(["generate", "--model", str(folders / "lm"), "a", "--lookup", "0"], capsys, "--lookup")


def test_a_shorter_window_stays_lossless_and_is_checked(folders, capsys):
    """`--window K` verifies K tokens per cycle: the text is still plain greedy decoding's, no cycle commits
    more than K, and a window the head cannot fill (or without a head) is one clean error."""
    summary = run_generate(GenerateConfig(model=str(folders / "lm"), head=str(folders / "head"), prompt="a",
                                          max_new_tokens=20, window=2), out=io.StringIO(), err=io.StringIO())
    assert summary["text"] == EXPECTED and max(summary["stats"]["accepted_per_cycle"]) == 2
    assert generate(folders, "a", "--max-new-tokens", "20", "--window", "2", "--compare") == 0
    assert "greedy outputs identical: yes" in capsys.readouterr().err
    refused(["generate", "--model", str(folders / "lm"), "a", "--window", "2"], capsys, "give --head")
    refused(["generate", "--model", str(folders / "lm"), "--head", str(folders / "head"), "a", "--window", "1"],
            capsys, "--window")
    refused(["generate", "--model", str(folders / "lm"), "--head", str(folders / "head"), "a", "--window", "99"],
            capsys, "--window 99: the head")


def test_a_tree_of_drafts_stays_lossless_and_is_checked(folders, capsys):
    """`--tree N` verifies a tree of N drafted tokens per cycle (with `--lookup K`, a match is one more branch):
    the text is still plain greedy decoding's; a tree without a head, beside --window, or one the head cannot
    fill is one clean error."""
    for extra in ([], ["--lookup", "4"]):
        assert generate(folders, "a", "--max-new-tokens", "20", "--tree", "6", "--compare", *extra) == 0
        captured = capsys.readouterr()
        assert captured.out == EXPECTED + "\n" and "greedy outputs identical: yes" in captured.err
    summary = run_generate(GenerateConfig(model=str(folders / "lm"), head=str(folders / "head"), prompt="a",
                                          max_new_tokens=20, tree=6), out=io.StringIO(), err=io.StringIO())
    assert summary["text"] == EXPECTED and max(summary["stats"]["accepted_per_cycle"]) > 1
    lm, head = str(folders / "lm"), str(folders / "head")
    refused(["generate", "--model", lm, "a", "--tree", "6"], capsys, "--tree is the draft head's tree")
    refused(["generate", "--model", lm, "--head", head, "a", "--tree", "6", "--window", "2"], capsys, "give one")
    refused(["generate", "--model", lm, "--head", head, "a", "--tree", "1"], capsys, "--tree")


def test_a_draft_temperature_samples_and_is_checked(folders, capsys):
    """`--draft-temperature T` sets the temperature the circuit samples at (the decoder's default: the
    target's); it needs a head and sampling, and a bad value is one clean error while parsing."""
    def sampled(draft_temperature):
        return run_generate(GenerateConfig(model=str(folders / "lm"), head=str(folders / "head"), prompt="a",
                                           max_new_tokens=40, temperature=0.7, draft_temperature=draft_temperature),
                            out=io.StringIO(), err=io.StringIO())["stats"]["accepted_per_cycle"]

    assert sampled(None) == sampled(0.7)  # the default is the target's temperature: the same draws
    assert sampled(0.3) != sampled(None)  # another one drafts other tokens
    assert generate(folders, "a", "--max-new-tokens", "8", "--temperature", "0.7", "--draft-temperature", "0.5") == 0
    lm, head = str(folders / "lm"), str(folders / "head")
    refused(["generate", "--model", lm, "a", "--temperature", "0.7", "--draft-temperature", "0.5"], capsys,
            "give --head and a --temperature above 0")
    refused(["generate", "--model", lm, "--head", head, "a", "--draft-temperature", "0.5"], capsys,
            "give --head and a --temperature above 0")  # greedy: an argmax has no temperature
    refused(["generate", "--model", lm, "--head", head, "a", "--temperature", "1", "--draft-temperature", "0"], capsys,
            "--draft-temperature")


def test_a_comparison_names_its_baseline():
    from mtpc.cli.generate import comparison, format_comparison

    spec, plain = {"tokens_per_second": 300.0, "sequence": [1, 2]}, {"tokens_per_second": 150.0, "sequence": [1, 2]}
    eager = format_comparison(comparison(spec, plain, greedy=True), 1)
    assert eager.startswith("speculative 300.0 tok/s vs plain 150.0 tok/s: 2.00x speed-up (1 torch thread)")
    compiled = format_comparison(comparison(spec, plain, greedy=True, baseline="static cache, compiled"), 2)
    assert "vs plain (static cache, compiled) 150.0 tok/s: 2.00x" in compiled and "(2 torch threads)" in compiled


@pytest.mark.slow
def test_compare_with_compile_measures_against_compiled_plain_decoding(folders, capsys, monkeypatch):
    """Compiled against compiled plain decoding; the speculative decoder generates once (it compiles
    before its first cycle: no untimed warm-up generation), and --stats times the compiling apart."""
    from mtpc.decoding import SpeculativeDecoder

    calls = []
    generate_once = SpeculativeDecoder.generate
    monkeypatch.setattr(SpeculativeDecoder, "generate", lambda *a, **k: calls.append(1) or generate_once(*a, **k))
    assert generate(folders, "a", "--max-new-tokens", "20", "--compile", "--compare", "--stats", "--threads", "1") == 0
    captured = capsys.readouterr()
    assert captured.out == EXPECTED + "\n" and len(calls) == 1
    assert "vs plain (static cache, compiled)" in captured.err and "greedy outputs identical: yes" in captured.err
    speculative = next(line for line in captured.err.splitlines() if line.startswith("[speculative]"))
    assert re.search(r"\(prefill [\d.]+ ms, compiling [\d.]+ s excluded\)", speculative), speculative
    cycle_ms = float(re.search(r"([\d.]+) ms/cycle", speculative).group(1))
    phases_ms = [float(x) for x in re.findall(r"[a-z]+ ([\d.]+)(?=  |$)", speculative.split("per cycle, ms:")[1])]
    assert sum(phases_ms) < 2 * cycle_ms, speculative  # the compiling is in no cycle's phases


def test_a_bf16_greedy_difference_is_said_to_be_rounding_and_an_fp32_one_is_not():
    from mtpc.cli.generate import comparison, format_comparison

    spec, plain = {"tokens_per_second": 2.0, "sequence": [1, 2, 3]}, {"tokens_per_second": 1.0, "sequence": [1, 2, 4]}
    rounded = comparison(spec, plain, greedy=True, rounding=True)
    assert rounded["greedy_identical"] is False
    assert "NO (in bf16" in format_comparison(rounded, 1) and "--dtype fp32" in format_comparison(rounded, 1)
    assert comparison(spec, plain, greedy=True)["rounding_note"] is None  # fp32: a difference is a failure
    assert comparison(spec, spec, greedy=True, rounding=True)["rounding_note"] is None
