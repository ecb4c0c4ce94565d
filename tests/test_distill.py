"""mtpc distill-data: deterministic, resumable, training prompts only, prompt masked in training data."""

import json
import shutil
from pathlib import Path

import numpy as np

import pytest

from _tiny import save_tiny_lm
from mtpc.cli.commands import main
from mtpc.training.data import load_documents, split_documents
from mtpc.training.distill import DistillConfig, distill_data
from mtpc.errors import InputError
from mtpc.lm.tokenizer import ByteTokenizer, to_bytes

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("lm"), sharpen=4.0)  # no float near-ties in greedy choices


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Files whose every line names its file, so a prompt tells which document it came from."""
    path = tmp_path_factory.mktemp("corpus")
    for i in range(20):
        lines = [f"file{i:02d} line {k:03d}: value = compute({k}, {i}) + {k * i}" for k in range(30)]
        (path / f"f{i:02d}.py").write_text("\n".join(lines) + "\n")
    return str(path)


def args(lm, corpus, out, *extra):
    return ["distill-data", "--model", lm, "--data", corpus, "--out", str(out), "--prompt-len", "16",
            "--max-new-tokens", "24", "--no-progress", *extra]


def records(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_records_are_deterministic_and_depend_on_the_seed(tiny_lm, corpus, tmp_path):
    for name, seed in (("a", "0"), ("b", "0"), ("c", "1")):
        assert main(args(tiny_lm, corpus, tmp_path / f"{name}.jsonl", "--num-prompts", "6", "--seed", seed)) == 0
    a, b, c = ((tmp_path / f"{n}.jsonl").read_bytes() for n in "abc")
    assert a == b and a != c
    got = records(tmp_path / "a.jsonl")
    assert [r["index"] for r in got] == list(range(6))
    assert {r["mode"] for r in got} <= {"greedy", "sample"}
    assert all(r["stop"] in ("eos", "special", "length") for r in got)
    assert all(len(to_bytes(r["prompt"])) == 16 for r in got)
    assert all(len(to_bytes(r["completion"])) == 24 for r in got if r["stop"] == "length")


def test_out_in_a_missing_folder_is_made_and_one_under_a_file_is_refused(tiny_lm, corpus, tmp_path, capsys):
    """`--out runs/new/a.jsonl` makes `runs/new` (as `train` and `tiny-lm` make OUT); a path through a
    file is one clean line before any work."""
    out = tmp_path / "new" / "deeper" / "a.jsonl"
    assert main(args(tiny_lm, corpus, out, "--num-prompts", "2")) == 0
    assert len(records(out)) == 2
    (tmp_path / "plain").write_text("x")
    capsys.readouterr()
    assert main(args(tiny_lm, corpus, tmp_path / "plain" / "sub" / "a.jsonl", "--num-prompts", "2")) == 2
    assert capsys.readouterr().err.strip() == f"mtpc: error: --out {tmp_path}/plain/sub/a.jsonl: {tmp_path}/plain is not a folder"


def test_resume_after_a_kill_gives_the_same_file(tiny_lm, corpus, tmp_path):
    whole = tmp_path / "whole.jsonl"
    assert main(args(tiny_lm, corpus, whole, "--num-prompts", "5")) == 0
    part = tmp_path / "part.jsonl"
    assert main(args(tiny_lm, corpus, part, "--num-prompts", "2")) == 0  # fewer records: a prefix
    assert whole.read_bytes().startswith(part.read_bytes())
    lines = whole.read_bytes().splitlines(keepends=True)
    with part.open("ab") as f:  # a killed run: record 2 written, record 3 torn in the middle
        f.write(lines[2] + lines[3][:20])
    assert main(args(tiny_lm, corpus, part, "--num-prompts", "5")) == 0
    assert part.read_bytes() == whole.read_bytes()
    assert main(args(tiny_lm, corpus, part, "--num-prompts", "5")) == 0  # complete: nothing to do
    assert part.read_bytes() == whole.read_bytes()


def test_a_rerun_with_other_settings_or_a_foreign_file_is_refused(tiny_lm, corpus, tmp_path):
    out = tmp_path / "x.jsonl"
    cfg = DistillConfig(model=tiny_lm, data=corpus, out=str(out), num_prompts=2, prompt_len=16, max_new_tokens=8,
                        progress=False)
    distill_data(cfg)
    before = out.read_bytes()
    cfg.seed, cfg.num_prompts = 1, 3
    with pytest.raises(InputError, match="seed"):
        distill_data(cfg)
    assert out.read_bytes() == before
    cfg.seed = 0
    text = sorted(Path(corpus).rglob("*.py"))[0]
    text.write_text(text.read_text() + "\n# the text changed\n")  # the same --data path, other text
    try:
        with pytest.raises(InputError, match="data_sha256 differ"):
            distill_data(cfg)
    finally:
        text.write_text(text.read_text().removesuffix("\n# the text changed\n"))
    other_model = Path(shutil.copytree(tiny_lm, tmp_path / "lm"))
    weights = other_model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(8)  # the same path and shapes, other weights
    weights.write_bytes(bytes(data))
    moved = DistillConfig(model=str(other_model), data=corpus, out=str(out), num_prompts=3, prompt_len=16,
                          max_new_tokens=8, progress=False)
    (out.parent / (out.name + ".meta.json")).write_text(
        (out.parent / (out.name + ".meta.json")).read_text().replace(str(Path(tiny_lm).resolve()), str(other_model)))
    with pytest.raises(InputError, match="model_fingerprint differ"):
        distill_data(moved)
    assert out.read_bytes() == before
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text('{"text": "not ours"}\n')
    with pytest.raises(InputError, match="not written by mtpc distill-data"):
        distill_data(DistillConfig(model=tiny_lm, data=corpus, out=str(foreign), prompt_len=16, max_new_tokens=8,
                                  progress=False))


@pytest.mark.parametrize("change, message", [
    ({"num_prompts": 0}, "--num-prompts"), ({"temperature": 0.0}, "--temperature"), ({"top_p": 1.5}, "--top-p"),
    ({"greedy_fraction": 2.0}, "--greedy-fraction"), ({"max_new_tokens": 60}, "context"),
    ({"head": "/nonexistent"}, "no such head folder: /nonexistent"), ({"data": "/nonexistent/x"}, "--data"), ({"model": "/nonexistent"}, "no such model folder: /nonexistent"),
    ({"data": "SHORT"}, "lower --prompt-len"),
])
def test_bad_settings_are_input_errors_before_any_work(tiny_lm, corpus, tmp_path, change, message):
    if change.get("data") == "SHORT":  # a corpus without a single 16-byte span
        (tmp_path / "short.py").write_text("a = 1\nb = 2\n")
        change = {"data": str(tmp_path / "short.py")}
    cfg = DistillConfig(**{"model": tiny_lm, "data": corpus, "out": str(tmp_path / "o.jsonl"), "prompt_len": 16,
                           "max_new_tokens": 8, "progress": False, **change})
    with pytest.raises(InputError, match=message):
        distill_data(cfg)
    assert not (tmp_path / "o.jsonl").exists()


def test_prompts_come_from_training_documents_only(tiny_lm, corpus, tmp_path):
    out = tmp_path / "p.jsonl"
    assert main(args(tiny_lm, corpus, out, "--num-prompts", "40", "--max-new-tokens", "1")) == 0
    tok = ByteTokenizer.load(tiny_lm)
    docs, _ = load_documents(corpus, tok)
    train, held_out = split_documents(docs, 0.02)
    assert held_out and train
    train_names = {Path(d.name).stem for d in train}
    held_out_bytes = [bytes(d.tokens[1:-1].astype(np.uint8)) for d in held_out]
    sources = set()
    for r in records(out):
        prompt = to_bytes(r["prompt"])
        sources.add(prompt[:6].decode())  # every prompt starts at a line start: "fileNN"
        assert not any(prompt in text for text in held_out_bytes)
    assert sources <= {name.replace("f", "file") for name in train_names}
    assert len(sources) > 5


def test_training_reads_records_with_the_prompt_masked(tiny_lm, corpus, tmp_path):
    out = tmp_path / "m.jsonl"
    assert main(args(tiny_lm, corpus, out, "--num-prompts", "3")) == 0
    tok = ByteTokenizer.load(tiny_lm)
    docs, stats = load_documents(str(out), tok)
    assert stats.skipped_corrupt == 0
    for doc, r in zip(docs, (r for r in records(out) if r["completion"])):
        prompt, completion = to_bytes(r["prompt"]), to_bytes(r["completion"])
        assert doc.tokens.tolist() == [tok.bos_id, *prompt, *completion, tok.eos_id]
        assert doc.mask.tolist() == [False] * (1 + len(prompt)) + [True] * (len(completion) + 1)


def test_invalid_utf8_round_trips_exactly_through_a_record(tmp_path):
    raw_prompt, raw_completion = b"ok \xff\xfe\xed\xb2\x80 x", b"\xc3(\x80\xe2\x82 end"
    record = {"index": 0, "prompt": raw_prompt.decode("utf-8", "surrogateescape"),
              "completion": raw_completion.decode("utf-8", "surrogateescape")}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(record) + "\n")
    assert path.read_bytes().isascii()
    tok = ByteTokenizer()
    (doc,), _ = load_documents(str(path), tok)
    assert doc.tokens.tolist() == [tok.bos_id, *raw_prompt, *raw_completion, tok.eos_id]
    assert doc.mask.sum() == len(raw_completion) + 1


def test_a_head_decodes_speculatively_with_the_same_greedy_records(tiny_lm, corpus, tmp_path, capsys):
    head = tmp_path / "head"
    assert main(["train", "--model", tiny_lm, "--circuit", str(ROOT / "examples" / "ff.pc"), "-D", "n=4",
                 "--data", corpus, "--out", str(head), "--steps", "2", "--seq-len", "32", "--batch-size", "2",
                 "--val-sequences", "1", "--precision", "fp32", "--no-progress"]) == 0
    plain, fast = tmp_path / "plain.jsonl", tmp_path / "fast.jsonl"
    assert main(args(tiny_lm, corpus, plain, "--num-prompts", "4", "--greedy-fraction", "1")) == 0
    capsys.readouterr()
    assert main(args(tiny_lm, corpus, fast, "--num-prompts", "4", "--greedy-fraction", "1", "--head", str(head))) == 0
    assert records(plain) == records(fast)
    per_cycle = float(capsys.readouterr().out.split("; ")[1].split()[0])  # "...; 1.23 tokens per decoding cycle)"
    assert 1.0 <= per_cycle <= 5.0
    meta = json.loads(Path(str(fast) + ".meta.json").read_text())
    assert meta["head"] == str(head.resolve())


def test_batched_sampling_gives_the_records_of_one_at_a_time(tiny_lm, corpus, tmp_path):
    """Plain batched sampling (the default) draws each record with its own seeded generator, so the file
    does not depend on --batch-size; records are on-policy samples by default (no greedy ones)."""
    for name, batch in (("one", "1"), ("three", "3"), ("eight", "8")):
        assert main(args(tiny_lm, corpus, tmp_path / f"{name}.jsonl", "--num-prompts", "7", "--batch-size", batch,
                         "--greedy-fraction", "0")) == 0
    one, three, eight = ((tmp_path / f"{n}.jsonl").read_bytes() for n in ("one", "three", "eight"))
    assert one == three == eight
    assert {r["mode"] for r in records(tmp_path / "one.jsonl")} == {"sample"}


def test_plain_batch_stops_each_row_at_its_first_special_token(tiny_lm):
    import torch
    from transformers import AutoModelForCausalLM

    from mtpc.decoding import PlainDecoder
    from mtpc.sampling import Sampling
    from mtpc.training.distill import plain_batch

    model = AutoModelForCausalLM.from_pretrained(tiny_lm).eval()
    requests = [([1, 65, 66], False, 0), ([1, 67, 68], True, 1)]
    target = Sampling(1.0)
    decoder = PlainDecoder(model)
    rows = plain_batch(decoder, requests, 40, target, stop=list(range(256, 264)), device=torch.device("cpu"))
    for row in rows:
        assert 1 <= len(row) <= 40
        assert all(t < 256 for t in row[:-1])  # a special token only ever ends a row
    greedy = plain_batch(decoder, [requests[1]], 40, target, stop=list(range(256, 264)), device=torch.device("cpu"))
    assert greedy[0] == rows[1]  # a greedy row is the same alone or in a batch
