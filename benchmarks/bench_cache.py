"""How much a decoding step slows down when other memory is touched between its calls: the cache cliff.

A plain decoding step touches the LM's weights and little else; a speculative cycle touches the LM's
and the head's. When a loop's working set outgrows what the CPU's last-level cache holds for it, every
call finds its weights (and its code) evicted by the call before and runs from memory: the step time
jumps. This script measures where that happens on this machine, for the LM's one-token step (what
plain decoding runs per token) and its eight-token verify call, eager and compiled: between calls it
copies one buffer of `X` MiB into another (untimed; `X` from `--mib`, 0 = nothing), so the loop's
working set is the step's own plus `2X` MiB.

Medians over `--repeats` calls, milliseconds, one thread by default; the JSON has every `X`. Read it
against the head's size (`models/heads/*/model.safetensors`): a head that makes the cycle's working
set cross the cliff costs the cycle far more than its own FLOPs.

Usage:
    python benchmarks/bench_cache.py [--model models/byte-lm] [--mib 0 1 2 4 8 16] [--repeats 200]
        [--threads 1] [--eager-only] [--out runs/cache.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: other processes share the cores

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from mtpc.lm.backbone import SplitBackbone  # noqa: E402
from mtpc.decoding.compiling import precompiled_step  # noqa: E402
from mtpc.decoding.cycle.verify import Verifier  # noqa: E402
from mtpc.checks import non_negative_int, positive_int  # noqa: E402
from mtpc.lm.loading import load_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from results_file import write_results  # noqa: E402
from bench_cycle import PROMPT, eviction  # noqa: E402
from bench_draft import median_ms  # noqa: E402
from script_args import ScriptParser, output_file, run_main, torch_threads  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 10


@torch.no_grad()
def step_times(model, widths: tuple[int, ...], mibs: list[int], repeats: int, compiled: bool) -> list[dict]:
    """Per verify width and per `X` in `mibs`: the median ms of one verify call after `PROMPT` (nothing
    committed: every call writes the same slots) with `X` MiB copied between calls."""
    verifier = Verifier(SplitBackbone(model))
    ids = torch.tensor([list(PROMPT)])
    verifier.start(ids, [0], 64)
    records = []
    for W in widths:
        tokens = ids[:, -W:]
        places = verifier.places(W)
        call = verifier.forward
        if compiled:
            call = precompiled_step(verifier.forward, (tokens, places), None).checked(tokens, places)
        for mib in mibs:
            ms = median_ms(lambda: call(tokens, places), repeats, WARMUP, before=eviction(mib) if mib else None)
            records.append({"width": W, "compiled": compiled, "touched_mib": mib, "ms": ms})
    return records


def main(argv=None) -> dict:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "byte-lm"))
    parser.add_argument("--mib", type=non_negative_int, nargs="+", default=[0, 1, 2, 4, 8, 16])
    parser.add_argument("--repeats", type=positive_int, default=200)
    parser.add_argument("--threads", type=torch_threads, default=1)
    parser.add_argument("--eager-only", action="store_true", help="skip the compiled calls")
    parser.add_argument("--out", type=output_file, default=None,
                        help="write the records as JSON here (default: print only)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    weights_mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2 ** 20
    records = []
    for compiled in (False,) if args.eager_only else (False, True):
        records += step_times(model, (1, 8), args.mib, args.repeats, compiled)
    print(f"one verify call at batch 1 with X MiB copied between calls, threads={args.threads}, median ms over "
          f"{args.repeats} calls; the LM's weights: {weights_mib:.1f} MiB")
    print(f"{'call':<22}" + "".join(f"{f'X={m}':>9}" for m in args.mib))
    for compiled in sorted({r["compiled"] for r in records}):
        for W in (1, 8):
            row = [r for r in records if r["compiled"] == compiled and r["width"] == W]
            name = f"{'compiled' if compiled else 'eager'} width {W}"
            print(f"{name:<22}" + "".join(f"{r['ms']:>9.3f}" for r in row))
    result = {"threads": args.threads, "repeats": args.repeats, "model": Path(args.model).name,
              "weights_mib": weights_mib, "records": records}
    write_results(result, args.out)
    return result


if __name__ == "__main__":
    run_main(main)
