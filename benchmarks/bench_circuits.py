"""circuitc against cirkit and against this machine's roofline, side by side in one run.

Structures: FF, CP, HMM and BTree over n=16 variables with v=256 states and r=32 units (the MtPC
paper's four). Programs: log-likelihood, all prefix marginals, sampling and MAP at B=1 and B=1024,
plus compile time. Parameters are shared (theta `[P]`, broadcast) because cirkit has no
per-example parameters; circuitc's per-example timings (theta `[B, P]`, what MTP uses) are an extra
column. cirkit has no prefix program: it gets all n masked marginals as one batch of n*B rows (its
IntegrateQuery with per-row masks); it has no MAP. circuitc's MAP at B=1024 is conditional on
per-example evidence (a random half of the variables observed), since shared parameters have one
unconditional MAP.

The roofline of a program is max(bytes / bandwidth, flops / matmul rate), with bandwidth and matmul
rate measured here, and bytes the unavoidable traffic: theta once, x and the output, and every
layer's values written and read once (leaves `[Q, B]`, sum outputs; for sampling the chosen
weight rows).

Every program is timed at each thread setting of `--threads` (default: 1 and torch's default for
this machine), eager first, cirkit right after in the same process; then the fused programs
(`circuitc.compile(..., fuse=True)`, torch.compile) of `--fuse-structures` are warmed up and timed
side by side with eager by `CompiledCircuit.warm_up` (last: inductor compiles take tens of seconds
each, and eager timings taken after them in the same process were slower, so the eager columns come
from before any compile).

Usage:
    python benchmarks/bench_circuits.py [--threads 1,2] [--fuse-structures BTree] [--out runs/circuits.json]
    python benchmarks/bench_circuits.py --quick    # tiny sizes, a few calls each: checks the script runs (seconds)

Without `--out` the report is printed only (benchmarks/results/ keeps the recorded runs).

Timings are medians; the machine is shared, so expect noise and compare ratios within one run.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: other processes share the cores

import argparse  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from circuitc.builders import btree_graph, cp_graph, ff_graph, hmm_graph  # noqa: E402
from circuitc.plan import Plan, lower  # noqa: E402
from circuitc.runtime import CompiledCircuit  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from script_args import ScriptParser, output_file, torch_threads  # noqa: E402

N, V, R = 16, 256, 32
PROGRAMS = ("log_prob", "prefix", "sample", "map")


@dataclass(frozen=True)
class Scale:
    """Sizes and repetitions of one run: the study's (`FULL`), or `QUICK` to check that the script runs."""

    n: int = N
    v: int = V
    r: int = R
    batch: int = 1024  # the large batch (the small one is 1)
    reps_one: int = 200
    reps_batch: int = 10
    big_vars: int = 5000  # the compile-time target's BTree

    def reps(self, batch: int, slow: bool = False) -> int:
        if slow:
            return min(3, self.reps_batch)
        return self.reps_one if batch == 1 else self.reps_batch

    def graph(self, structure: str):
        n, v, r = self.n, self.v, self.r
        return {"FF": lambda: ff_graph(n, v), "CP": lambda: cp_graph(n, r, v), "HMM": lambda: hmm_graph(n, r, v),
                "BTree": lambda: btree_graph(n, r, v)}[structure]()


FULL = Scale()
QUICK = Scale(n=4, v=8, r=2, batch=8, reps_one=2, reps_batch=2, big_vars=16)
STRUCTURES = ("FF", "CP", "HMM", "BTree")


