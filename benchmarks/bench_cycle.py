"""The three steps of one speculative cycle at batch 1, eager and compiled: draft, verify, accept, and the
decoder's whole cycle step.

For each head (default: the shipped `models/heads/ff8` and `models/heads/btree8-r8` on `models/byte-lm`)
and each target (greedy, sampling at T=1), on the real hidden state of a prompt, each step is timed on
its own, eagerly and compiled as the decoder runs its compiled step: compiled ahead of time with its
guards checked once (`mtpc.decoding.compiling.precompiled_step`, then `CompiledStep.checked`; the
acceptance, a function rather than a method, through `compile_step`, which checks its guards per call):

- `draft`: `decoder.drafter.circuit_window` (head -> circuit window -> proposal rows and verify width),
- `verify`: `decoder.verifier.forward` of one window of the circuit's full width (nothing is committed:
  every call writes the same slots after the prompt),
- `accept`: `mtpc.decoding.cycle.acceptance.accept_window` (the whole window's acceptance),
- `cycle`: the decoder's cycle at the full width as `SpeculativeDecoder(compile=True)` runs it:
  `decoder.verify_step` (the model's call), then `decoder.decide_step` (acceptance and next draft), each one
  graph when compiled. `sum` - `cycle` is what the two graphs save;
- `one graph`: the same two steps in one function (`OneGraph`), one graph when compiled: what the decoder
  compiled before its verify step was made a graph of its own (shared by greedy and sampling cycles);
  `cycle` / `one graph` is what the second graph costs a cycle.

Medians over `--repeats` calls, milliseconds, at `--threads` torch threads (say it with every number).
Eager, each step's tensor ops are counted too (`*_ops`: the top-level aten calls of one call, under the
torch profiler): unlike the milliseconds, which drift between runs on a shared machine, the count is
the same in every run, so two checkouts compare exactly.

`--cold` times every step a second time right after evicting the CPU caches (`*_cold_ms`: an untimed
copy of a buffer of `--evict-mib` MiB, well past the last-level cache, before each call). Called over
and over, a step finds its weights in the caches; inside a decoding cycle it runs after the others,
whose weights (the verify call's LM, the head) have pushed its own out, so the cold time bounds what
the step costs in a real cycle and the difference is what its weights' traffic costs.

Usage:
    python benchmarks/bench_cycle.py [--model models/byte-lm] [--heads models/heads/ff8 ...] [--threads 1]
        [--repeats 200] [--eager-only] [--cold] [--evict-mib 64] [--out runs/cycle.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: other processes share the cores

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from mtpc import SpeculativeDecoder, load_head  # noqa: E402
from mtpc.sampling import GREEDY, Sampling  # noqa: E402
from mtpc.decoding.cycle.acceptance import accept_window, cycle_uniforms  # noqa: E402
from mtpc.decoding.compiling import compile_step, precompiled_step  # noqa: E402
from mtpc.checks import positive_int  # noqa: E402
from mtpc.lm.loading import load_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from results_file import write_results  # noqa: E402
from bench_draft import median_ms  # noqa: E402
from script_args import ScriptParser, output_file, run_main, torch_threads  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROMPT = b"    def __init__(self, name, value):\n        self.name = name\n"
TARGETS = {"greedy": GREEDY, "sample": Sampling(1.0)}
WARMUP = 10  # untimed calls before each step is timed


class OneGraph:
    """The decoder's two cycle steps called from one method, so that `precompiled_step` compiles them as one
    graph."""

    def __init__(self, decoder: SpeculativeDecoder):
        self.decoder = decoder

    def step(self, tokens, shape, places, target, window, limit, eos, uniforms):
        logits, hidden = self.decoder.verify_step(tokens, shape, places)
        return self.decoder.decide_step(target, window, places.slots, logits, hidden, limit, eos, uniforms)


@torch.no_grad()
def step_times(decoder: SpeculativeDecoder, target: Sampling, repeats: int, compiled: bool,
               evict=None) -> dict[str, float]:
    """Milliseconds of the draft, verify and accept steps of one circuit cycle after `PROMPT`, one by one,
    and of the decoder's whole cycle (its verify and decide steps: two graphs when compiled); with
    `evict` (a function that empties the caches), each also timed right after it (`*_cold_ms`)."""
    ids = torch.tensor([list(PROMPT)])
    logits, h = decoder.verifier.start(ids, [0], 4 * decoder.layout.span)
    first = (target.probs(logits) if not target.greedy else logits).argmax(-1)  # [1]
    n, W = decoder.n, decoder.width
    eos = torch.tensor([-1])
    uniforms = cycle_uniforms(1, 2 * n + decoder.layout.span, None, h.device) if not target.greedy else None
    places = decoder.verifier.places(W)  # nothing is committed here: every call writes the same slots
    limit = torch.tensor([min(n, W)])

    draws = None if uniforms is None else uniforms[:, :n]
    window = decoder.drafter.circuit_window(h, first, target, draws)  # eagerly first: the draft program builds its plans
    tokens, rows = window.tokens[:, :W], None if window.rows is None else window.rows[:, :W]
    verified_logits, hidden = decoder.verifier.forward(tokens, places)
    tests = None if uniforms is None else uniforms[:, 2 * n:2 * n + W]

    def compiled_or_eager(step, *args):
        """`step` as the compiled decoder runs it: a method compiled ahead of time with its guards checked
        once (`CompiledStep.checked`, as a generation's cycles run), a function through `compile_step`."""
        if not compiled:
            return step
        if hasattr(step, "__self__"):
            return precompiled_step(step, args, None).checked(*args)
        return compile_step(step, False)

    circuit_window = compiled_or_eager(decoder.drafter.circuit_window, h, first, target, draws)
    verify_call = compiled_or_eager(decoder.verifier.forward, tokens, places)
    accept = compiled_or_eager(accept_window)
    verify_step = compiled_or_eager(decoder.verify_step, window.tokens, window.shape, places)
    decide_step = compiled_or_eager(decoder.decide_step, target, window, places.slots, verified_logits, hidden, limit,
                                    eos, uniforms)
    one_graph_args = (window.tokens, window.shape, places, target, window, limit, eos, uniforms)
    one_graph_step = compiled_or_eager(OneGraph(decoder).step, *one_graph_args)

    def draft():
        return circuit_window(h, first, target, draws)

    def verify():
        return verify_call(tokens, places)

    def accept_step():
        return accept(target, decoder.settings.acceptance, tokens, verified_logits, hidden, limit, eos, rows, tests)

    def cycle():
        cycle_logits, cycle_hidden = verify_step(window.tokens, window.shape, places)
        return decide_step(target, window, places.slots, cycle_logits, cycle_hidden, limit, eos, uniforms)

    def one_graph():
        return one_graph_step(*one_graph_args)

    steps = {"draft": draft, "verify": verify, "accept": accept_step, "cycle": cycle, "one_graph": one_graph}
    record = {f"{name}_ms": median_ms(step, repeats, WARMUP) for name, step in steps.items()}
    if evict is not None:
        record.update({f"{name}_cold_ms": median_ms(step, repeats, WARMUP, before=evict) for name, step in steps.items()})
    if not compiled:
        record.update({f"{name}_ops": op_count(step) for name, step in steps.items()})
    return record


def eviction(mib: int):
    """A function that pushes everything out of the CPU caches: it copies one buffer of `mib` MiB into
    another (both made here, once)."""
    source = torch.ones(mib << 18)  # float32: 4 bytes each
    target = torch.empty_like(source)
    return lambda: target.copy_(source)


def op_count(step) -> int:
    """The top-level aten calls of one call of `step` (ops a kernel calls inside another are not counted)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    return sum(1 for event in prof.events() if event.name.startswith("aten::") and event.cpu_parent is None)


def main(argv=None) -> dict:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "byte-lm"))
    parser.add_argument("--heads", nargs="+", default=[str(ROOT / "models" / "heads" / h) for h in ("ff8", "btree8-r8")])
    parser.add_argument("--threads", type=torch_threads, default=1)
    parser.add_argument("--repeats", type=positive_int, default=200)
    parser.add_argument("--eager-only", action="store_true", help="skip the compiled decoder (seconds, not minutes)")
    parser.add_argument("--cold", action="store_true", help="also time every step right after evicting the caches")
    parser.add_argument("--evict-mib", type=positive_int, default=64, help="MiB the eviction copies (default 64)")
    parser.add_argument("--out", type=output_file, default=None,
                        help="write the records as JSON here (default: print only)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    evict = eviction(args.evict_mib) if args.cold else None
    records = []
    for head_dir in args.heads:
        head = load_head(head_dir).eval()
        decoder = SpeculativeDecoder(model, head, window=head.num_variables)  # the full width: comparable runs
        for compiled in (False,) if args.eager_only else (False, True):
            for mode, target in TARGETS.items():
                times = step_times(decoder, target, args.repeats, compiled, evict)
                records.append({"head": Path(head_dir).name, "mode": mode, "compiled": compiled, **times})
    print(f"one cycle's steps at batch 1, threads={args.threads}, median ms over {args.repeats} calls")
    print(f"{'head':<14}{'mode':<8}{'':<10}{'draft':>8}{'verify':>8}{'accept':>8}{'sum':>8}{'cycle':>8}{'1 graph':>8}"
          f"{'ops: draft':>12}{'verify':>8}{'accept':>8}{'cycle':>8}")
    for r in records:
        kind = "compiled" if r["compiled"] else "eager"
        total = r["draft_ms"] + r["verify_ms"] + r["accept_ms"]
        ops = "".join(f"{r[f'{step}_ops']:>{12 if step == 'draft' else 8}}" for step in ("draft", "verify", "accept", "cycle")
                      ) if not r["compiled"] else ""
        print(f"{r['head']:<14}{r['mode']:<8}{kind:<10}{r['draft_ms']:>8.3f}{r['verify_ms']:>8.3f}{r['accept_ms']:>8.3f}"
              f"{total:>8.3f}{r['cycle_ms']:>8.3f}{r['one_graph_ms']:>8.3f}{ops}")
    if args.cold:
        print(f"the same steps right after evicting the caches ({args.evict_mib} MiB copied, untimed, before each call)")
        print(f"{'head':<14}{'mode':<8}{'':<10}{'draft':>8}{'verify':>8}{'accept':>8}{'sum':>8}{'cycle':>8}")
        for r in records:
            kind = "compiled" if r["compiled"] else "eager"
            total = r["draft_cold_ms"] + r["verify_cold_ms"] + r["accept_cold_ms"]
            print(f"{r['head']:<14}{r['mode']:<8}{kind:<10}{r['draft_cold_ms']:>8.3f}{r['verify_cold_ms']:>8.3f}"
                  f"{r['accept_cold_ms']:>8.3f}{total:>8.3f}{r['cycle_cold_ms']:>8.3f}")
    result = {"threads": args.threads, "repeats": args.repeats, "model": Path(args.model).name,
              "evict_mib": args.evict_mib if args.cold else None, "records": records}
    write_results(result, args.out)
    return result


if __name__ == "__main__":
    run_main(main)
