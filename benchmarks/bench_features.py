"""Training a head from cached features (`mtpc train --features`) against training it on the live LM:
the same head, the same trainer, the same machine, tokens per second of whole optimizer steps.

Each configuration is a `mtpc.training.trainer.Trainer` built twice from one `TrainConfig`, once with
`features=DIR` (the LM's final hidden states read from `mtpc features`' shards) and once with the live
LM on the text the store was made from; `Trainer.train_step()` is timed as a whole (`--steps` timed
steps after `--warmup`, alternating the two so a drifting machine slows both alike; median). The live
trainer runs the LM in `--dtype` (the store's, unless given).

Usage (SmolLM2 from its GGUF, the store `mtpc features` wrote; one thread):
    OMP_NUM_THREADS=1 python benchmarks/bench_features.py --model SmolLM2-135M-Instruct.Q4_1.gguf \\
        --features runs/features-smollm2 --draft-vocab 1024 [--heads ff4 btree4-r2] [--dtype fp32 bf16] \\
        [--steps 3] [--out benchmarks/results/features.json]
Prints a table; `--out FILE` also writes JSON.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: other processes share the cores

import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_results  # noqa: E402
from script_args import ScriptParser, existing_folder, output_file, run_main  # noqa: E402

from mtpc.checks import dtype_name, non_negative_int, positive_int  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HEADS = {  # name -> (circuit file, bindings)
    "ff4": ("ff.pc", {"n": 4}),
    "btree4-r2": ("btree.pc", {"n": 4, "r": 2}),
    "btree4-r4": ("btree.pc", {"n": 4, "r": 4}),
}


def trainer(args, head: str, dtype: str, features: bool, out: Path):
    from mtpc.training.config import TrainConfig
    from mtpc.training.features import read_manifest
    from mtpc.training.trainer import Trainer

    circuit, bindings = HEADS[head]
    store = read_manifest(Path(args.features))["settings"]
    data = None if features or store["data"] == "stdlib" else store["data"]
    cfg = TrainConfig(model=args.model, out=str(out), circuit=str(ROOT / "examples" / circuit), bindings=bindings,
                      parameterisation="tied", draft_vocab=args.draft_vocab, features=args.features if features
                      else None, data=data, seq_len=store["seq_len"], batch_size=args.batch_size, steps=1000,
                      dtype=dtype, loss=args.loss, progress=False)
    return Trainer(cfg)


def step_seconds(run, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        run.train_step()
        times.append(time.perf_counter() - start)
    return times


def measure(args, head: str, dtype: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        runs = {"features": trainer(args, head, dtype, True, Path(tmp) / "f"),
                "live LM": trainer(args, head, dtype, False, Path(tmp) / "l")}
        times = {name: [] for name in runs}
        for name, run in runs.items():
            step_seconds(run, args.warmup)
        for _ in range(args.steps):  # alternate: drift slows both
            for name, run in runs.items():
                times[name] += step_seconds(run, 1)
        tokens = args.batch_size * runs["features"].cfg.seq_len
    rates = {name: tokens / statistics.median(t) for name, t in times.items()}
    return {"head": head, "dtype": dtype, "tokens_per_step": tokens,
            "seconds_per_step": {name: statistics.median(t) for name, t in times.items()},
            "tokens_per_second": {name: round(r) for name, r in rates.items()},
            "speedup": round(rates["features"] / rates["live LM"], 2)}


def main(argv: list[str] | None = None) -> None:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--features", required=True, type=existing_folder)
    parser.add_argument("--heads", nargs="+", default=["ff4", "btree4-r2"], choices=sorted(HEADS))
    parser.add_argument("--draft-vocab", type=positive_int, default=1024)
    parser.add_argument("--dtype", nargs="+", type=dtype_name, default=None,
                        help="the live LM's dtypes (default: the store's)")
    parser.add_argument("--loss", default="nll+kl")
    parser.add_argument("--batch-size", type=positive_int, default=8)
    parser.add_argument("--steps", type=positive_int, default=3)
    parser.add_argument("--warmup", type=non_negative_int, default=1)
    parser.add_argument("--out", type=output_file)
    args = parser.parse_args(argv)
    from mtpc.training.features import read_manifest

    stored = read_manifest(Path(args.features))["settings"]["dtype"]
    dtypes = args.dtype or [{"float32": "fp32", "bfloat16": "bf16"}.get(stored, "fp32")]
    rows = [measure(args, head, dtype) for head in args.heads for dtype in dtypes]
    print(f"{'head':<12} {'live LM dtype':<14} {'features tok/s':>15} {'live LM tok/s':>14} {'ratio':>6}")
    for r in rows:
        print(f"{r['head']:<12} {r['dtype']:<14} {r['tokens_per_second']['features']:>15,} "
              f"{r['tokens_per_second']['live LM']:>14,} {r['speedup']:>5.1f}x")
    write_results({"command": " ".join(["python benchmarks/bench_features.py", *(argv or sys.argv[1:])]), "threads": torch.get_num_threads(),
                   "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "machine": platform.processor() or
                   platform.machine(), "torch": torch.__version__, "draft_vocab": args.draft_vocab,
                   "loss": args.loss, "stored_dtype": stored, "rows": rows}, args.out)


if __name__ == "__main__":
    run_main(main)
