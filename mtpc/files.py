"""Files mtpc reads and writes, treated as hostile until checked (ground floor: imports only `errors`).

- `regular_file(path, what)`: a path that is a regular file below a size cap, checked with `stat`
  (never opened): a FIFO would block the reader forever, `/dev/zero` or a sparse 6 GiB file would
  fill the memory.
- `read_json(path, what)`: every JSON file mtpc opens (config.json, tokenizer files, head.json,
  train_config.json, adapter_config.json, a distill `.meta.json`) goes through it: a regular file,
  at most `MAX_JSON_BYTES`, nested at most `MAX_JSON_DEPTH` deep, no integer longer than
  `MAX_JSON_INT_DIGITS` digits (refused while parsing), holding an object. Every failure
  is one `InputError` naming the file; messages never quote the file's content (a symlink planted in
  a folder could point at a credentials file).
- `inside(path, folder)`: a file of a model or head folder must not be a symlink out of the folder
  (the Hugging Face cache layout, `snapshots/REV/x -> ../../blobs/...`, is allowed).
- `atomic_write(path, data)`: temporary file beside the target, fsync, rename; on any failure (a full
  disk) the temporary file is removed and the old target stays whole.
- `OutputLock(folder)`: an exclusive `fcntl.flock` on `folder/.mtpc.lock`, so two runs cannot write
  one output at once.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from .errors import InputError

MAX_JSON_BYTES = 64 * 2**20  # a tokenizer.json of a 256k vocabulary is ~20 MB
MAX_JSON_DEPTH = 64  # config and head files nest a few levels; a graph spec inline in head.json ~6
# Integer literals longer than this are refused before int() runs (Python refuses 4,300+ digits with a bare
# ValueError, and converting thousands is slow); a 256-bit circuit binding (circuitc's int_bits, 78 digits)
# saved in train_config.json fits, as circuitc's command line allows 100 digits.
MAX_JSON_INT_DIGITS = 100
# Values a JSON file may hold, counted before parsing (bytes.count: milliseconds for 64 MB): a 63 MB file of
# 21M empty objects took 22 s and 3 GB to read. A 256k-token tokenizer.json holds about 1M values.
MAX_JSON_CONTAINERS = 1 << 20  # objects and lists ("{" and "[", counted inside strings too: an upper bound)
MAX_JSON_SEPARATORS = 1 << 22  # "," (values in lists and objects): a file at both caps reads in about 2 s
LOCK_FILE = ".mtpc.lock"


def describe(value) -> str:
    """A value for an error message without quoting text from the file: numbers as they are,
    anything else by its JSON type."""
    if value is None or isinstance(value, bool) or isinstance(value, (int, float)):
        return json.dumps(value) if not isinstance(value, int) or abs(value) < 10**30 else "a huge integer"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def regular_file(path: str | Path, what: str, max_bytes: int = MAX_JSON_BYTES) -> Path:
    """`path` if it is a regular file of at most `max_bytes` (stat only: nothing is opened)."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise InputError(f"{path} does not exist ({what})") from None
    except OSError as e:
        raise InputError(f"{path} cannot be read ({what}): {e.strerror or type(e).__name__}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = ("a folder" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "not a regular file")
        raise InputError(f"{path} is {kind}, not a regular file ({what})")
    if info.st_size > max_bytes:
        raise InputError(f"{path} is {info.st_size:,} bytes, more than the {max_bytes:,} mtpc reads ({what})")
    return path


def inside(path: str | Path, folder: str | Path) -> Path:
    """`path`, refused when it resolves outside `folder` (a symlink out of a model or head folder)."""
    path, folder = Path(path), Path(folder)
    target, root = path.resolve(), folder.resolve()
    if target == root or root in target.parents:
        return path
    if root.parent.name == "snapshots" and root.parent.parent / "blobs" in target.parents:
        return path  # the Hugging Face hub cache: snapshots/REV/file -> ../../blobs/HASH
    raise InputError(f"{path} is a symlink to a file outside {folder}; mtpc reads only files inside the folder "
                     "(copy the file in if it is meant to be there)")


def json_depth(data) -> int:
    """How deeply `data` nests lists and objects (iterative: a deep value cannot overflow the stack)."""
    deepest, stack = 0, [(data, 1)] if isinstance(data, (list, dict)) else []
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        children = value.values() if isinstance(value, dict) else value
        stack.extend((v, depth + 1) for v in children if type(v) in (list, dict))  # scalars: no tuple each
    return deepest


class _HugeInteger(Exception):
    """Raised by `_bounded_int` out of the JSON parser: an integer literal of `digits` digits."""

    def __init__(self, digits: int):
        super().__init__(digits)
        self.digits = digits


def _bounded_int(literal: str) -> int:
    """`json.loads`' `parse_int`: the literal converted only when it has at most `MAX_JSON_INT_DIGITS` digits."""
    digits = len(literal) - literal.startswith("-")
    if digits > MAX_JSON_INT_DIGITS:
        raise _HugeInteger(digits)
    return int(literal)


# a JSON string (skipped whole: digits inside it are text) or an integer literal too long to read
_STRING_OR_HUGE_INTEGER = re.compile(r'"(?:[^"\\]|\\.)*"|(?<![\d.eE+-])-?\d{%d,}(?![\d.eE])'
                                     % (MAX_JSON_INT_DIGITS + 1))


def _huge_integer_position(text: str | bytes) -> str:
    """" at line L column C" of the first too-long integer literal (its key is the file's own text, never
    quoted), or "" when it cannot be placed."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    for match in _STRING_OR_HUGE_INTEGER.finditer(text):
        if not match.group().startswith('"'):
            start = match.start()
            line, column = text.count("\n", 0, start) + 1, start - text.rfind("\n", 0, start)
            return f" at line {line} column {column}"
    return ""


def _check_json_size(text: str | bytes, where: str) -> None:
    """Refuse, from counts of its bytes alone, a JSON text holding more values than any file mtpc reads."""
    brace, bracket, comma = ("{", "[", ",") if isinstance(text, str) else (b"{", b"[", b",")
    containers, separators = text.count(brace) + text.count(bracket), text.count(comma)
    if containers > MAX_JSON_CONTAINERS or separators > MAX_JSON_SEPARATORS:
        raise InputError(f"{where}: holds more than {MAX_JSON_CONTAINERS:,} objects and lists or "
                         f"{MAX_JSON_SEPARATORS:,} values; not a file mtpc writes or reads")


def parse_json(text: str | bytes, where: str, max_depth: int = MAX_JSON_DEPTH):
    """`json.loads(text)` with every failure as one `InputError` naming `where` and the position; an
    integer of more than `MAX_JSON_INT_DIGITS` digits is refused while parsing, a text of more than
    `MAX_JSON_CONTAINERS` objects and lists or `MAX_JSON_SEPARATORS` values before it (bounded work)."""
    _check_json_size(text, where)
    try:
        data = json.loads(text, parse_int=_bounded_int)
    except _HugeInteger as e:
        raise InputError(f"{where}: an integer of {e.digits:,} digits{_huge_integer_position(text)}; mtpc reads "
                         f"integers of at most {MAX_JSON_INT_DIGITS} digits") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError:
        raise InputError(f"{where}: not valid JSON (not UTF-8 text)") from None
    except RecursionError:
        raise InputError(f"{where}: JSON nested too deeply (more than {max_depth} levels)") from None
    if json_depth(data) > max_depth:
        raise InputError(f"{where}: JSON nested too deeply (more than {max_depth} levels)")
    return data


def read_json(path: str | Path, what: str, *, folder: str | Path | None = None, max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH) -> dict:
    """The JSON object in `path` (see the module docstring); `folder`: the file must lie inside it."""
    path = regular_file(path, what, max_bytes)
    if folder is not None:
        inside(path, folder)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise InputError(f"{path} cannot be read ({what}): {e.strerror or type(e).__name__}") from None
    data = parse_json(raw, str(path), max_depth)
    if not isinstance(data, dict):
        raise InputError(f"{path} must hold a JSON object, it holds {describe(data)} ({what})")
    return data


def field(data: dict, key: str, path: str | Path, kind: str, *, default=..., low: int | float | None = None,
          high: int | float | None = None):
    """`data[key]` checked as `kind` ("int", "number", "str", "bool", "object", "list") and bounds;
    the error names the file and the key, and never quotes a string from the file."""
    if key not in data:
        if default is not ...:
            return default
        raise InputError(f"{path}: {key} is missing")
    value = data[key]
    types = {"int": int, "number": (int, float), "str": str, "bool": bool, "object": dict, "list": list}[kind]
    if not isinstance(value, types) or (kind in ("int", "number") and isinstance(value, bool)):
        raise InputError(f"{path}: {key} must be {'an integer' if kind == 'int' else 'a ' + kind}, got {describe(value)}")
    if kind in ("int", "number"):
        if value != value or (low is not None and value < low) or (high is not None and value > high):
            bounds = f">= {low}" if high is None else f"in {low}..{high:,}" if low is not None else f"<= {high:,}"
            raise InputError(f"{path}: {key} must be {bounds}, got {describe(value)}")
    return value


def read_text(path: str | Path, what: str, max_bytes: int, *, folder: str | Path | None = None) -> str:
    """A small UTF-8 text file (a chat template), checked like `read_json`'s files."""
    path = regular_file(path, what, max_bytes)
    if folder is not None:
        inside(path, folder)
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text ({what})") from None
    except OSError as e:
        raise InputError(f"{path} cannot be read ({what}): {e.strerror or type(e).__name__}") from None


def glob_paths(pattern: str | Path) -> list[Path]:
    """The paths `pattern` matches, without following symlinked folders (`**` over a symlink loop
    would otherwise grow without end): pathlib's glob from the part before the first wildcard;
    a trailing `**` means everything below, as in `glob.glob(..., recursive=True)`."""
    parts = Path(pattern).expanduser().parts
    first = next((i for i, part in enumerate(parts) if any(ch in part for ch in "*?[")), None)
    if first is None:
        return [Path(pattern)] if Path(pattern).exists() else []
    anchor, rest = Path(*parts[:first]) if first else Path("."), list(parts[first:])
    if rest[-1] == "**":
        rest.append("*")
    return sorted(anchor.glob(str(Path(*rest))))


# ------------------------------------------------------------------ writing

def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, read 4 MiB at a time (bounded memory whatever its size)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write(path: str | Path, data: bytes | str) -> Path:
    """Replace `path` by `data` all at once: a temporary file beside it, fsync, rename. A failure (a
    full disk) removes the temporary file and leaves the old `path` as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


class OutputLock:
    """`with OutputLock(folder, what):` holds an exclusive lock on `folder/.mtpc.lock` (created), or
    raises `InputError` at once when another process holds it. The lock goes with the process, so a
    killed run never leaves a stale lock behind."""

    def __init__(self, folder: str | Path, what: str, name: str = LOCK_FILE):
        self.path = Path(folder) / name
        self.what = what
        self._fd: int | None = None

    def __enter__(self) -> "OutputLock":
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InputError(f"{self.what} is in use by another mtpc run (it holds {self.path}); wait for it to "
                             "finish or choose another output") from None
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None
