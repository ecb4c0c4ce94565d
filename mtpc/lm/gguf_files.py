"""GGUF model files (llama.cpp's format): checked before anything parses them, dequantized once by
transformers' own GGUF loader, and kept as a checkpoint folder in mtpc's cache, named by the file's
content, so that every later run reads that folder instead.

    model_folder_for("SmolLM2-135M-Instruct.Q4_1.gguf")  # -> ~/.cache/mtpc/gguf/<sha256>/

A GGUF is outside input. `check_gguf` walks it with bounded work (`mtpc.lm.gguf_format`: every count,
length and offset checked against the bytes there, the model's sizes against its tensors) before
transformers' loader, which believes what the file claims, sees it; the loader gets the file's absolute
path (given a bare name it looks in the working folder first).

The converted folder is trusted only with proof: it is a real folder (not a symlink) owned by this user
and writable by no one else, its files likewise, and its record (`mtpc_gguf.json`, written last) names
the SHA-256 of the file's bytes. A folder owned by someone else is refused; one of ours whose record
names other bytes is converted afresh. The digest itself is remembered per file identity: path, size,
modification and change times, device and inode (`touch` can restore an mtime, never a ctime or an
inode). Conversions killed midway leave `<digest>.part-<pid>` folders; the next conversion sweeps those
whose process is gone. Errors are one `InputError` naming the file; nothing from the file is echoed but
short identifiers.

The `gguf` package is an optional extra (`pip install "circuitc[gguf]"`); without it a GGUF path is
one clear error.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, first_line
from ..files import file_sha256, read_json, regular_file
from .gguf_format import GGUF_MAGIC, read_gguf_layout

MAX_GGUF_BYTES = 2**40  # 1 TiB
CACHE_ENV = "MTPC_CACHE_DIR"  # where converted models are kept (default: $XDG_CACHE_HOME/mtpc or ~/.cache/mtpc)
DONE_FILE = "mtpc_gguf.json"  # written last into a converted folder: the folder is whole
INSTALL_HINT = 'pip install "circuitc[gguf]" (or pip install gguf)'
PART = re.compile(r"[0-9a-f]{32}\.part-(\d{1,10})")  # a conversion's temporary folder, by its process id

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
    require_gguf_package()  # the quantization types' block sizes are the gguf package's
    layout = read_gguf_layout(file)
    architecture = layout.string("general.architecture")  # one transformers builds (`gguf_format.check_architecture`)
    return GGUFSummary(architecture, layout.string("tokenizer.ggml.model"), len(layout.tensors), layout.size)


# ------------------------------------------------------------------ the cache and its trust rule

def owned_privately(path: Path) -> bool:
    """`path` itself (never a symlink's target) belongs to this user and no one else can write it."""
    try:
        info = path.lstat()
    except OSError:
        return False
    kind_ok = stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)
    return kind_ok and info.st_uid == os.getuid() and not info.st_mode & 0o022


def file_identity(file: Path) -> str:
    """What tells one file's bytes from another's without reading them: its path, size, modification and
    change times, device and inode (replacing a file changes its inode or ctime, which `touch` cannot
    restore)."""
    info = file.stat()
    return (f"{file.resolve()}\0{info.st_size}\0{info.st_mtime_ns}\0{info.st_ctime_ns}\0{info.st_dev}"
            f"\0{info.st_ino}")


