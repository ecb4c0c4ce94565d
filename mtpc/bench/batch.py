"""`mtpc bench --batch-size B`: throughput over batches of `B` left-padded prompts.

Every prompt set (`--repeats` sets of `--num-prompts`, a multiple of `B`) is cut into batches of `B`
consecutive prompts, left-padded to the batch's longest, and every batch is decoded, interleaved (the
order rotating from batch to batch), by:

- `plain (batched)`: plain one-token-per-step decoding of the whole batch with preallocated caches
  (`BatchedPlainDecoder`: the split backbone's per-row slots, the step run eagerly),
- `plain (batched, static + compile)`: the same step through `torch.compile` (`compile_step`, as the
  heads' cycle is compiled), with `--compile`,
- `hf generate (batched)`: transformers' own `model.generate(ids, attention_mask=...)` (greedy, or
  `do_sample=True` with the same temperature / top-k / top-p),
- every head variant (`SpeculativeDecoder.generate(ids, attention_mask=...)`; with `--compile` also
  compiled).

A batch's time is the wall time of its whole `generate` call, prefill included, for every decoder alike
(CUDA: synchronised before and after); its tokens are the new tokens of all rows (up to each row's
EOS). `tok/s` per set = tokens / seconds over its batches, mean ± std over the sets, with paired
speed-ups against each plain decoder and transformers' generate. Greedy rows are compared token for
token with the eager plain batched rows (`greedy_mismatches`).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..decoding import DecodeStats, GenerateOutput, Target
from ..decoding.backbone import BackboneState, SplitBackbone
from ..decoding.compiling import compile_step, dynamic_length
from ..decoding.inputs import eos_set
from ..decoding.verify import attended_slots, cache_length
from ..errors import InputError
from .config import BenchConfig
from .variants import load_bench
from .prompts import answer_end_ids, load_prompts
from .timing import synchronized

__all__ = ["BatchedPlainDecoder", "run_batch_bench", "format_batch_table", "write_batch_outputs"]

PLAIN, PLAIN_COMPILED, HF = "plain (batched)", "plain (batched, static + compile)", "hf generate (batched)"


# --------------------------------------------------------------------------- plain batched decoding

class BatchedPlainDecoder:
    """Plain decoding of a batch of left-padded prompts, one token per row and step, with the split
    backbone's preallocated caches (each row at its own positions; rows advance together). The prompt
    is read by an eager forward; the one-token step is eager or `torch.compile`d (fixed shapes: one
    graph per batch size and cache)."""

    def __init__(self, model: torch.nn.Module, compile: bool):
        self.backbone = SplitBackbone(model)
        if self.backbone.whole_model:
            raise InputError(f"batched plain decoding needs a family adapter; mtpc has none for model_type "
                             f"{getattr(self.backbone.config, 'model_type', None)!r}")
        self.state, self.max_len, self.batch = None, 0, 0
        cuda = self.backbone.parts.lm_head.weight.is_cuda
        self.step = compile_step(self._step, cuda) if compile else self._step

    def _step(self, tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
              starts: torch.Tensor, kv_slots: torch.Tensor) -> torch.Tensor:
        """`[B, 1]` tokens at `[B, 1]` slots and positions, attending over `kv_slots` `[S]` -> `[B, V]` logits
        (caches written in place)."""
        # a view of the caches with a constant host length: the rows' places come in as tensors
        view = BackboneState(self.state.verifier, None, 0, False)
        return self.backbone(tokens, view, position_ids=positions, slots=slots, starts=starts,
                             kv_slots=kv_slots).logits[:, -1]

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, eos_token_id=None, generator: torch.Generator | None = None,
                 pad_token_id: int = 0) -> GenerateOutput:
        B, T = input_ids.shape
        target, eos = Target(do_sample, temperature, top_k, top_p), eos_set(eos_token_id)
        if self.state is None or cache_length(T + max_new_tokens) > self.max_len or B != self.batch:
            self.max_len, self.batch = cache_length(T + max_new_tokens), B
            self.state = self.backbone.new_state(draft=False, max_len=self.max_len)
        device = input_ids.device
        starts = (T - attention_mask.sum(1)).long()  # [B] each row's padding
        slots = torch.arange(T, device=device)[None].expand(B, T)  # [B, T]
        stats = DecodeStats()
        start = time.perf_counter()
        logits = self.backbone(input_ids, self.state, keep=1, position_ids=(slots - starts[:, None]).clamp_min(0),
                               slots=slots, starts=starts).logits[:, -1]  # [B, V]
        stats.prefill_seconds = time.perf_counter() - start
        new = torch.full((B, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
        live = torch.ones(B, dtype=torch.bool, device=device)
        eos_ids = torch.tensor(sorted(eos) or [-1], device=device)
        for step in range(max_new_tokens):
            start = time.perf_counter()
            if do_sample:
                token = torch.multinomial(target.probs(logits), 1, generator=generator)[:, 0]  # [B]
            else:
                token = logits.argmax(-1)  # [B]
            new[:, step] = torch.where(live, token, pad_token_id)
            committed = int(live.sum())
            live = live & ~torch.isin(token, eos_ids)
            done = step == max_new_tokens - 1 or not bool(live.any())
            if not done:
                slot = torch.full((B, 1), T + step, device=device)
                kv_slots = dynamic_length(attended_slots(T + step + 1, self.max_len, device))  # [S]
                logits = self.step(token[:, None], slot, slot - starts[:, None], starts, kv_slots)
            stats.cycle_seconds.append(time.perf_counter() - start)
            stats.accepted_per_cycle.append(committed)
            stats.draft_accepted_per_cycle.append(0)
            stats.rows_per_cycle.append(committed)
            if done:
                new = new[:, :step + 1]
                break
        return GenerateOutput(torch.cat([input_ids, new], 1), stats)


# --------------------------------------------------------------------------- the bench

def run_batch_bench(cfg: BenchConfig, decoder_cls: Callable) -> dict:
    """Measure the heads, plain batched decoding and transformers' batched generate on batches of
    `cfg.batch_size`; returns the report (and writes bench.json and bench.md into `cfg.out`)."""
    B = cfg.batch_size
    if cfg.num_prompts % B:
        raise InputError(f"--batch-size {B}: --num-prompts ({cfg.num_prompts}) must be a multiple of it (every "
                         "prompt set is cut into whole batches)")
    loaded = load_bench(cfg, decoder_cls)
    device, tok, base, variants = loaded.device, loaded.tok, loaded.base, loaded.variants
    prompts = load_prompts(cfg, tok)
    sets = [[_batch(prompts[k * cfg.num_prompts + i:k * cfg.num_prompts + i + B], tok.pad_id, device)
             for i in range(0, cfg.num_prompts, B)] for k in range(cfg.repeats)]
    sampling, ends = _sampling(cfg), answer_end_ids(cfg, tok)
    tasks = {PLAIN: _plain_task(BatchedPlainDecoder(base, compile=False), sampling, tok, ends)}
    if cfg.compile:
        tasks[PLAIN_COMPILED] = _plain_task(BatchedPlainDecoder(base, compile=True), sampling, tok, ends)
    tasks[HF] = _hf_task(base, sampling, tok, ends)
    for v in variants:
        tasks[v.label] = _spec_task(v.decoder, sampling, tok, ends)
    runs = _measure(cfg, tasks, sets, {v.label for v in variants if v.compiled} | {PLAIN_COMPILED})
    report = batch_report(cfg, runs, [v.label for v in variants], ends, device)
    if cfg.out:
        write_batch_outputs(report, Path(cfg.out))
    return report


def _batch(rows: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """`[B, T]` ids left-padded with `pad` and their attention mask."""
    T = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (T - len(r)) + r for r in rows], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (T - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device)
    return ids, mask


def _sampling(cfg: BenchConfig) -> dict:
    if cfg.mode == "greedy":
        return {"do_sample": False}
    return {"do_sample": True, "temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p}


def _generator(seed: int, device: torch.device) -> torch.Generator | None:
    torch.manual_seed(seed)  # transformers samples with the global generator; so does every decoder on CUDA
    return torch.Generator().manual_seed(seed) if device.type == "cpu" else None


def _timed(call: Callable, cuda: bool) -> tuple:
    with synchronized(cuda):
        start = time.perf_counter()
        out = call()
    return out, time.perf_counter() - start


def _without_stats(sequences: torch.Tensor, seconds: float) -> tuple[torch.Tensor, float, None]:
    return sequences, seconds, None


def _plain_task(decoder: BatchedPlainDecoder, sampling: dict, tok, ends: set[int]) -> Callable:
    def task(ids, mask, budget: int, seed: int):
        gen = _generator(seed, ids.device)
        return _without_stats(*_timed(lambda: decoder.generate(ids, mask, budget, eos_token_id=ends, generator=gen,
                                                               pad_token_id=tok.pad_id, **sampling).sequences,
                                      ids.is_cuda))

    return task


def _hf_task(base, sampling: dict, tok, ends: set[int]) -> Callable:
    hf = dict(sampling)
    if hf["do_sample"]:  # transformers' top-k default of 50 off unless asked, as the other decoders
        hf.update(top_k=hf["top_k"] or 0, top_p=hf["top_p"] if hf["top_p"] is not None else 1.0)

    def task(ids, mask, budget: int, seed: int):
        _generator(seed, ids.device)
        return _without_stats(*_timed(lambda: base.generate(ids, attention_mask=mask, max_new_tokens=budget,
                                                            eos_token_id=sorted(ends), pad_token_id=tok.pad_id, **hf),
                                      ids.is_cuda))

    return task


def _spec_task(decoder, sampling: dict, tok, ends: set[int]) -> Callable:
    def task(ids, mask, budget: int, seed: int):
        gen = _generator(seed, ids.device)
        out, seconds = _timed(lambda: decoder.generate(ids, budget, attention_mask=mask, eos_token_id=ends,
                                                       generator=gen, pad_token_id=tok.pad_id, **sampling),
                              ids.is_cuda)
        return out.sequences, seconds, out.stats

    return task


def _measure(cfg: BenchConfig, tasks: dict[str, Callable], sets, compiled: set[str]) -> dict:
    """`runs[label][k]` = (rows' new tokens, seconds, the speculative decoder's `DecodeStats` or None) of every
    batch of set `k`, interleaved batch by batch."""
    from tqdm.auto import tqdm

    labels = list(tasks)
    batches = [b for batch_set in sets for b in batch_set]
    longest = max(batches, key=lambda b: b[0].shape[1])
    for label in labels:  # untimed: first-call allocations; compiled steps compile for the longest batch's caches
        ids, mask = longest if label in compiled else batches[0]
        tasks[label](ids, mask, cfg.max_new_tokens if label in compiled else cfg.warmup_tokens, 0)
    runs = {label: [[] for _ in sets] for label in labels}
    with tqdm(total=len(labels) * len(batches), desc="mtpc bench", unit="batch", disable=not cfg.progress) as bar:
        for k, batch_set in enumerate(sets):
            for i, (ids, mask) in enumerate(batch_set):
                shift = (k * len(batch_set) + i) % len(labels)
                seed = (cfg.seed * 1_000_003 + k * 10_007 + i) % 2**63
                for label in labels[shift:] + labels[:shift]:
                    sequences, seconds, stats = tasks[label](ids, mask, cfg.max_new_tokens, seed)
                    runs[label][k].append((_row_tokens(sequences, ids.shape[1]), seconds, stats))
                    bar.update(1)
    return runs


def _row_tokens(sequences: torch.Tensor, prompt_len: int) -> list[list[int]]:
    return [row[prompt_len:] for row in sequences.tolist()]


# --------------------------------------------------------------------------- the report

def _new_tokens(row: list[int], eos: set[int]) -> list[int]:
    """A row's new tokens up to and with its first id of `eos` (the padding after it dropped)."""
    end = next((i for i, t in enumerate(row) if t in eos), None)
    return row if end is None else row[:end + 1]


