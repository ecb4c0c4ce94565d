"""MTP-aware pretraining in `mtpc tiny-lm`: the joint loss, gradients into the LM, the saved head
(load_head, SpeculativeDecoder, `mtpc train --init-head`), exact resume and DDP (real torchrun, gloo)
for the plain and the joint path, and one-line errors for bad flags."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from _tiny import write_source_corpus
from mtpc.cli.commands import main
from mtpc.errors import InputError
from mtpc.training.tiny_lm import CHECKPOINT, MTP_HEAD_DIR, JointLM, TinyLMConfig, build_model, train_tiny_lm
from mtpc.lm.tokenizer import ByteTokenizer

ROOT = Path(__file__).resolve().parent.parent
FF = str(ROOT / "examples" / "ff.pc")
BTREE = str(ROOT / "examples" / "btree.pc")
SMALL = dict(context=48, d_model=32, layers=2, heads=2, ffn=64, batch_size=4, lr=5e-3, warmup_steps=2,
             precision="fp32", val_fraction=0.2, val_tokens=256, final_val_tokens=512, progress=False)
SMALL_ARGS = ["--context", "48", "--d-model", "32", "--layers", "2", "--heads", "2", "--ffn", "64",
              "--batch-size", "4", "--precision", "fp32", "--no-progress"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_source_corpus(tmp_path_factory.mktemp("corpus"))


def joint_config(out, corpus, **kw):
    base = dict(out=str(out), data=corpus, steps=6, mtp_circuit=BTREE, mtp_bindings={"n": 4, "r": 2},
                mtp_weight=0.5, mtp_parameterisation="shared", mtp_window_stride=2, **SMALL)
    base.update(kw)
    return TinyLMConfig(**base)


def log_values(out, key):
    lines = (Path(out) / "train_log.jsonl").read_text().splitlines()
    return [json.loads(x)[key] for x in lines if f'"{key}"' in x]


def test_joint_loss_is_cross_entropy_plus_weighted_average_mtp_loss_and_reaches_the_backbone(tmp_path):
    import circuitc

    from mtpc.heads.head import MTPHead
    from mtpc.heads.nll_loss import mtp_loss
    from mtpc.training.tiny_lm import lm_nll

    torch.manual_seed(0)
    tok = ByteTokenizer()
    model = build_model(TinyLMConfig(out="", **SMALL), tok).double()
    head = MTPHead(circuitc.load_graph(BTREE, n=4, r=2), 32, init_from=model.lm_head.weight.detach(),
                   sum_init_std=0.1, dtype=torch.float64)
    tokens = torch.randint(0, 256, (2, 24))
    doc_ids = torch.zeros(2, 24, dtype=torch.long)
    doc_ids[1, 10:] = 1
    loss_mask = torch.ones(2, 24, dtype=torch.bool)
    batch = {"tokens": tokens, "doc_ids": doc_ids, "loss_mask": loss_mask}
    nll, count, _, _, _ = lm_nll(model, batch, None)
    hidden = model.model(input_ids=tokens).last_hidden_state
    # the MTP term is an average over the window's positions: divided by sum_j gamma^(j-1) = 3.439 (n=4)
    per_position = mtp_loss(head, hidden, tokens, doc_ids, loss_mask).loss / (1 + 0.9 + 0.81 + 0.729)
    expected = nll / count + 0.3 * per_position
    joint = JointLM(model, head, 0.3, 0.9, None)
    loss, ce, mtp = joint(tokens, doc_ids, loss_mask, count)
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ce, nll / count, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mtp, per_position.detach(), rtol=1e-12, atol=1e-12)
    # the MTP term's gradient reaches the backbone (not only the head): it changes the LM's gradients
    loss.backward()
    with_mtp = model.model.layers[0].mlp.down_proj.weight.grad.clone()
    model.zero_grad()
    JointLM(model, head, 0.0, 0.9, None)(tokens, doc_ids, loss_mask, count)[0].backward()
    without = model.model.layers[0].mlp.down_proj.weight.grad
    assert (with_mtp - without).abs().max() > 1e-6
    assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0


def test_joint_head_is_saved_loads_and_drafts_losslessly(tmp_path, corpus):
    from transformers import LlamaForCausalLM

    from mtpc import SpeculativeDecoder, load_head
    from mtpc.decoding import PlainDecoder

    out = tmp_path / "lm"
    s = train_tiny_lm(joint_config(out, corpus, steps=8))
    assert s["mtp_head"]["dir"] == MTP_HEAD_DIR and s["mtp_head"]["val_mtp_loss"] > 0
    losses = log_values(out, "mtp_loss")
    assert len(losses) == 8 and all(x == x for x in losses)
    head = load_head(out / MTP_HEAD_DIR)
    assert head.parameterisation == "shared" and head.num_variables == 4 and head.hidden_size == 32
    model = LlamaForCausalLM.from_pretrained(out, dtype=torch.float64).eval()
    decoder = SpeculativeDecoder(model, head.double())
    prompt = torch.tensor([[257, *b"def f(x):"]])
    spec = decoder.generate(prompt, 24)
    plain = PlainDecoder(model).generate(prompt, 24)
    assert torch.equal(spec.sequences, plain.sequences)
    # `mtpc train --init-head OUT/mtp_head` continues the jointly trained head on the frozen LM
    assert main(["train", "--model", str(out), "--init-head", str(out / MTP_HEAD_DIR), "--data", corpus,
                 "--steps", "2", "--seq-len", "32", "--batch-size", "4", "--precision", "fp32", "--no-progress",
                 "--val-sequences", "2", "--out", str(tmp_path / "continued")]) == 0
    assert load_head(tmp_path / "continued").parameterisation == "shared"


@pytest.mark.parametrize("joint", [False, True], ids=["plain", "joint"])
def test_resume_is_exact(tmp_path, corpus, joint):
    """Stop after 3 of 7 steps, rerun the same configuration: identical weights and losses."""
    extra = {} if joint else dict(mtp_circuit=None, mtp_bindings={}, mtp_weight=TinyLMConfig.mtp_weight, mtp_window_stride=1)
    train_tiny_lm(joint_config(tmp_path / "straight", corpus, steps=7, **extra))
    split = joint_config(tmp_path / "split", corpus, steps=7, stop_after=3, **extra)
    assert train_tiny_lm(split) == {"stopped_at": 3}
    assert (tmp_path / "split" / CHECKPOINT).exists() and not (tmp_path / "split" / "model.safetensors").exists()
    split.stop_after = None
    train_tiny_lm(split)
    for name in ["model.safetensors"] + ([f"{MTP_HEAD_DIR}/head.safetensors"] if joint else []):
        a, b = load_file(str(tmp_path / "straight" / name)), load_file(str(tmp_path / "split" / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    for key in ["loss_bits", "grad_norm"] + (["mtp_loss"] if joint else []):
        assert log_values(tmp_path / "straight", key) == log_values(tmp_path / "split", key)
    state = torch.load(tmp_path / "split" / CHECKPOINT, weights_only=True)
    assert state["step"] == 7 and ("head" in state) == joint


def test_resume_refuses_a_checkpoint_of_other_settings(tmp_path, corpus):
    cfg = joint_config(tmp_path / "a", corpus, steps=4, stop_after=2)
    train_tiny_lm(cfg)
    with pytest.raises(InputError, match="different settings .*mtp_weight"):
        train_tiny_lm(joint_config(tmp_path / "a", corpus, steps=4, mtp_weight=0.1))
    cfg.resume, cfg.stop_after = False, None  # --no-resume starts over
    assert train_tiny_lm(cfg)["steps"] == 4


# the LM alone is the same JointLM path with no head: the "joint" run checks its weights, loss and gradient
# norm under DDP too. Both wait for `pytest -m slow` (three processes each, 14 s): tests/test_train.py's DDP
# test keeps real torchrun in the default suite
@pytest.mark.slow
@pytest.mark.parametrize("joint", [False, True], ids=["plain", "joint"])
def test_ddp_two_processes_equal_one_process(tmp_path, corpus, joint):
    """A real `torchrun --nproc_per_node 2` (gloo, CPU) equals one process on the same global batch."""
    args = ["tiny-lm", "--data", corpus, "--steps", "3", *SMALL_ARGS]
    if joint:
        args += ["--mtp-circuit", BTREE, "-D", "n=4", "-D", "r=2", "--mtp-parameterisation", "shared",
                 "--mtp-window-stride", "3", "--mtp-weight", "0.5"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "mtpc.cli",
           *args, "--out", str(tmp_path / "ddp")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert main([*args, "--out", str(tmp_path / "single")]) == 0
    assert json.loads((tmp_path / "ddp" / "tiny_lm.json").read_text())["world_size"] == 2
    for key in ["loss_bits", "grad_norm"] + (["mtp_loss"] if joint else []):
        assert log_values(tmp_path / "ddp", key) == pytest.approx(log_values(tmp_path / "single", key), rel=1e-5)
    for name in ["model.safetensors"] + ([f"{MTP_HEAD_DIR}/head.safetensors"] if joint else []):
        a, b = load_file(str(tmp_path / "ddp" / name)), load_file(str(tmp_path / "single" / name))
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("extra, message", [
    (["-D", "n=8"], "only apply with --mtp-circuit"),
    (["--mtp-weight", "0.5"], "only apply with --mtp-circuit"),
    (["--mtp-circuit", "no/such.pc"], "no such file"),
    (["--mtp-circuit", FF, "-D", "n=0"], "--mtp-circuit"),
    (["--mtp-circuit", FF, "--mtp-weight", "-1"], "--mtp-weight"),
    (["--mtp-circuit", FF, "--mtp-window-stride", "0"], "--mtp-window-stride"),
    (["--steps", "0"], "--steps"),
])
def test_bad_flags_are_input_errors_before_any_work(tmp_path, capsys, extra, message):
    (tmp_path / "corpus.txt").write_text("def f(x):\n    return x\n" * 50)
    args = ["tiny-lm", "--out", str(tmp_path / "x"), "--data", str(tmp_path / "corpus.txt"), *SMALL_ARGS]
    if "--steps" not in extra:
        args += ["--steps", "2"]
    assert main(args + extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("mtpc: error:") and message in err and "Traceback" not in err, err
    assert not (tmp_path / "x").exists()

