"""Batched speculative decoding: tok/s over the batch at B = 1, 2, 4, 8, 16, against plain batched decoding
(eager and static-cache compiled) and transformers' batched `generate`, and the speed-up plot.

For every batch size it runs `mtpc bench --batch-size B` (`mtpc.bench.batch`: the same prompts cut into
batches of B left-padded prompts, every decoder interleaved batch by batch, wall time of each whole
`generate` call, prefill included) and collects the reports; the plot shows each head's speed-up against
each baseline as a function of B, and against its own B = 1 throughput.

The target setting (docs/results.md): the shipped LM and heads, one thread, held-out third-party prompts
of 96-128 bytes, 128 new bytes, sampling at T = 1:

    python benchmarks/bench_batch.py --prompts PROMPTS.jsonl --num-prompts 16 --repeats 3 \\
        --max-new-tokens 128 --mode sample --compile --threads 1 --out runs/batch

Usage:
    python benchmarks/bench_batch.py [--model models/byte-lm] [--heads models/heads/ff8 ...]
        (--prompts FILE | --corpus PATH) [--batch-sizes 1 2 4 8 16] [--num-prompts 16] [--repeats 3]
        [--max-new-tokens 128] [--mode greedy|sample] [--compile] [--window K|adaptive ...] [--threads 1]
        [--out DIR]

Writes `DIR/batch.json` (every report, by batch size), `DIR/batch.md` (one table) and `DIR/speedup.png`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mtpc.bench import BenchConfig, run_bench  # noqa: E402
from mtpc.bench.batch import HF, PLAIN, PLAIN_COMPILED  # noqa: E402
from mtpc.checks import bench_window, positive_int, seed  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from script_args import ScriptParser, existing_file, output_folder, run_main, torch_threads  # noqa: E402


def reports_by_batch(args) -> dict[int, dict]:
    reports = {}
    for B in args.batch_sizes:
        cfg = BenchConfig(model=args.model, heads=args.heads, prompts=args.prompts, corpus=args.corpus,
                          num_prompts=args.num_prompts, repeats=args.repeats, max_new_tokens=args.max_new_tokens,
                          mode=args.mode, compile=args.compile, threads=args.threads, seed=args.seed,
                          device=args.device, batch_size=B, progress=not args.no_progress,
                          prompt_len=args.prompt_len, windows=tuple(args.window))
        reports[B] = run_bench(cfg)
        print(f"B = {B}: " + ", ".join(f"{row['label']} {row['tok_s']['mean']:.1f} tok/s"
                                        for row in reports[B]["rows"]), flush=True)
    return reports


def heads_of(report: dict) -> list[str]:
    return [row["label"] for row in report["rows"] if row["label"] not in (PLAIN, PLAIN_COMPILED, HF)]


def markdown(reports: dict[int, dict]) -> str:
    """One row per batch size: every decoder's tok/s, and each head's speed-ups."""
    first = next(iter(reports.values()))
    labels = [row["label"] for row in first["rows"]]
    baselines = first["baselines"]
    header = ["B"] + [f"{label} tok/s" for label in labels]
    header += [f"{head} tokens/cycle" for head in heads_of(first)]
    header += [f"{head} x {b}" for head in heads_of(first) for b in baselines]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for B, report in reports.items():
        rows = {row["label"]: row for row in report["rows"]}
        cells = [str(B)] + [f"{rows[label]['tok_s']['mean']:.1f}" for label in labels]
        cells += [f"{rows[head]['tokens_per_cycle']:.2f}" for head in heads_of(report)]
        cells += [f"{rows[head]['speedup'][b]['mean']:.2f}" for head in heads_of(report) for b in baselines]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(reports: dict[int, dict], path: Path) -> None:
    """Left: each head's speed-up over each baseline against B. Right: every decoder's tok/s relative to
    its own B = 1 (how well each one uses a batch)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(reports)
    first = reports[sizes[0]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 5.6), dpi=110)
    styles = {PLAIN: "--", PLAIN_COMPILED: "-", HF: ":"}
    for h, head in enumerate(heads_of(first)):
        for b in first["baselines"]:
            values = [{r["label"]: r for r in reports[B]["rows"]}[head]["speedup"][b]["mean"] for B in sizes]
            left.plot(sizes, values, ls=styles[b], marker="o", color=f"C{h}", label=f"{head} vs {b}")
    left.axhline(1.0, color="grey", lw=0.7)
    left.set_xscale("log", base=2)
    left.set_xticks(sizes, [str(B) for B in sizes])
    left.set_xlabel("batch size B")
    left.set_ylabel("speed-up (tok/s over the batch)")
    # below the axes, where it hides no line; long handles show each baseline's dash style
    left.legend(fontsize=6.5, handlelength=4, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    for i, label in enumerate(row["label"] for row in first["rows"]):
        rates = [{r["label"]: r for r in reports[B]["rows"]}[label]["tok_s"]["mean"] for B in sizes]
        right.plot(sizes, [r / rates[0] for r in rates], marker="o", color=f"C{i}", label=label)
    right.set_xscale("log", base=2)
    right.set_xticks(sizes, [str(B) for B in sizes])
    right.set_xlabel("batch size B")
    right.set_ylabel(f"tok/s relative to B = {sizes[0]}")
    right.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    fig.suptitle(f"{first['mode']}, {first['max_new_tokens']} new tokens per row, {first['threads']} thread(s), "
                 f"{first['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)



def batch_window(text: str) -> int | str:
    """A verify width for every row of a batch: an integer or 'adaptive' (`auto` chooses for one row, not here)."""
    value = bench_window(text)
    if value == "auto":
        raise argparse.ArgumentTypeError("expected 'adaptive' or an integer in 2..1024, got 'auto' (mtpc bench's "
                                         "--window auto chooses for one row at a time)")
    return value

def main(argv=None) -> dict[int, dict]:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "byte-lm"))
    parser.add_argument("--heads", nargs="+", default=[str(ROOT / "models" / "heads" / h) for h in ("ff8", "btree8-r8")])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", type=existing_file)
    source.add_argument("--corpus")
    parser.add_argument("--prompt-len", type=positive_int, default=128, help="corpus prompts: tokens per prompt")
    parser.add_argument("--batch-sizes", nargs="+", type=positive_int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--num-prompts", type=positive_int, default=16, help="prompts per set (a multiple of every B)")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--mode", choices=("greedy", "sample"), default="sample")
    parser.add_argument("--compile", action="store_true", help="also the compiled decoders (heads and plain)")
    parser.add_argument("--window", nargs="+", type=batch_window, default=[None], metavar="K",
                        help="verify widths to compare (2 .. n, or 'adaptive'; default: n): at a larger B a verified "
                             "position costs more of a cycle, so a narrower window may win")
    parser.add_argument("--threads", type=torch_threads, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--out", type=output_folder, default=None,
                        help="folder for batch.json, batch.md and speedup.png")
    args = parser.parse_args(argv)
    uneven = [B for B in args.batch_sizes if args.num_prompts % B]
    if uneven:  # found before the first batch size runs, not after it
        parser.error(f"--num-prompts {args.num_prompts} must be a multiple of every batch size, and is not of "
                     f"{', '.join(map(str, uneven))}")
    before = torch.get_num_threads()
    try:
        reports = reports_by_batch(args)
    finally:
        torch.set_num_threads(before)
    table = markdown(reports)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "batch.json").write_text(json.dumps({str(B): r for B, r in reports.items()}, indent=1) + "\n")
        (out / "batch.md").write_text(table)
        plot(reports, out / "speedup.png")
        print(f"wrote {out}/batch.json, batch.md, speedup.png")
    return reports


if __name__ == "__main__":
    run_main(main)
