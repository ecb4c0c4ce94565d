"""`mtpc features`: one pass of the frozen LM over the training text, its final hidden states written to
shards that `mtpc train --features DIR` trains heads from without running the LM again.

    mtpc features --model MODEL --out DIR [--data PATH] [--seq-len 512] [--max-tokens N] [--dtype bf16]

A shard holds, for each of its sequences (packed exactly as `mtpc train` packs `--data`, the same
held-out split): `tokens`, `loss_mask`, `doc_ids` and the LM's final-norm hidden states `hidden`
`[S, L, d]` in the LM's dtype, and `greedy`, the LM's own most likely next token at each position
(what a draft vocabulary is chosen from). That is all the losses need: the NLL reads the tokens, and the KL
teacher is the LM's own output layer applied to these hidden states (`DraftModel.teacher`, computed
while training: storing a 49,152-token distribution per position would cost 85x the disk).
With `--draft-layers K` a shard also holds `inner` `[S, L, d]`, the input of the LM's last K decoder layers
(the hidden state after layer L - K), from which `mtpc train --features --lora-layers K` runs only those
layers with their LoRA adapters (`trainer_setup.run_last_layers`); `hidden` stays the verifier's, the KL
teacher. The last layers need nothing else: every sequence is run alone from position 0 under plain
causal attention (`_write_shard`, as `DraftModel.hidden` runs the live LM), so positions and mask are
implied; the manifest records K and that convention (`INNER_POSITIONS`), and training refuses a store of
another K or convention.

`DIR/features.json` records the settings, the model's fingerprint (`loading.model_fingerprint`), the
data's (`data.packed_fingerprint`: a rerun on changed `--data` text is refused, never mixing two texts
in one store) and each finished shard with its size and SHA-256. A shard is written whole (a temporary
file, then a rename) before it is recorded, so a killed run, rerun with the same command, redoes at
most one shard; a recorded shard that is gone (removed, as the refusal of a damaged one advises) or
truncated is computed again; a larger `--max-tokens` extends the store (training sequences are taken
in one fixed shuffled order). `--out` must be new, empty or such a store: a folder holding files the
store did not write is refused, so none of the user's files is overwritten.
`FeatureSet` reads a split back: every shard checked against its record (size, SHA-256, shapes, and
dtypes: `hidden` and `inner` in the manifest's `dtype`) and the store against the model (a shard of another model,
a truncated or altered one is refused), then one sequence at a time through safetensors' memory map.
A store of any `--dtype` trains any head: `DraftModel` hands the head its input in the head's dtype.

Bounds: memory, one forward of `--batch-size` sequences (with `--draft-layers`, its every layer's hidden
states) and one shard's hidden states (`shard_sequences x L x d` values, twice that with `inner`); disk,
the estimate printed before the first forward (`inner` counted).
"""

from __future__ import annotations

import json
import os
import re
import time
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path

import torch

from .. import checks
from ..lm import loading
from ..lm.families import FAMILIES, OutputLayer, has_adapter
from ..errors import InputError
from ..files import LOCK_FILE, atomic_write, field, file_sha256, inside, regular_file
from .config import FeaturesConfig
from .data import PackedDataset, load_documents, packed_fingerprint, spread, split_documents
from .outputs import guarded_output
from .progress import progress_bar

__all__ = ["write_features", "FeatureSet", "MANIFEST", "FORMAT", "INNER_POSITIONS", "draft_layers_of"]

FORMAT = "mtpc-features/1"
MANIFEST = "features.json"
SPLITS = ("val", "train")
ORDER_SEED = 0  # the fixed shuffled order of training sequences (a --max-tokens prefix of it is cached)
MAX_SHARDS = 1 << 20
DATA_KEY = "data_sha256"  # the settings' fingerprint of the packed text (`data.packed_fingerprint`)
# a stored shard's tensors: the safetensors dtype of each (`hidden`: the store's --dtype, `HIDDEN_DTYPES`)
SHARD_DTYPES = {"greedy": "I32", "tokens": "I32", "loss_mask": "U8", "doc_ids": "I32"}
HIDDEN_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float64": "F64"}  # --dtype's torch names -> safetensors
STATE_TENSORS = ("hidden", "inner")  # the shard tensors in the store's --dtype (`inner`: --draft-layers only)
# how `inner` was computed (settings "inner_positions"): each packed sequence alone, positions 0..L-1, plain
# causal attention, no padding mask; the trainer replays the last layers the same way, and refuses another
INNER_POSITIONS = "causal, positions 0..seq_len-1, no attention mask"
# settings a store written before they existed lacks: read as their value then (a resume still matches)
SETTING_DEFAULTS = {"draft_layers": 0}
MAX_DRAFT_LAYERS = 1 << 16
SHARD_NAME = re.compile(r"(train|val)-\d{5}\.safetensors")
# what a killed run leaves: `atomic_write`'s and `_write_shard`'s temporary files, `.NAME.PID.tmp`
TEMPORARY_NAME = re.compile(r"\.(features\.json|(train|val)-\d{5}\.safetensors)\.\d+\.tmp")
MANIFEST_TEMPORARY = re.compile(r"\.features\.json\.\d+\.tmp")


