"""What `mtpc bench` runs on: the LM and its heads loaded, and one decoder variant per head x lookup x
verify width x acceptance rule x draft temperature x eager/compiled (`build_variants`). Shared by the
per-prompt bench (`run`) and the batched one (`batch`); `config` stays torch-free so `mtpc bench
--help` loads no torch."""

from __future__ import annotations

import functools
import itertools
import logging
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..lm import loading
from ..decoding import (AcceptanceRule, AdaptiveWidth, BlockVerification, HeadEntry, PlainDecoder, PromptLookup,
                        SpeculativeDecoder, load_head_entry, measured_pace)
from ..decoding.choice.auto_decoding import DecodingChoice, choose_decoding
from ..decoding.choice.auto_trees import AutoTree, choose_auto_tree, recorded_acceptance, verify_costs
from ..decoding.choice.costs import cycle_costs
from ..decoding.drafts.trees import tree_budget
from ..errors import InputError
from ..lm.tokenizer import ByteTokenizer, SubwordTokenizer
from .config import DTYPES, BenchConfig, Variant

__all__ = ["build_variants", "Loaded", "load_bench", "bench_tokenizer"]

log = logging.getLogger(__name__)


def build_variants(entries: Sequence[HeadEntry], decoder_cls: Callable[..., SpeculativeDecoder],
                   lookup: Sequence[bool] = (False,), lookup_tokens: int = 10, compiled: Sequence[bool] = (False,),
                   windows: Sequence[int | str | None] = (None,), acceptance: Sequence[str] = ("block",),
                   draft_temperatures: Sequence[float | None] = (None,),
                   trees: Sequence[int | str | None] = (None,),
                   call_seconds: Callable[[], dict[int, float]] | None = None) -> list[Variant]:
    """One decoder per head x lookup x verify width (None: the head's n; "adaptive": `AdaptiveWidth()`)
    x acceptance rule ("block" or "token") x draft temperature (None: the target's) x eager/compiled, for
    each window shape of `trees` (None: a chain; N: a tree of N nodes, with or without lookup branches, no
    width of its own, and no rows per acceptance rule or draft temperature: a tree's acceptance and drafts
    use neither; "auto": each head's budget from its recorded per-depth acceptance and `call_seconds()`, the
    verify call's seconds by width, measured once).
    A window wider than a head's circuit, or a tree it cannot fill, is an input error."""
    lookup, windows, acceptance = list(dict.fromkeys(lookup)), list(dict.fromkeys(windows)), list(dict.fromkeys(acceptance))
    draft_temperatures = list(dict.fromkeys(draft_temperatures))
    for entry in entries:
        widest = max(entry.info["n"], 2)
        wrong = [w for w in windows if isinstance(w, int) and not 2 <= w <= widest]
        if wrong:
            raise InputError(f"--window {wrong[0]}: the head {entry.label} verifies windows of 2 to {widest} tokens")
    trees = list(dict.fromkeys(trees))
    variants = _tree_variants(entries, decoder_cls, [t for t in trees if t is not None], lookup, lookup_tokens, compiled,
                              call_seconds, chains=None in trees)
    if None not in trees:
        return variants
    if "auto" in windows:
        variants += _auto_variants(entries, decoder_cls, lookup, lookup_tokens, compiled, call_seconds)
    windows = [w for w in windows if w != "auto"]
    for entry, use, width, rule, heat, c in itertools.product(entries, lookup, windows, acceptance, draft_temperatures,
                                                               compiled):
        label = (entry.label + ("/lookup" if use else "") + _width_label(width) + ("/token" if rule == "token" else "")
                 + ("" if heat is None else f"/draft-t{heat:g}") + ("/compile" if c else ""))
        window = AdaptiveWidth() if width == "adaptive" else width
        decoder = decoder_cls(entry.model, entry.head, entry.lora_layers,
                              lookup=PromptLookup(tokens=lookup_tokens) if use else None,
                              acceptance=AcceptanceRule() if rule == "token" else BlockVerification(),
                              draft_temperature=heat,
                              **({"window": window} if window is not None else {}), **({"compile": True} if c else {}))
        variants.append(Variant(label, entry, use, _longest(decoder, entry, use), decoder, compiled=c, width=width,
                                acceptance=rule,
                                draft_temperature=heat))
    return variants


