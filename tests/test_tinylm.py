import json

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
