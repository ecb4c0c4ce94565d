"""The exceptions mtpc raises for user mistakes and failed runs.

The command line prints either one as a single `mtpc: error: <message>` line (no traceback unless
`--debug`): an `InputError` (bad flag, missing or damaged file, unsupported model) exits with status 2,
any other `MtpcError` (a run that failed, e.g. a non-finite loss) with status 1. Both derive from
`ValueError`/`RuntimeError` so Python callers can keep catching the built-in kinds.
"""

from __future__ import annotations


class MtpcError(RuntimeError):
    """A run that could not finish; the message says why and what is kept (exit status 1)."""

    exit_status = 1


class InputError(MtpcError, ValueError):
    """Bad user input: a flag, a file, a model or head folder; detected before slow work (exit status 2)."""

    exit_status = 2


class MissingFolderError(InputError):
    """A model, head or LoRA adapter folder that is not there. mtpc reads local folders only (it never
    downloads from the Hugging Face Hub), so the message names the path, and for a name shaped like a
    Hub id (`org/name`) says that it was not looked up there."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its class name when it has none), for one-line errors."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
