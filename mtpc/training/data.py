"""Datasets from local files: documents, a deterministic split, and packing into fixed-length sequences.

Sources (`load_documents`):
- a file, a folder (searched recursively) or a glob pattern (`src/**/*.py`);
- plain files become one document each: `<bos> bytes <eos>`;
- `.jsonl` files hold one record per line: `{"messages": [{"role": ..., "content": ...}, ...]}`
  (chat, rendered with `chat_template`), `{"text": ...}` (plain) or `{"prompt": ..., "completion": ...}`
  (`<bos> prompt completion <eos>` with the prompt masked out: what `mtpc distill-data` writes; for a
  subword model it also stores `prompt_ids` and `completion_ids`, the LM's own tokens, which a subword
  model reads instead of re-tokenizing the text: a sampled token sequence need not be the one its text
  encodes to).
  Strings are UTF-8; lone surrogates U+DC80..U+DCFF (Python's `surrogateescape`) stand for the raw
  bytes 0x80..0xFF of invalid UTF-8, so any byte string round-trips exactly (`tokenizer.to_bytes`).

A document is token ids plus a *loss mask*: `mask[i]` is True when token `i` may be a prediction
target. Plain text masks only the leading `<bos>`; a prompt/completion record masks `<bos>` and the
prompt; chat masks everything except the assistant's
answers and their end-of-turn tokens. Corrupt records (bad JSON, wrong shape, unknown roles),
binary files and empty documents are counted in `DataStats` and skipped with a warning.

`PackedDataset` concatenates documents into one stream and cuts it into sequences of `seq_len`
tokens (the last one padded). Each item carries `doc_ids`, the global index of the document of
every position (-1 for padding), so a loss knows where documents end: a target `t + j` belongs to
the window at `t` only when `doc_ids[t + j] == doc_ids[t]` (`target_validity`).
"""

from __future__ import annotations

import json
import logging
import os
import sysconfig
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import InputError
from ..files import glob_paths, regular_file
from ..lm.tokenizer import ROLES, ByteTokenizer, SubwordTokenizer, to_bytes

log = logging.getLogger(__name__)

BINARY_SNIFF_BYTES = 8192
MAX_FILE_BYTES = 2**30  # one --data file is read whole: a bigger one (or a 6 GiB sparse file) is refused
MAX_LOGGED_PROBLEMS = 10
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", ".git", ".hg", ".svn", "node_modules"})


@dataclass
class Document:
    name: str  # the file's path relative to the corpus root (`:N` for line N of a .jsonl): the split's key
    tokens: np.ndarray  # [len] token ids (int16 bytes and specials; int32 subword ids)
    mask: np.ndarray  # [len] bool, True = may be a target

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class DataStats:
    files: int = 0
    documents: int = 0
    tokens: int = 0
    skipped_empty: int = 0
    skipped_corrupt: int = 0
    skipped_binary: int = 0
    problems: list[str] = field(default_factory=list)  # the first few, for the warning

    def note(self, kind: str, where: str, why: str) -> None:
        setattr(self, f"skipped_{kind}", getattr(self, f"skipped_{kind}") + 1)
        if len(self.problems) < MAX_LOGGED_PROBLEMS:
            self.problems.append(f"{where}: {why}")
            # Empty files are routine in source trees (`__init__.py`): the summary counts them.
            (log.info if kind == "empty" else log.warning)("skipping %s record %s: %s", kind, where, why)

    @property
    def skipped(self) -> int:
        return self.skipped_empty + self.skipped_corrupt + self.skipped_binary

    def summary(self) -> str:
        return (f"{self.documents} documents, {self.tokens} tokens from {self.files} files; skipped "
                f"{self.skipped_empty} empty, {self.skipped_corrupt} corrupt, {self.skipped_binary} binary")


# ------------------------------------------------------------------ finding files

def default_corpus() -> Path:
    """The Python standard library's source folder (present on every machine with Python)."""
    return Path(sysconfig.get_paths()["stdlib"])


