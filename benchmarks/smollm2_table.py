"""The SmolLM2 results table of docs/results.md, made from the bench reports `benchmarks/smollm2.sh` wrote
(`docs/bench/smollm2/<run>/bench.json`): every decoder of every run, its tokens per second, tokens per
cycle and speed-up over transformers' own `generate` and over compiled plain decoding in the same run.

    python benchmarks/smollm2_table.py [--reports docs/bench/smollm2]
    python benchmarks/smollm2_table.py --reports docs/bench/smollm2-trees --runs greedy t1 chat greedy-sizes

(the second: the trees table, from `benchmarks/smollm2_trees.sh`'s reports)

Prints the markdown table (tests/test_doc_claims.py checks that docs/results.md holds exactly this).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ("greedy-bf16", "t1-bf16", "t07-bf16", "greedy-fp32", "chat-bf16", "greedy-bf16-2threads")  # table order
TREE_RUNS = ("greedy", "t1", "chat", "greedy-sizes")  # benchmarks/smollm2_trees.sh's runs
GENERATE, COMPILED = "hf generate", "plain (static + compile)"


def rows_of(report: dict) -> list[dict]:
    """Plain decoding, the peers and the heads of one report, in the bench's own order."""
    plain = {"label": "plain (eager)", **report["plain"]}
    return [plain, *report["peers"], *report["heads"]]


def run_label(name: str, report: dict) -> str:
    cfg, env = report["config"], report["environment"]
    mode = "greedy" if cfg["mode"] == "greedy" else f"T = {cfg['temperature']:g}"
    prompts = "chat" if cfg.get("chat") else "code"
    return f"{prompts}, {mode}, {cfg['dtype']}, {env['threads']} thread{'s' if env['threads'] > 1 else ''}"


def table(reports: Path, runs: tuple[str, ...] = RUNS) -> str:
    lines = ["| run | decoder | tok/s | tokens/cycle | x hf generate | x plain compiled |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for name in runs:
        path = reports / name / "bench.json"
        if not path.is_file():
            continue
        report = json.loads(path.read_text())
        rows = rows_of(report)
        rate = {r["label"]: r["tok_s"]["mean"] for r in rows}
        for r in rows:
            ratio = lambda base: f"{rate[r['label']] / rate[base]:.2f}x" if base in rate else "-"  # noqa: E731
            lines.append(f"| {run_label(name, report)} | {r['label']} | {rate[r['label']]:.1f} | "
                         f"{r['mu_acc']['mean']:.2f} | {ratio(GENERATE)} | {ratio(COMPILED)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", default=str(ROOT / "docs" / "bench" / "smollm2"))
    parser.add_argument("--runs", nargs="+", default=list(RUNS), help="the runs' folders, in table order")
    args = parser.parse_args(argv)
    print(table(Path(args.reports), tuple(args.runs)))


if __name__ == "__main__":
    main()
