"""The GPU run in one command: the CUDA tests, what a cycle costs on an LM of SmolLM2-135M's shape, and
`mtpc bench` of the shipped byte LM and heads; everything that comes back is written into one folder.

    bash benchmarks/gpu.sh                 # on the GPU machine (writes into $OUT), about 5.5 minutes
    bash benchmarks/gpu.sh --only bench-sample train-head    # a second run: the stages the first left
    bash benchmarks/gpu.sh --dry-run       # the same stages at tiny sizes on the CPU
    python benchmarks/gpu.py --plan        # print the stages and their commands, run nothing

A device run may take 15 minutes in all, every start and wait counted, so one run is sized to leave room
for a second (`--budget-s`, 330 s). The stages run in the order of what they answer; each is a subprocess
with its own time limit and its log kept, and a stage the budget leaves out is named at the end with the
`--only` command that runs it:

1. `env`            the GPU, the driver and the versions of Python, torch, transformers, peft,
2. `tests`          `pytest -m cuda` over the test modules with CUDA tests (every test named as it ends,
                    so a cut run still says which passed),
3. `smollm2-shape`  what a cycle costs on an LM of SmolLM2-135M-Instruct's shape (its config, random
                    bf16 weights: its 98 MB GGUF file is more than a device run can carry), against a
                    compiled one-token step: the shipped SmolLM2 head (FF n=4, a 2,048-token draft
                    vocabulary) at verify widths 4 and 2, and an FF n=8 at width 8,
4. `bench-greedy`, `bench-sample`   `mtpc bench --device cuda --dtype bf16 --compile` of the shipped byte
                    LM with the shipped FF and BTree heads (with and without prompt lookup) against
                    compiled plain decoding and transformers' prompt lookup, on held-out networkx code,
                    greedy and T=1,
5. `train-head`     `mtpc train --device cuda` of a BTree n=8 head on the shipped byte LM for 30 seconds:
                    training tokens per second on a GPU,
6. `vllm`           only where vLLM is installed (`pip install -e .[vllm]`, or the image's `vllm==0.32.*`):
                    benchmarks/vllm_speed.py on the shipped byte LM with the ff8 head: vLLM plain, `ngram`,
                    the head and the head with prompt lookup, eager and compiled, 1 and 8 requests, greedy
                    and T=1 (about 6 minutes: a run of its own, `--only vllm`).

What comes back: `summary.json` (stages, times, environment, the bench tables, the cycle costs) and
`results.tar.gz` (logs, bench.json/bench.md, smollm2-shape.json, the training summary), both rewritten
after every stage, so a run cut short still returns what it finished.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mtpc.checks import positive_float  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from script_args import ScriptParser, output_folder, run_main  # noqa: E402

MiB = 1 << 20
MAX_FILE = 16 * MiB - 64 * 1024  # what one returned file may hold (a little under the 16 MiB limit)
BYTE_LM = ROOT / "models" / "byte-lm"
BYTE_HEADS = [ROOT / "models" / "heads" / "ff8", ROOT / "models" / "heads" / "btree8-r8"]
SMOLLM2_HEAD = ROOT / "models" / "heads" / "smollm2-ff4-k2048"
BUDGET_S = 330.0  # one run; a device run's 15 minutes, starts included, leave room for a second


@dataclasses.dataclass
class Stage:
    name: str
    argv: list[str]
    timeout_s: float
    cwd: Path = ROOT


@dataclasses.dataclass
class Sizes:
    """The knobs that differ between the GPU run and the dry run."""

    device: str
    cuda_tests: list[str]  # where `pytest -m cuda` looks
    bench: list[str]  # common `mtpc bench` flags
    corpus: str  # `mtpc bench --corpus`
    train: list[str]  # `mtpc train` flags
    smollm2: dict  # smollm2_shape_costs's spec, less its output path
    vllm: list[str]  # benchmarks/vllm_speed.py's flags, less its output
    timeouts: dict[str, float]


def cuda_test_files() -> list[str]:
    """The test modules with CUDA tests (only these are imported: a module needing a package the GPU
    machine lacks must not stop them)."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if "pytest.mark.cuda" in p.read_text())


