"""Settings written once (`mtpc.settings`): every `mtpc` command's options are its config dataclass's
option fields, so the command line and the Python API agree on every default."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from mtpc.cli.commands import build_parser, command_config
from mtpc.errors import InputError
from mtpc.settings import add_settings, config_from_args, options, setting

# the fewest arguments each command takes, and the same values given to its config directly
REQUIRED = {
    "tiny-lm": (["--out", "o"], {"out": "o"}),
    "train": (["--model", "m", "--out", "o", "--steps", "1"], {"model": "m", "out": "o", "steps": 1}),
    "bench": (["--model", "m", "--heads", "h", "--corpus", "stdlib"],
              {"model": "m", "heads": ["h"], "corpus": "stdlib"}),
    "distill-data": (["--model", "m", "--out", "o.jsonl"], {"model": "m", "out": "o.jsonl"}),
    "generate": (["--model", "m"], {"model": "m"}),
    "features": (["--model", "m", "--out", "o"], {"model": "m", "out": "o"}),
    "export-hf": (["--model", "m.gguf", "--out", "o"], {"model": "m.gguf", "out": "o"}),
    "serve": (["--model", "m"], {"model": "m"}),
}


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def disagreements(parser: argparse.ArgumentParser, command: str) -> list[str]:
    """Where `mtpc COMMAND` with only its required arguments and its config built in Python differ:
    the config the command builds, and every parsed value that names a config field (an option
    added by hand for a field)."""
    argv, values = REQUIRED[command]
    args = parser.parse_args([command, *argv])
    built, reference = command_config(args), args.config(**values)
    found = [f"{f.name}: command line {getattr(built, f.name)!r}, API {getattr(reference, f.name)!r}"
             for f in dataclasses.fields(reference) if getattr(built, f.name) != getattr(reference, f.name)]
    by_hand = {f.name for f in dataclasses.fields(reference)} - {f.name for f in options(args.config)}
    found += [f"{name}: an option added by hand defaults to {value!r}, the field to {getattr(reference, name)!r}"
              for name, value in vars(args).items() if name in by_hand and value != getattr(reference, name)]
    return found


def test_every_command_with_settings_is_checked():
    assert set(subparsers(build_parser())) == set(REQUIRED)


@pytest.mark.parametrize("command", sorted(REQUIRED))
def test_cli_and_api_defaults_agree(command):
    assert disagreements(build_parser(), command) == []


def test_a_default_written_by_hand_that_disagrees_is_caught():
    parser = build_parser()
    subparsers(parser)["train"].set_defaults(lr=0.5)  # as a hand-written `add_argument("--lr", default=0.5)`
    assert disagreements(parser, "train") == ["lr: command line 0.5, API 0.002"]
    parser = build_parser()
    subparsers(parser)["tiny-lm"].add_argument("--warmup-steps", type=int, default=10)  # a field without an option
    assert disagreements(parser, "tiny-lm") == ["warmup_steps: an option added by hand defaults to 10, the field to 50"]


def test_generate_defaults_to_the_device_every_command_uses():
    from mtpc.bench import BenchConfig
    from mtpc.cli.generate import GenerateConfig
    from mtpc.training import DistillConfig, TinyLMConfig, TrainConfig

    assert GenerateConfig(model="m").device == BenchConfig(model="m", heads=["h"]).device == "auto"
    assert TrainConfig(model="m", out="o").device == TinyLMConfig(out="o").device == "auto"
    assert "device" not in {f.name for f in dataclasses.fields(DistillConfig)}  # it decodes on the LM's device


# ------------------------------------------------------------------ the helper itself, on a made-up command

LEVELS = {"low": 1, "high": 9}


@dataclasses.dataclass
class Toy:
    name: str = setting(help="required")
    words: tuple = setting(("a",), nargs="+", help="one or more")
    level: int = setting(1, choices=LEVELS, help="a word standing for a number")
    quiet: bool = setting(False, help="a switch")
    progress: bool = setting(True, flag="--no-progress", help="a negative switch")
    stream: bool = setting(True, help="a pair")
    pairs: dict = setting(factory=dict, flag="-D", repeat=True, help="repeatable",
                          parse=lambda items: dict(item.split("=") for item in items))
    left: int | None = setting(None, type=int, exclusive="side", help="one side")
    right: int | None = setting(None, type=int, exclusive="side", help="the other")
    extra: int = setting(0, type=int, group=("Extras", "options in a section of their own"), help="grouped")
    text: str | None = setting(None, flag="text", help="positional")
    api_only: float = 0.5


def toy_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toy", exit_on_error=False)
    add_settings(parser, Toy)
    return parser


def test_fields_become_options_and_come_back_as_the_config():
    parser = toy_parser()
    assert config_from_args(Toy, parser.parse_args(["--name", "n", "--left", "1"])) == Toy(name="n", left=1)
    args = parser.parse_args(["hi", "--name", "n", "--words", "x", "y", "--level", "high", "--quiet", "--no-progress",
                              "--no-stream", "-D", "a=1", "-D", "b=2", "--right", "3", "--extra", "4"])
    assert config_from_args(Toy, args) == Toy(name="n", words=("x", "y"), level=9, quiet=True, progress=False,
                                              stream=False, pairs={"a": "1", "b": "2"}, right=3, extra=4, text="hi")
    assert "api_only" not in vars(args)
    assert "Extras:" in parser.format_help() and "options in a section of their own" in parser.format_help()


@pytest.mark.parametrize("argv", [["--left", "1"], ["--name", "n"], ["--name", "n", "--left", "1", "--right", "2"],
                                  ["--name", "n", "--left", "1", "--level", "9"]])
def test_required_exclusive_and_choices_are_enforced(argv):
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        toy_parser().parse_args(argv)


def test_a_word_map_must_name_the_default():
    @dataclasses.dataclass
    class Broken:
        level: int = setting(5, choices=LEVELS, help="5 is no word's value")

    with pytest.raises(ValueError, match="level: the default 5"):
        add_settings(argparse.ArgumentParser(), Broken)


def test_a_bad_define_is_one_input_error():
    args = build_parser().parse_args(["train", "--model", "m", "--out", "o", "--steps", "1", "-D", "n=1", "-D", "n=2"])
    with pytest.raises(InputError, match="-D n is given twice"):
        command_config(args)
