"""The reference LM and heads shipped in models/ load and decode right after install: what the README's
quick start runs (greedy speculative output identical to plain greedy, the stats line on stderr)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mtpc import SpeculativeDecoder, PlainDecoder, load_head
from mtpc.cli import main
from mtpc.lm.loading import model_info, open_model

ROOT = Path(__file__).resolve().parents[1]
LM = ROOT / "models" / "byte-lm"
HEADS = [ROOT / "models" / "heads" / name for name in ("ff8", "btree8-r8")]
pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_model_card_numbers_are_the_shipped_run():
    card = (ROOT / "models" / "README.md").read_text()
    summary = json.loads((LM / "tiny_lm.json").read_text())
    assert f"{summary['val_bits_per_byte']:.3f} bits/byte" in card
    assert f"{summary['train_tokens']:,} tokens" in card
    for head in HEADS:
        config = json.loads((head / "train_config.json").read_text())
        assert f"| {config['steps']} |" in card and "runs/" not in config.get("model", "")
    for stage in (1, 2):  # the BTree's hour and its second stage (shipped now: its fourth)
        config = json.loads((ROOT / "models" / "heads" / "btree8-r8" / f"train_config.stage{stage}.json").read_text())
        assert f"| {config['steps']} |" in card
    info = model_info(LM)
    assert info.byte_level and info.hidden_size == 192


@pytest.mark.parametrize("head_dir", HEADS, ids=lambda p: p.name)
def test_shipped_heads_decode_exactly(head_dir):
    model, _ = open_model(LM)
    head = load_head(head_dir).eval()
    prompt = torch.tensor([[1] + list(b"def fibonacci(n):\n")])
    plain = PlainDecoder(model).generate(prompt, 48).sequences
    spec = SpeculativeDecoder(model, head).generate(prompt, 48)
    assert torch.equal(spec.sequences, plain)
    assert spec.stats.mean_accepted >= 1.0


def test_the_quick_start_command_runs(capsys):
    assert main(["generate", "--model", str(LM), "--head", str(HEADS[0]), "--compare", "--threads", "1",
                 "--max-new-tokens", "32", "def fibonacci("]) == 0
    err = capsys.readouterr().err
    assert "greedy outputs identical: yes" in err


# --------------------------------------------------------------------------- the subword pair

SUBWORD_LM = ROOT / "models" / "subword-lm"
SUBWORD_HEAD = ROOT / "models" / "heads" / "subword-btree4-r4-tied"


def test_the_subword_model_card_numbers_are_the_shipped_run():
    card = (ROOT / "models" / "README.md").read_text()
    section = " ".join(card[card.index("## `subword-lm/`"):].split())
    summary = json.loads((SUBWORD_LM / "tiny_lm.json").read_text())
    assert f"{summary['val_bits_per_byte']:.3f} bits/byte" in section
    assert f"{summary['val_bits_per_token']:.3f} bits/token" in section
    assert f"{summary['steps']:,} steps" in section and f"{summary['train_tokens']:,} tokens" in section
    config = json.loads((SUBWORD_HEAD / "train_config.json").read_text())
    assert f"| {config['steps']} |" in section and "runs/" not in config["model"]
    info = model_info(SUBWORD_LM, allow_non_byte_vocab=True)
    assert not info.byte_level and info.vocab_size == 2048 and info.hidden_size == 192
    files = [f for folder in (SUBWORD_LM, SUBWORD_HEAD) for f in folder.iterdir()]
    assert sum(f.stat().st_size for f in files) <= 15 * 10**6 and "checkpoint.pt" not in {f.name for f in files}


def test_the_shipped_subword_head_decodes_exactly(capsys):
    assert main(["generate", "--model", str(SUBWORD_LM), "--head", str(SUBWORD_HEAD), "--compare", "--threads", "1",
                 "--max-new-tokens", "32", "def fibonacci("]) == 0
    assert "greedy outputs identical: yes" in capsys.readouterr().err
