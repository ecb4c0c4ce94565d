"""mtpc train: exact resume, DDP equivalence (real torchrun, gloo), accumulation, bad data, two stages."""

import json
import re
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from _tiny import save_tiny_lm, write_source_corpus
from mtpc.cli.commands import main
from mtpc.training.trainer import CHECKPOINT, TrainConfig, Trainer, train

ROOT = Path(__file__).resolve().parent.parent
BTREE = str(ROOT / "examples" / "btree.pc")


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("lm"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_source_corpus(tmp_path_factory.mktemp("corpus"))


def config(tiny_lm, corpus, out, **kw):
    base = dict(model=tiny_lm, out=str(out), circuit=BTREE, bindings={"n": 4, "r": 4}, data=corpus, seq_len=32,
                batch_size=4, steps=4, val_every=2, save_every=100, val_sequences=2, precision="fp32",
                progress=False, val_fraction=0.2)
    base.update(kw)
    return TrainConfig(**base)


def weights(out):
    return load_file(str(Path(out) / "head.safetensors"))


def log_losses(out, key="loss"):
    lines = (Path(out) / "train_log.jsonl").read_text().splitlines()
    return [json.loads(x)[key] for x in lines if f'"{key}"' in x]


def test_training_reduces_the_loss_and_writes_a_self_describing_folder(tiny_lm, corpus, tmp_path):
    from mtpc.heads.head import load_head

    s = train(config(tiny_lm, corpus, tmp_path / "a", steps=12, lr=1e-2, warmup_steps=2))
    losses = log_losses(tmp_path / "a")
    assert sum(losses[-3:]) < sum(losses[:3])
    assert 0 <= s["val_accepted"] <= 4 and s["val_windows"] > 0
    head = load_head(tmp_path / "a")
    assert head.num_variables == 4 and head.hidden_size == 32
    cfg = json.loads((tmp_path / "a" / "train_config.json").read_text())
    assert cfg["bindings"] == {"n": 4, "r": 4} and cfg["steps"] == 12


def test_resume_is_exact(tiny_lm, corpus, tmp_path):
    """Stop after 3 of 6 steps, rerun the same command: identical weights, losses and optimizer."""
    straight = config(tiny_lm, corpus, tmp_path / "straight", steps=6, lora_layers=1, window_stride=2)
    train(straight)
    split = config(tiny_lm, corpus, tmp_path / "split", steps=6, lora_layers=1, window_stride=2, stop_after=3)
    assert train(split) == {"stopped_at": 3}
    assert not (tmp_path / "split" / "head.safetensors").exists()
    split.stop_after = None
    train(split)
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "split")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert log_losses(tmp_path / "straight") == log_losses(tmp_path / "split")
    sa = torch.load(tmp_path / "straight" / CHECKPOINT, weights_only=False)
    sb = torch.load(tmp_path / "split" / CHECKPOINT, weights_only=False)
    assert sa["sampler"] == sb["sampler"] and sa["step"] == sb["step"] == 6
    assert set(sb) == {"format", "step", "total_steps", "budget", "tokens", "elapsed", "trainable", "optimizer",
                       "sampler", "rng", "settings"} and sb["format"] == "mtpc-train-checkpoint-2"  # the format kept
    for k in sa["trainable"]:
        assert torch.equal(sa["trainable"][k], sb["trainable"][k]), k
    assert any("lora" in k for k in sa["trainable"])
    assert (tmp_path / "split" / "lora" / "adapter_config.json").exists()


def test_a_copied_run_folder_resumes_where_it_now_is(tiny_lm, corpus, tmp_path):
    """A run copied to another folder (to keep the original, as a 20-minute head extended to 60 was)
    resumes from its checkpoint there: the folder is where the run lies, not one of its settings. The
    copy ends as the uninterrupted run does."""
    import shutil

    train(config(tiny_lm, corpus, tmp_path / "straight", steps=6))
    first = config(tiny_lm, corpus, tmp_path / "first", steps=6, stop_after=3)
    assert train(first) == {"stopped_at": 3}
    shutil.copytree(tmp_path / "first", tmp_path / "copy")
    train(config(tiny_lm, corpus, tmp_path / "copy", steps=6))
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "copy")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert log_losses(tmp_path / "straight") == log_losses(tmp_path / "copy")
    assert not (tmp_path / "first" / "head.safetensors").exists()  # the original is left as it was


def test_gradient_accumulation_matches_one_big_batch(tiny_lm, corpus, tmp_path):
    train(config(tiny_lm, corpus, tmp_path / "one", steps=2))
    train(config(tiny_lm, corpus, tmp_path / "acc", steps=2, grad_accum=2))
    a, b = weights(tmp_path / "one"), weights(tmp_path / "acc")
    for k in a:  # Adam turns rounding noise of near-zero gradients into ~1e-5 weight differences
        torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-4)
    for key in ("loss", "grad_norm"):
        assert log_losses(tmp_path / "one", key) == pytest.approx(log_losses(tmp_path / "acc", key), rel=1e-5)


