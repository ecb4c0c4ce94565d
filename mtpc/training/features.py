"""`mtpc features`: one pass of the frozen LM over the training text, its final hidden states written to
shards that `mtpc train --features DIR` trains heads from without running the LM again.

    mtpc features --model MODEL --out DIR [--data PATH] [--seq-len 512] [--max-tokens N] [--dtype bf16]

A shard holds, for each of its sequences (packed exactly as `mtpc train` packs `--data`, the same
held-out split): `tokens`, `loss_mask`, `doc_ids` and the LM's final-norm hidden states `hidden`
`[S, L, d]` in the LM's dtype, and `greedy`, the LM's own most likely next token at each position
(what a draft vocabulary is chosen from). That is all the losses need: the NLL reads the tokens, and the KL
teacher is the LM's own output layer applied to these hidden states (`DraftModel.teacher`, computed
while training: storing a 49,152-token distribution per position would cost 85x the disk).

`DIR/features.json` records the settings, the model's fingerprint (`loading.model_fingerprint`) and
each finished shard with its size and SHA-256. A shard is written whole (a temporary file, then a
rename) before it is recorded, so a killed run, rerun with the same command, redoes at most one shard;
a larger `--max-tokens` extends the store (training sequences are taken in one fixed shuffled order).
`FeatureSet` reads a split back: every shard checked against its record and the store against the
model (a shard of another model, a truncated or altered one is refused), then one sequence at a time
through safetensors' memory map.

Bounds: memory, one forward of `--batch-size` sequences and one shard's hidden states
(`shard_sequences x L x d` values); disk, the estimate printed before the first forward.
"""

from __future__ import annotations

import json
import math
import os
import time
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path

import torch

from .. import checks, loading
from ..decoding.families import OutputLayer
from ..errors import InputError
from ..files import atomic_write, field, file_sha256, inside, regular_file
from .config import FeaturesConfig
from .data import PackedDataset, load_documents, spread, split_documents
from .outputs import guarded_output
from .progress import progress_bar

__all__ = ["write_features", "FeatureSet", "MANIFEST", "FORMAT"]

FORMAT = "mtpc-features/1"
MANIFEST = "features.json"
SPLITS = ("val", "train")
ORDER_SEED = 0  # the fixed shuffled order of training sequences (a --max-tokens prefix of it is cached)
MAX_SHARDS = 1 << 20


# ------------------------------------------------------------------ writing


def write_features(cfg: FeaturesConfig, announce: Callable[[str], None] = print) -> dict:
    """Cache the LM's final hidden states of `cfg.data` in `cfg.out` (completing an earlier run of the
    same settings); returns a summary. Every input is checked before the model is loaded."""
    checks.output_folder(cfg.out)
    checks.data_source(cfg.data)
    info = loading.model_info(cfg.model, allow_non_byte_vocab=True, trust_remote_code=cfg.trust_remote_code)
    context = loading.model_config(info.path).get("max_position_embeddings")
    if context and cfg.seq_len > context:
        raise InputError(f"--seq-len {cfg.seq_len} is more than the {context} positions the model has")
    if cfg.seq_len < 2:
        raise InputError("--seq-len must be at least 2")
    tok = loading.model_tokenizer(info, trust_remote_code=cfg.trust_remote_code)
    device = loading.resolve_device(cfg.device)
    dtype = loading.torch_dtype(cfg.dtype)
    with guarded_output(cfg.out):
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        docs, _ = load_documents(cfg.data, tok)
        train_docs, val_docs = split_documents(docs, cfg.val_fraction)
        sets = {"train": PackedDataset(train_docs, cfg.seq_len, tok.pad_id),
                "val": PackedDataset(val_docs, cfg.seq_len, tok.pad_id)}
        settings = store_settings(cfg, info, tok)
        manifest = _start_manifest(out, settings)
        plan = _plan(cfg, sets, manifest)
        todo = [shard for shard in plan if shard["name"] not in manifest["shards"]]
        bytes_per_sequence = cfg.seq_len * (info.hidden_size * dtype.itemsize + 4 + 4 + 4 + 1)  # hidden, tokens, greedy, doc ids, mask
        total = sum(len(s["sequences"]) for s in plan)
        announce(f"mtpc features: {total:,} sequences of {cfg.seq_len} tokens ({sum(len(s['sequences']) for s in todo):,}"
                 f" to compute) in {len(plan)} shards: about {total * bytes_per_sequence / 2**30:.2f} GiB on disk, "
                 f"{cfg.shard_sequences * bytes_per_sequence / 2**20:,.0f} MiB of memory per shard")
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        started, computed = time.perf_counter(), 0
        if todo:
            model, _ = loading.open_model(info.path, allow_non_byte_vocab=True, dtype=dtype,
                                          trust_remote_code=cfg.trust_remote_code)
            model = model.to(device)
            bar = progress_bar(sum(len(s["sequences"]) for s in todo) * cfg.seq_len, "tok", cfg.progress,
                               "mtpc features")
            for shard in todo:
                _write_shard(out, shard, sets[shard["split"]], model, cfg.batch_size, device, bar)
                manifest["shards"][shard["name"]] = shard["record"]
                atomic_write(out / MANIFEST, json.dumps(manifest, indent=1) + "\n")
                computed += len(shard["sequences"]) * cfg.seq_len
            bar.close()
        seconds = time.perf_counter() - started
        return {"shards": len(manifest["shards"]), "sequences": total, "tokens": total * cfg.seq_len,
                "new_tokens": computed, "seconds": seconds, "bytes": sum(r["bytes"] for r in manifest["shards"].values())}


