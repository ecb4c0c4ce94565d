"""Per-cycle drafting cost of circuit heads at batch 1: the head's matmul and the circuit's draft.

For each structure (FF, CP, HMM, BTree) x head parameterisation (full, shared, factorised) x thread
count: the head's forward `h [d] -> theta [P]` in float32 and bfloat16, and for each greedy draft
strategy the circuit's draft from theta (what `SpeculativeDecoder` runs before its backbone call):

- `conditional`: sequential argmax of exact conditionals (the default; `circuitc.runtime.draft.DraftProgram.greedy`),
- `conditional+bonus`: the same given the verifier's bonus token as `x_0`,
- `marginal`: per-position marginal argmax (`DraftProgram.marginal_argmax`),
- `map`: max-product MAP (runtime), `sample`: one circuit sample (runtime),
- `conditional/layered`: the previous implementation (one upward pass of `log_marginal` over the `v`
  candidates per position), for comparison.

With `--model DIR` (a local Hugging Face causal LM, e.g. runs/tiny-lm) it also times one plain greedy
decoding step of that LM and reports each head's `head (the faster of f32/bf16) + draft` as a
fraction of it (the issue's target: at most 15%; the table shows it for the conditional draft).

Usage:
    python benchmarks/bench_draft.py [--n 8] [--r 8] [--v 256] [--d 256] [--threads 1 2] [--model runs/tiny-lm]
        [--out runs/draft.json]

Without `--out` the table is printed only (benchmarks/results/draft.json is the recorded run).

Timings are medians over `--repeats` calls; the machine is shared, so compare within one run.
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

from circuitc import builders  # noqa: E402
from circuitc.runtime.draft import DraftProgram  # noqa: E402
from mtpc import MTPHead, PlainDecoder  # noqa: E402

STRUCTURES = ("ff", "cp", "hmm", "btree")
PARAMETERISATIONS = ("full", "shared", "factorised")
STRATEGIES = ("conditional", "conditional+bonus", "marginal", "map", "sample", "conditional/layered")


def median_ms(fn, repeats: int, warmup: int = 5, before=None) -> float:
    """Median milliseconds of `fn()` over `repeats` calls after `warmup` untimed ones; `before()`, when
    given, runs untimed before every call (to put the machine in a state first)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def graph(structure: str, n: int, r: int, v: int):
    return {"ff": lambda: builders.ff_graph(n, v), "cp": lambda: builders.cp_graph(n, r, v),
            "hmm": lambda: builders.hmm_graph(n, r, v), "btree": lambda: builders.btree_graph(n, r, v)}[structure]()


def head_times(head: MTPHead, d: int, repeats: int) -> dict[str, float]:
    h = torch.randn(d)
    out = {}
    with torch.no_grad():
        out["head_f32_ms"] = median_ms(lambda: head(h), repeats)
        low = head.to(torch.bfloat16)
        hb = h.bfloat16()
        out["head_bf16_ms"] = median_ms(lambda: low(hb), repeats)
        head.to(torch.float32)
    return out


def layered_conditional(circ, theta: torch.Tensor) -> torch.Tensor:
    """`[n]` the sequential-argmax draft by upward passes: for each position, `log_marginal` of the `v`
    candidate states given the positions before it (what the decoder ran before `circuitc.runtime.draft`)."""
    n, v = circ.num_vars, circ.num_states
    x = torch.zeros(n, dtype=torch.long)
    for j in range(n):
        candidates = x[None].repeat(v, 1)  # [v, n]
        candidates[:, j] = torch.arange(v)
        x[j] = circ.log_marginal(candidates, torch.arange(n) <= j, theta[0]).argmax()
    return x


