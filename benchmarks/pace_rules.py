"""What each pacing rule would have done to real generations: every prompt is decoded once with `--no-pace`
(its cycles' tokens and seconds recorded) and once plainly right after (`--compare`: the plain step and the read
of a prompt, measured beside it); then each rule (`PaceCheck` with `cycles` C and `margin` m, the rule `mtpc
generate` runs) is replayed on the recorded cycles: where it would have handed over, the rest is costed at the
measured plain step plus the read of the text so far. So every rule is scored on the same generations, and a rule
is good when it hands over the generations that run behind plain decoding and none that run ahead.

    python benchmarks/pace_rules.py --model SmolLM2-135M-Instruct.Q4_1.gguf \\
        --head models/heads/smollm2-cp4-k2048-own --code $NX --threads 1 \\
        --flags="--dtype bf16 --window 4 --lookup 10" --out docs/bench/pace/xeon-bf16-chain.json

Prompts as `benchmarks/auto_choice.py` takes them (chat instructions, held-out code). Prints the Markdown table
(per rule: the median and lowest speed-up over plain decoding, and the generations handed over) and writes every
generation's cycles and each rule's outcome as JSON.
"""

from __future__ import annotations

import io
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts (when imported by path)
from auto_choice import prompts  # noqa: E402
from results_file import write_results  # noqa: E402
from script_args import ScriptParser, existing_file, existing_folder, output_file, run_main, torch_threads  # noqa: E402

from mtpc.checks import int_in  # noqa: E402

RULES = [(cycles, margin) for cycles in (8, 16, 32) for margin in (1.0, 0.95, 0.9)]


