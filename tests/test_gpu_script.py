"""benchmarks/gpu.py, the one-command GPU run: every stage's `mtpc` command parses (GPU and dry-run
sizes), the returned files respect the limits, and (slow) the whole dry run on the CPU."""

import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from mtpc.cli.commands import build_parser

ROOT = Path(__file__).resolve().parent.parent


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_script", ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_script"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gpu = load_script()


@pytest.mark.parametrize("sizes", [gpu.gpu_sizes, gpu.dry_sizes], ids=["gpu", "dry-run"])
def test_every_stage_command_parses(sizes, tmp_path):
    stages = gpu.plan(sizes(), tmp_path)
    assert [s.name for s in stages] == ["env", "tests", "smollm2-shape", "bench-greedy", "bench-sample", "train-head",
                                        *(["vllm"] if gpu.vllm_installed() else [])]
    for stage in stages:
        if stage.argv[1:3] == ["-m", "mtpc.cli"]:
            args = build_parser().parse_args(stage.argv[3:])  # an InputError names a flag that rotted
            assert args.device == sizes().device
            assert Path(args.model) == gpu.BYTE_LM and (gpu.BYTE_LM / "config.json").is_file()
    assert all((head / "head.json").is_file() for head in [*gpu.BYTE_HEADS, gpu.SMOLLM2_HEAD])


def test_the_gpu_plan_leaves_room_for_a_second_run():
    """A device run has 15 minutes in all, each start (about 1.5 minutes) counted: two runs of the default
    budget, each with its start and the packing, fit."""
    assert 2 * (gpu.BUDGET_S + 90 + 30) <= 15 * 60
    sizes = gpu.gpu_sizes()
    stages = {s.name: s for s in gpu.plan(sizes, Path("/w"))}
    argv = stages["train-head"].argv
    assert float(argv[argv.index("--minutes") + 1]) * 60 + 30 < stages["train-head"].timeout_s
    assert set(sizes.cuda_tests) >= {"tests/test_cuda.py", "tests/test_runtime.py"}
    assert Path(sizes.corpus).name == "networkx"


def copied_checkout(dest: Path, only: tuple[str, ...] = ()) -> Path:
    """The tracked files of this checkout (as they are in the work tree) copied to `dest`, without the
    docs and the subword LM (megabytes no stage reads); `only`: just the files under these folders."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in names.decode().split("\0"):
        wanted = name.startswith(only) if only else not name.startswith(("models/subword-lm/", "docs/"))
        if name and wanted and (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def load_script_from(root: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, root / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def bench_prompts_needed(sizes) -> tuple[int, int]:
    """(prompts, prompt length) the dry run's benches ask of their corpus."""
    flags = sizes.bench
    count = int(flags[flags.index("--num-prompts") + 1]) * int(flags[flags.index("--repeats") + 1])
    return count, int(flags[flags.index("--prompt-len") + 1])


def test_the_dry_runs_corpus_gives_the_same_prompts_from_any_checkout_location(tmp_path):
    from mtpc.bench.config import BenchConfig
    from mtpc.bench.prompts import prompts_from_corpus
    from mtpc.lm.tokenizer import ByteTokenizer

    parts = ("benchmarks/", "circuitc/", "mtpc/training/")  # the script and the corpora it might name
    copies = [copied_checkout(tmp_path / where, parts) for where in ("a/checkout", "b/c/other-name")]
    picked = []
    for i, root in enumerate(copies):
        sizes = load_script_from(root, f"gpu_script_copy{i}").dry_sizes()
        assert Path(sizes.corpus).is_relative_to(root)
        assert sizes.train[sizes.train.index("--data") + 1] == sizes.corpus
        count, length = bench_prompts_needed(sizes)
        picked.append(prompts_from_corpus(sizes.corpus, ByteTokenizer(), count, length, BenchConfig.seed,
                                          BenchConfig.val_fraction))  # an InputError: too few held-out spans
    assert picked[0] == picked[1]


@pytest.mark.slow
def test_the_dry_run_runs_every_stage_and_returns_files_within_the_limits(tmp_path):
    root = copied_checkout(tmp_path / "elsewhere" / "checkout")  # not where the package was installed from
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, str(root / "benchmarks" / "gpu.py"), "--dry-run", "--work",
                          str(tmp_path / "work"), "--out", str(out)], capture_output=True, text=True, timeout=900)
    summary = json.loads((out / "summary.json").read_text())
    assert run.returncode == 0, (summary["stages"], run.stdout[-3000:])
    assert all(s["status"] == "ok" for s in summary["stages"].values())
    files = list(out.iterdir())
    assert len(files) <= 8 and all(f.stat().st_size <= 16 << 20 for f in files)
    assert summary["environment"]["torch"] and {"bench-greedy", "bench-sample"} <= set(summary["bench"])
    costs = summary["smollm2_shape"]
    assert costs["plain_step_ms"] > 0 and costs["shape"]["num_hidden_layers"] == 30
    for key in ("ff4_shipped_width_4", "ff8_width_8", "ff4_shipped_width_2"):
        assert costs[key]["cycle_ms"] > 0 and costs[key]["cycle_over_step"] > 0
    with tarfile.open(out / "results.tar.gz") as tar:
        names = tar.getnames()
    assert {"bench-greedy/bench.json", "logs/tests.log", "smollm2-shape.json",
            "heads/btree-n8-r8/train_log.jsonl"} <= set(names)
    # every stage that fell to the budget is named with the command that runs it
    cut = subprocess.run([sys.executable, str(root / "benchmarks" / "gpu.py"), "--dry-run", "--only", "env",
                          "train-head", "--budget-s", "16", "--work", str(tmp_path / "cut"), "--out",
                          str(tmp_path / "cut-out")], capture_output=True, text=True, timeout=300)
    assert cut.returncode == 1
    assert "not done: train-head; again with: bash benchmarks/gpu.sh --only train-head --dry-run" in cut.stdout


def test_the_checkout_a_device_run_carries_fits_its_limit():
    """A device run carries the tracked files (and untracked ones git does not ignore) and the lark wheel
    (gpu_wheels.sh, about 0.1 MiB), 64 MiB in all: a shipped model that would cross it breaks the GPU run."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    size = sum((ROOT / name).stat().st_size for name in names if name and (ROOT / name).is_file())
    assert size + (1 << 20) < 64 << 20, f"{size / (1 << 20):.1f} MiB"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the error on a machine without CUDA")
@pytest.mark.parametrize("command", [["tiny-lm", "--out", "OUT", "--steps", "1"],
                                     ["train", "--model", "MODEL", "--out", "OUT", "--steps", "1"]])
@pytest.mark.parametrize("device, message", [("cuda", "CUDA is not available"), ("tpu", "not a device"),
                                             ("meta", "training runs on cpu or cuda")])
def test_a_training_device_that_is_not_there_is_one_line(command, device, message, tmp_path, capsys):
    from _tiny import save_tiny_lm
    from mtpc.cli.commands import main

    argv = [str(tmp_path / "out") if a == "OUT" else a for a in command]
    if "MODEL" in argv:
        argv[argv.index("MODEL")] = save_tiny_lm(tmp_path / "lm")
        argv += ["--circuit", str(ROOT / "examples" / "ff.pc"), "-D", "n=2"]
    capsys.readouterr()  # saving the LM printed a progress bar
    assert main([*argv, "--device", device]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mtpc: error: --device") and message in err[0]
    assert not (tmp_path / "out").exists()
