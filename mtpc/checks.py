"""Checks of user input, run before any slow work; each failure is one `InputError` naming the fix.

Three kinds live here:

- argparse `type=` functions for numeric flags (`positive_int`, `positive_float`, `probability`, ...):
  they refuse NaN, infinities and out-of-range values while the command line is parsed, and
  `parse_defines` for the `-D NAME=VALUE` bindings of a circuit's parameters;
- `check_sampling_settings`: every command's temperature, top-k, top-p and draft temperatures by
  `mtpc.sampling`'s rules, once, right after parsing;
- checks of paths the user names for output or data (`output_folder`, `data_source`) and of how
  loaded things fit together (`states_fit_vocabulary`, `hidden_sizes_match`).

Reading model, head and LoRA folders is `mtpc.lm.loading`'s job. This module imports nothing heavy, so
the command line can import it while staying quick to start.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from .errors import InputError
from .files import glob_paths
from .sampling import check_draft_temperature, check_temperature, check_top_k, check_top_p

MAX_THREADS = 4 * (os.cpu_count() or 1)  # torch threads a command may ask for (4 per core)
# What a model's sizes may be before anything is built (a 1 KB config.json or GGUF header must not ask for
# 16 TB): a checkpoint folder's (`loading.model_config`), a GGUF file's (`gguf_format`), a decoder's context
MAX_LAYERS = 1024
MAX_CONTEXT = 2**22  # max_position_embeddings: 4M positions
MAX_HIDDEN = 2**16
MAX_INT_CHARACTERS = 100  # an integer flag's text, as circuitc's command line bounds its numbers
MAX_LOOKUP_TOKENS = 1024  # tokens one prompt-lookup match may propose: every --lookup, --lookup-tokens and peer K
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp64": "float64"}  # a --dtype name -> its torch dtype's name
ROUNDING_DTYPES = ("bf16",)  # --dtype names whose matmuls round differently with the number of rows
ROUNDING_NOTE = ("in bf16 a verify call over several positions rounds its sums differently from a one-position "
                 "step, so a near-tie can go the other way; check exactness with --dtype fp32")
HELP_DECODING_DTYPE = ("auto: fp32 for a checkpoint stored in float32; else bf16 where the device runs bf16 matrix "
                       "products natively (CUDA, a CPU with AVX-512 BF16 or AMX) and fp32 elsewhere (a bf16 verify of "
                       "k positions costs about k steps there); or fp32, bf16, fp64")
HELP_DTYPE = ("the LM's dtype: fp32 (float32), bf16 (bfloat16) or fp64 (float64); on CPUs with bf16 matrix units "
              "bf16 makes verifying several positions cost about one step")


# ------------------------------------------------------------------ numeric flags (argparse types)


def _number(text: str, kind: type, what: str, accepts) -> int | float:
    """`text` parsed as `kind` (floats finite), refused with one message naming `what` unless `accepts` it."""
    if kind is int and len(text) > MAX_INT_CHARACTERS:  # before int(): slow on thousands of digits, refused past 4,300
        raise argparse.ArgumentTypeError(f"expected {what}, got a number of {len(text):,} characters")
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r} (NaN and infinities are refused)")
    if not accepts(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _number(text, int, "a positive integer", lambda v: v >= 1)


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    return _number(text, int, "an integer >= 0", lambda v: v >= 0)


def int_in(low: int, high: int):
    """An argparse type: an integer in `low..high` (bounds that keep a flag from sizing a huge list)."""
    def parse(text: str) -> int:
        return _number(text, int, f"an integer in {low}..{high:,}", lambda v: low <= v <= high)

    parse.__name__ = f"int_in_{low}_{high}"
    return parse


def bench_window(text: str) -> int | str:
    """A bench row's verify width: an integer in 2..1024, `adaptive` (each window chooses its own) or `auto` (what
    `mtpc generate` chooses with neither --window nor --tree)."""
    if text.strip().lower() in ("adaptive", "auto"):
        return text.strip().lower()
    return _number(text, int, "'adaptive', 'auto' or an integer in 2..1024", lambda v: 2 <= v <= 1024)


MAX_TREE_NODES = 1024  # the largest tree a flag may ask for (a head's n and branching bound it further)


def tree_or_chain(text: str) -> int | str | None:
    """A bench row's window shape: `chain` (None: one drafted continuation), `auto` (each head's budget chosen as
    `mtpc generate --tree auto` chooses it) or a tree's node budget in 2..1024."""
    if text.strip().lower() in ("chain", "auto"):
        return None if text.strip().lower() == "chain" else "auto"
    return _number(text, int, f"'chain', 'auto' or an integer in 2..{MAX_TREE_NODES}",
                   lambda v: 2 <= v <= MAX_TREE_NODES)


def tree_or_auto(text: str) -> int | str:
    """`mtpc generate --tree`: `auto` (the budget chosen from the head's recorded acceptance and this machine's
    verify costs) or a tree's node budget in 2..1024."""
    if text.strip().lower() == "auto":
        return "auto"
    return _number(text, int, f"'auto' or an integer in 2..{MAX_TREE_NODES}", lambda v: 2 <= v <= MAX_TREE_NODES)


def lookup_k(text: str) -> int:
    """The tokens a prompt-lookup match proposes: an integer in 1..`MAX_LOOKUP_TOKENS`."""
    return int_in(1, MAX_LOOKUP_TOKENS)(text)


