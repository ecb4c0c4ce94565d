"""A trained head's per-depth top-k acceptance on held-out text, as `mtpc train` records it for its own
validation windows (`val_depth_topk`): for each drafted depth, how often the LM's actual token is within
the circuit's k most probable given the true tokens before it (`token`), and how often every depth up to
it is (`path`: what a k-ary draft tree that deep could at most accept).

The held-out text comes as an `mtpc features` store of the model (its validation split), so the LM runs
once:

    mtpc features --model SmolLM2-135M-Instruct.Q4_1.gguf --data $NX --out runs/features-nx \\
        --max-tokens 1 --val-sequences 32 --dtype bf16 --threads 1
    python benchmarks/depth_acceptance.py --model SmolLM2-135M-Instruct.Q4_1.gguf \\
        --head models/heads/smollm2-ff4-k2048 --features runs/features-nx --windows 2048 \\
        --out benchmarks/results/depth_acceptance_smollm2.json

Prints the Markdown table (`depth_table`) and writes the record as JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mtpc.lm import loading  # noqa: E402
from mtpc.checks import positive_int  # noqa: E402
from mtpc.decoding import load_head_entry  # noqa: E402
from mtpc.errors import InputError  # noqa: E402
from mtpc.training.features import FeatureSet  # noqa: E402
from mtpc.training.trainer_setup import DraftModel  # noqa: E402
from mtpc.training.trainer_validation import depth_table, validate  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from results_file import write_results  # noqa: E402
from script_args import ScriptParser, existing_folder, output_file, run_main, torch_threads  # noqa: E402


def main(argv=None) -> dict:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--head", required=True)
    parser.add_argument("--features", required=True, type=existing_folder,
                        help="an mtpc features store of --model (its val split)")
    parser.add_argument("--split", choices=("val", "train"), default="val",
                        help="the store's split to score: train for a store of text no head was trained on (a few "
                             "records leave too few held-out documents)")
    parser.add_argument("--sequences", type=positive_int, default=64, help="held-out sequences read")
    parser.add_argument("--windows", type=positive_int, default=2048, help="held-out windows scored")
    parser.add_argument("--threads", type=torch_threads, default=1)
    parser.add_argument("--out", type=output_file, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    info = loading.model_info(args.model, subword_ok=True)
    cpu = torch.device("cpu")
    entry = load_head_entry(args.head, loading.load_model(args.model), args.model, torch.float32, None, cpu)
    val = FeatureSet(args.features, args.split, info, type(loading.model_tokenizer(info)).__name__)
    module = DraftModel(entry.model, entry.head, gamma=1.0, chunk_elements=1 << 22, amp=None, loss="kl")
    scores = validate(module, val, SimpleNamespace(val_sequences=args.sequences, val_windows=args.windows),
                      torch.device("cpu"))
    if not scores["val_windows"]:  # nothing scored: a record of NaN acceptance would read as a measurement
        raise InputError(f"--features {args.features}: its {args.split} split holds no window of "
                         f"{entry.head.num_variables} tokens in the head's states; nothing to score")
    record = {"model": Path(args.model).name, "head": str(args.head), "features": str(args.features), "split": args.split,
              "sequences": min(args.sequences, len(val)), **{k: v for k, v in scores.items() if k != "val_loss"}}
    print(depth_table(record))
    print(f"teacher-forced accepted length {record['val_accepted']:.3f} over {record['val_windows']} windows")
    write_results(record, args.out)
    return record


if __name__ == "__main__":
    run_main(main)