def private_cache_folder(folder: Path) -> bool:
    """`folder` made if missing (0o700: ours alone, whatever the umask), and whether it is ours alone."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return False
    return owned_privately(folder)


def content_digest(file: Path) -> str:
    """The SHA-256 of the file's bytes, remembered per `file_identity` in the cache, so a large file is
    read once. A memo is believed only when it and the folders it sits in are ours alone (in a folder
    others can write, one memo could be renamed over another's name)."""
    memos = cache_root() / "gguf" / "digests"
    memo = memos / hashlib.sha256(file_identity(file).encode()).hexdigest()[:32]
    private = private_cache_folder(memos.parent) and private_cache_folder(memos)
    if private and owned_privately(memo) and memo.stat().st_size == 64:
        value = memo.read_text(errors="replace")
        if re.fullmatch(r"[0-9a-f]{64}", value):
            return value
    value = file_sha256(file)
    if private:
        try:
            memo.unlink(missing_ok=True)
            fd = os.open(memo, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(value)
        except OSError:
            pass  # a read-only cache only costs the hash next time
    return value


def converted_folder_state(folder: Path, digest: str) -> str:
    """"missing", "trusted" (whole, ours, private, its record naming `digest`), "stale" (ours, but half
    made or made from other bytes: convert afresh) or "foreign" (not ours alone: never read)."""
    if not folder.exists() and not folder.is_symlink():
        return "missing"
    if not owned_privately(folder) or not stat.S_ISDIR(folder.lstat().st_mode):
        return "foreign"
    if any(not owned_privately(entry) for entry in folder.iterdir()):
        return "foreign"
    record = folder / DONE_FILE
    if not record.is_file():
        return "stale"
    try:
        named = read_json(record, "a converted model's record", folder=folder).get("sha256")
    except InputError:
        return "stale"
    return "trusted" if named == digest else "stale"


def model_folder_for(file: str | Path) -> Path:
    """The checkpoint folder of a GGUF model: made once (checked, dequantized to float32 by transformers,
    saved with its tokenizer and chat template), then found by the file's content digest and used while
    the cache's trust rule (module docstring) holds."""
    file = regular_file(Path(file), "GGUF model file", max_bytes=MAX_GGUF_BYTES).resolve()
    summary = check_gguf(file)  # first: the walk costs milliseconds, the digest reads every byte
    digest = content_digest(file)
    folder = cache_root() / "gguf" / digest[:32]
    state = converted_folder_state(folder, digest)
    if state == "trusted":
        return folder  # these bytes were checked and converted before
    if state == "foreign":
        raise InputError(f"{folder} (the converted copy of {file.name}) is not a folder of yours alone (a symlink, "
                         f"not a folder, or owned by another user or writable by others, it or a file in it), so mtpc "
                         f"does not load a model from it; remove it, or set {CACHE_ENV} to a folder of your own")
    if state == "stale":
        log.warning("mtpc: %s holds no whole conversion of %s (its record names other bytes); converting afresh",
                    folder, file.name)
    log.warning("mtpc: dequantizing %s once into %s (later runs read that folder)", file.name, folder)
    sweep_stale_parts(folder.parent)
    _convert(file, folder, summary, digest)
    return folder


def _check_every_weight_read(file: Path, loading_info: dict) -> None:
    """Every weight of the built model came from the file: transformers initialises a weight the file lacks
    at random (a file of norms only would decode as a random model), and names it among the missing keys."""
    missing = sorted(loading_info.get("missing_keys") or ())
    if missing:
        shown = missing[0] if len(missing[0]) <= 80 else missing[0][:80] + "..."
        raise InputError(f"{file}: the model transformers builds from it has {len(missing):,} weights the file does "
                         f"not hold (such as {shown}); a GGUF must hold every weight of its model")


def sweep_stale_parts(gguf_cache: Path) -> None:
    """Remove the temporary folders of conversions whose process is gone (killed midway)."""
    try:
        entries = list(gguf_cache.iterdir())
    except OSError:
        return
    for entry in entries:
        match = PART.fullmatch(entry.name)
        if match and owned_privately(entry) and not process_alive(int(match.group(1))):
            shutil.rmtree(entry, ignore_errors=True)


def process_alive(pid: int) -> bool:
    """Whether process `pid` still runs (whose temporary folder must not be swept)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return pid < 2**22  # another user's live process (or a pid no system gives out: gone)
    return True


def _convert(file: Path, folder: Path, summary: GGUFSummary, digest: str) -> None:
    """transformers' loader into a temporary folder beside `folder`, renamed into place when whole (two
    runs converting at once both finish; the first rename wins). The loader gets absolute paths: given a
    bare file name it would read a file of that name in the working folder first."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    temporary = folder.with_name(f"{folder.name}.part-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        private_cache_folder(folder.parent)
        temporary.mkdir(mode=0o755)
        try:
            model, loading_info = AutoModelForCausalLM.from_pretrained(
                str(file.parent), gguf_file=str(file), dtype=torch.float32, output_loading_info=True)
            tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=str(file))
        except Exception as e:  # noqa: BLE001 -- transformers reports a model it cannot build in many classes
            raise InputError(f"{file}: transformers cannot build a model from it: {type(e).__name__}: "
                             f"{first_line(e)[:200]}") from None
        _check_every_weight_read(file, loading_info)
        # a dequantized model is a plain checkpoint: its config must not claim a GGUF quantization any more
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.save_pretrained(str(temporary), safe_serialization=True)
        tokenizer.save_pretrained(str(temporary))
        done = {"source": file.name, "sha256": digest, "bytes": summary.size,
                "architecture": summary.architecture, "tokenizer": summary.tokenizer}
        (temporary / DONE_FILE).write_text(json.dumps(done, indent=1) + "\n")
        for entry in [temporary, *temporary.iterdir()]:
            entry.chmod(entry.stat().st_mode & ~0o022)  # private, whatever the umask: the trust rule reads this
        if folder.exists() and converted_folder_state(folder, digest) != "trusted":
            shutil.rmtree(folder, ignore_errors=True)  # half made, by hand, or from other bytes: ours to replace
        try:
            temporary.rename(folder)
        except OSError:
            if converted_folder_state(folder, digest) != "trusted":
                raise
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
