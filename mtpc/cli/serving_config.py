"""`mtpc export-hf`'s and `mtpc serve`'s settings (`ExportConfig`, `ServeConfig`); each field made with
`mtpc.settings.setting` is also the command's option. Importable without torch or vLLM (the parser is
built from them for `--help`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import MAX_LOOKUP_TOKENS, int_in, positive_int
from ..settings import setting

__all__ = ["ExportConfig", "ServeConfig", "DEFAULT_HOST", "DEFAULT_PORT"]

DEFAULT_HOST = "127.0.0.1"  # this machine only: serving to the network is a choice the user makes by name
DEFAULT_PORT = 8000  # vLLM's own default


@dataclass
class ExportConfig:
    model: str = setting(help="the GGUF model file (mtpc reads it as --model x.gguf does: checked, dequantized once)")
    out: str = setting(help="the folder to write: new or empty (--force replaces an earlier model folder)")
    dtype: str = setting(  # vLLM runs both; fp32 keeps exactly the weights mtpc decodes a GGUF with
        "fp32", choices=("fp32", "bf16"),
        help="the weights' dtype: fp32 (the dequantized values exactly, as mtpc decodes the GGUF) or bf16 (half "
             "the size, rounded once)")
    force: bool = setting(False, help="replace OUT when it already holds a model folder (config.json)")


@dataclass
class ServeConfig:
    model: str = setting(
        help="the model folder vLLM serves (a Hugging Face checkpoint; from a GGUF file, write one with mtpc "
             "export-hf)")
    head: str | None = setting(
        None, help="a head folder written by mtpc train: it drafts for vLLM's speculative decoding (default: "
                   "plain serving)")
    host: str = setting(DEFAULT_HOST, help="the address the server listens on (127.0.0.1: this machine only)")
    port: int = setting(DEFAULT_PORT, type=int_in(1, 65535), help="the port the server listens on")
    lookup: int | None = setting(  # prompt lookup beside the circuit, inside the proposer (mtpc.vllm_options)
        None, type=int_in(1, MAX_LOOKUP_TOKENS), metavar="K",
        help="with --head: also draft n-gram continuations of the prompt and the text so far (K tokens a match "
             "proposes)")
    num_speculative_tokens: int | None = setting(  # vLLM's name for it; mtpc.vllm_options checks the range
        None, type=positive_int, metavar="N",
        help="with --head: the most tokens one draft holds (default: the circuit's n - 1, or --lookup's K when "
             "longer)")
    vllm_args: tuple[str, ...] = ()  # everything after `--`, handed to vLLM's server as it is
