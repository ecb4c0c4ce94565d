"""What `mtpc generate` chooses on the machine at hand, and what it gives: each setting decodes each prompt with
`--compare` (the same prompt decoded plainly in the same process, eager, right after), so every ratio is against
plain decoding measured beside it. Prompts: chat instructions (through the model's chat template) and held-out
code (spans of an installed package the head never saw).

    python benchmarks/auto_choice.py --model SmolLM2-135M-Instruct.Q4_1.gguf \\
        --head models/heads/smollm2-cp4-k2048-own --code $NX --threads 1 \\
        --out docs/bench/auto-choice/auto_choice.json

Settings (each a list of `mtpc generate` flags): `readme` (the README's example: `--lookup 10`, every other
choice `auto`), `auto` (the head's defaults: `auto` chooses dtype, plain, chain or tree), `bf16` (`--dtype bf16
--lookup 10` forced: `auto` still chooses the width), `chain` (`--dtype bf16 --window 4 --lookup 10`: every
choice forced, as the README's example was before; `chain-unpaced` the same with `--no-pace`, so a generation
that falls behind plain decoding is not handed over to it) and `head+lookup` (`--window 2 --lookup 10`: the head forced
at its cheapest chain, with prompt lookup, in the dtype `auto` picks); and forced shapes to hold `auto`'s choice
against: `window4` (the head's chain of 4), `tree8` and `tree21` (trees of 8 and 21 nodes), `fp32` (float32, the
shape chosen). Every setting but `chain-unpaced` paces (`mtpc generate`'s default). Prints the Markdown table
(median speed-up per setting and kind, the tokens a cycle, how many runs handed over to plain decoding, what
`auto` said), with `--costs` the verify curves `auto` chose by (float32 and
bf16), and writes every run as JSON.
"""

from __future__ import annotations

import io
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts (when imported by path)
from results_file import write_results  # noqa: E402
from script_args import ScriptParser, existing_file, existing_folder, output_file, run_main, torch_threads  # noqa: E402

from mtpc.checks import int_in  # noqa: E402
from mtpc.errors import InputError  # noqa: E402

SETTINGS = {"readme": ["--lookup", "10"], "auto": [], "bf16": ["--dtype", "bf16", "--lookup", "10"],
            "chain": ["--dtype", "bf16", "--window", "4", "--lookup", "10"],
            "chain-unpaced": ["--dtype", "bf16", "--window", "4", "--lookup", "10", "--no-pace"],
            "head+lookup": ["--window", "2", "--lookup", "10"], "window4": ["--window", "4"], "tree8": ["--tree", "8"],
            "tree21": ["--tree", "21"], "fp32": ["--dtype", "fp32"]}
CODE_BYTES = 600  # a code prompt's length, from a line start a third of the way into its file


def parse_args(argv=None):
    p = ScriptParser(prog="auto_choice.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the model (a folder, or a GGUF file mtpc reads)")
    p.add_argument("--head", required=True, type=existing_folder)
    p.add_argument("--code", required=True, type=existing_folder, help="a package folder of held-out .py sources")
    p.add_argument("--chat", default=str(Path(__file__).parent / "prompts" / "chat-instructions.txt"),
                   type=existing_file, help="chat instructions, one a line")
    p.add_argument("--prompts", type=int_in(1, 32), default=3, help="prompts of each kind (chat, code)")
    p.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=list(SETTINGS))
    p.add_argument("--new-tokens", type=int_in(1, 4096), default=128)
    p.add_argument("--threads", type=torch_threads, default=1)
    p.add_argument("--costs", action="store_true",
                   help="also print the verify curves (float32 and bf16) auto chooses by, k positions against one")
    p.add_argument("--out", type=output_file, default=None, help="the JSON record to write")
    return p.parse_args(argv)


