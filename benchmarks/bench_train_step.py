"""Time of one `mtpc train` step, and where it goes: tokens per second per head and loss.

Each configuration is the trainer's own step: a `mtpc.training.trainer.Trainer` built from a
`TrainConfig` (frozen LM, the head, the data, AdamW), and `Trainer.train_step()` timed as a whole
(`--steps` timed steps after `--warmup`, median). One more step runs under `torch.profiler`, and the
labelled ranges the trainer and the losses open (`mtpc.lm_forward`, `mtpc.teacher_logits`,
`mtpc.head_forward`, `mtpc.circuit`, `mtpc.loss`, `mtpc.backward`, `mtpc.optimizer`) give the phases.
The ranges are inclusive and those of the recomputed blocks run again inside the backward pass, so
head and circuit are shown as forward + (recomputed in the backward); `backward` includes those.

Configurations (default: all, each with `--losses nll kl`):
    ff8                FF n=8, full head
    btree8-r8-shared   BTree n=8 r=8, shared head (also r16, r32)
    btree8-r8-full     BTree n=8 r=8, full head
`--tiny` runs the same code on a tiny random LM (d=32, 2 layers), n=4 circuits and short sequences
(the smoke test).

Before/after: `--compare OLD_ROOT` runs every configuration in two worker processes, one importing
the library from OLD_ROOT (e.g. a checkout of main), one from this checkout, and interleaves them
step by step (`--repeats` rounds, the order alternating), so a loaded machine slows both alike;
it reports the median seconds per step of each and the ratio. Pin it (`taskset -c 1`).

Usage:
    python benchmarks/bench_train_step.py [--model models/byte-lm] [--data FILE.jsonl] [--configs ff8 ...]
        [--losses nll kl] [--steps 3] [--warmup 1] [--window-stride 2] [--tiny] [--out FILE.json]
    python benchmarks/bench_train_step.py --compare /path/to/old/checkout [--repeats 5] ...
Prints a table; `--out FILE` also writes JSON (no file by default).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: other processes share the cores

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from script_args import ScriptParser, output_file, run_main, torch_threads  # noqa: E402

from mtpc.checks import non_negative_int, positive_int  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# name -> (circuit file, bindings, parameterisation); --tiny shrinks n and r
CONFIGS = {
    "ff8": ("ff.pc", {"n": 8}, "full"),
    "btree8-r8-shared": ("btree.pc", {"n": 8, "r": 8}, "shared"),
    "btree8-r16-shared": ("btree.pc", {"n": 8, "r": 16}, "shared"),
    "btree8-r32-shared": ("btree.pc", {"n": 8, "r": 32}, "shared"),
    "btree8-r8-full": ("btree.pc", {"n": 8, "r": 8}, "full"),
}
TINY_BINDINGS = {"n": 4, "r": 2}
LOSSES = ("nll", "kl")
# column -> the profiler ranges it adds up (what the trainer and the losses label)
PHASES = {
    "lm": ("mtpc.lm_forward", "mtpc.teacher_lm_forward"),
    "teacher": ("mtpc.teacher_logits",),
    "head": ("mtpc.head_forward",),
    "circuit": ("mtpc.circuit",),
    "loss": ("mtpc.loss",),
    "backward": ("mtpc.backward",),
    "optimizer": ("mtpc.optimizer",),
}
BACKWARD = "mtpc.backward"


# ------------------------------------------------------------------ the trainers


def tiny_model(folder: Path) -> str:
    """A random 2-layer d=32 byte LM saved as `mtpc tiny-lm` saves one."""
    from mtpc.lm.tokenizer import ByteTokenizer
    from mtpc.training.tiny_lm_setup import TinyLMConfig, build_model

    torch.manual_seed(0)
    tok = ByteTokenizer()
    model = build_model(TinyLMConfig(out="", context=64, d_model=32, layers=2, heads=2, ffn=64), tok)
    model.save_pretrained(folder)
    tok.save(folder)
    return str(folder)


def tiny_corpus(folder: Path) -> str:
    """A few files of this repository's own source."""
    folder.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "mtpc" / "training" / "data.py").read_text()
    for i in range(4):
        (folder / f"part{i}.py").write_text(text[i * 1500:(i + 1) * 1500 + 500])
    return str(folder)


