"""The GPU run in one command: tests on CUDA, a reference byte LM and two heads trained on the GPU,
and `mtpc bench` in the paper's regime; everything that comes back is written into one folder.

    bash benchmarks/gpu.sh                 # on the GPU machine (writes into $OUT), about 9 minutes
    bash benchmarks/gpu.sh --dry-run       # the same stages at tiny sizes on the CPU (seconds per stage)
    python benchmarks/gpu.py --plan        # print the stages and their commands, run nothing

Stages (each a subprocess with its own time limit, its log kept; a failed stage does not stop the ones
that do not need it):

1. `env`       the GPU, the driver and the versions of Python, torch, transformers, peft,
2. `tests`     `pytest -m cuda` (tests/test_cuda.py and the other CUDA tests), then a short slice of the
               default suite on the GPU machine,
3. `lm`        `mtpc tiny-lm --device cuda --precision bf16`: the reference byte LM (about 20M parameters),
4. `draft-lm`  a one-layer byte LM, the draft model of transformers' assisted generation,
5. `head-ff`   `mtpc train --device cuda`: FF n=8,
6. `head-btree` `mtpc train --device cuda`: BTree n=8 r=8, shared parameterisation,
7. `bench-greedy`, `bench-sample`   `mtpc bench --device cuda --compile` with both heads (with and
               without prompt lookup) and transformers' prompt lookup and assisted generation, greedy and T=1,
8. `smollm2-shape`   what a cycle costs on an LM of SmolLM2-135M-Instruct's shape (its config, random
               bf16 weights: its 98 MB GGUF file is more than a device run can carry), against a compiled
               one-token step: compiled plain decoding and a compiled tied FF head over a 2,048-token draft
               vocabulary at each verify width,
9. `bench-compiled-heads`   the heads' decoders built with `SpeculativeDecoder(..., compile=True)`
               (only where the decoder accepts it),
10. `export`   the LM and heads as bf16 safetensors.

What comes back (at most 8 files of at most 16 MiB): `summary.json` (stages, times, environment, the
bench tables), `results.tar.gz` (logs, bench.json/bench.md, training summaries and the bf16 heads;
rewritten after every stage, so a run cut short still returns what it finished), and the bf16 LM as
`lm-bf16.tar.partNN` chunks (`cat lm-bf16.tar.part* | tar -x` restores the folder).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
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
MiB = 1 << 20
MAX_FILE = 16 * MiB - 64 * 1024  # what one returned file may hold (a little under the 16 MiB limit)
MAX_FILES = 8


@dataclasses.dataclass
class Stage:
    name: str
    argv: list[str]
    timeout_s: float
    needs: tuple[str, ...] = ()
    cwd: Path = ROOT


@dataclasses.dataclass
class Sizes:
    """The knobs that differ between the GPU run and the dry run."""

    device: str
    cuda_tests: list[str]  # where `pytest -m cuda` looks
    tests: list[str]  # pytest arguments of the slice of the default suite
    lm: list[str]
    draft_lm: list[str]
    head: list[str]  # common `mtpc train` flags
    bench: list[str]  # common `mtpc bench` flags
    data: list[str]  # `--data X` for tiny-lm and train ([] = the Python standard library)
    corpus: str  # `mtpc bench --corpus`
    timeouts: dict[str, float]


def cuda_test_files() -> list[str]:
    """The test modules with CUDA tests (only these are imported: the GPU machine lacks some test-only
    packages other modules need, e.g. hypothesis)."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if "pytest.mark.cuda" in p.read_text())


