"""The checkable claims of README.md, its guides (`_readme.DOCS`) and docs/results.md, fast: the flags
they name exist, their commands parse with today's command line, the install line's versions are the
package's, every number they quote from a recorded run (docs/bench/*/bench.json, benchmarks/results/*.json,
models/) is that run's, the commands shown beside a table configure the runs it quotes, and the Python
names they cite exist. (tests/test_readme.py and tests/test_readme_commands.py run the commands.)"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import itertools
import json
import re

import pytest

import _readme
from _readme import ROOT, Command

THIRD_PARTY = ROOT / "docs" / "bench" / "third-party"
SMOLLM2 = ROOT / "docs" / "bench" / "smollm2"
RESULTS = ROOT / "docs" / "results.md"
# flags the docs name of the benchmark scripts, not of `mtpc`/`circuitc`: flag -> the script that takes it
SCRIPT_FLAGS = {"--dry-run": "benchmarks/recipe.sh", "--json": "benchmarks/bench_loss_memory.py",
                "--quick": "benchmarks/bench_circuits.py", "--old-rule": "benchmarks/heldout_bpb.py"}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]")


def help_text(main, args: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), contextlib.suppress(SystemExit):
        main(args)  # argparse exits after printing the help (circuitc's main returns instead)
    return out.getvalue()


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    """`--help` of every `mtpc` and `circuitc` subcommand, by "mtpc train", "circuitc compile", ..."""
    from circuitc.cli import main as circuitc
    from mtpc.cli.commands import build_parser

    parser = build_parser()
    found = {f"mtpc {sub}": help_text(parser.parse_args, [sub, "--help"])
             for sub in ("tiny-lm", "train", "generate", "bench", "distill-data", "features", "export-hf", "serve")}
    found.update({f"circuitc {sub}": help_text(circuitc, [sub, "--help"])
                  for sub in ("check", "compile", "show", "export", "fmt")})
    return found


def inline_code(paths=_readme.DOCS) -> list[tuple[str, str]]:
    """(file, span) of every inline code span of the docs, outside fenced blocks."""
    spans = []
    for path in paths:
        prose = re.sub(r"^\s*```.*?^\s*```", "", path.read_text(), flags=re.M | re.S)
        spans += [(path.name, span) for span in re.findall(r"`([^`]+)`", prose.replace("\n", " "))]
    return spans


def offers(help: str, flag: str) -> bool:
    return re.search(re.escape(flag) + r"(?![\w-])", help) is not None


def test_the_flags_the_docs_name_exist(helps):
    """A span `mtpc SUB ... --flag` names a flag of SUB, a span `python benchmarks/X.py ... --flag` one of
    X's options (checked in its source); any other `--flag` is one of some subcommand (or of the
    benchmark script SCRIPT_FLAGS says)."""
    everything = "\n".join(helps.values())
    missing = []
    for name, span in inline_code():
        program = re.match(r"(mtpc|circuitc) ([a-z-]+)", span)
        script = re.match(r"python (benchmarks/\w+\.py)", span)
        for flag in FLAG.findall(span):
            if program and not span.startswith(("mtpc.", "circuitc.")):
                known = offers(helps[program.group(0)], flag)
            elif script:  # `python benchmarks/X.py --flag`: one of that script's argparse options
                known = re.search(rf"[\"\s]{flag}[\"]", (ROOT / script.group(1)).read_text()) is not None
            elif flag in SCRIPT_FLAGS:  # an argparse option, or a case label of recipe.sh
                known = re.search(rf"[\"\s]{flag}[\")]", (ROOT / SCRIPT_FLAGS[flag]).read_text()) is not None
            elif f"{flag}-..." in span:  # a family of flags: `--max-...`
                known = f"{flag}-" in everything
            else:
                known = offers(everything, flag) or span.startswith(("pip ", "torchrun "))
            if not known:
                missing.append((name, span, flag))
    assert not missing, missing


def resolve(name: str):
    """The object a dotted name such as `mtpc.lm.families.WholeModelPath` names."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for part in parts[i:]:
            found = getattr(found, part)
        return found
    raise ModuleNotFoundError(name)


def test_the_python_names_the_docs_cite_exist():
    """Every `mtpc.…`/`circuitc.…` name in the prose of the user docs (and the language and compiler
    references) is importable."""
    docs = (*_readme.DOCS, ROOT / "docs" / "language.md", ROOT / "docs" / "compiler.md")
    names = {(file, m.group(0)) for file, span in inline_code(docs)
             for m in re.finditer(r"\b(?:mtpc|circuitc)(?:\.[A-Za-z_]\w*)+", span)}
    assert len(names) >= 20
    missing = []
    for file, name in sorted(names):
        try:
            resolve(name)
        except (ModuleNotFoundError, AttributeError):
            missing.append((file, name))
    assert not missing, missing


def mtpc_commands() -> list[Command]:
    """Every `mtpc ...` command of the docs' bash blocks (`$NX` set to the recorded corpus name), with
    `...` (more of the same, in the docs) left out."""
    found = []
    for c in _readme.commands():
        words = c.text.split()
        if c.block.language != "bash" or "mtpc" not in words[:2]:
            continue
        text = " ".join(w for w in words if w != "...")
        found.append(dataclasses.replace(c, text=text, prelude=("NX=site-packages/networkx", *c.prelude)))
    return found


def results_commands() -> list[Command]:
    """Every `mtpc ...` command of docs/results.md's bash blocks, `$NX` set to the recorded corpus name
    and `$HEADS` (the head folders a report lists) to one shipped head."""
    found = []
    for block in _readme.file_blocks(RESULTS, include_skipped=True):
        if block.language != "bash":
            continue
        prelude, index = ["NX=site-packages/networkx", "HEADS=models/heads/ff8"], 0
        for line in _readme.bash_lines(block):
            if _readme.is_assignment(line):
                prelude.append(line)
            elif line.startswith("mtpc "):
                found.append(Command(line, block, index, tuple(prelude)))
                index += 1
    return found


def test_the_docs_have_mtpc_commands():
    assert len(mtpc_commands()) >= 12 and len(results_commands()) >= 6


@pytest.mark.parametrize("command", mtpc_commands() + results_commands(), ids=lambda c: f"{c.block.where}#{c.index}")
def test_mtpc_commands_of_the_docs_parse(command):
    from mtpc.cli.commands import build_parser

    args = _readme.argv(command)
    out = io.StringIO()
    with contextlib.redirect_stderr(out):
        try:
            build_parser().parse_args(args)
        except SystemExit:
            pytest.fail(f"{command.block.where}: {command.text}: {out.getvalue()}")