def _tree_variants(entries: Sequence[HeadEntry], decoder_cls: Callable[..., SpeculativeDecoder],
                   trees: Sequence[int | str], lookup: Sequence[bool], lookup_tokens: int,
                   compiled: Sequence[bool], call_seconds: Callable[[], dict[int, float]] | None,
                   chains: bool = False) -> list[Variant]:
    """One decoder per head x tree budget x lookup x eager/compiled (`--tree N`, or `auto`: `_auto_budget`; where
    no tree beats plain decoding, the head's chain, once: as a row `HEAD/auto-chain` unless `chains` has it)."""
    variants = []
    for entry, nodes, use, c in itertools.product(entries, trees, lookup, compiled):
        auto = _auto_budget(entry, call_seconds) if nodes == "auto" else None
        budget = auto.budget if auto else nodes  # None: no tree beats plain decoding, the head's chain
        if budget is None and chains:
            continue  # the chain rows have it
        if budget is not None:
            try:
                tree_budget(budget, entry.info["n"], entry.head.num_states)
            except ValueError as e:
                raise InputError(f"--tree {nodes} with the head {entry.label}: {e}") from None
        decoder = decoder_cls(entry.model, entry.head, entry.lora_layers, tree=budget,
                              lookup=PromptLookup(tokens=lookup_tokens) if use else None,
                              **({"compile": True} if c else {}))
        count = (None if budget is None else budget.nodes) if auto else nodes
        label = (f"{entry.label}/{'auto-' if auto else ''}{'chain' if count is None else f'tree{count}'}"
                 + ("/lookup" if use else "") + ("/compile" if c else ""))
        variants.append(Variant(label, entry, use, _longest(decoder, entry, use), decoder, compiled=c, tree=count,
                                tree_auto=auto.summary() if auto else None))
    return variants


def _auto_variants(entries: Sequence[HeadEntry], decoder_cls: Callable[..., SpeculativeDecoder], lookup: Sequence[bool],
                   lookup_tokens: int, compiled: Sequence[bool],
                   call_seconds: Callable[[], dict[int, float]] | None) -> list[Variant]:
    """`--window auto`: per head, the chain or tree `mtpc generate` chooses with neither --window nor --tree
    (`choose_decoding`, from the head's recorded acceptance, `call_seconds()` and a cycle's other work measured
    now), with and without lookup and compiled as asked, and paced as `mtpc generate` paces (`mtpc.decoding.pace`:
    against a plain decoder compiled alike, whose step is measured here); a head for which plain decoding is
    chosen has no row (the plain row is its choice), and a line on stderr says so."""
    variants = []
    for entry in entries:
        choice = _auto_choice(entry, call_seconds)
        summary = {"kind": choice.kind, "window": choice.window, "nodes": choice.tree.nodes if choice.tree else None,
                   "expected_tokens": choice.tokens, "expected_cost": choice.cost, "expected_speedup": choice.rate()}
        if choice.kind == "plain":
            log.warning("mtpc bench: --window auto for %s: %s; the plain row is its choice", entry.label,
                        choice.describe())
            continue
        shape = f"auto-w{choice.window}" if choice.kind == "chain" else f"auto-tree{choice.tree.nodes}"
        plains = {c: PlainDecoder(entry.model, compile=c) for c in compiled}  # one per mode, measured once
        paces = {c: (plain, measured_pace(plain)) for c, plain in plains.items()}
        for use, c in itertools.product(lookup, compiled):
            decoder = decoder_cls(entry.model, entry.head, entry.lora_layers, window=choice.window, tree=choice.tree,
                                  lookup=PromptLookup(tokens=lookup_tokens) if use else None,
                                  **({"compile": True} if c else {}))
            variants.append(Variant(f"{entry.label}/{shape}" + ("/lookup" if use else "") + ("/compile" if c else ""),
                                    entry, use, _longest(decoder, entry, use), decoder, compiled=c, width="auto",
                                    tree=choice.tree.nodes if choice.tree else None, auto=summary, pace=paces[c]))
    return variants


