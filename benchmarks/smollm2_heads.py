"""Which circuit structure drafts SmolLM2 best (the MtPC paper's RQ2 on a real LM): the heads
`benchmarks/smollm2_heads.sh` trains from the same cached features, compared side by side.

    python benchmarks/smollm2_heads.py collect [--runs runs]   # the runs' records -> benchmarks/results/smollm2_heads.json
    python benchmarks/smollm2_heads.py table                   # the markdown table of docs/results.md

`collect` reads each trained head's `train_config.json` (its structure, draft vocabulary, minutes, tokens
seen, held-out loss and teacher-forced tokens per cycle) and the size of its `head.safetensors`;
`table` prints the table from the recorded JSON (tests/test_doc_claims.py checks that docs/results.md
holds exactly it).
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

RECORD = ROOT / "benchmarks" / "results" / "smollm2_heads.json"
# run folder -> (structure, n, r): the runs benchmarks/smollm2_heads.sh makes, in the table's order
RUNS = {
    "h-ff4": ("FF", 4, None), "h-cp4": ("CP", 4, 8), "h-hmm4": ("HMM", 4, 8), "h-btree4": ("BTree", 4, 4),
    "h-ff8": ("FF", 8, None), "h-cp8": ("CP", 8, 8), "h-btree8": ("BTree", 8, 4),
    "h-ff4-k4096": ("FF", 4, None), "h-btree4-k4096": ("BTree", 4, 4), "h-ff4-21min": ("FF", 4, None),
}


def record_of(folder: Path, structure: str, n: int, r: int | None) -> dict:
    cfg = json.loads((folder / "train_config.json").read_text())
    vocabulary = cfg["draft_vocabulary"]
    return {"run": folder.name, "structure": structure, "n": n, "r": r, "draft_vocab": cfg["draft_vocab"],
            "minutes": cfg["minutes"], "steps": cfg["steps"], "train_tokens": cfg["train_tokens"],
            "tokens_per_second": cfg["tokens_per_second"], "val_loss": round(cfg["val_loss"], 4),
            "teacher_forced_tokens_per_cycle": round(cfg["val_accepted"], 4),
            "accept_hist": cfg["val_accept_hist"], "val_coverage": vocabulary["val_coverage"],
            "head_megabytes": round((folder / "head.safetensors").stat().st_size / 1e6, 2),
            "dtype": cfg["dtype"], "loss": cfg["loss"], "first_token_mlp": cfg["first_token_mlp"]}


def collect(runs: Path) -> dict:
    records = [record_of(runs / name, *spec) for name, spec in RUNS.items() if (runs / name / "train_config.json").is_file()]
    if not records:  # before the record is written: an empty one would replace the recorded run
        raise InputError(f"{runs} holds none of the runs {', '.join(RUNS)} (their train_config.json); nothing to "
                         "collect")
    data = {"what": "heads trained by benchmarks/smollm2_heads.sh from runs/features-smollm2 (mtpc features, "
                    "1M tokens of the Python standard library, bf16), one thread each, alone on a 2-core CPU",
            "heads": records}
    RECORD.write_text(json.dumps(data, indent=1) + "\n")
    return data


def table(data: dict) -> str:
    lines = ["| structure | n | r | K | minutes | tokens seen | train tok/s | head MB | held-out loss | "
             "tokens/cycle (teacher-forced) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for h in data["heads"]:
        lines.append(f"| {h['structure']} | {h['n']} | {h['r'] or ''} | {h['draft_vocab']:,} | {h['minutes']:g} | "
                     f"{h['train_tokens']:,} | {h['tokens_per_second']:,} | {h['head_megabytes']:.1f} | "
                     f"{h['val_loss']:.2f} | {h['teacher_forced_tokens_per_cycle']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    p = ScriptParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("collect", "table"))
    p.add_argument("--runs", default=str(ROOT / "runs"), help="where smollm2_heads.sh trained the heads")
    args = p.parse_args()
    if args.what == "collect" and not Path(args.runs).is_dir():
        p.error(f"--runs {args.runs}: no such folder")
    data = collect(Path(args.runs)) if args.what == "collect" else json.loads(RECORD.read_text())
    print(table(data))


if __name__ == "__main__":
    run_main(main)