def pyproject() -> dict:
    """pyproject.toml, read with the standard library's TOML reader (Python 3.11 on; skipped on 3.10)."""
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_install_versions_are_the_packages():
    """"Python 3.10 or newer, torch 2.11 up to 3, transformers 5.17 or a later 5.x" is pyproject.toml's."""
    project = pyproject()["project"]
    said = re.search(r"Python (\d+\.\d+) or newer, torch (\d+\.\d+) up to (\d+), transformers (\d+)\.(\d+) or a "
                     r"later (\d+)\.x", " ".join(_readme.README.read_text().split()))
    assert said, "the README's install section no longer gives the versions"
    python, torch_low, torch_high, transformers, transformers_minor, major = said.groups()
    assert project["requires-python"] == f">={python}" and major == transformers
    assert f"torch>={torch_low},<{torch_high}" in project["dependencies"]
    assert f"transformers>={transformers}.{transformers_minor},<{int(transformers) + 1}" in project["dependencies"]


def test_the_recorded_files_the_docs_cite_exist():
    """Every report folder (`docs/bench/...`) and result file (`benchmarks/results/...`) the README,
    docs/ and models/README.md name in code spans is in the repository (a renamed report leaves no
    stale name behind)."""
    docs = [ROOT / "README.md", ROOT / "models" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    cited = {(path.name, m) for path in docs
             for m in re.findall(r"`((?:docs/bench|benchmarks/results)/[\w./-]*[\w/])`", path.read_text())}
    assert len(cited) >= 20
    missing = [(name, m) for name, m in sorted(cited) if not (ROOT / m).exists()]
    assert not missing, missing


# ------------------------------------------------------------------ recorded bench runs

def report(folder) -> dict:
    import json
    return json.loads((folder / "bench.json").read_text())


def rows_of(recorded: dict) -> dict[str, dict]:
    """Plain decoding, the peers and the heads of one bench report, by label."""
    return {r["label"]: r for r in [{"label": "plain (eager)", **recorded["plain"]}, *recorded["peers"],
                                    *recorded["heads"]]}


def table_rows(path, first_header: str) -> list[list[str]]:
    """The cells of each body row of the one markdown table of `path` whose header row starts with
    `| first_header |`."""
    lines = path.read_text().splitlines()
    [start] = [i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |")]
    body = itertools.takewhile(lambda line: line.startswith("|"), lines[start + 2:])
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in body]


def test_the_readme_results_are_the_recorded_smollm2_runs():
    """The README's results table is what benchmarks/smollm2_table.py makes of the CP head's reports
    (docs/bench/smollm2-cp: each row one run of benchmarks/smollm2.sh, each cell a decoder's speed-up over
    transformers' generate with tokens per cycle in parentheses); the environment it names is the runs'; and
    the float32 record it cites says every greedy output was plain decoding's and transformers'."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("smollm2_table", ROOT / "benchmarks" / "smollm2_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    reports = ROOT / "docs" / "bench" / "smollm2-cp"
    made = module.readme_table(reports, ("greedy-bf16", "t1-bf16", "chat-bf16"), "smollm2-cp4-k2048-own")
    assert made in _readme.README.read_text() and made.count("\n") == 4
    text = " ".join(_readme.README.read_text().split())
    env = report(reports / "greedy-bf16")["environment"]
    assert f"torch {env['torch']}" in text and f"Python {env['python']}" in text and "benchmarks/smollm2.sh" in text
    fp32 = report(reports / "fp32-exactness")
    assert fp32["config"]["dtype"] == "fp32" and fp32["greedy_identical"] is True
    assert all(h["greedy_check"]["identical"] == h["greedy_check"]["compared"] > 0 for h in fp32["heads"] + fp32["peers"])
    assert {h["label"] for h in fp32["heads"]} >= {"smollm2-cp4-k2048-own/tree8", "smollm2-cp4-k2048-own/tree8/lookup"}
    own = report(ROOT / "docs" / "bench" / "smollm2-own" / "greedy-bf16")  # the FF head's run the README compares
    ratios = {}
    for name, folder in (("cp", reports), ("own", ROOT / "docs" / "bench" / "smollm2-own")):
        run = report(folder / "greedy-bf16")
        plain = next(p for p in run["peers"] if p["label"] == "plain (static + compile)")["tok_s"]["mean"]
        head = next(h for h in run["heads"] if h["label"].endswith("-own/compile"))["tok_s"]["mean"]
        ratios[name] = f"{head / plain:.2f}x"
    generate = {r: next(p for p in x["peers"] if p["label"] == "hf generate")["tok_s"]["mean"]
                for r, x in (("cp", report(reports / "greedy-bf16")), ("own", own))}
    assert (f"`generate` ran at {generate['cp']:.1f} tok/s in the greedy run and {generate['own']:.1f} in the same "
            f"command's run of the FF own-text head earlier that day, and against compiled plain decoding the two "
            f"heads decode code alike ({ratios['cp']} and {ratios['own']})") in text


BYTE_RUNS = {"t1": "t1-transformers-5.25", "t07": "t07-transformers-5.24", "greedy": "greedy-transformers-5.24"}


def test_the_byte_lm_commands_are_the_recorded_runs(monkeypatch):
    """results.md's three bench commands of the byte LM, parsed by today's CLI, configure the bench each
    recorded report ran (docs/bench/third-party/NAME/bench.json): all but the output folder and the
    progress bar."""
    import json

    import mtpc.bench
    from mtpc.cli.commands import build_parser, run_bench

    class Configured(Exception):
        pass

    def capture(cfg):
        raise Configured(dataclasses.asdict(cfg))

    monkeypatch.setattr(mtpc.bench, "run_bench", capture)
    commands = {_readme.argv(c)[-1].split("/")[-1]: c for c in results_commands()
                if c.text.startswith("mtpc bench $C ")}
    assert sorted(commands) == sorted(BYTE_RUNS)
    for name, command in commands.items():
        with pytest.raises(Configured) as configured:
            run_bench(build_parser().parse_args(_readme.argv(command)))
        ours = json.loads(json.dumps(configured.value.args[0]))  # tuples as the report's lists
        recorded = report(THIRD_PARTY / BYTE_RUNS[name])["config"]
        differing = {k: (v, ours.get(k)) for k, v in recorded.items() if k not in ("out", "progress") and ours.get(k) != v}
        assert not differing, (name, differing)


def byte_lm_cells(recorded: dict) -> list[str]:
    """A row of results.md's byte-LM tables: compiled plain x eager plain, then per head eager x eager
    plain / compiled x compiled plain, then bytes per cycle."""
    rows = rows_of(recorded)
    cells = [f"{rows['plain (static + compile)']['speedup_plain']['mean']:.2f}"]
    cells += [f"{rows[h]['speedup_plain']['mean']:.2f} / {rows[h + '/compile']['speedup_compiled']['mean']:.2f}"
              for h in ("ff8", "btree8-r8")]
    cells.append(" / ".join(f"{rows[h]['mu_acc']['mean']:.2f}" for h in ("ff8", "btree8-r8")))
    return cells


def test_the_byte_lm_tables_are_the_recorded_runs():
    """results.md's speed-up table of the byte LM and the four runs of its T = 1 command: every cell is
    the report the row names."""
    rows = table_rows(RESULTS, "run (report in `docs/bench/third-party/`)")
    assert len(rows) == 3
    for cells in rows:
        [folder] = re.findall(r"\(`([\w.-]+)`\)", cells[0])
        assert folder in BYTE_RUNS.values()
        assert [c.replace("**", "") for c in cells[1:]] == byte_lm_cells(report(THIRD_PARTY / folder)), cells
    greedy = report(THIRD_PARTY / BYTE_RUNS["greedy"])["greedy_identical"]
    assert greedy is True and "12/12 outputs identical" in rows[2][0]
    spread = table_rows(RESULTS, "report in `docs/bench/third-party/`")
    assert len(spread) == 4
    for cells in spread:
        expected = byte_lm_cells(report(THIRD_PARTY / cells[0].strip("`")))
        assert [cells[1], cells[2]] == [expected[0], expected[2]], cells


def test_the_stage_table_is_the_recorded_runs():
    """results.md's byte heads stage by stage: each row's bytes per cycle (± the prompt sets' spread) and
    first-position acceptance are those of the decoder its report holds, and every report ran the
    48-prompt eager command shown above the table."""
    rows = table_rows(RESULTS, "head | report in `docs/bench/`: decoder")
    assert len(rows) == 8
    for cells in rows:
        folder, label = re.fullmatch(r"`([\w/-]+)`: `([\w-]+)`", cells[1]).groups()
        recorded = report(ROOT / "docs" / "bench" / folder)
        config = recorded["config"]
        assert (config["num_prompts"], config["repeats"], config["seed"], config["compile"], config["temperature"],
                config["mode"]) == (24, 2, 1, False, 1.0, "sample"), folder
        row = rows_of(recorded)[label]
        assert cells[2].replace("**", "") == f"{row['mu_acc']['mean']:.2f} ± {row['mu_acc']['std']:.2f}", cells
        assert cells[3] == f"{row['position_acceptance'][0]:.2f}", cells


def test_the_cirkit_table_is_the_recorded_run():
    """results.md's circuitc-against-cirkit speed-ups are the one-thread rows of the table
    benchmarks/results/circuits.json recorded."""
    import json

    recorded = json.loads((ROOT / "benchmarks" / "results" / "circuits.json").read_text())["table"]
    speedup = {}
    for line in recorded.splitlines():
        words = line.split()
        if len(words) == 11 and words[3] == "1":
            speedup[words[0], words[1], words[2]] = words[8]
    rows = table_rows(RESULTS, "structure | log-likelihood, B = 1")
    assert [r[0] for r in rows] == ["FF", "CP", "HMM", "BTree"]
    for cells in rows:
        expected = [speedup[cells[0], program, batch] for program in ("log_prob", "prefix", "sample")
                    for batch in ("1", "1024")]
        assert cells[1:] == expected, cells


# ------------------------------------------------------------------ the shipped models' numbers

def said(path, pattern: str) -> tuple[str, ...]:
    found = re.search(pattern, " ".join(path.read_text().split()))
    assert found, f"{path.name} no longer says {pattern!r}"
    return found.groups()


def test_the_shipped_models_numbers_are_their_records():
    """What README.md, guide-heads and reproduce.md say of models/ is what models/ recorded: the LM's
    size, steps, budget and held-out bits per byte, the heads' steps, and the Python of the results."""
    import json

    lm = json.loads((ROOT / "models" / "byte-lm" / "tiny_lm.json").read_text())
    heads = [json.loads((ROOT / "models" / "heads" / h / "train_config.json").read_text()) for h in ("ff8", "btree8-r8")]
    first_stage = json.loads((ROOT / "models" / "heads" / "btree8-r8" / "train_config.stage1.json").read_text())
    ff_first_stage = json.loads((ROOT / "models" / "heads" / "ff8" / "train_config.stage1.json").read_text())
    second_stage = json.loads((ROOT / "models" / "heads" / "btree8-r8" / "train_config.stage2.json").read_text())
    third_stage = json.loads((ROOT / "models" / "heads" / "btree8-r8" / "train_config.stage3.json").read_text())
    heldout = {r["corpus"]: r for r in json.loads((ROOT / "benchmarks" / "results" / "heldout_bpb.json").read_text())["results"]}
    readme, reproduce = _readme.README, ROOT / "docs" / "reproduce.md"
    guide = ROOT / "docs" / "guide-heads.md"

    millions = f"{lm['parameters'] / 1e6:.2f}"
    assert said(readme, r"ships a ([\d.]+)M-parameter byte-level Llama") == (millions,)
    assert said(guide, r"context 1024, ([\d.]+)M parameters") == (millions,)
    stdlib, networkx = said(readme, r"models/byte-lm`: ([\d.]+) bits/byte on the standard-library files held out "
                                     r"from its training, ([\d.]+) on the networkx")
    assert stdlib == f"{lm['val_bits_per_byte']:.2f}" and networkx == f"{heldout['networkx']['bits_per_byte']:.2f}"
    minutes = round(lm["train_seconds"] / 60)
    assert said(guide, r"`models/byte-lm` took (\d+) minutes \((\d+) steps\) to reach (\d\.\d+)") == (
        str(minutes), str(lm["steps"]), f"{lm['val_bits_per_byte']:.3f}")
    assert said(reproduce, r"the shipped LM: (\d+) steps in (\d+) minutes; the heads: (\d+) and (\d+) steps in (\d+), "
                           r"then the BTree's second stage (\d+) steps in (\d+), its third (\d+) in (\d+) and its "
                           r"fourth (\d+) in (\d+), and the FF's second (\d+) steps in (\d+)\)") == (
        str(lm["steps"]), str(minutes), str(ff_first_stage["steps"]), str(first_stage["steps"]),
        f"{first_stage['minutes']:.0f}", str(second_stage["steps"]), f"{second_stage['minutes']:.0f}",
        str(third_stage["steps"]), f"{third_stage['minutes']:.0f}", str(heads[1]["steps"]), f"{heads[1]['minutes']:.0f}",
        str(heads[0]["steps"]), f"{heads[0]['minutes']:.0f}")
    assert first_stage["minutes"] == ff_first_stage["minutes"] and heads[1]["init_head"] == "models/heads/btree8-r8"
    assert heads[0]["init_head"] == "models/heads/ff8" and heads[0]["first_token"]
    assert second_stage["init_head"] == third_stage["init_head"] == "models/heads/btree8-r8" and third_stage["first_token"]
    assert heads[1]["first_token_mlp"] == 384  # the fourth stage reads x_0 through an MLP of that width
    python = report(THIRD_PARTY / BYTE_RUNS["t1"])["environment"]["python"]
    assert python.startswith(said(reproduce, r"the results were measured with Python (3\.\d+)")[0] + ".")


def test_the_changelog_and_readme_name_the_packages_version():
    version = pyproject()["project"]["version"]
    changelog = ROOT / "CHANGELOG.md"
    titles = re.findall(r"^## (\d+\.\d+\.\d+) — (\d{4}-\d\d-\d\d)", changelog.read_text(), flags=re.M)
    assert titles and titles[0][0] == version, titles
    assert [t[0] for t in titles] == sorted((t[0] for t in titles), key=lambda v: tuple(map(int, v.split("."))),
                                            reverse=True)  # newest first
    assert said(_readme.README, r"what changed in each version \(now (\d+\.\d+\.\d+)\)") == (version,)


def test_the_draft_costs_the_guide_gives_are_the_recorded_run():
    """guide-decoding's draft times per window, warm and cold, eager and compiled, for the shipped FF and
    BTree heads greedy and sampled: the extremes of benchmarks/results/cycle_cold_kernels.json
    (`python benchmarks/bench_cycle.py --cold`, today's decoder)."""
    import json

    records = json.loads((ROOT / "benchmarks" / "results" / "cycle_cold_kernels.json").read_text())["records"]
    assert {(r["head"], r["mode"], r["compiled"]) for r in records} == {
        (h, m, c) for h in ("ff8", "btree8-r8") for m in ("greedy", "sample") for c in (False, True)}

    def spread(key, compiled):
        values = [r[key] for r in records if r["compiled"] is compiled]
        return f"{min(values):.2f}", f"{max(values):.2f}"

    assert said(ROOT / "docs" / "guide-decoding.md", r"a window's draft takes ([\d.]+)-([\d.]+) ms compiled and "
                r"([\d.]+)-([\d.]+) ms eager called over and over, ([\d.]+)-([\d.]+) ms compiled and "
                r"([\d.]+)-([\d.]+) ms eager right after the caches are emptied") == (
        *spread("draft_ms", True), *spread("draft_ms", False), *spread("draft_cold_ms", True),
        *spread("draft_cold_ms", False))


def test_the_draft_temperatures_the_guide_compares_are_the_recorded_runs():
    """guide-decoding's bytes per cycle at each draft temperature, from the two side-by-side runs in
    docs/bench/draft-temperature/ (the shipped BTree on held-out networkx prompts)."""
    import json

    def bytes_per_cycle(run: str) -> dict:
        report = json.loads((ROOT / "docs" / "bench" / "draft-temperature" / run / "bench.json").read_text())
        assert report["config"]["heads"] == ["models/heads/btree8-r8"] and report["config"]["num_prompts"] == 12
        return {r["draft_temperature"]: f"{r['bytes_per_cycle']['mean']:.2f}" for r in report["heads"]}

    hot, warm = bytes_per_cycle("t07-sweep"), bytes_per_cycle("t1-sweep")
    guide = ROOT / "docs" / "guide-decoding.md"
    assert said(guide, r"at T = 0.7, top-p 0.95 the shipped BTree commits ([\d.]+) bytes per cycle drafting at 0.7 "
                r"against ([\d.]+) at 1, and ([\d.]+) at 0.6 or 0.5") == (hot[None], hot[1.0], hot[0.6])
    assert hot[0.5] == hot[0.6]
    assert said(guide, r"drafting at 1, 0.9 or 0.8 makes no difference \(([\d.]+), ([\d.]+), ([\d.]+)\)") == (
        warm[None], warm[0.9], warm[0.8])


def test_the_start_up_cost_the_docs_give_is_the_recorded_run():
    """README's and guide-decoding's extra seconds of a second `--compile` run, and the guide's cost when
    the step could not be stored, from one run: benchmarks/results/startup_kernels.json (transformers
    5.25; its `old` checkout could not save the step and traced it twice in every process)."""
    import json

    rows = {r["checkout"]: r for r in json.loads((ROOT / "benchmarks" / "results" / "startup_kernels.json")
                                                  .read_text())["rows"]}
    now, unsaved = f"{rows['this']['extra_s']:.1f}", f"{rows['old']['extra_s']:.1f}"
    assert said(ROOT / "README.md", r"and later runs load it: ([\d.]+) s more than eager") == (now,)
    assert said(ROOT / "docs" / "guide-decoding.md",
                r"([\d.]+) s more than eager on our 2-core CPU, against ([\d.]+) s when the step could not be "
                r"stored") == (now, unsaved)


def test_what_a_speed_up_needs_is_the_recorded_t1_run():
    """results.md's cycle costs: the start-up table is benchmarks/results/startup_kernels.json, and the
    T = 1 table and the bytes per cycle and cycle times each speed-up needs are computed from the run in
    docs/bench/third-party/t1-transformers-5.25 (speed-up s needs s x cycle / plain bytes per cycle, or a
    cycle of at most bytes x plain / s)."""
    import json

    results = ROOT / "docs" / "results.md"
    startup = {r["checkout"]: r for r in json.loads((ROOT / "benchmarks" / "results" / "startup_kernels.json")
                                                    .read_text())["rows"]}
    assert said(results, r"\| now \(the verify and decide steps loaded from disk\) \| ([\d.]+) \| ([\d.]+) \| "
                         r"\*\*([\d.]+)\*\* \|") == tuple(
        f"{startup['this'][k]:.2f}" for k in ("eager_s", "compile_s", "extra_s"))
    assert said(results, r"\(the save fails: traced twice in every process\) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|") == tuple(
        f"{startup['old'][k]:.2f}" for k in ("eager_s", "compile_s", "extra_s"))
    run = json.loads((ROOT / "docs" / "bench" / "third-party" / "t1-transformers-5.25" / "bench.json").read_text())
    heads = {h["label"]: h for h in run["heads"]}
    eager, compiled = heads["btree8-r8"], heads["btree8-r8/compile"]
    plain = run["plain"]["mu_lat"]["mean"] * 1e3
    [static] = [p for p in run["peers"] if p["label"] == "plain (static + compile)"]
    static = static["mu_lat"]["mean"] * 1e3
    cycle, fast_cycle = eager["mu_lat"]["mean"] * 1e3, compiled["mu_lat"]["mean"] * 1e3
    got = eager["bytes_per_cycle"]["mean"]
    verify = eager["phases_ms"]["backbone"]
    beside = sum(eager["phases_ms"][k] for k in ("head", "circuit", "accept"))
    assert said(results, r"\| BTree, eager / compiled \| ([\d.]+) / ([\d.]+) \| ([\d.]+) \| \*\*([\d.]+)\*\* / ([\d.]+) \| "
                r"([\d.]+) / \*\*([\d.]+)\*\* \|") == (
        f"{cycle:.2f}", f"{fast_cycle:.2f}", f"{got:.2f}", f"{eager['speedup_plain']['mean']:.2f}",
        f"{compiled['speedup_plain']['mean']:.2f}", f"{eager['speedup_compiled']['mean']:.2f}",
        f"{compiled['speedup_compiled']['mean']:.2f}")
    assert said(results, r"\| eager ≥ 1.5x eager plain \| ([\d.]+) \| ([\d.]+) ms: head, circuit and acceptance ≤ ([\d.]+) ms "
                r"beside the ([\d.]+) ms verify call \| ([\d.]+) ms \(([\d.]+) ms of them\) \|") == (
        f"{1.5 * cycle / plain:.2f}", f"{got * plain / 1.5:.2f}", f"{got * plain / 1.5 - verify:.2f}", f"{verify:.2f}",
        f"{cycle:.2f}", f"{beside:.2f}")
    assert said(results, r"\| eager ≥ 1.6x eager plain \| ([\d.]+) \| ([\d.]+) ms: ≤ ([\d.]+) ms") == (
        f"{1.6 * cycle / plain:.2f}", f"{got * plain / 1.6:.2f}", f"{got * plain / 1.6 - verify:.2f}")
    assert said(results, r"\| compiled ≥ 1.6x compiled plain \| ([\d.]+) \| ([\d.]+) ms \| ([\d.]+) ms \|") == (
        f"{1.6 * fast_cycle / static:.2f}", f"{got * static / 1.6:.2f}", f"{fast_cycle:.2f}")


def test_the_cold_step_table_is_the_recorded_run():
    """results.md's warm/cold table of a cycle's steps is benchmarks/results/cycle_cold_kernels.json, and
    the eager phases it quotes are the T = 1 run's."""
    import json

    records = {(r["head"], r["mode"], r["compiled"]): r for r in json.loads(
        (ROOT / "benchmarks" / "results" / "cycle_cold_kernels.json").read_text())["records"]}
    heads = {"BTree": "btree8-r8", "FF": "ff8"}
    modes = {"sampled": "sample", "greedy": "greedy"}
    rows = table_rows(RESULTS, "head, mode | draft warm / cold")
    assert len(rows) == 4
    for cells in rows:
        head, mode, how = cells[0].split(", ")
        r = records[heads[head], modes[mode], how == "compiled"]
        assert cells[1:] == [f"{r[k + '_ms']:.2f} / {r[k + '_cold_ms']:.2f}" for k in ("draft", "verify", "accept", "cycle")]
    run = {h["label"]: h for h in report(THIRD_PARTY / BYTE_RUNS["t1"])["heads"]}
    btree, ff = run["btree8-r8"]["phases_ms"], run["ff8"]["phases_ms"]
    assert said(RESULTS, r"Eager, the BTree's cycle is a ([\d.]+) ms verify call of 8 bytes plus ([\d.]+) ms of head "
                r"\(([\d.]+)\), circuit \(([\d.]+)\) and acceptance \(([\d.]+)\); the FF's a ([\d.]+) ms verify call "
                r"plus ([\d.]+) ms") == (
        f"{btree['backbone']:.2f}", f"{btree['head'] + btree['circuit'] + btree['accept']:.2f}", f"{btree['head']:.2f}",
        f"{btree['circuit']:.2f}", f"{btree['accept']:.2f}", f"{ff['backbone']:.2f}",
        f"{ff['head'] + ff['circuit'] + ff['accept']:.2f}")


# ------------------------------------------------------------------ guide-heads' loss-memory run

def loss_memory_block() -> _readme.Block:
    guide = ROOT / "docs" / "guide-heads.md"
    [block] = [b for b in _readme.file_blocks(guide, include_skipped=True) if b.text.startswith("MTP ")]
    return block


def test_the_loss_memory_table_is_the_recorded_run():
    """guide-heads shows benchmarks/results/loss_memory.json's run (defaults: nll loss, full head), as
    bench_loss_memory.py prints it."""
    import json

    recorded = json.loads((ROOT / "benchmarks" / "results" / "loss_memory.json").read_text())
    c = recorded["config"]
    lines = [f"MTP {c.get('loss', 'nll')} loss, {c.get('parameterisation', 'full')} head, {c['structure']} n={c['n']} "
             f"r={c['r']} v={c['v']} d={c['d']}, {c['tokens']} tokens, {c['device']}; memory: {recorded['rows'][0]['method']}",
             f"{'variant':8} {'peak MiB':>10} {'seconds':>9} {'loss':>12} {'|grad W|':>12}"]
    lines += [f"{r['variant']:8} {r['peak_bytes'] / 2**20:10.1f} {r['seconds']:9.2f} {r['loss']:12.6f} {r['grad_norm']:12.6f}"
              for r in recorded["rows"]]
    lines.append(f"fused / naive peak memory: {recorded['fused_over_naive']:.3f} (target <= 0.125)")
    assert loss_memory_block().text.rstrip("\n") == "\n".join(lines)


@pytest.mark.slow
def test_the_loss_memory_script_prints_lines_of_the_guides_shape(tmp_path):
    """Today's script, run tiny, prints the guide's lines with other numbers (two child processes)."""
    import os
    import subprocess
    import sys

    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_loss_memory.py"), "--n", "4", "--r", "2",
                          "--v", "16", "--d", "8", "--tokens", "32", "--batch", "2", "--device", "cpu"],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    shown = loss_memory_block().text.splitlines()
    printed = run.stdout.splitlines()
    assert len(printed) == len(shown)
    for ours, theirs in zip(printed, shown):
        assert _readme.shape(theirs.replace(" (target <= 0.125)", "")).fullmatch(ours.replace(" (target <= 0.125)", "")) \
            or _readme.shape(" ".join(theirs.split())).fullmatch(" ".join(ours.split())), (ours, theirs)


def test_the_smollm2_table_is_the_recorded_runs():
    """docs/results.md's SmolLM2 table is what benchmarks/smollm2_table.py makes of the reports
    benchmarks/smollm2.sh wrote (docs/bench/smollm2/*/bench.json), every row."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("smollm2_table", ROOT / "benchmarks" / "smollm2_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made = module.table(ROOT / "docs" / "bench" / "smollm2")
    assert made.count("\n") >= 8 and made in (ROOT / "docs" / "results.md").read_text()


def test_the_smollm2_structures_table_is_the_recorded_run():
    """docs/results.md's RQ2 table on SmolLM2 is what benchmarks/smollm2_heads.py makes of its record
    (benchmarks/results/smollm2_heads.json), and the prose's numbers are that record's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("smollm2_heads", ROOT / "benchmarks" / "smollm2_heads.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = json.loads(module.RECORD.read_text())
    text = (ROOT / "docs" / "results.md").read_text()
    assert module.table(data) in text
    heads = {h["run"]: h for h in data["heads"]}
    assert f"reaches {heads['h-ff4-21min']['teacher_forced_tokens_per_cycle']:.2f} tokens per cycle against " \
           f"{heads['h-ff4']['teacher_forced_tokens_per_cycle']:.2f}" in " ".join(text.split())


def test_the_equal_tokens_table_is_the_recorded_run():
    """docs/results.md's RQ2 table at equal tokens is what benchmarks/smollm2_rq2.py makes of its record, every
    head saw the same tokens, and the prose's numbers are the record's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("smollm2_rq2", ROOT / "benchmarks" / "smollm2_rq2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = json.loads(module.RECORD.read_text())
    text = (ROOT / "docs" / "results.md").read_text()
    assert module.table(data) in text
    heads = {h["run"]: h for h in data["heads"]}
    assert list(heads) == list(module.RUNS) and len({h["train_tokens"] for h in heads.values()}) == 1
    flat = " ".join(text.split())
    tokens = {name: f"{h['teacher_forced_tokens_per_window']:.2f}" for name, h in heads.items()}
    assert f"CP {tokens['cp4']} tokens a window and HMM {tokens['hmm4']} against the FF's {tokens['ff4']}" in flat
    assert f"depth 2 top-1 {heads['cp4']['depth_top1'][1]:.2f} and {heads['hmm4']['depth_top1'][1]:.2f} against " \
           f"{heads['ff4']['depth_top1'][1]:.2f}" in flat
    assert f"{tokens['ff4-lora1']} against {tokens['ff4']}, for a second pass" in flat
    cycle = {name: f"{h['decoding_tokens_per_cycle']:.2f}" for name, h in heads.items()}
    assert (f"CP {cycle['cp4']} tokens a cycle, HMM {cycle['hmm4']}, BTree {cycle['btree4']}, FF {cycle['ff4']} and the "
            f"FF with LoRA {cycle['ff4-lora1']}") in flat and f"{data['plain_ms_per_step']:.1f} ms plain step" in flat


def test_the_index_put_batch_table_is_the_recorded_runs():
    """results.md's paired batch runs before and after the cache write became `index_put`: every cell is the
    `batch.json` of the run the row names, and each row's command is the one shown (B = 8, 32 prompts)."""
    rows = table_rows(RESULTS, "run (report in `docs/bench/batch/index-put/`)")
    assert [cells[0].split("`")[1] for cells in rows] == ["pair3-before", "pair3-after", "pair4-after", "pair4-before"]
    for cells in rows:
        recorded = json.loads((ROOT / "docs/bench/batch/index-put" / cells[0].split("`")[1] / "batch.json").read_text())
        assert recorded["8"]["num_prompts"] == 32 and recorded["8"]["repeats"] == 3
        rates = {row["label"]: row["tok_s"]["mean"] for row in recorded["8"]["rows"]}
        hf, eager, compiled = rates["hf generate (batched)"], rates["btree8-r8/w4"], rates["btree8-r8/w4/compile"]
        plain = rates["plain (batched, static + compile)"] / rates["plain (batched)"]
        assert cells[1:] == [f"{hf:.1f}", f"{eager:.1f}", f"{compiled:.1f}", f"{compiled / hf:.2f}",
                             f"{compiled / eager:.2f}", f"{plain:.2f}"], cells


def test_the_compile_once_table_is_the_recorded_run():
    """results.md's compile-once table of SmolLM2: every row is a generation of the recorded run, in order."""
    recorded = json.loads((ROOT / "benchmarks/results/compile_once_smollm2.json").read_text())
    rows = table_rows(RESULTS, "prompt tokens")
    assert [[str(g["prompt_tokens"]), str(g["new_tokens"]), str(g["compile_seconds"]), str(g["allocations"]),
             str(g["cache_positions"])] for g in recorded["generations"]] == rows
    assert f"{recorded['cache_mib']:.0f} MiB" in RESULTS.read_text() and recorded["dtype"] == "bf16"


def test_the_per_depth_table_is_the_recorded_run():
    """results.md's per-depth acceptance of the shipped SmolLM2 head is `depth_table` of its recorded run."""
    from mtpc.training.trainer_validation import depth_table

    recorded = json.loads((ROOT / "benchmarks/results/depth_acceptance_smollm2.json").read_text())
    assert depth_table(recorded) in RESULTS.read_text()
    assert recorded["val_windows"] == 2048 and f"{recorded['val_accepted']:.2f} tokens per window" in RESULTS.read_text()
    assert depth_table(recorded) in (ROOT / "models" / "README.md").read_text()  # the head's model card


def test_the_lora_cost_table_is_the_recorded_run():
    """results.md's LoRA draft-path costs on SmolLM2: each row is a head of the recorded bench run."""
    recorded = json.loads((SMOLLM2 / "lora-cost" / "bench.json").read_text())
    plain = recorded["plain"]["phases_ms"]["backbone"]
    expected = [[str(h["lora_layers"]), f"{h['phases_ms']['backbone']:.2f}", f"{h['phases_ms']['backbone'] - plain:+.2f}",
                 f"{h['phases_ms']['backbone'] / plain:.2f}"] for h in recorded["heads"]]
    assert table_rows(RESULTS, "LoRA layers k") == expected
    assert f"({plain:.2f} ms;" in RESULTS.read_text() and recorded["config"]["dtype"] == "bf16"


def test_the_own_text_table_is_its_record():
    """results.md's "The LM's own text" table: each head's held-out scores as
    benchmarks/smollm2_own_text.sh recorded them (benchmarks/results/own_text_smollm2.json)."""
    import json

    record = json.loads((ROOT / "benchmarks" / "results" / "own_text_smollm2.json").read_text())["heads"]
    rows = table_rows(ROOT / "docs" / "results.md", "head (SmolLM2)")
    assert [r[0] for r in rows] == ["smollm2-ff4-k2048 (shipped)", "+ 60 steps of library text",
                                    "+ 60 steps of the LM's own text"]
    for cells, name in zip(rows, ("shipped", "std", "own")):
        own, sources = record[name]["nx-own"], record[name]["nx"]
        assert cells[1:] == [f"{own['val_depth_topk']['token'][0][0]:.3f}", f"{own['val_depth_topk']['token'][0][3]:.3f}",
                             f"{own['val_accepted']:.2f}", f"{sources['val_depth_topk']['token'][0][0]:.3f}",
                             f"{sources['val_accepted']:.2f}"], cells
    assert record["own"]["training"]["train_tokens"] == record["std"]["training"]["train_tokens"]  # equal tokens
    said(ROOT / "docs" / "results.md", r"moved the first drafted token from (43)% to (50)%")
    assert round(100 * record["shipped"]["nx-own"]["val_depth_topk"]["token"][0][0]) == 43
    assert round(100 * record["own"]["nx-own"]["val_depth_topk"]["token"][0][0]) == 50


def test_the_own_text_heads_decoding_table_is_the_recorded_runs():
    """docs/results.md's table of the own-text head in decoding is what benchmarks/smollm2_table.py makes of its
    three reports, every row."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("smollm2_table", ROOT / "benchmarks" / "smollm2_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made = module.table(ROOT / "docs" / "bench" / "smollm2-own", ("greedy-bf16", "t1-bf16", "chat-bf16"))
    assert made.count("smollm2-ff4-k2048-own/tree8/compile") == 3 and made in (ROOT / "docs" / "results.md").read_text()


def test_the_own_text_at_volume_table_is_its_record():
    """results.md's table of the heads trained on the LM's own text at volume is what
    benchmarks/smollm2_own_head.py makes of its record, and the token counts the prose gives are the files'."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("smollm2_own_head", ROOT / "benchmarks" / "smollm2_own_head.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = json.loads(module.RECORD.read_text())
    text = (ROOT / "docs" / "results.md").read_text()
    assert module.table(data) in text and {"shipped", "own", "cp4-hour"} <= set(data["heads"])
    flat = " ".join(text.split())
    for name in ("stdlib-own.jsonl", "stdlib-chat.jsonl"):
        f = data["files"][name]
        assert f"{f['records']:,} records, {f['completion_tokens']:,} tokens written by the LM" in flat, name
    heads = data["heads"]
    first = {(h, t): heads[h][t]["val_depth_topk"]["token"][0][0] for h in heads for t in module.TEXTS}
    tokens = {(h, t): f"{heads[h][t]['val_accepted']:.2f}" for h in heads for t in module.TEXTS}
    assert (f"from {100 * first['shipped', 'nx-own']:.0f}% to {100 * first['own', 'nx-own']:.0f}% on the LM's own "
            f"continuations and from {100 * first['shipped', 'nx-chat']:.0f}% to {100 * first['own', 'nx-chat']:.0f}% "
            f"on its answers, and the teacher-forced tokens per window from {tokens['shipped', 'nx-own']} to "
            f"{tokens['own', 'nx-own']} and from {tokens['shipped', 'nx-chat']} to {tokens['own', 'nx-chat']}") in flat
    assert (f"{first['adds-mixed', 'nx-chat']:.3f} against {first['adds-continuations', 'nx-chat']:.3f} first tokens "
            f"and {tokens['adds-mixed', 'nx-chat']} against {tokens['adds-continuations', 'nx-chat']} tokens") in flat


def test_the_smollm2_trees_table_is_the_recorded_runs():
    """docs/results.md's trees table is what benchmarks/smollm2_table.py makes of the reports
    benchmarks/smollm2_trees.sh wrote (docs/bench/smollm2-trees/*/bench.json), every row; and the float32
    record says every decoder's greedy output, trees included, was plain greedy decoding's and transformers'."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("smollm2_table", ROOT / "benchmarks" / "smollm2_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made = module.table(ROOT / "docs" / "bench" / "smollm2-trees", module.TREE_RUNS)
    assert made.count("tree8") >= 8 and made in (ROOT / "docs" / "results.md").read_text()
    fp32 = report(ROOT / "docs" / "bench" / "smollm2-trees" / "fp32-exactness")
    assert fp32["config"]["dtype"] == "fp32" and fp32["greedy_identical"] is True
    assert {r["label"] for r in fp32["heads"]} >= {"smollm2-ff4-k2048/tree8", "smollm2-ff4-k2048/tree8/lookup"}
    assert all(p["greedy_check"]["identical"] == p["greedy_check"]["compared"] > 0 for p in fp32["peers"])


def test_the_own_text_heads_card_is_its_records():
    """models/README.md's card of smollm2-ff4-k2048-own: its training line is its train_config.json, its
    held-out scores are benchmarks/results/own_head_smollm2.json's, its depth table its depth_topk.json."""
    from mtpc.training.trainer_validation import depth_table

    folder = ROOT / "models" / "heads" / "smollm2-ff4-k2048-own"
    cfg = json.loads((folder / "train_config.json").read_text())
    card = " ".join((ROOT / "models" / "README.md").read_text().split())
    assert (f"{cfg['steps']:,} steps of 8 x 512 tokens, {cfg['train_tokens']:,} tokens" in card
            and f"in {cfg['train_seconds']:,.0f} s ({cfg['tokens_per_second']:,} tok/s" in card)
    assert cfg["init_head"] == "models/heads/smollm2-ff4-k2048" and f"teacher-forced {cfg['val_accepted']:.2f} tokens" in card
    heads = json.loads((ROOT / "benchmarks" / "results" / "own_head_smollm2.json").read_text())["heads"]
    own, shipped = heads["own"], heads["shipped"]
    first = {t: f"{100 * own[t]['val_depth_topk']['token'][0][0]:.1f}%" for t in ("nx-own", "nx-chat", "nx")}
    before = {t: f"{100 * shipped[t]['val_depth_topk']['token'][0][0]:.1f}%" for t in ("nx-own", "nx-chat", "nx")}
    assert (f"on {first['nx-own']} of the windows of SmolLM2's own continuations of networkx prompts "
            f"({before['nx-own']} for the shipped head), {first['nx-chat']} of its answers to instructions about "
            f"networkx ({before['nx-chat']}) and {first['nx']} of networkx's sources ({before['nx']})") in card
    assert depth_table(json.loads((folder / "depth_topk.json").read_text())) in (ROOT / "models" / "README.md").read_text()


def test_the_cp_heads_card_is_its_records():
    """models/README.md's card of smollm2-cp4-k2048-own: its stages are its and its first stage's
    train_config.json (the first stage's as benchmarks/smollm2_own_head.py recorded it), its held-out scores
    benchmarks/results/own_head_smollm2.json's, its depth table its depth_topk.json."""
    from mtpc.training.trainer_validation import depth_table

    folder = ROOT / "models" / "heads" / "smollm2-cp4-k2048-own"
    cfg = json.loads((folder / "train_config.json").read_text())
    card = " ".join((ROOT / "models" / "README.md").read_text().split())
    heads = json.loads((ROOT / "benchmarks" / "results" / "own_head_smollm2.json").read_text())["heads"]
    first = heads["cp4-hour"]["training"]
    assert (first["circuit"], first["bindings"], first["steps"]) == ("examples/cp.pc", {"n": 4, "r": 8}, 720)
    assert f"{first['train_tokens']:,} tokens of the continuations alone" in card
    assert cfg["init_head"] == "runs/own2/cp4-hour" and cfg["features"] == "runs/own2/features-train"
    assert (f"{cfg['steps']:,} steps of 8 x 512 tokens, {cfg['train_tokens']:,} tokens in {cfg['train_seconds']:,.0f} s "
            f"({cfg['tokens_per_second']:,} tok/s" in card and f"teacher-forced {cfg['val_accepted']:.2f} tokens" in card)
    cp, ff = heads["cp4-mixed"], heads["own"]
    pct = {t: (f"{100 * cp[t]['val_depth_topk']['token'][0][0]:.1f}%", f"{100 * ff[t]['val_depth_topk']['token'][0][0]:.1f}%")
           for t in ("nx-own", "nx-chat", "nx")}
    assert (f"on {pct['nx-own'][0]} of the windows of SmolLM2's own continuations of networkx prompts "
            f"({pct['nx-own'][1]} for the FF own-text head), {pct['nx-chat'][0]} of its answers to instructions about "
            f"networkx ({pct['nx-chat'][1]}) and {pct['nx'][0]} of networkx's sources ({pct['nx'][1]})") in card
    windows = ", ".join(f"{cp[t]['val_accepted']:.2f}" for t in ("nx-own", "nx-chat"))
    assert f"tokens per window {windows} and {cp['nx']['val_accepted']:.2f}" in card
    assert depth_table(json.loads((folder / "depth_topk.json").read_text())) in (ROOT / "models" / "README.md").read_text()


def test_the_cp_heads_decoding_table_is_the_recorded_runs():
    """docs/results.md's table of the CP head in decoding is what benchmarks/smollm2_table.py makes of its three
    reports, every row; its float32 record says every greedy output was plain decoding's and transformers'."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("smollm2_table", ROOT / "benchmarks" / "smollm2_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    reports = ROOT / "docs" / "bench" / "smollm2-cp"
    made = module.table(reports, ("greedy-bf16", "t1-bf16", "chat-bf16"))
    assert made.count("smollm2-cp4-k2048-own/tree8/compile") == 3 and made in (ROOT / "docs" / "results.md").read_text()
    fp32 = report(reports / "fp32-exactness")
    assert fp32["greedy_identical"] is True and fp32["config"]["dtype"] == "fp32"
    assert all(h["greedy_check"]["identical"] == h["greedy_check"]["compared"] > 0 for h in fp32["heads"] + fp32["peers"])


def test_the_first_token_gap_table_is_the_recorded_run():
    """results.md's first-drafted-token breakdown on SmolLM2 is `first_token_gap.table` of its recorded run."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("first_token_gap", ROOT / "benchmarks" / "first_token_gap.py")
    first_token_gap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(first_token_gap)
    recorded = json.loads((ROOT / "benchmarks/results/first_token_gap_smollm2.json").read_text())
    assert first_token_gap.table(recorded) in RESULTS.read_text()
    decoded = recorded["decoded"]
    assert f"{decoded['decoding_first_token']:.3f}" == "0.372" and decoded["prompts"] == 6


def test_the_llama_cpp_table_is_the_recorded_runs():
    """docs/results.md's table against llama.cpp is what benchmarks/smollm2_table.py makes of the reports
    `benchmarks/smollm2.sh greedy-llamacpp t1-llamacpp` wrote, and the README's speeds are theirs."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("smollm2_table", ROOT / "benchmarks" / "smollm2_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    reports = ROOT / "docs" / "bench" / "smollm2-llamacpp"
    made = module.table(reports, ("greedy-llamacpp", "t1-llamacpp"))
    assert made.count("| llama.cpp |") == 2 and made in (ROOT / "docs" / "results.md").read_text()
    readme = " ".join(_readme.README.read_text().split())
    for run in ("greedy-llamacpp", "t1-llamacpp"):
        [llama] = [p for p in report(reports / run)["peers"] if p["kind"] == "llama.cpp"]
        assert f"{llama['tok_s']['mean']:.1f} tok/s" in readme and "quantized weights" in llama["detail"]
