"""docs/compiler.md's output blocks are what the benchmark scripts print, and its Python block runs.

Each text block of the doc is one benchmark run's table; the paragraph before it names the recorded
run (`benchmarks/results/NAME.json`). The block must equal the table recorded there; the
`bench_circuits.py` table is also regenerated from the recorded report by the script's own
formatter, and the targets command the doc gives runs (at `--quick` sizes, with `circuitc` itself as
the `--baseline`) and prints tables of the same structure (titles, columns, programs, footer; the
timings and the tiny batch differ)."""

from __future__ import annotations

import json
import re
import shlex

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import _readme
from _readme import ROOT, shape
from test_benchmarks import keep_threads, script  # noqa: F401 (keep_threads: an autouse fixture)

COMPILER = ROOT / "docs" / "compiler.md"
RECORDED = re.compile(r"benchmarks/results/(\w+)\.json")


def output_blocks() -> list[_readme.Block]:
    return [b for b in _readme.file_blocks(COMPILER, include_skipped=True) if b.language in ("", "text")]


def recorded_name(block: _readme.Block) -> str:
    """The recorded run (`benchmarks/results/NAME.json`) the doc names last before `block`'s fence."""
    before = "\n".join(COMPILER.read_text().splitlines()[:block.line - 1])
    names = RECORDED.findall(before)
    assert names, f"{block.where}: no benchmarks/results/*.json named before this block"
    return names[-1]


def recorded_run(block: _readme.Block) -> dict:
    return json.loads((ROOT / "benchmarks" / "results" / f"{recorded_name(block)}.json").read_text())


def test_the_doc_shows_the_three_recorded_runs():
    assert [recorded_name(b) for b in output_blocks()] == ["circuits", "circuit_targets", "circuit_targets_merged"]


@pytest.mark.parametrize("block", output_blocks(), ids=lambda b: b.where)
def test_each_block_is_its_recorded_runs_table(block):
    assert block.text.rstrip("\n") == recorded_run(block)["table"].rstrip("\n"), block.where


def test_the_circuits_table_is_what_the_script_prints_for_its_report(monkeypatch):
    """Today's formatter, given the recorded run's measurements, prints the doc's table. (The recorded
    report predates its `batch` and `big_vars` keys; the full-size run's are the script's FULL scale.)"""
    bench = script("bench_circuits")
    block = output_blocks()[0]
    report = recorded_run(block)
    assert "structures" in report, block.where  # a bench_circuits.py report
    monkeypatch.setenv("OMP_WAIT_POLICY", report["omp_wait_policy"])
    full = {"batch": bench.FULL.batch, "big_vars": bench.FULL.big_vars}
    assert bench.table({**full, **report}) == block.text.rstrip("\n")


def targets_command() -> list[str]:
    """The arguments of the doc's `bench_circuit_targets.py` command."""
    [command] = re.findall(r"`[^`]*python benchmarks/bench_circuit_targets\.py ([^`]*)`", COMPILER.read_text())
    return shlex.split(command)


def table_parts(text: str) -> tuple[list[str], list[list[str]], list[list[str]], str]:
    """(titles, column names per table, programs per table, the footer line) of a targets printout."""
    titles, columns, programs, footer = [], [], [], ""
    for line in text.splitlines():
        if line.startswith("program "):
            columns.append(re.split(r"\s{2,}", line.strip())[2:-1])  # between `B` and `roofline`
            programs.append([])
        elif line.startswith("medians of "):
            footer = line
        elif re.fullmatch(r"[a-z_]+\s+\d+\s.*", line):
            programs[-1].append(line.split()[0])
        elif not line.startswith("-"):
            titles.append(line)
    return titles, columns, programs, footer


def test_the_targets_command_prints_tables_of_the_docs_structure(capsys):
    args = targets_command()
    assert args[args.index("--baseline") + 1] == "circuitc_old"
    args[args.index("--baseline") + 1] = "circuitc"  # the same layout, importable here
    script("bench_circuit_targets").main([*args, "--quick", "--threads", "2"])
    printed = table_parts(capsys.readouterr().out)
    for block in output_blocks()[1:]:
        shown = table_parts(block.text)
        assert printed[0] == shown[0], block.where  # the titles
        # the columns: eager and before at 1 and 2 threads (cirkit too where installed; --quick fuses nothing)
        for ours, theirs in zip(printed[1], shown[1], strict=True):
            assert {"eager 1 thr", "eager 2 thr", "before 1 thr", "before 2 thr"} <= set(ours) <= set(theirs)
        assert printed[2] == shown[2], block.where  # the same programs in the same order
        assert shape(shown[3]).fullmatch(printed[3]), (printed[3], shown[3])


class OpCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def test_the_op_counts_the_doc_gives():
    """"BTree n=16 r=32 at B=1 with shared logits runs log-likelihood in N tensor ops, ...": recounted."""
    import circuitc
    from circuitc.builders import btree_graph

    said = re.search(r"runs log-likelihood in (\d+) tensor ops, prefix marginals (\d+), sampling (\d+), MAP (\d+) "
                     r"\(torch (\d+\.\d+),", " ".join(COMPILER.read_text().split()))
    assert said, "docs/compiler.md no longer gives the op counts and the torch they were counted with"
    if not torch.__version__.startswith(said.group(5) + "."):
        pytest.skip(f"the doc's counts are torch {said.group(5)}'s (aten ops differ between versions)")
    circ = circuitc.compile(btree_graph(16, 32, 256))
    theta, x = torch.randn(circ.num_params), torch.randint(256, (1, 16))
    generator = torch.Generator().manual_seed(0)
    programs = (lambda: circ.log_prob(x, theta), lambda: circ.prefix_log_marginals(x, theta),
                lambda: circ.sample(theta, 1, generator=generator), lambda: circ.map(theta))
    counted = []
    with torch.no_grad():
        for program in programs:
            program()  # a first call may build lazily
            with OpCount() as count:
                program()
            counted.append(count.ops)
    assert counted == [int(n) for n in said.groups()[:4]], f"update docs/compiler.md's op counts to {counted}"


def test_the_python_block_runs(tmp_path, monkeypatch):
    [block] = [b for b in _readme.file_blocks(COMPILER, include_skipped=True) if b.language == "python"]
    monkeypatch.chdir(tmp_path)
    assert _readme.printed_by(block) == ""
