"""A head folder's files: `head.json` (the format version, the circuit's graph spec inline, the
parameterisation, the options, a draft vocabulary) and `head.safetensors` (the parameters by name).

Everything here is checked before anything the size of the head is allocated: the description's every field
(`read_head_config`), the weights' header against the shapes the description implies
(`check_weights_header`) and the machine's memory (`check_memory`); a damaged folder is one `InputError`
naming the file and what is wrong. Building the head itself is `mtpc.heads.head`'s (`load_head`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ..errors import InputError, first_line
from ..files import describe, field, read_json
from ..lm.loading import MAX_HIDDEN
from .constants import PARAMETERISATIONS

__all__ = ["HEAD_FORMAT", "WEIGHTS_FILE", "CONFIG_FILE", "MAX_VOCABULARY", "COMPUTE_DTYPES", "read_head_config",
           "check_vocabulary", "head_arguments", "check_weights_header", "check_memory", "read_head_weights",
           "compute_dtype", "write_head_files"]

HEAD_FORMAT = "mtpc-head/1"
MAX_VOCABULARY = 2**22  # token ids a draft vocabulary may name (mtpc.lm.loading's MAX_VOCAB)
WEIGHTS_FILE = "head.safetensors"
CONFIG_FILE = "head.json"


def write_head_files(directory: str | Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """`tensors` into `directory/head.safetensors` and `config` into `directory/head.json` (made if need be)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": HEAD_FORMAT})
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=1))
    return directory


def read_head_config(path: Path) -> dict:
    """`head.json` at `path`, every field checked, its graph spec read into a `RegionGraph`."""
    from circuitc.graph import RegionGraph

    if not path.exists() and not path.is_symlink():
        raise InputError(f"{path.parent} has no {CONFIG_FILE}; is it a folder written by save_head or mtpc train?")
    config = read_json(path, "the head's description", folder=path.parent)
    if config.get("format") != HEAD_FORMAT:
        raise InputError(f"{path}: format is {describe(config.get('format'))}, not {HEAD_FORMAT!r}")
    field(config, "hidden_size", path, "int", low=1, high=MAX_HIDDEN)
    if config.get("parameterisation", "full") not in PARAMETERISATIONS:
        raise InputError(f"{path}: parameterisation must be one of {', '.join(PARAMETERISATIONS)}")
    options = field(config, "options", path, "object", default={})
    for key in ("adapter_rank", "factor_rank"):
        field(options, key, f"{path}: options", "int", low=0, high=MAX_HIDDEN, default=None)
    field(options, "sum_init_std", f"{path}: options", "number", low=0, high=1e6, default=0.0)
    field(options, "first_token", f"{path}: options", "bool", default=False)
    field(options, "first_token_mlp", f"{path}: options", "int", low=0, high=MAX_HIDDEN, default=0)
    check_vocabulary(config, path)
    identity = options.get("identity_init")
    if identity is not None:
        field(options, "identity_init", f"{path}: options", "number", low=-1e6, high=1e6)
    graph = config.get("graph")
    if not isinstance(graph, dict):  # never a path: a head folder does not point at other files
        raise InputError(f"{path}: graph must be the inline graph-spec JSON object, got {describe(graph)}")
    try:
        config["graph"] = RegionGraph.from_json(graph, source_name=f"{path}: graph")
    except (ValueError, TypeError, KeyError, RecursionError) as e:
        raise InputError(f"{path}: graph: {first_line(e)}") from None
    return config


def check_vocabulary(config: dict, path: Path) -> None:
    """head.json's `vocabulary`: the identity's description, or a draft vocabulary (a list of distinct token
    ids; its length is checked against the circuit when the head is built)."""
    vocabulary = config.get("vocabulary")
    if vocabulary is None or isinstance(vocabulary, str):
        config["vocabulary"] = None
        return
    ok = isinstance(vocabulary, list) and 0 < len(vocabulary) <= MAX_VOCABULARY and all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < MAX_VOCABULARY for t in vocabulary)
    if not ok or len(set(vocabulary)) != len(vocabulary):
        raise InputError(f"{path}: vocabulary must be a list of distinct token ids (a draft vocabulary) or the "
                         f"identity's description, got {describe(vocabulary)}")


def head_arguments(config: dict) -> tuple[dict, dict]:
    """(keyword arguments of `MTPHead`, the head options' ranks) from a checked head.json."""
    options = dict(config.get("options", {}))
    ranks = {k: options.pop(k) for k in ("adapter_rank", "factor_rank") if k in options}
    return {"parameterisation": config.get("parameterisation", "full"), "identity_init": options.get("identity_init"),
            "sum_init_std": options.get("sum_init_std", 0.0), "first_token": options.get("first_token", False),
            "first_token_mlp": options.get("first_token_mlp", 0), "vocabulary": config.get("vocabulary")}, ranks


def check_weights_header(header: dict, shapes: dict, weights: Path, kind: str) -> None:
    """The safetensors header of `weights` names exactly the tensors of `shapes`, each of its shape."""
    if set(header) != set(shapes):
        raise InputError(f"{weights} holds {sorted(header)[:8]}; a {kind!r} head has {sorted(shapes)}")
    for name, shape in shapes.items():
        if tuple(header[name]) != shape:
            raise InputError(f"{weights}: {name} has shape {tuple(header[name])}, the graph and options in "
                             f"{CONFIG_FILE} need {shape}")


def check_memory(shapes: dict, weights: Path) -> None:
    """Refuse a head larger than this machine's memory (physical, or the address-space limit if lower)."""
    import os
    import resource

    values = sum(math.prod(s) for s in shapes.values())
    need = values * 4  # float32 at most per value is what loading and casting hold
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        memory = min(memory, soft)
    if need > memory:
        raise InputError(f"{weights}: the head has {values:,} weights ({need / 2**30:.1f} GiB), more than this "
                         f"machine's {memory / 2**30:.1f} GiB of memory")


def read_head_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of `head.safetensors`: floating point, one dtype."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable safetensors file, truncated or damaged? ({first_line(e)})") from None
    dtypes = {t.dtype for t in tensors.values()}
    if not tensors or len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
        raise InputError(f"{path}: expected floating-point tensors of one dtype, got "
                         f"{sorted(str(d).removeprefix('torch.') for d in dtypes) or 'none'}")
    return tensors


COMPUTE_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
                  "float16": torch.float16}


def compute_dtype(config: dict, tensors: dict[str, torch.Tensor], directory: Path) -> torch.dtype:
    """The dtype the head runs in: its weights' own, or `head.json`'s `compute_dtype` where a shipped head
    stores them narrower than it runs (float16 weights of a float32 head: half the bytes in a repository)."""
    name = config.get("compute_dtype")
    if name is None:
        return next(iter(tensors.values())).dtype
    if not isinstance(name, str) or name not in COMPUTE_DTYPES:
        raise InputError(f"{directory / CONFIG_FILE}: compute_dtype must be one of {sorted(COMPUTE_DTYPES)}, got "
                         f"{str(name)[:40]!r}")
    return COMPUTE_DTYPES[name]