def gpu_sizes() -> Sizes:
    """Sized for about 9 minutes on one H200: planned about 2 + 2.5 + 0.5 + 2 + 2.5 minutes (tests, LM,
    draft LM, heads, benches). The timeouts are ceilings; `--budget-s` cuts the last stages short."""
    return Sizes(
        device="cuda",
        cuda_tests=cuda_test_files(),
        tests=["tests/test_loss.py", "tests/test_kl_loss.py", "tests/test_head.py", "-x", "-q"],
        lm=["--d-model", "512", "--layers", "6", "--heads", "8", "--ffn", "1408", "--context", "1024",
            "--batch-size", "32", "--lr", "1e-3", "--minutes", "2", "--save-every", "100000"],
        draft_lm=["--d-model", "128", "--layers", "1", "--heads", "4", "--ffn", "352", "--context", "1024",
                  "--batch-size", "32", "--lr", "2e-3", "--minutes", "0.25", "--save-every", "100000"],
        head=["--minutes", "0.6", "--seq-len", "512", "--batch-size", "16", "--val-every", "100000",
              "--save-every", "100000", "--val-sequences", "8"],
        bench=["--num-prompts", "4", "--prompt-len", "128", "--max-new-tokens", "128", "--lookup", "both",
               "--compile", "--max-repetition", "0.9"],
        data=[], corpus="stdlib",
        timeouts={"env": 60, "tests": 130, "lm": 170, "draft-lm": 45, "head": 70, "bench-greedy": 120,
                  "bench-sample": 90, "smollm2-shape": 100, "bench-compiled-heads": 90, "export": 45},
    )


def dry_sizes() -> Sizes:
    """Tiny sizes on the CPU: every stage runs its real command for a few steps. The corpus is circuitc's
    sources: the split keys on paths relative to it, so its held-out file (grammars/pc.lark) is the
    same in every checkout and holds ample prompts for the dry run's benches (mtpc/training's
    held-out part is one 2 % tail with a single 16-token prompt)."""
    data = str(ROOT / "circuitc")
    return Sizes(
        device="cpu",
        cuda_tests=["tests/test_cuda.py"],
        tests=["tests/test_tokenizer.py", "-x", "-q"],
        lm=["--d-model", "32", "--layers", "2", "--heads", "2", "--ffn", "64", "--context", "128",
            "--batch-size", "2", "--steps", "2", "--precision", "fp32"],
        draft_lm=["--d-model", "16", "--layers", "1", "--heads", "2", "--ffn", "32", "--context", "128",
                  "--batch-size", "2", "--steps", "1", "--precision", "fp32"],
        head=["--steps", "2", "--seq-len", "64", "--batch-size", "2", "--val-every", "2", "--val-sequences", "2",
              "--precision", "fp32"],
        bench=["--num-prompts", "1", "--prompt-len", "16", "--max-new-tokens", "8", "--lookup", "both",
               "--threads", "1"],
        data=["--data", data], corpus=data,
        timeouts={"env": 60, "tests": 120, "lm": 120, "draft-lm": 120, "head": 120, "bench-greedy": 180,
                  "bench-sample": 180, "smollm2-shape": 180, "bench-compiled-heads": 180, "export": 60},
    )


# --------------------------------------------------------------------------- the stages

def mtpc(*args: str) -> list[str]:
    return [sys.executable, "-m", "mtpc.cli", *args]