def find_files(source: str | Path, suffixes: Sequence[str] | None = None) -> list[Path]:
    """Files named by `source`: a file, a folder (recursive; hidden and package folders such as
    site-packages skipped, an unreadable sub-folder skipped with a warning) or a glob pattern. Sorted,
    so the order is the same on every machine."""
    text = str(source)
    path = Path(text).expanduser()
    if any(ch in text for ch in "*?["):
        files = glob_paths(path)
    elif path.is_dir():
        files = _walk(path)
    elif path.exists():
        return [path]
    else:
        raise FileNotFoundError(f"data source {text!r} does not exist")
    files = [p for p in files if p.is_file() and (suffixes is None or p.suffix in suffixes)]
    return sorted(files)


def _walk(folder: Path) -> list[Path]:
    """Every file below `folder`, not descending into skipped or symlinked folders. `Path.rglob` would
    pass over an unreadable sub-folder without a word; `os.walk` reports it, and it is warned about."""
    def unreadable(e: OSError) -> None:
        log.warning("skipping unreadable folder %s: %s", e.filename, e.strerror or e)

    files = []
    for top, dirs, names in os.walk(folder, onerror=unreadable):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]  # pruned, not walked
        files += [Path(top, name) for name in names]
    return files


def corpus_root(source: str | Path) -> Path:
    """The folder documents are named relative to: a folder itself, a file's parent, a glob's part
    before the first wildcard. Names relative to it are the same wherever the corpus lies."""
    path = Path(str(source)).expanduser()
    parts = path.parts
    first = next((i for i, part in enumerate(parts) if any(ch in part for ch in "*?[")), None)
    if first is not None:
        return Path(*parts[:first]) if first else Path(".")
    return path if path.is_dir() else path.parent


def document_name(path: Path, root: Path) -> str:
    """`path` relative to `root` in POSIX form (the split hashes it: the same on every OS and machine)."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:  # not below the root (cannot happen for files `find_files` returns): the name itself
        return path.name


# ------------------------------------------------------------------ documents

def body_ids(data: bytes, tok: ByteTokenizer | SubwordTokenizer) -> np.ndarray:
    """The token ids of `data`: its bytes (a byte tokenizer, int16 like every byte document), or the
    model's own subword tokens (int32: a subword vocabulary outgrows int16)."""
    if isinstance(tok, SubwordTokenizer):
        return np.asarray(tok.encode(data), dtype=np.int32)
    return np.frombuffer(data, dtype=np.uint8).astype(np.int16)


def body_document(name: str, body: np.ndarray, tok: ByteTokenizer | SubwordTokenizer) -> Document:
    """`<bos> body <eos>`; every token but the `<bos>` may be a target."""
    tokens = np.empty(len(body) + 2, dtype=body.dtype)
    tokens[0], tokens[-1] = tok.bos_id, tok.eos_id
    tokens[1:-1] = body
    mask = np.ones(len(tokens), dtype=bool)
    mask[0] = False
    return Document(name, tokens, mask)


def text_document(name: str, data: bytes, tok: ByteTokenizer | SubwordTokenizer) -> Document:
    """`<bos> data <eos>`; every token but the `<bos>` may be a target."""
    return body_document(name, body_ids(data, tok), tok)


