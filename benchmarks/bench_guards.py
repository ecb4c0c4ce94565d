"""What a compiled cycle saves by checking its guards once per generation instead of on every call.

For each head (default: the shipped `models/heads/ff8` and `models/heads/btree8-r8` on `models/byte-lm`),
the decoder's two cycle steps (`verify_step`, then `decide_step`) are compiled ahead of time for one
sampled cycle after a prompt (`mtpc.decoding.compiling.precompiled_step`, not stored), then the cycle is
called alternately, `--calls` times per round over `--rounds` rounds, two ways:

- `per call`: `step(*args)`, each compiled step checking its guards on every call (what every compiled
  call did before: torch.compile's own wrapper checks them too);
- `per generation`: `step.checked(*args)`, the guards checked once, then the steps without them (what a
  compiled generation's cycles now run).

Prints the median milliseconds per call of each, their ratio, and the ratio's spread over rounds;
`--out FILE` writes them as JSON. Nothing is committed between calls: each call writes the same slots.

Usage:
    python benchmarks/bench_guards.py [--model models/byte-lm] [--heads ...] [--threads 1] [--rounds 15]
        [--calls 50] [--out FILE.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: other processes share the cores

import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from mtpc import SpeculativeDecoder, load_head  # noqa: E402
from mtpc.sampling import Sampling  # noqa: E402
from mtpc.decoding.cycle.acceptance import cycle_uniforms  # noqa: E402
from mtpc.decoding.compiling import precompiled_step  # noqa: E402
from mtpc.checks import positive_int  # noqa: E402
from mtpc.lm.loading import load_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from results_file import write_results  # noqa: E402
from bench_cycle import PROMPT  # noqa: E402
from script_args import ScriptParser, output_file, run_main, torch_threads  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def cycle_arguments(decoder: SpeculativeDecoder, target: Sampling) -> tuple[tuple, tuple]:
    """The arguments of one sampled cycle's verify and decide steps at the full width after `PROMPT`."""
    ids = torch.tensor([list(PROMPT)])
    logits, h = decoder.verifier.start(ids, [0], 4 * decoder.layout.span)
    uniforms = cycle_uniforms(1, 2 * decoder.n + decoder.layout.span, None, h.device)
    first = target.probs(logits).argmax(-1)  # [1]
    window = decoder.drafter.circuit_window(h, first, target, uniforms[:, :decoder.n])
    width = decoder.width
    places = decoder.verifier.places(width)
    verify_args = (window.tokens, window.shape, places)
    logits, hidden = decoder.verify_step(*verify_args)
    return verify_args, (target, window, places.slots, logits, hidden, torch.tensor([width]), torch.tensor([-1]),
                         uniforms)


def per_call_ms(step, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - start) / calls * 1e3


@torch.no_grad()
def measure(decoder: SpeculativeDecoder, rounds: int, calls: int) -> dict:
    target = Sampling(1.0)
    verify_args, decide_args = cycle_arguments(decoder, target)
    decoder.decide_step(*decide_args)  # eagerly first, as the decoder's warm-up does
    verify = precompiled_step(decoder.verify_step, verify_args, None, dynamic=[verify_args[2].kv_slots])
    decide = precompiled_step(decoder.decide_step, decide_args, None)
    checked = verify.checked(*verify_args), decide.checked(*decide_args)

    def cycle(verify_step, decide_step):
        verify_step(*verify_args)
        return decide_step(*decide_args)

    ways = {"per_call": lambda: cycle(verify, decide), "per_generation": lambda: cycle(*checked)}
    for way in ways.values():
        per_call_ms(way, 10)
    times = {name: [] for name in ways}
    for _ in range(rounds):
        for name, way in ways.items():
            times[name].append(per_call_ms(way, calls))
    ratios = [a / b for a, b in zip(times["per_call"], times["per_generation"])]
    return {"per_call_ms": statistics.median(times["per_call"]),
            "per_generation_ms": statistics.median(times["per_generation"]),
            "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios), **times}


def main(argv=None) -> dict:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "byte-lm"))
    parser.add_argument("--heads", nargs="+",
                        default=[str(ROOT / "models" / "heads" / h) for h in ("ff8", "btree8-r8")])
    parser.add_argument("--threads", type=torch_threads, default=1)
    parser.add_argument("--rounds", type=positive_int, default=15)
    parser.add_argument("--calls", type=positive_int, default=50)
    parser.add_argument("--out", type=output_file, default=None,
                        help="write the results as JSON here (default: print only)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    records = []
    for head_dir in args.heads:
        decoder = SpeculativeDecoder(model, load_head(head_dir).eval())
        records.append({"head": Path(head_dir).name, **measure(decoder, args.rounds, args.calls)})
    print(f"one compiled sampled cycle (verify and decide steps), threads={args.threads}, median ms per call over {args.rounds} rounds "
          f"of {args.calls} calls")
    print(f"{'head':<14}{'per call':>10}{'per generation':>16}{'ratio':>8}{'range':>14}")
    for r in records:
        print(f"{r['head']:<14}{r['per_call_ms']:>10.3f}{r['per_generation_ms']:>16.3f}{r['ratio']:>8.3f}"
              f"{r['ratio_min']:>7.2f}-{r['ratio_max']:.2f}")
    result = {"threads": args.threads, "rounds": args.rounds, "calls": args.calls, "model": Path(args.model).name,
              "torch": torch.__version__, "records": records}
    write_results(result, args.out)
    return result


if __name__ == "__main__":
    run_main(main)