def plan(sizes: Sizes, work: Path) -> list[Stage]:
    """Every stage's command; `work` holds the models, heads and bench folders."""
    lm, draft = work / "lm", work / "draft-lm"
    ff, btree = work / "heads" / "ff-n8", work / "heads" / "btree-n8-r8-shared"
    precision = [] if "--precision" in sizes.lm else ["--precision", "bf16"]
    train = ["--device", sizes.device, *sizes.head, *sizes.data, "--no-progress"]
    if "--precision" not in sizes.head:
        train += ["--precision", "bf16"]
    t = sizes.timeouts
    stages = [
        Stage("env", [sys.executable, str(Path(__file__).resolve()), "--env"], t["env"]),
        Stage("tests", [sys.executable, str(Path(__file__).resolve()), "--tests",
                        json.dumps({"cuda": sizes.cuda_tests, "slice": sizes.tests})], t["tests"]),
        Stage("lm", mtpc("tiny-lm", "--out", str(lm), "--device", sizes.device, *precision, *sizes.lm, *sizes.data,
                         "--no-progress"), t["lm"]),
        Stage("draft-lm", mtpc("tiny-lm", "--out", str(draft), "--device", sizes.device, *precision, *sizes.draft_lm,
                               *sizes.data, "--no-progress"), t["draft-lm"]),
        Stage("head-ff", mtpc("train", "--model", str(lm), "--out", str(ff), "--circuit",
                              str(ROOT / "examples" / "ff.pc"), "-D", "n=8", *train), t["head"], ("lm",)),
        Stage("head-btree", mtpc("train", "--model", str(lm), "--out", str(btree), "--circuit",
                                 str(ROOT / "examples" / "btree.pc"), "-D", "n=8", "-D", "r=8",
                                 "--parameterisation", "shared", *train), t["head"], ("lm",)),
    ]
    stages.append(Stage("export", [sys.executable, str(Path(__file__).resolve()), "--export", str(work)],
                        t["export"], ("lm",)))  # before the benches: the LM comes back even if they run long
    bench = ["--model", str(lm), "--heads", str(ff), str(btree), "--corpus", sizes.corpus, "--device", sizes.device,
             "--peers", "prompt-lookup", f"assisted:{draft}", *sizes.bench, "--no-progress"]
    needs = ("lm", "draft-lm", "head-ff", "head-btree")
    stages += [
        Stage("bench-greedy", mtpc("bench", *bench, "--mode", "greedy", "--repeats", "2",
                                   "--out", str(work / "bench-greedy")), t["bench-greedy"], needs),
        Stage("bench-sample", mtpc("bench", *bench, "--mode", "sample", "--temperature", "1", "--repeats", "1",
                                   "--out", str(work / "bench-sample")), t["bench-sample"], needs),
        Stage("smollm2-shape", [sys.executable, str(Path(__file__).resolve()), "--smollm2-shape",
                                json.dumps({"device": sizes.device, "small": sizes.device == "cpu",
                                            "out": str(work / "smollm2-shape.json")})], t["smollm2-shape"]),
        Stage("bench-compiled-heads", [sys.executable, str(Path(__file__).resolve()), "--compiled-bench",
                                       json.dumps({"model": str(lm), "heads": [str(ff), str(btree)],
                                                   "corpus": sizes.corpus, "device": sizes.device,
                                                   "out": str(work / "bench-compiled-heads"),
                                                   "small": sizes.device == "cpu"})],
              t["bench-compiled-heads"], needs),
    ]
    return stages


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
    for name in ("peft", "lark", "scipy", "numpy", "safetensors"):
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
    """`pytest -m cuda`, then the slice of the default suite; exit status 1 if either failed."""
    # `-o addopts=`: pyproject's addopts run the suite on pytest-xdist workers, a test-only package the
    # GPU machine may lack; these runs are serial, and the slice names the `not slow` filter itself
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "-o", "addopts="]
    # a module the machine cannot import (a test-only package it lacks) must not stop the CUDA tests
    cuda = subprocess.run(base + ["-m", "cuda", "-q", "--durations", "10", "--continue-on-collection-errors",
                                  *spec["cuda"]], cwd=ROOT).returncode
    rest = subprocess.run(base + ["-m", "not slow", *spec["slice"]], cwd=ROOT).returncode
    print(f"pytest -m cuda: exit {cuda}; slice {' '.join(spec['slice'])}: exit {rest}")
    return 0 if cuda in (0, 5) and rest == 0 else 1  # 5: nothing collected (only where CUDA is missing)