def completion_document(name: str, record: dict, tok: ByteTokenizer | SubwordTokenizer) -> Document:
    """`<bos> prompt completion <eos>`; only the completion and the `<eos>` may be targets (prompt and
    completion tokenized apart, so the mask falls on a token boundary under a subword tokenizer too). A
    `mtpc distill-data --chat` record (`"chat": true`) is `prompt completion <eos>`: its prompt ids are the
    chat template's whole rendered turn, which writes its own first token."""
    prompt, completion = record.get("prompt"), record.get("completion")
    if not isinstance(prompt, str) or not isinstance(completion, str):
        raise ValueError('"prompt" and "completion" must both be strings')
    if not completion:
        raise EmptyRecord("empty completion")
    if isinstance(tok, SubwordTokenizer) and "completion_ids" in record:
        head, body = record_ids(record, "prompt", tok), record_ids(record, "completion", tok)
    else:
        head, body = body_ids(to_bytes(prompt), tok), body_ids(to_bytes(completion), tok)
    if record.get("chat") is True and "completion_ids" in record:  # a rendered chat turn: no <bos> before it
        tokens = np.concatenate([head, body, np.asarray([tok.eos_id], dtype=body.dtype)])
        mask = np.ones(len(tokens), dtype=bool)
        mask[:len(head)] = False
        return Document(name, tokens, mask)
    doc = body_document(name, np.concatenate([head, body]), tok)
    doc.mask[1:1 + len(head)] = False
    return doc


def record_ids(record: dict, part: str, tok: SubwordTokenizer) -> np.ndarray:
    """A subword record's `PART_ids` (what `mtpc distill-data` stores for a subword LM: the LM's own tokens,
    which re-encoding their text need not give back), checked to be this tokenizer's spelling of `PART`."""
    ids = record.get(f"{part}_ids")
    if not isinstance(ids, list) or not all(type(i) is int and 0 <= i < tok.vocab_size for i in ids):
        raise ValueError(f'"{part}_ids" must be a list of token ids in 0..{tok.vocab_size - 1}')
    if tok.decode(ids) != record[part]:
        raise ValueError(f'"{part}_ids" do not spell "{part}" under this model\'s tokenizer (written for another '
                         "model?)")
    return np.asarray(ids, dtype=np.int32)


def chat_template(messages: Sequence[dict], tok: ByteTokenizer) -> tuple[list[int], list[bool]]:
    """`<bos>` then `<|role|> content <|end|>` per message, then `<eos>`. The mask covers only the
    assistant's content and its `<|end|>` (what a chat model must learn to write)."""
    tokens, mask = [tok.bos_id], [False]
    for m in messages:
        body = tok.encode(m["content"]) + [tok.end_of_turn_id]
        answer = m["role"] == "assistant"
        tokens += [tok.role_id(m["role"])] + body
        mask += [False] + [answer] * len(body)
    tokens.append(tok.eos_id)
    mask.append(False)
    return tokens, mask


def chat_document(name: str, record: object, tok: ByteTokenizer) -> Document:
    """A chat record as a document; raises ValueError (corrupt) or EmptyRecord."""
    if isinstance(tok, SubwordTokenizer):
        raise ValueError("chat records are rendered with mtpc's byte chat format; a subword model trains on "
                         '{"text"} or {"prompt", "completion"} records')
    messages = validate_messages(record)
    tokens, mask = chat_template(messages, tok)
    if not any(mask):
        raise EmptyRecord("no assistant answer to learn from")
    return Document(name, np.asarray(tokens, dtype=np.int16), np.asarray(mask, dtype=bool))


class EmptyRecord(ValueError):
    pass


def validate_messages(record: object) -> list[dict]:
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        raise ValueError('expected an object with a "messages" list')
    for i, m in enumerate(record["messages"]):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise ValueError(f'message {i} is not an object with a string "content"')
        if m.get("role") not in ROLES:
            raise ValueError(f"message {i} has role {m.get('role')!r}, expected one of {', '.join(ROLES)}")
    return record["messages"]


def jsonl_documents(path: Path, data: bytes, tok: ByteTokenizer, stats: DataStats,
                    name: str | None = None) -> Iterator[Document]:
    """One document per record, named `NAME:N` (`name`: the file's name relative to the corpus root)."""
    for lineno, line in enumerate(data.splitlines(), 1):
        where, key = f"{path}:{lineno}", f"{name or path}:{lineno}"
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if isinstance(record, dict) and "messages" in record:
                yield chat_document(key, record, tok)
            elif isinstance(record, dict) and "completion" in record:
                yield completion_document(key, record, tok)
            elif isinstance(record, dict) and isinstance(record.get("text"), str):
                if not record["text"]:
                    raise EmptyRecord("empty text")
                yield text_document(key, to_bytes(record["text"]), tok)
            else:
                raise ValueError('expected {"messages": [...]}, {"text": "..."} or {"prompt": "...", "completion": "..."}')
        except EmptyRecord as e:
            stats.note("empty", where, str(e))
        except RecursionError:
            stats.note("corrupt", where, "nested too deeply")
        except (ValueError, KeyError, TypeError) as e:  # json.JSONDecodeError is a ValueError
            stats.note("corrupt", where, str(e))


