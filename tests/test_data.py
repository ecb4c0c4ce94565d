import json
import logging
from pathlib import Path

import pytest
import torch

from mtpc.training.data import PackedDataset, chat_template, collate, find_files, load_documents, split_documents
from mtpc.heads.windows import target_validity, window_targets
from mtpc.lm.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def test_folder_glob_and_file_sources(tmp_path):
    write(tmp_path / "a.py", "print(1)\n")
    write(tmp_path / "sub" / "b.py", "x = 2\n")
    write(tmp_path / "sub" / "c.txt", "text\n")
    write(tmp_path / "site-packages" / "skip.py", "no\n")
    write(tmp_path / ".hidden" / "skip.py", "no\n")
    assert [p.name for p in find_files(tmp_path)] == ["a.py", "b.py", "c.txt"]
    assert [p.name for p in find_files(tmp_path, suffixes=(".py",))] == ["a.py", "b.py"]
    assert [p.name for p in find_files(str(tmp_path / "**" / "*.txt"))] == ["c.txt"]
    assert [p.name for p in find_files(tmp_path / "a.py")] == ["a.py"]
    with pytest.raises(FileNotFoundError):
        find_files(tmp_path / "missing")


def test_text_document_tokens_and_mask(tmp_path):
    write(tmp_path / "a.txt", b"ab\xff")
    docs, stats = load_documents(tmp_path, TOK)
    (d,) = docs
    assert d.tokens.tolist() == [TOK.bos_id, 97, 98, 255, TOK.eos_id]
    assert d.mask.tolist() == [False, True, True, True, True]
    assert stats.documents == 1 and stats.tokens == 5


def test_chat_template_masks_only_assistant_answers():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"}, {"role": "user", "content": "q"},
            {"role": "assistant", "content": "A"}]
    tokens, mask = chat_template(msgs, TOK)
    targets = [t for t, m in zip(tokens, mask) if m]
    assert targets == [ord("y"), ord("o"), TOK.end_of_turn_id, ord("A"), TOK.end_of_turn_id]
    assert TOK.decode(tokens, skip_special=False) == (
        "<bos><|system|>S<|end|><|user|>hi<|end|><|assistant|>yo<|end|><|user|>q<|end|><|assistant|>A<|end|><eos>")


def test_bad_records_are_counted_and_skipped(tmp_path, caplog):
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    lines = [json.dumps(good), "{not json", json.dumps({"messages": "nope"}),
             json.dumps({"messages": [{"role": "wizard", "content": "x"}]}),
             json.dumps({"messages": [{"role": "user", "content": "only a question"}]}),
             "", json.dumps({"text": "plain record"}), json.dumps({"text": ""}), json.dumps([1, 2]),
             '{"messages": [{"role": "assistant", "content": 3}]}']
    write(tmp_path / "chat.jsonl", "\n".join(lines) + "\n")
    write(tmp_path / "empty.txt", b"  \n")
    write(tmp_path / "blob.bin", b"\x00\x01\x02")
    with caplog.at_level(logging.WARNING, logger="mtpc.training.data"):
        docs, stats = load_documents(tmp_path, TOK)
    assert len(docs) == 2
    assert (stats.skipped_corrupt, stats.skipped_empty, stats.skipped_binary) == (5, 3, 1)
    assert "chat.jsonl:2" in caplog.text and "empty" in caplog.text


def test_no_usable_documents_is_an_error(tmp_path):
    write(tmp_path / "e.txt", b"")
    with pytest.raises(ValueError, match="no usable documents"):
        load_documents(tmp_path, TOK)


def test_split_is_deterministic_and_disjoint(tmp_path):
    for i in range(200):
        write(tmp_path / f"f{i:03d}.txt", f"file {i}\n")
    docs, _ = load_documents(tmp_path, TOK)
    train, val = split_documents(docs, 0.1)
    train2, val2 = split_documents(list(reversed(docs)), 0.1)
    assert sorted(d.name for d in val) == sorted(d.name for d in val2)
    assert {d.name for d in train}.isdisjoint(d.name for d in val)
    assert len(train) + len(val) == 200 and 5 <= len(val) <= 40