def compiled_heads_bench(spec: dict) -> int:
    """`mtpc bench` with the heads' decoders built as `SpeculativeDecoder(..., compile=True)`."""
    import functools
    import inspect

    from mtpc import SpeculativeDecoder
    from mtpc.bench import BenchConfig, format_table, run_bench

    if "compile" not in inspect.signature(SpeculativeDecoder).parameters:
        print("SpeculativeDecoder has no compile= yet: compiled heads not measured")
        return 0
    small = spec["small"]
    cfg = BenchConfig(model=spec["model"], heads=spec["heads"], corpus=spec["corpus"], device=spec["device"],
                      num_prompts=1 if small else 4, repeats=1 if small else 2, prompt_len=16 if small else 128,
                      max_new_tokens=8 if small else 128, lookup=(False, True), compile=not small,
                      max_repetition=None if small else 0.9, out=spec["out"], progress=False,
                      threads=1 if small else None)
    report = run_bench(cfg, decoder_cls=functools.partial(SpeculativeDecoder, compile=True))
    print(format_table(report))
    return 1 if report["greedy_identical"] is False else 0


# SmolLM2-135M-Instruct's shape (the config transformers reads from its GGUF file)
SMOLLM2_SHAPE = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                     intermediate_size=1536, vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0,
                     rms_norm_eps=1e-5, tie_word_embeddings=True)
SMALL_SHAPE = dict(SMOLLM2_SHAPE, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=128, vocab_size=4096, max_position_embeddings=1024)


