"""Hostile GGUF files and a hostile converted-model cache (issue 61).

Every count, length and offset a GGUF claims is checked against its bytes before transformers' loader
sees it (`mtpc.lm.gguf_format`), in bounded time; the file named is the file read, whatever the working
folder; a converted folder is used only while it is ours alone and its record names the file's bytes;
the file's identity survives `touch`; killed conversions are swept; a GGUF's own tokenizer is always its
tokenizer, and a prompt is what that tokenizer makes of the text.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from _gguf import tiny_bpe, tiny_llama, write_gguf
from mtpc.lm import loading
from mtpc.cli import main
from mtpc.errors import InputError
from mtpc.lm.gguf_files import DONE_FILE, check_gguf, model_folder_for
from mtpc.lm.gguf_format import read_gguf_layout
from test_gguf import cache, tiny  # noqa: F401  the module's tiny GGUF and a private cache per test

pytest.importorskip("gguf")

U32, STRING, ARRAY, F32 = 4, 8, 9, 0


# ------------------------------------------------------------------ GGUF bytes written by hand

def text(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack("<Q", len(raw)) + raw


def kv_u32(key: str, value: int) -> bytes:
    return text(key) + struct.pack("<II", U32, value)


def kv_u32s(key: str, values: list[int]) -> bytes:
    return text(key) + struct.pack("<IIQ", ARRAY, U32, len(values)) + struct.pack(f"<{len(values)}I", *values)


def kv_text(key: str, value: str) -> bytes:
    return text(key) + struct.pack("<I", STRING) + text(value)


def kv_strings(key: str, items: list[str], claimed: int | None = None) -> bytes:
    count = len(items) if claimed is None else claimed
    return text(key) + struct.pack("<IIQ", ARRAY, STRING, count) + b"".join(text(i) for i in items)


def tensor_info(name: str, shape: tuple[int, ...], offset: int) -> bytes:
    return text(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape) + struct.pack(
        "<IQ", F32, offset)


def gguf_bytes(kvs: list[bytes], tensors: list[tuple[str, tuple[int, ...]]], *, offsets=None,
               claimed_tensors=None) -> bytes:
    """Header, metadata, tensor descriptions and float32 data laid out one after another, 32-aligned."""
    sizes = [4 * int(torch.tensor(shape).prod()) for _, shape in tensors]
    placed = offsets or [sum(sizes[:i]) for i in range(len(sizes))]
    infos = b"".join(tensor_info(name, shape, o) for (name, shape), o in zip(tensors, placed))
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors) if claimed_tensors is None else claimed_tensors, len(kvs))
    body = head + b"".join(kvs) + infos
    body += bytes(-len(body) % 32)
    return body + bytes(sum(sizes))


def small_model(*, layers: int = 1, blocks: int | None = None, extra: list[bytes] = (), tokens: int = 8,
                offsets=None, arch: str = "llama", layer_prefix: str = "blk.{}.") -> bytes:
    """A minimal GGUF the walk accepts (`layers` layers of tensors, `blocks` claimed), altered by the tests."""
    kvs = [kv_text("general.architecture", arch), kv_u32(f"{arch}.block_count", blocks or layers),
           kv_u32(f"{arch}.embedding_length", 32), kv_u32(f"{arch}.feed_forward_length", 64),
           kv_text("tokenizer.ggml.model", "gpt2"), kv_strings("tokenizer.ggml.tokens", [f"t{i}" for i in range(tokens)]),
           *extra]
    tensors = [("token_embd.weight", (32, 8))] + [(layer_prefix.format(i) + "attn_norm.weight", (32,))
                                                  for i in range(layers)]
    return gguf_bytes(kvs, tensors, offsets=offsets)


def refused_quickly(path: Path, message: str, seconds: float = 2.0) -> None:
    start = time.perf_counter()
    with pytest.raises(InputError, match=message):
        read_gguf_layout(path)
    assert time.perf_counter() - start < seconds


def test_the_minimal_file_is_walked_whole(tmp_path):
    (tmp_path / "ok.gguf").write_bytes(small_model(layers=2))
    layout = read_gguf_layout(tmp_path / "ok.gguf")  # the control: each case below changes one thing
    assert layout.array_lengths["tokenizer.ggml.tokens"] == 8 and set(layout.tensors) == {
        "token_embd.weight", "blk.0.attn_norm.weight", "blk.1.attn_norm.weight"}


def test_array_counts_and_lengths_are_held_against_the_bytes_left(tmp_path, tiny):
    huge_list = small_model(extra=[kv_strings("general.tags", [], claimed=2**62)])
    (tmp_path / "claims.gguf").write_bytes(huge_list[:100])
    refused_quickly(tmp_path / "claims.gguf", "claims")  # a 100-byte file claiming 2^62 values
    (tmp_path / "tail.gguf").write_bytes(huge_list)
    refused_quickly(tmp_path / "tail.gguf", "claims")
    data = tiny[0].read_bytes()
    at = data.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 8  # past the array's two types
    flipped = data[:at] + struct.pack("<Q", 2**40) + data[at + 8:]
    (tmp_path / "flipped.gguf").write_bytes(flipped)
    refused_quickly(tmp_path / "flipped.gguf", "claims 1,099,511,627,776 values")
    long_string = small_model(extra=[text("general.name") + struct.pack("<I", STRING) + struct.pack("<Q", 2**63)])
    (tmp_path / "string.gguf").write_bytes(long_string)
    refused_quickly(tmp_path / "string.gguf", "a string claims")


def test_a_large_in_file_array_is_refused_in_bounded_time(tmp_path):
    junk = kv_strings("general.junk", [""] * 1_000_000)  # 8 MB of real, empty strings
    (tmp_path / "junk.gguf").write_bytes(small_model(extra=[junk]))
    refused_quickly(tmp_path / "junk.gguf", "at most 65,536", seconds=1.0)
    many_tokens = small_model(tokens=500_000)  # under the vocabulary cap, but 7 MB cannot hold so many values
    (tmp_path / "tokens.gguf").write_bytes(many_tokens)
    refused_quickly(tmp_path / "tokens.gguf", "more than 65,536 values, more than a file of 7,390,432 bytes")
    template = kv_text("tokenizer.chat_template", "{{ x }}" + " " * (2 << 20))  # 2 MiB: transformers took a minute on 70
    (tmp_path / "template.gguf").write_bytes(small_model(extra=[template]))
    refused_quickly(tmp_path / "template.gguf", "a string of 2,097,159 bytes, more than the 1,048,576 mtpc reads")
    names = [kv_text(f"general.note{i}", " " * (1 << 20)) for i in range(5)]  # 60 of them: a 43 s conversion
    (tmp_path / "strings.gguf").write_bytes(small_model(extra=names))
    refused_quickly(tmp_path / "strings.gguf", "string values hold more than 4,194,304 bytes together")


def test_the_model_the_metadata_claims_must_be_in_the_file(tmp_path):
    cases = {
        "layers.gguf": (small_model(layers=2, blocks=200_000), "block_count must be an integer in 1..1,024"),
        "missing.gguf": (small_model(layers=2, blocks=3), "no tensors for layer 2"),
        "bare.gguf": (gguf_bytes([kv_text("general.architecture", "llama")], []), "no token embedding"),
        "wide.gguf": (small_model(extra=[kv_u32("llama.feed_forward_length", 0)]), "appears twice"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        refused_quickly(tmp_path / name, message)
    (tmp_path / "zero.gguf").write_bytes(small_model(layer_prefix="blk.0{}."))  # "blk.00.": no layer of transformers'
    refused_quickly(tmp_path / "zero.gguf", "no tensors for layer 0")
    experts = small_model(arch="qwen3_moe", extra=[kv_u32("qwen3_moe.expert_count", 2048)])
    (tmp_path / "experts.gguf").write_bytes(experts)  # transformers built 1.2 GB of random experts from 167 KB
    refused_quickly(tmp_path / "experts.gguf", "implies a model of about")
    (tmp_path / "heads.gguf").write_bytes(small_model(extra=[kv_u32("llama.rope.dimension_count", 1 << 20)]))
    refused_quickly(tmp_path / "heads.gguf", r"llama.rope.dimension_count must be an integer in 1..4,096")
    as_array = small_model(extra=[kv_u32s("llama.rope.dimension_count", [1 << 20])])  # transformers reads it as 2^20
    (tmp_path / "array.gguf").write_bytes(as_array)
    refused_quickly(tmp_path / "array.gguf", r"llama.rope.dimension_count must be an integer in 1..4,096")
    experts = small_model(arch="qwen3_moe", extra=[kv_u32s("qwen3_moe.expert_count", [4096])])
    (tmp_path / "experts2.gguf").write_bytes(experts)
    refused_quickly(tmp_path / "experts2.gguf", "implies a model of about")
    big = small_model()
    big = big.replace(kv_u32("llama.feed_forward_length", 64), kv_u32("llama.feed_forward_length", 1 << 20))
    (tmp_path / "big.gguf").write_bytes(big)
    refused_quickly(tmp_path / "big.gguf", "implies a model of about")
    assert len(gguf_bytes([kv_text("general.architecture", "llama")], [])) < 100  # the 90-byte file of the report


def test_a_file_without_every_weight_of_its_model_is_refused_not_made_random(tiny, tmp_path):
    file, model, tok = tiny
    norms_only = write_gguf(tmp_path / "norms.gguf", model, tok,
                            leave_out=("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"))
    with pytest.raises(InputError, match=r"weights the file does not hold \(such as model.layers.0"):
        model_folder_for(norms_only)  # transformers initialised them at random, and the random model was cached


def test_a_huge_sparse_file_is_refused_before_it_is_hashed(tmp_path):
    sparse = tmp_path / "sparse.gguf"
    with open(sparse, "wb") as f:
        f.truncate(4 << 30)  # 4 GB of holes: hashing them first takes 7 s (a 20 GB file took 35 s)
    start = time.perf_counter()
    with pytest.raises(InputError, match="not a GGUF file"):
        model_folder_for(sparse)
    assert time.perf_counter() - start < 1


def test_digest_memos_in_a_folder_others_can_write_are_not_believed(tiny, cache, tmp_path):
    file, model, tok = tiny
    other = write_gguf(tmp_path / "other.gguf", tiny_llama(tok, seed=6), tok)
    mine, theirs = model_folder_for(file), model_folder_for(other)
    memos = cache / "gguf" / "digests"
    assert (memos.stat().st_mode & 0o777) == 0o700 and len(list(memos.iterdir())) == 2
    memos.chmod(0o777)  # as an umask of 000 once left it: one memo could be renamed over the other
    first, second = sorted(memos.iterdir())
    swapped = first.read_text()
    first.write_text(second.read_text())
    second.write_text(swapped)
    assert {model_folder_for(file), model_folder_for(other)} == {mine, theirs}
    assert model_folder_for(file) == mine


def test_tensor_offsets_cannot_wrap_around_or_overlap(tmp_path):
    cases = {
        "wrap.gguf": ([2**64 - 64, 1024], "ends past the end of the file"),
        "overlap.gguf": ([0, 32], "overlaps"),
        "unaligned.gguf": ([0, 1028], "not aligned"),
    }
    for name, (offsets, message) in cases.items():
        (tmp_path / name).write_bytes(small_model(offsets=offsets))
        refused_quickly(tmp_path / name, message)


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path):
    (tmp_path / "t.gguf").write_bytes(small_model(tokens=9))
    refused_quickly(tmp_path / "t.gguf", "9 tokens, more than the 8 rows")


def test_a_folder_whose_config_asks_more_rows_than_its_embedding_has_is_refused(tiny, tmp_path):
    folder = Path(shutil.copytree(loading.model_folder(tiny[0]), tmp_path / "m"))
    config = json.loads((folder / "config.json").read_text())
    config["vocab_size"] += 40
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=r"vocab_size is 640, but the embedding \(model.embed_tokens.weight\)"):
        loading.model_info(folder, subword_ok=True)


# ------------------------------------------------------------------ the file named is the file read

def test_the_file_named_is_read_whatever_the_working_folder(tiny, tmp_path, monkeypatch):
    file, model, tok = tiny
    a, b = tmp_path / "A", tmp_path / "B"
    a.mkdir(), b.mkdir()
    shutil.copy(file, a / "tiny.gguf")
    write_gguf(b / "tiny.gguf", tiny_llama(tok, seed=7), tok)  # another model under the same name
    monkeypatch.chdir(b)
    loaded, _ = loading.open_model("../A/tiny.gguf", allow_non_byte_vocab=True)
    torch.testing.assert_close(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight)


# ------------------------------------------------------------------ the converted cache's trust rule

def embedding(folder: Path) -> torch.Tensor:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))["model.embed_tokens.weight"]


def test_a_planted_folder_whose_record_names_other_bytes_is_converted_afresh(tiny, tmp_path):
    file, model, tok = tiny
    other = write_gguf(tmp_path / "other.gguf", tiny_llama(tok, seed=3), tok)
    planted = model_folder_for(other)
    target = model_folder_for(file)
    shutil.rmtree(target)
    shutil.copytree(planted, target)  # another model's folder under this file's digest
    assert model_folder_for(file) == target
    record = json.loads((target / DONE_FILE).read_text())
    assert record["sha256"] != json.loads((planted / DONE_FILE).read_text())["sha256"]
    torch.testing.assert_close(embedding(target), model.model.embed_tokens.weight)


def test_a_folder_others_can_write_is_never_read(tiny, capsys):
    folder = model_folder_for(tiny[0])
    capsys.readouterr()  # the conversion's progress bars
    folder.chmod(0o777)
    with pytest.raises(InputError, match="owned by another user or writable by others"):
        model_folder_for(tiny[0])
    assert main(["generate", "--model", str(tiny[0]), "x", "--max-new-tokens", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mtpc: error:") and "writable by others" in err[0]
    folder.chmod(0o755)
    (folder / "config.json").chmod(0o666)
    with pytest.raises(InputError, match="writable by others"):
        model_folder_for(tiny[0])
    (folder / "config.json").chmod(0o644)
    link = folder.with_name(folder.name + "-real")
    folder.rename(link)
    folder.symlink_to(link)
    with pytest.raises(InputError, match=r"not a folder of yours alone \(a symlink"):
        model_folder_for(tiny[0])


def test_a_file_replaced_with_its_mtime_restored_is_read_anew(tiny, tmp_path):
    file, model, tok = tiny
    mine = Path(shutil.copy(file, tmp_path / "model.gguf"))
    first = model_folder_for(mine)
    stamp = mine.stat()
    replacement = write_gguf(tmp_path / "new.gguf", tiny_llama(tok, seed=5), tok)
    assert replacement.stat().st_size == stamp.st_size  # same size: only the identity can tell
    os.replace(replacement, mine)
    os.utime(mine, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    second = model_folder_for(mine)
    assert second != first
    assert not torch.equal(embedding(second), embedding(first))


def test_a_killed_conversion_leaves_nothing_behind_the_next_one(tiny, cache, tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    part = cache / "gguf" / f"{'0' * 32}.part-{pid}"
    part.mkdir(parents=True)
    (part / "config.json").write_text("{}")
    live = cache / "gguf" / f"{'1' * 32}.part-{os.getpid()}"
    live.mkdir()
    model_folder_for(tiny[0])
    assert not part.exists() and live.exists()  # a running conversion (this process) is left alone


# ------------------------------------------------------------------ the tokenizer is the file's own

@pytest.fixture(scope="module")
def small_vocabulary(tmp_path_factory):
    tok = tiny_bpe(300)  # inside 264..512, where a folder without tokenizer files is taken as bytes
    return write_gguf(tmp_path_factory.mktemp("v300") / "v300.gguf", tiny_llama(tok, seed=4), tok, add_bos=True), tok


def test_a_small_vocabulary_gguf_keeps_its_own_tokenizer_and_its_bos_rule(small_vocabulary, capsys):
    from transformers import AutoTokenizer

    file, tok = small_vocabulary
    info = loading.model_info(file, subword_ok=True)
    assert not info.byte_level
    ours = loading.model_tokenizer(info)
    theirs = AutoTokenizer.from_pretrained(loading.model_folder(file))
    prompt = "def collate(items):\n"
    assert ours.encode_prompt(prompt) == theirs(prompt).input_ids  # this file's rule adds its bos
    assert ours.encode_prompt(prompt)[0] == theirs.bos_token_id
    model = loading.load_model(file)
    ids = theirs(prompt, return_tensors="pt").input_ids
    expected = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert main(["generate", "--model", str(file), prompt, "--max-new-tokens", "8", "--no-stream"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == theirs.decode(expected[0, ids.shape[1]:], skip_special_tokens=True)
