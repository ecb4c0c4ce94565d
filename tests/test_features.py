"""`mtpc features` and `mtpc train --features`: the LM's cached hidden states give the same loss as the
live LM on the same sequences, a killed or extended run completes without redoing finished shards, and
a store of another model, a damaged shard or a planted manifest is refused."""

import json
import os

import pytest
import torch

from _tiny import save_tiny_lm, write_source_corpus
from mtpc.lm import loading
from mtpc.cli import main
from mtpc.errors import InputError
from mtpc.heads.nll_loss import valid_counts
from mtpc.training.config import FeaturesConfig, TrainConfig
from mtpc.training.data import collate
from mtpc.training.features import MANIFEST, FeatureSet, write_features
from mtpc.training.trainer import Trainer

SEQ = 64


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("lm"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_source_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def store(lm, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("features") / "f"
    write_features(FeaturesConfig(model=lm, out=str(out), data=corpus, seq_len=SEQ, shard_sequences=8,
                                  val_sequences=4, progress=False), announce=lambda line: None)
    return out


def train_config(lm, out, **kw):
    return TrainConfig(model=lm, out=str(out), circuit="examples/btree.pc", bindings={"n": 4, "r": 2}, steps=2,
                       seq_len=SEQ, batch_size=4, precision="fp32", loss="nll+kl", progress=False, val_sequences=2,
                       **kw)


def test_cached_hidden_states_give_the_live_lms_loss_on_the_same_sequences(lm, corpus, store, tmp_path):
    trainer = Trainer(train_config(lm, tmp_path / "head", features=str(store)))
    live = Trainer(train_config(lm, tmp_path / "live", data=corpus))
    cached = {bytes(live.train_set[i]["tokens"].numpy()) for i in range(len(live.train_set))}
    assert len(trainer.train_set) == len(live.train_set)  # every training sequence, each once
    assert all(bytes(trainer.train_set[i]["tokens"].numpy()) in cached for i in range(len(trainer.train_set)))
    batch = collate(trainer.train_set[i] for i in range(4))
    n, v = trainer.head.num_variables, trainer.head.num_states
    norm = valid_counts(batch["doc_ids"], batch["loss_mask"], batch["tokens"], n, v)
    args = (batch["tokens"], batch["doc_ids"], batch["loss_mask"], norm)
    with torch.no_grad():
        from_lm, _, _ = trainer.module(*args)
        from_cache, _, _ = trainer.module(*args, hidden=batch["hidden"])
    assert from_lm.item() > 0
    torch.testing.assert_close(from_cache, from_lm, rtol=1e-6, atol=1e-6)


def test_train_from_features_on_the_command_line(lm, store, tmp_path, capsys):
    out = tmp_path / "head"
    argv = ["train", "--model", lm, "--features", str(store), "--circuit", "examples/btree.pc", "-D", "n=4", "-D",
            "r=2", "--steps", "3", "--seq-len", str(SEQ), "--batch-size", "4", "--val-sequences", "2", "--out", str(out),
            "--no-progress"]
    assert main(argv) == 0
    assert "teacher-forced mean accepted length" in capsys.readouterr().out
    config = json.loads((out / "train_config.json").read_text())
    assert config["data"]["features"] == str(store.resolve()) and config["train_tokens"] == 3 * 4 * SEQ


def test_a_killed_run_redoes_only_its_unfinished_shard_and_a_larger_budget_extends(lm, corpus, tmp_path):
    out = tmp_path / "f"
    cfg = FeaturesConfig(model=lm, out=str(out), data=corpus, seq_len=SEQ, shard_sequences=4, val_sequences=4,
                         max_tokens=12 * SEQ, progress=False)
    first = write_features(cfg, announce=lambda line: None)
    assert first["new_tokens"] == (4 + 12) * SEQ and first["shards"] == 4
    # a kill between writing train-00002 and recording it: the file is there, the manifest does not have it
    manifest = json.loads((out / MANIFEST).read_text())
    del manifest["shards"]["train-00002.safetensors"]
    (out / MANIFEST).write_text(json.dumps(manifest))
    (out / ".train-00003.safetensors.999.tmp").write_bytes(b"half a shard")
    kept = {name: (out / name).stat().st_mtime_ns for name in ("train-00000.safetensors", "val-00000.safetensors")}
    again = write_features(cfg, announce=lambda line: None)
    assert again["new_tokens"] == 4 * SEQ and again["shards"] == 4
    assert all((out / name).stat().st_mtime_ns == t for name, t in kept.items())
    cfg.max_tokens = 20 * SEQ
    more = write_features(cfg, announce=lambda line: None)
    assert more["new_tokens"] == 8 * SEQ and more["shards"] == 6
    info = loading.model_info(lm)
    assert len(FeatureSet(out, "train", info)) == 20


def test_a_store_of_another_model_or_with_a_damaged_shard_is_refused(lm, store, tmp_path, capsys):
    other = save_tiny_lm(tmp_path / "other", sharpen=2.0)
    with pytest.raises(InputError, match="another model"):
        FeatureSet(store, "train", loading.model_info(other))
    copy = tmp_path / "copy"
    copy.mkdir()
    for file in store.iterdir():
        if not file.name.startswith("."):
            (copy / file.name).write_bytes(file.read_bytes())
    shard = copy / "train-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF
    shard.write_bytes(bytes(data))
    info = loading.model_info(lm)
    with pytest.raises(InputError, match="size or contents changed"):
        FeatureSet(copy, "train", info)
    manifest = json.loads((copy / MANIFEST).read_text())
    manifest["shards"]["../escape.safetensors"] = manifest["shards"].pop("train-00000.safetensors")
    (copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="not one mtpc features writes"):
        FeatureSet(copy, "train", info)
    argv = ["train", "--model", other, "--features", str(store), "--circuit", "examples/btree.pc", "--steps", "1",
            "--seq-len", str(SEQ), "--out", str(tmp_path / "h")]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another model" in err[0]


@pytest.mark.parametrize("extra, message", [
    (["--data", "tests"], "--data and --features"),
    (["--lora-layers", "1"], "LoRA"),
    (["--seq-len", "32"], "--seq-len 64"),
])
def test_train_settings_that_features_cannot_serve_are_refused_first(lm, store, tmp_path, capsys, extra, message):
    argv = ["train", "--model", lm, "--features", str(store), "--circuit", "examples/btree.pc", "--steps", "1",
            "--out", str(tmp_path / "h"), *(["--seq-len", str(SEQ)] if "--seq-len" not in extra else []), *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_rerunning_with_other_settings_is_refused(lm, corpus, store, capsys):
    argv = ["features", "--model", lm, "--out", str(store), "--data", corpus, "--seq-len", "32", "--shard-sequences",
            "8", "--val-sequences", "4", "--no-progress"]
    assert main(argv) == 2
    assert "other settings (seq_len 64 there, 32 now)" in capsys.readouterr().err
    assert not any(name.startswith(".") and name.endswith(".tmp") for name in os.listdir(store))
