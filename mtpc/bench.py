"""`mtpc bench`: throughput of circuit draft heads against plain autoregressive decoding of the same LM.

    mtpc bench --model DIR --heads HEAD_DIR... (--prompts FILE | --corpus PATH) [--num-prompts N]
               [--max-new-tokens N] [--mode greedy|sample] [--repeats K] [--out DIR]

What is measured (the paper's metrics, Section 4.2), per head and decoder variant (draft strategy,
bonus-conditioned drafting), over `K` disjoint prompt sets of `N` prompts each:

- `mu_acc`: tokens committed per cycle (the accepted length; plain decoding: 1),
- `mu_lat`: seconds per cycle, prefill excluded,
- `tok/s`: generated tokens / decoding time (prefill excluded), and its ratio to plain decoding and to
  the FF head (paired: same prompt set, same process),
- `max tok/s`: `n / mu_lat`, the throughput if every draft were accepted. This decoder commits at most
  `n` tokens per cycle (the verifier's next token is carried into the next cycle, not committed), so
  the bound uses `n`, not `n + 1`,
- a latency breakdown per cycle, taken inside the real decoding loop with PyTorch module hooks (public
  API, nothing patched): `head` (the head's matmul), `circuit` (from the head's output to the
  backbone call: the circuit's draft, its marginals/conditionals, the first token's decision),
  `backbone` (the one backbone call: verifier + draft path), `accept` (after the backbone call until
  the next cycle: acceptance, residuals after a rejection, cache crop, bookkeeping).

Every prompt is decoded by plain autoregressive decoding (`mtpc.decode.generate_autoregressive`) and
by every variant, interleaved prompt by prompt (rotating the order), so machine noise hits all of
them alike. In greedy mode every speculative output is compared token for token with the plain greedy
output of the same prompt, and the report counts the mismatches (`mtpc bench` exits with status 1 if
there is any). Timing: `time.perf_counter` (the decoder's own cycle clock) on CPU, CUDA events on CUDA.
"""

from __future__ import annotations

import json
import platform
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from . import checks
from .decode import DRAFT_STRATEGIES, SpeculativeDecoder, generate_autoregressive
from .head import MTPHead, load_head
from .errors import InputError
from .tokenizer import ByteTokenizer

__all__ = ["BenchConfig", "run_bench", "load_prompts", "format_table", "write_markdown", "plot_tradeoff",
           "PhaseClock", "split_phases"]

PHASES = ("head", "circuit", "backbone", "accept")
DTYPES = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16}
LORA_DIR = "lora"  # where `mtpc train` saves a head's draft-path adapter (mtpc.train.LORA_DIR)


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
    drafts: Sequence[str] = ("conditional",)  # greedy draft strategies to compare
    bonus: Sequence[bool] = (False,)  # plain and/or bonus-conditioned drafting
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


# --------------------------------------------------------------------------- prompts

def load_prompts(cfg: BenchConfig, tok: ByteTokenizer) -> list[list[int]]:
    """`repeats * num_prompts` prompts (token ids), from `cfg.prompts` or sampled from `cfg.corpus`."""
    need = cfg.repeats * cfg.num_prompts
    if (cfg.prompts is None) == (cfg.corpus is None):
        raise InputError("give exactly one of prompts (a file) or corpus (a path)")
    if cfg.prompts is not None:
        prompts = prompts_from_file(Path(cfg.prompts), tok)
        if len(prompts) < need:
            raise InputError(f"{cfg.prompts} has {len(prompts)} prompts; {cfg.repeats} sets of {cfg.num_prompts} "
                             f"need {need}")
        return prompts[:need]
    return prompts_from_corpus(cfg.corpus, tok, need, cfg.prompt_len, cfg.seed, cfg.val_fraction)


def prompts_from_file(path: Path, tok: ByteTokenizer) -> list[list[int]]:
    """`.jsonl`: one JSON string or `{"prompt": ...}` per line; otherwise one prompt per non-empty line.
    Each prompt starts with `<bos>`, like the training documents."""
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="surrogateescape").splitlines(), 1):
        if not line.strip():
            continue
        text = line
        if path.suffix == ".jsonl":
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{number}: invalid JSON: {e.msg}") from None
            text = record.get("prompt") if isinstance(record, dict) else record
            if not isinstance(text, str):
                raise InputError(f"{path}:{number}: expected a JSON string or an object with a string 'prompt'")
        prompts.append(tok.encode(text, add_bos=True))
    return prompts