def test_two_stage_schedule_adds_lora_to_a_trained_head(tiny_lm, corpus, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from mtpc import SpeculativeDecoder, load_head
    from mtpc.decoding import PlainDecoder

    train(config(tiny_lm, corpus, tmp_path / "stage1", steps=2))
    stage2 = config(tiny_lm, corpus, tmp_path / "stage2", steps=2, circuit=None, bindings={},
                    init_head=str(tmp_path / "stage1"),
                    lora_layers=1)
    train(stage2)
    assert not torch.equal(weights(tmp_path / "stage1")["weight"], weights(tmp_path / "stage2")["weight"])
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_lm), str(tmp_path / "stage2" / "lora"))
    assert json.loads((tmp_path / "stage2" / "lora" / "adapter_config.json").read_text())["layers_to_transform"] == [1]
    head = load_head(tmp_path / "stage2").double()
    decoder = SpeculativeDecoder(model.double().eval(), head, lora_layers=1)  # the outputs plug into the decoder
    prompt = torch.tensor([[257, 100, 101, 102]])
    out = decoder.generate(prompt, max_new_tokens=12)
    with model.disable_adapter():  # plain greedy decoding of the base model (the verifier)
        plain = PlainDecoder(model.get_base_model()).generate(prompt, max_new_tokens=12)
    assert torch.equal(out.sequences, plain.sequences)


def test_a_second_stage_can_read_the_first_token(tiny_lm, corpus, tmp_path):
    """`--first-token` on an `--init-head` head: it starts from the head's own distributions (a zero
    embedding: the same held-out windows scored the same) and trains the embedding; the saved head reads it."""
    from mtpc.heads.head import load_head

    # the CLI's split (val_fraction 0.02): the same held-out windows in both stages
    train(config(tiny_lm, corpus, tmp_path / "stage1", steps=2, val_fraction=0.02))
    assert main(["train", "--model", tiny_lm, "--init-head", str(tmp_path / "stage1"), "--data", corpus, "--out",
                 str(tmp_path / "stage2"), "--steps", "3", "--seq-len", "32", "--batch-size", "4", "--precision",
                 "fp32", "--no-progress", "--first-token", "--val-every", "1", "--lr", "1e-2",
                 "--val-sequences", "2"]) == 0
    records = [json.loads(x) for x in (tmp_path / "stage2" / "train_log.jsonl").read_text().splitlines()]
    first = json.loads((tmp_path / "stage1" / "train_log.jsonl").read_text().splitlines()[-1])
    start = records[0]
    assert start["step"] == 0 and start["val_committed"] == pytest.approx(first["val_committed"])
    assert start["val_accepted"] == start["val_committed"] >= 1  # counted after x_0, as the decoder drafts
    head = load_head(tmp_path / "stage2")
    assert head.reads_first_token and head.first_embedding.abs().sum() > 0
    assert json.loads((tmp_path / "stage2" / "train_config.json").read_text())["first_token"] is True


def test_a_second_stage_can_read_the_first_token_through_an_mlp(tiny_lm, corpus, tmp_path):
    """`--first-token-mlp m` implies `--first-token`; it starts from the head's own distributions (a zero
    output layer) and trains the MLP; the saved head reads x_0 through it."""
    from mtpc.heads.head import load_head

    train(config(tiny_lm, corpus, tmp_path / "stage1", steps=2, val_fraction=0.02))  # the CLI's split
    assert main(["train", "--model", tiny_lm, "--init-head", str(tmp_path / "stage1"), "--data", corpus, "--out",
                 str(tmp_path / "stage2"), "--steps", "3", "--seq-len", "32", "--batch-size", "4", "--precision",
                 "fp32", "--no-progress", "--first-token-mlp", "6", "--val-every", "1", "--lr", "1e-2",
                 "--val-sequences", "2"]) == 0
    records = [json.loads(x) for x in (tmp_path / "stage2" / "train_log.jsonl").read_text().splitlines()]
    first = json.loads((tmp_path / "stage1" / "train_log.jsonl").read_text().splitlines()[-1])
    assert records[0]["step"] == 0 and records[0]["val_committed"] == pytest.approx(first["val_committed"])
    head = load_head(tmp_path / "stage2")
    assert head.reads_first_token and head.first_mlp_in.shape[0] == 6 and head.first_mlp_out.abs().sum() > 0
    assert json.loads((tmp_path / "stage2" / "train_config.json").read_text())["first_token_mlp"] == 6


