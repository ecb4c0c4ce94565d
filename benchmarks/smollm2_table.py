"""The SmolLM2 results table of docs/results.md, made from the bench reports `benchmarks/smollm2.sh` wrote
(`docs/bench/smollm2/<run>/bench.json`): every decoder of every run, its tokens per second, tokens per
cycle and speed-up over transformers' own `generate` and over compiled plain decoding in the same run.

    python benchmarks/smollm2_table.py [--reports docs/bench/smollm2]
    python benchmarks/smollm2_table.py --reports docs/bench/smollm2-trees --runs greedy t1 chat greedy-sizes

(the second: the trees table, from `benchmarks/smollm2_trees.sh`'s reports)
    python benchmarks/smollm2_table.py --reports docs/bench/smollm2-own --runs greedy-bf16 t1-bf16 chat-bf16 \
        --readme smollm2-ff4-k2048-own   (the README's table)

Prints the markdown table (tests/test_doc_claims.py checks that docs/results.md holds exactly this).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mtpc.errors import InputError  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from script_args import ScriptParser, existing_folder, run_main  # noqa: E402

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


README_COLUMNS = (("plain, compiled", COMPILED, False), ("head, compiled", "{head}/compile", True),
                  ("head + prompt lookup, compiled", "{head}/lookup/compile", True),
                  ("head, tree of 8, compiled", "{head}/tree8/compile", True),
                  ("head, tree of 8 + lookup, compiled", "{head}/tree8/lookup/compile", True),
                  ("transformers prompt lookup", "hf prompt-lookup:10", True))


def readme_table(reports: Path, runs: tuple[str, ...], head: str) -> str:
    """The README's results table: per run, transformers' `generate` in tokens per second, then each decoder's
    speed-up over it (tokens per cycle in parentheses), the fastest in bold; a decoder the run lacks is empty."""
    lines = ["| run | transformers `generate` | " + " | ".join(name for name, _, _ in README_COLUMNS) + " |",
             "| --- | --- |" + " --- |" * len(README_COLUMNS)]
    for name in runs:
        report = json.loads((reports / name / "bench.json").read_text())
        rows = {r["label"]: r for r in rows_of(report)}
        if GENERATE not in rows:
            raise InputError(f"{reports / name / 'bench.json'} has no `{GENERATE}` row, which the README's table "
                             "compares every decoder with (bench it with --peers generate)")
        base = rows[GENERATE]["tok_s"]["mean"]
        cells = {}
        for column, label, cycles in README_COLUMNS:
            row = rows.get(label.format(head=head))
            if row is not None:
                cells[column] = (row["tok_s"]["mean"] / base, f" ({row['mu_acc']['mean']:.2f})" if cycles else "")
        if not any(column in cells for column, label, _ in README_COLUMNS if "{head}" in label):
            raise InputError(f"--readme {head}: {reports / name / 'bench.json'} has no row of that head")
        best = max(ratio for ratio, _ in cells.values())
        shown = [("**{:.2f}x**" if ratio == best else "{:.2f}x").format(ratio) + extra if column in cells else ""
                 for column, (ratio, extra) in ((c, cells.get(c, (0, ""))) for c, _, _ in README_COLUMNS)]
        lines.append(f"| {run_label(name, report)} | {base:.1f} tok/s | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=existing_folder, default=str(ROOT / "docs" / "bench" / "smollm2"))
    parser.add_argument("--runs", nargs="+", default=None,
                        help=f"the runs' folders, in table order (default: those of {' '.join(RUNS)} it holds)")
    parser.add_argument("--readme", metavar="HEAD", help="print the README's table of this head's runs instead")
    args = parser.parse_args(argv)
    reports = Path(args.reports)
    runs = tuple(args.runs or (name for name in RUNS if (reports / name / "bench.json").is_file()))
    missing = [name for name in runs if not (reports / name / "bench.json").is_file()]
    if missing:
        parser.error(f"--reports {args.reports} has no {', '.join(f'{name}/bench.json' for name in missing)}")
    if not runs:  # an empty table is no result
        parser.error(f"--reports {args.reports} holds none of the runs {', '.join(RUNS)}; name its runs with --runs")
    if args.readme:
        print(readme_table(reports, runs, args.readme))
    else:
        print(table(reports, runs))


if __name__ == "__main__":
    run_main(main)