def prompts_from_corpus(corpus: str, tok: ByteTokenizer, count: int, length: int, seed: int,
                        val_fraction: float) -> list[list[int]]:
    """`count` distinct spans of `length` tokens from the held-out documents of `corpus` (the same
    deterministic split `mtpc tiny-lm` and `mtpc train` use), each starting at a line start."""
    from .data import load_documents, split_documents

    docs, _ = load_documents(None if corpus == "stdlib" else corpus, tok)
    _, held_out = split_documents(docs, val_fraction)
    candidates = [(d, s) for d in held_out for s in _line_starts(d.tokens, length)]
    if len(candidates) < count:
        raise InputError(f"the held-out part of {corpus} has only {len(candidates)} spans of {length} tokens; "
                         f"{count} prompts were asked for")
    rng = random.Random(seed)
    picked = rng.sample(candidates, count)
    return [d.tokens[s:s + length].astype("int64").tolist() for d, s in picked]


def _line_starts(tokens, length: int, step: int = 512) -> list[int]:
    """Offsets (at most one per `step` tokens) where a span of `length` tokens starts a line."""
    newline = ord("\n")
    starts, last = [], -step
    for i in range(len(tokens) - length):
        if (i == 0 or tokens[i - 1] == newline) and i - last >= step:
            starts.append(i)
            last = i
    return starts


# --------------------------------------------------------------------------- heads and variants

@dataclass
class HeadEntry:
    """One head folder, loaded: the head, the model its decoder runs (a PeftModel with the head's LoRA
    adapter, or the shared base model), and what the report says about it."""

    label: str
    path: str
    head: MTPHead
    model: torch.nn.Module
    lora_layers: int
    info: dict


@dataclass
class Variant:
    label: str
    entry: HeadEntry
    draft: str
    bonus: bool
    decoder: SpeculativeDecoder


def load_model(path: str, dtype: torch.dtype, device: torch.device, allow_non_byte_vocab: bool = True
               ) -> torch.nn.Module:
    """The LM in eval mode (`checks.open_model`: a folder that cannot be one is an `InputError`)."""
    model, _ = checks.open_model(path, allow_non_byte_vocab=allow_non_byte_vocab, dtype=dtype)
    return model.to(device).eval()


def load_head_entry(path: str, base: torch.nn.Module, model_path: str, dtype: torch.dtype,
                    head_dtype: torch.dtype | None, device: torch.device) -> HeadEntry:
    """A head folder written by `mtpc train` (or `save_head`): head, LoRA adapter if any, its config."""
    from safetensors import SafetensorError

    folder = checks.head_folder(path)
    try:
        head = load_head(folder, device=device)
    except (ValueError, KeyError, OSError, SafetensorError) as e:
        raise InputError(f"head folder {path}: {e}") from None
    head = head.to(head_dtype) if head_dtype is not None else head
    head.eval()
    train_cfg = _read_json(folder / "train_config.json")
    lora_dir = folder / LORA_DIR
    model, k = base, 0
    if (lora_dir / "adapter_config.json").exists():
        from peft import PeftModel

        k = len(_read_json(lora_dir / "adapter_config.json").get("layers_to_transform") or [])
        model = PeftModel.from_pretrained(load_model(model_path, dtype, device), str(lora_dir)).eval()
    info = head_info(head, train_cfg, k)
    return HeadEntry(folder.name, str(folder), head, model, k, info)