def trainer_for(name: str, loss: str, args, work: Path):
    """The `Trainer` of one configuration (nothing is written: `train_step` only computes)."""
    from mtpc.training.trainer import Trainer
    from mtpc.training.trainer_setup import TrainConfig

    circuit, bindings, parameterisation = CONFIGS[name]
    if args.tiny:
        bindings = {k: TINY_BINDINGS[k] for k in bindings}
    cfg = TrainConfig(model=args.model, out=str(work / f"{name}-{loss}"), circuit=str(EXAMPLES / circuit),
                      bindings=dict(bindings), data=args.data, seq_len=args.seq_len, batch_size=args.batch_size,
                      steps=1_000_000, loss=loss, window_stride=args.window_stride,
                      parameterisation=parameterisation, progress=False, seed=0)
    return Trainer(cfg)


def timed_step(trainer) -> tuple[float, int]:
    """Seconds of one `train_step` and the tokens it trained on."""
    tokens = trainer.tokens
    start = time.perf_counter()
    trainer.train_step()
    return time.perf_counter() - start, trainer.tokens - tokens


# ------------------------------------------------------------------ phases


def profiled_phases(trainer) -> dict[str, dict[str, float]]:
    """Seconds per phase of one step, from the labelled ranges: `{"column": {"forward": s, "backward": s}}`
    (a range opened inside `mtpc.backward` is a recomputation and counts as backward)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.train_step()
    events = [e for e in prof.events() if e.name.startswith("mtpc.")]
    backward = [(e.time_range.start, e.time_range.end) for e in events if e.name == BACKWARD]
    phases = {}
    for column, names in PHASES.items():
        split = {"forward": 0.0, "backward": 0.0}
        for e in events:
            if e.name in names:
                inside = e.name != BACKWARD and any(s <= e.time_range.start and e.time_range.end <= t
                                                    for s, t in backward)
                split["backward" if inside or e.name == BACKWARD else "forward"] += e.time_range.elapsed_us() / 1e6
        phases[column] = split
    return phases


def measure(name: str, loss: str, args, work: Path) -> dict:
    trainer = trainer_for(name, loss, args, work)
    for _ in range(args.warmup):
        trainer.train_step()
    times, tokens = [], 0
    for _ in range(args.steps):
        seconds, tokens = timed_step(trainer)
        times.append(seconds)
    step = statistics.median(times)
    return {"config": name, "loss": loss, "tokens_per_step": tokens, "step_s": step, "step_s_all": times,
            "tokens_per_s": tokens / step, "head_weights": trainer.head.num_weights(),
            "phases_s": profiled_phases(trainer) if args.profile else {}}


def cell(split: dict[str, float]) -> str:
    forward, backward = split["forward"], split["backward"]
    return f"{forward:.3f}" + (f"+{backward:.3f}" if backward and forward else "") if forward else f"{backward:.3f}"


def print_table(rows: list[dict]) -> None:
    columns = list(PHASES)
    print(f"{'config':<19} {'loss':<4} {'tok/step':>8} {'s/step':>7} {'tok/s':>7}  "
          + " ".join(f"{c:>11}" for c in columns))
    for r in rows:
        phases = r["phases_s"]
        print(f"{r['config']:<19} {r['loss']:<4} {r['tokens_per_step']:>8} {r['step_s']:>7.3f} {r['tokens_per_s']:>7.0f}  "
              + " ".join(f"{cell(phases[c]) if phases else '-':>11}" for c in columns))
    print("phases in seconds per step; a+b: a in the forward pass, b recomputed in the backward (counted in "
          "backward too)")


# ------------------------------------------------------------------ before / after


def worker(args, work: Path) -> None:
    """Build every trainer, then run `NAME LOSS` steps read from stdin, one JSON line of seconds each."""
    trainers = {(name, loss): trainer_for(name, loss, args, work) for name in args.configs for loss in args.losses}
    for trainer in trainers.values():
        for _ in range(args.warmup):
            trainer.train_step()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        name, loss = line.split()
        seconds, tokens = timed_step(trainers[name, loss])
        print(json.dumps({"seconds": seconds, "tokens": tokens}), flush=True)


def start_worker(root: Path, argv: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", *argv], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(root))


def ask(process: subprocess.Popen, request: str | None = None) -> dict:
    if request is not None:
        process.stdin.write(request + "\n")
        process.stdin.flush()
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"a worker stopped (exit status {process.wait()})")
    return json.loads(line)


def compare(args, argv: list[str]) -> list[dict]:
    """Old (`--compare ROOT`) and new, interleaved step by step in two workers."""
    sides = {"old": start_worker(Path(args.compare).resolve(), argv), "new": start_worker(ROOT, argv)}
    try:
        for process in sides.values():
            ask(process)  # ready
        times = {(name, loss, side): [] for name in args.configs for loss in args.losses for side in sides}
        tokens = {}
        for rep in range(args.repeats):
            order = list(sides) if rep % 2 == 0 else list(reversed(sides))
            for name in args.configs:
                for loss in args.losses:
                    for side in order:
                        answer = ask(sides[side], f"{name} {loss}")
                        times[name, loss, side].append(answer["seconds"])
                        tokens[name, loss] = answer["tokens"]
    finally:
        for process in sides.values():
            process.stdin.close()
            process.wait()
    rows = []
    for name in args.configs:
        for loss in args.losses:
            old, new = (statistics.median(times[name, loss, s]) for s in ("old", "new"))
            rows.append({"config": name, "loss": loss, "tokens_per_step": tokens[name, loss],
                         "old_step_s": old, "new_step_s": new, "old_tokens_per_s": tokens[name, loss] / old,
                         "new_tokens_per_s": tokens[name, loss] / new, "speedup": old / new,
                         "old_all": times[name, loss, "old"], "new_all": times[name, loss, "new"]})
    print(f"{'config':<19} {'loss':<4} {'old s/step':>10} {'new s/step':>10} {'old tok/s':>9} {'new tok/s':>9} "
          f"{'speed-up':>8}")
    for r in rows:
        print(f"{r['config']:<19} {r['loss']:<4} {r['old_step_s']:>10.3f} {r['new_step_s']:>10.3f} "
              f"{r['old_tokens_per_s']:>9.0f} {r['new_tokens_per_s']:>9.0f} {r['speedup']:>7.2f}x")
    return rows


# ------------------------------------------------------------------ command line


def parse(argv: list[str] | None):
    p = ScriptParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(ROOT / "models" / "byte-lm"))
    p.add_argument("--data", default=None, help="training data (default: the standard library sources)")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    p.add_argument("--seq-len", type=positive_int, default=512)
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--window-stride", type=positive_int, default=2)
    p.add_argument("--steps", type=positive_int, default=3, help="timed steps per configuration (median)")
    p.add_argument("--warmup", type=non_negative_int, default=1)
    p.add_argument("--threads", type=torch_threads, default=1)
    p.add_argument("--no-profile", dest="profile", action="store_false", help="skip the per-phase step")
    p.add_argument("--tiny", action="store_true", help="a tiny random LM, n=4 circuits, short sequences")
    p.add_argument("--compare", metavar="OLD_ROOT", help="interleave with the library of another checkout")
    p.add_argument("--repeats", type=positive_int, default=5, help="--compare: rounds")
    p.add_argument("--out", type=output_file, help="also write the results as JSON here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-train-step-") as work:
        run(args, argv, Path(work))


def run(args, argv: list[str], work: Path) -> None:
    if args.tiny and "--model" not in argv:
        args.model = tiny_model(work / "tiny-lm")
    if args.tiny and args.data is None:
        args.data = tiny_corpus(work / "corpus")
    if args.tiny and "--seq-len" not in argv:
        args.seq_len, args.batch_size = 32, 2
    if args.worker:
        return worker(args, work)
    if args.compare:
        forwarded = [a for a in argv if a not in ("--compare", args.compare)]
        forwarded += ["--model", args.model, "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size)]
        if args.data:
            forwarded += ["--data", args.data]
        rows = compare(args, [a for a in forwarded if a != "--tiny"] + (["--tiny"] if args.tiny else []))
        report = {"compare": str(args.compare), "threads": args.threads, "repeats": args.repeats, "rows": rows}
    else:
        rows = [measure(name, loss, args, work) for name in args.configs for loss in args.losses]
        print_table(rows)
        report = {"threads": args.threads, "window_stride": args.window_stride, "rows": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    run_main(main)
