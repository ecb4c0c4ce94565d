"""Head folders: save_pretrained/from_pretrained (the right subclass), folders written by earlier code
still load, and a damaged folder raises InputError naming the file and the problem."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from circuitc import builders
from mtpc import MTPHead, load_head
from mtpc.errors import InputError
from mtpc.heads.head import FactorisedHead, FullHead, SharedHead

OLD = Path(__file__).parent / "data" / "heads_v1"
KINDS = {"full": FullHead, "shared": SharedHead, "factorised": FactorisedHead}


@pytest.mark.parametrize("kind", KINDS)
def test_folders_written_by_earlier_save_head_still_load(kind):
    expected = torch.tensor(json.loads((OLD / kind / "expected_theta.json").read_text()))
    for head in (load_head(OLD / kind), MTPHead.from_pretrained(OLD / kind), KINDS[kind].from_pretrained(OLD / kind)):
        assert type(head) is KINDS[kind]
        # float32 matmul kernels differ by a few ulp between CPUs (AVX2 vs AVX-512); a misread weight differs by far more
        torch.testing.assert_close(head(torch.linspace(-1, 1, 8)), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_save_pretrained_from_pretrained_round_trip(kind, tmp_path):
    torch.manual_seed(0)
    head = MTPHead(builders.hmm_graph(3, 2, 7), 12, parameterisation=kind, adapter_rank=2, factor_rank=3,
                   sum_init_std=0.2, dtype=torch.float64)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_()
    head.save_pretrained(tmp_path / "h")
    back = MTPHead.from_pretrained(tmp_path / "h")
    assert type(back) is type(head) and back.dtype == torch.float64 and back.options == head.options
    h = torch.randn(4, 12, dtype=torch.float64)
    assert torch.equal(back(h), head(h))
    assert MTPHead.from_pretrained(tmp_path / "h", dtype=torch.float32).dtype == torch.float32
    other = next(cls for name, cls in KINDS.items() if name != kind)
    with pytest.raises(InputError, match=f"holds a '{kind}' head"):
        other.from_pretrained(tmp_path / "h")


def damaged(tmp_path, change):
    folder = tmp_path / "head"
    shutil.copytree(OLD / "shared", folder)
    change(folder)
    return folder


def edit_config(**updates):
    def change(folder):
        config = json.loads((folder / "head.json").read_text())
        config.update(updates)
        (folder / "head.json").write_text(json.dumps(config))
    return change


def truncate(name, size):
    return lambda folder: (folder / name).write_bytes((folder / name).read_bytes()[:size])


@pytest.mark.parametrize("change, message", [
    (lambda f: (f / "head.safetensors").unlink(), r"has no head\.safetensors"),
    (truncate("head.safetensors", 300), r"head\.safetensors: not a readable safetensors file"),
    (truncate("head.safetensors", 5), r"head\.safetensors: not a readable safetensors file"),
    (lambda f: (f / "head.json").unlink(), r"has no head\.json"),
    (truncate("head.json", 100), r"head\.json: not valid JSON"),
    (lambda f: (f / "head.json").write_bytes(b"\xff\xfe"), r"head\.json: not valid JSON"),
    (lambda f: (f / "head.json").write_text("[1, 2]"), r"head\.json must hold a JSON object, it holds a list"),
    (edit_config(format="mtpc-head/99"), r"head\.json: format is a string, not 'mtpc-head/1'"),
    (edit_config(graph="/etc/passwd"), r"head\.json: graph must be the inline graph-spec JSON object, got a string"),
    (edit_config(graph={"format": "circuitc-graph/1", "variables": 2}), r"head\.json: graph:"),
    (edit_config(parameterisation="lowrank"), r"head\.json: parameterisation must be one of full, shared"),
    (edit_config(hidden_size=-3), r"head\.json: hidden_size must be in 1\.\."),
    (edit_config(hidden_size=9), r"head\.safetensors: proj_weight has shape \(\d+, 8\)"),
    (edit_config(options={"adapter_rank": 5}), r"head\.safetensors: proj_weight has shape \(22, 8\), the graph and options in head\.json need \(34, 8\)"),
    (edit_config(options={"adapter_rank": "x"}), r"options: adapter_rank must be an integer"),
    (edit_config(parameterisation="full"), r"head\.safetensors holds .*a 'full' head has"),
    (edit_config(options={"first_token": "yes"}), r"options: first_token must be a bool, got a string"),
    (edit_config(options={"adapter_rank": 2, "first_token": True}), r"head\.safetensors holds .*a 'shared' head has"),
    (edit_config(options={"adapter_rank": 2, "first_token_mlp": -4}), r"options: first_token_mlp must be in 0\.\."),
    (edit_config(options={"adapter_rank": 2, "first_token_mlp": 3}), r"head\.safetensors holds .*a 'shared' head has"),
])
def test_a_damaged_folder_names_the_file_and_the_problem(tmp_path, change, message):
    folder = damaged(tmp_path, change)
    with pytest.raises(InputError, match=message) as info:
        load_head(folder)
    assert "root:" not in str(info.value)  # a string graph is refused, never read as a path and echoed


def test_weights_stored_narrower_than_the_head_runs(tmp_path):
    """head.json's `compute_dtype`: float16 weights of a float32 head load as float32 parameters holding the
    float16 values (a shipped head in half the bytes); a compute_dtype that is no float type is one line."""
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    head = MTPHead(builders.cp_graph(3, 2, 7), 12, sum_init_std=0.2, dtype=torch.float32)
    head.save_pretrained(tmp_path / "h")
    weights = tmp_path / "h" / "head.safetensors"
    save_file({k: v.half() for k, v in load_file(str(weights)).items()}, str(weights))
    assert load_head(tmp_path / "h").dtype == torch.float16  # without it, the weights' own dtype
    config = json.loads((tmp_path / "h" / "head.json").read_text())
    (tmp_path / "h" / "head.json").write_text(json.dumps({**config, "compute_dtype": "float32"}))
    back = load_head(tmp_path / "h")
    assert back.dtype == torch.float32
    assert all(torch.equal(p, q.half().float()) for p, q in zip(back.parameters(), head.parameters()))
    (tmp_path / "h" / "head.json").write_text(json.dumps({**config, "compute_dtype": "int8"}))
    with pytest.raises(InputError, match="compute_dtype must be one of"):
        load_head(tmp_path / "h")
