"""`mtpc export-hf`: a GGUF file written as a checkpoint folder vLLM and transformers load, holding the
weights mtpc decodes the GGUF with (fp32: the same logits; bf16: those weights rounded once), its
tokenizer, chat template and generation config; the GGUF refusals of `--model x.gguf`, and an output
folder that is replaced only when asked and only when it is a model folder."""

from __future__ import annotations

import json
import stat

import pytest
import torch

from _gguf import tiny_bpe, tiny_llama, write_gguf
from mtpc.lm import loading
from mtpc.cli import main
from mtpc.lm.gguf_export import RECORD_FILE, export_gguf, file_mode
from mtpc.lm.gguf_files import content_digest

pytest.importorskip("gguf")

PROMPT = "def collate(items):\n    return"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    tok = tiny_bpe()
    return write_gguf(folder / "tiny.gguf", tiny_llama(tok, seed=1), tok), tok


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MTPC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtpc: error: "), captured.err
    return lines[0]


def leftovers(folder) -> list[str]:
    """Temporary folders an export left beside its output (none, whatever happened)."""
    return sorted(p.name for p in folder.parent.iterdir() if ".part-" in p.name or ".old-" in p.name)


def test_the_exported_folder_gives_the_logits_of_mtpcs_own_gguf_load(tiny, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    file, tok = tiny
    out = tmp_path / "tiny-hf"
    assert main(["export-hf", "--model", str(file), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"wrote {out}: LlamaForCausalLM, ") and "in fp32" in printed[0]
    assert "mtpc serve --model" in printed[1]
    mtpc_model, info = loading.open_model(file, allow_non_byte_vocab=True)  # what --model tiny.gguf decodes with
    exported = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    ids = torch.tensor([tok.encode(PROMPT)])
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, mtpc_model(ids).logits, rtol=0, atol=0)
    loaded_tok = AutoTokenizer.from_pretrained(str(out))
    assert loaded_tok.encode("for x in y:") == loading.model_tokenizer(info).encode(b"for x in y:")
    assert loaded_tok.chat_template == tok.chat_template and tok.chat_template
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == tok.eos_token_id
    record = json.loads((out / RECORD_FILE).read_text())
    assert record == {"source": "tiny.gguf", "sha256": content_digest(file), "dtype": "fp32"}
    assert leftovers(out) == []
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert set(modes.values()) == {file_mode()}, modes  # the weights too (transformers writes them 0o600)


def test_bf16_holds_the_fp32_weights_rounded_once(tiny, tmp_path):
    from safetensors.torch import load_file

    file = tiny[0]
    full = export_gguf(file, tmp_path / "fp32")
    half = export_gguf(file, tmp_path / "bf16", dtype="bf16")
    assert half.dtype == "bf16" and half.parameters == full.parameters and half.bytes < full.bytes * 0.6
    fp32, bf16 = load_file(str(full.folder / "model.safetensors")), load_file(str(half.folder / "model.safetensors"))
    assert fp32.keys() == bf16.keys()
    for name, weight in fp32.items():
        assert bf16[name].dtype == torch.bfloat16 and torch.equal(bf16[name], weight.to(torch.bfloat16)), name


def test_an_output_folder_is_replaced_only_with_force_and_only_a_model_folder(tiny, tmp_path, capsys):
    file = tiny[0]
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["export-hf", "--model", str(file), "--out", str(out)]) == 2
    assert "already holds files; give --force" in one_error_line(capsys)
    assert main(["export-hf", "--model", str(file), "--out", str(out), "--force"]) == 2
    assert "no model folder (no config.json)" in one_error_line(capsys)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # untouched
    first = export_gguf(file, tmp_path / "model")
    capsys.readouterr()  # transformers' progress bars
    assert main(["export-hf", "--model", str(file), "--out", str(first.folder)]) == 2
    assert "already holds files" in one_error_line(capsys)
    assert main(["export-hf", "--model", str(file), "--out", str(first.folder), "--force", "--dtype", "bf16"]) == 0
    capsys.readouterr()
    assert json.loads((first.folder / RECORD_FILE).read_text())["dtype"] == "bf16"
    assert leftovers(first.folder) == []
    inside = tmp_path / "holder"
    inside.mkdir()
    (inside / "config.json").write_text("{}")
    (inside / "tiny.gguf").write_bytes(file.read_bytes())
    assert main(["export-hf", "--model", str(inside / "tiny.gguf"), "--out", str(inside), "--force"]) == 2
    assert "holds the GGUF file tiny.gguf itself" in one_error_line(capsys)
    assert (inside / "tiny.gguf").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["export-hf", "--model", str(file), "--out", str(empty)]) == 0  # an empty folder is new enough
    assert (empty / "model.safetensors").is_file()


def test_what_mtpc_refuses_as_a_gguf_model_it_refuses_to_export(tiny, tmp_path, capsys):
    file = tiny[0]
    out = tmp_path / "never"
    (tmp_path / "cut.gguf").write_bytes(file.read_bytes()[:3000])
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "other.gguf").write_bytes(file.read_bytes().replace(b"llama", b"xlama"))  # its keys renamed alike
    cases = {str(tmp_path / "cut.gguf"): "truncated", str(tmp_path / "missing.gguf"): "does not exist",
             str(tmp_path / "other.gguf"): "architecture 'xlama' is not one transformers' GGUF loader builds",
             str(tmp_path / "notes.txt"): "not a GGUF file", str(tmp_path): "is a folder; export-hf writes"}
    for model, message in cases.items():
        assert main(["export-hf", "--model", model, "--out", str(out)]) == 2
        assert message in one_error_line(capsys), model
        assert not out.exists() and leftovers(out) == []
    assert main(["export-hf", "--model", str(file), "--out", str(out), "--dtype", "fp64"]) == 2
    assert "invalid choice: 'fp64'" in one_error_line(capsys)
    (tmp_path / "file").write_text("x")
    assert main(["export-hf", "--model", str(file), "--out", str(tmp_path / "file")]) == 2
    assert "exists and is not a folder" in one_error_line(capsys)
