"""What `--compile` costs a user in wall time: `mtpc generate` run as a command, with and without
`--compile`, on warm caches (inductor's on-disk cache filled by an untimed run of each first).

Each round runs the command once per mode (eager, then `--compile`; the order alternates between
rounds, so a machine that drifts slows both alike) and the table gives, per checkout, the median wall
time of each mode over `--repeats` rounds and the median of the rounds' differences (`compile -
eager`: the start-up a second `--compile` run costs over the eager one).

Before/after: `--compare OLD_ROOT` runs the same rounds with the library imported from OLD_ROOT (a
checkout of main, say) as well, interleaved with this checkout's.

Usage:
    python benchmarks/bench_startup.py [--model models/byte-lm] [--head models/heads/btree8-r8]
        [--max-new-tokens 128] [--threads 1] [--repeats 3] [--compare OLD_ROOT] [--out FILE.json]
Prints a table; `--out FILE` also writes JSON (no file by default).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from results_file import write_results  # noqa: E402
from script_args import ScriptParser, output_file, torch_threads  # noqa: E402

from mtpc.checks import positive_int  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "def shortest_path(G, source, target):\n    "
MODES = ("eager", "compile")


def command(args, mode: str) -> list[str]:
    """The `mtpc generate` command line of one run (text to stdout, nothing measured in-process)."""
    line = [sys.executable, "-m", "mtpc.cli", "generate", "--model", str(Path(args.model).resolve()),
            "--head", str(Path(args.head).resolve()), "--max-new-tokens", str(args.max_new_tokens),
            "--threads", str(args.threads), "--no-stream", PROMPT]
    return line + (["--compile"] if mode == "compile" else [])


def wall_seconds(root: Path, line: list[str]) -> float:
    """Seconds the command takes with the library imported from `root` (run in `root`)."""
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_WAIT_POLICY": "PASSIVE"}
    start = time.perf_counter()
    done = subprocess.run(line, cwd=root, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"bench_startup: error: {' '.join(line[2:5])} ... in {root} failed:\n{done.stderr[-2000:]}")
    if done.stderr.strip():  # the target: nothing but the text reaches the terminal
        print(f"warning: {root.name} {line[-1]}: stderr: {done.stderr.strip()[-300:]}", file=sys.stderr)
    return seconds


def measure(roots: dict[str, Path], args) -> dict[str, dict[str, list[float]]]:
    """`{checkout: {mode: [seconds per round]}}`, after one untimed run of each (warm caches)."""
    for root in roots.values():
        for mode in MODES:
            wall_seconds(root, command(args, mode))
    times = {name: {mode: [] for mode in MODES} for name in roots}
    for round_ in range(args.repeats):
        modes = MODES if round_ % 2 == 0 else MODES[::-1]
        for name, root in roots.items():
            for mode in modes:
                times[name][mode].append(wall_seconds(root, command(args, mode)))
    return times


def summary(times: dict[str, dict[str, list[float]]]) -> list[dict]:
    rows = []
    for name, by_mode in times.items():
        extra = [c - e for c, e in zip(by_mode["compile"], by_mode["eager"])]
        rows.append({"checkout": name, "eager_s": statistics.median(by_mode["eager"]),
                     "compile_s": statistics.median(by_mode["compile"]), "extra_s": statistics.median(extra),
                     "eager_all": by_mode["eager"], "compile_all": by_mode["compile"]})
    return rows


def main(argv=None) -> dict:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "byte-lm"))
    parser.add_argument("--head", default=str(ROOT / "models" / "heads" / "btree8-r8"))
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--threads", type=torch_threads, default=1)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--compare", default=None, metavar="OLD_ROOT", help="also time the library of this checkout")
    parser.add_argument("--out", type=output_file, default=None,
                        help="write the rows as JSON here (default: print only)")
    args = parser.parse_args(argv)
    roots = {"this": ROOT}
    if args.compare:
        old = Path(args.compare).resolve()
        if not (old / "mtpc" / "cli" / "__main__.py").is_file():
            parser.error(f"--compare {args.compare}: no mtpc checkout there")
        roots = {"old": old, "this": ROOT}
    rows = summary(measure(roots, args))
    print(f"mtpc generate, {args.max_new_tokens} new bytes, threads={args.threads}, warm caches; "
          f"median wall seconds over {args.repeats} rounds")
    print(f"{'checkout':<10}{'eager':>8}{'compile':>9}{'extra':>8}")
    for r in rows:
        print(f"{r['checkout']:<10}{r['eager_s']:>8.2f}{r['compile_s']:>9.2f}{r['extra_s']:>8.2f}")
    result = {"max_new_tokens": args.max_new_tokens, "threads": args.threads, "repeats": args.repeats,
              "model": Path(args.model).name, "head": Path(args.head).name, "rows": rows}
    write_results(result, args.out)
    return result


if __name__ == "__main__":
    main()
