"""What `mtpc bench` is asked to measure (`BenchConfig`) and the decoder variants it builds (`Variant`,
`build_variants`)."""

from __future__ import annotations

from dataclasses import dataclass
import functools
import itertools
from typing import Callable, Sequence

import torch

from .. import loading
from ..decoding import AdaptiveWidth, HeadEntry, PromptLookup, SpeculativeDecoder, load_head_entry
from ..errors import InputError
from ..tokenizer import ByteTokenizer

__all__ = ["BenchConfig", "Variant", "DTYPES", "build_variants", "Loaded", "load_bench"]

DTYPES = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16}


@dataclass
class BenchConfig:
    model: str
    heads: Sequence[str]
    prompts: str | None = None  # a .txt (one prompt per line) or .jsonl file
    corpus: str | None = None  # or: sample prompts from the held-out documents of a corpus ("stdlib": Python's)
    num_prompts: int = 8  # prompts per set
    repeats: int = 3  # K disjoint prompt sets
    prompt_len: int = 128  # corpus prompts: tokens per prompt
    max_new_tokens: int = 256
    mode: str = "greedy"  # greedy | sample
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    lookup: Sequence[bool] = (False,)  # heads without and/or with prompt-lookup drafting
    lookup_tokens: int = 10  # tokens a lookup match proposes
    windows: Sequence[int | str | None] = (None,)  # verify widths to compare (None: the head's n; "adaptive")
    peers: Sequence[str] = ()  # "prompt-lookup[:K]", "assisted:DIR"
    compile: bool = False  # also plain decoding with a static cache, eager and torch.compile'd, and every
    # speculative variant again with its cycle step compiled
    max_repetition: float | None = None  # leave out prompts whose plain continuation repeats more
    dtype: str = "fp32"  # the LM's dtype
    head_dtype: str | None = None  # cast heads for inference (None: as saved)
    device: str = "auto"
    threads: int | None = None
    seed: int = 0
    warmup_tokens: int = 32
    val_fraction: float = 0.02  # corpus prompts come from this held-out split (mtpc tiny-lm's default)
    out: str | None = None
    progress: bool = True
    allow_non_byte_vocab: bool = False  # accept a model whose vocabulary is not bytes (ids 0..255 taken as bytes)
    trust_remote_code: bool = False  # allow model folders whose config names their own modelling code (auto_map)
    batch_size: int | None = None  # decode batches of this many left-padded prompts (`mtpc.bench.batch`)


@dataclass
class Variant:
    label: str
    entry: HeadEntry
    lookup: bool
    window: int  # the most tokens one cycle can commit
    decoder: SpeculativeDecoder
    compiled: bool = False  # the cycle step runs through torch.compile
    width: int | str | None = None  # the requested verify width of the circuit window (None: n; "adaptive")


def build_variants(entries: Sequence[HeadEntry], decoder_cls: Callable[..., SpeculativeDecoder],
                   lookup: Sequence[bool] = (False,), lookup_tokens: int = 10, compiled: Sequence[bool] = (False,),
                   windows: Sequence[int | str | None] = (None,)) -> list[Variant]:
    """One decoder per head x lookup x verify width (None: the head's n; "adaptive": `AdaptiveWidth()`)
    x eager/compiled. A window wider than a head's circuit is an input error."""
    lookup, windows = list(dict.fromkeys(lookup)), list(dict.fromkeys(windows))
    for entry in entries:
        widest = max(entry.info["n"], 2)
        wrong = [w for w in windows if isinstance(w, int) and not 2 <= w <= widest]
        if wrong:
            raise InputError(f"--window {wrong[0]}: the head {entry.label} verifies windows of 2 to {widest} tokens")
    variants = []
    for entry, use, width, c in itertools.product(entries, lookup, windows, compiled):
        label = (entry.label + ("/lookup" if use else "") + _width_label(width) + ("/compile" if c else ""))
        window = AdaptiveWidth() if width == "adaptive" else width
        decoder = decoder_cls(entry.model, entry.head, entry.lora_layers,
                              lookup=PromptLookup(tokens=lookup_tokens) if use else None,
                              **({"window": window} if window is not None else {}), **({"compile": True} if c else {}))
        window = decoder.span if use else min(decoder.width, entry.info["n"])
        variants.append(Variant(label, entry, use, window, decoder, compiled=c, width=width))
    return variants

def _width_label(width: int | str | None) -> str:
    return "" if width is None else "/adaptive" if width == "adaptive" else f"/w{width}"


@dataclass
class Loaded:
    """What a bench runs on: the device, the LM's dtype, its byte tokenizer, the LM, the loader of
    further models (peers) and every head variant."""

    device: torch.device
    dtype: torch.dtype
    tok: ByteTokenizer
    base: torch.nn.Module
    load_model: Callable
    variants: list[Variant]


def load_bench(cfg: BenchConfig, decoder_cls: Callable[..., SpeculativeDecoder]) -> Loaded:
    """Set the threads, load the LM and the heads, and build the variants of `cfg`."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = loading.resolve_device(cfg.device)
    dtype = DTYPES[cfg.dtype]
    load_model = functools.partial(loading.load_model, trust_remote_code=cfg.trust_remote_code)
    base = load_model(cfg.model, dtype, device)
    head_dtype = DTYPES[cfg.head_dtype] if cfg.head_dtype else None
    entries = [load_head_entry(p, base, cfg.model, dtype, head_dtype, device, trust_remote_code=cfg.trust_remote_code)
               for p in cfg.heads]
    variants = build_variants(entries, decoder_cls, cfg.lookup, cfg.lookup_tokens,
                              compiled=(False, True) if cfg.compile else (False,), windows=cfg.windows)
    return Loaded(device, dtype, ByteTokenizer.load(cfg.model), base, load_model, variants)
