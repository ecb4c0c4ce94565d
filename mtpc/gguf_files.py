"""GGUF model files (llama.cpp's format): checked before anything parses them, dequantized once by
transformers' own GGUF loader, and kept as a checkpoint folder in mtpc's cache, named by the file's
content, so that every later run reads that folder instead.

    model_folder_for("SmolLM2-135M-Instruct.Q4_1.gguf")  # -> ~/.cache/mtpc/gguf/<sha256>/

A GGUF is outside input. `check_gguf` reads it with bounded work: the fixed header first (magic,
version, counts under caps), then the `gguf` package's reader, which maps the file and parses values
only (nothing in it is executed), then every tensor's data checked to lie inside the file (a truncated
copy is refused) and the architecture and tokenizer checked to be ones transformers can build. Errors
are one `InputError` naming the file; nothing from the file is echoed but short identifiers.

The `gguf` package is an optional extra (`pip install "circuitc[gguf]"`); without it a GGUF path is
one clear error.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError, first_line
from .files import file_sha256, regular_file

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
MAX_GGUF_BYTES = 2**40  # 1 TiB
MAX_GGUF_TENSORS = 1 << 16
MAX_GGUF_KEYS = 1 << 16
CACHE_ENV = "MTPC_CACHE_DIR"  # where converted models are kept (default: $XDG_CACHE_HOME/mtpc or ~/.cache/mtpc)
DONE_FILE = "mtpc_gguf.json"  # written last into a converted folder: the folder is whole
INSTALL_HINT = 'pip install "circuitc[gguf]" (or pip install gguf)'

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GGUFSummary:
    """What `check_gguf` read: the architecture, the tokenizer model and the counts."""

    architecture: str
    tokenizer: str
    tensors: int
    size: int


def is_gguf(path: str | Path) -> bool:
    """A path that names a GGUF file: a file ending in `.gguf`, or any file starting with GGUF's magic."""
    path = Path(path)
    if not path.is_file():
        return False
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def cache_root() -> Path:
    """mtpc's cache folder: `$MTPC_CACHE_DIR`, else `$XDG_CACHE_HOME/mtpc`, else `~/.cache/mtpc`."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mtpc"


def require_gguf_package() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise InputError(f"reading a GGUF model file needs the gguf package: {INSTALL_HINT}")


def check_gguf(file: str | Path) -> GGUFSummary:
    """The GGUF file checked as described in the module's docstring; an `InputError` otherwise."""
    file = regular_file(Path(file), "GGUF model file", max_bytes=MAX_GGUF_BYTES)
    size = file.stat().st_size
    _check_header(file, size)
    require_gguf_package()
    import gguf

    try:
        reader = gguf.GGUFReader(str(file), "r")
    except Exception as e:  # noqa: BLE001 -- the reader reports a damaged file in many classes
        raise InputError(f"{file} is damaged or truncated (not a readable GGUF file: {type(e).__name__})") from None
    for tensor in reader.tensors:
        if tensor.data_offset + int(tensor.n_bytes) > size:
            raise InputError(f"{file} is truncated: tensor data ends past the end of the file ({size:,} bytes)")
    architecture = _string_field(reader, "general.architecture", file)
    tokenizer = _string_field(reader, "tokenizer.ggml.model", file)
    _check_supported(architecture, file)
    return GGUFSummary(architecture, tokenizer, len(reader.tensors), size)


def _check_header(file: Path, size: int) -> None:
    """Magic, version and the tensor and key counts, from the fixed 24-byte header."""
    with open(file, "rb") as f:
        head = f.read(24)
    if head[:4] != GGUF_MAGIC:
        raise InputError(f"{file} is not a GGUF file (it does not start with GGUF's magic bytes)")
    if len(head) < 24:
        raise InputError(f"{file} is truncated: {size} bytes, shorter than a GGUF header")
    version = int.from_bytes(head[4:8], "little")
    tensors, keys = int.from_bytes(head[8:16], "little"), int.from_bytes(head[16:24], "little")
    if version not in GGUF_VERSIONS:
        raise InputError(f"{file}: GGUF version {version} is not one transformers reads "
                         f"({', '.join(map(str, GGUF_VERSIONS))})")
    if tensors > MAX_GGUF_TENSORS or keys > MAX_GGUF_KEYS:
        raise InputError(f"{file} is damaged: its header claims {tensors:,} tensors and {keys:,} metadata keys "
                         f"(at most {MAX_GGUF_TENSORS:,} each)")


