"""`mtpc bench --batch-size B`: throughput over batches of `B` left-padded prompts.

Every prompt set (`--repeats` sets of `--num-prompts`, a multiple of `B`) is cut into batches of `B`
consecutive prompts, left-padded to the batch's longest, and every batch is decoded, interleaved (the
order rotating from batch to batch), by:

- `plain (batched)`: plain one-token-per-step decoding of the whole batch with preallocated caches
  (`mtpc.decoding.plain.PlainDecoder`: the split backbone's per-row slots, the step run eagerly),
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

from ..decoding import PlainDecoder
from ..errors import InputError
from ..sampling import Sampling
from .config import BenchConfig
from .variants import load_bench
from .prompts import answer_end_ids, load_prompts
from .timing import synchronized

__all__ = ["run_batch_bench", "format_batch_table", "write_batch_outputs"]

PLAIN, PLAIN_COMPILED, HF = "plain (batched)", "plain (batched, static + compile)", "hf generate (batched)"


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
    longest = max(ids.shape[1] for batches in sets for ids, _ in batches)
    refuse_batches(variants, B, longest, cfg.max_new_tokens, device)
    sampling, ends = cfg.sampling(), answer_end_ids(cfg, tok)
    tasks = {PLAIN: _plain_task(_plain_decoder(base, compile=False), sampling, tok, ends)}
    if cfg.compile:
        tasks[PLAIN_COMPILED] = _plain_task(_plain_decoder(base, compile=True), sampling, tok, ends)
    tasks[HF] = _hf_task(base, sampling, tok, ends)
    for v in variants:
        tasks[v.label] = _spec_task(v.decoder, sampling, tok, ends)
    runs = _measure(cfg, tasks, sets, {v.label for v in variants if v.compiled} | {PLAIN_COMPILED})
    report = batch_report(cfg, runs, [v.label for v in variants], ends, device)
    if cfg.out:
        write_batch_outputs(report, Path(cfg.out))
    return report


def refuse_batches(variants, B: int, T: int, budget: int, device) -> None:
    """Every head's decoder checks a batch of `B` rows of `T` tokens and `budget` new ones (its caches, as many
    slots as it will allocate, and cycle tensors in the device's memory: `SpeculativeDecoder.check_batch`)
    before any is timed, as `mtpc generate --batch-size` does; it needs more than plain decoding's."""
    for variant in variants:
        try:
            variant.decoder.check_batch(B, T, budget, device)
        except ValueError as e:
            raise InputError(f"--batch-size {B} ({variant.label}): {e}") from None


def _batch(rows: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """`[B, T]` ids left-padded with `pad` and their attention mask."""
    T = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (T - len(r)) + r for r in rows], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (T - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device)
    return ids, mask


def _plain_decoder(base, compile: bool) -> PlainDecoder:
    try:
        decoder = PlainDecoder(base, compile=compile)
        decoder.backbone.require_slot_caches("batched plain decoding", "bench it with --batch-size 1")
    except ValueError as e:
        raise InputError(str(e)) from None
    return decoder


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


def _plain_task(decoder: PlainDecoder, sampling: Sampling, tok, ends: set[int]) -> Callable:
    def task(ids, mask, budget: int, seed: int):
        gen = _generator(seed, ids.device)
        return _without_stats(*_timed(lambda: decoder.generate(ids, budget, sampling, attention_mask=mask,
                                                               eos_token_id=ends, generator=gen,
                                                               pad_token_id=tok.pad_id).sequences,
                                      ids.is_cuda))

    return task


def _hf_task(base, sampling: Sampling, tok, ends: set[int]) -> Callable:
    hf = sampling.transformers_kwargs()

    def task(ids, mask, budget: int, seed: int):
        _generator(seed, ids.device)
        return _without_stats(*_timed(lambda: base.generate(ids, attention_mask=mask, max_new_tokens=budget,
                                                            eos_token_id=sorted(ends), pad_token_id=tok.pad_id, **hf),
                                      ids.is_cuda))

    return task


def _spec_task(decoder, sampling: Sampling, tok, ends: set[int]) -> Callable:
    def task(ids, mask, budget: int, seed: int):
        gen = _generator(seed, ids.device)
        out, seconds = _timed(lambda: decoder.generate(ids, budget, sampling, attention_mask=mask, eos_token_id=ends,
                                                       generator=gen, pad_token_id=tok.pad_id),
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
