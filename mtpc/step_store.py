"""The compiled-step store: the folder where compiled decoding steps (and the verify costs measured on this
machine) are kept between processes, and the rules under which a file from it may be read.

Loading a stored step unpickles it, so it runs whatever the file says: a store is used only when no one
but this user (or root) could have put or changed anything on the way to it (`check_store`: every folder
of its real path), and a file is read through one descriptor opened without following a link and
checked on that descriptor (`read_stored_step`), so nothing can be swapped between the check and the
read. Torch is imported only to find inductor's cache folder.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Collection

__all__ = ["MAX_STEP_BYTES", "UntrustedStore", "check_store", "read_stored_step", "step_store"]

MAX_STEP_BYTES = 256 * 2**20  # a stored step file (the byte LM's are 1.7 MB): more is refused unread


def step_store() -> Path:
    """Where precompiled steps are kept: `mtpc-steps` in inductor's cache folder (`TORCHINDUCTOR_CACHE_DIR`,
    by default a folder of the system's temporary directory), so clearing one clears both."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / "mtpc-steps"


class UntrustedStore(Exception):
    """A step store, or a step file in it, that someone other than this user (or root) could have written:
    never unpickled. The message names the path and why, never the file's content."""


def check_store(folder: Path, owners: Collection[int] | None = None) -> Path:
    """The real path of `folder`, to open files below it by; `UntrustedStore` unless every folder of that
    path, from the root down, is owned by one of `owners` (default: this user and root) and writable by no
    one else (`_others_can_write`) unless sticky (as /tmp: there no one renames or removes what they do not
    own, and the next folder down is judged by its own owner). Links are resolved first, so a folder reached
    through one (macOS's /tmp, a linked home or `TORCHINDUCTOR_CACHE_DIR`) is judged where it is; open files
    through the path returned, never through the links again. Folders not made yet pass: this process makes
    them its own."""
    real = Path(os.path.realpath(folder))
    trusted = _trusted_owners(owners)
    for part in reversed((real, *real.parents)):  # the root first
        try:
            status = os.lstat(part)
        except FileNotFoundError:
            break
        except OSError as e:
            raise UntrustedStore(f"{part} cannot be examined ({e.strerror})") from None
        problem = _folder_problem(status, trusted)
        if problem is not None:
            raise UntrustedStore(f"{part} {problem}")
    return real


def read_stored_step(path: Path, user: int | None = None) -> bytes | None:
    """The bytes of the step file at `path` (None: there is none), read through one descriptor opened
    without following a link (`O_NONBLOCK`: nor hanging on a FIFO) and checked on that descriptor: a
    regular file of `user` (default: this user) that no one else can write, else `UntrustedStore`. Its
    folder is `check_store`'s to judge, and `path` a file of the real path it returned."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as e:  # ELOOP (EMLINK on some BSDs): the file is a link
        why = "is a symbolic link" if e.errno in (errno.ELOOP, errno.EMLINK) else f"cannot be opened ({e.strerror})"
        raise UntrustedStore(f"{path} {why}") from None
    try:  # judged on the bare descriptor: a file object cannot even be made of a folder's (IsADirectoryError)
        status = os.fstat(fd)
        problem = _file_problem(status, os.getuid() if user is None else user)
        if problem is not None:
            raise UntrustedStore(f"{path} {problem}")
        if status.st_size > MAX_STEP_BYTES:  # a step is a few MB; reading a planted sparse giant would fill memory
            raise UntrustedStore(f"{path} is {status.st_size:,} bytes, more than the {MAX_STEP_BYTES:,} of a step")
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read(MAX_STEP_BYTES + 1)
    finally:
        os.close(fd)


def _trusted_owners(owners: Collection[int] | None) -> frozenset[int]:
    """The uids a folder of a store may belong to: `owners`, by default this user and root."""
    return frozenset((os.getuid(), 0) if owners is None else owners)


def _folder_problem(status: os.stat_result, owners: frozenset[int]) -> str | None:
    """Why a folder of a store's real path could hold someone else's file, or None."""
    if stat.S_ISLNK(status.st_mode):  # resolved away, so put there since: someone is racing us
        return "is a symbolic link"
    if not stat.S_ISDIR(status.st_mode):
        return "is not a folder"
    if status.st_uid not in owners:
        return f"belongs to another user (uid {status.st_uid})"
    if _others_can_write(status) and not status.st_mode & stat.S_ISVTX:
        return "is writable by other users"
    return None


def _file_problem(status: os.stat_result, user: int) -> str | None:
    """Why an open step file could hold someone else's bytes, or None."""
    if not stat.S_ISREG(status.st_mode):
        return "is not a regular file"
    if status.st_uid != user:
        return f"belongs to another user (uid {status.st_uid})"
    if _others_can_write(status):
        return "is writable by other users"
    return None


def _others_can_write(status: os.stat_result) -> bool:
    """Whether anyone but the owner may write: everyone, or a group that is not the owner's own."""
    if status.st_mode & 0o002:
        return True
    return bool(status.st_mode & 0o020) and not _own_group(status.st_gid, status.st_uid)


def _own_group(gid: int, uid: int) -> bool:
    """Whether group `gid` is user `uid`'s private group (named as the user, no other member): the scheme
    behind a umask of 002 (Debian's and Ubuntu's default for users), whose group-writable folders, inductor's
    cache among them, let no one else in."""
    import grp
    import pwd

    try:
        group, user = grp.getgrgid(gid), pwd.getpwuid(uid)
    except KeyError:  # a group or user without a name: nothing says it is private
        return False
    return group.gr_name == user.pw_name and user.pw_gid == gid and set(group.gr_mem) <= {user.pw_name}