def tree_and_window(trees, windows) -> None:
    """One rule for `SpeculativeDecoder(tree=, window=)` (one value each), `mtpc generate` and `mtpc bench`
    (lists): a window (`--window K`) sets a chain's verify width and a tree (`--tree N` or `auto`) has none (its
    width is its node budget), so a window with no chain to apply to is refused. `trees`: the window shapes
    asked for (None: a chain); `windows`: the verify widths (None: the head's n)."""
    window = next((w for w in windows if w is not None), None)
    tree = next((t for t in trees if t is not None), None)
    if window is not None and None not in trees:
        raise InputError(f"tree {tree} (--tree) verifies a tree of drafted tokens per cycle, window {window} "
                         "(--window) sets a chain's verify width: give one of them (in mtpc bench, --tree chain N "
                         "compares both)")


def target_or_temperature(text: str) -> float | None:
    """A draft temperature: `target` (None: the verifier's own temperature) or a finite number > 0."""
    if text.strip().lower() == "target":
        return None
    return _number(text, float, "'target' or a finite number > 0", lambda v: v > 0)


def dtype_name(text: str) -> str:
    """A dtype's short name (`fp32`, `bf16`, `fp64`), given it or its torch name (`float32`, ...)."""
    names = {**{short: short for short in DTYPES}, **{full: short for short, full in DTYPES.items()}}
    if text not in names:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(names)}, got {text!r}")
    return names[text]


def decoding_dtype_name(text: str) -> str:
    """`--dtype` of a decoding command: `auto` (a float32 checkpoint's fp32, else bf16 where the device runs it
    natively and fp32 elsewhere: `mtpc.lm.loading.resolve_dtype`) or a dtype's name as `dtype_name` takes it."""
    return "auto" if text == "auto" else dtype_name(text)


def seed(text: str) -> int:
    """A random seed: an integer in 0..2**63-1 (what torch.Generator.manual_seed takes)."""
    return _number(text, int, "a seed in 0..2**63-1", lambda v: 0 <= v < 2**63)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    return _number(text, float, "a finite number > 0", lambda v: v > 0)


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    return _number(text, float, "a finite number >= 0", lambda v: v >= 0)


def probability(text: str) -> float:
    """A number in (0, 1] (discounts such as --gamma, nucleus mass such as --top-p)."""
    return _number(text, float, "a number in (0, 1]", lambda v: 0 < v <= 1)


def unit_interval(text: str) -> float:
    """A number in [0, 1] (a share, such as --greedy-fraction)."""
    return _number(text, float, "a number in [0, 1]", lambda v: 0 <= v <= 1)


def parse_defines(items: list[str]) -> dict:
    """`-D` bindings of circuit parameters: `["n=16", "name=x"]` -> `{"n": 16, "name": "x"}` (ints and
    floats parsed); a malformed or repeated name is an `InputError`."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise InputError(f"-D expects NAME=VALUE with NAME a parameter name, got {item!r}")
        if key in out:
            raise InputError(f"-D {key} is given twice")
        out[key] = _scalar(value.strip())
    return out


def _scalar(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


# ------------------------------------------------------------------ sampling settings

SAMPLING_RULES = {"temperature": check_temperature, "top_k": check_top_k, "top_p": check_top_p}


def check_sampling_settings(config) -> None:
    """The one check of a command's sampling settings: whichever of `temperature`, `top_k`, `top_p` and the
    draft temperature(s) its config has, by `mtpc.sampling`'s own rules, whatever mode will use them (a
    greedy bench still refuses `--temperature 1e-9`); a refusal is one `InputError` naming the flag. The
    command line runs it on every command's config right after parsing, before any model loads, and the
    commands' own checks run it for the Python API."""
    for name, rule in SAMPLING_RULES.items():
        if hasattr(config, name):
            _apply(rule, getattr(config, name), "--")
    for t in _draft_temperatures(config):
        _apply(check_draft_temperature, t, "--draft-")


def _draft_temperatures(config) -> list:
    """The draft temperatures a config asks for (generate: one, bench: several; None: the target's)."""
    several = getattr(config, "draft_temperatures", None) or ()
    return [t for t in (getattr(config, "draft_temperature", None), *several) if t is not None]


def _apply(rule, value, prefix: str) -> None:
    """`rule(value)`, its `ValueError` (a message starting with the setting's name) as an `InputError`
    naming the flag (`prefix` + the message: `--temperature ...`, `--draft-temperature ...`)."""
    try:
        rule(value)
    except ValueError as e:
        raise InputError(f"{prefix}{e}") from None


# ------------------------------------------------------------------ paths and fits

def output_folder(path: str | Path, what: str = "--out") -> Path:
    """An output folder that exists or can be created: not an existing file, not below one."""
    out = Path(path)
    for p in (out, *out.parents):
        if p.exists():
            if not p.is_dir():
                raise InputError(f"{what} {str(out)!r}: {str(p)!r} is a file, not a folder")
            break
    return out


def data_source(source: str | None, what: str = "--data") -> None:
    """A file, folder or glob that names at least one file (None: the default corpus)."""
    if source is None:
        return
    text = str(source)
    if any(ch in text for ch in "*?["):
        if not any(p.is_file() for p in glob_paths(text)):
            raise InputError(f"{what} {text!r} matches no files")
    elif not Path(text).expanduser().exists():
        raise InputError(f"{what} {text!r} does not exist")


def states_fit_vocabulary(num_states: int, vocab_size: int, where: str) -> None:
    """A circuit's state `s` is token id `s`, so every state must be a token of the model."""
    if num_states > vocab_size:
        raise InputError(f"{where}: the circuit has {num_states} states per variable but the model's vocabulary "
                         f"has {vocab_size} tokens (state s is token id s; use v <= {vocab_size})")


def hidden_sizes_match(head_hidden: int, model_hidden: int, head: str, model: str) -> None:
    if head_hidden != model_hidden:
        raise InputError(f"head {head} reads hidden states of size {head_hidden}, model {model} has hidden size "
                         f"{model_hidden}; it was trained on another model")
