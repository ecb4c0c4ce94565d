"""A GGUF model file written out as a checkpoint folder that vLLM and transformers load (`mtpc export-hf`).

    export_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2", dtype="bf16")  # -> ExportSummary

vLLM (0.32) reads no GGUF. The file goes through `mtpc.lm.gguf_files.model_folder_for`, the path every
`--model x.gguf` takes: the bounded walk and its refusals first, then transformers' dequantisation to
float32, kept in mtpc's cache. That folder is loaded again at the asked dtype and saved with its
tokenizer (and chat template) and generation config, so the folder written holds exactly the weights mtpc
decodes with (fp32), or those rounded once (bf16).

The output is written into a hidden temporary folder beside OUT and renamed into place when whole, so a
killed export never leaves a half folder under OUT's name. An existing OUT is refused unless it is
empty, or `force` is given and it is a model folder (it holds `config.json`): `force` never deletes a
folder that is not a checkpoint (a home folder, a project), nor one holding the GGUF file itself.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, first_line
from ..files import regular_file
from .gguf_files import MAX_GGUF_BYTES, check_gguf, content_digest, is_gguf, model_folder_for, process_alive

EXPORT_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # what vLLM's CPU and GPU backends both run
RECORD_FILE = "mtpc_export.json"  # which GGUF bytes the folder was written from, and at which dtype
PART = re.compile(r"\.(.+)\.part-(\d{1,10})")  # an export's temporary folder: .<out name>.part-<pid>


@dataclass(frozen=True)
class ExportSummary:
    """What `export_gguf` wrote: the folder, its architecture and size, and how long it took."""

    folder: Path
    architecture: str  # transformers' class name (config.json's "architectures"), e.g. LlamaForCausalLM
    parameters: int
    dtype: str
    bytes: int
    seconds: float


def export_gguf(file: str | Path, out: str | Path, dtype: str = "fp32", force: bool = False) -> ExportSummary:
    """The GGUF `file` written as a checkpoint folder `out` at `dtype` ("fp32" or "bf16"), as the module
    docstring says; an `InputError` (a `ValueError`) names what is wrong before any weight is read."""
    start = time.perf_counter()
    if dtype not in EXPORT_DTYPES:
        raise InputError(f"dtype {dtype!r} is not one of {', '.join(EXPORT_DTYPES)} (what vLLM loads)")
    file = gguf_file(file)
    out = Path(out)
    check_output(out, file, force)
    source = model_folder_for(file)  # the walk, the refusals and the float32 conversion every --model x.gguf gets
    sweep_stale_parts(out)
    temporary = out.parent / f".{out.name}.part-{os.getpid()}"
    try:
        write_folder(source, temporary, dtype)
        record = {"source": file.name, "sha256": content_digest(file), "dtype": dtype}
        (temporary / RECORD_FILE).write_text(json.dumps(record, indent=1) + "\n")
        config = json.loads((temporary / "config.json").read_text())
        parameters = parameter_count(temporary)
        size = sum(f.stat().st_size for f in temporary.iterdir())
        move_into_place(temporary, out)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return ExportSummary(out, (config.get("architectures") or ["?"])[0], parameters, dtype, size,
                         time.perf_counter() - start)


def gguf_file(file: str | Path) -> Path:
    """`file` if it is a GGUF file mtpc reads (a regular file, its magic or suffix GGUF's, its walk
    passing `check_gguf`); a checkpoint folder is refused: it is already what vLLM loads."""
    path = Path(file)
    if path.is_dir():
        raise InputError(f"{file} is a folder; export-hf writes a folder from a GGUF file (a checkpoint folder is "
                         "already what vLLM and transformers load)")
    regular_file(path, "GGUF model file", max_bytes=MAX_GGUF_BYTES)
    if not is_gguf(path):
        raise InputError(f"{file} is not a GGUF file (no .gguf suffix and no GGUF magic)")
    check_gguf(path)  # milliseconds: damaged, foreign and unsupported files are refused before the output is touched
    return path.resolve()


def check_output(out: Path, file: Path, force: bool) -> None:
    """OUT may be new, an empty folder, or with `force` a model folder that does not hold `file`."""
    if out.is_symlink():
        raise InputError(f"--out {out} is a symlink; name the folder itself")
    if not out.exists():
        if out.parent.exists() and not out.parent.is_dir():
            raise InputError(f"--out {out}: {out.parent} is not a folder")
        return
    if not out.is_dir():
        raise InputError(f"--out {out} exists and is not a folder")
    if not any(out.iterdir()):
        return
    if not force:
        raise InputError(f"--out {out} already holds files; give --force to replace it, or name a new folder")
    if not (out / "config.json").is_file():
        raise InputError(f"--out {out} holds files but is no model folder (no config.json); --force replaces only a "
                         "model folder, so remove it yourself or name a new folder")
    if out.resolve() in file.parents:
        raise InputError(f"--out {out} holds the GGUF file {file.name} itself; name another folder")


def write_folder(source: Path, folder: Path, dtype: str) -> None:
    """The converted checkpoint `source` loaded at `dtype` and saved into the new `folder` with its
    tokenizer files, chat template and generation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.mkdir()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=getattr(torch, EXPORT_DTYPES[dtype]))
        tokenizer = AutoTokenizer.from_pretrained(str(source))
    except Exception as e:  # noqa: BLE001 -- transformers reports a folder it cannot load in many classes
        raise InputError(f"transformers cannot load the converted folder {source}: {type(e).__name__}: "
                         f"{first_line(e)[:200]}") from None
    # a plain checkpoint: no quantizer and no GGUF quantization claim (vLLM would look for a GGUF loader)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    mode = file_mode()
    for entry in folder.iterdir():  # transformers writes the weights 0o600; a served folder is read as any file
        entry.chmod(mode)


def file_mode() -> int:
    """The mode a new file gets under this process's umask (0o644 under the usual 022)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def parameter_count(folder: Path) -> int:
    """The number of weights in the folder's safetensors files (read from their headers)."""
    from safetensors import safe_open

    total = 0
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                count = 1
                for n in f.get_slice(name).get_shape():
                    count *= n
                total += count
    return total


def move_into_place(temporary: Path, out: Path) -> None:
    """`temporary` renamed to `out`; a model folder already there (checked by `check_output`) is set
    aside first and removed once the new one is in place, or put back if the rename fails."""
    if out.is_dir() and any(out.iterdir()):
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(old)
        try:
            temporary.rename(out)
        except OSError:
            old.rename(out)
            raise
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        temporary.rename(out)  # over a missing or empty folder
    except OSError as e:
        raise InputError(f"--out {out} could not be written ({e.strerror or e}); did another export write it "
                         "meanwhile?") from None


def sweep_stale_parts(out: Path) -> None:
    """Remove the temporary folders that killed exports to `out` left beside it (their process is gone)."""
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return
    for entry in entries:
        match = PART.fullmatch(entry.name)
        if match and match.group(1) == out.name and not entry.is_symlink() and not process_alive(int(match.group(2))):
            shutil.rmtree(entry, ignore_errors=True)