def write_nested_corpus(root):
    """60 files in two sub-folders plus a .jsonl of 20 records: enough for both sides of a 0.1 split."""
    for i in range(30):
        write(root / "pkg" / f"m{i:02d}.py", f"value = {i}\n" * 40)
        write(root / "pkg" / "sub" / f"n{i:02d}.py", f"other = {i}\n" * 40)
    write(root / "records.jsonl", "\n".join(json.dumps({"text": f"record {i}\n" * 30}) for i in range(20)) + "\n")
    return root


def split_names(source, fraction=0.1):
    train, val = split_documents(load_documents(source, TOK)[0], fraction)
    return [d.name for d in train], [d.name for d in val]


def test_the_split_is_the_same_wherever_the_corpus_lies(tmp_path):
    import shutil

    original = write_nested_corpus(tmp_path / "a")
    moved = Path(shutil.copytree(original, tmp_path / "elsewhere" / "deeper" / "b"))
    train, val = split_names(original)
    assert split_names(moved) == (train, val)
    assert val and "pkg/sub/n00.py" in train + val and "records.jsonl:1" in train + val  # relative names
    # a glob keys on the part below its wildcard-free prefix, a single file on its own name
    assert split_names(str(moved / "**" / "*.py")) == split_names(str(original / "**" / "*.py"))
    assert split_names(moved / "records.jsonl")[1] == split_names(original / "records.jsonl")[1]


def test_bench_prompts_from_a_corpus_are_the_same_wherever_it_lies(tmp_path):
    import shutil

    from mtpc.bench.prompts import prompts_from_corpus

    original = write_nested_corpus(tmp_path / "a")
    moved = shutil.copytree(original, tmp_path / "x" / "y")
    picked = [prompts_from_corpus(str(folder), TOK, 4, 16, seed=3, val_fraction=0.1) for folder in (original, moved)]
    assert picked[0] == picked[1] and len(picked[0]) == 4


def test_split_cuts_a_single_document(tmp_path):
    write(tmp_path / "one.txt", "x" * 1000)
    docs, _ = load_documents(tmp_path, TOK)
    train, val = split_documents(docs, 0.1)
    assert len(train[0]) + len(val[0]) == 1002 and len(val[0]) == 101


def test_packing_keeps_document_boundaries():
    docs, _ = [], None
    from mtpc.training.data import text_document
    docs = [text_document("a", b"abc", TOK), text_document("b", b"defgh", TOK)]  # 5 + 7 tokens
    ds = PackedDataset(docs, seq_len=5, pad_id=TOK.pad_id)
    assert len(ds) == 3
    batch = collate(ds[i] for i in range(3))
    assert batch["tokens"].shape == (3, 5)
    assert batch["doc_ids"].tolist() == [[0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, -1, -1, -1]]
    assert batch["tokens"][2].tolist() == [ord("h"), TOK.eos_id, TOK.pad_id, TOK.pad_id, TOK.pad_id]
    assert batch["loss_mask"][1].tolist() == [False, True, True, True, True]
    assert not batch["loss_mask"][2, 2:].any()


def test_target_validity_and_window_targets():
    doc_ids = torch.tensor([[0, 0, 0, 1, 1, -1]])  # [1, 6]
    mask = torch.tensor([[False, True, False, False, True, False]])
    valid = target_validity(doc_ids, mask, 3)  # [1, 6, 3]
    expect = [[True, False, False],  # t=0: t+1 ok, t+2 masked, t+3 other doc
              [False, False, False],
              [False, False, False],  # t+1 is another document
              [True, False, False],
              [False, False, False],
              [False, False, False]]
    assert valid[0].tolist() == expect
    x = window_targets(torch.arange(6).view(1, 6), 3, fill=-1)
    assert x[0, 0].tolist() == [1, 2, 3] and x[0, 4].tolist() == [5, -1, -1]
