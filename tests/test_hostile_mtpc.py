"""Hostile and mistaken input to the `mtpc` command line and trainer.

Every ordinary mistake is one `mtpc: error: ...` line (exit status 2 for usage and input errors, 1 for
failed runs), checked before slow work, never a traceback without `--debug`. Training refuses planted
pickles, stops at a non-finite loss keeping the last good checkpoint, and resumes only what it can
resume honestly.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _tiny import write_source_corpus
from mtpc.cli.commands import describe_error, main
from mtpc.errors import InputError, MtpcError
from mtpc.training.trainer import CHECKPOINT

ROOT = Path(__file__).resolve().parent.parent
BTREE = str(ROOT / "examples" / "btree.pc")


def save_lm(path, *, vocab=None, hidden=32, byte_tokenizer=True, nan=False, model_type=None):
    """A tiny Llama saved with save_pretrained (and mtpc_tokenizer.json unless byte_tokenizer=False)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from mtpc.lm.tokenizer import ByteTokenizer

    tok = ByteTokenizer(vocab)
    config = LlamaConfig(vocab_size=tok.vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=128)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    if nan:
        with torch.no_grad():
            model.model.norm.weight.fill_(float("nan"))  # every hidden state becomes NaN
    model.save_pretrained(path)
    if byte_tokenizer:
        tok.save(path)
    if model_type is not None:
        data = json.loads((Path(path) / "config.json").read_text())
        data["model_type"] = model_type
        (Path(path) / "config.json").write_text(json.dumps(data))
    return str(path)


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return save_lm(tmp_path_factory.mktemp("lm"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_source_corpus(tmp_path_factory.mktemp("corpus"), parts=8, length=700, overlap=300)


FAST = ["--steps", "2", "--seq-len", "32", "--batch-size", "2", "--val-every", "1", "--val-sequences", "2",
        "--precision", "fp32", "--no-progress"]


def train_args(lm, corpus, out, *extra, circuit=BTREE, n=4, r=4):
    args = ["train", "--model", lm, "--data", corpus, "--out", str(out), *FAST]
    if circuit is not None:
        args += ["--circuit", circuit, "-D", f"n={n}", "-D", f"r={r}"]
    return args + list(extra)


@pytest.fixture(scope="module")
def head(lm, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("head") / "h"
    assert main(train_args(lm, corpus, out)) == 0
    return str(out)


def fails(capsys, argv, status, *fragments):
    """Run `mtpc argv` in-process; assert the exit status, one `mtpc: error:` line and no traceback."""
    assert main(argv) == status
    err = capsys.readouterr().err
    assert "mtpc: error:" in err, err
    assert "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


# ------------------------------------------------------------------ the command line itself


def test_help_does_not_import_torch_and_shows_defaults():
    code = ("import sys\nfrom mtpc.cli import main\n"
            "for cmd in ([], ['train'], ['tiny-lm'], ['bench'], ['distill-data'], ['generate']):\n"
            "    assert main([*cmd, '--help']) == 0\n"
            "heavy = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]\n"
            "print('HEAVY', heavy)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "HEAVY []" in run.stdout
    text = " ".join(run.stdout.split())  # undo argparse's line wrapping
    for shown in ("gamma**(j-1) (default: 0.9)", "byte-lm's shape) (default: 192)", "tokens a lookup match proposes (default: 10)",
                  "decoder layers (default: 0)", "learning rate of the head (default: 0.002)"):
        assert shown in text, shown


def test_version(capsys):
    with pytest.raises(SystemExit) as e:  # argparse's version action exits itself
        from mtpc.cli.commands import build_parser

        build_parser().parse_args(["--version"])
    assert e.value.code == 0
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("mtpc ")


@pytest.mark.parametrize("argv, fragment", [
    ([], "required: COMMAND"),
    (["nope"], "invalid choice: 'nope'"),
    (["train", "--model", "m", "--out", "o"], "one of the arguments --steps --minutes is required"),
    (["train", "--out", "o", "--steps", "1"], "--model"),
    (["bench", "--model", "m", "--heads", "h"], "one of the arguments --prompts --corpus is required"),
    (["tiny-lm"], "--out"),
])
def test_usage_errors(capsys, argv, fragment):
    fails(capsys, argv, 2, fragment)


BAD_NUMBERS = [
    ("train", "--steps", "nan"), ("train", "--steps", "0"), ("train", "--minutes", "inf"),
    ("train", "--minutes", "nan"), ("train", "--lr", "nan"), ("train", "--lr", "-1"), ("train", "--lr", "inf"),
    ("train", "--gamma", "0"), ("train", "--gamma", "1.5"), ("train", "--gamma", "nan"),
    ("train", "--batch-size", "0"), ("train", "--window-stride", "0"), ("train", "--grad-accum", "-2"),
    ("train", "--val-every", "0"), ("train", "--save-every", "0"), ("train", "--lora-layers", "-1"),
    ("train", "--lora-lr", "nan"), ("train", "--seq-len", "1.5"),
    ("tiny-lm", "--minutes", "nan"), ("tiny-lm", "--steps", "0"), ("tiny-lm", "--lr", "inf"),
    ("tiny-lm", "--batch-size", "-3"), ("tiny-lm", "--d-model", "x"),
    ("bench", "--temperature", "nan"), ("bench", "--top-p", "0"), ("bench", "--top-p", "1.01"),
    ("bench", "--max-new-tokens", "0"), ("bench", "--num-prompts", "inf"), ("bench", "--threads", "0"),
    ("bench", "--draft-temperature", "0"), ("bench", "--draft-temperature", "nan"),
    ("bench", "--draft-temperature", "hot"),
]


@pytest.mark.parametrize("command, flag, value", BAD_NUMBERS)
def test_numeric_flags_are_checked_while_parsing(capsys, command, flag, value):
    required = {"train": ["--model", "m", "--out", "o", "--circuit", "c.pc"] + (["--steps", "1"] if flag not in (
        "--steps", "--minutes") else []), "tiny-lm": ["--out", "o"], "bench": ["--model", "m", "--heads", "h",
                                                                                "--corpus", "stdlib"]}[command]
    fails(capsys, [command, *required, flag, value], 2, f"argument {flag}", repr(value))


def test_describe_error_classifies_every_kind():
    from circuitc.errors import CircuitError

    assert describe_error(InputError("bad")) == (2, "bad")
    assert describe_error(MtpcError("failed")) == (1, "failed")
    assert describe_error(CircuitError("unknown parameter zz"))[0] == 2
    assert describe_error(FileNotFoundError(2, "No such file or directory", "x.pc")) == (
        2, "No such file or directory: x.pc")
    assert describe_error(OSError(28, "No space left on device", "out/head.safetensors"))[0] == 1
    status, message = describe_error(KeyError("weight"))
    assert status == 1 and message.startswith("internal error: KeyError: 'weight'") and "--debug" in message
    assert describe_error(MemoryError())[0] == 1


def test_internal_errors_are_one_line_and_debug_shows_the_traceback(capsys, monkeypatch):
    import mtpc.cli.commands

    def broken(args):
        raise KeyError("a bug")

    monkeypatch.setattr(mtpc.cli.commands, "run_train", broken)
    argv = ["train", "--model", "m", "--out", "o", "--steps", "1"]
    err = fails(capsys, argv, 1, "internal error: KeyError: 'a bug'", "rerun with --debug")
    assert len(err.strip().splitlines()) == 1
    assert main(["--debug", *argv]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "mtpc: error: internal error" in err
    assert main([*argv, "--debug"]) == 1  # --debug after the subcommand works too
    assert "Traceback" in capsys.readouterr().err


# ------------------------------------------------------------------ ordinary mistakes in mtpc train


def test_missing_circuit_and_malformed_or_unknown_defines(capsys, lm, corpus, tmp_path):
    fails(capsys, train_args(lm, corpus, tmp_path / "o", circuit=None), 2, "give --circuit")
    fails(capsys, train_args(lm, corpus, tmp_path / "o", "-D", "n"), 2, "-D expects NAME=VALUE", "'n'")
    fails(capsys, train_args(lm, corpus, tmp_path / "o", "-D", "=3"), 2, "-D expects NAME=VALUE")
    fails(capsys, train_args(lm, corpus, tmp_path / "o", "-D", "zz=3"), 2, "unknown parameter zz")
    fails(capsys, train_args(lm, corpus, tmp_path / "o", "--circuit", str(tmp_path / "none.pc")), 2, "none.pc")
    assert not (tmp_path / "o").exists()  # a failed start leaves no output folder behind


def test_model_folder_mistakes(capsys, lm, corpus, tmp_path):
    out = tmp_path / "o"
    fails(capsys, train_args(str(tmp_path / "missing"), corpus, out), 2, "no such model folder")
    (tmp_path / "file").write_text("x")
    fails(capsys, train_args(str(tmp_path / "file"), corpus, out), 2, "is not a folder")
    (tmp_path / "empty").mkdir()
    fails(capsys, train_args(str(tmp_path / "empty"), corpus, out), 2, "config.json is missing")
    broken = Path(shutil.copytree(lm, tmp_path / "badjson"))
    (broken / "config.json").write_text("{not json")
    fails(capsys, train_args(str(broken), corpus, out), 2, "config.json: not valid JSON")
    t5 = save_lm(tmp_path / "t5", model_type="t5")
    fails(capsys, train_args(t5, corpus, out), 2, "model_type 't5' is not a decoder-only causal LM")
    opt = save_lm(tmp_path / "opt", model_type="opt")  # decodes (lora_layers=0), but has no split-loop adapter
    fails(capsys, train_args(opt, corpus, out, "--lora-layers", "1"), 2, "no split-backbone adapter for model_type "
          "'opt'", "--lora-layers 0")
    head = Path(shutil.copytree(lm, tmp_path / "noweights"))
    (head / "model.safetensors").unlink()
    fails(capsys, train_args(str(head), corpus, out), 2, "holds no model weights")
    assert not out.exists()


def test_truncated_model_weights(capsys, lm, corpus, tmp_path):
    cut = Path(shutil.copytree(lm, tmp_path / "cut"))
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    fails(capsys, train_args(str(cut), corpus, tmp_path / "o"), 2, "model.safetensors is damaged")


def test_non_byte_vocabulary_is_refused_unless_allowed(capsys, corpus, tmp_path):
    big = save_lm(tmp_path / "big", vocab=32000, hidden=16, byte_tokenizer=False)
    fails(capsys, train_args(big, corpus, tmp_path / "o"), 2, "32,000-token vocabulary", "--allow-non-byte-vocab")
    assert main(train_args(big, corpus, tmp_path / "o", "--allow-non-byte-vocab", "--steps", "1")) == 0
    assert (tmp_path / "o" / "head.safetensors").exists()


def test_circuit_states_must_fit_the_vocabulary(capsys, lm, corpus, tmp_path):
    fails(capsys, train_args(lm, corpus, tmp_path / "o", "-D", "v=300"), 2, "300 states", "264 tokens")


def test_out_is_a_file_and_data_is_missing(capsys, lm, corpus, tmp_path):
    (tmp_path / "file").write_text("x")
    fails(capsys, train_args(lm, corpus, tmp_path / "file"), 2, "--out", "is a file")
    fails(capsys, train_args(lm, corpus, tmp_path / "file" / "below"), 2, "is a file, not a folder")
    fails(capsys, train_args(lm, str(tmp_path / "nothing"), tmp_path / "o"), 2, "--data", "does not exist")
    fails(capsys, train_args(lm, str(tmp_path / "*.none"), tmp_path / "o"), 2, "matches no files")
    (tmp_path / "empty.txt").write_text("")
    fails(capsys, train_args(lm, str(tmp_path / "empty.txt"), tmp_path / "o"), 2, "no usable documents")
    assert not (tmp_path / "o").exists()


def test_init_head_mistakes(capsys, lm, corpus, head, tmp_path):
    fails(capsys, train_args(lm, corpus, tmp_path / "o", "--init-head", corpus, circuit=None), 2,
          "is not a head folder", "head.json")
    other = save_lm(tmp_path / "wide", hidden=48)
    fails(capsys, train_args(other, corpus, tmp_path / "o", "--init-head", head, circuit=None), 2,
          "hidden states of size 32", "hidden size 48")
    fails(capsys, train_args(lm, corpus, tmp_path / "o", "--init-head", head, r=8), 2,
          "--circuit differs from the circuit of the head")
    cut = Path(shutil.copytree(head, tmp_path / "cut"))
    weights = cut / "head.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    fails(capsys, train_args(lm, corpus, tmp_path / "o", "--init-head", str(cut), circuit=None), 2,
          "cut/head.safetensors is damaged")
    prompts = tmp_path / "p.txt"
    prompts.write_text("x\n")
    fails(capsys, ["bench", "--model", lm, "--heads", str(cut), "--prompts", str(prompts), "--num-prompts", "1",
                   "--repeats", "1"], 2, "cut/head.safetensors is damaged")
    assert not (tmp_path / "o").exists()


def test_batch_not_divisible_by_accumulation(capsys, lm, corpus, tmp_path):
    fails(capsys, train_args(lm, corpus, tmp_path / "o", "--batch-size", "3", "--grad-accum", "2"), 2,
          "--batch-size 3 must be divisible")


# ------------------------------------------------------------------ training faults and resume


def test_planted_pickle_checkpoint_is_refused_and_not_executed(capsys, lm, corpus, tmp_path):
    class Payload:
        def __reduce__(self):
            return os.mkdir, (str(tmp_path / "pwned"),)

    out = tmp_path / "o"
    out.mkdir()
    torch.save({"format": "mtpc-train-checkpoint-2", "payload": Payload()}, out / CHECKPOINT)
    fails(capsys, train_args(lm, corpus, out), 2, "cannot be loaded as an mtpc checkpoint", "--no-resume")
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(Exception):  # the control: the planted file really is a live pickle payload
        torch.load(out / CHECKPOINT, weights_only=True)
    torch.load(out / CHECKPOINT, weights_only=False)
    assert (tmp_path / "pwned").exists()
    torch.save({"format": "mtpc-train-checkpoint-2", "step": 1}, out / CHECKPOINT)  # loads, but is no checkpoint
    fails(capsys, train_args(lm, corpus, out), 2, "is not an mtpc training checkpoint")
    assert main(train_args(lm, corpus, out, "--no-resume")) == 0  # --no-resume overwrites it


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(capsys, lm, corpus, tmp_path):
    nan_lm = save_lm(tmp_path / "nan", nan=True)
    fails(capsys, train_args(nan_lm, corpus, tmp_path / "a"), 1, "non-finite loss", "at step 1",
          "No checkpoint was written yet")
    assert not (tmp_path / "a" / "head.safetensors").exists()

    model = Path(shutil.copytree(lm, tmp_path / "model"))
    out = tmp_path / "b"
    args = train_args(str(model), corpus, out, "--steps", "4", "--save-every", "2", "--stop-after", "2")
    assert main(args) == 0
    good = (out / CHECKPOINT).read_bytes()
    shutil.rmtree(model)
    save_lm(model, nan=True)  # the model goes bad between the two runs
    fails(capsys, args[:-2], 1, "non-finite loss", "at step 3", f"{CHECKPOINT} keeps step 2")
    assert (out / CHECKPOINT).read_bytes() == good
    assert not (out / "head.safetensors").exists()


def test_small_state_spaces_and_tiny_validation_split_validate(lm, tmp_path):
    """Was: `"bincount_cpu" not implemented for 'Float'` when no held-out window was complete."""
    data = tmp_path / "tiny.txt"
    data.write_text("abcdefgh" * 8)
    out = tmp_path / "o"
    assert main(train_args(lm, str(data), out, "-D", "v=16", n=4)) == 0
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert all(r["val_windows"] == 0 and r["val_accept_hist"] == [0] * 5 for r in log if "val_windows" in r)


def test_resume_refuses_other_settings_and_another_circuit(capsys, lm, corpus, tmp_path):
    out = tmp_path / "o"
    assert main(train_args(lm, corpus, out, "--steps", "4", "--stop-after", "2", "--save-every", "2")) == 0
    err = fails(capsys, train_args(lm, corpus, out, "--steps", "4", "--lr", "0.01"), 2,
                "other settings", "lr: 0.002 -> 0.01", "--no-resume")
    assert "steps" not in err.split("other settings")[1].split(")")[0]
    fails(capsys, train_args(lm, corpus, out, "--steps", "4", r=8), 2, "circuit: another region graph")
    fails(capsys, train_args(lm, corpus, out, "--steps", "1"), 2, "below the checkpoint's step 2")
    assert not (out / "head.safetensors").exists()
    # settings that may change: a longer run, other validation/save frequencies, no progress bar
    assert main(train_args(lm, corpus, out, "--steps", "5", "--val-every", "2", "--save-every", "3")) == 0
    cfg = json.loads((out / "train_config.json").read_text())
    assert cfg["steps"] == 5 and cfg["val_every"] == 2
    steps = [json.loads(x)["step"] for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4, 5]
    assert main(train_args(lm, corpus, out, "--steps", "4", "--lr", "0.01", "--no-resume")) == 0


def test_a_resume_may_switch_to_a_time_budget(lm, corpus, tmp_path):
    """`--minutes` on resume turns the rest of a `--steps 6` run into a wall-clock budget: it ends
    when the budget (1.2 s, the checkpoint's two steps included) is spent, not after 6 steps."""
    out = tmp_path / "o"
    assert main(train_args(lm, corpus, out, "--steps", "6", "--stop-after", "2", "--val-every", "100")) == 0
    args = train_args(lm, corpus, out, "--val-every", "100")
    i = args.index("--steps")
    assert main([*args[:i], *args[i + 2:], "--minutes", "0.02"]) == 0
    config = json.loads((out / "train_config.json").read_text())
    per_step = config["train_seconds"] / config["steps"]
    assert config["minutes"] == 0.02 and abs(config["train_seconds"] - 1.2) <= per_step + 0.5


def test_log_has_no_duplicate_steps_after_a_kill(lm, corpus, tmp_path):
    out = tmp_path / "o"
    args = train_args(lm, corpus, out, "--steps", "4", "--save-every", "2")
    assert main([*args, "--stop-after", "2"]) == 0
    with (out / "train_log.jsonl").open("a") as f:  # what a run killed during step 4 leaves behind
        f.write(json.dumps({"step": 3, "loss": 1.0}) + "\n" + '{"step": 4, "lo')
    assert main(args) == 0
    steps = [json.loads(x)["step"] for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4]


def test_checkpoints_load_with_weights_only(lm, corpus, tmp_path):
    out = tmp_path / "o"
    assert main(train_args(lm, corpus, out, "--stop-after", "1", "--save-every", "1")) == 0
    state = torch.load(out / CHECKPOINT, weights_only=True)
    assert state["step"] == 1 and state["format"] == "mtpc-train-checkpoint-2"


# ------------------------------------------------------------------ tiny-lm and bench


def test_tiny_lm_mistakes(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    fails(capsys, ["tiny-lm", "--out", str(tmp_path / "file"), "--steps", "1"], 2, "is a file")
    fails(capsys, ["tiny-lm", "--out", str(tmp_path / "o"), "--data", str(tmp_path / "none")], 2, "does not exist")
    fails(capsys, ["tiny-lm", "--out", str(tmp_path / "o"), "--d-model", "30", "--heads", "4"], 2,
          "--heads 4 must divide --d-model 30")
    fails(capsys, ["tiny-lm", "--out", str(tmp_path / "o"), "--vocab-size", "100"], 2, "--vocab-size 100 is too small")
    (tmp_path / "empty.txt").write_text("")
    fails(capsys, ["tiny-lm", "--out", str(tmp_path / "o"), "--data", str(tmp_path / "empty.txt")], 2,
          "no usable documents")
    assert not (tmp_path / "o").exists()


def test_bench_mistakes(capsys, lm, head, corpus, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("def f():\n")
    base = ["bench", "--model", lm, "--prompts", str(prompts), "--num-prompts", "1", "--repeats", "1",
            "--max-new-tokens", "4", "--no-progress"]
    fails(capsys, ["bench", "--model", str(tmp_path / "none"), "--heads", head, "--prompts", str(prompts)], 2,
          "no such model folder")
    fails(capsys, [*base, "--heads", corpus], 2, "is not a head folder")
    fails(capsys, [*base, "--heads", str(tmp_path / "nohead")], 2, "no such head folder")
    other = save_lm(tmp_path / "wide", hidden=48)
    fails(capsys, ["bench", "--model", other, "--heads", head, "--prompts", str(prompts)], 2, "hidden size 48")
    fails(capsys, ["bench", "--model", lm, "--heads", head, "--prompts", str(tmp_path / "none.txt")], 2,
          "is not a file")
    (tmp_path / "file").write_text("x")
    fails(capsys, [*base, "--heads", head, "--out", str(tmp_path / "file")], 2, "is a file")
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "x"\n')
    fails(capsys, ["bench", "--model", lm, "--heads", head, "--prompts", str(bad), "--num-prompts", "1",
                   "--repeats", "1", "--no-progress"], 2, "p.jsonl:1: invalid JSON")
    assert main([*base, "--heads", head]) == 0  # the control: the same command with good input runs


# ------------------------------------------------------------------ real processes


def test_real_processes_print_one_line_and_the_exit_status(lm, tmp_path):
    def run(*argv):
        return subprocess.run([sys.executable, "-m", "mtpc.cli", *argv], capture_output=True, text=True,
                              timeout=300)

    missing = run("train", "--model", str(tmp_path / "missing"), "--circuit", BTREE, "--out", str(tmp_path / "o"),
                  "--steps", "1")
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [f"mtpc: error: no such model folder: {tmp_path / 'missing'}"]
    nan = run("train", "--model", lm, "--circuit", BTREE, "--out", str(tmp_path / "o"), "--steps", "nan")
    assert nan.returncode == 2 and nan.stderr.startswith("mtpc: error: train: argument --steps")
    assert "Traceback" not in missing.stderr + nan.stderr
    debug = run("--debug", "train", "--model", str(tmp_path / "missing"), "--circuit", BTREE, "--out",
                str(tmp_path / "o"), "--steps", "1")
    assert debug.returncode == 2 and "Traceback" in debug.stderr and "mtpc: error: no such model folder" in debug.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_killed_run_resumes_without_duplicate_log_steps(lm, corpus, tmp_path):
    """A real SIGKILL after a checkpoint, while later steps are already logged; the rerun finishes
    with each step logged once."""
    import signal
    import time

    out = tmp_path / "o"
    argv = [sys.executable, "-m", "mtpc.cli", *train_args(lm, corpus, out, "--steps", "400", "--save-every", "3")]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = out / "train_log.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline:
        steps = [json.loads(x)["step"] for x in log.read_text().splitlines() if x.endswith("}")] if log.exists() else []
        if (out / CHECKPOINT).exists() and steps and steps[-1] % 3 == 1 and steps[-1] > 3:  # 2 steps to the next save
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = torch.load(out / CHECKPOINT, weights_only=True)["step"]
    logged = [json.loads(x)["step"] for x in log.read_text().splitlines() if x.endswith("}")]
    assert max(logged) > saved  # the kill really left steps after the checkpoint in the log
    longer = [str(saved + 4) if a == "400" else a for a in argv]  # --steps may change across a resume
    resumed = subprocess.run(longer, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    steps = [json.loads(x)["step"] for x in log.read_text().splitlines()]
    assert steps == list(range(saved + 5))
