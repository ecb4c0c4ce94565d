"""Where one generation's time goes, op by op, inside the decoding loop: speculative and plain.

Timed alone, a step runs warm; inside the loop it runs after the others (`bench_cycle.py --cold`). This
script profiles whole generations instead: one untimed warm-up, then one generation of each decoder
under `torch.profiler`, and prints the top ops by their own time per cycle (plain decoding: per token),
with their calls per cycle and time per call. The speculative decoder's rows hold its verify call
(the LM's matmuls and attention for the window), its head, circuit and acceptance together; the
plain decoder's the LM's one-token step. The profiler adds a little to every op, so read the shares,
not the totals.

The prompt is `--prompt-bytes` bytes of `--prompt-file` from `--offset` (default: networkx's weighted
shortest paths, code the shipped LM never trained on), after the model's `<bos>`.

Usage:
    python benchmarks/profile_generate.py [--model models/byte-lm] [--head models/heads/btree8-r8]
        [--prompt-file FILE] [--offset 2000] [--prompt-bytes 400] [--max-new-tokens 256] [--greedy]
        [--top 20] [--threads 1] [--seed 0] [--out runs/profile.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: other processes share the cores

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from mtpc import SpeculativeDecoder, PlainDecoder, load_head  # noqa: E402
from mtpc.checks import non_negative_int, positive_int, seed  # noqa: E402
from mtpc.lm.loading import byte_tokenizer, load_model  # noqa: E402
from mtpc.sampling import GREEDY, Sampling  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from results_file import write_results  # noqa: E402
from script_args import ScriptParser, existing_file, output_file, run_main, torch_threads  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def default_prompt_file() -> str | None:
    try:
        import networkx
    except ImportError:
        return None
    return str(Path(networkx.__file__).parent / "algorithms" / "shortest_paths" / "weighted.py")


def op_table(run, cycles: int, top: int) -> list[dict]:
    """Profile `run()` and return its `top` ops by own CPU time: ms per cycle, calls per cycle, us per call."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run()
    rows = [{"op": e.key, "ms_per_cycle": e.self_cpu_time_total / 1e3 / cycles(), "calls_per_cycle": e.count / cycles(),
             "us_per_call": e.self_cpu_time_total / e.count} for e in prof.key_averages() if e.count]
    rows.sort(key=lambda r: -r["ms_per_cycle"])
    total = sum(r["ms_per_cycle"] for r in rows)
    for r in rows:
        r["share"] = r["ms_per_cycle"] / total if total else 0.0
    return rows[:top]


def main(argv=None) -> dict:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "byte-lm"))
    parser.add_argument("--head", default=str(ROOT / "models" / "heads" / "btree8-r8"))
    parser.add_argument("--prompt-file", type=existing_file, default=default_prompt_file())
    parser.add_argument("--offset", type=non_negative_int, default=2000)
    parser.add_argument("--prompt-bytes", type=positive_int, default=400)
    parser.add_argument("--max-new-tokens", type=positive_int, default=256)
    parser.add_argument("--greedy", action="store_true", help="greedy decoding (default: sampling at T = 1)")
    parser.add_argument("--top", type=positive_int, default=20, help="ops to list per decoder")
    parser.add_argument("--threads", type=torch_threads, default=1)
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument("--out", type=output_file, default=None,
                        help="write the tables as JSON here (default: print only)")
    args = parser.parse_args(argv)
    if args.prompt_file is None:
        parser.error("--prompt-file is needed (networkx, the default's source, is not installed)")
    data = Path(args.prompt_file).read_bytes()[args.offset:args.offset + args.prompt_bytes]
    if not data or args.max_new_tokens < 1 or args.top < 1:
        parser.error("the prompt is empty (check --offset against the file's size) or a count is below 1")
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    ids = torch.tensor([byte_tokenizer(args.model).encode(data, add_bos=True)])
    decoder = SpeculativeDecoder(model, load_head(args.head).eval())
    sampling = GREEDY if args.greedy else Sampling(1.0)
    plain = PlainDecoder(model)
    runs = {"speculative": lambda g: decoder.generate(ids, args.max_new_tokens, sampling, generator=g),
            "plain": lambda g: plain.generate(ids, args.max_new_tokens, sampling, generator=g)}
    tables = {}
    for name, run in runs.items():
        run(torch.Generator().manual_seed(args.seed))  # warm-up, untimed
        outputs = []
        tables[name] = op_table(lambda: outputs.append(run(torch.Generator().manual_seed(args.seed))),
                                lambda: outputs[0].stats.cycles, args.top)
        tables[name + "_cycles"] = outputs[0].stats.cycles
    mode = "greedy" if args.greedy else "sampling at T = 1"
    for name in runs:
        unit = "cycle" if name == "speculative" else "token"
        print(f"{name}: {tables[name + '_cycles']} {unit}s, {mode}, threads={args.threads}; top ops by own time")
        print(f"{'op':<52}{f'ms/{unit}':>10}{'share':>8}{f'calls/{unit}':>13}{'us/call':>10}")
        for r in tables[name]:
            print(f"{r['op'][:51]:<52}{r['ms_per_cycle']:>10.3f}{r['share']:>8.1%}{r['calls_per_cycle']:>13.1f}"
                  f"{r['us_per_call']:>10.1f}")
    result = {"threads": args.threads, "model": Path(args.model).name, "head": Path(args.head).name,
              "prompt": f"{Path(args.prompt_file).name}[{args.offset}:{args.offset + len(data)}]",
              "max_new_tokens": args.max_new_tokens, "mode": mode, **tables}
    write_results(result, args.out)
    return result


if __name__ == "__main__":
    run_main(main)