def median_ms(fn, reps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


# ------------------------------------------------------------------ this machine's roofline

def measure_machine() -> dict[str, float]:
    """Memory bandwidth (GB/s, a large copy: read + write) and matmul rate (GFLOP/s, float32)."""
    big = torch.empty(64 * 2**20 // 4)  # 64 MiB, far beyond the caches
    big.uniform_()
    dst = torch.empty_like(big)
    copy_ms = median_ms(lambda: dst.copy_(big), 15)
    bandwidth = 2 * big.numel() * 4 / (copy_ms * 1e-3) / 1e9
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    mm_ms = median_ms(lambda: a @ b, 15)
    flops = 2 * 1024**3 / (mm_ms * 1e-3) / 1e9
    return {"bandwidth_gb_s": bandwidth, "matmul_gflop_s": flops}


def roofline_ms(plan: Plan, program: str, batch: int, machine: dict[str, float]) -> float:
    """Lower bound from the unavoidable traffic and FLOPs (see the module docstring)."""
    f32, i64 = 4, 8
    n, q = plan.num_vars, plan.num_leaves
    theta = plan.num_params * f32
    rows = {"prefix": "prefix"}.get(program, "full")
    sums = sum(sf.size * sf.units * sf.rows[rows] for layer in plan.layers for sf in layer.sums)
    sum_inputs = sum(sf.size * sf.inputs for sf in plan.sum_folds)
    # parameter work (normalising leaves and weights) is done once for shared parameters
    shared = 2 * q * plan.num_states + 3 * (plan.num_params - plan.num_input_params)
    key = {"prefix": "prefix_log_marginals"}.get(program, program)
    flops = max(plan.counts["flops"][key] - shared, 0) * batch + shared
    if program in ("log_prob", "prefix", "map"):
        values = (q + sums) * batch * f32 * 2  # written once, read once
        out = batch * (n if program in ("prefix", "map") else 1) * (i64 if program == "map" else f32)
        traffic = theta + batch * n * i64 + values + out
    else:  # sampling: the chosen weight rows and leaf rows, and the samples
        traffic = theta + batch * (sum_inputs * f32 + n * i64)
    return 1e3 * max(traffic / (machine["bandwidth_gb_s"] * 1e9), flops / (machine["matmul_gflop_s"] * 1e9))


# ------------------------------------------------------------------ circuitc

def bench_circuitc(graph, machine, scale: Scale = FULL) -> tuple[dict, Plan]:
    results = {"compile_ms": median_ms(lambda: CompiledCircuit(lower(graph)), 5, warmup=1)}
    plan = lower(graph)
    circ = CompiledCircuit(plan)
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(circ.num_params, generator=gen)
    n = graph.variables
    for batch in (1, scale.batch):
        x = torch.randint(graph.states, (batch, n), generator=gen)
        theta_b = theta.expand(batch, -1).contiguous()  # per-example parameters
        keep = torch.rand(batch, n, generator=gen) < 0.5
        reps = scale.reps(batch)
        with torch.no_grad():
            timings = {
                "log_prob": median_ms(lambda: circ.log_prob(x, theta), reps),
                "prefix": median_ms(lambda: circ.prefix_log_marginals(x, theta), reps),
                "sample": median_ms(lambda: circ.sample(theta, num_samples=batch, generator=gen), reps),
                # shared parameters give one MAP; a batch of MAPs differs by its evidence (half observed)
                "map": median_ms(lambda: circ.map(theta, evidence=x, keep=keep) if batch > 1 else circ.map(theta), reps),
                "log_prob_per_example": median_ms(lambda: circ.log_prob(x, theta_b), reps),
                "prefix_per_example": median_ms(lambda: circ.prefix_log_marginals(x, theta_b), reps),
            }
        results[batch] = timings
        results[f"roofline_{batch}"] = {p: roofline_ms(plan, p, batch, machine) for p in PROGRAMS}
    return results, plan


def bench_fused(graph, scale: Scale = FULL) -> dict:
    """The fused likelihood programs at B=1 and B=1024 (shared parameters, no grad): compile time,
    and fused against eager medians from `warm_up` (alternating calls)."""
    circ = CompiledCircuit(lower(graph), fuse=True)
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(circ.num_params, generator=gen)
    results = {}
    for batch in (1, scale.batch):
        x = torch.randint(graph.states, (batch, graph.variables), generator=gen)
        with torch.no_grad():
            report = circ.warm_up(x, theta, repeats=scale.reps(batch))
        results[batch] = {("prefix" if name == "prefix_log_marginals" else name): r for name, r in report.items()}
    return results


def bench_big_compile(scale: Scale = FULL) -> float:
    """Lowering a BTree over 5000 variables (9,999 regions), the compile-time target."""
    graph = btree_graph(scale.big_vars, scale.r, scale.v)
    start = time.perf_counter()
    CompiledCircuit(lower(graph))
    return 1e3 * (time.perf_counter() - start)


# ------------------------------------------------------------------ cirkit (optional)

def cirkit_available() -> bool:
    try:
        import cirkit  # noqa: F401
    except ImportError:
        return False
    return True


def to_cirkit_circuit(graph, units: int):
    """The same region graph as a cirkit symbolic circuit: categorical inputs, CP (hadamard) layers,
    softmax-parameterised sums (cirkit samples only from normalised weights)."""
    from cirkit.templates.region_graph.graph import PartitionNode, RegionNode
    from cirkit.templates.region_graph.graph import RegionGraph as CirkitRegionGraph
    from cirkit.templates.utils import Parameterization, name_to_input_layer_factory, parameterization_to_factory

    nodes = {rid: RegionNode(r.scope) for rid, r in graph.regions.items()}
    in_nodes: dict = {}
    all_nodes = list(nodes.values())
    for p in graph.partitions:
        partition = PartitionNode(graph.regions[p.parent].scope)
        all_nodes.append(partition)
        in_nodes.setdefault(nodes[p.parent], []).append(partition)
        in_nodes[partition] = [nodes[c] for c in p.children]
    region_graph = CirkitRegionGraph(all_nodes, in_nodes, [nodes[graph.root]])
    return region_graph.build_circuit(
        input_factory=name_to_input_layer_factory("categorical", num_categories=graph.states),
        sum_product="cp",
        sum_weight_factory=parameterization_to_factory(Parameterization(activation="softmax", initialization="normal")),
        num_input_units=units, num_sum_units=units, num_classes=1,
    )


def bench_cirkit(graph, units: int, scale: Scale = FULL) -> dict:
    from cirkit.backend.torch.queries import IntegrateQuery, SamplingQuery
    from cirkit.pipeline import PipelineContext

    def build():
        symbolic = to_cirkit_circuit(graph, units)
        return PipelineContext(backend="torch", semiring="lse-sum", fold=True, optimize=True).compile(symbolic)

    results = {"compile_ms": median_ms(build, 3, warmup=1)}
    circuit = build()
    gen = torch.Generator().manual_seed(0)
    integrate = IntegrateQuery(circuit)
    sample = SamplingQuery(circuit)
    # all prefixes as one batch: row (i, b) integrates out the variables after i
    n = graph.variables
    prefix_mask = torch.arange(n).unsqueeze(0) > torch.arange(n).unsqueeze(1)  # [n, n] True = integrate
    for batch in (1, scale.batch):
        x = torch.randint(graph.states, (batch, n), generator=gen)
        xs = x.repeat(n, 1)  # [n*B, n]
        masks = prefix_mask.repeat_interleave(batch, dim=0)
        reps = scale.reps(batch)
        with torch.no_grad():
            results[batch] = {
                "log_prob": median_ms(lambda: circuit(x), reps),
                "prefix": median_ms(lambda: integrate(xs, integrate_vars=masks), reps),
                "sample": median_ms(lambda: sample(num_samples=batch), scale.reps(batch, slow=batch > 1)),
            }
    return results


# ------------------------------------------------------------------ report

def table(report: dict) -> str:
    """One row per structure, program, batch and thread setting: eager, fused (where run), per-example
    eager, cirkit, cirkit's time over circuitc's best, the roofline and the best over the roofline."""
    head = (f"{'structure':<9} {'program':<9} {'B':>5} {'thr':>3} {'eager ms':>9} {'fused ms':>9} {'per-ex ms':>10} "
            f"{'cirkit ms':>10} {'speed-up':>9} {'roofline':>9} {'x roof':>7}")
    lines = [head, "-" * len(head)]
    for name, entry in report["structures"].items():
        for program in PROGRAMS:
            for batch in ("1", str(report["batch"])):
                for threads, run in entry["threads"].items():
                    ours, theirs, fused = run["circuitc"], run.get("cirkit"), run.get("fused", {})
                    t = ours[batch][program]
                    f = fused.get(batch, {}).get(program, {}).get("fused_ms")
                    best = min(t, f) if f is not None else t
                    per_example = ours[batch].get(f"{program}_per_example")
                    other = theirs[batch].get(program) if theirs else None
                    roof = ours[f"roofline_{batch}"][program]
                    lines.append(
                        f"{name:<9} {program:<9} {batch:>5} {threads:>3} {t:>9.3f} "
                        f"{(f'{f:.3f}' if f is not None else '-'):>9} "
                        f"{(f'{per_example:.3f}' if per_example is not None else '-'):>10} "
                        f"{(f'{other:.3f}' if other is not None else 'n/a'):>10} "
                        f"{(f'{other / best:.1f}x' if other is not None else '-'):>9} {roof:>9.3f} {best / roof:>6.1f}x")
        for threads, run in entry["threads"].items():
            theirs = run.get("cirkit")
            cirkit_compile = f"{theirs['compile_ms']:.1f}" if theirs else "n/a"
            lines.append(f"{name:<9} {'compile':<9} {'':>5} {threads:>3} {run['circuitc']['compile_ms']:>9.1f} {'':>9} "
                         f"{'':>10} {cirkit_compile:>10}")
        for threads, run in entry["threads"].items():
            for batch, programs in run.get("fused", {}).items():
                compiled = ", ".join(f"{p} {r['compile_s']:.0f} s ({r['uses']} kept)" for p, r in programs.items())
                lines.append(f"{name:<9} fused compile, B={batch}, {threads} thread(s): {compiled}")
    big = report["big_vars"]
    lines.append(f"BTree over {big} variables ({2 * big - 1:,} regions): compiled in {report['big_compile_ms']:.0f} ms")
    m = report["machine"]
    lines.append(f"machine: {m['bandwidth_gb_s']:.1f} GB/s copy bandwidth, {m['matmul_gflop_s']:.0f} GFLOP/s float32 "
                 f"matmul (1 thread); OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}; speed-up = cirkit / the "
                 f"faster of eager and fused; x roof = that time / the roofline")
    return "\n".join(lines)


def thread_settings(text: str) -> list[int]:
    """--threads: comma-separated torch thread counts, each as mtpc's --threads takes it."""
    try:
        return [torch_threads(t) for t in text.split(",")]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} (in {text!r})") from None


def main(argv: list[str] | None = None) -> None:
    default_threads = torch.get_num_threads()
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=thread_settings, default=",".join(map(str, sorted({1, default_threads}))),
                        help="torch intra-op thread settings, comma-separated (default: 1 and this machine's default, "
                             f"{default_threads})")
    parser.add_argument("--structures", default=",".join(STRUCTURES))
    parser.add_argument("--fuse-structures", default="BTree",
                        help="structures whose fused (torch.compile) programs are timed: names, 'all' or 'none' "
                             "(default: BTree; each takes minutes of inductor compiles)")
    parser.add_argument("--no-cirkit", action="store_true", help="skip cirkit even if it is installed")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and a few calls each, no fused programs: checks that the script runs")
    parser.add_argument("--out", type=output_file, default=None,
                        help="write the report as JSON here (default: print only)")
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    thread_counts = args.threads
    names = args.structures.split(",")
    fuse = "none" if args.quick else args.fuse_structures
    fused_names = {"all": names, "none": []}.get(fuse, fuse.split(","))
    unknown = [s for s in names + fused_names if s not in STRUCTURES]
    if unknown:
        parser.error(f"unknown structure(s) {', '.join(unknown)}; choose from {', '.join(STRUCTURES)}")

    torch.set_num_threads(1)
    machine = measure_machine()
    have_cirkit = cirkit_available() and not args.no_cirkit
    report = {"machine": machine, "threads": thread_counts, "default_threads": default_threads,
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "torch": torch.__version__,
              "platform": platform.platform(), "n": scale.n, "v": scale.v, "r": scale.r, "batch": scale.batch,
              "big_vars": scale.big_vars, "structures": {}}
    for name in names:
        graph = scale.graph(name)
        units = 1 if name == "FF" else scale.r
        runs = {}
        for count in thread_counts:
            torch.set_num_threads(count)
            ours, _ = bench_circuitc(graph, machine, scale)
            runs[str(count)] = {"circuitc": ours}
            if have_cirkit:
                runs[str(count)]["cirkit"] = bench_cirkit(graph, units, scale)
        report["structures"][name] = json.loads(json.dumps({"threads": runs}))  # int batch keys become strings
        print(f"{name} done", flush=True)
    torch.set_num_threads(1)
    report["big_compile_ms"] = bench_big_compile(scale)
    for name in fused_names:  # last: see the module docstring
        for count in thread_counts:
            torch.set_num_threads(count)
            fused = bench_fused(scale.graph(name), scale)
            report["structures"][name]["threads"][str(count)]["fused"] = json.loads(json.dumps(fused))
            print(f"{name} fused at {count} thread(s) done", flush=True)
    if not have_cirkit:
        print("cirkit not run (pip install libcirkit, or drop --no-cirkit): its columns are n/a")
    text = table(report)
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        report["table"] = text
        out.write_text(json.dumps(report, indent=1))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