def file_documents(path: Path, tok: ByteTokenizer, stats: DataStats, name: str | None = None) -> Iterator[Document]:
    """The documents of one file, named `name` (default: its path); problems are noted in `stats`."""
    regular_file(path, "a --data file", MAX_FILE_BYTES)  # a FIFO would block, /dev/zero never end
    try:
        data = path.read_bytes()
    except OSError as e:
        stats.note("corrupt", str(path), f"unreadable: {e}")
        return
    stats.files += 1
    if path.suffix == ".jsonl":
        yield from jsonl_documents(path, data, tok, stats, name)
    elif not data.strip():
        stats.note("empty", str(path), "empty file")
    elif b"\0" in data[:BINARY_SNIFF_BYTES]:
        stats.note("binary", str(path), "contains NUL bytes")
    else:
        yield text_document(name or str(path), data, tok)


def load_documents(source: str | Path | None, tok: ByteTokenizer, *,
                   suffixes: Sequence[str] | None = None) -> tuple[list[Document], DataStats]:
    """All documents of `source` (default: the Python standard library's `.py` files), each named by
    its path relative to the corpus root (`corpus_root`; the stdlib: its folder), so the split they
    get is the same on every machine."""
    if source is None:
        source, suffixes = default_corpus(), suffixes or (".py",)
    stats = DataStats()
    docs: list[Document] = []
    root = corpus_root(source)
    for path in find_files(source, suffixes):
        for doc in file_documents(path, tok, stats, document_name(path, root)):
            docs.append(doc)
            stats.documents += 1
            stats.tokens += len(doc)
    if stats.skipped:
        log.warning("data %s: %s", source, stats.summary())
    if not docs:
        raise InputError(f"no usable documents in {source}: {stats.summary()}")
    return docs, stats


# ------------------------------------------------------------------ split

