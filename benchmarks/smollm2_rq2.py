"""Which circuit structure drafts SmolLM2 best at equal tokens seen (the MtPC paper's RQ2 on a real LM): the
heads `benchmarks/smollm2_rq2.sh` trains from the same cached features of the LM's own text, side by side.

    python benchmarks/smollm2_rq2.py collect [--runs runs/rq2] [--bench docs/bench/smollm2-rq2/bench.json]
    python benchmarks/smollm2_rq2.py table                       # the markdown table of docs/results.md

`collect` reads each head's `train_config.json` (tokens seen, training tokens per second from the store,
minutes), its size, its teacher-forced scores on the LM's own held-out networkx continuations
(`score-NAME-nx-own.json`, benchmarks/depth_acceptance.py's record) and, when the `--bench` report exists
(an eager `mtpc bench` of the same heads, greedy), each head's tokens per cycle and milliseconds per cycle
in decoding; `table` prints the table from the recorded JSON (tests/test_doc_claims.py checks that
docs/results.md holds exactly it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mtpc.errors import InputError  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from script_args import ScriptParser, run_main  # noqa: E402

RECORD = ROOT / "benchmarks" / "results" / "rq2_smollm2.json"
# run folder -> (structure, r, LoRA layers), in the table's order
RUNS = {"ff4": ("FF", None, 0), "cp4": ("CP", 8, 0), "hmm4": ("HMM", 8, 0), "btree4": ("BTree", 4, 0),
        "ff4-lora1": ("FF", None, 1)}


def record_of(runs: Path, name: str, structure: str, r: int | None, lora: int, bench: dict) -> dict:
    folder = runs / name
    cfg = json.loads((folder / "train_config.json").read_text())
    score = json.loads((runs / f"score-{name}-nx-own.json").read_text())
    topk = score["val_depth_topk"]
    weights = sum(p.stat().st_size for p in folder.rglob("*.safetensors"))  # a LoRA adapter included
    record = {"run": name, "structure": structure, "n": cfg["bindings"]["n"], "r": r, "lora_layers": lora,
              "steps": cfg["steps"], "train_tokens": cfg["train_tokens"], "minutes": round(cfg["train_seconds"] / 60, 1),
              "tokens_per_second": cfg["tokens_per_second"], "weights_megabytes": round(weights / 1e6, 2),
              "held_out_windows": score["val_windows"],
              "teacher_forced_tokens_per_window": round(score["val_accepted"], 4),
              "depth_top1": [row[0] for row in topk["token"]], "depth_top8": [row[-1] for row in topk["token"]],
              "path_top4": [row[2] for row in topk["path"]]}
    row = bench.get(f"{folder.name}")
    if row is not None:
        record["decoding_tokens_per_cycle"] = round(row["mu_acc"]["mean"], 3)
        record["decoding_ms_per_cycle"] = round(1000 * row["mu_lat"]["mean"], 2)
        record["decoding_tok_s"] = round(row["tok_s"]["mean"], 1)
    return record


def bench_rows(path: Path) -> tuple[dict, dict | None]:
    """(head folder name -> its eager chain row, the bench's plain row) of the bench report `path`, if it exists."""
    if not path.is_file():
        return {}, None
    data = json.loads(path.read_text())
    rows = {Path(h["head"]).name: h for h in data["heads"]
            if not h.get("compiled") and not h.get("lookup") and not h.get("tree")}
    return rows, data["plain"]


def collect(runs: Path, bench_report: Path) -> dict:
    bench, plain = bench_rows(bench_report)
    records = [record_of(runs, name, *spec, bench) for name, spec in RUNS.items()
               if (runs / name / "train_config.json").is_file() and (runs / f"score-{name}-nx-own.json").is_file()]
    if not records:  # before the record is written: an empty one would replace the recorded run
        raise InputError(f"{runs} holds none of the runs {', '.join(RUNS)} trained and scored (NAME/train_config.json "
                         "and score-NAME-nx-own.json); nothing to collect")
    data = {"what": "SmolLM2-135M-Instruct heads at n = 4 trained by benchmarks/smollm2_rq2.sh from scratch for the "
                    "same steps on the same store of the LM's own text (its continuations of 512 standard-library "
                    "prompts, bf16 features), one thread each, scored teacher-forced on the LM's own greedy "
                    "continuations of 64 held-out networkx prompts",
            "heads": records}
    if plain is not None:
        data["plain_ms_per_step"] = round(1000 * plain["mu_lat"]["mean"], 2)
    RECORD.write_text(json.dumps(data, indent=1) + "\n")
    return data


def table(data: dict) -> str:
    decoding = all("decoding_tokens_per_cycle" in h for h in data["heads"])
    head = ("| structure | r | LoRA | tokens seen | train tok/s | minutes | MB | depth 1-3 top-1 | depth 1-3 top-8 | "
            "tokens/window (teacher-forced) |")
    rule = "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |"
    if decoding:
        head += " tokens/cycle (decoding) | ms/cycle |"
        rule += " ---: | ---: |"
    lines = [head, rule]
    for h in data["heads"]:
        line = (f"| {h['structure']} | {h['r'] or ''} | {h['lora_layers'] or ''} | {h['train_tokens']:,} | "
                f"{h['tokens_per_second']:,} | {h['minutes']:g} | {h['weights_megabytes']:.1f} | "
                f"{' / '.join(f'{x:.2f}' for x in h['depth_top1'])} | {' / '.join(f'{x:.2f}' for x in h['depth_top8'])} | "
                f"{h['teacher_forced_tokens_per_window']:.2f} |")
        if decoding:
            line += f" {h['decoding_tokens_per_cycle']:.2f} | {h['decoding_ms_per_cycle']:.1f} |"
        lines.append(line)
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("collect", "table"))
    parser.add_argument("--runs", default="runs/rq2")
    parser.add_argument("--bench", default="docs/bench/smollm2-rq2/bench.json")
    args = parser.parse_args(argv)
    if args.action == "collect" and not Path(args.runs).is_dir():
        parser.error(f"--runs {args.runs}: no such folder")
    data = collect(Path(args.runs), Path(args.bench)) if args.action == "collect" else json.loads(RECORD.read_text())
    print(table(data))


if __name__ == "__main__":
    run_main(main)