def networkx_source() -> str:
    """The held-out code of results.md's byte-head benches: the installed networkx package's folder."""
    import networkx

    return str(Path(networkx.__file__).parent)


def gpu_sizes() -> Sizes:
    """Sized for about 5.5 minutes on one H100 or H200 (`--budget-s` cuts what does not fit); the timeouts
    are ceilings."""
    return Sizes(
        device="cuda",
        cuda_tests=cuda_test_files(),
        bench=["--num-prompts", "4", "--repeats", "2", "--prompt-len", "128", "--max-new-tokens", "128",
               "--lookup", "both", "--compile", "--dtype", "bf16", "--max-repetition", "0.9"],
        corpus=networkx_source(),
        train=["--minutes", "0.5", "--seq-len", "512", "--batch-size", "32", "--precision", "bf16",
               "--val-every", "100000", "--save-every", "100000", "--val-sequences", "8"],
        smollm2={"device": "cuda", "dtype": "bf16", "compile": True, "new_tokens": 128},
        vllm=["--dtype", "bfloat16", "--new-tokens", "128", "--methods", "plain", "ngram", "head", "head+lookup"],
        timeouts={"env": 60, "tests": 120, "smollm2-shape": 150, "bench-greedy": 120, "bench-sample": 100,
                  "train-head": 75, "vllm": 540},
    )


def dry_sizes() -> Sizes:
    """Tiny sizes on the CPU: every stage runs its real command for a few tokens or steps. The corpus is
    circuitc's sources: the split keys on paths relative to it, so its held-out file (grammars/pc.lark) is
    the same in every checkout and holds ample prompts for the dry run's benches."""
    return Sizes(
        device="cpu",
        cuda_tests=["tests/test_cuda.py"],
        bench=["--num-prompts", "1", "--repeats", "1", "--prompt-len", "16", "--max-new-tokens", "8",
               "--lookup", "both", "--threads", "1"],
        corpus=str(ROOT / "circuitc"),
        train=["--steps", "2", "--seq-len", "64", "--batch-size", "2", "--val-every", "2", "--val-sequences", "2",
               "--precision", "fp32", "--data", str(ROOT / "circuitc")],
        smollm2={"device": "cpu", "dtype": "fp32", "compile": False, "new_tokens": 4},
        vllm=["--dtype", "float32", "--new-tokens", "8", "--single", "2", "--batch", "2", "--modes", "eager",
              "--methods", "plain", "head", "--cost-repeats", "1"],
        timeouts={"env": 60, "tests": 120, "smollm2-shape": 240, "bench-greedy": 180, "bench-sample": 180,
                  "train-head": 120, "vllm": 600},
    )


# --------------------------------------------------------------------------- the stages

def mtpc(*args: str) -> list[str]:
    return [sys.executable, "-m", "mtpc.cli", *args]


def own(flag: str, spec: dict | None = None) -> list[str]:
    """This script run as one of its in-process stages (`spec`: the stage's arguments, as JSON)."""
    return [sys.executable, str(Path(__file__).resolve()), flag, *([] if spec is None else [json.dumps(spec)])]


