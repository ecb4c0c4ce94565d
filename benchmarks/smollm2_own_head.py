"""The LM's own text at volume (benchmarks/smollm2_own_head.sh, smollm2_hour.sh, smollm2_chat_adds.sh): what
the training files hold, and each head's teacher-forced scores on the three held-out texts, side by side.

    python benchmarks/smollm2_own_head.py collect [--runs runs/own2]   # -> benchmarks/results/own_head_smollm2.json
    python benchmarks/smollm2_own_head.py table                        # the markdown tables of docs/results.md
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

RECORD = ROOT / "benchmarks" / "results" / "own_head_smollm2.json"
TEXTS = {"nx-own": "the LM's own networkx continuations", "nx": "networkx's sources",
         "nx-chat": "the LM's answers about networkx"}
# score name -> (row label, training folder under RUNS, or None: the shipped head)
HEADS = {"shipped": ("smollm2-ff4-k2048 (shipped)", None),
         "own": ("smollm2-ff4-k2048-own: the shipped head + 30 min of both texts", "head"),
         "cp4-hour": ("CP r = 8 from scratch, 60 min of the continuations", "cp4-hour"),
         "cp4-mixed": ("smollm2-cp4-k2048-own: the CP's hour + 60 min of both texts", "cp4-mixed"),
         "cp4-third": ("the CP's two hours + 60 min more of both texts, half the learning rate", "cp4-third"),
         "adds-continuations": ("the shipped head + 120 steps of continuations", "adds-continuations"),
         "adds-mixed": ("the shipped head + 120 steps of continuations and answers", "adds-mixed")}
FILES = ("stdlib-own.jsonl", "stdlib-chat.jsonl", "nx-chat.jsonl")


def file_record(path: Path) -> dict:
    """Records, and the LM's tokens in them (prompt, completion), of a `mtpc distill-data` file."""
    records = prompt = completion = 0
    for line in path.read_text().splitlines():
        record = json.loads(line)
        records += 1
        prompt += len(record["prompt_ids"])
        completion += len(record["completion_ids"])
    return {"records": records, "prompt_tokens": prompt, "completion_tokens": completion}


def training_record(folder: Path) -> dict:
    cfg = json.loads((folder / "train_config.json").read_text())
    return {"features": cfg["features"], "init_head": cfg.get("init_head"), "circuit": cfg["circuit"],
            "bindings": cfg["bindings"], "steps": cfg["steps"], "train_tokens": cfg["train_tokens"],
            "minutes": round(cfg["train_seconds"] / 60, 1), "tokens_per_second": cfg["tokens_per_second"],
            "lr": cfg["lr"], "val_accepted": cfg["val_accepted"]}


def collect(runs: Path) -> dict:
    heads = {}
    for name, (label, folder) in HEADS.items():
        scores = {text: json.loads((runs / f"score-{name}-{text}.json").read_text()) for text in TEXTS
                  if (runs / f"score-{name}-{text}.json").is_file()}
        if len(scores) < len(TEXTS):
            continue
        heads[name] = {"label": label, **{t: {k: s[k] for k in ("val_accepted", "val_windows", "val_depth_topk")}
                                          for t, s in scores.items()}}
        if folder is not None:
            heads[name]["training"] = training_record(runs / folder)
    if not heads:  # before the record is written: an empty one would replace the recorded run
        raise InputError(f"{runs} holds no head scored on every text (score-HEAD-TEXT.json for {', '.join(TEXTS)}); "
                         "nothing to collect")
    data = {"what": "SmolLM2-135M-Instruct heads trained on the LM's own text (benchmarks/smollm2_own_head.sh, "
                    "smollm2_hour.sh, smollm2_chat_adds.sh), scored teacher-forced on held-out text no head saw",
            "files": {name: file_record(runs / name) for name in FILES if (runs / name).is_file()},
            "heads": heads}
    RECORD.write_text(json.dumps(data, indent=1) + "\n")
    return data


def table(data: dict) -> str:
    head = "| head |" + "".join(f" {what}: depth-1 top-1 | tokens/window |" for what in TEXTS.values())
    lines = [head, "| --- |" + " ---: | ---: |" * len(TEXTS)]
    for h in data["heads"].values():
        cells = "".join(f" {h[t]['val_depth_topk']['token'][0][0]:.3f} | {h[t]['val_accepted']:.2f} |" for t in TEXTS)
        lines.append(f"| {h['label']} |{cells}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("collect", "table"))
    parser.add_argument("--runs", default="runs/own2")
    args = parser.parse_args(argv)
    if args.action == "collect" and not Path(args.runs).is_dir():
        parser.error(f"--runs {args.runs}: no such folder")
    data = collect(Path(args.runs)) if args.action == "collect" else json.loads(RECORD.read_text())
    print(table(data))


if __name__ == "__main__":
    run_main(main)