def batch_report(cfg: BenchConfig, runs: dict, heads: Sequence[str], eos: set[int], device: torch.device) -> dict:
    rates = {label: [sum(len(_new_tokens(r, eos)) for rows, _, _ in batches for r in rows)
                     / max(sum(s for _, s, _ in batches), 1e-12) for batches in per_set]
             for label, per_set in runs.items()}
    baselines = [b for b in (PLAIN, PLAIN_COMPILED, HF) if b in runs]
    rows = []
    for label in runs:
        row = {"label": label, "tok_s": _mean_std(rates[label]),
               "speedup": {b: _mean_std([x / y for x, y in zip(rates[label], rates[b])]) for b in baselines}}
        if label in heads:
            row["tokens_per_cycle"] = _tokens_per_cycle(runs[label])
        if cfg.mode == "greedy" and label in heads:
            row["greedy_mismatches"] = sum(_new_tokens(a, eos) != _new_tokens(b, eos)
                                           for got, want in zip(runs[label], runs[PLAIN])
                                           for (rows_a, _, _), (rows_b, _, _) in zip(got, want)
                                           for a, b in zip(rows_a, rows_b))
        rows.append(row)
    return {"batch_size": cfg.batch_size, "mode": cfg.mode, "max_new_tokens": cfg.max_new_tokens,
            "num_prompts": cfg.num_prompts, "repeats": cfg.repeats, "threads": torch.get_num_threads(),
            "device": str(device), "baselines": baselines, "rows": rows}