def _auto_choice(entry: HeadEntry, call_seconds: Callable[[], dict[int, float]] | None) -> DecodingChoice:
    """`choose_decoding` for one head as `mtpc generate` makes it: its recorded acceptance, the verify curve and
    a cycle's other work measured by decoding a few tokens (`cycle_costs`)."""
    depth_topk = recorded_acceptance(entry.path, entry.label, flag="--window auto")
    if call_seconds is None:
        raise ValueError("--window auto needs call_seconds, the verify call's seconds by width")
    seconds = call_seconds()
    cycle = cycle_costs(entry.model, entry.head, seconds)  # a tied head is tied already (`load_head_entry`)
    return choose_decoding(depth_topk, seconds, cycle.overhead, entry.info["n"], entry.head.num_states)


def _auto_budget(entry: HeadEntry, call_seconds: Callable[[], dict[int, float]] | None) -> AutoTree:
    """`--tree auto` for one head, as `mtpc generate` chooses it (`mtpc.decoding.choice.auto_trees`): its `budget` is
    None where no tree beats plain decoding."""
    depth_topk = recorded_acceptance(entry.path, entry.label)
    if call_seconds is None:
        raise ValueError("--tree auto needs call_seconds, the verify call's seconds by width")
    return choose_auto_tree(depth_topk, call_seconds(), entry.info["n"], entry.head.num_states)


def _longest(decoder: SpeculativeDecoder, entry: HeadEntry, lookup: bool) -> int:
    """The most tokens one cycle of `decoder` can commit: a tree's deepest path and its root, else the lookup's
    span or the chain's width (at most the head's n)."""
    layout = decoder.layout
    if layout.tree is not None:
        return layout.depth + 1
    return layout.span if lookup else min(layout.widest, entry.info["n"])


def _width_label(width: int | str | None) -> str:
    return "" if width is None else "/adaptive" if width == "adaptive" else f"/w{width}"


@dataclass
class Loaded:
    """What a bench runs on: the device, the LM's dtype, its tokenizer (bytes or subword), the LM, the loader of
    further models (peers) and every head variant."""

    device: torch.device
    dtype: torch.dtype
    tok: ByteTokenizer | SubwordTokenizer
    base: torch.nn.Module
    load_model: Callable
    variants: list[Variant]


def load_bench(cfg: BenchConfig, decoder_cls: Callable[..., SpeculativeDecoder]) -> Loaded:
    """Set the threads, load the LM and the heads, and build the variants of `cfg`."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = loading.resolve_device(cfg.device)
    dtype = getattr(torch, DTYPES[cfg.dtype])
    load_model = functools.partial(loading.load_model, trust_remote_code=cfg.trust_remote_code)
    base = load_model(cfg.model, dtype, device)
    head_dtype = getattr(torch, DTYPES[cfg.head_dtype]) if cfg.head_dtype else None
    entries = [load_head_entry(p, base, cfg.model, dtype, head_dtype, device, trust_remote_code=cfg.trust_remote_code)
               for p in cfg.heads]
    call_seconds = functools.cache(functools.partial(verify_costs, base, "compare chains (no --tree)"))
    variants = build_variants(entries, decoder_cls, cfg.lookup, cfg.lookup_tokens,
                              compiled=(False, True) if cfg.compile else (False,), windows=cfg.windows,
                              acceptance=cfg.acceptance, draft_temperatures=cfg.draft_temperatures,
                              trees=cfg.trees, call_seconds=call_seconds)
    return Loaded(device, dtype, bench_tokenizer(cfg)[1], base, load_model, variants)


def bench_tokenizer(cfg: BenchConfig) -> tuple[loading.ModelInfo, ByteTokenizer | SubwordTokenizer]:
    """The model folder checked (`loading.model_info`) and the tokenizer its prompts go through: bytes, the
    model's own subword tokenizer (a vocabulary that is not byte-level, with its tokenizer files), or with
    `--allow-non-byte-vocab` and no tokenizer files ids 0..255 read as bytes."""
    info = loading.model_info(cfg.model, allow_non_byte_vocab=cfg.allow_non_byte_vocab,
                              trust_remote_code=cfg.trust_remote_code, subword_ok=True)
    return info, loading.model_tokenizer(info, trust_remote_code=cfg.trust_remote_code)
