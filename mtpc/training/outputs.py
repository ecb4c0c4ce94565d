"""What the trainers do around their output folder: one run at a time, and a full disk as one line.

`guarded_output(folder, what)` wraps a whole `mtpc train` / `mtpc tiny-lm` run:

- rank 0 holds `mtpc.files.OutputLock` on the folder, so a second run into the same `--out` is
  refused at once instead of sharing `checkpoint.pt.tmp` and interleaving `train_log.jsonl` (other
  ranks of a torchrun job write nothing and take no lock);
- a write that fails because the disk is full (or a file-size limit is hit) becomes an `MtpcError`
  saying that the last good checkpoint is kept; the checkpoint writers remove their temporary file
  themselves (`save_atomically`).
"""

from __future__ import annotations

import errno
import io
import os
from contextlib import contextmanager
from pathlib import Path

from ..errors import MtpcError
from ..files import LOCK_FILE, OutputLock, atomic_write

DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


@contextmanager
def guarded_output(folder: str | Path, what: str = "--out"):
    """Lock `folder` (rank 0) for the run and turn a full disk into one `MtpcError`."""
    folder = Path(folder)
    main = int(os.environ.get("RANK", "0")) == 0
    existed = folder.exists()
    try:
        if main:
            with OutputLock(folder, f"{what} {folder}"):
                yield
        else:
            yield
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        raise MtpcError(f"writing {e.filename or folder} failed: {e.strerror}; the disk is full. "
                        f"{folder / 'checkpoint.pt'} keeps the last good step, if one was saved (free space and "
                        "rerun the same command to resume)") from e
    finally:
        if main and not existed:
            _remove_if_only_the_lock(folder)


def _remove_if_only_the_lock(folder: Path) -> None:
    """A folder this run created and left empty (it failed before writing) is removed again."""
    if folder.is_dir() and {p.name for p in folder.iterdir()} <= {LOCK_FILE}:
        (folder / LOCK_FILE).unlink(missing_ok=True)
        folder.rmdir()


def save_atomically(save, path: Path) -> None:
    """`save(buffer)` into memory, then `files.atomic_write` (temporary file beside `path`, fsync,
    rename). Writing the bytes ourselves makes a full disk an `OSError` (torch.save's own writer reports
    it as a bare RuntimeError); on any failure `path` stays as it was and no temporary file is left."""
    buffer = io.BytesIO()
    save(buffer)
    atomic_write(path, buffer.getvalue())
