"""What a user would pick instead of a circuit head, measured by `mtpc bench` on the same prompts.

- `prompt-lookup[:K]`: transformers' prompt-lookup decoding (`generate(prompt_lookup_num_tokens=K)`),
- `assisted:DIR`: transformers' assisted generation with a small draft LM (`generate(assistant_model=...)`),
- `static`: transformers' own plain decoding with a static KV cache (`generate(cache_implementation="static")`;
  transformers compiles its step automatically on accelerators only, so on the CPU this is its eager static
  path; timed with the same hooks as the other peers, which on CUDA would sit inside its compiled step:
  there, `--compile`'s "plain (static + compile)" row is the compiled baseline),
- `generate`: transformers' own plain `generate()` with its default (dynamic) cache: the baseline a user
  already has,
- `llama.cpp`: llama.cpp's own plain decoding of the same GGUF file (`llama-cpp-python`, when installed: an
  optional dependency with no wheel for every platform), the CPU user's alternative. It runs the file's
  quantized weights with its own kernels, not the dequantized model the other rows run, so its outputs are
  its own (greedy equality is reported, not expected) and its speed is another dtype's: the row says so.
  Timed from its first new token (the prompt's forward) to its last, as the others,
- `--compile`: the fastest plain decoding of the same model: mtpc's one plain decoder
  (`mtpc.decoding.plain.PlainDecoder`: static, preallocated KV caches), its one-token step run eagerly
  without phase hooks ("plain (static cache)") and through `torch.compile` ("plain (static + compile)"),
  gpt-fast's recipe. The compile happens in the untimed warm-up.

Every peer runs as a task `task(ids, budget, seed) -> Run`, interleaved prompt by prompt with plain
decoding and the heads. transformers' generate is timed with the same module hooks as the heads (from
the end of the target's first forward, which reads the prompt, to the end); its cycles are the target's
forward calls. Sampling uses the same temperature / top-k / top-p (transformers' warpers, the rules
`mtpc.sampling.Sampling` follows) and the global torch generator, seeded per prompt.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..checks import lookup_k
from ..decoding import PHASES, PhaseClock, PlainDecoder, backbone_marks, split_phases
from ..errors import InputError, MtpcError, first_line
from .timing import Run, synchronized

__all__ = ["Peer", "PeerSpec", "parse_peer", "build_peers", "PEER_KINDS"]

PEER_KINDS = ("prompt-lookup", "assisted", "static", "generate", "llama.cpp")
DEFAULT_LOOKUP_TOKENS = 10  # transformers' documented example value for prompt_lookup_num_tokens


# the peers that are transformers' plain decoding, no argument: kind -> (label, detail, generate's extra kwargs)
PLAIN_GENERATE = {"static": ("hf static cache", 'generate(cache_implementation="static")',
                             {"cache_implementation": "static"}),
                  "generate": ("hf generate", "generate() (its default dynamic cache)", {})}


@dataclass(frozen=True)
class PeerSpec:
    kind: str  # prompt-lookup | assisted | static | generate | llama.cpp
    tokens: int | None = None  # prompt-lookup: candidate tokens per match
    path: str | None = None  # assisted: the draft LM folder


@dataclass
class Peer:
    label: str
    kind: str  # prompt-lookup | assisted | static | generate | llama.cpp | plain-static | plain-compiled
    detail: str
    task: Callable[[torch.Tensor, int, int], Run]


def parse_peer(text: str, model: str | None = None) -> PeerSpec:
    """`prompt-lookup`, `prompt-lookup:K`, `assisted:DIR`, `static`, `generate` or `llama.cpp` (checked before
    any model is loaded; `llama.cpp` needs `model`, the bench's `--model`, to be a GGUF file and
    llama-cpp-python to be installed)."""
    kind, colon, arg = text.partition(":")
    if text == "llama.cpp":
        from ..lm.gguf_files import is_gguf

        if importlib.util.find_spec("llama_cpp") is None:
            raise InputError("--peers llama.cpp needs llama-cpp-python (pip install llama-cpp-python; where no wheel "
                             "fits, pip builds it from source with cmake and a C++ compiler)")
        if model is None or not is_gguf(model):
            raise InputError("--peers llama.cpp runs the --model GGUF file itself; give --model a .gguf file")
        return PeerSpec("llama.cpp", path=str(model))
    if kind in PLAIN_GENERATE:
        if colon:
            raise InputError(f"--peers {text}: {kind} takes no argument")
        return PeerSpec(kind)
    if kind == "prompt-lookup":
        if not colon:
            return PeerSpec(kind, tokens=DEFAULT_LOOKUP_TOKENS)
        try:  # the bound every --lookup has; an empty K is a mistake, not the default
            return PeerSpec(kind, tokens=lookup_k(arg))
        except argparse.ArgumentTypeError as e:
            raise InputError(f"--peers {text}: K in prompt-lookup:K (tokens a match proposes): {e}") from None
    if kind == "assisted":
        if not arg:
            raise InputError("--peers assisted:DIR needs the draft LM's folder (e.g. from mtpc tiny-lm --layers 1)")
        if not (Path(arg) / "config.json").is_file():
            raise InputError(f"--peers {text}: {arg} is not a Hugging Face checkpoint folder (no config.json)")
        return PeerSpec(kind, path=arg)
    raise InputError(f"--peers {text}: unknown peer; use prompt-lookup[:K], assisted:DIR, static, generate or "
                     "llama.cpp")


def build_peers(cfg, base, specs: list[PeerSpec], load_model: Callable, dtype, device: torch.device,
                eos: set[int]) -> list[Peer]:
    """The peers' tasks: transformers' decoders for `specs`, and the static-cache baselines if `cfg.compile`;
    every one stops at any id of `eos`."""
    peers = []
    if cfg.compile:
        eager = PlainDecoder(base, compile=False)
        compiled = PlainDecoder(base, compile=True)
        peers.append(Peer("plain (static cache)", "plain-static", "PlainDecoder, preallocated caches, eager step",
                          _static_task(cfg, eager, eos)))
        peers.append(Peer("plain (static + compile)", "plain-compiled",
                          "PlainDecoder, preallocated caches, torch.compile'd step (compile_step, as the heads' cycle)",
                          _static_task(cfg, compiled, eos)))
    for spec in specs:
        if spec.kind in PLAIN_GENERATE:
            label, detail, decoder = PLAIN_GENERATE[spec.kind]
            peers.append(Peer(label, spec.kind, detail, _hf_task(cfg, base, eos, device, **decoder)))
        elif spec.kind == "prompt-lookup":
            peers.append(Peer(f"hf prompt-lookup:{spec.tokens}", spec.kind,
                              f"generate(prompt_lookup_num_tokens={spec.tokens})",
                              _hf_task(cfg, base, eos, device, prompt_lookup_num_tokens=spec.tokens)))
        elif spec.kind == "llama.cpp":
            peers.append(_llama_cpp_peer(cfg, spec.path, eos))
        else:
            draft = load_model(spec.path, dtype, device)
            if draft.config.vocab_size != base.config.vocab_size:
                raise InputError(f"the draft LM {spec.path} has a vocabulary of {draft.config.vocab_size}, the model's "
                                 f"is {base.config.vocab_size}; assisted generation needs the same tokens")
            peers.append(Peer(f"hf assisted:{Path(spec.path).name}", spec.kind,
                              f"generate(assistant_model={spec.path}), "
                              f"{sum(p.numel() for p in draft.parameters()) / 1e6:.2f}M parameters",
                              _hf_task(cfg, base, eos, device, assistant_model=draft)))
    return peers


def _hf_task(cfg, base, eos: set[int], device: torch.device, **decoder) -> Callable:
    embed, ends = backbone_marks(base)
    pad = base.config.vocab_size - 1 if base.config.pad_token_id is None else base.config.pad_token_id

    def task(ids, budget: int, seed: int) -> Run:
        torch.manual_seed(seed)  # transformers samples with the global generator
        clock = PhaseClock(None, embed, ends, device.type == "cuda")
        with synchronized(clock.cuda), clock, torch.no_grad():
            out = base.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=budget,
                                eos_token_id=sorted(eos), pad_token_id=pad, **cfg.sampling().transformers_kwargs(), **decoder)
        stamps = clock.times()
        phases, seconds = split_phases(stamps)
        calls = sum(kind == "backbone_start" for kind, _ in stamps)
        return Run(out.shape[1] - ids.shape[1], calls, seconds, phases, out[0].tolist(), ids.shape[1])

    return task


def _static_task(cfg, decoder: PlainDecoder, eos: set[int]) -> Callable:
    """No phase hooks here: a hook inside a `torch.compile`d step is traced by dynamo (graph breaks and
    recompiles), which would time something else than the compiled step. The decoder's own cycle clock
    (CUDA: synchronised) gives the decoding time; the phases stay empty."""
    sampling = cfg.sampling()

    def task(ids, budget: int, seed: int) -> Run:
        gen = torch.Generator().manual_seed(seed) if ids.device.type == "cpu" else None
        if gen is None:
            torch.manual_seed(seed)
        with synchronized(ids.is_cuda):  # the host clock times the GPU's work
            out = decoder.generate(ids, budget, sampling, eos_token_id=eos, generator=gen)
        stats = out.stats
        return Run(stats.new_tokens, stats.cycles, sum(stats.cycle_seconds), dict.fromkeys(PHASES, 0.0),
                   out.sequences[0].tolist(), ids.shape[1])

    return task


def _llama_cpp_peer(cfg, gguf: str, eos: set[int]) -> Peer:
    """llama.cpp decoding the GGUF file on `cfg.threads` threads (the same prompts' token ids, so the same
    prompts), one token per call: greedy, or sampling with the same temperature / top-k / top-p and none of
    llama.cpp's other samplers (min-p, typical, repetition penalty all off)."""
    import llama_cpp

    threads = cfg.threads or torch.get_num_threads()
    try:  # n_ctx 0: the file's own context length
        llm = llama_cpp.Llama(model_path=gguf, n_ctx=0, n_threads=threads, n_threads_batch=threads, verbose=False)
    except (ValueError, RuntimeError) as e:  # a file llama.cpp cannot run (an architecture it lacks, ...)
        raise MtpcError(f"--peers llama.cpp: llama.cpp could not load {gguf}: {first_line(e)}") from None
    sampling = cfg.sampling()
    if sampling.greedy:
        settings = {"temp": 0.0, "top_k": 1}
    else:
        settings = {"temp": sampling.temperature, "top_k": sampling.top_k or 0,
                    "top_p": sampling.top_p if sampling.top_p is not None else 1.0}
    settings.update(min_p=0.0, typical_p=1.0, repeat_penalty=1.0)

    def task(ids, budget: int, seed: int) -> Run:
        prompt = ids[0].tolist()
        llm.set_seed(seed)
        new, stamps = [], []
        for token in llm.generate(prompt, reset=True, **settings):
            stamps.append(time.perf_counter())  # the first: after the prompt's forward, as the other rows start
            new.append(int(token))
            if token in eos or len(new) == budget:
                break
        return Run(len(new), len(new), stamps[-1] - stamps[0], dict.fromkeys(PHASES, 0.0), prompt + new, len(prompt))

    detail = (f"llama-cpp-python {llama_cpp.__version__}: the GGUF's own quantized weights and kernels, "
              f"{threads} thread{'s' if threads > 1 else ''} (another dtype than the other rows)")
    return Peer("llama.cpp", "llama.cpp", detail, task)