def test_bad_data_is_skipped_not_fatal(tiny_lm, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    good = {"messages": [{"role": "user", "content": "say hi"}, {"role": "assistant", "content": "hi there! " * 6}]}
    lines = [json.dumps(good)] * 30 + ["{broken", json.dumps({"messages": [{"role": "x", "content": 1}]}), ""]
    (data / "chat.jsonl").write_text("\n".join(lines) + "\n")
    (data / "blob.bin").write_bytes(b"\x00\xff" * 100)
    (data / "empty.txt").write_text("")
    s = train(config(tiny_lm, str(data), tmp_path / "out", steps=2, val_fraction=0.1))
    assert s["data"] == {"documents": 30, "skipped_empty": 1, "skipped_corrupt": 2, "skipped_binary": 1}
    assert s["steps"] == 2 and all(l == l for l in log_losses(tmp_path / "out"))  # finite, not NaN


def test_time_budget_is_turned_into_a_step_count(tiny_lm, corpus, tmp_path):
    s = train(config(tiny_lm, corpus, tmp_path / "budget", steps=None, minutes=0.05))
    assert s["steps"] >= 2
    state = torch.load(tmp_path / "budget" / CHECKPOINT, weights_only=False)
    assert state["total_steps"] == s["steps"]
    lrs = log_losses(tmp_path / "budget", "lr")
    assert lrs[0] < lrs[1]  # still warming up, not already at the end of the schedule


def test_time_budget_is_wall_clock_even_when_the_first_steps_are_slow(tiny_lm, corpus, tmp_path, monkeypatch):
    """The first steps of a run are slower than the rest (allocations, page faults); a step count sized
    on them alone ended a 15-minute run in 12. Here the first two steps take 0.5 s each and the rest a
    few ms: the run still fills its 3 s."""
    original = Trainer.train_step

    def first_two_slow(self):
        if self.step < 2:
            time.sleep(0.5)
        return original(self)

    monkeypatch.setattr(Trainer, "train_step", first_two_slow)
    s = train(config(tiny_lm, corpus, tmp_path / "budget", steps=None, minutes=0.05))
    assert s["train_seconds"] >= 2.7 and s["steps"] > 6  # sized after step 2 alone: 6 steps in about 1 s


def test_cli_train_parses_defines_and_runs(tiny_lm, corpus, tmp_path, capsys):
    assert main(["train", "--model", tiny_lm, "--circuit", BTREE, "-D", "n=4", "-D", "r=2", "--data", corpus,
                 "--out", str(tmp_path / "cli"), "--steps", "2", "--seq-len", "32", "--batch-size", "2",
                 "--precision", "fp32", "--no-progress"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    config = json.loads((tmp_path / "cli" / "train_config.json").read_text())
    assert config["tokens_per_second"] > 0
    assert re.fullmatch(rf"saved .*: 2 steps, 128 tokens in \d+ s \({config['tokens_per_second']:,} tok/s\); held-out loss .* "
                        r"mean accepted length .*", line), line
    assert json.loads((tmp_path / "cli" / "head.json").read_text())["graph"]["variables"] == 4


@pytest.mark.parametrize("parameterisation", ["shared", "factorised"])
def test_cli_trains_cheap_head_parameterisations(tiny_lm, corpus, tmp_path, parameterisation):
    from mtpc.heads.head import load_head

    out = tmp_path / parameterisation
    assert main(["train", "--model", tiny_lm, "--circuit", BTREE, "-D", "n=4", "-D", "r=2", "--data", corpus,
                 "--out", str(out), "--steps", "3", "--seq-len", "32", "--batch-size", "2", "--precision", "fp32",
                 "--no-progress", "--parameterisation", parameterisation, "--adapter-rank", "3",
                 "--factor-rank", "5"]) == 0
    head = load_head(out)
    assert head.parameterisation == parameterisation and head.adapter_rank == 3
    losses = log_losses(out)
    assert all(loss == loss for loss in losses)  # finite, trained through the generic chunked loss path


@pytest.mark.slow  # two real torchrun processes: 17 s on 2 cores
def test_ddp_two_processes_equal_one_process(tiny_lm, corpus, tmp_path):
    """A real `torchrun --nproc_per_node 2` (gloo, CPU) equals one process on the same global batch."""
    args = ["train", "--model", tiny_lm, "--circuit", BTREE, "-D", "n=4", "-D", "r=4", "--data", corpus,
            "--steps", "3", "--seq-len", "32", "--batch-size", "4", "--precision", "fp32", "--no-progress",
            "--val-every", "100", "--window-stride", "3"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "mtpc.cli",
           *args, "--out", str(tmp_path / "ddp")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert main([*args, "--out", str(tmp_path / "single")]) == 0
    a, b = weights(tmp_path / "ddp"), weights(tmp_path / "single")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-4)
    assert json.loads((tmp_path / "ddp" / "train_config.json").read_text())["world_size"] == 2
    ddp_losses, single_losses = log_losses(tmp_path / "ddp"), log_losses(tmp_path / "single")
    assert ddp_losses == pytest.approx(single_losses, rel=1e-5)
    # Adam hides a gradient scale error in the weights; the logged pre-clipping norm does not
    assert log_losses(tmp_path / "ddp", "grad_norm") == pytest.approx(log_losses(tmp_path / "single", "grad_norm"),
                                                                       rel=1e-5)
