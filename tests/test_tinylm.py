import json
import shutil
from pathlib import Path

import pytest
import torch

from mtpc.cli.commands import main
from mtpc.training.tiny_lm import TinyLMConfig, train_tiny_lm


def small_corpus(path):
    import textwrap
    path.mkdir()
    src = textwrap.dedent('''
        def add(a, b):
            """Return the sum of a and b."""
            return a + b
        ''')
    for i in range(40):
        (path / f"m{i}.py").write_text(src.replace("add", f"add{i}") * 8)
    return path


def test_tiny_lm_trains_saves_and_loads(tmp_path):
    from transformers import LlamaForCausalLM

    data = small_corpus(tmp_path / "corpus")
    out = tmp_path / "lm"
    s = train_tiny_lm(TinyLMConfig(out=str(out), data=str(data), steps=60, context=128, d_model=64, layers=2,
                                   heads=2, ffn=128, batch_size=8, lr=5e-3, warmup_steps=5,
                                   precision="fp32", val_fraction=0.1, progress=False))
    assert s["val_bits_per_byte"] < s["val_bits_per_byte_at_start"] - 2.0
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    losses = [r["loss_bits"] for r in log if "loss_bits" in r]
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 - 2.0
    model = LlamaForCausalLM.from_pretrained(out)
    assert model.config.vocab_size == 264 and model.config.max_position_embeddings == 128
    with torch.no_grad():
        assert model(input_ids=torch.tensor([[257, 100, 101]])).logits.shape == (1, 3, 264)
    assert (out / "mtpc_tokenizer.json").exists() and (out / "model.safetensors").exists()


def test_cli_tiny_lm(tmp_path, capsys):
    data = small_corpus(tmp_path / "corpus")
    assert main(["tiny-lm", "--out", str(tmp_path / "lm"), "--data", str(data), "--steps", "3", "--context", "64",
                 "--d-model", "32", "--layers", "1", "--heads", "2", "--ffn", "64", "--no-progress"]) == 0
    assert "bits/byte" in capsys.readouterr().out


# A checkpoint written by `mtpc tiny-lm` as it was before the shared training loop (`loop.py`): step 14
# of a `--minutes 200` run, in its second epoch, with the log up to it; `resumed_log.jsonl` is what that
# code logged continuing it to step 24. Long runs started then must continue identically, so neither
# the file nor the corpus and flags below may change.
OLD_CHECKPOINT = Path(__file__).parent / "data" / "tiny_lm_checkpoint"
OLD_FLAGS = ["--data", "corpus", "--minutes", "200", "--seed", "0", "--save-every", "20", "--precision", "fp32",
             "--device", "cpu", "--context", "32", "--d-model", "8", "--layers", "1", "--heads", "1", "--ffn", "16",
             "--batch-size", "8", "--no-progress"]


def old_checkpoint_corpus(path):
    path.mkdir()
    for i in range(40):
        (path / f"m{i}.py").write_text(f'def add{i}(a, b):\n    """Return the sum of a and b."""\n    return a + b + {i}\n')


def read_log(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_checkpoint_of_the_earlier_format_resumes_identically(tmp_path, monkeypatch):
    from mtpc.training.schedule import cosine_lr
    from mtpc.training.tiny_lm_checkpoints import FIELDS

    monkeypatch.chdir(tmp_path)  # the checkpoint's settings name the corpus as `corpus`
    old_checkpoint_corpus(tmp_path / "corpus")
    out = tmp_path / "lm"
    out.mkdir()
    for name in ("checkpoint.pt", "train_log.jsonl"):
        shutil.copy(OLD_CHECKPOINT / name, out / name)
    old = torch.load(out / "checkpoint.pt", weights_only=True)
    assert set(old) == set(FIELDS) and old["step"] == 14 and old["order"]["epoch"] == 1

    assert main(["tiny-lm", "--out", "lm", *OLD_FLAGS, "--stop-after", "24"]) == 0
    log = read_log(out / "train_log.jsonl")
    assert [r["step"] for r in log] == list(range(25))
    assert log[:15] == read_log(OLD_CHECKPOINT / "train_log.jsonl")
    expected = read_log(OLD_CHECKPOINT / "resumed_log.jsonl")
    resumed = log[15:]
    for key in ("loss_bits", "grad_norm"):  # the weights, the optimizer and the data order (into epoch 2) carried on
        assert [r[key] for r in resumed] == pytest.approx([r[key] for r in expected], rel=1e-6), key
    assert [r["tokens"] for r in resumed] == [r["tokens"] for r in expected]
    # the schedule follows the clock from the checkpoint's seconds on: step 15's position is step 14's time
    assert resumed[0]["lr"] == pytest.approx(cosine_lr(2e-3, old["elapsed"] / (200 * 60), 14, 50, 0.1), rel=1e-9)
    assert resumed[0]["time_s"] >= round(old["elapsed"], 2)
    new = torch.load(out / "checkpoint.pt", weights_only=True)
    assert set(new) == set(FIELDS) and new["config"] == old["config"]
    assert new["step"] == 24 and new["order"] == {"epoch": 2, "cursor": 2} and new["start_bpb"] == old["start_bpb"]
    assert new["elapsed"] > old["elapsed"]