def split_documents(docs: Sequence[Document], val_fraction: float = 0.01
                    ) -> tuple[list[Document], list[Document]]:
    """Deterministic train/validation split by a hash of each document's name (its path relative to
    the corpus root: the same wherever the corpus lies), so a document's side does not depend on
    which other documents exist or where they are. If a side would be empty, the last document is
    cut in two (its tail becomes validation)."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    train, val = [], []
    for d in docs:
        (val if _unit_hash(d.name) < val_fraction else train).append(d)
    if train and val:
        return train, val
    pool = train or val
    head, tail = _cut(pool[-1], 1 - val_fraction)
    return pool[:-1] + [head], [tail]


def _unit_hash(name: str) -> float:
    return zlib.crc32(name.encode("utf-8", "surrogateescape")) / 2**32


def _cut(doc: Document, fraction: float) -> tuple[Document, Document]:
    if len(doc) < 4:
        raise InputError(f"cannot split a corpus of one {len(doc)}-token document into train and validation")
    k = min(max(int(len(doc) * fraction), 2), len(doc) - 2)
    return (Document(doc.name + "#train", doc.tokens[:k], doc.mask[:k]),
            Document(doc.name + "#val", doc.tokens[k:], doc.mask[k:]))


# ------------------------------------------------------------------ packing

class PackedDataset(torch.utils.data.Dataset):
    """Documents concatenated and cut into `seq_len`-token sequences; item `i` is a dict of
    `tokens [L]` long, `loss_mask [L]` bool and `doc_ids [L]` long (-1 marks padding)."""

    def __init__(self, docs: Sequence[Document], seq_len: int, pad_id: int):
        if seq_len < 2:
            raise ValueError(f"seq_len must be at least 2, got {seq_len}")
        if not docs:
            raise ValueError("cannot pack an empty list of documents")
        self.seq_len, self.pad_id = seq_len, pad_id
        self.tokens = torch.from_numpy(np.concatenate([d.tokens for d in docs]))  # [N] int16
        self.mask = torch.from_numpy(np.concatenate([d.mask for d in docs]))  # [N] bool
        lengths = torch.tensor([len(d) for d in docs], dtype=torch.long)
        self.doc_starts = torch.cumsum(lengths, 0) - lengths  # [D]
        self.names = [d.name for d in docs]

    def __len__(self) -> int:
        return -(-len(self.tokens) // self.seq_len)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"sequence {i} out of range 0..{len(self) - 1}")
        lo, L = i * self.seq_len, self.seq_len
        hi = min(lo + L, len(self.tokens))
        tokens = torch.full((L,), self.pad_id, dtype=torch.long)  # [L]
        mask = torch.zeros(L, dtype=torch.bool)  # [L]
        doc_ids = torch.full((L,), -1, dtype=torch.long)  # [L]
        tokens[: hi - lo] = self.tokens[lo:hi].long()
        mask[: hi - lo] = self.mask[lo:hi]
        doc_ids[: hi - lo] = torch.searchsorted(self.doc_starts, torch.arange(lo, hi), right=True) - 1
        return {"tokens": tokens, "loss_mask": mask, "doc_ids": doc_ids}


def packed_fingerprint(sets: dict[str, PackedDataset]) -> str:
    """The SHA-256 of what `sets` pack, split by split (in name order): every token id, loss mask and document
    start. Exact and cheap (the tokens are in memory already); the files' names and paths are not in it, so
    the same text elsewhere has the same fingerprint, and a changed, added or removed document another."""
    import hashlib

    digest = hashlib.sha256()
    chunk = 1 << 22  # elements hashed at a time: bounded extra memory whatever the corpus' size
    for name in sorted(sets):
        packed = sets[name]
        digest.update(f"{name} {len(packed.tokens)} {len(packed.doc_starts)}\n".encode())
        for values, dtype in ((packed.tokens, "<i4"), (packed.mask, "u1"), (packed.doc_starts, "<i8")):
            array = values.numpy()
            for k in range(0, len(array), chunk):
                digest.update(array[k:k + chunk].astype(dtype).tobytes())
    return digest.hexdigest()


def spread(size: int, count: int) -> list[int]:
    """`min(size, count)` distinct indices spread evenly over `range(size)`."""
    if size <= count:
        return list(range(size))
    return [int(i * size // count) for i in range(count)]


def collate(items: Iterable[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    items = list(items)
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """`batch`'s tensors on `device`. Copies to a GPU go from pinned (page-locked) host memory and do not
    block the host, so it packs the next micro-batch while this one is in flight (the pinned allocator
    keeps the source alive until its copy is done)."""
    if device.type != "cuda":
        return {k: t.to(device) for k, t in batch.items()}
    return {k: t.pin_memory().to(device, non_blocking=True) for k, t in batch.items()}


# ------------------------------------------------------------------ data order

class EpochSampler:
    """Sequence indices in a seeded random order per epoch (`mtpc train`); its state is the data
    position (epoch, cursor). Subclasses choose the permutation of an epoch."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed, self.epoch, self.cursor = size, seed, 0, 0
        self._perm = self._permutation()

    def _permutation(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.size, generator=g).tolist()

    def take(self, count: int) -> list[int]:
        out = []
        while len(out) < count:
            if self.cursor == self.size:
                self.epoch, self.cursor = self.epoch + 1, 0
                self._perm = self._permutation()
            k = min(count - len(out), self.size - self.cursor)
            out += self._perm[self.cursor:self.cursor + k]
            self.cursor += k
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._perm = self._permutation()