def plan(sizes: Sizes, work: Path) -> list[Stage]:
    """Every stage's command, in the order they run; `work` holds the bench and training folders."""
    t = sizes.timeouts
    bench = ["--model", str(BYTE_LM), "--heads", *map(str, BYTE_HEADS), "--corpus", sizes.corpus,
             "--device", sizes.device, "--peers", "prompt-lookup", *sizes.bench, "--no-progress"]
    return [
        Stage("env", own("--env"), t["env"]),
        Stage("tests", own("--tests", {"cuda": sizes.cuda_tests}), t["tests"]),
        Stage("smollm2-shape", own("--smollm2-shape", {**sizes.smollm2, "out": str(work / "smollm2-shape.json")}),
              t["smollm2-shape"]),
        Stage("bench-greedy", mtpc("bench", *bench, "--mode", "greedy", "--out", str(work / "bench-greedy")),
              t["bench-greedy"]),
        Stage("bench-sample", mtpc("bench", *bench, "--mode", "sample", "--temperature", "1",
                                   "--out", str(work / "bench-sample")), t["bench-sample"]),
        Stage("train-head", mtpc("train", "--model", str(BYTE_LM), "--out", str(work / "heads" / "btree-n8-r8"),
                                 "--circuit", str(ROOT / "examples" / "btree.pc"), "-D", "n=8", "-D", "r=8",
                                 "--device", sizes.device, *sizes.train, "--no-progress"), t["train-head"]),
        *([Stage("vllm", [sys.executable, str(Path(__file__).parent / "vllm_speed.py"), "--model", str(BYTE_LM),
                          "--head", str(BYTE_HEADS[0]), "--code", sizes.corpus, *sizes.vllm,
                          "--out", str(work / "vllm-speed.json")], t["vllm"])] if vllm_installed() else []),
    ]


def vllm_installed() -> bool:
    """vLLM is importable here (the `vllm` stage runs only then)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def run_stage(stage: Stage, logs: Path, env: dict) -> dict:
    """Run one stage with its output in `logs/NAME.log`; returns its status, seconds and last lines."""
    log = logs / f"{stage.name}.log"
    start = time.perf_counter()
    with log.open("w") as f:
        f.write("$ " + " ".join(stage.argv) + "\n")
        f.flush()
        # its own process group: a timeout ends the stage's children too (pytest, compile workers)
        proc = subprocess.Popen(stage.argv, cwd=stage.cwd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=stage.timeout_s)
            status = "ok" if rc == 0 else f"failed (exit {rc})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = f"timed out after {stage.timeout_s:.0f} s"
    seconds = time.perf_counter() - start
    tail = log.read_text(errors="replace").splitlines()[-12:]
    return {"status": status, "seconds": round(seconds, 1), "tail": tail}


# --------------------------------------------------------------------------- what the stages run in-process

def environment() -> dict:
    """The machine and the versions (printed and kept in summary.json)."""
    import platform

    import torch
    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "cuda_available": torch.cuda.is_available()}
    for name in ("peft", "lark", "scipy", "numpy", "safetensors", "networkx"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2 ** 30, 1),
                    capability=f"{props.major}.{props.minor}", bf16=torch.cuda.is_bf16_supported())
        smi = shutil.which("nvidia-smi")
        if smi:
            out = subprocess.run([smi, "--query-gpu=name,driver_version,clocks.max.sm,power.limit",
                                  "--format=csv,noheader"], capture_output=True, text=True)
            info["nvidia_smi"] = out.stdout.strip()
    return info


def run_tests(spec: dict) -> int:
    """`pytest -m cuda` over `spec["cuda"]`, each test named as it ends (a run cut by its time limit still
    says which passed); exit status 0 when they passed (or, without CUDA, all skipped)."""
    # `-o addopts=`: pyproject's addopts spread the suite over pytest-xdist workers; these tests run in one
    # process, one GPU. A module the machine cannot import must not stop the others.
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-m", "cuda", "-v", "-rfEs",
            "--durations", "10", "--continue-on-collection-errors", *spec["cuda"]]
    code = subprocess.run(argv, cwd=ROOT).returncode
    print(f"pytest -m cuda: exit {code}")
    return 0 if code in (0, 5) else 1  # 5: nothing collected (only where CUDA is missing)


# SmolLM2-135M-Instruct's shape (the config transformers reads from its GGUF file)
SMOLLM2_SHAPE = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                     intermediate_size=1536, vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0,
                     rms_norm_eps=1e-5, tie_word_embeddings=True)


def smollm2_shape_costs(spec: dict) -> int:
    """What decoding costs on an LM of SmolLM2-135M's shape with random weights (the costs are the shape's;
    tokens per cycle mean nothing here): a compiled plain step, and compiled cycles of the shipped SmolLM2
    head at verify widths 4 and 2 and of an untrained FF n=8 over the same draft vocabulary at width 8.
    Written to `spec["out"]` as JSON after each measurement, so a stage cut short keeps what it measured."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from circuitc.load import load_graph
    from mtpc import MTPHead, PlainDecoder, SpeculativeDecoder, load_head

    device = torch.device(spec["device"])
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[spec["dtype"]]
    torch.manual_seed(0)
    config = LlamaConfig(**SMOLLM2_SHAPE)
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    shipped = load_head(SMOLLM2_HEAD).to(device=device, dtype=dtype)
    vocabulary = list(shipped.vocabulary)
    ff8 = MTPHead(load_graph(str(ROOT / "examples" / "ff.pc"), n=8, v=len(vocabulary)), config.hidden_size,
                  parameterisation="tied", vocabulary=vocabulary, first_token_mlp=1024).to(device=device, dtype=dtype)
    for head in (shipped, ff8):  # tied heads: their input units are the LM's output layer
        head.tie_to(model.get_output_embeddings())
    prompt = torch.randint(0, config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(1)).to(device)
    new, compile = spec["new_tokens"], spec["compile"]
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "dtype": spec["dtype"],
              "compiled": compile, "shape": SMOLLM2_SHAPE, "prompt_tokens": 128, "new_tokens": new}

    def timed(decoder) -> tuple[float, float]:
        start = time.perf_counter()
        decoder.generate(prompt, new)  # compiles (untimed)
        compile_s = time.perf_counter() - start
        return 1e3 * decoder.generate(prompt, new).stats.mean_cycle_latency, compile_s

    def record(key: str, value) -> None:
        result[key] = value
        Path(spec["out"]).write_text(json.dumps(result, indent=1) + "\n")
        print(f"{key}: {value}", flush=True)

    step_ms, compile_s = timed(PlainDecoder(model, compile=compile))
    record("plain_step_ms", round(step_ms, 3))
    record("plain_compile_s", round(compile_s, 1))
    for name, head, width in (("ff4_shipped", shipped, 4), ("ff8", ff8, 8), ("ff4_shipped", shipped, 2)):
        cycle_ms, compile_s = timed(SpeculativeDecoder(model, head, window=width, compile=compile))
        record(f"{name}_width_{width}", {"cycle_ms": round(cycle_ms, 3), "cycle_over_step": round(cycle_ms / step_ms, 3),
                                         "compile_s": round(compile_s, 1)})
    return 0


