"""Checks of user input, run before any slow work; each failure is one `InputError` naming the fix.

Two kinds live here:

- argparse `type=` functions for numeric flags (`positive_int`, `positive_float`, `probability`, ...):
  they refuse NaN, infinities and out-of-range values while the command line is parsed;
- checks of files and folders (`model_info`, `open_model`, `head_folder`, `output_folder`,
  `data_source`) and of how they fit together (`states_fit_vocabulary`, `hidden_sizes_match`).

This module imports torch and transformers only inside the functions that load a model, so the
command line can import it while staying quick to start.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError

TOKENIZER_FILE = "mtpc_tokenizer.json"  # mtpc.tokenizer.TOKENIZER_FILE (that module imports nothing heavy either)
MAX_BYTE_VOCAB = 512  # without mtpc_tokenizer.json, a vocabulary this small is taken as bytes + specials
MIN_BYTE_VOCAB = 264  # 256 bytes + the 8 special tokens of mtpc.tokenizer
HEAD_FILES = ("head.json", "head.safetensors")


# ------------------------------------------------------------------ numeric flags (argparse types)


def _number(text: str, kind: type, what: str, accepts) -> int | float:
    """`text` parsed as `kind` (floats finite), refused with one message naming `what` unless `accepts` it."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r} (NaN and infinities are refused)")
    if not accepts(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _number(text, int, "a positive integer", lambda v: v >= 1)


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    return _number(text, int, "an integer >= 0", lambda v: v >= 0)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    return _number(text, float, "a finite number > 0", lambda v: v > 0)


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    return _number(text, float, "a finite number >= 0", lambda v: v >= 0)


def probability(text: str) -> float:
    """A number in (0, 1] (discounts such as --gamma, nucleus mass such as --top-p)."""
    return _number(text, float, "a number in (0, 1]", lambda v: 0 < v <= 1)


def unit_interval(text: str) -> float:
    """A number in [0, 1] (a share, such as --greedy-fraction)."""
    return _number(text, float, "a number in [0, 1]", lambda v: 0 <= v <= 1)


# ------------------------------------------------------------------ files and folders


def _folder(path: str | Path, what: str) -> Path:
    folder = Path(path)
    if not folder.exists():
        raise InputError(f"{what} {str(folder)!r} does not exist")
    if not folder.is_dir():
        raise InputError(f"{what} {str(folder)!r} is not a folder")
    try:
        next(iter(folder.iterdir()), None)
    except OSError as e:
        raise InputError(f"{what} {str(folder)!r} cannot be read: {e.strerror or e}") from None
    return folder


def json_object(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path} is missing; {what}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path} cannot be read as JSON: {e}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} must hold a JSON object, it holds {type(data).__name__}")
    return data


@dataclass(frozen=True)
class ModelInfo:
    """What mtpc needs to know about a model folder before loading its weights."""

    path: Path
    model_type: str
    hidden_size: int
    vocab_size: int
    byte_level: bool  # ids 0..255 are the bytes (mtpc_tokenizer.json, or a small vocabulary)


def model_info(path: str | Path, *, allow_non_byte_vocab: bool = False) -> ModelInfo:
    """Check a Hugging Face checkpoint folder without loading its weights: readable, `config.json`
    of a supported family (Llama layout, see `mtpc.backbone.FAMILIES`), a byte-level vocabulary
    (refused otherwise unless `allow_non_byte_vocab`), and weights whose safetensors headers are whole."""
    folder = _folder(path, "model folder")
    config = json_object(folder / "config.json", "is this a Hugging Face checkpoint folder (save_pretrained)?")
    from .backbone import FAMILIES  # imports torch/transformers: only when a model is really checked

    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise InputError(f"{folder}: model_type {model_type!r} is not supported; mtpc runs decoder-only models with "
                         f"the Llama layout ({', '.join(sorted(FAMILIES))})")
    hidden, vocab = config.get("hidden_size"), config.get("vocab_size")
    for name, value in (("hidden_size", hidden), ("vocab_size", vocab)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"{folder / 'config.json'}: {name} must be a positive integer, got {value!r}")
    byte_level = _byte_level(folder, vocab)
    if not byte_level and not allow_non_byte_vocab:
        raise InputError(f"{folder}: a {vocab:,}-token vocabulary without {TOKENIZER_FILE} is not byte-level "
                         f"(mtpc needs ids 0..255 = bytes); pass --allow-non-byte-vocab to use token ids 0..255 "
                         "as bytes anyway")
    _check_weights(folder)
    return ModelInfo(folder, model_type, hidden, vocab, byte_level)