def store_settings(cfg: FeaturesConfig, info, tok) -> dict:
    """What the cached values depend on: the model (its fingerprint), dtype, tokenizer, data and packing."""
    return {"model_fingerprint": loading.model_fingerprint(info.path), "hidden_size": info.hidden_size,
            "vocab_size": info.vocab_size, "tokenizer": type(tok).__name__,
            "dtype": str(loading.torch_dtype(cfg.dtype)).removeprefix("torch."), "seq_len": cfg.seq_len, "val_fraction": cfg.val_fraction,
            "data": str(Path(cfg.data).resolve()) if cfg.data and cfg.data != "stdlib" else "stdlib",
            "val_sequences": cfg.val_sequences, "shard_sequences": cfg.shard_sequences}


def _start_manifest(out: Path, settings: dict) -> dict:
    """The folder's manifest when its settings are these (a resume), else a fresh one; a folder made for
    other settings is refused with what differs."""
    path = out / MANIFEST
    if not path.exists():
        manifest = {"format": FORMAT, "settings": settings, "shards": {}}
        atomic_write(path, json.dumps(manifest, indent=1) + "\n")
        return manifest
    manifest = read_manifest(out)
    stored = manifest["settings"]
    differing = [f"{k} {_shown(stored.get(k))} there, {_shown(settings[k])} now" for k in sorted(settings)
                 if stored.get(k) != settings[k]]
    if differing:
        raise InputError(f"{out} holds features made with other settings ({'; '.join(differing)}); use another "
                         "--out, or remove the folder to start over")
    return manifest


def _shown(value) -> str:
    """A setting as the refusal shows it (a digest shortened; the folder's own file, never echoed at length)."""
    text = str(value)
    return text[:12] + "..." if len(text) > 40 else text


def _plan(cfg: FeaturesConfig, sets: dict[str, PackedDataset], manifest: dict) -> list[dict]:
    """The shards of the store: the held-out sequences spread evenly over the validation set, then a
    prefix of the training sequences in one fixed shuffled order, `shard_sequences` to a shard."""
    val = spread(len(sets["val"]), cfg.val_sequences)
    order = torch.randperm(len(sets["train"]), generator=torch.Generator().manual_seed(ORDER_SEED)).tolist()
    wanted = len(order) if cfg.max_tokens is None else min(len(order), math.ceil(cfg.max_tokens / cfg.seq_len))
    plan = []
    for split, indices in (("val", val), ("train", order[:wanted])):
        for k in range(0, len(indices), cfg.shard_sequences):
            plan.append({"name": f"{split}-{k // cfg.shard_sequences:05d}.safetensors", "split": split,
                         "sequences": indices[k:k + cfg.shard_sequences]})
    if len(plan) > MAX_SHARDS:
        raise InputError(f"{len(plan):,} shards are too many; raise --shard-sequences")
    return plan


