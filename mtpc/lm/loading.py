"""Reading a model from disk: model folders, head folders (found and checked), tokenizers, dtypes and devices.

Every loader checks before it builds: a folder that cannot be what it is named as is one `InputError`
naming the folder and the problem, raised before any weights are read. Heavy imports (torch,
transformers, peft) happen inside the functions that need them, so the command line stays quick.
LoRA adapter folders are `mtpc.lm.lora`'s. Building a head from a head folder's files is `mtpc.heads`'
job; this module only finds and checks the folder.
"""

from __future__ import annotations

import itertools
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, MissingFolderError, first_line
from ..checks import MAX_CONTEXT, MAX_HIDDEN, MAX_LAYERS
from ..files import describe, field, inside, parse_json, read_json, regular_file
from .tokenizer import TOKENIZER_FILE, ByteTokenizer

MAX_BYTE_VOCAB = 512  # without mtpc_tokenizer.json, a vocabulary this small is taken as bytes + specials
MIN_BYTE_VOCAB = 264  # 256 bytes + the 8 special tokens of mtpc.lm.tokenizer
HEAD_FILES = ("head.json", "head.safetensors")
REMOTE_CODE_FLAG = "--trust-remote-code"
GENERATION_CONFIG = "generation_config.json"
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
HF_TOKENIZER_MODELS = ("BPE", "WordPiece", "WordLevel", "Unigram")  # the model types `tokenizers` reads

log = logging.getLogger(__name__)
_warned: set[Path] = set()  # tokenizer.json files already warned about (model_info runs more than once a run)


# ------------------------------------------------------------------ folders and JSON

def readable_folder(path: str | Path, what: str) -> Path:
    """`path` if it is a readable folder; a missing one is a `MissingFolderError` naming it, raised before
    transformers or peft see the name (they would take it for a Hub id and fail to connect)."""
    folder = Path(path)
    if not folder.exists():
        raise MissingFolderError(f"no such {what}: {path}{missing_folder_hint(path)}")
    if not folder.is_dir():
        raise InputError(f"{what} {str(folder)!r} is not a folder")
    try:
        next(iter(folder.iterdir()), None)
    except OSError as e:
        raise InputError(f"{what} {str(folder)!r} cannot be read: {e.strerror or e}") from None
    return folder


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")  # `gpt2`, `org/name`: what the Hub calls a repo id


def looks_like_hub_id(path: str | Path) -> bool:
    """A missing path that could be meant as a Hugging Face Hub id: a string (a `Path` is a path) of one
    or two plain name parts, the first of which is not a local folder (`runs/x` with a `runs/` here is
    a local path, mistyped; `./x`, `/x`, `~/x` and `a/b/c` are paths by their shape)."""
    return isinstance(path, str) and bool(HUB_ID.fullmatch(path)) and not Path(path.split("/")[0]).is_dir()


def missing_folder_hint(path: str | Path) -> str:
    """What to say after "no such folder: PATH": for a Hub-id-shaped name, that mtpc did not look it up on
    the Hub (it reads local folders only) and how to get it; for a local path whose parent exists, the
    folders that parent holds (the likely typo)."""
    if looks_like_hub_id(path):
        return (f" (mtpc reads local folders only and did not look {path!r} up on the Hugging Face Hub; "
                f"to use a Hub model, download it first, e.g. `hf download {path} --local-dir DIR`, and pass DIR)")
    parent = Path(path).parent
    if str(parent) in ("", ".", parent.anchor) or not parent.is_dir():
        return ""  # the working folder or the root: too broad to be a hint
    try:
        names = sorted(p.name for p in itertools.islice(parent.iterdir(), 200) if holds_files(p))
    except OSError:
        return ""
    if not names:
        return ""
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    return f" ({parent}/ holds: {shown})"


def holds_files(path: Path) -> bool:
    """A folder with something in it besides hidden files (not the empty output folder a failing
    command has just made for itself, holding only its lock)."""
    if path.name.startswith(".") or not path.is_dir():
        return False
    return any(not p.name.startswith(".") for p in itertools.islice(path.iterdir(), 50))


def model_folder(path: str | Path) -> Path:
    """The checkpoint folder a `--model` names: the folder itself, or for a GGUF file (`model.gguf`) the
    folder it was dequantized into once (`mtpc.lm.gguf_files`, in mtpc's cache, keyed on its content)."""
    from .gguf_files import is_gguf, model_folder_for

    if is_gguf(path):
        return model_folder_for(path)
    return readable_folder(path, "model folder")