def head_info(head: MTPHead, train_cfg: dict, lora_layers: int) -> dict:
    """Structure, window, size and training summary of a head, for the report."""
    circuit = train_cfg.get("circuit")
    structure = Path(circuit).stem if isinstance(circuit, str) and circuit.endswith((".pc", ".json")) else None
    if structure is None:
        structure = "ff" if head.num_leaves == head.num_variables else "circuit"
    return {"structure": structure, "bindings": train_cfg.get("bindings", {}), "n": head.num_variables,
            "leaves": head.num_leaves, "parameters": head.num_weights(),
            "parameterisation": head.parameterisation, "head_dtype": str(head.dtype).removeprefix("torch."),
            "lora_layers": lora_layers, "train_steps": train_cfg.get("steps"),
            "train_seconds": train_cfg.get("train_seconds"), "val_loss": train_cfg.get("val_loss"),
            "val_accepted": train_cfg.get("val_accepted")}


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def build_variants(entries: Sequence[HeadEntry], drafts: Sequence[str], bonus: Sequence[bool], mode: str,
                   decoder_cls: Callable[..., SpeculativeDecoder]) -> list[Variant]:
    """One decoder per head x draft strategy x bonus setting (sampling mode ignores the strategy)."""
    drafts = list(dict.fromkeys(drafts)) if mode == "greedy" else ["sample"]
    bonus = list(dict.fromkeys(bonus))
    variants = []
    for entry in entries:
        for draft in drafts:
            for b in bonus:
                label = entry.label + (f"/{draft}" if len(drafts) > 1 else "") + ("/bonus" if b else "")
                decoder = decoder_cls(entry.model, entry.head, entry.lora_layers, draft="conditional"
                                      if mode == "sample" else draft, bonus=b)
                variants.append(Variant(label, entry, draft, b, decoder))
    return variants


# --------------------------------------------------------------------------- timing inside the loop

class PhaseClock:
    """Stamps points of the decoding loop through module hooks on the head (before/after its forward),
    the backbone's embedding (a backbone call starts) and its final norm / LM head (a backbone call
    may end there). CPU: `perf_counter`; CUDA: events, read after a synchronize.

    Use as a context manager around one generation; `split_phases(clock.times())` sums the phases.
    """

    def __init__(self, head: torch.nn.Module | None, embed: torch.nn.Module, ends: Sequence[torch.nn.Module],
                 cuda: bool):
        self.cuda = cuda
        self.kinds: list[str] = []
        self.marks: list = []
        self._targets = (head, embed, ends)
        self._handles = []

    def stamp(self, kind: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())
        self.kinds.append(kind)

    def _hook(self, kind: str):
        return lambda *args: self.stamp(kind)

    def __enter__(self) -> "PhaseClock":
        head, embed, ends = self._targets
        if head is not None:
            self._handles.append(head.register_forward_pre_hook(self._hook("head_start")))
            self._handles.append(head.register_forward_hook(self._hook("head_end")))
        self._handles.append(embed.register_forward_pre_hook(self._hook("backbone_start")))
        for module in ends:
            self._handles.append(module.register_forward_hook(self._hook("backbone_end")))
        return self

    def __exit__(self, *exc) -> None:
        self.stamp("end")
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def times(self) -> list[tuple[str, float]]:
        """`(kind, seconds)` for every stamp, seconds measured from the first stamp."""
        if not self.marks:
            return []
        if self.cuda:
            torch.cuda.synchronize()
            first = self.marks[0]
            return [(k, first.elapsed_time(e) / 1e3) for k, e in zip(self.kinds, self.marks)]
        return [(k, t - self.marks[0]) for k, t in zip(self.kinds, self.marks)]


def split_phases(stamps: Sequence[tuple[str, float]]) -> tuple[dict[str, float], float]:
    """Sum the time between consecutive stamps into `PHASES`; the prefill (everything up to the end of
    the first backbone call) is left out. Returns (seconds per phase, decoding seconds).

    An interval is attributed to what was running since its opening stamp: after `head_start` the
    head, after `head_end` the circuit, after `backbone_start` (or a `backbone_end` followed by another
    end of the same call) the backbone, after the last `backbone_end` of a call the acceptance."""
    totals = dict.fromkeys(PHASES, 0.0)
    prefill_end = _end_of_call(stamps, 0)
    if prefill_end is None:
        return totals, 0.0
    for i in range(prefill_end, len(stamps) - 1):
        kind, t = stamps[i]
        nxt_kind, nxt_t = stamps[i + 1]
        if kind == "head_start":
            phase = "head"
        elif kind == "head_end":
            phase = "circuit"
        elif kind == "backbone_start" or kind == "backbone_end" and nxt_kind == "backbone_end":
            phase = "backbone"
        else:
            phase = "accept"
        totals[phase] += nxt_t - t
    return totals, stamps[-1][1] - stamps[prefill_end][1]


