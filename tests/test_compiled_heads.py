"""A compiled circuit is a first-class head circuit (issue 53): the README's path from a `.pc` file through
`circuitc compile` and `mtpc train --circuit x.plan.json` to lossless decoding, and heads built from
`circuitc.compile(...)` or a plan file that decode, save and reload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import circuitc
from _tiny import save_tiny_lm, write_source_corpus
from circuitc.cli import main as circuitc_main
from mtpc.cli.commands import main as mtpc_main
from mtpc.heads.head import MTPHead, load_head

pytestmark = pytest.mark.usefixtures("one_thread")

BTREE_4 = """# a balanced binary tree over four bytes, two units per region
vars x[4] states 256 units 2
x[0:2] = x[0] * x[1]
x[2:4] = x[2] * x[3]
x[0:4] = x[0:2] * x[2:4]
root x[0:4]
"""
TRAIN = ["--steps", "2", "--seq-len", "32", "--batch-size", "2", "--precision", "fp32", "--no-progress"]


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("lm"), sharpen=4.0)  # no near-ties between greedy choices


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_source_corpus(tmp_path_factory.mktemp("corpus"), parts=4)


@pytest.fixture
def plan_file(tmp_path, capsys) -> Path:
    """A `.pc` written and compiled as the README says: `circuitc compile tree.pc` -> tree.plan.json."""
    (tmp_path / "tree.pc").write_text(BTREE_4)
    assert circuitc_main(["compile", str(tmp_path / "tree.pc")]) == 0
    assert capsys.readouterr().out.endswith(f"wrote {tmp_path / 'tree.plan.json'}\n")
    return tmp_path / "tree.plan.json"


def generated(capsys, *argv) -> str:
    assert mtpc_main(["generate", *argv, "--no-stream"]) == 0
    return capsys.readouterr().out


@torch.no_grad()
def plain_greedy(model, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The reference: one full forward per token, the argmax appended."""
    ids = prompt
    for _ in range(new_tokens):
        ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


def test_the_readme_path_from_a_pc_file_to_lossless_decoding(tiny_lm, corpus, plan_file, tmp_path, capsys):
    out = tmp_path / "head"
    assert mtpc_main(["train", "--model", tiny_lm, "--circuit", str(plan_file), "--data", corpus, "--out", str(out),
                      *TRAIN]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("saved ")
    assert json.loads((out / "head.json").read_text())["graph"] == json.loads(plan_file.read_text())["graph"]
    prompt = ["--model", tiny_lm, "def main(", "--max-new-tokens", "24"]
    plain = generated(capsys, *prompt)
    assert generated(capsys, *prompt, "--head", str(out)) == plain and len(plain) > 1


def test_a_head_of_a_compiled_circuit_decodes_as_plain_greedy_and_saves(tiny_lm, tmp_path):
    from transformers import AutoModelForCausalLM

    from mtpc import SpeculativeDecoder

    (tmp_path / "tree.pc").write_text((Path(circuitc.__file__).parents[1] / "examples" / "btree.pc").read_text())
    circ = circuitc.compile(tmp_path / "tree.pc", n=4, r=2)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm).eval()
    torch.manual_seed(0)
    head = MTPHead(circ, model.config.hidden_size, sum_init_std=0.5)
    assert head.graph is circ.graph
    prompt = torch.tensor([[257, 100, 101, 102]])
    out = SpeculativeDecoder(model, head).generate(prompt, max_new_tokens=12).sequences
    plain = plain_greedy(model, prompt, 12)
    assert torch.equal(out, plain[:, :out.shape[1]]) and out.shape[1] > prompt.shape[1]
    assert out.shape[1] == plain.shape[1] or out[0, -1].item() == model.config.eos_token_id  # or it ended
    head.save_pretrained(tmp_path / "head")
    again = load_head(tmp_path / "head")
    assert again.graph.to_json() == circ.graph.to_json()
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), again.state_dict().values()))


def test_a_head_built_from_a_plan_file_or_its_dict_saves_and_reloads(plan_file, tmp_path):
    stored = json.loads(plan_file.read_text())
    for source in (plan_file, str(plan_file), stored):
        head = MTPHead(source, 16, parameterisation="shared")
        assert head.graph.to_json() == stored["graph"] and head.circ.plan.to_json() == stored
    head.save_pretrained(tmp_path / "head")
    again = load_head(tmp_path / "head")
    assert again.parameterisation == "shared" and again.circ.plan.to_json() == stored


def test_train_refuses_a_damaged_plan_file_in_one_line(tiny_lm, corpus, plan_file, tmp_path, capsys):
    text = plan_file.read_text()
    cases = {"truncated": (text[:len(text) // 3], "the plan file is truncated or damaged (invalid JSON"),
             "garbled": (text.replace('"param_offset": ', '"param_offset": 1', 1),
                         "the plan disagrees with its graph at layers[0].sums[0].param_offset"),
             "old": (json.dumps({k: v for k, v in json.loads(text).items() if k != "graph"}),
                     "this plan file holds no graph")}
    for name, (broken, fragment) in cases.items():
        plan_file.write_text(broken)
        status = mtpc_main(["train", "--model", tiny_lm, "--circuit", str(plan_file), "--data", corpus, "--out",
                            str(tmp_path / name), *TRAIN])
        err = capsys.readouterr().err
        assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith(f"mtpc: error: --circuit: {plan_file}: ") and fragment in err, err
        assert "recompile its source with `circuitc compile`" in err
        assert not (tmp_path / name / "head.safetensors").exists()