def smollm2_shape_costs(spec: dict) -> int:
    """Per-token cost of compiled plain decoding and per-cycle cost of a compiled tied FF n=4 head (a draft
    vocabulary of 2,048 tokens) at verify widths 2 and 4 on an LM of SmolLM2's shape, in bf16; written to
    `spec["out"]` as JSON. Random weights: the costs are the shape's, the tokens per cycle mean nothing."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from circuitc.load import load_graph
    from mtpc import MTPHead, PlainDecoder, SpeculativeDecoder

    device = torch.device(spec["device"])
    torch.manual_seed(0)
    config = LlamaConfig(**(SMALL_SHAPE if spec["small"] else SMOLLM2_SHAPE))
    dtype = torch.float32 if spec["small"] else torch.bfloat16
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    K, new = (256, 8) if spec["small"] else (2048, 128)
    head = MTPHead(load_graph(str(ROOT / "examples" / "ff.pc"), n=4, v=K), config.hidden_size,
                   parameterisation="tied", vocabulary=list(range(K)), first_token_mlp=256).to(device=device,
                                                                                             dtype=dtype)
    head.tie_to(model.get_output_embeddings())
    prompt = torch.randint(0, config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(1)).to(device)
    compile = not spec["small"]
    result = {"device": str(device), "dtype": str(dtype), "shape": dict(config.to_diff_dict()), "new_tokens": new}
    plain = PlainDecoder(model, compile=compile)
    plain.generate(prompt, new)  # compiles (untimed)
    stats = plain.generate(prompt, new).stats
    result["plain_step_ms"] = 1e3 * stats.mean_cycle_latency
    for width in (2, 4):
        decoder = SpeculativeDecoder(model, head, window=width, compile=compile)
        decoder.generate(prompt, new)  # compiles (untimed)
        stats = decoder.generate(prompt, new).stats
        result[f"cycle_ms_width_{width}"] = 1e3 * stats.mean_cycle_latency
        result[f"cycle_over_step_width_{width}"] = stats.mean_cycle_latency / max(result["plain_step_ms"] / 1e3, 1e-9)
    Path(spec["out"]).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


def export_bf16(work: Path) -> int:
    """The LM and the heads as bf16 safetensors in `work/export/` (model card included)."""
    import torch
    from transformers import AutoModelForCausalLM

    from mtpc import load_head, save_head
    from mtpc.tokenizer import ByteTokenizer

    dest = work / "export"
    shutil.rmtree(dest, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(work / "lm", dtype=torch.float32).to(torch.bfloat16)
    model.save_pretrained(dest / "lm", safe_serialization=True)
    ByteTokenizer.load(work / "lm").save(dest / "lm")
    summary = json.loads((work / "lm" / "tiny_lm.json").read_text())
    (dest / "lm" / "tiny_lm.json").write_text(json.dumps(summary, indent=1) + "\n")
    (dest / "lm" / "README.md").write_text(model_card(summary))
    for folder in sorted((work / "heads").glob("*")):
        if (folder / "head.json").is_file():
            save_head(load_head(folder).to(torch.bfloat16), dest / "heads" / folder.name)
            for name in ("train_config.json", "train_summary.json"):
                if (folder / name).is_file():
                    shutil.copy(folder / name, dest / "heads" / folder.name / name)
    print(f"exported {dest}: " + ", ".join(f"{p.relative_to(dest)} {p.stat().st_size / MiB:.1f} MiB"
                                           for p in sorted(dest.rglob("*.safetensors"))))
    return 0


def model_card(summary: dict) -> str:
    cfg = summary.get("config", {})
    return (f"# Reference byte LM (trained on a GPU by benchmarks/gpu.sh)\n\n"
            f"A byte-level LlamaForCausalLM (`mtpc tiny-lm`), stored in bf16.\n\n"
            f"- parameters: {summary.get('parameters', 0) / 1e6:.1f}M (d_model {cfg.get('d_model')}, "
            f"{cfg.get('layers')} layers, {cfg.get('heads')} heads, ffn {cfg.get('ffn')}, context "
            f"{cfg.get('context')})\n"
            f"- data: {summary.get('data', {}).get('source')}; {summary.get('train_tokens', 0):,} training tokens in "
            f"{summary.get('train_seconds')} s on {summary.get('device')} ({summary.get('autocast')} autocast)\n"
            f"- held-out: {summary.get('val_bits_per_byte', float('nan')):.3f} bits/byte (at the start "
            f"{summary.get('val_bits_per_byte_at_start', float('nan')):.3f})\n\n"
            f"Load: `AutoModelForCausalLM.from_pretrained(DIR)`; `mtpc bench --model DIR`.\n")


# --------------------------------------------------------------------------- what comes back

def pack_results(work: Path, logs: Path, out: Path) -> None:
    """`out/results.tar.gz`: logs, bench outputs, training summaries and logs, the bf16 heads."""
    keep = [logs]
    keep += sorted(work.glob("bench-*"))
    for name in ("tiny_lm.json", "train_log.jsonl"):
        keep += [p for p in (work / "lm" / name, work / "draft-lm" / name) if p.is_file()]
    for folder in sorted((work / "heads").glob("*")):
        keep += [p for p in folder.glob("*.json*") if p.is_file()]
    if (work / "export" / "heads").is_dir():
        keep.append(work / "export" / "heads")
    tmp = out / "results.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for path in keep:
            tar.add(path, arcname=str(path.relative_to(work)))
    if tmp.stat().st_size > MAX_FILE:  # never a file that would not come back: drop the heads first
        with tarfile.open(tmp, "w:gz") as tar:
            for path in keep:
                if "export" not in path.parts:
                    tar.add(path, arcname=str(path.relative_to(work)))
    os.replace(tmp, out / "results.tar.gz")


def split_into(data: bytes, out: Path, stem: str, max_bytes: int = MAX_FILE) -> list[Path]:
    """`data` as `stem.partNN` files of at most `max_bytes` each (cat them in order to restore it)."""
    parts = []
    for i in range(0, max(len(data), 1), max_bytes):
        path = out / f"{stem}.part{len(parts):02d}"
        path.write_bytes(data[i:i + max_bytes])
        parts.append(path)
    return parts


def pack_lm(work: Path, out: Path, files_left: int) -> list[str]:
    """The bf16 LM folder as tar chunks, if they fit in the files left; returns their names."""
    folder = work / "export" / "lm"
    if not folder.is_dir():
        return []
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(folder, arcname="lm-bf16")
    data = buffer.getvalue()
    if -(-len(data) // MAX_FILE) > files_left:
        print(f"the bf16 LM ({len(data) / MiB:.1f} MiB) needs more than the {files_left} files left; not returned")
        return []
    return [p.name for p in split_into(data, out, "lm-bf16.tar", MAX_FILE)]


def bench_tables(work: Path) -> dict:
    tables = {}
    for folder in sorted(work.glob("bench-*")):
        if (folder / "bench.md").is_file():
            tables[folder.name] = (folder / "bench.md").read_text()
    return tables


# --------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (seconds per stage)")
    p.add_argument("--plan", action="store_true", help="print the stages' commands and exit")
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "out" / "gpu"),
                   help="where the returned files go (default: $OUT, else out/gpu)")
    p.add_argument("--work", default=None, help="models, heads and bench folders (default: a temporary folder)")
    p.add_argument("--only", nargs="+", default=None, metavar="STAGE", help="run only these stages")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="stop starting stages (and cut the running one) this many seconds after the start, leaving "
                        "time to pack the results")
    p.add_argument("--env", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tests", default=None, help=argparse.SUPPRESS)
    p.add_argument("--compiled-bench", default=None, help=argparse.SUPPRESS)
    p.add_argument("--export", default=None, help=argparse.SUPPRESS)
    p.add_argument("--smollm2-shape", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.env:
        print(json.dumps(environment(), indent=1))
        return 0
    if args.tests is not None:
        return run_tests(json.loads(args.tests))
    if args.compiled_bench is not None:
        return compiled_heads_bench(json.loads(args.compiled_bench))
    if args.export is not None:
        return export_bf16(Path(args.export))
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
            print(f"[{s.name}] (limit {s.timeout_s:.0f} s{', after ' + ', '.join(s.needs) if s.needs else ''})\n  "
                  + " ".join(s.argv))
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
    summary = {"dry_run": dry, "device": sizes.device, "work": str(work), "stages": {}}
    start = time.perf_counter()
    failed = False
    for stage in stages:
        missing = [n for n in stage.needs if summary["stages"].get(n, {}).get("status", "ok") != "ok"]
        left = budget_s - (time.perf_counter() - start)
        if missing:
            summary["stages"][stage.name] = {"status": f"skipped (needs {', '.join(missing)})"}
        elif left < 15:
            summary["stages"][stage.name] = {"status": f"skipped (the {budget_s:.0f} s budget is spent)"}
        else:
            stage = dataclasses.replace(stage, timeout_s=min(stage.timeout_s, left))
            print(f"[{time.perf_counter() - start:6.0f} s] {stage.name} ...", flush=True)
            summary["stages"][stage.name] = result = run_stage(stage, logs, env)
            print(f"[{time.perf_counter() - start:6.0f} s] {stage.name}: {result['status']} "
                  f"({result['seconds']:.0f} s)", flush=True)
            print("\n".join("    " + line for line in result["tail"][-6:]), flush=True)
        failed |= summary["stages"][stage.name]["status"] != "ok"
        if stage.name == "env" and summary["stages"]["env"]["status"] == "ok":
            summary["environment"] = _json_in((logs / "env.log").read_text())
        summary["seconds"] = round(time.perf_counter() - start, 1)
        summary["bench"] = bench_tables(work)
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        pack_results(work, logs, out)
    summary["lm_files"] = pack_lm(work, out, MAX_FILES - 2)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for name, table in summary["bench"].items():
        print(f"\n## {name}\n{table}")
    print(f"\nwrote {', '.join(sorted(p.name for p in out.iterdir()))} into {out} "
          f"({time.perf_counter() - start:.0f} s)")
    return 1 if failed else 0


def _json_in(text: str) -> dict:
    """The JSON object a stage printed after its command line."""
    body = text[text.index("{"):] if "{" in text else "{}"
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        return {}


if __name__ == "__main__":
    sys.exit(main())