def _end_of_call(stamps, start: int) -> int | None:
    """Index of the last `backbone_end` of the backbone call opened at or after `start`."""
    i = next((j for j in range(start, len(stamps)) if stamps[j][0] == "backbone_start"), None)
    if i is None:
        return None
    end = None
    for j in range(i + 1, len(stamps)):
        if stamps[j][0] != "backbone_end":
            break
        end = j
    return end


def _backbone_marks(model: torch.nn.Module) -> tuple[torch.nn.Module, list[torch.nn.Module]]:
    """The modules whose hooks open (embedding) and may close (final norm, LM head) a backbone call."""
    from .backbone import SplitBackbone

    parts = SplitBackbone(model).parts
    return parts.embed, [parts.norm, parts.lm_head]


# --------------------------------------------------------------------------- one generation

@dataclass
class Run:
    """One generation's numbers: tokens, cycles, decoding seconds, seconds per phase, the output."""

    tokens: int
    cycles: int
    seconds: float
    phases: dict[str, float]
    sequence: list[int]


def run_one(generate: Callable, clock: PhaseClock, stats_clock: bool) -> Run:
    """Run `generate()` under `clock`. `stats_clock`: take the decoding time from the decoder's own
    cycle clock (CPU); otherwise from the clock's stamps (CUDA events)."""
    with clock:
        out = generate()
    phases, hooked = split_phases(clock.times())
    stats = out.stats
    seconds = sum(stats.cycle_seconds) if stats_clock else hooked
    return Run(stats.new_tokens, stats.cycles, seconds, phases, out.sequences[0].tolist())


# --------------------------------------------------------------------------- the bench

