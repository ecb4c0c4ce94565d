"""`mtpc features --draft-layers k` and `mtpc train --features DIR --lora-layers k` (issue 63, item 1): the
store also holds the input of the LM's last k layers, a training step runs only those layers (LoRA on),
the final norm and the head, and gives the live LM's loss and gradients with the same adapters and head;
a store without those features, or of another k, is refused with the command that makes one."""

import json
import shutil

import pytest
import torch

from _tiny import save_tiny_lm, write_source_corpus
from mtpc.lm import loading
from mtpc.cli.commands import main
from mtpc.heads.nll_loss import valid_counts
from mtpc.training.config import FeaturesConfig, TrainConfig
from mtpc.training.data import collate
from mtpc.training.features import INNER_POSITIONS, MANIFEST, FeatureSet, sequence_bytes, write_features
from mtpc.training.trainer import Trainer

SEQ = 64
BTREE = "examples/btree.pc"


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("lm"))  # 2 decoder layers, d = 32


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_source_corpus(tmp_path_factory.mktemp("corpus"), parts=4)


def make_store(lm, corpus, out, draft_layers=0, lines=None):
    cfg = FeaturesConfig(model=lm, out=str(out), data=corpus, seq_len=SEQ, shard_sequences=8, val_sequences=4,
                         max_tokens=16 * SEQ, draft_layers=draft_layers, progress=False)
    summary = write_features(cfg, announce=(lines.append if lines is not None else lambda line: None))
    return out, summary


@pytest.fixture(scope="module")
def stores(lm, corpus, tmp_path_factory):
    """draft_layers -> (store folder, write summary, the announced lines)."""
    base = tmp_path_factory.mktemp("stores")
    made = {}
    for k in (0, 1, 2):
        lines = []
        out, summary = make_store(lm, corpus, base / f"k{k}", k, lines)
        made[k] = (out, summary, lines)
    return made


def train_config(lm, out, **kw):
    return TrainConfig(model=lm, out=str(out), circuit=BTREE, bindings={"n": 4, "r": 2}, steps=2, seq_len=SEQ,
                       batch_size=4, precision="fp32", loss="nll+kl", progress=False, val_sequences=2, **kw)


def randomize_lora(module) -> None:
    """LoRA's B starts at zero (the draft path is then the verifier's): random weights make the paths differ."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in module.lm.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)


def loss_and_grads(module, args, **cached):
    module.zero_grad(set_to_none=True)
    loss, _, _ = module(*args, **cached)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("k", [1, 2])
def test_the_loss_from_inner_features_is_the_live_lms_with_the_same_lora_and_head(lm, stores, tmp_path, k):
    trainer = Trainer(train_config(lm, tmp_path / "head", features=str(stores[k][0]), lora_layers=k))
    module = trainer.module.eval()  # no dropout (LoRA's is 0 too)
    randomize_lora(module)
    batch = collate(trainer.train_set[i] for i in range(4))
    assert batch["inner"].shape == batch["hidden"].shape == (4, SEQ, 32)
    n, v = trainer.head.num_variables, trainer.head.num_states
    norm = valid_counts(batch["doc_ids"], batch["loss_mask"], batch["tokens"], n, v)
    args = (batch["tokens"], batch["doc_ids"], batch["loss_mask"], norm)
    live, live_grads = loss_and_grads(module, args)  # the whole LM: draft path adapters on, teacher off
    cached, cached_grads = loss_and_grads(module, args, hidden=batch["hidden"], inner=batch["inner"])
    torch.testing.assert_close(cached, live, rtol=1e-5, atol=1e-6)
    assert live_grads.keys() == cached_grads.keys() and any("lora_" in name for name in live_grads)
    for name, grad in live_grads.items():
        torch.testing.assert_close(cached_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    with torch.no_grad():  # the adapters matter: the draft path's states are not the stored verifier's
        assert not torch.allclose(module.hidden_from_inner(batch["inner"]), batch["hidden"], atol=1e-3)


def test_a_step_from_the_store_never_runs_the_first_layers(lm, stores, tmp_path):
    trainer = Trainer(train_config(lm, tmp_path / "head", features=str(stores[1][0]), lora_layers=1))
    decoder = trainer.module.base.get_decoder()
    calls = {"embed": 0, "layer 0": 0, "layer 1": 0}
    hooks = [module.register_forward_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
             for name, module in (("embed", decoder.embed_tokens), ("layer 0", decoder.layers[0]),
                                  ("layer 1", decoder.layers[1]))]
    try:
        trainer.train_step()
    finally:
        for hook in hooks:
            hook.remove()
    assert calls == {"embed": 0, "layer 0": 0, "layer 1": 1}


def test_train_with_lora_from_inner_features_on_the_command_line(lm, stores, tmp_path):
    out = tmp_path / "head"
    argv = ["train", "--model", lm, "--features", str(stores[1][0]), "--lora-layers", "1", "--circuit", BTREE,
            "-D", "n=4", "-D", "r=2", "--steps", "2", "--seq-len", str(SEQ), "--batch-size", "4", "--loss", "nll+kl",
            "--val-sequences", "2", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    assert (out / "head.safetensors").is_file() and (out / "lora" / "adapter_config.json").is_file()
    adapter = json.loads((out / "lora" / "adapter_config.json").read_text())
    assert adapter["layers_to_transform"] == [1]
    from safetensors.torch import load_file

    weights = load_file(str(next((out / "lora").glob("adapter_model.safetensors"))))
    assert any("lora_B" in name and t.abs().max() > 0 for name, t in weights.items())  # the adapters trained
    config = json.loads((out / "train_config.json").read_text())
    assert config["lora_dir"] == "lora" and config["train_tokens"] == 2 * 4 * SEQ


def fails(capsys, argv, *fragments):
    """Run `mtpc argv` in-process: exit status 2, one `mtpc: error:` line holding every fragment."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    line = err.split("mtpc: error:")[-1]  # a refusal after the model loads follows transformers' progress bar
    assert err.count("mtpc: error:") == 1 and "\n" not in line.strip() and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def train_args(lm, store, out, *extra):
    return ["train", "--model", lm, "--features", str(store), "--circuit", BTREE, "-D", "n=4", "-D", "r=2",
            "--steps", "1", "--seq-len", str(SEQ), "--batch-size", "2", "--out", str(out), "--no-progress", *extra]


