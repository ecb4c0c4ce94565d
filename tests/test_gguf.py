"""GGUF model files: a tiny Llama written as llama.cpp lays one out is dequantized once by transformers'
loader into mtpc's cache and then runs like any checkpoint folder; damaged and foreign files are one
clear error each, before transformers parses them."""

import importlib.util
import json

import pytest
import torch

from _gguf import tiny_bpe, tiny_llama, write_gguf
from mtpc.lm import loading
from mtpc.cli import main
from mtpc.errors import InputError
from mtpc.lm.gguf_files import DONE_FILE, check_gguf, model_folder_for

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    tok = tiny_bpe()
    model = tiny_llama(tok, seed=1)
    return write_gguf(folder / "tiny.gguf", model, tok), model, tok


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MTPC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_gguf_file_becomes_a_checkpoint_folder_with_the_same_model_and_tokenizer(tiny, cache):
    file, model, tok = tiny
    folder = loading.model_folder(file)
    assert folder.parent.parent == cache and (folder / DONE_FILE).is_file()
    assert json.loads((folder / DONE_FILE).read_text())["architecture"] == "llama"
    loaded, info = loading.open_model(file, allow_non_byte_vocab=True)  # the API takes the file itself
    assert info.path == folder and not info.byte_level and info.vocab_size == len(tok)
    ids = torch.tensor([tok.encode("def collate(items):\n    return")])
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=1e-5)
    assert loading.model_tokenizer(info).encode("for x in y:") == tok.encode("for x in y:")
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())


def test_the_second_run_reads_the_cached_folder_and_a_changed_file_gets_its_own(tiny, cache, tmp_path, monkeypatch):
    file, model, tok = tiny
    first = model_folder_for(file)
    made = (first / "model.safetensors").stat().st_mtime_ns
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    assert model_folder_for(file) == first and (first / "model.safetensors").stat().st_mtime_ns == made
    monkeypatch.undo()
    monkeypatch.setenv("MTPC_CACHE_DIR", str(cache))
    other = write_gguf(tmp_path / "other.gguf", tiny_llama(tok, seed=2), tok)
    assert model_folder_for(other) != first


def test_generate_takes_a_gguf_file_and_decodes_as_transformers_generate(tiny, capsys):
    file, model, tok = tiny
    prompt = "def collate(items):\n"
    assert main(["generate", "--model", str(file), prompt, "--max-new-tokens", "12", "--no-stream"]) == 0
    out = capsys.readouterr().out
    ids = torch.tensor([tok.encode(prompt)])  # its own rule: this file's tokenizer adds no bos token
    expected = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert out.rstrip("\n") == tok.decode(expected[0, ids.shape[1]:], skip_special_tokens=True)
    assert main(["generate", "--model", str(file), prompt, "--max-new-tokens", "4", "--dtype", "bf16"]) == 0


def test_damaged_and_foreign_files_are_refused_before_transformers_reads_them(tiny, tmp_path):
    file = tiny[0]
    data = file.read_bytes()
    cases = {
        "truncated.gguf": (data[: len(data) - 5000], "truncated"),
        "short.gguf": (data[:10], "truncated"),
        "foreign.gguf": (b"PK\x03\x04" + bytes(200), "not a GGUF file"),
        "version.gguf": (data[:4] + (9).to_bytes(4, "little") + data[8:], "GGUF version 9"),
        "counts.gguf": (data[:8] + (2**40).to_bytes(8, "little") + data[16:], "claims"),
        "garbled.gguf": (data[:24] + bytes(range(256)) * 4 + data[24 + 1024:], "damaged"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(InputError, match=message):
            check_gguf(tmp_path / name)


def test_a_gguf_mistake_is_one_line_on_the_command_line(tiny, tmp_path, capsys, monkeypatch):
    (tmp_path / "cut.gguf").write_bytes(tiny[0].read_bytes()[:3000])
    assert main(["generate", "--model", str(tmp_path / "cut.gguf"), "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mtpc: error:") and "truncated" in err[0]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    assert main(["generate", "--model", str(tiny[0]), "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install" in err[0] and "gguf" in err[0]


def test_dtype_names_are_checked_where_they_are_parsed(capsys):
    assert main(["generate", "--model", "x", "--dtype", "float16", "hi"]) == 2
    assert "expected one of fp32, bf16, fp64, float32, bfloat16, float64" in capsys.readouterr().err


def test_bench_runs_llama_cpp_on_the_same_gguf_beside_plain_decoding(tiny, tmp_path, capsys, monkeypatch):
    """`mtpc bench --peers llama.cpp` (llama-cpp-python installed): llama.cpp decodes the --model GGUF file
    itself on the same prompts, a row of its own whose greedy check is reported and left out of the run's
    verdict (its kernels are its own), and its tokens counted as the other rows'."""
    llama_cpp = pytest.importorskip("llama_cpp")
    file = tiny[0]
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.py").write_text("def collate(items):\n    return [item for item in items]\n" * 40)
    head = tmp_path / "ff2"
    assert main(["train", "--model", str(file), "--circuit", "examples/ff.pc", "-D", "n=2", "--parameterisation",
                 "tied", "--data", str(data), "--out", str(head), "--steps", "1", "--seq-len", "32",
                 "--batch-size", "2", "--val-sequences", "1", "--val-windows", "4", "--no-progress"]) == 0
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def collate(items):\nimport os\n")
    out = tmp_path / "bench"
    assert main(["bench", "--model", str(file), "--heads", str(head), "--prompts", str(prompts), "--num-prompts", "2",
                 "--repeats", "1", "--max-new-tokens", "8", "--peers", "llama.cpp", "generate", "--threads", "1",
                 "--out", str(out), "--no-progress"]) == 0
    report = json.loads((out / "bench.json").read_text())
    peers = {r["label"]: r for r in report["peers"]}
    llama = peers["llama.cpp"]
    assert llama["kind"] == "llama.cpp" and "quantized weights" in llama["detail"] and llama["tok_s"]["mean"] > 0
    assert llama["tokens"] == peers["hf generate"]["tokens"] == report["plain"]["tokens"]  # the same budget
    assert llama["greedy_check"]["compared"] == 2 and llama["mu_acc"]["mean"] == 1
    assert report["greedy_identical"] is (not peers["hf generate"]["greedy_check"]["mismatches"]
                                           and all(not h["greedy_check"]["mismatches"] for h in report["heads"]))
    assert "llama.cpp: from its first new token" in (out / "bench.md").read_text()
    capsys.readouterr()

    def unloadable(**kwargs):
        raise ValueError(f"Failed to load model from file: {kwargs['model_path']}")

    monkeypatch.setattr(llama_cpp, "Llama", unloadable)  # a file llama.cpp cannot run: one line, exit 1
    assert main(["bench", "--model", str(file), "--heads", str(head), "--prompts", str(prompts), "--num-prompts", "2",
                 "--repeats", "1", "--max-new-tokens", "8", "--peers", "llama.cpp", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("mtpc: error: --peers llama.cpp: llama.cpp could not load") and not any("Traceback" in line for line in err)
