"""`mtpc bench`: throughput of circuit draft heads against plain autoregressive decoding of the same LM.

    mtpc bench --model DIR --heads HEAD_DIR... (--prompts FILE [--chat] | --corpus PATH) [--num-prompts N]
               [--max-new-tokens N] [--mode greedy|sample] [--repeats K] [--out DIR]
               [--lookup off|on|both] [--window K|adaptive ...]
               [--peers prompt-lookup[:K] assisted:DIR static generate llama.cpp] [--compile] [--max-repetition R]

What is measured (the paper's metrics, Section 4.2), per head and decoder variant (prompt lookup,
the circuit window's verify width, eager or compiled), over `K` disjoint prompt sets of `N` prompts each:

- `mu_acc`: tokens committed per cycle (the accepted length; plain decoding: 1),
- `mu_lat`: seconds per cycle, prefill excluded,
- `tok/s`: generated tokens / decoding time (prefill excluded), and its ratio to plain decoding and to
  the FF head (paired: same prompt set, same process),
- `max tok/s`: `window / mu_lat`, the throughput if every draft were accepted. This decoder commits at
  most `window` tokens per cycle (`n`, or `1 + K` with prompt lookup: the verifier's next token is
  carried into the next cycle, not committed), so the bound uses `n`, not `n + 1`,
- `rep8`: how repetitive the outputs are (the share of 8-byte n-grams already seen; `bench_prompts.
  repetition`), next to every speed-up: copying drafters shine on degenerate loops. `--max-repetition R`
  leaves out the prompts whose plain continuation is above `R` (reported),
- a latency breakdown per cycle, taken inside the real decoding loop with PyTorch module hooks (public
  API, nothing patched): `head` (the head's matmul), `circuit` (from the head's output to the
  backbone call: the circuit's draft, its marginals/conditionals, the first token's decision),
  `backbone` (the one backbone call: verifier + draft path), `accept` (after the backbone call until
  the next cycle: acceptance, residuals after a rejection, cache crop, bookkeeping). A compiled
  variant runs its verify call as one graph and its acceptance and draft as another
  (`SpeculativeDecoder.verify_step`, `decide_step`): its `backbone` phase is the two, `head` only the eager choice of the window, `accept` the host
  read and bookkeeping after it (`benchmarks/bench_cycle.py` times the steps one by one).

A subword LM (its own tokenizer files in the folder) is measured through its tokenizer: prompts are its
tokens, `mu_acc` counts them, and `bytes_per_cycle` (`bytes/cycle`) is the bytes of text the committed
tokens spell per cycle, the measure comparable across vocabularies (for a byte LM the two agree but for
specials).

Peers (`mtpc.bench.peers`): transformers' prompt lookup, assisted generation and plain `generate` (static or
its default dynamic cache), llama.cpp on a GGUF `--model` (llama-cpp-python), and with `--compile` plain
decoding with a static KV cache, eager and `torch.compile`d (speed-ups are then also reported against the compiled baseline). Prompts come from
`mtpc.bench.prompts` (`--chat`: each prompt of the file a user turn of the model's chat template, as
`mtpc generate --chat` renders it, every decoder stopping where generate's answer ends), one timed
generation from `mtpc.bench.timing` (with the loop's own `mtpc.decoding.clock`), the report from
`mtpc.bench.report`; this module loads, runs and interleaves.

Every prompt is decoded by plain autoregressive decoding (`mtpc.decoding.plain.PlainDecoder`), by
every peer and by every variant, interleaved prompt by prompt (rotating the order), so machine noise hits all of
them alike. In greedy mode every speculative output is compared token for token with the plain greedy
output of the same prompt, and the report counts the mismatches (`mtpc bench` exits with status 1 if
there is any). Timing: `time.perf_counter` (the decoder's own cycle clock) on CPU, CUDA events on CUDA.
"""


from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch

from .. import checks
from ..lm import loading
from ..decoding import PhaseClock, PlainDecoder, SpeculativeDecoder, backbone_marks, generate_paced
from ..decoding.choice.auto_trees import recorded_acceptance
from ..errors import InputError, MtpcError
from .config import DTYPES, MODES, BenchConfig, Variant
from .variants import bench_tokenizer, load_bench
from .peers import Peer, build_peers, parse_peer
from .prompts import answer_end_ids, check_chat_source, load_prompts
from .report import build_report, drop_repetitive, write_outputs
from .timing import Run, run_one

__all__ = ["run_bench", "measure"]

# --------------------------------------------------------------------------- the bench