def _tokens_per_cycle(per_set: list) -> float:
    """Tokens a row commits per cycle (its windows, over every batch): what each row's cycles accept."""
    stats = [stats for batches in per_set for _, _, stats in batches]
    windows = sum(sum(s.rows_per_cycle) for s in stats)
    return sum(s.new_tokens for s in stats) / windows if windows else 0.0


def _mean_std(values: Sequence[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def batch_table_rows(report: dict) -> list[list[str]]:
    header = ["decoder", "tok/s", "tokens/cycle"] + [f"x {b}" for b in report["baselines"]] + ["greedy mismatches"]
    body = [[row["label"], f"{row['tok_s']['mean']:.1f} ± {row['tok_s']['std']:.1f}",
             f"{row['tokens_per_cycle']:.2f}" if "tokens_per_cycle" in row else "-"]
            + [f"{row['speedup'][b]['mean']:.2f}" for b in report["baselines"]]
            + [str(row.get("greedy_mismatches", "-"))] for row in report["rows"]]
    return [header] + body


def format_batch_table(report: dict) -> str:
    table = batch_table_rows(report)
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    title = (f"batch size {report['batch_size']}, {report['mode']}, {report['max_new_tokens']} new tokens per row, "
             f"{report['threads']} thread(s), {report['device']}")
    return "\n".join([title] + ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in table])


def write_batch_outputs(report: dict, out: Path) -> None:
    """`bench.json` (the report) and `bench.md` (its table) in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    table = batch_table_rows(report)
    lines = ["| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])]
    lines += ["| " + " | ".join(r) + " |" for r in table[1:]]
    (out / "bench.md").write_text(format_batch_table(report).splitlines()[0] + "\n\n" + "\n".join(lines) + "\n")