def draft_times(head: MTPHead, d: int, repeats: int) -> dict[str, float]:
    """Median ms per draft strategy, from one float32 theta (as the decoder computes it)."""
    with torch.no_grad():
        theta = head(torch.randn(d))[None]  # [1, P]
    circ = head.circ
    program = DraftProgram(head.graph, circ.param_layout)
    bonus = torch.tensor([7 % circ.num_states])
    gen = torch.Generator().manual_seed(0)
    runs = {
        "conditional": lambda: program.greedy(theta[0]),
        "conditional+bonus": lambda: program.greedy(theta[0], bonus),
        "marginal": lambda: program.marginal_argmax(theta[0]),
        "map": lambda: circ.map(theta),
        "sample": lambda: circ.sample(theta, num_samples=1, generator=gen),
        "conditional/layered": lambda: layered_conditional(circ, theta),
    }
    with torch.no_grad():
        return {name: median_ms(fn, max(10, repeats // 10) if name.endswith("layered") else repeats)
                for name, fn in runs.items()}


def lm_step_ms(model_dir: str, repeats: int) -> float:
    """Median per-token latency of plain greedy decoding (batch 1, KV cache)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompt = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(0))
    steps = []
    for _ in range(max(1, repeats // 64)):
        steps += PlainDecoder(model).generate(prompt, 64).stats.cycle_seconds[1:]
    return statistics.median(steps) * 1e3


def run(args) -> dict:
    records = []
    lm = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        if args.model:
            lm[threads] = lm_step_ms(args.model, args.repeats)
        for structure in args.structures:
            g = graph(structure, args.n, args.r, args.v)
            drafts = None
            for parameterisation in args.parameterisations:
                torch.manual_seed(0)
                head = MTPHead(g, args.d, parameterisation=parameterisation, sum_init_std=0.5,
                               adapter_rank=args.adapter_rank, factor_rank=args.factor_rank).eval()
                heads = head_times(head, args.d, args.repeats)
                drafts = drafts or draft_times(head, args.d, args.repeats)  # the circuit's cost: any head
                for strategy in STRATEGIES:
                    record = {"threads": threads, "structure": structure, "parameterisation": parameterisation,
                              "strategy": strategy, "params": head.num_weights(), **heads,
                              "draft_ms": drafts[strategy]}
                    if threads in lm:
                        record["lm_step_ms"] = lm[threads]
                        best = min(heads["head_f32_ms"], heads["head_bf16_ms"])  # the faster dtype
                        record["cycle_fraction"] = (best + drafts[strategy]) / lm[threads]
                    records.append(record)
    return {"config": vars(args), "lm_step_ms": lm, "records": records}


def table(result: dict) -> str:
    lines = []
    for threads in result["config"]["threads"]:
        step = result["lm_step_ms"].get(threads)
        title = f"threads={threads}" + (f", one LM step {step:.2f} ms (15% = {0.15 * step:.2f} ms)" if step else "")
        lines += [title, f"{'structure':9} {'head':10} {'params':>9} {'head f32':>9} {'head bf16':>9} "
                  + " ".join(f"{s:>13}" for s in STRATEGIES) + ("   (best head + cond) / step" if step else "")]
        rows = [r for r in result["records"] if r["threads"] == threads]
        keys = list(dict.fromkeys((r["structure"], r["parameterisation"]) for r in rows))
        for structure, parameterisation in keys:
            mine = {r["strategy"]: r for r in rows
                    if (r["structure"], r["parameterisation"]) == (structure, parameterisation)}
            first = mine["conditional"]
            cells = " ".join(f"{mine[s]['draft_ms']:13.3f}" for s in STRATEGIES)
            frac = f"   {first['cycle_fraction']:.1%}" if step else ""
            lines.append(f"{structure:9} {parameterisation:10} {first['params']:9d} {first['head_f32_ms']:9.3f} "
                         f"{first['head_bf16_ms']:9.3f} {cells}{frac}")
        lines.append("")
    return "\n".join(lines) + "(milliseconds, medians; draft columns are the circuit's draft from theta)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--r", type=int, default=8)
    parser.add_argument("--v", type=int, default=256)
    parser.add_argument("--d", type=int, default=256)
    parser.add_argument("--adapter-rank", type=int, default=16)
    parser.add_argument("--factor-rank", type=int, default=64)
    parser.add_argument("--structures", nargs="+", default=list(STRUCTURES), choices=STRUCTURES)
    parser.add_argument("--parameterisations", nargs="+", default=list(PARAMETERISATIONS), choices=PARAMETERISATIONS)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--model", help="a local causal LM directory: time one plain decoding step too")
    parser.add_argument("--out", default=None, help="write the records as JSON here (default: print only)")
    args = parser.parse_args(argv)
    result = run(args)
    print(table(result))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