def run_bench(cfg: BenchConfig, decoder_cls: Callable[..., SpeculativeDecoder] = SpeculativeDecoder) -> dict:
    """Measure every head (x variant) and plain decoding on the same prompts; returns the report dict
    and writes `bench.json`, `bench.md` and `tradeoff.png` into `cfg.out` when it is set.

    `decoder_cls` builds the decoders (`SpeculativeDecoder` or a subclass, e.g. to study a change)."""
    _check_config(cfg)
    _check_inputs(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = _device(cfg.device)
    dtype = DTYPES[cfg.dtype]
    tok = ByteTokenizer.load(cfg.model)
    base = load_model(cfg.model, dtype, device)
    head_dtype = DTYPES[cfg.head_dtype] if cfg.head_dtype else None
    entries = [load_head_entry(p, base, cfg.model, dtype, head_dtype, device) for p in cfg.heads]
    variants = build_variants(entries, cfg.drafts, cfg.bonus, cfg.mode, decoder_cls)
    prompts = load_prompts(cfg, tok)
    sets = [prompts[k * cfg.num_prompts:(k + 1) * cfg.num_prompts] for k in range(cfg.repeats)]
    runs = measure(cfg, base, variants, sets, device, tok.eos_id)
    report = build_report(cfg, base, variants, runs, device, tok)
    if cfg.out:
        write_outputs(report, Path(cfg.out))
    return report


def _check_config(cfg: BenchConfig) -> None:
    if cfg.mode not in ("greedy", "sample"):
        raise InputError(f"mode must be 'greedy' or 'sample', got {cfg.mode!r}")
    if not cfg.heads:
        raise InputError("give at least one head folder")
    unknown = [d for d in cfg.drafts if d not in DRAFT_STRATEGIES]
    if unknown:
        raise InputError(f"unknown draft strategies {unknown}; choose from {DRAFT_STRATEGIES}")
    if cfg.dtype not in DTYPES or cfg.head_dtype not in (None, *DTYPES):
        raise InputError(f"dtype and head_dtype must be one of {sorted(DTYPES)}")
    for name in ("num_prompts", "repeats", "max_new_tokens"):
        if getattr(cfg, name) < 1:
            raise InputError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    labels = [Path(p).name for p in cfg.heads]
    if len(set(labels)) != len(labels):
        raise InputError(f"head folders must have distinct names (they label the report): {labels}")


def _check_inputs(cfg: BenchConfig) -> None:
    """Files and how they fit, before any model is loaded: model folder, head folders (hidden size,
    states within the vocabulary), prompts file, output folder."""
    info = checks.model_info(cfg.model, allow_non_byte_vocab=cfg.allow_non_byte_vocab)
    for path in cfg.heads:
        spec = checks.json_object(checks.head_folder(path) / "head.json", "")
        hidden, graph = spec.get("hidden_size"), spec.get("graph")
        if isinstance(hidden, int):
            checks.hidden_sizes_match(hidden, info.hidden_size, path, cfg.model)
        if isinstance(graph, dict) and isinstance(graph.get("states"), int):
            checks.states_fit_vocabulary(graph["states"], info.vocab_size, f"head {path} with model {cfg.model}")
    if cfg.prompts is not None and not Path(cfg.prompts).is_file():
        raise InputError(f"--prompts {cfg.prompts!r} is not a file")
    if cfg.corpus not in (None, "stdlib"):
        checks.data_source(cfg.corpus, "--corpus")
    if cfg.out:
        checks.output_folder(cfg.out)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def measure(cfg: BenchConfig, base, variants: Sequence[Variant], sets, device: torch.device,
            eos: int) -> dict[str, list[list[Run]]]:
    """`runs[label][k]` = the runs of set `k` ("plain" is plain decoding). Every prompt is decoded by
    every variant, in an order that rotates from prompt to prompt."""
    from tqdm.auto import tqdm

    cuda = device.type == "cuda"
    tasks = [("plain", _plain_task(cfg, base, eos, cuda))] + [(v.label, _spec_task(cfg, v, eos, cuda))
                                                               for v in variants]
    _warm_up(tasks, sets[0][0], cfg.warmup_tokens, device)
    runs = {label: [[] for _ in sets] for label, _ in tasks}
    total = len(tasks) * sum(len(s) for s in sets)
    with tqdm(total=total, desc="mtpc bench", unit="gen", disable=not cfg.progress, dynamic_ncols=True) as bar:
        for k, prompt_set in enumerate(sets):
            for i, prompt in enumerate(prompt_set):
                ids = torch.tensor([prompt], dtype=torch.long, device=device)
                shift = (k * len(prompt_set) + i) % len(tasks)
                for label, task in tasks[shift:] + tasks[:shift]:
                    seed = cfg.seed * 1_000_003 + k * 10_007 + i
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


def _sampling(cfg: BenchConfig) -> dict:
    if cfg.mode == "greedy":
        return {"do_sample": False}
    return {"do_sample": True, "temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p}


def _plain_task(cfg: BenchConfig, base, eos: int, cuda: bool) -> Callable:
    embed, ends = _backbone_marks(base)

    def task(ids, budget: int, seed: int) -> Run:
        gen = _generator(seed, ids.device)
        return run_one(lambda: generate_autoregressive(base, ids, budget, eos_token_id=eos, generator=gen,
                                                       **_sampling(cfg)),
                       PhaseClock(None, embed, ends, cuda), stats_clock=not cuda)

    return task


def _spec_task(cfg: BenchConfig, variant: Variant, eos: int, cuda: bool) -> Callable:
    decoder = variant.decoder
    parts = decoder.backbone.parts

    def task(ids, budget: int, seed: int) -> Run:
        gen = _generator(seed, ids.device)
        clock = PhaseClock(decoder.head, parts.embed, [parts.norm, parts.lm_head], cuda)
        return run_one(lambda: decoder.generate(ids, budget, eos_token_id=eos, generator=gen, **_sampling(cfg)),
                       clock, stats_clock=not cuda)

    return task


def _warm_up(tasks, prompt: list[int], tokens: int, device: torch.device) -> None:
    """One short untimed generation per task (first-call allocations, lazy initialisation)."""
    if tokens <= 0:
        return
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    for _, task in tasks:
        task(ids, tokens, 0)


# --------------------------------------------------------------------------- the report

def set_metrics(runs: Sequence[Run]) -> dict:
    """Metrics of one prompt set (sums over its prompts)."""
    tokens = sum(r.tokens for r in runs)
    cycles = sum(r.cycles for r in runs)
    seconds = sum(r.seconds for r in runs)
    phases = {p: sum(r.phases[p] for r in runs) for p in PHASES}
    return {"tokens": tokens, "cycles": cycles, "seconds": seconds,
            "mu_acc": tokens / cycles if cycles else 0.0,
            "mu_lat": seconds / cycles if cycles else 0.0,
            "tok_s": tokens / seconds if seconds > 0 else 0.0,
            "phases_per_cycle": {p: phases[p] / cycles if cycles else 0.0 for p in PHASES}}


def mean_std(values: Sequence[float]) -> dict:
    values = list(values)
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def greedy_check(variant_runs: Sequence[Sequence[Run]], plain_runs: Sequence[Sequence[Run]]) -> dict:
    """Compare every output with plain greedy decoding of the same prompt."""
    mismatches = []
    compared = 0
    for k, (vs, ps) in enumerate(zip(variant_runs, plain_runs)):
        for i, (v, p) in enumerate(zip(vs, ps)):
            compared += 1
            if v.sequence != p.sequence:
                mismatches.append({"set": k, "prompt": i, "first_difference": _first_difference(v.sequence,
                                                                                                 p.sequence)})
    return {"compared": compared, "identical": compared - len(mismatches), "mismatches": mismatches}


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def ff_reference(variant: Variant, variants: Sequence[Variant]) -> Variant | None:
    """The FF head the variant is compared with: same window, same draft strategy and bonus setting
    when there is one, else any FF head with the same window."""
    ffs = [v for v in variants if v.entry.info["structure"] == "ff" and v.entry.info["n"] == variant.entry.info["n"]]
    same = [v for v in ffs if (v.draft, v.bonus) == (variant.draft, variant.bonus) and v.entry.lora_layers == 0]
    return (same or ffs or [None])[0]


def build_report(cfg: BenchConfig, base, variants: Sequence[Variant], runs: dict, device: torch.device,
                 tok: ByteTokenizer) -> dict:
    plain_sets = [set_metrics(r) for r in runs["plain"]]
    plain = {"per_set": plain_sets, **_aggregate(plain_sets)}
    rows = []
    for v in variants:
        sets = [set_metrics(r) for r in runs[v.label]]
        ff = ff_reference(v, variants)
        row = {"label": v.label, "head": v.entry.path, "draft": v.draft if cfg.mode == "greedy" else "sample",
               "bonus": v.bonus, **v.entry.info, "per_set": sets, **_aggregate(sets),
               "speedup_plain": mean_std([s["tok_s"] / p["tok_s"] for s, p in zip(sets, plain_sets)]),
               "ff_reference": ff.label if ff else None}
        if ff is not None:
            ff_sets = [set_metrics(r) for r in runs[ff.label]]
            row["speedup_ff"] = mean_std([s["tok_s"] / f["tok_s"] for s, f in zip(sets, ff_sets)])
        row["max_tok_s"] = v.entry.info["n"] / row["mu_lat"]["mean"] if row["mu_lat"]["mean"] else 0.0
        step = plain["mu_lat"]["mean"]
        row["draft_cost_of_lm_step"] = ((row["phases_ms"]["head"] + row["phases_ms"]["circuit"]) / 1e3 / step
                                        if step else None)
        if cfg.mode == "greedy":
            row["greedy_check"] = greedy_check(runs[v.label], runs["plain"])
        rows.append(row)
    return {"format": "mtpc-bench/1", "config": _config_dict(cfg), "environment": _environment(device, base),
            "max_tok_s_rule": "n tokens per cycle (the decoder commits at most n per cycle) / mean cycle latency",
            "timer": "cuda events" if device.type == "cuda" else "time.perf_counter (the decoder's cycle clock)",
            "greedy_identical": all(not r["greedy_check"]["mismatches"] for r in rows) if cfg.mode == "greedy"
            else None,
            "context_warning": _context_warning(cfg, base), "plain": plain, "heads": rows}


def _aggregate(sets: Sequence[dict]) -> dict:
    phases = {p: statistics.fmean(s["phases_per_cycle"][p] for s in sets) * 1e3 for p in PHASES}
    return {"mu_acc": mean_std(s["mu_acc"] for s in sets), "mu_lat": mean_std(s["mu_lat"] for s in sets),
            "tok_s": mean_std(s["tok_s"] for s in sets), "phases_ms": phases,
            "tokens": sum(s["tokens"] for s in sets), "cycles": sum(s["cycles"] for s in sets)}


def _config_dict(cfg: BenchConfig) -> dict:
    out = asdict(cfg)
    out["heads"], out["drafts"], out["bonus"] = list(cfg.heads), list(cfg.drafts), list(cfg.bonus)
    return out


def _environment(device: torch.device, base) -> dict:
    env = {"device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "python": platform.python_version(), "machine": platform.machine(), "processor": platform.processor(),
           "model_parameters": sum(p.numel() for p in base.parameters()),
           "model_config": {k: getattr(base.config, k, None) for k in
                            ("hidden_size", "num_hidden_layers", "vocab_size", "max_position_embeddings")}}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    env["code"] = _code_version()
    return env


def _code_version() -> str | None:
    """`git describe` of the checkout this module runs from (with `-dirty` for local changes), if any."""
    import subprocess

    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _context_warning(cfg: BenchConfig, base) -> str | None:
    limit = getattr(base.config, "max_position_embeddings", None)
    longest = cfg.prompt_len + cfg.max_new_tokens
    if cfg.corpus is not None and limit and longest > limit:
        return (f"prompt_len + max_new_tokens = {longest} exceeds the model's max_position_embeddings {limit}: "
                "acceptance collapses beyond the training context")
    return None


# --------------------------------------------------------------------------- output

def _pm(stat: dict, scale: float = 1.0, digits: int = 2) -> str:
    return f"{stat['mean'] * scale:.{digits}f} ± {stat['std'] * scale:.{digits}f}"


def _check_cell(row: dict) -> str:
    check = row.get("greedy_check")
    if check is None:
        return "n/a"
    return f"{check['identical']}/{check['compared']}" + ("" if not check["mismatches"] else " MISMATCH")


TABLE_COLUMNS = ("head", "n", "LoRA", "params", "mu_acc", "mu_lat ms", "tok/s", "x plain", "x FF", "max tok/s",
                 "head ms", "circuit ms", "backbone ms", "accept ms", "draft/LM step", "greedy == plain")


def table_rows(report: dict) -> list[list[str]]:
    plain = report["plain"]
    ms = plain["phases_ms"]
    rows = [["plain (autoregressive)", "-", "-", "-", "1.00", _pm(plain["mu_lat"], 1e3), _pm(plain["tok_s"], 1, 1),
             "1.00", "-", "-", "-", "-", f"{ms['backbone']:.2f}", f"{ms['accept']:.2f}", "-", "reference"]]
    for r in report["heads"]:
        ff = r.get("speedup_ff")
        cost = r["draft_cost_of_lm_step"]
        rows.append([r["label"], str(r["n"]), str(r["lora_layers"]), f"{r['parameters'] / 1e6:.2f}M",
                     _pm(r["mu_acc"]), _pm(r["mu_lat"], 1e3), _pm(r["tok_s"], 1, 1), _pm(r["speedup_plain"]),
                     _pm(ff) if ff else "-", f"{r['max_tok_s']:.0f}",
                     *(f"{r['phases_ms'][p]:.2f}" for p in PHASES),
                     f"{cost:.0%}" if cost is not None else "-", _check_cell(r)])
    return rows


def format_table(report: dict) -> str:
    """A plain-text table (what `mtpc bench` prints)."""
    rows = [list(TABLE_COLUMNS)] + table_rows(report)
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(report: dict) -> str:
    rows = [list(TABLE_COLUMNS)] + table_rows(report)
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|")
    return "\n".join(lines)


def write_markdown(report: dict, path: Path, plot_name: str | None = None) -> None:
    cfg, env = report["config"], report["environment"]
    check = report["greedy_identical"]
    lines = [f"# mtpc bench: {cfg['mode']} decoding", "",
             f"Model `{cfg['model']}` ({env['model_parameters'] / 1e6:.2f}M parameters) on {env['device']} "
             f"({env['threads']} threads, torch {env['torch']}); {cfg['repeats']} disjoint sets of "
             f"{cfg['num_prompts']} prompts, up to {cfg['max_new_tokens']} new tokens each. Mean ± std over the "
             f"sets. Timer: {report['timer']}. `max tok/s`: {report['max_tok_s_rule']}. Phases are ms per cycle "
             "(plain: per token); `draft/LM step` = (head + circuit) / one plain decoding step.", ""]
    if check is not None:
        lines += [f"Greedy output identical to plain greedy decoding for every prompt and head: "
                  f"**{'yes' if check else 'NO'}**.", ""]
    if report["context_warning"]:
        lines += [f"Warning: {report['context_warning']}.", ""]
    lines += [markdown_table(report), ""]
    if plot_name:
        lines += [f"![accepted tokens vs cycle latency]({plot_name})", ""]
    path.write_text("\n".join(lines))


def plot_tradeoff(reports: Sequence[dict], path: Path, title: str | None = None) -> None:
    """The paper's Figure 1: mean accepted tokens per cycle against mean cycle latency, one marker per
    head (error bars: std over prompt sets), dashed iso-throughput lines at multiples of plain decoding."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.6), dpi=110)
    markers = {"ff": "o", "cp": "s", "hmm": "^", "btree": "D"}
    max_lat = max_acc = 0.0
    for report, face in zip(reports, ("C0", "C1", "C2", "C3")):
        mode = report["config"]["mode"]
        plain = report["plain"]
        for r in report["heads"]:
            lat, acc = r["mu_lat"]["mean"] * 1e3, r["mu_acc"]["mean"]
            ax.errorbar(lat, acc, xerr=r["mu_lat"]["std"] * 1e3, yerr=r["mu_acc"]["std"], fmt=markers.get(
                r["structure"], "P"), color=face, ms=6, capsize=2, alpha=0.9)
            ax.annotate(r["label"], (lat, acc), textcoords="offset points", xytext=(4, 3), fontsize=6.5)
            max_lat, max_acc = max(max_lat, lat), max(max_acc, acc)
        step = plain["mu_lat"]["mean"] * 1e3
        ax.plot([step], [1.0], marker="*", color=face, ms=11, ls="none", label=f"plain ({mode})")
        max_lat = max(max_lat, step)
    step = reports[0]["plain"]["mu_lat"]["mean"] * 1e3
    x_top, y_top = max_lat * 1.15, max(max_acc * 1.2, 1.5)
    for mult in (0.25, 0.5, 1, 2, 3):  # throughput = mult x plain: accepted = mult * latency / step
        ax.plot([0, x_top], [0, x_top * mult / step], ls="--", lw=0.7, color="grey")
        x, y = min(x_top, y_top * step / mult), min(y_top, x_top * mult / step)  # where it leaves the axes
        ax.annotate(f"{mult:g}x plain", (x, y), fontsize=6, color="grey", ha="right", va="top")
    ax.set_xlim(0, x_top)
    ax.set_ylim(0, y_top)
    ax.set_xlabel("mean cycle latency μ_lat (ms)")
    ax.set_ylabel("mean accepted tokens per cycle μ_acc")
    ax.set_title(title or "accepted tokens vs latency (dashed: iso-throughput)", fontsize=9)
    handles = [plt.Line2D([], [], marker=m, ls="none", color="k", label=s) for s, m in markers.items()]
    ax.legend(handles=handles + ax.get_legend_handles_labels()[0], fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_outputs(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=1) + "\n")
    plot_tradeoff([report], out / "tradeoff.png", title=f"{report['config']['mode']}: accepted tokens vs latency")
    write_markdown(report, out / "bench.md", "tradeoff.png")

