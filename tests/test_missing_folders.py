"""A model, head or LoRA folder that is not there is named by mtpc before transformers or peft see the
name (they would take it for a Hub id and report "couldn't connect to huggingface.co").

mtpc reads local folders only, so every loader checks the path on disk: Python callers get one
`mtpc.errors.MissingFolderError` (an `InputError`), the command line one `mtpc: error: no such ...
folder: PATH` line with exit status 2. A name shaped like a Hub id (`gpt2`, `org/name`, whose first
part is not a local folder) also says it was not looked up on the Hub and how to download it; a path
that is local by its shape (`./x`, `/x`, `runs/x` where `runs/` exists, `a/b/c`) lists what its
parent folder holds instead (the likely typo)."""

from __future__ import annotations

import pytest

from circuitc.builders import ff_graph
from mtpc import MTPHead, load_head
from mtpc.cli.commands import main as mtpc
from mtpc.errors import InputError, MissingFolderError
from mtpc.lm.loading import head_folder, load_model, model_config, model_info, open_model
from mtpc.lm.lora import adapter_files, load_lora, lora_folder

from _readme import ROOT
from _tiny import save_tiny_lm

HUB_HINT = "did not look"


@pytest.fixture
def here(tmp_path, monkeypatch):
    """An empty working folder but for runs/tiny-lm10 (the quick start's old LM), runs/heads/ff4 and an
    empty runs/o (as a command makes for its output: not listed)."""
    (tmp_path / "runs" / "tiny-lm10").mkdir(parents=True)
    (tmp_path / "runs" / "tiny-lm10" / "config.json").write_text("{}")
    (tmp_path / "runs" / "heads" / "ff4").mkdir(parents=True)
    (tmp_path / "runs" / "o").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


LOADERS = {
    "open_model": (open_model, "model folder"),
    "load_model": (load_model, "model folder"),
    "model_info": (model_info, "model folder"),
    "model_config": (model_config, "model folder"),
    "head_folder": (head_folder, "head folder"),
    "load_head": (load_head, "head folder"),
    "MTPHead.from_pretrained": (MTPHead.from_pretrained, "head folder"),
    "lora_folder": (lora_folder, "LoRA adapter folder (--lora)"),
    "adapter_files": (adapter_files, "LoRA adapter folder"),
    "load_lora": (lambda path: load_lora(None, path), "LoRA adapter folder"),  # checked before the model is used
}


@pytest.mark.parametrize("name", LOADERS)
def test_a_missing_local_folder_is_named_by_every_loader(name, here):
    load, what = LOADERS[name]
    with pytest.raises(MissingFolderError) as caught:
        load("runs/tiny-lm")
    message = str(caught.value)
    assert message == f"no such {what}: runs/tiny-lm (runs/ holds: heads, tiny-lm10)"
    assert isinstance(caught.value, InputError) and isinstance(caught.value, ValueError)


@pytest.mark.parametrize("path", ["org/some-model", "gpt2"])
def test_a_hub_shaped_name_says_it_was_not_looked_up_on_the_hub(path, here):
    with pytest.raises(MissingFolderError) as caught:
        open_model(path)
    message = str(caught.value)
    assert message.startswith(f"no such model folder: {path} (")
    assert f"{HUB_HINT} '{path}' up on the Hugging Face Hub" in message and f"hf download {path} --local-dir" in message
    assert "couldn't connect" not in message


@pytest.mark.parametrize("path, hint", [
    ("./org/model", ""),  # local by its shape: no Hub hint
    ("a/b/c", ""),  # more than one slash: not a Hub id
    ("runs/x", " (runs/ holds: heads, tiny-lm10)"),  # its first part is a local folder
    ("runs/heads/ff8", ""),  # runs/heads/ff4 is empty: nothing to suggest
])
def test_a_local_shaped_path_gets_no_hub_hint(path, hint, here):
    with pytest.raises(MissingFolderError) as caught:
        load_head(path)
    assert str(caught.value) == f"no such head folder: {path}{hint}"


def test_an_absolute_path_names_its_parent_folders(here):
    with pytest.raises(MissingFolderError, match=f"no such model folder: {here}/runs/nothing \\(.*heads, tiny-lm10\\)"):
        model_info(here / "runs" / "nothing")


@pytest.fixture
def lm(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("lm") / "lm")


def cli_commands(lm: str) -> dict[str, tuple[list[str], str]]:
    """Each command-line flag that names a folder, pointed at a missing one: argv, what it is."""
    examples = str(ROOT / "examples")  # an existing --data source: the folders are checked first
    train = ["train", "--circuit", f"{examples}/ff.pc", "--data", examples, "--out", "runs/o", "--steps", "1"]
    bench = ["bench", "--prompts", "p.txt", "--num-prompts", "1"]
    return {
        "generate --model": (["generate", "--model", "runs/missing", "hi"], "model folder"),
        "generate --head": (["generate", "--model", lm, "--head", "runs/missing", "hi"], "head folder"),
        "generate --lora": (["generate", "--model", lm, "--head", "HEAD", "--lora", "runs/missing", "hi"],
                            "LoRA adapter folder (--lora)"),
        "train --model": ([*train, "--model", "runs/missing"], "model folder"),
        "train --init-head": ([*train, "--model", lm, "--init-head", "runs/missing"], "head folder"),
        "bench --model": ([*bench, "--model", "runs/missing", "--heads", "HEAD"], "model folder"),
        "bench --heads": ([*bench, "--model", lm, "--heads", "runs/missing"], "head folder"),
        "distill-data --model": (["distill-data", "--model", "runs/missing", "--out", "runs/d.jsonl"], "model folder"),
        "distill-data --head": (["distill-data", "--model", lm, "--head", "runs/missing", "--out", "runs/d.jsonl",
                                 "--prompt-len", "8", "--max-new-tokens", "8"], "head folder"),
    }


@pytest.mark.parametrize("flag", list(cli_commands("LM")))
def test_the_command_line_names_a_missing_folder_in_one_line(flag, lm, here, capsys):
    MTPHead(ff_graph(2, 256), 32).save_pretrained(here / "HEAD")  # a real head where one is needed besides
    (here / "p.txt").write_text("def f(\n")
    argv, what = cli_commands(lm)[flag]
    assert mtpc(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == f"mtpc: error: no such {what}: runs/missing (runs/ holds: heads, tiny-lm10)\n"
    assert captured.out == ""
