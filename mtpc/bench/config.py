"""What `mtpc bench` is asked to measure (`BenchConfig`, whose fields are also the command's options:
`mtpc.settings`) and the decoder variants it builds (`Variant`). Importable without torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ..checks import (DTYPES, HELP_DTYPE, MAX_LOOKUP_TOKENS, MAX_THREADS, dtype_name, int_in, positive_float,
                      positive_int, probability, target_or_temperature, tree_or_chain, unit_interval,
                      bench_window)
from ..checks import seed as parse_seed
from ..sampling import GREEDY, Sampling
from ..settings import setting
from ..training.config import HELP_MODEL, HELP_REMOTE_CODE

if TYPE_CHECKING:
    from ..decoding import HeadEntry, SpeculativeDecoder

__all__ = ["BenchConfig", "Variant", "DTYPES", "MODES", "LOOKUP_MODES", "ACCEPTANCE_RULES"]

MODES = ("greedy", "sample")
LOOKUP_MODES = {"off": (False,), "on": (True,), "both": (False, True)}  # --lookup -> BenchConfig.lookup
ACCEPTANCE_RULES = ("block", "token")  # --acceptance: BlockVerification (the decoder's default), AcceptanceRule
MAX_BATCH = 4096  # rows of one --batch-size batch (the decoder also checks memory before allocating)


@dataclass
class BenchConfig:
    model: str = setting(help=HELP_MODEL)
    heads: Sequence[str] = setting(nargs="+", metavar="DIR", help="head folders written by mtpc train")
    allow_non_byte_vocab: bool = setting(  # ids 0..255 taken as bytes
        False, help="accept a model whose vocabulary is not byte-level and whose folder has no tokenizer files (token "
                    "ids 0..255 are taken as bytes; a model with its own tokenizer is read through it, no flag)")
    trust_remote_code: bool = setting(False, help=HELP_REMOTE_CODE)
    prompts: str | None = setting(None, exclusive="source",
                                  help=".txt (one prompt per line) or .jsonl (strings or {\"prompt\": ...})")
    corpus: str | None = setting(None, exclusive="source",  # "stdlib": Python's
                                 help="sample prompts from the held-out documents of this corpus ('stdlib': the "
                                      "Python standard library, mtpc tiny-lm's default)")
    chat: bool = setting(  # as `mtpc generate --chat`; the answer ends where generate's does
        False, help="render every --prompts prompt as a user turn with the model's own chat template (a subword "
                    "model's answer then ends at any of its special tokens)")
    num_prompts: int = setting(8, type=positive_int, help="prompts per set")
    repeats: int = setting(3, type=positive_int, help="K disjoint prompt sets; mean ± std over them")
    prompt_len: int = setting(128, type=positive_int, help="corpus prompts: tokens per prompt")
    max_new_tokens: int = setting(256, type=positive_int, help="tokens generated per prompt")
    mode: str = setting("greedy", choices=MODES, help="decoding mode")
    temperature: float = setting(1.0, type=positive_float, help="sampling temperature")
    top_k: int | None = setting(None, type=positive_int, help="sample: keep the k most likely tokens")
    top_p: float | None = setting(None, type=probability, help="sample: nucleus mass in (0, 1]")
    lookup: Sequence[bool] = setting(  # heads without and/or with prompt-lookup drafting
        (False,), choices=LOOKUP_MODES,
        help="prompt-lookup drafting inside the heads' decoder: off, on, or both side by side")
    lookup_tokens: int = setting(10, type=int_in(1, MAX_LOOKUP_TOKENS), help="tokens a lookup match proposes")
    windows: Sequence[int | str | None] = setting(  # None: the head's n
        (None,), flag="--window", nargs="+", type=bench_window, metavar="K",
        help="verify widths of the circuit window to compare side by side: 2 .. each head's n, 'adaptive' "
             "(each window's width chosen from its draft's probabilities) or 'auto' (the chain or tree mtpc "
             "generate chooses on this machine from the head's recorded acceptance and measured costs; no row "
             "where it chooses plain decoding, and a line says so); default: n")
    trees: Sequence[int | str | None] = setting(  # None: a chain
        (None,), flag="--tree", nargs="+", type=tree_or_chain, metavar="N",
        help="window shapes to compare side by side: 'chain' (one drafted continuation, the default) and/or "
             "trees of N nodes chosen by the circuit (mtpc.decoding.drafts.trees; with --lookup, a match is a branch of "
             "the tree), or 'auto': each head's tree sized from its recorded per-depth acceptance and the verify "
             "costs measured at the start (as mtpc generate --tree auto); a tree takes no --window")
    acceptance: Sequence[str] = setting(
        ("block",), nargs="+", choices=ACCEPTANCE_RULES,
        help="speculative-sampling rules to compare side by side: block (block verification, the decoder's "
             "default) and/or token (token by token); greedy decoding is the same under both")
    draft_temperatures: Sequence[float | None] = setting(  # None: the target's temperature
        (None,), flag="--draft-temperature", nargs="+", type=target_or_temperature, metavar="T",
        help="temperatures the circuit drafts at when sampling, compared side by side: 'target' (the "
             "verifier's own, the decoder's default) and/or numbers > 0 (1: the circuit as trained)")
    peers: Sequence[str] = setting(
        (), nargs="+", metavar="PEER",
        help="also run transformers' own decoders: prompt-lookup[:K] (default K 10), assisted:DIR (a small draft "
             "LM folder), static (generate with cache_implementation=\"static\") and/or generate (plain generate, "
             "transformers' usual dynamic cache); and llama.cpp: llama.cpp's own decoding of a --model GGUF file "
             "(needs llama-cpp-python)")
    compile: bool = setting(
        False, help="also run plain decoding with a static KV cache, eager and torch.compile'd, and every head "
                    "variant again with its cycle compiled (the verify call as one graph, acceptance and draft as another; "
                    "compiled in the "
                    "warm-up); speed-ups are then reported against the compiled baseline too")
    max_repetition: float | None = setting(
        None, type=unit_interval, metavar="R",
        help="leave out prompts whose plain continuation repeats more than R of its 8-token n-grams (degenerate "
             "loops; reported)")
    dtype: str = setting("fp32", type=dtype_name, help=HELP_DTYPE)
    head_dtype: str | None = setting(None, type=dtype_name,
                                     help="cast the heads for inference (default: as saved)")
    device: str = setting("auto", help="auto, cpu, cuda, cuda:1, ...")
    threads: int | None = setting(None, type=int_in(1, MAX_THREADS), help="torch CPU threads (default: torch's choice)")
    seed: int = setting(0, type=parse_seed, help="random seed (prompt choice, sampling)")
    out: str | None = setting(None, help="folder for bench.json, bench.md, tradeoff.png")
    progress: bool = setting(True, flag="--no-progress", help="no progress bar")
    batch_size: int | None = setting(  # `mtpc.bench.batch`
        None, type=int_in(1, MAX_BATCH), metavar="B",
        help="decode the prompts in batches of B left-padded rows, against plain batched decoding and "
             "transformers' batched generate (--num-prompts must be a multiple of B)")
    warmup_tokens: int = 32
    val_fraction: float = 0.02  # corpus prompts come from this held-out split (mtpc tiny-lm's default)

    def sampling(self) -> Sampling:
        """The target every decoder of the bench follows (`--mode greedy`, or sampled at `--temperature`)."""
        return GREEDY if self.mode == "greedy" else Sampling(self.temperature, self.top_k, self.top_p)


@dataclass
class Variant:
    label: str
    entry: HeadEntry
    lookup: bool
    window: int  # the most tokens one cycle can commit
    decoder: SpeculativeDecoder
    compiled: bool = False  # the cycle step runs through torch.compile
    width: int | str | None = None  # the requested verify width of the circuit window (None: n; "adaptive")
    tree: int | None = None  # a tree's node budget (None: a chain)
    tree_auto: dict | None = None  # `--tree auto`: what the choice expected (tokens a cycle, cost), and from what
    auto: dict | None = None  # `--window auto`: what `choose_decoding` chose and expected
    pace: tuple | None = None  # `--window auto`: (PlainDecoder, PaceCheck): paced as `mtpc generate` paces a prompt
    acceptance: str = "block"  # the speculative-sampling rule, one of ACCEPTANCE_RULES
    draft_temperature: float | None = None  # the circuit's sampling temperature (None: the target's)