# ------------------------------------------------------------------ writing


def write_features(cfg: FeaturesConfig, announce: Callable[[str], None] = print) -> dict:
    """Cache the LM's final hidden states of `cfg.data` in `cfg.out` (completing an earlier run of the
    same settings); returns a summary. Every input is checked before the model is loaded."""
    checks.output_folder(cfg.out)
    check_store_folder(Path(cfg.out))
    checks.data_source(cfg.data)
    info = loading.model_info(cfg.model, allow_non_byte_vocab=True, trust_remote_code=cfg.trust_remote_code)
    context = loading.model_config(info.path).get("max_position_embeddings")
    if context and cfg.seq_len > context:
        raise InputError(f"--seq-len {cfg.seq_len} is more than the {context} positions the model has")
    if cfg.seq_len < 2:
        raise InputError("--seq-len must be at least 2")
    check_draft_layers(cfg.draft_layers, info)
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
        settings = {**store_settings(cfg, info, tok), DATA_KEY: packed_fingerprint(sets)}
        manifest = _start_manifest(out, settings)
        lost = _forget_lost_shards(out, manifest)
        if lost:
            announce(f"mtpc features: {lost} recorded shard{'s' if lost > 1 else ''} missing or truncated in "
                     f"{out}: computing again")
        plan = _plan(cfg, sets, manifest)
        todo = [shard for shard in plan if shard["name"] not in manifest["shards"]]
        bytes_per_sequence = sequence_bytes(cfg, info.hidden_size, dtype.itemsize)
        total = sum(len(s["sequences"]) for s in plan)
        announce(f"mtpc features: {total:,} sequences of {cfg.seq_len} tokens ({sum(len(s['sequences']) for s in todo):,}"
                 f" to compute) in {len(plan)} shards{_inner_note(cfg.draft_layers)}: about "
                 f"{total * bytes_per_sequence / 2**30:.2f} GiB on disk, "
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
            inner_index = _inner_index(model, cfg.draft_layers)
            for shard in todo:
                _write_shard(out, shard, sets[shard["split"]], model, cfg.batch_size, device, bar, inner_index)
                manifest["shards"][shard["name"]] = shard["record"]
                atomic_write(out / MANIFEST, json.dumps(manifest, indent=1) + "\n")
                computed += len(shard["sequences"]) * cfg.seq_len
            bar.close()
        seconds = time.perf_counter() - started
        return {"shards": len(manifest["shards"]), "sequences": total, "tokens": total * cfg.seq_len,
                "new_tokens": computed, "seconds": seconds, "bytes": sum(r["bytes"] for r in manifest["shards"].values())}


def store_settings(cfg: FeaturesConfig, info, tok) -> dict:
    """What the cached values depend on: the model (its fingerprint), dtype, tokenizer, data and packing,
    and which layers' input `inner` holds (`draft_layers`, 0: none) computed how (`inner_positions`)."""
    inner = {"inner_positions": INNER_POSITIONS} if cfg.draft_layers else {}
    return {"model_fingerprint": loading.model_fingerprint(info.path), "hidden_size": info.hidden_size,
            "vocab_size": info.vocab_size, "tokenizer": type(tok).__name__,
            "dtype": str(loading.torch_dtype(cfg.dtype)).removeprefix("torch."), "seq_len": cfg.seq_len, "val_fraction": cfg.val_fraction,
            "data": str(Path(cfg.data).resolve()) if cfg.data and cfg.data != "stdlib" else "stdlib",
            "val_sequences": cfg.val_sequences, "shard_sequences": cfg.shard_sequences,
            "draft_layers": cfg.draft_layers, **inner}


def check_draft_layers(k, info) -> None:
    """`--draft-layers K`: at most the model's decoder layers, of a family whose last layers `mtpc train`
    can run from their input (the split loop's adapter, as a LoRA draft path needs)."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise InputError(f"--draft-layers must be an integer >= 0, got {k!r}")
    if not k:
        return
    layers = loading.model_config(info.path).get("num_hidden_layers")
    if isinstance(layers, int) and k > layers:
        raise InputError(f"--draft-layers {k} is more than the model's {layers} decoder layers")
    if not has_adapter(info.model_type):
        raise InputError(f"--draft-layers {k}: no split-backbone adapter for model_type {info.model_type!r} (known: "
                         f"{', '.join(sorted(FAMILIES))}), so mtpc train could not run the last layers; omit it")


def sequence_bytes(cfg: FeaturesConfig, hidden_size: int, itemsize: int) -> int:
    """A stored sequence's bytes: `hidden` (and `inner`) of `hidden_size` values in the store's dtype, and
    int32 tokens, greedy tokens, document ids and a byte of loss mask per position."""
    states = 2 if cfg.draft_layers else 1
    return cfg.seq_len * (states * hidden_size * itemsize + 4 + 4 + 4 + 1)


def _inner_note(k: int) -> str:
    return f" (final hidden states and the input of the last {k} layer{'s' if k > 1 else ''})" if k else ""


def _inner_index(model, k: int) -> int | None:
    """Which of the decoder's `hidden_states` is the input of its last `k` layers (entry 0: the embeddings,
    entry i: layer i's output), None without `--draft-layers`."""
    return model.config.num_hidden_layers - k if k else None


def draft_layers_of(settings: dict) -> int:
    """How many last layers' input a store holds (0: none; a store made before the setting existed)."""
    return settings.get("draft_layers", SETTING_DEFAULTS["draft_layers"])


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
    differing = [f"{k} {_shown(stored.get(k, SETTING_DEFAULTS.get(k)))} there, {_shown(settings[k])} now"
                 for k in sorted(settings) if k != DATA_KEY and stored.get(k, SETTING_DEFAULTS.get(k)) != settings[k]]
    if differing:
        raise InputError(f"{out} holds features made with other settings ({'; '.join(differing)}); use another "
                         "--out, or remove the folder to start over")
    if stored.get(DATA_KEY) != settings[DATA_KEY]:  # the same --data path, another text: never mixed in a store
        older = "" if stored.get(DATA_KEY) else " (or the folder predates mtpc's record of its text)"
        raise InputError(f"the --data text changed since the features in {out} were made: its tokens differ from "
                         f"those the store holds{older}; use a new --out, or remove the folder to start over")
    return manifest


def _forget_lost_shards(out: Path, manifest: dict) -> int:
    """Drop the records of shards whose file is gone or no longer of its recorded size (removed as a damaged
    shard's refusal advises, or truncated), so the plan computes them again; returns how many."""
    lost = [name for name, record in manifest["shards"].items()
            if not (out / name).is_file() or (out / name).stat().st_size != record["bytes"]]
    for name in lost:
        del manifest["shards"][name]
    if lost:
        atomic_write(out / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return len(lost)


def check_store_folder(out: Path) -> None:
    """`--out` is new, empty, or a store of mtpc features: it holds only the files the store writes (the
    manifest, shards, the lock, a killed run's temporary files), so no file of the user's is overwritten."""
    if not out.is_dir():
        return
    entries = sorted(out.iterdir())
    store = (out / MANIFEST).is_file()
    recorded = {LOCK_FILE, MANIFEST, *read_manifest(out)["shards"]} if store else set()
    foreign = [p.name for p in entries if p.is_dir() or not _written_by_store(p.name, store, recorded)]
    if foreign:
        more = f" and {len(foreign) - 1:,} more" if len(foreign) > 1 else ""
        what = "beside its features.json" if store else "without a features.json"
        raise InputError(f"--out {out} holds files mtpc features did not write ({_shown_name(foreign[0])}"
                         f"{more}, {what}); give a new or empty folder, or one mtpc features made")


def _written_by_store(name: str, store: bool, recorded: set[str]) -> bool:
    """Whether a file named `name` in `--out` is one mtpc features writes: in a store (`store`: it has a
    manifest), a file the manifest records (`recorded`), a shard file not yet recorded (a killed run's last,
    which the rerun writes again) or a killed write's temporary file; in a folder without a manifest
    (written before any shard), only the lock or a killed first manifest write."""
    if not store:
        return name == LOCK_FILE or bool(MANIFEST_TEMPORARY.fullmatch(name))
    return name in recorded or bool(SHARD_NAME.fullmatch(name) or TEMPORARY_NAME.fullmatch(name))


def _shown_name(name: str) -> str:
    """A file name of the user's folder for a message: quoted, cut at 60 characters (one line, whatever it
    holds)."""
    return ascii(name[:60] + ("..." if len(name) > 60 else ""))


def _shown(value) -> str:
    """A setting as the refusal shows it (a digest shortened; the folder's own file, never echoed at length)."""
    text = str(value)
    return text[:12] + "..." if len(text) > 40 else text


def _plan(cfg: FeaturesConfig, sets: dict[str, PackedDataset], manifest: dict) -> list[dict]:
    """The shards of the store: the held-out sequences spread evenly over the validation set, then a
    prefix of the training sequences in one fixed shuffled order, `shard_sequences` to a shard."""
    val = spread(len(sets["val"]), cfg.val_sequences)
    order = torch.randperm(len(sets["train"]), generator=torch.Generator().manual_seed(ORDER_SEED)).tolist()
    # integer ceiling division: a float quotient of a huge --max-tokens (the Python API's) would overflow
    wanted = len(order) if cfg.max_tokens is None else min(len(order), -(-cfg.max_tokens // cfg.seq_len))
    plan = []
    for split, indices in (("val", val), ("train", order[:wanted])):
        for k in range(0, len(indices), cfg.shard_sequences):
            plan.append({"name": f"{split}-{k // cfg.shard_sequences:05d}.safetensors", "split": split,
                         "sequences": indices[k:k + cfg.shard_sequences]})
    if len(plan) > MAX_SHARDS:
        raise InputError(f"{len(plan):,} shards are too many; raise --shard-sequences")
    return plan


@torch.no_grad()
def _write_shard(out: Path, shard: dict, dataset: PackedDataset, model, batch_size: int, device, bar,
                 inner_index: int | None = None) -> None:
    """One shard's sequences through the LM, saved whole, then its record set on `shard`; `inner_index`:
    which of the decoder's hidden states to keep as `inner` (`_inner_index`), None: none."""
    from safetensors.torch import save_file

    items = [dataset[i] for i in shard["sequences"]]
    tokens = torch.stack([it["tokens"] for it in items])  # [S, L]
    hidden, inner, greedy = [], [], []
    output = OutputLayer(model)
    for k in range(0, len(items), batch_size):
        batch = tokens[k:k + batch_size].to(device)
        # each sequence alone from position 0, no attention mask: the convention `INNER_POSITIONS` records
        run = model.get_decoder()(input_ids=batch, output_hidden_states=inner_index is not None)
        h = run.last_hidden_state  # [b, L, d]
        hidden.append(h.cpu())
        if inner_index is not None:
            inner.append(run.hidden_states[inner_index].cpu())  # [b, L, d] the input of the last K layers
        greedy.append(torch.stack([output(row).argmax(-1) for row in h]).cpu())  # [b, L], a row at a time
        bar.update(batch.numel())
    tensors = {"hidden": torch.cat(hidden).contiguous(), "greedy": torch.cat(greedy).int(), "tokens": tokens.int(),
               "loss_mask": torch.stack([it["loss_mask"] for it in items]).to(torch.uint8),
               "doc_ids": torch.stack([it["doc_ids"] for it in items]).int()}
    if inner:
        tensors["inner"] = torch.cat(inner).contiguous()
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
    field(settings, DATA_KEY, path, "str", default=None)
    if field(settings, "draft_layers", path, "int", low=0, high=MAX_DRAFT_LAYERS, default=0):
        field(settings, "inner_positions", path, "str")
    if field(settings, "dtype", path, "str") not in HIDDEN_DTYPES:
        raise InputError(f"{path}: dtype must be one of {', '.join(HIDDEN_DTYPES)} (the stored features' dtype)")
    shards = field(manifest, "shards", path, "object")
    if len(shards) > MAX_SHARDS:
        raise InputError(f"{path}: more than {MAX_SHARDS:,} shards")
    for name, record in shards.items():
        if not SHARD_NAME.fullmatch(name):  # what _plan names them: never a path, a NUL or a hidden file
            raise InputError(f"{path}: a shard name that is not one mtpc features writes (train-NNNNN.safetensors "
                             "or val-NNNNN.safetensors)")
        if not isinstance(record, dict) or record.get("split") not in SPLITS:
            raise InputError(f"{path}: shard {name} has no valid record")
        field(record, "sequences", path, "int", low=1, high=2**31)
        field(record, "bytes", path, "int", low=1, high=2**50)
        field(record, "sha256", path, "str")
    return manifest


class FeatureSet(torch.utils.data.Dataset):
    """One split (`train` or `val`) of a feature folder, checked against `model_folder`'s model; item `i`
    is a dict like `PackedDataset`'s (`tokens`, `loss_mask`, `doc_ids`: `[L]` long/bool) plus `hidden`
    `[L, d]` (the stored dtype; `DraftModel` casts it to the head's) and, with `inner=True`, `inner`
    `[L, d]` (the input of the last `draft_layers` layers; a store without it is refused). `info`: the
    checked model the head trains for; `tokenizer`: the class name of the tokenizer training reads text
    through."""

    def __init__(self, folder: str | Path, split: str, info: loading.ModelInfo, tokenizer: str | None = None,
                 inner: bool = False):
        from safetensors import safe_open

        self.folder = loading.readable_folder(folder, "features folder (--features)")
        manifest = read_manifest(self.folder)
        self.settings = manifest["settings"]
        check_model(self.folder, self.settings, info, tokenizer)
        if inner and not draft_layers_of(self.settings):
            raise InputError(f"{self.folder} holds no inner-layer features (made without mtpc features --draft-layers)")
        self.inner = inner
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
        item = {"tokens": f.get_slice("tokens")[row].long(), "loss_mask": f.get_slice("loss_mask")[row].bool(),
                "doc_ids": f.get_slice("doc_ids")[row].long(), "hidden": f.get_slice("hidden")[row],
                "greedy": f.get_slice("greedy")[row].long()}
        if self.inner:  # read only when the draft path runs from it (--lora-layers): it doubles the reads
            item["inner"] = f.get_slice("inner")[row]  # [L, d]
        return item


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
    from ..lm.loading import safetensors_header

    path = regular_file(inside(folder / name, folder), "a feature shard", max_bytes=2**50)
    if path.stat().st_size != record["bytes"] or file_sha256(path) != record["sha256"]:
        raise InputError(f"{path} is not the shard mtpc features wrote (its size or contents changed: damaged "
                         "or replaced); remove it and rerun the same mtpc features command to write it again")
    shapes = safetensors_header(path)
    S, L, d = record["sequences"], settings["seq_len"], settings["hidden_size"]
    expected = {"hidden": (S, L, d), "greedy": (S, L), "tokens": (S, L), "loss_mask": (S, L), "doc_ids": (S, L)}
    if draft_layers_of(settings):
        expected["inner"] = (S, L, d)
    if shapes != expected:
        inner = " (and inner-layer ones)" if draft_layers_of(settings) else ""
        raise InputError(f"{path}: its tensors are not those of {S} sequences of {L} tokens and {d} features{inner}")
    check_contents(path, settings)
    return path


def check_contents(path: Path, settings: dict) -> None:
    """The shard's dtypes are the store's (`hidden` and `inner` in the manifest's dtype: a shard of another
    --dtype run is refused, not fed to training), token ids in the vocabulary and document ids >= -1
    (padding), so no index is out of range later."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        for name in STATE_TENSORS[:2 if draft_layers_of(settings) else 1]:
            check_state_dtype(path, name, f.get_slice(name).get_dtype(), settings["dtype"])
        wrong = [name for name, code in SHARD_DTYPES.items() if f.get_slice(name).get_dtype() != code]
        if wrong:
            raise InputError(f"{path}: its {wrong[0]} tensor is not of the dtype mtpc features writes "
                             f"({SHARD_DTYPES[wrong[0]]}); remove it and rerun the same mtpc features command")
        check_ids(path, f, settings["vocab_size"])


def check_state_dtype(path: Path, name: str, code: str, dtype: str) -> None:
    """A stored state tensor (`hidden`, `inner`) of safetensors dtype `code` is in the manifest's `dtype`."""
    if code != HIDDEN_DTYPES[dtype]:
        stored = {c: n for n, c in HIDDEN_DTYPES.items()}.get(code, "another dtype")
        what = "hidden states" if name == "hidden" else "inner-layer states"
        raise InputError(f"{path}: its {what} are {stored}, but {MANIFEST} says {dtype} (a shard of another --dtype "
                         "run?); remove it and rerun the same mtpc features command to write it again")


def check_ids(path: Path, f, vocab_size: int) -> None:
    """Token ids in the vocabulary and document ids >= -1 (padding); `f`: the shard, opened."""
    tokens, doc_ids = torch.cat([f.get_tensor("tokens"), f.get_tensor("greedy")]), f.get_tensor("doc_ids")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size) or \
            doc_ids.numel() and int(doc_ids.min()) < -1:
        raise InputError(f"{path}: token or document ids out of range for a {vocab_size:,}-token vocabulary")

