"""`mtpc bench --batch-size B`: batches of left-padded prompts decoded by the heads, plain batched decoding
(whose rows equal plain decoding of each prompt alone) and transformers' batched generate; the report."""

import json

import pytest
import torch

from mtpc.cli.commands import main
from mtpc.decoding import PlainDecoder
from test_decode import tiny_lm
from test_generate import folders, refused  # noqa: F401  (folders: the module's fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_plain_batched_rows_equal_plain_decoding_of_each_prompt():
    model = tiny_lm(12, scale=3.0)
    rows = [[1, 2], [3, 4, 5, 6, 7], [8]]
    T = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (T - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (T - len(r)) + [1] * len(r) for r in rows])
    decoder = PlainDecoder(model)
    alone = [PlainDecoder(model).generate(torch.tensor([r]), 9).sequences[0, len(r):].tolist() for r in rows]
    out = decoder.generate(ids, 9, attention_mask=mask, pad_token_id=0)
    assert out.sequences[:, T:].tolist() == alone and out.stats.new_tokens == 27
    eos = alone[1][2]  # row 1 ends at its third token; the others go on
    stopped = decoder.generate(ids, 9, attention_mask=mask, eos_token_id=eos, pad_token_id=0).sequences[:, T:].tolist()
    for got, want in zip(stopped, alone):
        end = want.index(eos) + 1 if eos in want else len(want)
        assert got[:end] == want[:end] and set(got[end:]) <= {0}


def bench_args(folders, tmp_path, *extra):  # noqa: F811
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a\n\u2713 \u00e9\na\u2713\n \u00e9a\u2713 \n")
    return ["bench", "--model", str(folders / "lm"), "--heads", str(folders / "head"), "--prompts", str(prompts),
            "--num-prompts", "4", "--repeats", "1", "--max-new-tokens", "6", "--threads", "1", "--no-progress",
            *extra]


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_bench_batch_size_reports_the_batch_against_its_peers(folders, tmp_path, capsys, mode):  # noqa: F811
    out = tmp_path / "out"
    assert main(bench_args(folders, tmp_path, "--batch-size", "2", "--mode", mode, "--out", str(out))) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "bench.json").read_text())
    labels = [row["label"] for row in report["rows"]]
    assert labels == ["plain (batched)", "hf generate (batched)", "head"]
    assert report["batch_size"] == 2 and report["baselines"] == ["plain (batched)", "hf generate (batched)"]
    head = report["rows"][-1]
    assert head["tok_s"]["mean"] > 0 and head["speedup"]["plain (batched)"]["mean"] > 0
    assert head.get("greedy_mismatches", 0) == 0 and ("greedy_mismatches" in head) == (mode == "greedy")
    assert 1 <= head["tokens_per_cycle"] <= 8 and all("tokens_per_cycle" not in r for r in report["rows"][:-1])
    assert "batch size 2" in printed and "hf generate (batched)" in printed
    assert "| decoder | tok/s | tokens/cycle |" in (out / "bench.md").read_text()


@pytest.mark.slow
def test_bench_batch_size_compiled(folders, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "out"
    assert main(bench_args(folders, tmp_path, "--batch-size", "4", "--compile", "--out", str(out))) == 0
    labels = [row["label"] for row in json.loads((out / "bench.json").read_text())["rows"]]
    assert labels == ["plain (batched)", "plain (batched, static + compile)", "hf generate (batched)", "head",
                      "head/compile"]


def test_bench_batch_size_errors(folders, tmp_path, capsys):  # noqa: F811
    refused(bench_args(folders, tmp_path, "--batch-size", "3"), capsys, "must be a multiple of it")
    refused(bench_args(folders, tmp_path, "--batch-size", "2", "--peers", "static"), capsys, "per-prompt options")
    refused(bench_args(folders, tmp_path, "--batch-size", "0"), capsys, "--batch-size")