@torch.no_grad()
def _write_shard(out: Path, shard: dict, dataset: PackedDataset, model, batch_size: int, device, bar) -> None:
    """One shard's sequences through the LM, saved whole, then its record set on `shard`."""
    from safetensors.torch import save_file

    items = [dataset[i] for i in shard["sequences"]]
    tokens = torch.stack([it["tokens"] for it in items])  # [S, L]
    hidden = []
    greedy = []
    output = OutputLayer(model)
    for k in range(0, len(items), batch_size):
        batch = tokens[k:k + batch_size].to(device)
        h = model.get_decoder()(input_ids=batch).last_hidden_state  # [b, L, d]
        hidden.append(h.cpu())
        greedy.append(torch.stack([output(row).argmax(-1) for row in h]).cpu())  # [b, L], a row at a time
        bar.update(batch.numel())
    tensors = {"hidden": torch.cat(hidden).contiguous(), "greedy": torch.cat(greedy).int(), "tokens": tokens.int(),
               "loss_mask": torch.stack([it["loss_mask"] for it in items]).to(torch.uint8),
               "doc_ids": torch.stack([it["doc_ids"] for it in items]).int()}
    path = out / shard["name"]
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(temporary))
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    shard["record"] = {"split": shard["split"], "sequences": len(items), "bytes": path.stat().st_size,
                       "sha256": file_sha256(path)}


# ------------------------------------------------------------------ reading


def read_manifest(folder: Path) -> dict:
    """`folder/features.json`, checked: the format, the settings' fields and the shard records."""
    path = folder / MANIFEST
    manifest = loading.json_object(path, "is this a folder written by mtpc features?", folder)
    if manifest.get("format") != FORMAT:
        raise InputError(f"{path}: \"format\" must be {FORMAT!r} (a folder written by mtpc features)")
    settings = field(manifest, "settings", path, "object")
    for key in ("hidden_size", "vocab_size", "seq_len"):
        field(settings, key, path, "int", low=1, high=2**31)
    field(settings, "model_fingerprint", path, "str")
    shards = field(manifest, "shards", path, "object")
    if len(shards) > MAX_SHARDS:
        raise InputError(f"{path}: more than {MAX_SHARDS:,} shards")
    for name, record in shards.items():
        if not isinstance(name, str) or "/" in name or "\\" in name or not name.endswith(".safetensors") \
                or name.startswith("."):
            raise InputError(f"{path}: a shard name that is not a plain .safetensors file name")
        if not isinstance(record, dict) or record.get("split") not in SPLITS:
            raise InputError(f"{path}: shard {name} has no valid record")
        field(record, "sequences", path, "int", low=1, high=2**31)
        field(record, "bytes", path, "int", low=1, high=2**50)
        field(record, "sha256", path, "str")
    return manifest