def json_object(path: Path, what: str, folder: Path | None = None) -> dict:
    """The JSON object in `path` through `mtpc.files.read_json` (regular file, size and depth caps;
    inside `folder` when given); a missing file says `what` it should have been."""
    if not path.exists() and not path.is_symlink():
        raise InputError(f"{path} is missing; {what}" if what else f"{path} is missing")
    return read_json(path, what or "a JSON file", folder=folder)


MAX_VOCAB = 2**22  # with checks' MAX_LAYERS, MAX_CONTEXT, MAX_HIDDEN: what a model's sizes may be


def model_config(path: str | Path, what: str = "--model") -> dict:
    """A model folder's `config.json`, checked: an object, its sizes integers in range, the attention
    heads dividing the hidden size, and the parameter count they imply present in the weights' headers
    (`check_weights_fit`). Raises `InputError` naming the file and the key."""
    folder = model_folder(path)
    file = folder / "config.json"
    config = json_object(file, "is this a Hugging Face checkpoint folder (save_pretrained)?", folder)
    sizes = model_sizes(config)  # each family's own spelling (GPT-2: n_embd) resolved
    limits = {"hidden_size": MAX_HIDDEN, "vocab_size": MAX_VOCAB, "num_hidden_layers": MAX_LAYERS,
              "num_attention_heads": MAX_HIDDEN, "intermediate_size": 2**20, "max_position_embeddings": MAX_CONTEXT}
    for key, high in limits.items():
        required = key in ("hidden_size", "vocab_size")
        field(sizes, key, file, "int", low=1, high=high, **({} if required else {"default": None}))
    kv = field(sizes, "num_key_value_heads", file, "int", low=1, high=MAX_HIDDEN, default=None)
    _check_other_integers(config, file)
    heads, hidden = sizes.get("num_attention_heads"), sizes["hidden_size"]
    if heads is not None and hidden % heads:
        raise InputError(f"{file}: num_attention_heads ({heads}) must divide hidden_size ({hidden})")
    if heads is not None and kv is not None and heads % kv:
        raise InputError(f"{file}: num_key_value_heads ({kv}) must divide num_attention_heads ({heads})")
    for name in (GENERATION_CONFIG, *HF_TOKENIZER_FILES):
        if (folder / name).exists() or (folder / name).is_symlink():
            json_object(folder / name, "", folder)
    return config


WINDOW_KEYS = ("sliding_window", "attention_window")  # a window of positions: None, or 1 .. MAX_CONTEXT
MAX_CONFIG_INTEGER = 2**53  # any other integer of a config (an id, a count): beyond it transformers overflows


def _check_other_integers(config: dict, file: Path) -> None:
    """Integers of the config (and its `text_config`) transformers would build from: windows in range, and
    no integer past `MAX_CONFIG_INTEGER` (a sliding window of 10^100 overflowed deep inside the model)."""
    for part in (config, config.get("text_config")):
        if not isinstance(part, dict):
            continue
        for key in WINDOW_KEYS:
            if part.get(key) is not None:
                field(part, key, file, "int", low=1, high=MAX_CONTEXT)
        for key, value in part.items():
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_CONFIG_INTEGER:
                raise InputError(f"{file}: {key[:60]!r} is {describe(value)}, past any size transformers builds")


SIZE_KEYS = ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "intermediate_size", "max_position_embeddings", "head_dim", "tie_word_embeddings")


def model_sizes(config: dict) -> dict:
    """The sizes of a config.json under transformers' common names, whatever the family spells them."""
    if not isinstance(config.get("model_type", ""), str):
        return {key: config.get(key) for key in SIZE_KEYS if key in config}
    return {key: value for key in SIZE_KEYS if (value := _config_value(config, key)) is not None}


def implied_parameters(config: dict) -> int:
    """The weights a config asks for, counted as for the Llama layout (embeddings, attention, MLP; norms
    aside): an estimate within a factor of two for the other families, which is all the check needs."""
    config = model_sizes(config)
    d, v = config["hidden_size"], config["vocab_size"]
    layers = config.get("num_hidden_layers") or 1
    heads = config.get("num_attention_heads") or 1
    head_dim = config.get("head_dim") or d // heads
    kv = config.get("num_key_value_heads") or heads
    ffn = config.get("intermediate_size") or 4 * d
    attention = d * heads * head_dim * 2 + d * kv * head_dim * 2
    embeddings = v * d * (1 if config.get("tie_word_embeddings") else 2)
    return embeddings + layers * (attention + 3 * d * ffn)


