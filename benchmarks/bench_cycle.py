"""The three steps of one speculative cycle at batch 1, eager and compiled: draft, verify, accept.

For each head (default: the shipped `models/heads/ff8` and `models/heads/btree8-r8` on `models/byte-lm`)
and each target (greedy, sampling at T=1): a `SpeculativeDecoder` is built eager and with
`compile=True`, one short generation compiles and warms it, and then each step is timed on its own,
on the real hidden state of a prompt:

- `draft`: `decoder.drafter.draft` (head -> circuit window -> proposal rows; compiled: one graph),
- `verify`: `decoder.verifier.verify` of one window (the write position is put back afterwards),
- `accept`: `mtpc.decoding.decoder.decide` (the whole window's acceptance and the host packet; compiled
  through `mtpc.decoding.compiling.compile_step`, as the decoder does).

Medians over `--repeats` calls, milliseconds, at `--threads` torch threads (say it with every number).

Usage:
    python benchmarks/bench_cycle.py [--model models/byte-lm] [--heads models/heads/ff8 ...] [--threads 1]
        [--repeats 200] [--eager-only] [--out runs/cycle.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: other processes share the cores

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from mtpc import SpeculativeDecoder, load_head  # noqa: E402
from mtpc.decoding import Target  # noqa: E402
from mtpc.decoding.acceptance import window_uniforms  # noqa: E402
from mtpc.decoding.compiling import compile_step  # noqa: E402
from mtpc.decoding.decoder import decide  # noqa: E402
from mtpc.loading import load_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROMPT = b"    def __init__(self, name, value):\n        self.name = name\n"
TARGETS = {"greedy": Target(), "sample": Target(do_sample=True)}


def median_ms(fn, repeats: int, warmup: int = 10) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


@torch.no_grad()
def step_times(decoder: SpeculativeDecoder, accept, target: Target, repeats: int) -> dict[str, float]:
    """Milliseconds of the draft, verify and accept steps of one cycle after `PROMPT`."""
    ids = torch.tensor([list(PROMPT)])
    decoder.generate(ids, 2 * decoder.width, do_sample=target.do_sample)  # compiles every step for this target
    logits, h = decoder.verifier.start(ids, 4 * decoder.width)
    carried = target.probs(logits) if target.do_sample else logits
    x0 = int(carried.argmax())
    n = decoder.circuit.n
    eos = torch.tensor([-1])

    def uniforms():
        return window_uniforms(n + decoder.width, None, h.device) if target.do_sample else None

    def draft():
        u = uniforms()
        return decoder.drafter.draft(h, carried, x0, target, None, None, None, None if u is None else u[:n])

    window = draft()
    base = decoder.verifier.length

    def verify():
        out = decoder.verifier.verify(window.window)
        decoder.verifier.commit(base)
        return out

    verified_logits, hidden = verify()
    limit = torch.tensor(decoder.width)
    randomness = uniforms()

    def accept_step():
        u = None if randomness is None else randomness[n:]
        return accept(target, decoder.acceptance, window.window, verified_logits, hidden, limit, eos, window.rows, u,
                      window.own)

    return {"draft_ms": median_ms(draft, repeats), "verify_ms": median_ms(verify, repeats),
            "accept_ms": median_ms(accept_step, repeats)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "byte-lm"))
    parser.add_argument("--heads", nargs="+", default=[str(ROOT / "models" / "heads" / h) for h in ("ff8", "btree8-r8")])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--eager-only", action="store_true", help="skip the compiled decoder (seconds, not minutes)")
    parser.add_argument("--out", default=None, help="write the records as JSON here (default: print only)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    records = []
    for head_dir in args.heads:
        head = load_head(head_dir).eval()
        for compiled in (False,) if args.eager_only else (False, True):
            decoder = SpeculativeDecoder(model, head, compile=compiled)
            accept = compile_step(decide, False) if compiled else decide
            for mode, target in TARGETS.items():
                times = step_times(decoder, accept, target, args.repeats)
                records.append({"head": Path(head_dir).name, "mode": mode, "compiled": compiled, **times})
    print(f"one cycle's steps at batch 1, threads={args.threads}, median ms over {args.repeats} calls")
    print(f"{'head':<14}{'mode':<8}{'':<10}{'draft':>8}{'verify':>8}{'accept':>8}")
    for r in records:
        kind = "compiled" if r["compiled"] else "eager"
        print(f"{r['head']:<14}{r['mode']:<8}{kind:<10}{r['draft_ms']:>8.3f}{r['verify_ms']:>8.3f}{r['accept_ms']:>8.3f}")
    result = {"threads": args.threads, "repeats": args.repeats, "model": Path(args.model).name, "records": records}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
