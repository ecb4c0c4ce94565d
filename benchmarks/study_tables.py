"""Compact markdown tables for docs/results.md from `mtpc bench` reports (bench.json).

Usage: python benchmarks/study_tables.py runs/bench/sample/bench.json [--heads]
       python benchmarks/study_tables.py --lm runs/study/lm-d256 runs/study/lm-d192 [--until 600]
  --heads  also print the table of the heads themselves (training budget, size, teacher-forced acceptance)
  --lm     the LM size comparison instead: each `mtpc tiny-lm` run's held-out bits/byte at its evaluations
           in its first --until seconds (the runs trained side by side, one core each)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mtpc.checks import positive_float  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from script_args import ScriptParser, existing_file, existing_folder  # noqa: E402


def pm(stat: dict, scale: float = 1.0, digits: int = 2) -> str:
    return f"{stat['mean'] * scale:.{digits}f} ± {stat['std'] * scale:.{digits}f}"


def bench_table(report: dict) -> str:
    plain = report["plain"]
    lines = ["| head | μ_acc | μ_lat ms | tok/s | × plain | × FF | head ms | circuit ms | backbone ms | accept ms |",
             "|---|---|---|---|---|---|---|---|---|---|",
             f"| plain | 1 | {pm(plain['mu_lat'], 1e3)} | {pm(plain['tok_s'], 1, 0)} | 1 | | | | "
             f"{plain['phases_ms']['backbone']:.2f} | {plain['phases_ms']['accept']:.2f} |"]
    for r in report["heads"]:
        ph = r["phases_ms"]
        ff = pm(r["speedup_ff"]) if r.get("speedup_ff") else ""
        lines.append(f"| {r['label']} | {pm(r['mu_acc'])} | {pm(r['mu_lat'], 1e3)} | {pm(r['tok_s'], 1, 0)} | "
                     f"{pm(r['speedup_plain'])} | {ff} | {ph['head']:.2f} | {ph['circuit']:.2f} | "
                     f"{ph['backbone']:.2f} | {ph['accept']:.2f} |")
    return "\n".join(lines)


def heads_table(report: dict) -> str:
    lines = ["| head | structure | n | bindings | LoRA | weights | train steps | train s | held-out loss | "
             "teacher-forced acc. |", "|---|---|---|---|---|---|---|---|---|---|"]
    seen = set()
    for r in report["heads"]:
        if r["head"] in seen:
            continue
        seen.add(r["head"])
        bindings = " ".join(f"{k}={v}" for k, v in r["bindings"].items())
        lines.append(f"| {Path(r['head']).name} | {r['structure']} | {r['n']} | {bindings} | {r['lora_layers']} | "
                     f"{r['parameters'] / 1e6:.2f}M | {r['train_steps']} | {r['train_seconds']} | "
                     f"{r['val_loss']:.2f} | {r['val_accepted']:.3f} |")
    return "\n".join(lines)


def lm_parameters(folder: Path) -> int:
    """Weights of a tiny-lm run, finished (its summary) or cut short (its checkpoint's model)."""
    summary = folder / "tiny_lm.json"
    if summary.exists():
        return json.loads(summary.read_text())["parameters"]
    import torch

    state = torch.load(folder / "checkpoint.pt", map_location="cpu", weights_only=True)
    return sum(t.numel() for t in state["model"].values())


def lm_table(folders: list[Path], until: float) -> str:
    rows = []
    for folder in folders:
        records = [json.loads(line) for line in (folder / "train_log.jsonl").read_text().splitlines() if line]
        timed = [r for r in records if "time_s" in r and r["time_s"] <= until]
        evals = [r for r in timed if "val_bpb" in r]
        curve = ", ".join(f"{r['val_bpb']:.3f} ({r['time_s'] / 60:.1f} min)" for r in evals)
        steps, rate = (timed[-1]["step"], f"{timed[-1]['tokens'] / timed[-1]['time_s']:,.0f}") if timed else (0, "-")
        rows.append(f"| {folder.name} | {lm_parameters(folder) / 1e6:.2f}M | {steps} | {rate} | {curve or '-'} |")
    return "\n".join([f"| LM | weights | steps in {until:.0f} s | tok/s | held-out bits/byte (at minute) |",
                      "|---|---|---|---|---|", *rows])


def main(argv: list[str] | None = None) -> None:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", nargs="?", type=existing_file)
    parser.add_argument("--heads", action="store_true")
    parser.add_argument("--lm", nargs="+", type=existing_folder, metavar="RUN")
    parser.add_argument("--until", type=positive_float, default=600.0)
    args = parser.parse_args(argv)
    if args.lm:
        untrained = [run for run in args.lm if not (Path(run) / "train_log.jsonl").is_file()]
        if untrained:
            parser.error(f"--lm: no train_log.jsonl in {', '.join(untrained)} (give `mtpc tiny-lm` run folders)")
        print(lm_table([Path(run) for run in args.lm], args.until))
        return
    if args.report is None:
        parser.error("a bench.json report, or --lm RUN ...")
    report = json.loads(Path(args.report).read_text())
    if args.heads:
        print(heads_table(report) + "\n")
    print(bench_table(report))


if __name__ == "__main__":
    main()