@dataclass(frozen=True)
class ModelInfo:
    """What mtpc needs to know about a model folder before loading its weights."""

    path: Path
    model_type: str
    hidden_size: int
    vocab_size: int
    byte_level: bool  # ids 0..255 are the bytes (mtpc_tokenizer.json, or a small vocabulary)
    remote_code: bool = False  # the config names its own modelling code (auto_map), allowed by the caller


def model_info(path: str | Path, *, allow_non_byte_vocab: bool = False, trust_remote_code: bool = False,
               subword_ok: bool = False) -> ModelInfo:
    """Check a Hugging Face checkpoint folder without loading its weights: readable, `config.json`
    of a decoder-only causal LM (any `AutoModelForCausalLM` family; custom code, `auto_map`, only
    with `trust_remote_code`), sizes in range (`model_config`), a byte-level vocabulary (refused
    otherwise unless `allow_non_byte_vocab`, or `subword_ok` and the folder has its own tokenizer
    files), and weights whose safetensors headers are whole."""
    folder = model_folder(path)
    config = model_config(folder)
    model_type = config.get("model_type")
    remote = _remote_code(folder, config, trust_remote_code)
    if not remote:
        _check_causal_lm(folder, config)
    sizes = model_sizes(config)
    hidden, vocab = sizes["hidden_size"], sizes["vocab_size"]
    byte_level = _byte_level(folder, vocab)
    if not byte_level and not allow_non_byte_vocab and not (subword_ok and has_hf_tokenizer(folder)):
        own = " or its own tokenizer files (tokenizer.json)" if subword_ok else ""
        raise InputError(f"{folder}: a {vocab:,}-token vocabulary without {TOKENIZER_FILE}{own} is not byte-level "
                         f"(mtpc needs ids 0..255 = bytes); pass --allow-non-byte-vocab to use token ids 0..255 "
                         "as bytes anyway")
    _check_hf_tokenizer(folder, byte_level)
    _check_weights(folder, config)
    return ModelInfo(folder, model_type, hidden, vocab, byte_level, remote)


def _check_hf_tokenizer(folder: Path, byte_level: bool) -> None:
    """A `tokenizer.json` of a model type `tokenizers` does not know: refused where it would be read
    (a subword model), said to be ignored where it is not (a byte-level model reads mtpc_tokenizer.json;
    `AutoTokenizer.from_pretrained` on the folder would still fail). No "type" is accepted: old files
    leave it out and `tokenizers` infers it."""
    path = folder / HF_TOKENIZER_FILES[0]
    if not path.is_file():
        return
    model = json_object(path, "", folder).get("model")
    kind = model.get("type") if isinstance(model, dict) else model
    if isinstance(model, dict) and ("type" not in model or kind in HF_TOKENIZER_MODELS):
        return
    shown = repr(kind) if isinstance(kind, str) and kind.isidentifier() and len(kind) <= 40 else describe(kind)
    problem = (f"{path}: its model type {shown} is not a tokenizer the tokenizers library knows "
               f"({', '.join(HF_TOKENIZER_MODELS)})")
    if not byte_level:
        raise InputError(problem)
    if path not in _warned:
        _warned.add(path)
        log.warning("warning: %s; ignored (mtpc reads %s), but AutoTokenizer.from_pretrained on the folder "
                    "would fail", problem, TOKENIZER_FILE)