# --------------------------------------------------------------------------- what comes back

def pack_results(work: Path, logs: Path, out: Path) -> None:
    """`out/results.tar.gz`: logs, bench outputs, the cycle costs, training summaries and logs."""
    keep = [logs, *sorted(work.glob("bench-*")), *sorted(work.glob("*.json"))]
    for folder in sorted((work / "heads").glob("*")):
        keep += [p for p in folder.glob("*.json*") if p.is_file()]
    tmp = out / "results.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for path in keep:
            tar.add(path, arcname=str(path.relative_to(work)))
    if tmp.stat().st_size > MAX_FILE:  # never a file that would not come back: the logs and summaries only
        with tarfile.open(tmp, "w:gz") as tar:
            for path in keep:
                if path.suffix in (".log", ".json", ".md") or path == logs:
                    tar.add(path, arcname=str(path.relative_to(work)))
    os.replace(tmp, out / "results.tar.gz")


def bench_tables(work: Path) -> dict:
    tables = {}
    for folder in sorted(work.glob("bench-*")):
        if (folder / "bench.md").is_file():
            tables[folder.name] = (folder / "bench.md").read_text()
    return tables


# --------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    p = ScriptParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU")
    p.add_argument("--plan", action="store_true", help="print the stages' commands and exit")
    p.add_argument("--out", type=output_folder, default=os.environ.get("OUT") or str(ROOT / "out" / "gpu"),
                   help="where the returned files go (default: $OUT, else out/gpu)")
    p.add_argument("--work", type=output_folder, default=None,
                   help="bench and training folders (default: a temporary folder)")
    p.add_argument("--only", nargs="+", default=None, metavar="STAGE", help="run only these stages")
    p.add_argument("--budget-s", type=positive_float, default=BUDGET_S,
                   help="stop starting stages (and cut the running one) this many seconds after the start, leaving "
                        "time to pack the results and, within a device run's 15 minutes, for a second run")
    p.add_argument("--env", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tests", default=None, help=argparse.SUPPRESS)
    p.add_argument("--smollm2-shape", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.env:
        print(json.dumps(environment(), indent=1))
        return 0
    if args.tests is not None:
        return run_tests(json.loads(args.tests))
    if args.smollm2_shape is not None:
        return smollm2_shape_costs(json.loads(args.smollm2_shape))

    sizes = dry_sizes() if args.dry_run else gpu_sizes()
    work = Path(args.work or tempfile.mkdtemp(prefix="mtpc-gpu-"))
    stages = plan(sizes, work)
    if args.only:
        unknown = set(args.only) - {s.name for s in stages}
        if unknown:
            p.error(f"unknown stages {sorted(unknown)}; choose from {[s.name for s in stages]}")
        stages = [s for s in stages if s.name in args.only]
    if args.plan:
        for s in stages:
            print(f"[{s.name}] (limit {s.timeout_s:.0f} s)\n  " + " ".join(s.argv))
        return 0
    return run_all(stages, sizes, work, Path(args.out), args.dry_run, args.budget_s)


def run_all(stages: list[Stage], sizes: Sizes, work: Path, out: Path, dry: bool, budget_s: float) -> int:
    out.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    if dry:
        env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    summary = {"dry_run": dry, "device": sizes.device, "work": str(work), "budget_s": budget_s, "stages": {}}
    start = time.perf_counter()
    for stage in stages:
        left = budget_s - (time.perf_counter() - start)
        if left < 15:
            summary["stages"][stage.name] = {"status": f"skipped (the {budget_s:.0f} s budget is spent)"}
        else:
            stage = dataclasses.replace(stage, timeout_s=min(stage.timeout_s, left))
            print(f"[{time.perf_counter() - start:6.0f} s] {stage.name} ...", flush=True)
            summary["stages"][stage.name] = result = run_stage(stage, logs, env)
            print(f"[{time.perf_counter() - start:6.0f} s] {stage.name}: {result['status']} "
                  f"({result['seconds']:.0f} s)", flush=True)
            print("\n".join("    " + line for line in result["tail"][-6:]), flush=True)
        if stage.name == "env" and summary["stages"]["env"]["status"] == "ok":
            summary["environment"] = _json_in((logs / "env.log").read_text())
        summary["seconds"] = round(time.perf_counter() - start, 1)
        summary["bench"] = bench_tables(work)
        if (work / "smollm2-shape.json").is_file():
            summary["smollm2_shape"] = json.loads((work / "smollm2-shape.json").read_text())
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        pack_results(work, logs, out)
    for name, table in summary["bench"].items():
        print(f"\n## {name}\n{table}")
    if "smollm2_shape" in summary:
        print("\n## smollm2-shape\n" + json.dumps(summary["smollm2_shape"], indent=1))
    print(f"\nwrote {', '.join(sorted(p.name for p in out.iterdir()))} into {out} "
          f"({time.perf_counter() - start:.0f} s)")
    left_out = [name for name, s in summary["stages"].items() if s["status"] != "ok"]
    if left_out:
        print(f"not done: {', '.join(left_out)}; again with: bash benchmarks/gpu.sh --only {' '.join(left_out)}"
              + (" --dry-run" if dry else ""))
    return 1 if left_out else 0


def _json_in(text: str) -> dict:
    """The JSON object a stage printed after its command line."""
    body = text[text.index("{"):] if "{" in text else "{}"
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        return {}


if __name__ == "__main__":
    sys.exit(run_main(main))
