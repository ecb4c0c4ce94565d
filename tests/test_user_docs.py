"""The user docs speak to a user: no internal issue numbers, session history, report folders named by a
sequence number, scripts under runs/ (which git ignores: nothing there ships) or commit hashes as
baselines; the README stays a front door (short, linking guides that exist), and docs/reproduce.md's LM
command is the shipped LM's recipe. docs/results.md is a reference (one section per question, each
table with its command), so it is checked too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
USER_DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "models" / "README.md",
             *sorted((ROOT / "docs").glob("*.md"))]
HISTORY = re.compile(
    r"\bissue[- ]?\d+|\b(this|last|previous) round\b|\bround's\b"  # the work's own bookkeeping
    r"|(?<![\w.])s\d{2,3}(?=[-_/])|[-_/]s\d{2,3}(?!\w)"  # folders named by a sequence number: s15-t1, t1-s13, runs/s16/
    r"|\bruns/[\w./*{},-]*\.sh\b"  # a script under runs/, which does not ship
    r"|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"  # a commit hash (a baseline is named by what it was)
    r"|\b(?:previous|earlier|last) README\b|\bwas lent\b",  # who ran what when
    re.I)


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_docs_name_no_issue_numbers_or_session_history(doc):
    found = HISTORY.search(doc.read_text())
    assert not found, f"{doc.relative_to(ROOT)}: {found.group(0)!r}"


@pytest.mark.parametrize("text", ["see issue 54", "in `docs/bench/third-party/s15-t1/`", "the `*-s13/` reports",
                                  "`--out runs/s16/t1`", "cycle_cold_s16.json", "(`runs/x0/train.sh`)",
                                  "library code of commit bf9e9dc", "the previous README's run", "no GPU was lent"])
def test_the_history_check_catches(text):
    assert HISTORY.search(text), text


@pytest.mark.parametrize("text", ["`--mtp-window-stride 4` into runs/lm-mtp-10-s4", "benchmarks/subword.sh",
                                  "the `s` windows", "bf16 and fp32", "ff8, btree8-r8", "sha256 of the file",
                                  "2026-12-05", "docs/bench/third-party/t1-transformers-5.25/"])
def test_the_history_check_passes(text):
    assert not HISTORY.search(text), text


def test_the_readme_is_short_and_its_links_exist():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for target in re.findall(r"\]\(([^)#\s]+)\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), target


@pytest.mark.parametrize("guide", sorted((ROOT / "docs").glob("guide-*.md")) + [ROOT / "docs" / "reproduce.md"],
                         ids=lambda p: p.name)
def test_guides_link_only_to_files_that_exist(guide):
    for target in re.findall(r"\]\(([^)#\s]+)\)", guide.read_text()):
        if "://" not in target:
            assert (guide.parent / target).exists(), target


def test_reproduce_commands_lm_recipe_is_the_shipped_lms(monkeypatch):
    """docs/reproduce.md's `mtpc tiny-lm` command, with the CLI's defaults, gives the configuration the
    shipped LM recorded (models/byte-lm/tiny_lm.json) in every training setting: all but the output
    folder, the progress bar, and the precision, which it pins to the fp32 that `auto` chose there."""
    import dataclasses
    import json

    import _readme
    import mtpc.training.tiny_lm as tiny_lm
    from mtpc.cli.commands import build_parser, run_tiny_lm

    class Configured(Exception):
        pass

    def capture(cfg):
        raise Configured(dataclasses.asdict(cfg))

    monkeypatch.setattr(tiny_lm, "train_tiny_lm", capture)  # read the configuration, train nothing
    [command] = [c for c in _readme.commands() if c.block.path.name == "reproduce.md" and "tiny-lm" in c.text]
    with pytest.raises(Configured) as configured:
        run_tiny_lm(build_parser().parse_args(_readme.argv(command)))
    ours = configured.value.args[0]
    shipped = json.loads((ROOT / "models" / "byte-lm" / "tiny_lm.json").read_text())
    assert shipped["autocast"] == "fp32" and ours["precision"] == "fp32"
    differing = {k: (v, ours.get(k)) for k, v in shipped["config"].items()
                 if k not in ("out", "progress", "precision") and ours.get(k) != v}
    assert not differing, differing


def test_reproduce_commands_ff_head_recipe_is_the_shipped_heads(monkeypatch):
    """The same for its `mtpc train` command and models/heads/ff8/train_config.stage1.json: all but the paths
    (model, data, output), the progress bar, the pinned precision and `steps` (the shipped file records
    the count its 15-minute budget became)."""
    import dataclasses
    import json

    import _readme
    import mtpc.training.trainer as trainer
    from mtpc.cli.commands import build_parser, run_train

    class Configured(Exception):
        pass

    def capture(cfg, announce=None):
        raise Configured(dataclasses.asdict(cfg))

    monkeypatch.setattr(trainer, "train", capture)
    [command] = [c for c in _readme.commands() if c.block.path.name == "reproduce.md" and c.text.startswith("mtpc train")]
    with pytest.raises(Configured) as configured:
        run_train(build_parser().parse_args(_readme.argv(command)))
    ours = configured.value.args[0]
    # the FF's first stage (its second, `--first-token` from it, is models/README.md's command)
    shipped = json.loads((ROOT / "models" / "heads" / "ff8" / "train_config.stage1.json").read_text())
    assert ours["precision"] == "fp32"
    differing = {k: (v, ours[k]) for k, v in shipped.items()
                 if k in ours and k not in ("model", "data", "out", "progress", "precision", "steps") and ours[k] != v}
    assert not differing, differing