def run_bench(cfg: BenchConfig, decoder_cls: Callable[..., SpeculativeDecoder] = SpeculativeDecoder) -> dict:
    """Measure every head (x variant) and plain decoding on the same prompts; returns the report dict
    and writes `bench.json`, `bench.md` and `tradeoff.png` into `cfg.out` when it is set.

    `decoder_cls` builds the decoders (`SpeculativeDecoder` or a subclass, e.g. to study a change)."""
    _check_config(cfg)
    _check_inputs(cfg)
    if cfg.batch_size is not None:
        from .batch import run_batch_bench

        return run_batch_bench(cfg, decoder_cls)
    specs = [parse_peer(text, cfg.model) for text in cfg.peers]
    loaded = load_bench(cfg, decoder_cls)
    device, dtype, tok, base, variants = loaded.device, loaded.dtype, loaded.tok, loaded.base, loaded.variants
    prompts = load_prompts(cfg, tok)
    sets = [prompts[k * cfg.num_prompts:(k + 1) * cfg.num_prompts] for k in range(cfg.repeats)]
    ends = answer_end_ids(cfg, tok)
    peers = build_peers(cfg, base, specs, loaded.load_model, dtype, device, ends)
    runs = measure(cfg, base, variants, peers, sets, device, ends)
    dropped = None
    if cfg.max_repetition is not None:
        runs, dropped = drop_repetitive(runs, cfg.max_repetition)
        if not runs["plain"]:
            raise MtpcError(f"every prompt's plain continuation repeats more than --max-repetition "
                            f"{cfg.max_repetition} of its 8-grams; nothing is left to report")
    report = build_report(cfg, base, variants, peers, runs, device, dropped, tok)
    if cfg.out:
        write_outputs(report, Path(cfg.out))
    return report


def _check_config(cfg: BenchConfig) -> None:
    if cfg.mode not in MODES:
        raise InputError(f"mode must be 'greedy' or 'sample', got {cfg.mode!r}")
    checks.check_sampling_settings(cfg)  # whatever the mode: a greedy bench's --temperature is still checked
    if cfg.mode == "greedy" and any(t is not None for t in cfg.draft_temperatures):
        raise InputError("--draft-temperature is the temperature a draft head samples at: give --mode sample "
                         "(a greedy bench drafts the circuit's argmax)")  # as generate refuses it with --temperature 0
    if not cfg.heads:
        raise InputError("give at least one head folder")
    if cfg.dtype not in DTYPES or cfg.head_dtype not in (None, *DTYPES):
        raise InputError(f"dtype and head_dtype must be one of {sorted(DTYPES)}")
    for name in ("num_prompts", "repeats", "max_new_tokens"):
        if getattr(cfg, name) < 1:
            raise InputError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.lookup_tokens < 1:
        raise InputError(f"lookup tokens must be >= 1, got {cfg.lookup_tokens}")
    if cfg.max_repetition is not None and not 0 <= cfg.max_repetition <= 1:
        raise InputError(f"max repetition is a share of 8-grams in [0, 1], got {cfg.max_repetition}")
    if cfg.batch_size is not None and not (isinstance(cfg.batch_size, int) and cfg.batch_size >= 1):
        raise InputError(f"batch size must be an integer >= 1, got {cfg.batch_size!r}")
    if cfg.batch_size is not None and (cfg.peers or cfg.max_repetition is not None):
        raise InputError("--batch-size measures batches against plain batched decoding and transformers' batched "
                         "generate; --peers and --max-repetition are per-prompt options")
    check_chat_source(cfg)
    checks.tree_and_window(cfg.trees, cfg.windows)  # the rule mtpc generate applies to its one of each
    labels = [Path(p).name for p in cfg.heads]
    if len(set(labels)) != len(labels):
        raise InputError(f"head folders must have distinct names (they label the report): {labels}")


def _check_inputs(cfg: BenchConfig) -> None:
    """Files and how they fit, before any model is loaded: model folder, head folders (hidden size,
    states within the vocabulary; with --tree auto, the recorded acceptance), prompts file, output folder."""
    info = bench_tokenizer(cfg)[0]  # a subword model's own tokenizer, read and checked before any weights
    for path in cfg.heads:
        spec = loading.json_object(loading.head_folder(path) / "head.json", "")
        hidden, graph = spec.get("hidden_size"), spec.get("graph")
        if isinstance(hidden, int):
            checks.hidden_sizes_match(hidden, info.hidden_size, path, cfg.model)
        vocabulary = spec.get("vocabulary")
        if isinstance(vocabulary, list) and vocabulary and all(isinstance(t, int) for t in vocabulary):
            checks.states_fit_vocabulary(max(vocabulary) + 1, info.vocab_size, f"head {path} with model {cfg.model}")
        elif isinstance(graph, dict) and isinstance(graph.get("states"), int):
            checks.states_fit_vocabulary(graph["states"], info.vocab_size, f"head {path} with model {cfg.model}")
        if "auto" in cfg.trees:
            recorded_acceptance(path, Path(path).name)  # read again, the same way, when the tree is chosen
        if "auto" in cfg.windows:
            recorded_acceptance(path, Path(path).name, flag="--window auto")
    if cfg.prompts is not None and not Path(cfg.prompts).is_file():
        raise InputError(f"--prompts {cfg.prompts!r} is not a file")
    if cfg.corpus not in (None, "stdlib"):
        checks.data_source(cfg.corpus, "--corpus")
    if cfg.out:
        checks.output_folder(cfg.out)