class FeatureSet(torch.utils.data.Dataset):
    """One split (`train` or `val`) of a feature folder, checked against `model_folder`'s model; item `i`
    is a dict like `PackedDataset`'s (`tokens`, `loss_mask`, `doc_ids`: `[L]` long/bool) plus `hidden`
    `[L, d]` (the stored dtype). `info`: the checked model the head trains for; `tokenizer`: the class
    name of the tokenizer training reads text through."""

    def __init__(self, folder: str | Path, split: str, info: loading.ModelInfo, tokenizer: str | None = None):
        from safetensors import safe_open

        self.folder = loading.readable_folder(folder, "features folder (--features)")
        manifest = read_manifest(self.folder)
        self.settings = manifest["settings"]
        check_model(self.folder, self.settings, info, tokenizer)
        names = sorted(name for name, record in manifest["shards"].items() if record["split"] == split)
        if not names:
            raise InputError(f"{self.folder} holds no {split} shards (is mtpc features still running?)")
        self.seq_len = self.settings["seq_len"]
        self.files, self.starts, start = [], [], 0
        for name in names:
            record = manifest["shards"][name]
            path = check_shard(self.folder, name, record, self.settings)
            self.files.append(safe_open(str(path), framework="pt"))
            self.starts.append(start)
            start += record["sequences"]
        self.size = start

    def __len__(self) -> int:
        return self.size

    @property
    def num_tokens(self) -> int:
        return self.size * self.seq_len

    def greedy_counts(self, vocab_size: int) -> torch.Tensor:
        """`[V]` how often each token is the LM's greedy next token at the split's real positions."""
        counts = torch.zeros(vocab_size, dtype=torch.long)
        for f in self.files:
            greedy, real = f.get_tensor("greedy").long(), f.get_tensor("doc_ids") >= 0  # [S, L]
            counts += torch.bincount(greedy[real], minlength=vocab_size)[:vocab_size]
        return counts

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < self.size:
            raise IndexError(f"sequence {i} out of range 0..{self.size - 1}")
        k = bisect_right(self.starts, i) - 1
        f, row = self.files[k], i - self.starts[k]
        return {"tokens": f.get_slice("tokens")[row].long(), "loss_mask": f.get_slice("loss_mask")[row].bool(),
                "doc_ids": f.get_slice("doc_ids")[row].long(), "hidden": f.get_slice("hidden")[row],
                "greedy": f.get_slice("greedy")[row].long()}


def check_model(folder: Path, settings: dict, info: loading.ModelInfo, tokenizer: str | None) -> None:
    """The store was made by this model (fingerprint) and read through the tokenizer training uses."""
    if settings["model_fingerprint"] != loading.model_fingerprint(info.path):
        raise InputError(f"{folder} holds the features of another model than {info.path} (its weights differ); "
                         "make them with mtpc features --model for this model")
    if settings["hidden_size"] != info.hidden_size or settings["vocab_size"] != info.vocab_size:
        raise InputError(f"{folder}: its hidden size and vocabulary ({settings['hidden_size']}, "
                         f"{settings['vocab_size']}) are not the model's ({info.hidden_size}, {info.vocab_size})")
    if tokenizer is not None and settings.get("tokenizer") != tokenizer:
        raise InputError(f"{folder} was tokenized with {settings.get('tokenizer')}, but this head reads the text "
                         f"through {tokenizer}")


def check_shard(folder: Path, name: str, record: dict, settings: dict) -> Path:
    """A shard as recorded: a regular file inside the folder, its size and SHA-256 as written, its tensors
    of the store's shapes and dtypes."""
    from ..loading import safetensors_header

    path = regular_file(inside(folder / name, folder), "a feature shard", max_bytes=2**50)
    if path.stat().st_size != record["bytes"] or file_sha256(path) != record["sha256"]:
        raise InputError(f"{path} is not the shard mtpc features wrote (its size or contents changed: damaged "
                         "or replaced); remove it and rerun mtpc features to write it again")
    shapes = safetensors_header(path)
    S, L, d = record["sequences"], settings["seq_len"], settings["hidden_size"]
    expected = {"hidden": (S, L, d), "greedy": (S, L), "tokens": (S, L), "loss_mask": (S, L), "doc_ids": (S, L)}
    if shapes != expected:
        raise InputError(f"{path}: its tensors are not those of {S} sequences of {L} tokens and {d} features")
    check_ids(path, settings["vocab_size"])
    return path


def check_ids(path: Path, vocab_size: int) -> None:
    """Token ids in the vocabulary and document ids >= -1 (padding), so no index is out of range later."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        tokens, doc_ids = torch.cat([f.get_tensor("tokens"), f.get_tensor("greedy")]), f.get_tensor("doc_ids")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size) or \
            doc_ids.numel() and int(doc_ids.min()) < -1:
        raise InputError(f"{path}: token or document ids out of range for a {vocab_size:,}-token vocabulary")