def _byte_level(folder: Path, vocab: int) -> bool:
    path = folder / TOKENIZER_FILE
    if path.exists():
        data = json_object(path, "")
        if data.get("type") != "mtpc-byte-tokenizer":
            raise InputError(f"{path} is not an mtpc byte-tokenizer description")
        return True
    return MIN_BYTE_VOCAB <= vocab <= MAX_BYTE_VOCAB


def _check_weights(folder: Path) -> None:
    """Every safetensors file has a whole header and data section (a truncated copy is caught here,
    in milliseconds, instead of deep inside `from_pretrained`)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files and not any(folder.glob("*.bin")):
        raise InputError(f"{folder} holds no model weights (*.safetensors)")
    for file in files:
        safetensors_file(file)


def safetensors_file(file: Path) -> None:
    """A safetensors file whose header parses and whose data section is as long as it says."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), "pt") as f:
            f.keys()
    except (SafetensorError, OSError) as e:
        raise InputError(f"{file} is damaged (truncated or not safetensors): {e}") from None


def open_model(path: str | Path, *, allow_non_byte_vocab: bool = False, dtype=None):
    """`model_info(path)` checks, then the causal LM in eval mode (float32 unless `dtype`), frozen.
    Returns `(model, info)`; a load that still fails is reported as an `InputError` about the folder."""
    import torch
    from transformers import AutoModelForCausalLM

    info = model_info(path, allow_non_byte_vocab=allow_non_byte_vocab)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(info.path), dtype=dtype or torch.float32)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        raise InputError(f"{info.path}: the model cannot be loaded: {_first_line(e)}") from e
    model.requires_grad_(False)
    return model.eval(), info


def byte_tokenizer(path: str | Path):
    """The model folder's `ByteTokenizer` (an `InputError` instead of `ValueError` for odd sizes)."""
    from .tokenizer import ByteTokenizer

    try:
        return ByteTokenizer.load(path)
    except (ValueError, KeyError, OSError) as e:
        raise InputError(f"{path}: no usable byte tokenizer: {_first_line(e)}") from None


def head_folder(path: str | Path) -> Path:
    """A folder written by `mtpc train` / `save_head` (head.json and head.safetensors present)."""
    folder = _folder(path, "head folder")
    missing = [name for name in HEAD_FILES if not (folder / name).is_file()]
    if missing:
        raise InputError(f"{folder} is not a head folder (no {' or '.join(missing)}; heads are written by "
                         "mtpc train)")
    safetensors_file(folder / HEAD_FILES[1])
    return folder


def output_folder(path: str | Path, what: str = "--out") -> Path:
    """An output folder that exists or can be created: not an existing file, not below one."""
    out = Path(path)
    for p in (out, *out.parents):
        if p.exists():
            if not p.is_dir():
                raise InputError(f"{what} {str(out)!r}: {str(p)!r} is a file, not a folder")
            break
    return out


def data_source(source: str | None, what: str = "--data") -> None:
    """A file, folder or glob that names at least one file (None: the default corpus)."""
    if source is None:
        return
    text = str(source)
    if any(ch in text for ch in "*?["):
        if not any(Path(p).is_file() for p in glob.iglob(str(Path(text).expanduser()), recursive=True)):
            raise InputError(f"{what} {text!r} matches no files")
    elif not Path(text).expanduser().exists():
        raise InputError(f"{what} {text!r} does not exist")


def states_fit_vocabulary(num_states: int, vocab_size: int, where: str) -> None:
    """A circuit's state `s` is token id `s`, so every state must be a token of the model."""
    if num_states > vocab_size:
        raise InputError(f"{where}: the circuit has {num_states} states per variable but the model's vocabulary "
                         f"has {vocab_size} tokens (state s is token id s; use v <= {vocab_size})")


def hidden_sizes_match(head_hidden: int, model_hidden: int, head: str, model: str) -> None:
    if head_hidden != model_hidden:
        raise InputError(f"head {head} reads hidden states of size {head_hidden}, model {model} has hidden size "
                         f"{model_hidden}; it was trained on another model")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