def measure(cfg: BenchConfig, base, variants: Sequence[Variant], peers: Sequence[Peer], sets,
            device: torch.device, eos: set[int]) -> dict[str, list[list[Run]]]:
    """`runs[label][k]` = the runs of set `k` ("plain" is plain decoding). Every prompt is decoded by
    every variant, in an order that rotates from prompt to prompt, each stopping at any id of `eos`."""
    from tqdm.auto import tqdm

    cuda = device.type == "cuda"
    tasks = ([("plain", _plain_task(cfg, base, eos, cuda))] + [(p.label, p.task) for p in peers]
             + [(v.label, _spec_task(cfg, v, eos, cuda)) for v in variants])
    compiled = {v.label for v in variants if v.compiled}
    longest = max((p for prompt_set in sets for p in prompt_set), key=len)
    _warm_up([t for t in tasks if t[0] not in compiled], sets[0][0], cfg.warmup_tokens, device)
    # a compiled decoder compiles for the caches it writes: warmed on the longest prompt and the whole budget,
    # it allocates (and compiles) its caches here, not in a timed generation's prefill
    _warm_up([t for t in tasks if t[0] in compiled], longest, cfg.max_new_tokens, device)
    runs = {label: [[] for _ in sets] for label, _ in tasks}
    total = len(tasks) * sum(len(s) for s in sets)
    with tqdm(total=total, desc="mtpc bench", unit="gen", disable=not cfg.progress, dynamic_ncols=True) as bar:
        for k, prompt_set in enumerate(sets):
            for i, prompt in enumerate(prompt_set):
                ids = torch.tensor([prompt], dtype=torch.long, device=device)
                shift = (k * len(prompt_set) + i) % len(tasks)
                for label, task in tasks[shift:] + tasks[:shift]:
                    seed = (cfg.seed * 1_000_003 + k * 10_007 + i) % 2**63  # a valid seed for any --seed
                    runs[label][k].append(task(ids, cfg.max_new_tokens, seed))
                    bar.update(1)
    return runs


def _generator(seed: int, device: torch.device) -> torch.Generator | None:
    """A seeded CPU generator; on CUDA the global generators are seeded instead and None is returned
    (the decoder draws its acceptance uniforms on the CPU and circuit samples on the device, so no
    single generator object serves both)."""
    if device.type == "cuda":
        torch.manual_seed(seed)
        return None
    return torch.Generator().manual_seed(seed)


def _plain_task(cfg: BenchConfig, base, eos: set[int], cuda: bool) -> Callable:
    embed, ends = backbone_marks(base)
    decoder, sampling = PlainDecoder(base), cfg.sampling()

    def task(ids, budget: int, seed: int) -> Run:
        gen = _generator(seed, ids.device)
        return run_one(lambda: decoder.generate(ids, budget, sampling, eos_token_id=eos, generator=gen),
                       PhaseClock(None, embed, ends, cuda), stats_clock=not cuda, prompt_tokens=ids.shape[1])

    return task


def _spec_task(cfg: BenchConfig, variant: Variant, eos: set[int], cuda: bool) -> Callable:
    decoder, sampling = variant.decoder, cfg.sampling()
    parts = decoder.backbone.parts

    def task(ids, budget: int, seed: int) -> Run:
        gen = _generator(seed, ids.device)
        if variant.compiled:  # no hooks inside compiled steps: the decoder stamps the draft and the verify call
            clock = PhaseClock(None, None, [], cuda)
            extra = {"phase_clock": clock}
        else:
            clock, extra = PhaseClock(decoder.head, parts.embed, [parts.norm, parts.lm_head], cuda), {}
        if variant.pace is not None:  # `--window auto`: paced, as mtpc generate decodes one prompt
            plain, pace = variant.pace
            return run_one(lambda: generate_paced(decoder, plain, ids, budget, sampling, pace=pace, eos_token_id=eos,
                                                  generator=gen, **extra),
                           clock, stats_clock=not cuda, prompt_tokens=ids.shape[1])
        return run_one(lambda: decoder.generate(ids, budget, sampling, eos_token_id=eos, generator=gen, **extra),
                       clock, stats_clock=not cuda, prompt_tokens=ids.shape[1])

    return task


def _warm_up(tasks, prompt: list[int], tokens: int, device: torch.device) -> None:
    """One short untimed generation per task (first-call allocations, lazy initialisation)."""
    if tokens <= 0:
        return
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    for _, task in tasks:
        task(ids, tokens, 0)