def _string_field(reader, key: str, file: Path) -> str:
    """A short identifier-like string value of the GGUF metadata (never a long or odd one echoed)."""
    field = reader.fields.get(key)
    value = None
    if field is not None:
        try:  # gguf >= 0.11 decodes a value itself; before, a string is the bytes of its last part
            value = field.contents() if hasattr(field, "contents") else bytes(field.parts[field.data[0]]).decode()
        except Exception:  # noqa: BLE001 -- a damaged field
            value = None
    if not isinstance(value, str) or not value:
        raise InputError(f"{file}: no {key} in its metadata (not a language model GGUF that transformers reads)")
    if len(value) > 40 or not value.replace("-", "_").replace(".", "_").isidentifier():
        raise InputError(f"{file}: its {key} is not a name transformers knows")
    return value


def _check_supported(architecture: str, file: Path) -> None:
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    if architecture not in GGUF_CONFIG_MAPPING or architecture in ("general", "tokenizer"):
        raise InputError(f"{file}: architecture {architecture!r} is not one transformers' GGUF loader builds "
                         f"(it builds: {', '.join(sorted(k for k in GGUF_CONFIG_MAPPING if k not in ('general', 'tokenizer')))})")


def content_digest(file: Path) -> str:
    """The SHA-256 of the file's bytes, remembered per (path, size, modification time) in the cache, so a
    large file is read once."""
    stat = file.stat()
    memo_key = hashlib.sha256(f"{file.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:32]
    memo = cache_root() / "gguf" / "digests" / memo_key
    if memo.is_file() and memo.stat().st_size == 64:
        return memo.read_text()
    value = file_sha256(file)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        memo.write_text(value)
    except OSError:
        pass  # a read-only cache only costs the hash next time
    return value


def model_folder_for(file: str | Path) -> Path:
    """The checkpoint folder of a GGUF model: made once (checked, dequantized to float32 by transformers,
    saved with its tokenizer and chat template), then found by the file's content digest."""
    file = regular_file(Path(file), "GGUF model file", max_bytes=MAX_GGUF_BYTES)
    folder = cache_root() / "gguf" / content_digest(file)[:32]
    if (folder / DONE_FILE).is_file():
        return folder  # these bytes were checked and converted before (the check costs seconds on a large file)
    summary = check_gguf(file)
    log.warning("mtpc: dequantizing %s once into %s (later runs read that folder)", file.name, folder)
    _convert(file, folder, summary)
    return folder


def _convert(file: Path, folder: Path, summary: GGUFSummary) -> None:
    """transformers' loader into a temporary folder beside `folder`, renamed into place when whole (two
    runs converting at once both finish; the first rename wins)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    temporary = folder.with_name(f"{folder.name}.part-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        temporary.mkdir(parents=True)
        try:
            model = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
        except Exception as e:  # noqa: BLE001 -- transformers reports a model it cannot build in many classes
            raise InputError(f"{file}: transformers cannot build a model from it: {type(e).__name__}: "
                             f"{first_line(e)[:200]}") from None
        # a dequantized model is a plain checkpoint: its config must not claim a GGUF quantization any more
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.save_pretrained(str(temporary), safe_serialization=True)
        tokenizer.save_pretrained(str(temporary))
        done = {"source": file.name, "sha256": content_digest(file), "bytes": summary.size,
                "architecture": summary.architecture, "tokenizer": summary.tokenizer}
        (temporary / DONE_FILE).write_text(json.dumps(done, indent=1) + "\n")
        if folder.exists() and not (folder / DONE_FILE).is_file():
            shutil.rmtree(folder, ignore_errors=True)  # a folder left half-made by hand or by an old version
        try:
            temporary.rename(folder)
        except OSError:
            if not (folder / DONE_FILE).is_file():
                raise
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
