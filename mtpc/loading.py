"""Reading things from disk: model folders, head folders, LoRA adapter folders, and devices.

Every loader checks before it builds: a folder that cannot be what it is named as is one `InputError`
naming the folder and the problem, raised before any weights are read. Heavy imports (torch,
transformers, peft) happen inside the functions that need them, so the command line stays quick.
Building a head from a head folder's files is `mtpc.heads`' job; this module only finds and checks
the folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError, first_line
from .tokenizer import TOKENIZER_FILE, ByteTokenizer

MAX_BYTE_VOCAB = 512  # without mtpc_tokenizer.json, a vocabulary this small is taken as bytes + specials
MIN_BYTE_VOCAB = 264  # 256 bytes + the 8 special tokens of mtpc.tokenizer
HEAD_FILES = ("head.json", "head.safetensors")
LORA_DIR = "lora"  # where `mtpc train` saves a head's draft-path adapter, inside the head folder
ADAPTER_CONFIG = "adapter_config.json"
REMOTE_CODE_FLAG = "--trust-remote-code"


# ------------------------------------------------------------------ folders and JSON

def readable_folder(path: str | Path, what: str) -> Path:
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
    remote_code: bool = False  # the config names its own modelling code (auto_map), allowed by the caller


def model_info(path: str | Path, *, allow_non_byte_vocab: bool = False, trust_remote_code: bool = False) -> ModelInfo:
    """Check a Hugging Face checkpoint folder without loading its weights: readable, `config.json`
    of a decoder-only causal LM (any `AutoModelForCausalLM` family; custom code, `auto_map`, only
    with `trust_remote_code`), a byte-level vocabulary (refused otherwise unless
    `allow_non_byte_vocab`), and weights whose safetensors headers are whole."""
    folder = readable_folder(path, "model folder")
    config = json_object(folder / "config.json", "is this a Hugging Face checkpoint folder (save_pretrained)?")
    model_type = config.get("model_type")
    remote = _remote_code(folder, config, trust_remote_code)
    if not remote:
        _check_causal_lm(folder, config)
    hidden, vocab = (_config_value(config, name) for name in ("hidden_size", "vocab_size"))
    for name, value in (("hidden_size", hidden), ("vocab_size", vocab)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"{folder / 'config.json'}: {name} must be a positive integer, got {value!r}")
    byte_level = _byte_level(folder, vocab)
    if not byte_level and not allow_non_byte_vocab:
        raise InputError(f"{folder}: a {vocab:,}-token vocabulary without {TOKENIZER_FILE} is not byte-level "
                         f"(mtpc needs ids 0..255 = bytes); pass --allow-non-byte-vocab to use token ids 0..255 "
                         "as bytes anyway")
    _check_weights(folder)
    return ModelInfo(folder, model_type, hidden, vocab, byte_level, remote)


def _remote_code(folder: Path, config: dict, trust_remote_code: bool) -> bool:
    """Whether the folder's config asks for its own modelling code (`auto_map`); refused unless trusted,
    so that no planted `modeling_*.py` runs by accident."""
    if "auto_map" not in config:
        return False
    if not trust_remote_code:
        raise InputError(f"{folder}: config.json names custom modelling code (auto_map: "
                         f"{', '.join(sorted(map(str, config['auto_map'])))[:80]}), which would run Python code from "
                         f"the folder; pass {REMOTE_CODE_FLAG} (Python: trust_remote_code=True) if you trust it")
    if "AutoModelForCausalLM" not in config["auto_map"]:
        raise InputError(f"{folder}: its custom code (auto_map) has no AutoModelForCausalLM; mtpc runs causal LMs")
    return True


def _check_causal_lm(folder: Path, config: dict) -> None:
    """A `model_type` transformers builds as a decoder-only `AutoModelForCausalLM`."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = config.get("model_type")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or config.get("is_encoder_decoder"):
        raise InputError(f"{folder}: model_type {str(model_type)[:40]!r} is not a decoder-only causal LM that "
                         "transformers knows (AutoModelForCausalLM); mtpc runs those")


