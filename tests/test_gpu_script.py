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
    names = [s.name for s in stages]
    assert names[:2] == ["env", "tests"] and {"lm", "head-ff", "head-btree", "bench-greedy", "bench-sample", "smollm2-shape",
                                              "export"} <= set(names)
    assert all(need in names[:names.index(s.name)] for s in stages for need in s.needs)  # needs run earlier
    for stage in stages:
        if stage.argv[1:3] == ["-m", "mtpc.cli"]:
            args = build_parser().parse_args(stage.argv[3:])  # an InputError names a flag that rotted
            if args.command in ("tiny-lm", "train", "bench"):
                assert args.device == sizes().device


def test_the_gpu_plan_fits_the_machine():
    sizes = gpu.gpu_sizes()
    planned = {"lm": 2.0, "draft-lm": 0.25, "head-ff": 0.6, "head-btree": 0.6}  # training minutes
    stages = {s.name: s for s in gpu.plan(sizes, Path("/w"))}
    for name, minutes in planned.items():
        argv = stages[name].argv
        assert float(argv[argv.index("--minutes") + 1]) == minutes
        assert stages[name].timeout_s > minutes * 60  # room for loading, evaluation and saving
    t = sizes.timeouts  # training, the tests and the greedy bench fit the budget even at their ceilings
    assert sum(planned.values()) * 60 + t["tests"] + t["bench-greedy"] < 540
    assert set(sizes.cuda_tests) >= {"tests/test_cuda.py", "tests/test_runtime.py"}


def test_split_into_keeps_every_part_under_the_limit_and_restores_the_bytes(tmp_path):
    data = bytes(range(256)) * 41
    parts = gpu.split_into(data, tmp_path, "blob", max_bytes=1000)
    assert len(parts) == 11 and all(p.stat().st_size <= 1000 for p in parts)
    assert b"".join(p.read_bytes() for p in parts) == data
    assert [p.name for p in parts][:2] == ["blob.part00", "blob.part01"]


def test_pack_lm_returns_nothing_when_the_parts_would_not_fit(tmp_path, monkeypatch):
    folder = tmp_path / "work" / "export" / "lm"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x" * 5000)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(gpu, "MAX_FILE", 2048)
    assert gpu.pack_lm(tmp_path / "work", out, files_left=2) == []
    names = gpu.pack_lm(tmp_path / "work", out, files_left=8)
    assert len(names) >= 3
    restored = b"".join((out / n).read_bytes() for n in names)
    with tarfile.open(fileobj=__import__("io").BytesIO(restored)) as tar:
        assert tar.extractfile("lm-bf16/model.safetensors").read() == b"x" * 5000


def copied_checkout(dest: Path, only: tuple[str, ...] = ()) -> Path:
    """The tracked files of this checkout (as they are in the work tree) copied to `dest`, without the
    shipped models and the docs (megabytes no stage reads); `only`: just the files under these folders."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in names.decode().split("\0"):
        wanted = name.startswith(only) if only else not name.startswith(("models/", "docs/"))
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
    """(prompts, prompt length) the dry run's benches ask of their corpus (the greedy one runs 2 repeats)."""
    flags = sizes.bench
    return int(flags[flags.index("--num-prompts") + 1]) * 2, int(flags[flags.index("--prompt-len") + 1])


def test_the_dry_runs_corpus_gives_the_same_prompts_from_any_checkout_location(tmp_path):
    from mtpc.bench.config import BenchConfig
    from mtpc.bench.prompts import prompts_from_corpus
    from mtpc.tokenizer import ByteTokenizer

    parts = ("benchmarks/", "circuitc/", "mtpc/training/")  # the script and the corpora it might name
    copies = [copied_checkout(tmp_path / where, parts) for where in ("a/checkout", "b/c/other-name")]
    picked = []
    for i, root in enumerate(copies):
        sizes = load_script_from(root, f"gpu_script_copy{i}").dry_sizes()
        assert Path(sizes.corpus).is_relative_to(root) and sizes.data == ["--data", sizes.corpus]
        count, length = bench_prompts_needed(sizes)
        picked.append(prompts_from_corpus(sizes.corpus, ByteTokenizer(), count, length, BenchConfig.seed,
                                          BenchConfig.val_fraction))  # an InputError: too few held-out spans
    assert picked[0] == picked[1]


@pytest.mark.slow
def test_the_dry_run_runs_every_stage_and_returns_files_within_the_limits(tmp_path):
    root = copied_checkout(tmp_path / "elsewhere" / "checkout")  # not where the package was installed from
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, str(root / "benchmarks" / "gpu.py"), "--dry-run", "--work",
                          str(tmp_path / "work"), "--out", str(out)], capture_output=True, text=True, timeout=600)
    summary = json.loads((out / "summary.json").read_text())
    assert run.returncode == 0, (summary["stages"], run.stdout[-3000:])
    assert all(s["status"] == "ok" for s in summary["stages"].values())
    files = list(out.iterdir())
    assert len(files) <= gpu.MAX_FILES and all(f.stat().st_size <= 16 << 20 for f in files)
    assert summary["environment"]["torch"] and "bench-greedy" in summary["bench"]
    with tarfile.open(out / "results.tar.gz") as tar:
        names = tar.getnames()
    assert "bench-greedy/bench.json" in names and "logs/tests.log" in names
    assert any(n.startswith("export/heads/ff-n8") for n in names)
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from mtpc import load_head

    lm = tmp_path / "work" / "export" / "lm"
    assert AutoModelForCausalLM.from_pretrained(lm).dtype == torch.bfloat16
    head = tmp_path / "work" / "export" / "heads" / "btree-n8-r8-shared"
    assert load_head(head).dtype == torch.bfloat16
    assert all(t.dtype == torch.bfloat16 for t in load_file(str(lm / "model.safetensors")).values())


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
