"""The circuit-speed targets for BTree n=16, v=256, r=32 (docs/results.md), measured interleaved: every candidate runs
once per round (one untimed call right before its timed one), round after round, and medians are
taken over rounds, so that load from other
processes on a shared machine hits all candidates alike (bench_circuits.py times one candidate
after another). The copy bandwidth behind the roofline is measured in the same rounds.

Candidates: circuitc eager at 1 thread and at `--threads` (default: torch's default), circuitc
fused (`fuse=True`, warmed up first) at 1 thread, cirkit at 1 thread (if installed), and optionally
another circuitc package (`--baseline MODULE`, e.g. a copy of an older checkout) for before/after.

Usage:
    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_circuit_targets.py [--rounds 200] [--baseline circuitc_old]
        [--out runs/circuit_targets.json]
    python benchmarks/bench_circuit_targets.py --quick    # tiny sizes, 2 rounds, no fused programs (seconds)

Without `--out` the tables are printed only (benchmarks/results/ keeps the recorded runs).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: other processes share the cores

import importlib  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from bench_circuits import FULL, QUICK, cirkit_available, roofline_ms, to_cirkit_circuit  # noqa: E402
from script_args import ScriptParser, output_file, torch_threads  # noqa: E402

from circuitc.builders import btree_graph  # noqa: E402
from circuitc.plan import lower  # noqa: E402
from circuitc.runtime import CompiledCircuit  # noqa: E402
from mtpc.checks import positive_int  # noqa: E402


def programs(circ, theta, x1, xb, keep, gen) -> dict:
    big = xb.shape[0]
    return {
        ("log_prob", 1): lambda: circ.log_prob(x1, theta),
        ("prefix", 1): lambda: circ.prefix_log_marginals(x1, theta),
        ("sample", 1): lambda: circ.sample(theta, 1, generator=gen),
        ("map", 1): lambda: circ.map(theta),
        ("log_prob", big): lambda: circ.log_prob(xb, theta),
        ("prefix", big): lambda: circ.prefix_log_marginals(xb, theta),
        ("map_evidence", big): lambda: circ.map(theta, evidence=xb, keep=keep),
    }


def main(argv: list[str] | None = None) -> None:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=200, help="rounds at B=1 (B=1024: a tenth)")
    parser.add_argument("--threads", type=torch_threads, default=torch.get_num_threads())
    parser.add_argument("--baseline", help="importable package with the same layout as circuitc (before/after)")
    parser.add_argument("--no-fuse", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, 2 rounds, no fused programs: checks that the script runs")
    parser.add_argument("--out", type=output_file, default=None,
                        help="write the tables as JSON here (default: print only)")
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    rounds = 2 if args.quick else args.rounds
    n, r, v, wide = scale.n, scale.r, scale.v, scale.batch
    torch.set_num_threads(1)
    graph = btree_graph(n, r, v)
    plan = lower(graph)
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(plan.num_params, generator=gen)
    x1 = torch.randint(v, (1, n), generator=gen)
    xb = torch.randint(v, (wide, n), generator=gen)
    keep = torch.rand(wide, n, generator=gen) < 0.5

    candidates: dict[str, tuple[int, dict]] = {}  # name -> (threads, {(program, batch): fn})
    eager = CompiledCircuit(plan)
    candidates["eager 1 thr"] = (1, programs(eager, theta, x1, xb, keep, gen))
    candidates[f"eager {args.threads} thr"] = (args.threads, programs(eager, theta, x1, xb, keep, gen))
    if args.baseline:
        old = importlib.import_module(f"{args.baseline}.runtime").CompiledCircuit(
            importlib.import_module(f"{args.baseline}.plan").lower(
                importlib.import_module(f"{args.baseline}.builders").btree_graph(n, r, v)))
        candidates["before 1 thr"] = (1, programs(old, theta, x1, xb, keep, gen))
        candidates[f"before {args.threads} thr"] = (args.threads, programs(old, theta, x1, xb, keep, gen))
    if not (args.no_fuse or args.quick):
        fused = CompiledCircuit(plan, fuse=True)
        with torch.no_grad():
            for x in (x1, xb):
                fused.warm_up(x, theta, repeats=3)
        likelihood = {k: f for k, f in programs(fused, theta, x1, xb, keep, gen).items()
                      if k[0] in ("log_prob", "prefix")}
        candidates["fused 1 thr"] = (1, likelihood)
    if cirkit_available():
        from cirkit.backend.torch.queries import IntegrateQuery, SamplingQuery
        from cirkit.pipeline import PipelineContext

        circuit = PipelineContext(backend="torch", semiring="lse-sum", fold=True, optimize=True).compile(
            to_cirkit_circuit(graph, r))
        integrate, sample = IntegrateQuery(circuit), SamplingQuery(circuit)
        mask = torch.arange(n).unsqueeze(0) > torch.arange(n).unsqueeze(1)
        xs1, m1 = x1.repeat(n, 1), mask
        xsb, mb = xb.repeat(n, 1), mask.repeat_interleave(wide, dim=0)
        candidates["cirkit 1 thr"] = (1, {
            ("log_prob", 1): lambda: circuit(x1), ("prefix", 1): lambda: integrate(xs1, integrate_vars=m1),
            ("sample", 1): lambda: sample(num_samples=1),
            ("log_prob", wide): lambda: circuit(xb), ("prefix", wide): lambda: integrate(xsb, integrate_vars=mb)})

    big = torch.empty(64 * 2**20 // 4).uniform_()
    dst = torch.empty_like(big)
    times: dict[tuple[str, str, int], list[float]] = {}
    copies: list[float] = []
    big_rounds = 2 if args.quick else max(rounds // 10, 5)
    for batch, batch_rounds in ((1, rounds), (wide, big_rounds)):
        with torch.no_grad():
            for k in range(batch_rounds + 2):
                for name, (threads, fns) in candidates.items():
                    torch.set_num_threads(threads)
                    for (program, b), fn in fns.items():
                        if b != batch:
                            continue
                        fn()  # untimed: the previous candidate (another library, thread count) left the caches cold
                        start = time.perf_counter()
                        fn()
                        if k >= 2:  # two warm-up rounds
                            times.setdefault((name, program, b), []).append(time.perf_counter() - start)
                torch.set_num_threads(1)
                if batch == wide:
                    start = time.perf_counter()
                    dst.copy_(big)
                    copies.append(time.perf_counter() - start)
    bandwidth = 2 * big.numel() * 4 / statistics.median(copies) / 1e9
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    mm = statistics.median([(lambda s: (a @ b, time.perf_counter() - s)[1])(time.perf_counter()) for _ in range(15)])
    machine = {"bandwidth_gb_s": bandwidth, "matmul_gflop_s": 2 * 1024**3 / mm / 1e9}
    medians = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    minimums = {k: 1e3 * min(v) for k, v in times.items()}
    names = list(candidates)
    rows = sorted({(p, b) for _, p, b in medians}, key=lambda k: (k[1], k[0]))
    lines = []
    for title, values in (("medians", medians), ("minimums (the least disturbed round)", minimums)):
        head = f"{'program':<13} {'B':>5} " + " ".join(f"{n:>14}" for n in names) + f" {'roofline':>9}"
        lines += [title, head, "-" * len(head)]
        for program, batch in rows:
            roof = roofline_ms(plan, "map" if program == "map_evidence" else program, batch, machine)
            cells = [f"{values[(n, program, batch)]:>14.3f}" if (n, program, batch) in values else f"{'-':>14}"
                     for n in names]
            lines.append(f"{program:<13} {batch:>5} " + " ".join(cells) + f" {roof:>9.3f}")
    lines.append(f"medians of {rounds} interleaved rounds at B=1, {big_rounds} at B={wide} (ms); "
                 f"copy bandwidth {bandwidth:.1f} GB/s (same rounds), matmul {machine['matmul_gflop_s']:.0f} GFLOP/s; "
                 f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    text = "\n".join(lines)
    print(text)
    if not args.out:
        return
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "medians_ms": {f"{n}|{p}|{b}": t for (n, p, b), t in medians.items()},
                               "minimums_ms": {f"{n}|{p}|{b}": t for (n, p, b), t in minimums.items()},
                               "table": text}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