def prompts(args) -> list[tuple[str, str]]:
    """(kind, text): `--prompts` chat instructions, then as many code spans (every 7th file by sorted name)."""
    chat = [line.strip() for line in Path(args.chat).read_text().splitlines() if line.strip()][:args.prompts]
    code = []
    for file in sorted(Path(args.code).rglob("*.py"))[::7]:
        text = file.read_text(errors="replace")
        start = text.find("\n", len(text) // 3) + 1
        if len(text) - start >= CODE_BYTES:
            code.append(text[start:start + CODE_BYTES])
        if len(code) == args.prompts:
            break
    if len(chat) < args.prompts or len(code) < args.prompts:
        raise InputError(f"found {len(chat)} chat and {len(code)} code prompts; {args.prompts} of each needed")
    return [("chat", text) for text in chat] + [("code", text) for text in code]


def decode(args, kind: str, text: str, flags: list[str]) -> dict:
    """One `mtpc generate --compare` run: its comparison, tokens a cycle and what auto said (stderr)."""
    from mtpc.cli.commands import build_parser
    from mtpc.cli.generate import run_generate
    from mtpc.settings import config_from_args
    from mtpc.cli.generate_config import GenerateConfig

    argv = ["generate", "--model", args.model, "--head", args.head, "--threads", str(args.threads), "--compare",
            "--no-stream", "--max-new-tokens", str(args.new_tokens), *(["--chat"] if kind == "chat" else []),
            *flags, text]
    cfg = config_from_args(GenerateConfig, build_parser().parse_args(argv))
    err = io.StringIO()
    summary = run_generate(cfg, out=io.StringIO(), err=err)
    said = [line for line in err.getvalue().splitlines() if line.startswith(("mtpc: auto", "mtpc: warning"))]
    stats = summary["stats"]
    return {"kind": kind, "speedup": summary["compare"]["speedup"], "tok_s": summary["compare"]["speculative_tok_s"],
            "plain_tok_s": summary["compare"]["plain_tok_s"], "tokens_a_cycle": stats.get("mean_accepted"),
            "identical": summary["compare"]["greedy_identical"], "said": said,
            "handed_over_after": (stats.get("handover") or {}).get("tokens")}


def table(runs: dict[str, list[dict]]) -> str:
    lines = ["| setting | flags | kind | speed-up vs plain (median) | each | tokens a cycle | handed over | auto said |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, cells in runs.items():
        for kind in ("chat", "code"):
            mine = [c for c in cells if c["kind"] == kind]
            if not mine:
                continue
            each = ", ".join(f"{c['speedup']:.2f}" for c in mine)
            cycle = statistics.median(c["tokens_a_cycle"] or 1.0 for c in mine)
            said = mine[0]["said"][-1].removeprefix("mtpc: ")[:160] if mine[0]["said"] else ""
            handed = sum(c.get("handed_over_after") is not None for c in mine)
            lines.append(f"| {name} | `{' '.join(SETTINGS[name]) or '(none)'}` | {kind} | "
                         f"{statistics.median(c['speedup'] for c in mine):.2f}x | {each} | {cycle:.2f} | "
                         f"{handed} of {len(mine)} | {said} |")
    return "\n".join(lines)


def verify_costs(args) -> dict[str, dict[int, float]]:
    """The verify curve `auto` chose by, for float32 and bf16 (read from the step store where a run above kept
    it, else measured now): seconds of one call over each width."""
    import torch

    from mtpc.lm import loading
    from mtpc.lm.backbone import SplitBackbone
    from mtpc.decoding.choice.costs import machine_costs

    torch.set_num_threads(args.threads)
    curves = {}
    for name in ("fp32", "bf16"):
        dtype = loading.torch_dtype(name)
        model = loading.load_model(args.model, dtype, torch.device("cpu"))
        curves[name] = machine_costs(SplitBackbone(model), dtype, torch.device("cpu")).call_seconds
    return curves


def costs_table(curves: dict[str, dict[int, float]]) -> str:
    widths = sorted(next(iter(curves.values())))
    lines = ["| dtype | one position, ms | " + " | ".join(f"k = {w}" for w in widths[1:]) + " |",
             "| --- | --- |" + " --- |" * (len(widths) - 1)]
    for name, seconds in curves.items():
        lines.append(f"| {name} | {seconds[1] * 1e3:.1f} | "
                     + " | ".join(f"{seconds[w] / seconds[1]:.2f}" for w in widths[1:]) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    from mtpc.hardware import machine_summary

    args = parse_args(argv)
    texts = prompts(args)
    runs = {}
    for name in args.settings:
        runs[name] = [decode(args, kind, text, SETTINGS[name]) for kind, text in texts]
        print(f"{name}: " + ", ".join(f"{r['speedup']:.2f}x" for r in runs[name]), file=sys.stderr, flush=True)
    print(f"{machine_summary()}, {args.threads} torch thread(s), {args.new_tokens} new tokens\n")
    print(table(runs))
    curves = verify_costs(args) if args.costs else {}
    if curves:
        print(f"\nA verify call over k positions against one position ({machine_summary()}, {args.threads} "
              f"thread(s), eager):\n\n{costs_table(curves)}")
    write_results({"machine": machine_summary(), "threads": args.threads, "new_tokens": args.new_tokens,
                   "settings": SETTINGS, "runs": runs,
                   "verify_call_seconds": {name: {str(w): s for w, s in c.items()} for name, c in curves.items()}},
                  args.out)


if __name__ == "__main__":
    run_main(main)