def _config_value(config: dict, name: str):
    """`name` from a config.json, through the family's own spelling (GPT-2: `n_embd`) and, for a
    multimodal config, its `text_config`."""
    from transformers import CONFIG_MAPPING

    for part in (config, config.get("text_config")):
        if not isinstance(part, dict):
            continue
        if name in part:
            return part[name]
        cls = CONFIG_MAPPING[part["model_type"]] if part.get("model_type") in CONFIG_MAPPING else None
        alias = getattr(cls, "attribute_map", {}).get(name)
        if alias in part:
            return part[alias]
    return None


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


def open_model(path: str | Path, *, allow_non_byte_vocab: bool = False, dtype=None, trust_remote_code: bool = False):
    """`model_info(path)` checks, then the causal LM in eval mode (float32 unless `dtype`), frozen.
    Returns `(model, info)`; a load that still fails is reported as an `InputError` about the folder."""
    import torch
    from transformers import AutoModelForCausalLM

    info = model_info(path, allow_non_byte_vocab=allow_non_byte_vocab, trust_remote_code=trust_remote_code)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(info.path), dtype=dtype or torch.float32,
                                                     trust_remote_code=info.remote_code, local_files_only=True)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        raise InputError(f"{info.path}: the model cannot be loaded: {first_line(e)}") from e
    model.requires_grad_(False)
    return model.eval(), info


def byte_tokenizer(path: str | Path):
    """The model folder's `ByteTokenizer` (an `InputError` instead of `ValueError` for odd sizes)."""
    try:
        return ByteTokenizer.load(path)
    except (ValueError, KeyError, OSError) as e:
        raise InputError(f"{path}: no usable byte tokenizer: {first_line(e)}") from None


def head_folder(path: str | Path) -> Path:
    """A folder written by `mtpc train` / `save_head` (head.json and head.safetensors present)."""
    folder = readable_folder(path, "head folder")
    missing = [name for name in HEAD_FILES if not (folder / name).is_file()]
    if missing:
        raise InputError(f"{folder} is not a head folder (no {' or '.join(missing)}; heads are written by "
                         "mtpc train)")
    safetensors_file(folder / HEAD_FILES[1])
    return folder


# ------------------------------------------------------------------ models and devices

def load_model(path: str | Path, dtype=None, device=None, allow_non_byte_vocab: bool = True,
               trust_remote_code: bool = False):
    """The LM in eval mode on `device` (`open_model`: a folder that cannot be one is an `InputError`)."""
    model, _ = open_model(path, allow_non_byte_vocab=allow_non_byte_vocab, dtype=dtype,
                          trust_remote_code=trust_remote_code)
    return model.to(device).eval() if device is not None else model


def resolve_device(name: str):
    """The device called `name`; "auto" is CUDA when available, else the CPU."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


# ------------------------------------------------------------------ LoRA adapter folders

def head_lora_folder(head: str | Path) -> Path | None:
    """The draft-path adapter `mtpc train` saved inside a head folder (`HEAD/lora`), if there is one."""
    folder = Path(head) / LORA_DIR
    return folder if (folder / ADAPTER_CONFIG).is_file() else None


def lora_folder(path: str | Path, what: str = "--lora") -> Path:
    """A peft adapter folder named by the user (it must hold `adapter_config.json`)."""
    folder = Path(path)
    if not (folder / ADAPTER_CONFIG).is_file():
        raise InputError(f"{what} {folder}: no {ADAPTER_CONFIG}; expected a peft adapter folder "
                         f"(mtpc train writes one to OUT/{LORA_DIR})")
    return folder


def adapter_layers(folder: Path, wanted: int | None = None) -> int:
    """How many (last) decoder layers the adapter in `folder` adapts; `wanted` must agree when given."""
    config = json_object(folder / ADAPTER_CONFIG, "the LoRA adapter's configuration")
    layers = config.get("layers_to_transform") or []
    if not isinstance(layers, list) or not layers:
        raise InputError(f"{folder}: the adapter does not say which layers it adapts (layers_to_transform)")
    if wanted is not None and wanted != len(layers):
        raise InputError(f"--lora-layers {wanted}, but the adapter in {folder} adapts the last {len(layers)} layers")
    return len(layers)


def load_lora(model, folder: Path):
    """`model` wrapped with the peft adapter saved in `folder` (read from local files only)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(folder), local_files_only=True).eval()
