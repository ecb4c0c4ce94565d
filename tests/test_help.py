"""What a new user reads first: `--version` and `--help` of both commands.

Each option's default is said once, never as noise (`(default: None)`, `(default: [])`, `--debug
(default: False)`); the help points to nothing an installed wheel lacks; the two commands' shared
options agree (`--device` defaults to `auto` in `mtpc generate` as in `mtpc bench`)."""

from __future__ import annotations

import json
import re
from importlib.metadata import version
from pathlib import Path

import pytest

import circuitc
import mtpc
from circuitc.cli import main as circuitc_main
from mtpc.cli.commands import build_parser
from mtpc.cli.commands import main as mtpc_main

ROOT = Path(__file__).resolve().parent.parent
CIRCUITC = [[], ["check"], ["export"], ["show"], ["fmt"], ["compile"]]
MTPC = [[], ["tiny-lm"], ["train"], ["bench"], ["distill-data"], ["generate"]]


def help_text(main, argv, capsys) -> str:
    assert main([*argv, "--help"]) == 0
    return capsys.readouterr().out


def option_entries(text: str) -> list[str]:
    """One string per option of a help page: its flag line joined with the wrapped lines below it."""
    entries: list[str] = []
    for line in text.splitlines():
        if re.match(r"  -", line):
            entries.append(line.strip())
        elif entries and line.startswith("    ") and line.strip():
            entries[-1] += " " + line.strip()
        elif not line.strip() or not line.startswith(" "):
            entries.append("")  # a blank line or a section title ends the entry
    return [" ".join(e.split()) for e in entries if e]


def test_versions_agree_with_the_package_metadata(capsys):
    expected = version("circuitc")  # one distribution carries both packages
    assert circuitc.__version__ == mtpc.__version__ == expected
    assert circuitc_main(["--version"]) == 0
    assert capsys.readouterr().out == f"circuitc {expected}\n"
    assert mtpc_main(["--version"]) == 0
    assert capsys.readouterr().out == f"mtpc {expected}\n"


@pytest.mark.parametrize("main, argv", [(circuitc_main, a) for a in CIRCUITC] + [(mtpc_main, a) for a in MTPC],
                         ids=[" ".join(["circuitc", *a]) for a in CIRCUITC] + [" ".join(["mtpc", *a]) for a in MTPC])
def test_each_default_is_said_once_and_never_as_noise(main, argv, capsys):
    text = help_text(main, argv, capsys)
    entries = option_entries(text)
    assert len(entries) >= 2 and any("--help" in e for e in entries)
    for entry in entries:
        assert len(re.findall(r"\bdefault\b", entry)) <= 1, entry
        for noise in ("(default: None)", "(default: [])", "(default: False)", "(default: True)", "(default: ())"):
            assert noise not in entry, entry
    assert "docs/" not in text  # the wheel carries no docs folder


def test_defaults_that_matter_are_still_shown(capsys):
    compile_help = " ".join(help_text(circuitc_main, ["compile"], capsys).split())
    for shown in ("(default: 1,1024)", "torch threads for --fuse (default: 1)", "(default: <stem>.plan.json beside FILE)",
                  "--max-steps N most evaluation steps (statements, calls, loop turns) of a .pc program (default: 1000000)"):
        assert shown in compile_help, shown
    show_help = " ".join(help_text(circuitc_main, ["show"], capsys).split())
    assert "(default: text)" in show_help and "(default: standard output; a PNG: <stem>.png beside FILE)" in show_help
    generate_help = " ".join(help_text(mtpc_main, ["generate"], capsys).split())
    assert "print as cycles commit (default) or all at the end" in generate_help
    assert "(default: auto)" in generate_help


def test_generate_and_bench_pick_the_device_alike():
    parser = build_parser()
    generate = parser.parse_args(["generate", "--model", "m", "x"])
    bench = parser.parse_args(["bench", "--model", "m", "--heads", "h", "--corpus", "stdlib"])
    assert generate.device == bench.device == "auto"


def test_tiny_lm_defaults_are_the_reference_shape():
    """`mtpc tiny-lm`'s shape flags default to TinyLMConfig's, which are models/byte-lm's shape."""
    from mtpc.training.tiny_lm import TinyLMConfig
    args = build_parser().parse_args(["tiny-lm", "--out", "x"])
    defaults = TinyLMConfig(out="x")
    for name in ("d_model", "layers", "heads", "ffn", "context"):
        assert getattr(args, name) == getattr(defaults, name), name
    config = json.loads((ROOT / "models" / "byte-lm" / "config.json").read_text())
    assert (defaults.d_model, defaults.layers, defaults.heads, defaults.ffn) == (
        config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"], config["intermediate_size"])
