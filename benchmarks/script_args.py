"""What the benchmark scripts' command lines share, so that a mistake ends as `mtpc`'s own do: one line
`<script>: error: <message>` and status 2, before any model loads (never a traceback, a NaN record or an
empty table).

- `ScriptParser`: argparse, its mistakes reported as that one line;
- argparse types: `torch_threads`, and for paths `existing_file`, `existing_folder`, `output_file` and
  `output_folder`; the numeric ones are `mtpc.checks`' (`positive_int`, `non_negative_int`, `seed`, ...),
  the rules `mtpc`'s own flags follow;
- `run_main(main)`: a script's `main`, with an `mtpc.errors.MtpcError` (mtpc's own refusals: a missing model
  folder, a damaged store; or the script's `InputError`, of what it found) reported as one such line too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mtpc.checks import MAX_THREADS, int_in, output_folder as checked_output_folder
from mtpc.errors import InputError, MtpcError, first_line

torch_threads = int_in(1, MAX_THREADS)  # --threads: torch threads, as mtpc's own --threads (4 per CPU core)


class ScriptParser(argparse.ArgumentParser):
    """argparse, with a mistake reported as one line (no usage block) and status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def run_main(main):
    """`main()` and what it returns, or its `MtpcError` as one error line and mtpc's status (2: bad input, 1: a
    failed run)."""
    try:
        return main()
    except MtpcError as e:
        print(f"{Path(sys.argv[0]).name}: error: {first_line(e)}", file=sys.stderr)
        raise SystemExit(e.exit_status) from None


def existing_file(text: str) -> str:
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a file")
    return text


def existing_folder(text: str) -> str:
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such folder: {text}")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a folder")
    return text


def output_file(text: str) -> str:
    """A file to write: not a folder, and below no file (its missing folders are made when it is written)."""
    if not text or Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text or repr(text)} is a folder; give a file's name")
    _folder_can_be(Path(text).parent)
    return text


def output_folder(text: str) -> str:
    """A folder to write into: one that exists or can be made (not a file, not below one)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty folder name")
    _folder_can_be(Path(text))
    return text


def _folder_can_be(folder: Path) -> None:
    try:
        checked_output_folder(folder, "")
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e).strip()) from None
