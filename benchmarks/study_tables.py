"""Compact markdown tables for docs/results.md from `mtpc bench` reports (bench.json).

Usage: python benchmarks/study_tables.py runs/bench/sample/bench.json [--bonus off|on|all] [--heads]
  --heads  also print the table of the heads themselves (training budget, size, teacher-forced acceptance)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def pm(stat: dict, scale: float = 1.0, digits: int = 2) -> str:
    return f"{stat['mean'] * scale:.{digits}f} ± {stat['std'] * scale:.{digits}f}"


def bench_table(report: dict, bonus: str) -> str:
    keep = {"off": [False], "on": [True], "all": [False, True]}[bonus]
    plain = report["plain"]
    lines = ["| head | μ_acc | μ_lat ms | tok/s | × plain | × FF | head ms | circuit ms | backbone ms | accept ms |",
             "|---|---|---|---|---|---|---|---|---|---|",
             f"| plain | 1 | {pm(plain['mu_lat'], 1e3)} | {pm(plain['tok_s'], 1, 0)} | 1 | | | | "
             f"{plain['phases_ms']['backbone']:.2f} | {plain['phases_ms']['accept']:.2f} |"]
    for r in report["heads"]:
        if r["bonus"] not in keep:
            continue
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report")
    parser.add_argument("--bonus", choices=("off", "on", "all"), default="all")
    parser.add_argument("--heads", action="store_true")
    args = parser.parse_args(argv)
    report = json.loads(Path(args.report).read_text())
    if args.heads:
        print(heads_table(report) + "\n")
    print(bench_table(report, args.bonus))


if __name__ == "__main__":
    main()
