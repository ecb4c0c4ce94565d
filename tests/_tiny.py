"""Builders shared by the trainer tests: a tiny byte-level Llama saved as `mtpc tiny-lm` saves one,
and a corpus of slices of this repository's own source."""

from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def save_tiny_lm(path, sharpen: float = 1.0) -> str:
    """A 2-layer d=32 LM (seed 0) with the byte tokenizer. `sharpen` scales the output layer: a
    confident LM has no float near-ties between greedy choices and a peaky teacher for the KL loss."""
    from mtpc.training.tiny_lm import TinyLMConfig, build_model
    from mtpc.tokenizer import ByteTokenizer

    torch.manual_seed(0)
    tok = ByteTokenizer()
    model = build_model(TinyLMConfig(out="", context=64, d_model=32, layers=2, heads=2, ffn=64), tok)
    if sharpen != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(sharpen)
    model.save_pretrained(path)
    tok.save(path)
    return str(path)


def write_source_corpus(path, parts: int = 12, length: int = 900, overlap: int = 400) -> str:
    """`parts` files, each `length + overlap` characters of mtpc/training/data.py starting `length` apart."""
    text = (ROOT / "mtpc" / "training" / "data.py").read_text()
    for i in range(parts):
        (Path(path) / f"part{i}.py").write_text(text[i * length:(i + 1) * length + overlap])
    return str(path)