def parse_args(argv=None):
    p = ScriptParser(prog="pace_rules.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="the model (a folder, or a GGUF file mtpc reads)")
    p.add_argument("--head", type=existing_folder)
    p.add_argument("--code", type=existing_folder, help="a package folder of held-out .py sources")
    p.add_argument("--replay", type=existing_file, default=None,
                   help="score the rules on the generations of a record this script wrote (no decoding)")
    p.add_argument("--chat", default=str(Path(__file__).parent / "prompts" / "chat-instructions.txt"),
                   type=existing_file, help="chat instructions, one a line")
    p.add_argument("--prompts", type=int_in(1, 32), default=3, help="prompts of each kind (chat, code)")
    p.add_argument("--flags", default="", help="more mtpc generate flags, e.g. \"--dtype bf16 --window 4\"")
    p.add_argument("--new-tokens", type=int_in(1, 4096), default=128)
    p.add_argument("--threads", type=torch_threads, default=1)
    p.add_argument("--out", type=output_file, default=None, help="the JSON record to write")
    args = p.parse_args(argv)
    if args.replay is None and not (args.model and args.head and args.code):
        p.error("--model, --head and --code are needed (or --replay RECORD)")
    try:
        args.flag_list = shlex.split(args.flags)
    except ValueError as e:
        p.error(f"--flags: {e}")
    if any(f in ("--no-pace", "--compare", "--prompts") for f in args.flag_list):
        p.error("--flags: --no-pace, --compare and --prompts are the script's own")
    refused = mtpc_refusal(args.flag_list)
    if refused:
        p.error(f"--flags: {refused}")
    return args


def mtpc_refusal(flags: list[str]) -> str | None:
    """What `mtpc generate` says of `flags` (its error, which names the flag), or None: checked before any model
    loads."""
    from mtpc.cli.commands import build_parser
    from mtpc.errors import InputError

    try:
        build_parser().parse_args(["generate", "--model", "m", *flags, "a prompt"])
    except InputError as e:
        return str(e).split(" (see ")[0]
    return None


def record(args, kind: str, text: str) -> dict:
    """One unpaced generation and the plain one beside it: the cycles' tokens and seconds, the plain step."""
    from mtpc.cli.commands import build_parser
    from mtpc.cli.generate import run_generate
    from mtpc.cli.generate_config import GenerateConfig
    from mtpc.settings import config_from_args

    argv = ["generate", "--model", args.model, "--head", args.head, "--threads", str(args.threads), "--compare",
            "--no-stream", "--no-pace", "--max-new-tokens", str(args.new_tokens),
            *(["--chat"] if kind == "chat" else []), *args.flag_list, text]
    cfg = config_from_args(GenerateConfig, build_parser().parse_args(argv))  # its flags were checked before
    summary = run_generate(cfg, out=io.StringIO(), err=io.StringIO())
    spec, plain = summary["stats"], summary["plain"]
    prompt = len(summary["prompt_ids"])
    return {"kind": kind, "prompt_tokens": prompt, "cycle_seconds": spec["cycle_seconds"],
            "accepted_per_cycle": spec["accepted_per_cycle"], "plain_step": 1.0 / plain["tokens_per_second"],
            "unpaced_speedup": summary["compare"]["speedup"]}


def replay(run: dict, cycles: int, margin: float) -> dict:
    """Where `PaceCheck(cycles, margin)` hands `run` over, and its speed-up over plain decoding then: the decided
    token committed, then plain steps (the plain decoder takes over the caches: the first step feeds that token)."""
    from mtpc.decoding.pace import PaceCheck
    from mtpc.decoding.stats import DecodeStats

    pace = PaceCheck(plain_step=run["plain_step"], cycles=cycles, margin=margin)
    seconds, accepted = run["cycle_seconds"], run["accepted_per_cycle"]
    total = sum(accepted)
    stats = DecodeStats()
    for i, (s, a) in enumerate(zip(seconds, accepted)):
        done = sum(accepted[:i])
        if pace.behind(stats) and total - done > 1:
            time = sum(seconds[:i]) + (total - done) * run["plain_step"]
            return {"handed_over_after": done + 1, "speedup": total / time * run["plain_step"]}
        stats.record(s, [[0] * a], 1)
    return {"handed_over_after": None, "speedup": total / sum(seconds) * run["plain_step"]}


def table(runs: list[dict]) -> str:
    lines = ["| rule | kind | speed-up vs plain (median) | lowest | each | handed over |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name in ["never"] + [f"C={c}, m={m}" for c, m in RULES]:
        for kind in ("chat", "code"):
            mine = [r["rules"][name] for r in runs if r["kind"] == kind]
            speedups = [r["speedup"] for r in mine]
            handed = sum(r["handed_over_after"] is not None for r in mine)
            lines.append(f"| {name} | {kind} | {statistics.median(speedups):.2f}x | {min(speedups):.2f}x | "
                         + ", ".join(f"{s:.2f}" for s in speedups) + f" | {handed} of {len(mine)} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    from mtpc.hardware import machine_summary

    args = parse_args(argv)
    if args.replay is not None:
        recorded = read_record(args.replay)
        runs = [scored(run) for run in recorded["runs"]]
        machine, threads, tokens, flags = (recorded[k] for k in ("machine", "threads", "new_tokens", "flags"))
    else:
        runs = []
        for kind, text in prompts(args):
            runs.append(scored(record(args, kind, text)))
            print(f"{kind}: unpaced {runs[-1]['unpaced_speedup']:.2f}x", file=sys.stderr, flush=True)
        machine, threads, tokens, flags = machine_summary(), args.threads, args.new_tokens, args.flags
    print(f"{machine}, {threads} torch thread(s), {tokens} new tokens, flags: `{flags or '(none)'}`\n")
    print(table(runs))
    write_results({"machine": machine, "threads": threads, "new_tokens": tokens, "flags": flags, "runs": runs},
                  args.out)


def scored(run: dict) -> dict:
    """`run` with each rule's outcome."""
    rules = {"never": {"handed_over_after": None, "speedup": run["unpaced_speedup"]}}
    for cycles, margin in RULES:
        rules[f"C={cycles}, m={margin}"] = replay(run, cycles, margin)
    return {**run, "rules": rules}


def read_record(path: str) -> dict:
    """A record this script wrote, checked: a bounded JSON file with every field a replay reads."""
    from mtpc.errors import InputError
    from mtpc.files import parse_json

    data = Path(path).read_bytes()[:64 << 20]
    record = parse_json(data, path)
    try:
        for run in record["runs"]:
            assert run["kind"] in ("chat", "code") and run["plain_step"] > 0 and run["unpaced_speedup"] > 0
            assert len(run["cycle_seconds"]) == len(run["accepted_per_cycle"]) > 0
            assert all(s >= 0 for s in run["cycle_seconds"]) and all(a >= 1 for a in run["accepted_per_cycle"])
        assert record["runs"] and all(k in record for k in ("machine", "threads", "new_tokens", "flags"))
    except (AssertionError, KeyError, TypeError) as e:
        raise InputError(f"{path}: not a record of pace_rules.py ({type(e).__name__} {e})") from None
    return record


if __name__ == "__main__":
    run_main(main)