def _remote_code(folder: Path, config: dict, trust_remote_code: bool) -> bool:
    """Whether the folder's config asks for its own modelling code (`auto_map`); refused unless trusted,
    so that no planted `modeling_*.py` runs by accident."""
    if "auto_map" not in config:
        return False
    if not isinstance(config["auto_map"], dict):
        raise InputError(f"{folder / 'config.json'}: auto_map must be a JSON object, it is {describe(config['auto_map'])}")
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
    if not isinstance(model_type, str) or model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES \
            or config.get("is_encoder_decoder"):
        shown = repr(model_type) if isinstance(model_type, str) and model_type.isidentifier() and len(model_type) <= 40 \
            else describe(model_type)  # never a long string from the file: it could be someone's secret
        raise InputError(f"{folder}: model_type {shown} is not a decoder-only causal LM that "
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
        model_type = part.get("model_type")
        cls = CONFIG_MAPPING[model_type] if isinstance(model_type, str) and model_type in CONFIG_MAPPING else None
        alias = getattr(cls, "attribute_map", {}).get(name)
        if alias in part:
            return part[alias]
    return None


def _byte_level(folder: Path, vocab: int) -> bool:
    """Ids 0..255 are the bytes: the folder says so (mtpc_tokenizer.json), or it has no tokenizer of its own
    and a vocabulary of bytes and a few specials. A folder's own tokenizer files always win over the size
    (a converted GGUF of 300 tokens is not a byte model)."""
    path = folder / TOKENIZER_FILE
    if path.exists():
        try:
            ByteTokenizer.from_dict(json_object(path, "", folder), str(path))
        except ValueError as e:
            if isinstance(e, InputError):
                raise
            raise InputError(str(e)) from None
        return True
    return MIN_BYTE_VOCAB <= vocab <= MAX_BYTE_VOCAB and not has_hf_tokenizer(folder)


def _check_weights(folder: Path, config: dict) -> None:
    """Every safetensors file has a whole header and data section (a truncated copy is caught here,
    in milliseconds, instead of deep inside `from_pretrained`), lies inside the folder, and together
    they hold the parameters `config.json` implies (its sizes cannot ask for more than is there).
    Pickled weights (`*.bin`) are refused: loading them can run code."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickled = any(folder.glob("*.bin")) or any(folder.glob("*.pt")) or any(folder.glob("*.pth"))
        raise InputError(f"{folder} holds no model weights (*.safetensors)" + (
            "; pickled weights (*.bin) are refused because loading them can run code: convert them with "
            "save_pretrained(..., safe_serialization=True)" if pickled else ""))
    headers = [safetensors_header(inside(file, folder)) for file in files]
    stored = sum(_numel(shape) for header in headers for shape in header.values())
    implied = implied_parameters(config)
    if implied > 2 * stored + 2**20:
        raise InputError(f"{folder / 'config.json'}: its sizes imply {implied:,} parameters, but the weights hold "
                         f"only {stored:,}; config.json does not describe these weights")
    vocab = model_sizes(config)["vocab_size"]
    for name, shape in ((n, s) for header in headers for n, s in header.items()):
        if name.endswith(EMBEDDING_NAMES) and len(shape) == 2 and shape[0] < vocab:
            raise InputError(f"{folder / 'config.json'}: vocab_size is {vocab:,}, but the embedding ({name}) has "
                             f"only {shape[0]:,} rows")


EMBEDDING_NAMES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")  # the families' input embeddings


def _numel(shape) -> int:
    total = 1
    for n in shape:
        total *= n
    return total


MAX_SAFETENSORS_HEADER = 100 * 2**20
SAFETENSORS_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
                      "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def safetensors_header(file: Path) -> dict[str, tuple[int, ...]]:
    """The tensor shapes of a safetensors file by name, read from its header alone (never mapped: a
    sparse file claiming terabytes costs nothing here); the header must parse and its data offsets
    must tile the rest of the file exactly (a truncated copy is caught)."""
    size = regular_file(file, "safetensors weights", max_bytes=2**50).stat().st_size
    damaged = f"{file} is damaged (truncated or not safetensors)"
    try:
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if size < 8 or not 2 <= n <= min(MAX_SAFETENSORS_HEADER, size - 8):
                raise InputError(f"{damaged}: its header length does not fit the file")
            header = parse_json(f.read(n), str(file), max_depth=4)
    except OSError as e:
        raise InputError(f"{damaged}: {e.strerror or type(e).__name__}") from None
    if not isinstance(header, dict):
        raise InputError(f"{damaged}: its header is not a JSON object")
    header.pop("__metadata__", None)
    shapes, end = {}, 0
    for name, entry in sorted(header.items(), key=lambda kv: _offsets(kv[1])[0] if isinstance(kv[1], dict) else 0):
        shape, dtype, (start, stop) = _entry(entry, name, damaged)
        if start != end or stop - start != _numel(shape) * SAFETENSORS_DTYPES[dtype]:
            raise InputError(f"{damaged}: tensor {name} does not sit where its header says")
        shapes[name], end = shape, stop
    if 8 + n + end != size:
        raise InputError(f"{damaged}: its header describes {end:,} bytes of data, the file holds {size - 8 - n:,}")
    return shapes


def _offsets(entry: dict) -> tuple[int, int]:
    offsets = entry.get("data_offsets")
    ok = isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) and o >= 0 for o in offsets)
    return tuple(offsets) if ok else (-1, -1)


def _entry(entry, name: str, damaged: str) -> tuple[tuple[int, ...], str, tuple[int, int]]:
    if not isinstance(entry, dict) or entry.get("dtype") not in SAFETENSORS_DTYPES:
        raise InputError(f"{damaged}: tensor {name} has no known dtype")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in shape):
        raise InputError(f"{damaged}: tensor {name} has no valid shape")
    start, stop = _offsets(entry)
    if start < 0 or stop < start:
        raise InputError(f"{damaged}: tensor {name} has no valid data_offsets")
    return tuple(shape), entry["dtype"], (start, stop)


def safetensors_file(file: Path) -> None:
    """A safetensors file whose header parses and whose data section is as long as it says."""
    safetensors_header(file)


FINGERPRINT_SAMPLES = 16  # slices of each weights file read into a model's fingerprint
FINGERPRINT_SLICE = 1 << 16


def model_fingerprint(path: str | Path) -> str:
    """A digest telling one model's weights from another's, read in milliseconds: `config.json`, and of
    every safetensors file its size, its header and 16 slices of 64 KiB spread over it (two fine-tunes
    of one architecture share headers, not weights)."""
    import hashlib

    folder = model_folder(path)
    digest = hashlib.sha256(regular_file(folder / "config.json", "config.json").read_bytes())
    for file in sorted(folder.glob("*.safetensors")):
        size = inside(file, folder).stat().st_size
        digest.update(f"{file.name}\0{size}\0".encode())
        with open(file, "rb") as f:
            for k in range(FINGERPRINT_SAMPLES):
                f.seek(size * k // FINGERPRINT_SAMPLES)
                digest.update(f.read(FINGERPRINT_SLICE))
    return digest.hexdigest()


def open_model(path: str | Path, *, allow_non_byte_vocab: bool = False, dtype=None, trust_remote_code: bool = False):
    """`model_info(path)` checks, then the causal LM in eval mode (float32 unless `dtype`), frozen.
    Returns `(model, info)`; a load that still fails is reported as an `InputError` about the folder."""
    import torch
    from transformers import AutoModelForCausalLM

    info = model_info(path, allow_non_byte_vocab=allow_non_byte_vocab, trust_remote_code=trust_remote_code)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(info.path), dtype=dtype or torch.float32,
                                                     trust_remote_code=info.remote_code, local_files_only=True)
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as e:
        raise InputError(f"{info.path}: the model cannot be loaded: {first_line(e)}") from e
    except Exception as e:  # noqa: BLE001 -- transformers' config validators raise their own classes
        raise InputError(f"{info.path}: the model cannot be loaded: {type(e).__name__}: {first_line(e)}") from e
    model.requires_grad_(False)
    return model.eval(), info


def byte_tokenizer(path: str | Path):
    """The model folder's `ByteTokenizer` (an `InputError` instead of `ValueError` for odd sizes)."""
    try:
        return ByteTokenizer.load(path)
    except InputError:
        raise
    except (ValueError, KeyError, OSError) as e:
        raise InputError(f"{path}: no usable byte tokenizer: {first_line(e)}") from None


def subword_tokenizer(path: str | Path, vocab_size: int | None, trust_remote_code: bool = False):
    """The model folder's own (subword) tokenizer, `mtpc.lm.tokenizer.SubwordTokenizer` (`vocab_size`: the
    model's, or None for the tokenizer's own size): its Hugging Face
    files must be there (nothing is downloaded); a tokenizer that cannot be read is an `InputError`."""
    from .tokenizer import SubwordTokenizer

    folder = Path(path)
    if not has_hf_tokenizer(folder):
        raise InputError(f"{folder}: a subword model needs its own tokenizer files (tokenizer.json or "
                         "tokenizer_config.json, as tokenizer.save_pretrained writes them)")
    try:
        return SubwordTokenizer.load(folder, vocab_size, trust_remote_code)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 -- transformers reports a bad tokenizer in many classes
        raise InputError(f"{folder}: its tokenizer cannot be loaded: {type(e).__name__}: {first_line(e)}") from None


def has_hf_tokenizer(folder: Path) -> bool:
    """The folder holds a Hugging Face tokenizer's files (`tokenizer.json` or `tokenizer_config.json`)."""
    return any((folder / n).is_file() for n in HF_TOKENIZER_FILES[:2])


def model_tokenizer(info: ModelInfo, subword: bool | None = None, trust_remote_code: bool = False):
    """The tokenizer text goes through for this model: its byte tokenizer when the vocabulary is
    byte-level, else (`subword`, by default when the folder has Hugging Face tokenizer files) its own
    subword tokenizer, else the byte view (ids 0..255 taken as bytes, `--allow-non-byte-vocab`)."""
    if subword is None:
        subword = not info.byte_level and has_hf_tokenizer(info.path)
    if subword and not info.byte_level:
        return subword_tokenizer(info.path, info.vocab_size, trust_remote_code)
    return byte_tokenizer(info.path)


def head_folder(path: str | Path) -> Path:
    """A folder written by `mtpc train` / `save_head` (head.json and head.safetensors present)."""
    folder = readable_folder(path, "head folder")
    missing = [name for name in HEAD_FILES if not ((folder / name).exists() or (folder / name).is_symlink())]
    if missing:
        raise InputError(f"{folder} is not a head folder (no {' or '.join(missing)}; heads are written by "
                         "mtpc train)")
    for name in HEAD_FILES:
        regular_file(inside(folder / name, folder), "a head folder file", max_bytes=2**50)
    safetensors_file(folder / HEAD_FILES[1])
    return folder


DEPTH_TOPK_FILE = "depth_topk.json"  # a head's per-depth top-k acceptance measured after training
MAX_DEPTH_TOPK_K, MAX_DEPTH_TOPK_DEPTHS = 16, 64  # a table's k and depths at most (`mtpc train` records 4 k)


def head_depth_topk(path: str | Path) -> dict | None:
    """A head folder's per-depth top-k acceptance on held-out windows (`val_depth_topk`): from
    `depth_topk.json` (benchmarks/depth_acceptance.py's `--out` record, whose `val_depth_topk` it is, or
    the table alone) when the folder has one, else from `train_config.json` (what `mtpc train` recorded);
    None when neither holds it. Checked here, where it is read, by `depth_topk_table`'s rules: a table
    that breaks one (or a depth_topk.json that holds none, or is no JSON object) is an `InputError`
    naming the file, never skipped."""
    folder = head_folder(path)
    for name in (DEPTH_TOPK_FILE, "train_config.json"):
        file = folder / name
        if not file.exists() and not file.is_symlink():
            continue
        record = json_object(file, "", folder)
        if name == DEPTH_TOPK_FILE:  # the script's record or the table alone: a table it must hold
            table = record["val_depth_topk"] if "val_depth_topk" in record else record
        elif (table := record.get("val_depth_topk")) is None:
            continue  # a head trained before mtpc recorded one
        try:
            return depth_topk_table(table)
        except ValueError as e:
            raise InputError(f"{file}: {e}") from None
    return None


def depth_topk_table(table) -> dict:
    """`table` (a `val_depth_topk`: `mtpc.heads.nll_loss.depth_topk`'s record) checked, one rule each:

    - an object with the lists `k`, `depth` and `path` (other keys, such as `token`, are not read);
    - `k`: 1 to 16 increasing integers in 1..65,536;
    - `depth`: 1 to 64 consecutive integers from 0 or 1 (a head that reads `x_0` is scored from depth 1,
      one that drafts it too from depth 0);
    - `path`: a row per depth of a rate in [0, 1] (or null: no window) per `k`;
    - the rates growing with `k` and falling with depth (every depth through `d` within the top `k`: a
      larger `k` or a shallower depth never keeps fewer windows).

    Returns its `k`, `depth` and `path`; a broken rule is a `ValueError` saying which."""
    if not isinstance(table, dict):
        raise ValueError(f"val_depth_topk must be an object with the lists k, depth and path, got {describe(table)}")
    missing = [key for key in ("k", "depth", "path") if not isinstance(table.get(key), list)]
    if missing:
        raise ValueError(f"val_depth_topk must be an object with the lists k, depth and path; {', '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} missing or not a list")
    ks, depths, rows = table["k"], table["depth"], table["path"]
    if not 1 <= len(ks) <= MAX_DEPTH_TOPK_K or not all(_is_int(k) and 1 <= k <= 2**16 for k in ks) \
            or ks != sorted(set(ks)):
        raise ValueError(f"val_depth_topk k must be 1 to {MAX_DEPTH_TOPK_K} increasing integers in 1..65,536")
    if not 1 <= len(depths) <= MAX_DEPTH_TOPK_DEPTHS or not all(_is_int(d) for d in depths) \
            or depths[0] not in (0, 1) or depths != list(range(depths[0], depths[0] + len(depths))):
        raise ValueError(f"val_depth_topk depth must be 1 to {MAX_DEPTH_TOPK_DEPTHS} consecutive integers from 0 or 1")
    if len(rows) != len(depths) or not all(isinstance(row, list) and len(row) == len(ks) and all(
            x is None or _is_rate(x) for x in row) for row in rows):
        raise ValueError("val_depth_topk path rows must hold a rate in [0, 1] (or null) per k, a row per depth")
    if not all(_ordered(row) for row in rows) or not all(_ordered(column[::-1]) for column in zip(*rows)):
        raise ValueError("val_depth_topk path rates must grow with k and fall with depth (a path within the top k "
                         "is within every larger k's, and its shorter paths are too)")
    return {"k": list(ks), "depth": list(depths), "path": [list(row) for row in rows]}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_rate(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1  # NaN fails


def _ordered(rates) -> bool:
    """Whether the rates (nulls left out) never fall."""
    known = [r for r in rates if r is not None]
    return all(a <= b for a, b in zip(known, known[1:]))


# ------------------------------------------------------------------ models and devices

def load_model(path: str | Path, dtype=None, device=None, allow_non_byte_vocab: bool = True,
               trust_remote_code: bool = False):
    """The LM in eval mode on `device` (`open_model`: a folder that cannot be one is an `InputError`)."""
    model, _ = open_model(path, allow_non_byte_vocab=allow_non_byte_vocab, dtype=dtype,
                          trust_remote_code=trust_remote_code)
    return model.to(device).eval() if device is not None else model


def torch_dtype(name: str):
    """The torch dtype of a `--dtype` name (`fp32`, `bf16`, `fp64`, or their torch names)."""
    import torch

    from ..checks import DTYPES, dtype_name

    try:
        return getattr(torch, DTYPES[dtype_name(name)])
    except Exception:  # noqa: BLE001 -- argparse's own error class, from the Python API
        raise InputError(f"dtype {name!r} is not one of {', '.join(DTYPES)}") from None


def resolve_dtype(name: str, device, stored: str | None = None) -> str:
    """A `--dtype` name with `auto` resolved for `device` and a model whose checkpoint holds `stored` weights
    (`stored_dtype`): `fp32` for a float32 checkpoint (its own dtype, as transformers' `dtype="auto"` keeps it:
    bf16 would change the text it was checked with), else `bf16` where the device runs bf16 matrix products
    natively (`mtpc.hardware.native_bf16`) and `fp32` elsewhere; any other name as it is."""
    from ..hardware import native_bf16

    if name != "auto":
        return name
    if stored == "fp32":
        return "fp32"
    return "bf16" if native_bf16(str(device)) else "fp32"


def stored_dtype(path: str | Path, config: dict) -> str | None:
    """The float dtype a model's checkpoint holds its weights in, by its `config` (`model_config`): `fp32`,
    `bf16`, `fp16`, or None when it names none or the model is a GGUF file (quantized weights: mtpc dequantizes
    them to the dtype it decodes in)."""
    from .gguf_files import is_gguf

    if is_gguf(path):
        return None
    named = config.get("dtype") or config.get("torch_dtype")
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(named) if isinstance(named, str) else None


def resolve_device(name: str):
    """The device called `name`; "auto" is CUDA when available, else the CPU. An unknown name, or a
    CUDA device this machine does not have, is an `InputError`."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise InputError(f"--device {name!r} is not a device name (auto, cpu, cuda, cuda:1, mps, ...)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"--device {name}: this machine has no CUDA device (use cpu or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputError(f"--device {name}: there are only {torch.cuda.device_count()} CUDA devices")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"--device {name}: MPS is not available here (use cpu or auto)")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise InputError(f"--device {name}: mtpc runs on cpu, cuda or mps")
    return device
