"""Draw the study's Figure 1 (accepted tokens vs cycle latency, iso-throughput lines, one marker per
head) from one or more `mtpc bench` reports, e.g. greedy and sampling side by side.

Usage: python benchmarks/study_figure.py runs/bench/greedy/bench.json runs/bench/sample/bench.json \
           --out docs/results_tradeoff.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mtpc.bench.report import plot_tradeoff

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from script_args import ScriptParser, existing_file, output_file  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=existing_file, help="bench.json files (one colour each)")
    parser.add_argument("--out", required=True, type=output_file, help="PNG path")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    reports = [json.loads(Path(p).read_text()) for p in args.reports]
    modes = " vs ".join(r["config"]["mode"] for r in reports)
    plot_tradeoff(reports, Path(args.out), title=args.title or f"tiny byte LM, {modes}: accepted tokens vs latency")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