def test_lora_layers_with_a_store_of_no_or_other_inner_features_is_one_line_naming_the_command(
        lm, stores, tmp_path, capsys):
    fails(capsys, train_args(lm, stores[0][0], tmp_path / "h", "--lora-layers", "1"), "--lora-layers 1",
          "no inner-layer features", f"run mtpc features --model {lm} --out NEW_DIR --draft-layers 1 --seq-len {SEQ}")
    fails(capsys, train_args(lm, stores[1][0], tmp_path / "h", "--lora-layers", "2"),
          "holds the input of the last 1 layer;", "--draft-layers 2")
    assert not (tmp_path / "h").exists()
    # a store made with --draft-layers trains a head without LoRA too (reading only the final states)
    assert main(train_args(lm, stores[1][0], tmp_path / "plain")) == 0


def test_a_store_whose_inner_features_were_made_otherwise_or_are_missing_is_refused(lm, stores, tmp_path, capsys):
    other = shutil.copytree(stores[1][0], tmp_path / "other", ignore=shutil.ignore_patterns(".*"))
    manifest = json.loads((other / MANIFEST).read_text())
    manifest["settings"]["inner_positions"] = "sliding, from 7\n" * 50
    (other / MANIFEST).write_text(json.dumps(manifest))
    err = fails(capsys, train_args(lm, other, tmp_path / "h", "--lora-layers", "1"), "computed another way",
                "--draft-layers 1")
    assert "sliding" not in err  # the file's own text is never echoed
    # a manifest claiming inner features over shards without them: each shard is refused, named
    claimed = shutil.copytree(stores[0][0], tmp_path / "claimed", ignore=shutil.ignore_patterns(".*"))
    manifest = json.loads((claimed / MANIFEST).read_text())
    manifest["settings"].update(draft_layers=1, inner_positions=INNER_POSITIONS)
    (claimed / MANIFEST).write_text(json.dumps(manifest))
    fails(capsys, train_args(lm, claimed, tmp_path / "h", "--lora-layers", "1"), ".safetensors", "inner-layer")


def test_the_manifest_records_draft_layers_and_the_size_estimate_counts_inner(lm, corpus, stores, tmp_path, capsys):
    for k, (store, summary, lines) in stores.items():
        settings = json.loads((store / MANIFEST).read_text())["settings"]
        assert settings["draft_layers"] == k
        assert settings.get("inner_positions") == (INNER_POSITIONS if k else None)
        # the estimate printed first is the bytes written, up to the shards' headers
        cfg = FeaturesConfig(model=lm, out="", seq_len=SEQ, draft_layers=k)
        estimate = summary["sequences"] * sequence_bytes(cfg, 32, 4)
        assert 0 <= summary["bytes"] - estimate < 0.02 * estimate, (k, summary["bytes"], estimate)
        assert ("input of the last" in lines[0]) == (k > 0)
    assert sequence_bytes(FeaturesConfig(model=lm, out="", seq_len=SEQ, draft_layers=1), 32, 4) == \
        sequence_bytes(FeaturesConfig(model=lm, out="", seq_len=SEQ), 32, 4) + SEQ * 32 * 4
    info = loading.model_info(lm)
    assert "inner" in FeatureSet(stores[1][0], "val", info, inner=True)[0]
    assert "inner" not in FeatureSet(stores[1][0], "val", info)[0]  # not read unless the LoRA path needs it
    # a rerun with another k is refused; a store written before draft_layers was recorded still resumes
    capsys.readouterr()
    argv = ["features", "--model", lm, "--out", str(stores[0][0]), "--data", corpus, "--seq-len", str(SEQ),
            "--shard-sequences", "8", "--val-sequences", "4", "--max-tokens", str(16 * SEQ), "--draft-layers", "1",
            "--no-progress"]
    assert main(argv) == 2
    assert "draft_layers 0 there, 1 now" in capsys.readouterr().err
    legacy = shutil.copytree(stores[0][0], tmp_path / "legacy", ignore=shutil.ignore_patterns(".*"))
    manifest = json.loads((legacy / MANIFEST).read_text())
    del manifest["settings"]["draft_layers"]
    (legacy / MANIFEST).write_text(json.dumps(manifest))
    assert make_store(lm, corpus, legacy)[1]["new_tokens"] == 0


def test_draft_layers_past_the_models_layers_is_refused_before_any_work(lm, corpus, tmp_path, capsys):
    argv = ["features", "--model", lm, "--out", str(tmp_path / "f"), "--data", corpus, "--draft-layers", "3",
            "--seq-len", str(SEQ), "--no-progress"]
    fails(capsys, argv, "--draft-layers 3 is more than the model's 2 decoder layers")
    assert not (tmp_path / "f").exists()
