"""Every script under benchmarks/ runs, at tiny sizes, against the library as it is now.

The scripts are not imported by the library, so nothing else notices when an API they use moves (as
`bench_draft.py` once died on a name the decoder no longer had). Each one runs here through its own
`main(argv)` (or, for `study.sh` and the memory benchmark's fresh child processes, as a program) on a
tiny byte LM and two heads that `mtpc train` trains for one step, and its output is checked."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mtpc.cli.commands import build_parser
from mtpc.cli.commands import main as mtpc

from _tiny import save_tiny_lm, write_source_corpus

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture(autouse=True)
def keep_threads():
    """The scripts set torch's thread count for their runs; give the next test back its own."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def script(name: str):
    """The benchmark script `benchmarks/<name>.py` as a module (its `main(argv)` is the command)."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A tiny LM, a corpus, FF and BTree heads trained by `mtpc train` for one step, and a bench report."""
    root = tmp_path_factory.mktemp("benchmarks")
    model = save_tiny_lm(root / "lm")
    corpus = root / "corpus"
    corpus.mkdir()
    write_source_corpus(corpus, parts=6, length=400, overlap=100)
    heads = {}
    for name, circuit, bindings in (("ff4", "ff.pc", ["-D", "n=4"]), ("btree4", "btree.pc", ["-D", "n=4", "-D", "r=2"])):
        heads[name] = str(root / name)
        assert mtpc(["train", "--model", model, "--circuit", str(ROOT / "examples" / circuit), *bindings,
                     "--data", str(corpus), "--out", heads[name], "--steps", "1", "--seq-len", "32",
                     "--batch-size", "2", "--val-sequences", "1", "--val-windows", "8", "--no-progress"]) == 0
    prompts = root / "prompts.txt"
    prompts.write_text("def main():\nimport os\n")
    bench = root / "bench"
    assert mtpc(["bench", "--model", model, "--heads", *heads.values(), "--prompts", str(prompts),
                 "--num-prompts", "1", "--repeats", "2", "--max-new-tokens", "8", "--threads", "1",
                 "--out", str(bench), "--no-progress"]) == 0
    return {"root": root, "model": model, "corpus": str(corpus), "heads": heads, "bench": str(bench / "bench.json")}


def test_bench_circuits_quick(tmp_path, capsys):
    out = tmp_path / "circuits.json"
    script("bench_circuits").main(["--quick", "--threads", "1", "--no-cirkit", "--out", str(out)])
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert set(report["structures"]) == {"FF", "CP", "HMM", "BTree"} and report["n"] == 4
    assert "BTree     log_prob      1   1" in printed and f"wrote {out}" in printed
    assert report["structures"]["BTree"]["threads"]["1"]["circuitc"]["1"]["log_prob"] > 0


def test_bench_circuit_targets_quick(tmp_path, capsys):
    out = tmp_path / "targets.json"
    script("bench_circuit_targets").main(["--quick", "--threads", "1", "--out", str(out)])
    report = json.loads(out.read_text())
    for program in ("log_prob|1", "prefix|1", "sample|1", "map|1", "log_prob|8", "prefix|8", "map_evidence|8"):
        assert report["medians_ms"][f"eager 1 thr|{program}"] > 0, program
    assert "medians of 2 interleaved rounds" in capsys.readouterr().out


def test_bench_draft_times_every_strategy_and_the_lm_step(lab, tmp_path, capsys):
    out = tmp_path / "draft.json"
    script("bench_draft").main(["--n", "4", "--r", "2", "--v", "16", "--d", "8", "--adapter-rank", "2",
                                "--factor-rank", "4", "--threads", "1", "--repeats", "2", "--model", lab["model"],
                                "--out", str(out)])
    result = json.loads(out.read_text())
    assert len(result["records"]) == 4 * 3 * 6  # structures x parameterisations x strategies
    assert all(r["draft_ms"] > 0 and r["cycle_fraction"] > 0 for r in result["records"])
    assert "threads=1, one LM step" in capsys.readouterr().out


def run_bench_cycle(lab, tmp_path, *flags):
    out = tmp_path / "cycle.json"
    script("bench_cycle").main(["--model", lab["model"], "--heads", lab["heads"]["btree4"], "--threads", "1",
                                "--repeats", "3", "--out", str(out), *flags])
    records = json.loads(out.read_text())["records"]
    assert all(r[k] > 0 for r in records for k in ("draft_ms", "verify_ms", "accept_ms", "cycle_ms"))
    return {(r["mode"], r["compiled"]) for r in records}


def test_bench_cycle_times_every_step(lab, tmp_path, capsys):
    assert run_bench_cycle(lab, tmp_path, "--eager-only") == {("greedy", False), ("sample", False)}
    assert "threads=1, median ms over 3 calls" in capsys.readouterr().out
    records = json.loads((tmp_path / "cycle.json").read_text())["records"]
    for r in records:  # eager steps count their ops; the cycle is the three steps, in the decoder's two
        assert all(r[f"{step}_ops"] > 0 for step in ("draft", "verify", "accept"))
        steps = r["draft_ops"] + r["verify_ops"] + r["accept_ops"]
        assert steps <= r["cycle_ops"] <= steps + 12, r  # plus the slices and the packet the host reads
    greedy, sample = sorted(records, key=lambda r: r["mode"])
    assert sample["draft_ops"] > greedy["draft_ops"]  # a sampled draft also builds its proposal rows


def test_bench_cycle_cold_times_every_step_after_an_eviction(lab, tmp_path, capsys):
    """`--cold` times each step again after an untimed cache eviction: every record gets a cold time per
    step, the JSON says how much the eviction copied, and the table says what it is."""
    run_bench_cycle(lab, tmp_path, "--eager-only", "--cold", "--evict-mib", "4")
    result = json.loads((tmp_path / "cycle.json").read_text())
    assert result["evict_mib"] == 4
    assert all(r[f"{step}_cold_ms"] > 0 for r in result["records"] for step in ("draft", "verify", "accept", "cycle"))
    assert "right after evicting the caches (4 MiB copied" in capsys.readouterr().out


def test_profile_generate_lists_each_decoders_top_ops_per_cycle(lab, tmp_path, capsys):
    """Both decoders are profiled over a whole generation: their top ops, with time per cycle (token),
    calls and shares that add up to at most one, and the JSON says which prompt."""
    prompt = tmp_path / "prompt.py"
    prompt.write_text("def main():\n    return 1\n" * 4)
    out = tmp_path / "profile.json"
    result = script("profile_generate").main(["--model", lab["model"], "--head", lab["heads"]["btree4"],
                                              "--prompt-file", str(prompt), "--offset", "3", "--prompt-bytes", "20",
                                              "--max-new-tokens", "6", "--top", "5", "--out", str(out)])
    assert json.loads(out.read_text())["prompt"] == "prompt.py[3:23]"
    for name in ("speculative", "plain"):
        rows = result[name]
        assert len(rows) == 5 and all(r["ms_per_cycle"] > 0 and r["calls_per_cycle"] > 0 for r in rows)
        assert rows[0]["ms_per_cycle"] >= rows[-1]["ms_per_cycle"] and sum(r["share"] for r in rows) <= 1 + 1e-9
    assert result["plain_cycles"] == 6 and 1 <= result["speculative_cycles"] <= 6
    printed = capsys.readouterr().out
    assert "speculative: " in printed and "plain: 6 tokens, sampling at T = 1, threads=1" in printed


def test_profile_generate_refuses_an_empty_prompt(lab, tmp_path):
    prompt = tmp_path / "prompt.py"
    prompt.write_text("x = 1\n")
    with pytest.raises(SystemExit):
        script("profile_generate").main(["--model", lab["model"], "--head", lab["heads"]["btree4"],
                                         "--prompt-file", str(prompt), "--offset", "100"])


def test_write_results_makes_the_folder_and_writes_nothing_without_a_path(tmp_path, capsys):
    write_results = script("results_file").write_results
    out = tmp_path / "new" / "folder" / "r.json"
    write_results({"records": [1, 2]}, str(out))
    assert json.loads(out.read_text()) == {"records": [1, 2]} and f"wrote {out}" in capsys.readouterr().out
    write_results({"records": []}, None)
    assert capsys.readouterr().out == "" and len(list(tmp_path.rglob("*.json"))) == 1


def test_bench_cache_times_the_verify_call_per_touched_size(lab, tmp_path, capsys):
    """One record per width and touched size, each timed; the table names the LM's weight size."""
    out = tmp_path / "cache.json"
    script("bench_cache").main(["--model", lab["model"], "--eager-only", "--repeats", "2", "--mib", "0", "1",
                                "--out", str(out)])
    result = json.loads(out.read_text())
    assert {(r["width"], r["touched_mib"]) for r in result["records"]} == {(1, 0), (1, 1), (8, 0), (8, 1)}
    assert all(r["ms"] > 0 and not r["compiled"] for r in result["records"]) and result["weights_mib"] > 0
    assert "with X MiB copied between calls, threads=1" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_cycle_compiled(lab, tmp_path):
    assert run_bench_cycle(lab, tmp_path) == {(m, c) for m in ("greedy", "sample") for c in (False, True)}


@pytest.mark.slow  # compiles a cycle step
def test_bench_guards_times_both_ways_and_writes_json(lab, tmp_path, capsys):
    out = tmp_path / "guards.json"
    script("bench_guards").main(["--model", lab["model"], "--heads", lab["heads"]["btree4"], "--rounds", "2",
                                 "--calls", "3", "--out", str(out)])
    [record] = json.loads(out.read_text())["records"]
    assert record["per_call_ms"] > 0 and record["per_generation_ms"] > 0 and len(record["per_call"]) == 2
    assert record["ratio_min"] <= record["ratio"] <= record["ratio_max"]
    assert re.search(r"^btree4 +[\d.]+ +[\d.]+ +[\d.]+", capsys.readouterr().out, re.M)


def test_bench_guards_refuses_no_rounds():
    with pytest.raises(SystemExit) as refused:
        script("bench_guards").main(["--rounds", "0"])
    assert refused.value.code == 2


@pytest.mark.slow
def test_bench_startup_times_generate_with_and_without_compile(lab, tmp_path, capsys):
    out = tmp_path / "startup.json"
    script("bench_startup").main(["--model", lab["model"], "--head", lab["heads"]["btree4"], "--max-new-tokens", "8",
                                  "--repeats", "1", "--compare", str(ROOT), "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["checkout"] for r in rows] == ["old", "this"]
    for row in rows:
        assert row["eager_s"] > 0 and row["compile_s"] > 0 and len(row["eager_all"]) == len(row["compile_all"]) == 1
        assert row["extra_s"] == row["compile_s"] - row["eager_s"]
    assert re.search(r"^this +[\d.]+ +[\d.]+ +-?[\d.]+$", capsys.readouterr().out, re.M)


def test_bench_startup_refuses_a_folder_without_mtpc(tmp_path):
    with pytest.raises(SystemExit) as refused:
        script("bench_startup").main(["--compare", str(tmp_path)])
    assert refused.value.code == 2


def test_bench_batch_runs_every_batch_size_and_draws_the_plot(lab, tmp_path, capsys):
    out = tmp_path / "batch"
    reports = script("bench_batch").main(["--model", lab["model"], "--heads", lab["heads"]["ff4"], "--prompts",
                                          str(lab["root"] / "prompts.txt"), "--batch-sizes", "1", "2",
                                          "--num-prompts", "2", "--repeats", "1", "--max-new-tokens", "4",
                                          "--window", "4", "2", "--no-progress", "--out", str(out)])
    assert sorted(reports) == [1, 2] and all(r["batch_size"] == B for B, r in reports.items())
    assert [row["label"] for row in reports[2]["rows"]] == ["plain (batched)", "hf generate (batched)", "ff4/w4",
                                                            "ff4/w2"]
    assert json.loads((out / "batch.json").read_text())["2"]["mode"] == "sample"
    assert (out / "speedup.png").stat().st_size > 0
    assert "ff4/w2 x hf generate (batched)" in (out / "batch.md").read_text()
    assert f"wrote {out}/batch.json" in capsys.readouterr().out


def test_layered_draft_equals_the_draft_program():
    """The script's `conditional/layered` baseline is the same draft, computed the old way."""
    from circuitc import builders
    from circuitc.runtime.draft import DraftProgram
    from mtpc import MTPHead

    layered = script("bench_draft").layered_conditional
    torch.manual_seed(0)
    head = MTPHead(builders.btree_graph(4, 3, 16), 8, sum_init_std=0.5).eval()
    with torch.no_grad():
        theta = head(torch.randn(8))[None]
    program = DraftProgram(head.graph, head.circ.param_layout)
    assert torch.equal(layered(head.circ, theta), program.greedy(theta[0]))


@pytest.mark.slow  # 12 s: a subprocess that imports torch and measures both losses' peak memory
def test_bench_loss_memory_imports_first_and_writes_no_file_by_default(tmp_path):
    recorded = BENCHMARKS / "results" / "loss_memory.json"
    before = recorded.read_bytes()
    run = subprocess.run([sys.executable, str(BENCHMARKS / "bench_loss_memory.py"), "--n", "4", "--r", "2",
                          "--v", "16", "--d", "8", "--tokens", "32", "--batch", "2", "--device", "cpu"],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    rows = {line.split()[0]: line.split() for line in run.stdout.splitlines()
            if re.match(r"(fused|naive) +[0-9]", line)}
    assert set(rows) == {"fused", "naive"} and rows["fused"][3] == rows["naive"][3]  # the same loss
    assert "warning" not in run.stdout  # no module was first imported inside a measured pass
    assert "wrote" not in run.stdout and not re.search(r"(^|\s)/\w", run.stdout)  # no file, no absolute path
    assert recorded.read_bytes() == before and list(tmp_path.iterdir()) == []


def test_heldout_kl(lab, capsys):
    script("heldout_kl").main(["--model", lab["model"], "--heads", *lab["heads"].values(), "--data", lab["corpus"],
                               "--sequences", "2", "--seq-len", "32", "--val-fraction", "0.5"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("head") and "KL to LM" in lines[0]
    assert [line.split()[0] for line in lines[1:]] == list(lab["heads"].values())
    assert all(float(v) >= -1e-4 for line in lines[1:] for v in line.split()[1:])  # KLs and NLLs


def test_study_tables_and_figure(lab, tmp_path, capsys):
    script("study_tables").main([lab["bench"], "--heads"])
    printed = capsys.readouterr().out
    assert "| ff4 | ff | 4 | n=4 |" in printed and "| plain | 1 |" in printed and "| btree4 |" in printed
    figure = tmp_path / "tradeoff.png"
    script("study_figure").main([lab["bench"], "--out", str(figure)])
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def study(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(BENCHMARKS / "study.sh"), *args], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, **env))


def test_study_sh_help_and_bad_stage():
    shown = study("--help")
    assert shown.returncode == 0 and "benchmarks/study.sh --dry-run [STAGE]" in shown.stdout
    bad = study("--dry-run", "nonsense")
    assert bad.returncode == 2 and "usage:" in bad.stderr


def test_study_sh_dry_run_after_the_stage_and_unknown_options(tmp_path):
    """`--dry-run` after the stage still only prints (it once started the stage's training for real); a
    mistyped option is refused before anything runs."""
    runs = tmp_path / "runs"
    after = study("levers", "--dry-run", RUNS=str(runs), MODEL="runs/lm")
    assert after.returncode == 0, after.stderr
    assert after.stdout == study("--dry-run", "levers", RUNS=str(runs), MODEL="runs/lm").stdout
    assert "distill-data" in after.stdout and not runs.exists()
    typo = study("levers", "--dryrun", RUNS=str(runs), MODEL="runs/lm")
    assert typo.returncode == 2 and "unknown option --dryrun" in typo.stderr and not runs.exists()


def test_study_sh_dry_run_commands_parse(tmp_path):
    """Every command the whole study would run is printed, and each `mtpc` one parses with today's
    flags (parsing runs nothing); the scripts it calls exist. Nothing is written."""
    run = study("--dry-run", "all", RUNS=str(tmp_path / "runs"))
    assert run.returncode == 0, run.stderr
    commands = [shlex.split(line) for line in run.stdout.splitlines()]
    mtpc_commands = [c[3:] for c in commands if c[:3] == ["python", "-m", "mtpc.cli"]]
    counts = {name: sum(c[0] == name for c in mtpc_commands) for name in {c[0] for c in mtpc_commands}}
    assert counts == {"tiny-lm": 3, "distill-data": 1, "train": 7, "bench": 3}
    parser = build_parser()
    for argv in mtpc_commands:
        parser.parse_args(argv)  # an unknown or malformed flag raises InputError
    heads = [argv[argv.index("--out") + 1] for argv in mtpc_commands if argv[0] == "train"]
    benched = {h for argv in mtpc_commands if argv[0] == "bench"
               for h in itertools.takewhile(lambda a: not a.startswith("--"), argv[argv.index("--heads") + 1:])}
    assert len(set(heads)) == 7 and benched == set(heads)  # every benched head is one the study trains
    scripts = {c[1] for c in commands if c[0] == "python" and c[1].startswith("benchmarks/")}
    assert scripts == {"benchmarks/study_tables.py", "benchmarks/study_figure.py"}
    assert all((ROOT / s).is_file() for s in scripts)
    assert list(tmp_path.iterdir()) == []


def test_study_sh_levers_and_long_heads_dry_run(tmp_path):
    """The levers stage trains four heads on the same on-policy data (two seeds' halves) and budget, the
    BTree once plain and once with each lever; `long` extends copies of the FF lever run and of the
    $LONG_BTREE one to 60 minutes each, with the arguments those runs were trained with."""
    runs = tmp_path / "runs"
    levers = study("--dry-run", "levers", RUNS=str(runs), MODEL="runs/lm", LEVER_MINUTES="20")
    assert levers.returncode == 0, levers.stderr
    commands = [shlex.split(line)[3:] for line in levers.stdout.splitlines() if "mtpc.cli" in line]
    parser = build_parser()
    for argv in commands:
        parser.parse_args(argv)
    distills = [c for c in commands if c[0] == "distill-data"]
    assert sorted(c[c.index("--seed") + 1] for c in distills) == ["0", "1"]
    trains = {c[c.index("--out") + 1].rsplit("/", 1)[1]: c for c in commands if c[0] == "train"}
    assert sorted(trains) == ["lever-btree8-r16-factorised", "lever-btree8-r8", "lever-btree8-r8-lora1", "lever-ff8"]
    assert {c[c.index("--minutes") + 1] for c in trains.values()} == {"20"}
    assert {c[c.index("--data") + 1] for c in trains.values()} == {f"{runs}/onpolicy-*.jsonl"}
    base = trains["lever-btree8-r8"]
    assert trains["lever-btree8-r8-lora1"] == [a.replace("r8", "r8-lora1") if a.endswith("r8") else a for a in base] + [
        "--lora-layers", "1"]
    long = study("--dry-run", "long", RUNS=str(runs), MODEL="runs/lm", LONG_BTREE="lever-btree8-r8-lora1")
    lines = [shlex.split(line) for line in long.stdout.splitlines()]
    copies = [line[2:] for line in lines if line[:2] == ["cp", "-r"]]
    assert copies == [[f"{runs}/heads/lever-ff8", f"{runs}/heads/long-ff8"],
                      [f"{runs}/heads/lever-btree8-r8-lora1", f"{runs}/heads/long-btree8"]]
    extended = [line[3:] for line in lines if "mtpc.cli" in line]
    assert [c[c.index("--minutes") + 1] for c in extended] == ["60", "60"]
    # each resumes its copy: the lever's own arguments (a checkpoint refuses other settings) but --out and --minutes
    same = [trains["lever-ff8"], trains["lever-btree8-r8-lora1"]]
    for resumed, lever in zip(extended, same):
        drop = {"--out", "--minutes"}
        strip = lambda argv: [a for i, a in enumerate(argv) if a not in drop and argv[i - 1] not in drop]  # noqa: E731
        assert strip(resumed) == strip(lever)
    refused = study("--dry-run", "long", RUNS=str(runs), MODEL="runs/lm", LONG_BTREE="--lora-layers 1")
    assert refused.returncode == 2 and "is no lever run" in refused.stderr and "mtpc.cli" not in refused.stdout
    assert not runs.exists()


def test_study_tables_compares_lm_runs_in_their_first_seconds(tmp_path, capsys):
    """`--lm`: each run's held-out curve up to --until, from its log, weights from its summary."""
    for name, params, rows in (("small", 1_000_000, [(10, 100.0, 4.0), (20, 200.0, 3.5), (30, 700.0, 3.0)]),
                               ("large", 3_000_000, [(5, 110.0, 4.5), (10, 220.0, 4.0)])):
        run = tmp_path / name
        run.mkdir()
        (run / "tiny_lm.json").write_text(json.dumps({"parameters": params}))
        log = [{"step": 0, "tokens": 0, "val_bpb": 8.0}]
        log += [{"step": s, "tokens": s * 4096, "time_s": t, "val_bpb": v} for s, t, v in rows]
        (run / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    script("study_tables").main(["--lm", str(tmp_path / "small"), str(tmp_path / "large"), "--until", "600"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| LM | weights | steps in 600 s |")
    assert lines[2] == "| small | 1.00M | 20 | 410 | 4.000 (1.7 min), 3.500 (3.3 min) |"  # step 30 is past 600 s
    assert lines[3] == "| large | 3.00M | 10 | 186 | 4.500 (1.8 min), 4.000 (3.7 min) |"


def test_bench_train_step_times_the_trainers_step_and_its_phases(tmp_path, capsys):
    out = tmp_path / "train_step.json"
    script("bench_train_step").main(["--tiny", "--configs", "ff8", "btree8-r8-shared", "--steps", "1",
                                     "--warmup", "0", "--out", str(out)])
    printed = capsys.readouterr().out
    rows = {(r["config"], r["loss"]): r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {(c, loss) for c in ("ff8", "btree8-r8-shared") for loss in ("nll", "kl")}
    for (config, loss), row in rows.items():
        phases = row["phases_s"]
        assert row["tokens_per_step"] == 64 and row["tokens_per_s"] > 0 and row["step_s"] > 0
        assert phases["lm"]["forward"] > 0 and phases["backward"]["backward"] > 0
        assert phases["head"]["forward"] > 0 and phases["circuit"]["forward"] > 0
        assert phases["optimizer"]["forward"] > 0 and phases["loss"]["forward"] >= phases["circuit"]["forward"]
        assert (phases["teacher"]["forward"] > 0) == (loss == "kl")
        assert re.search(rf"^{config} +{loss} +64 ", printed, re.M)
    assert f"wrote {out}" in printed


@pytest.mark.slow
def test_bench_train_step_compare_interleaves_two_checkouts(tmp_path, capsys):
    out = tmp_path / "compare.json"
    script("bench_train_step").main(["--tiny", "--configs", "ff8", "--losses", "nll", "--warmup", "0",
                                     "--compare", str(ROOT), "--repeats", "2", "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert len(row["old_all"]) == len(row["new_all"]) == 2 and row["speedup"] > 0
    assert re.search(r"^ff8 +nll .*x$", capsys.readouterr().out, re.M)


def test_heldout_bpb_scores_each_rules_held_out_part(lab, tmp_path, capsys):
    """The current rule's held-out part, the previous rule's and their overlap, scored like tiny-lm does;
    the split is the one `mtpc.training.data` makes (so the script cannot drift from training)."""
    from mtpc.lm.tokenizer import ByteTokenizer
    from mtpc.training.data import load_documents, split_documents

    out = tmp_path / "bpb.json"
    results = script("heldout_bpb").main(["--model", lab["model"], "--corpus", lab["corpus"], "--old-rule",
                                          "--fraction", "0.4", "--context", "32", "--tokens", "256",
                                          "--out", str(out)])
    (result,) = results
    docs, _ = load_documents(lab["corpus"], ByteTokenizer.load(lab["model"]))
    assert result["documents"] == len(split_documents(docs, 0.4)[1])
    both, old = result["held out by both rules"], result["previous rule (absolute path)"]
    assert both["documents"] <= min(result["documents"], old["documents"]) and old["documents"] >= 1
    assert 0 < result["bits_per_byte"] < 20 and result["tokens"] == 256
    assert json.loads(out.read_text())["results"] == results
    assert "held out (relative-path rule)" in capsys.readouterr().out


def test_subword_sh_dry_run_commands_parse(tmp_path):
    """benchmarks/subword.sh (the shipped subword pair): every stage's `mtpc` command parses with today's
    flags, distillation, head and bench read the shipped LM, the bench the shipped head; nothing is written."""
    def subword(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(BENCHMARKS / "subword.sh"), *args], capture_output=True, text=True,
                              timeout=60, env=dict(os.environ, RUNS=str(tmp_path / "runs")))

    assert "benchmarks/subword.sh --dry-run [STAGE]" in subword("--help").stdout
    assert subword("--dry-run", "nonsense").returncode == 2
    commands = []
    for stage in ("all", "bench"):
        run = subword("--dry-run", stage)
        assert run.returncode == 0, run.stderr
        commands += [shlex.split(line) for line in run.stdout.splitlines()]
    mtpc_commands = [c[3:] for c in commands if c[:3] == ["python", "-m", "mtpc.cli"]]
    assert [argv[0] for argv in mtpc_commands] == ["tiny-lm", "distill-data", "train", "train", "train", "bench"]
    parser = build_parser()
    for argv in mtpc_commands:
        parser.parse_args(argv)  # an unknown or malformed flag raises InputError
    models = {argv[argv.index("--model") + 1] for argv in mtpc_commands[1:]}
    assert models == {"models/subword-lm"} and (ROOT / "models" / "subword-lm").is_dir()
    first, mlp = mtpc_commands[3], mtpc_commands[4]  # the later stages continue the head before them
    assert first[first.index("--init-head") + 1] == mtpc_commands[2][mtpc_commands[2].index("--out") + 1]
    assert mlp[mlp.index("--init-head") + 1] == first[first.index("--out") + 1] and "--first-token-mlp=384" in mlp
    shipped = mtpc_commands[5][mtpc_commands[5].index("--heads") + 1]
    assert shipped == "models/heads/subword-btree4-r4-tied" and (ROOT / shipped).is_dir()
    assert list(tmp_path.iterdir()) == []


def test_recipe_sh_run_prints_or_runs():
    """benchmarks/recipe.sh's `run`, which study.sh and subword.sh source: one shell-quoted line, or the run."""
    script = f'source {BENCHMARKS / "recipe.sh"}; DRY_RUN=1 run echo "a b"; DRY_RUN=0 run echo "a b"'
    shown = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert shown.stdout.splitlines() == ["echo a\\ b", "a b"]


def test_bench_features_times_training_from_the_store_and_on_the_live_lm(lab, tmp_path, capsys):
    store = tmp_path / "features"
    assert mtpc(["features", "--model", lab["model"], "--data", lab["corpus"], "--out", str(store), "--seq-len",
                 "32", "--val-sequences", "2", "--no-progress"]) == 0
    out = tmp_path / "features.json"
    script("bench_features").main(["--model", lab["model"], "--features", str(store), "--draft-vocab", "32",
                                   "--heads", "ff4", "--batch-size", "2", "--steps", "1", "--warmup", "0",
                                   "--out", str(out)])
    printed = capsys.readouterr().out
    assert "features tok/s" in printed and "ff4" in printed
    [row] = json.loads(out.read_text())["rows"]
    assert row["head"] == "ff4" and row["tokens_per_step"] == 64 and row["speedup"] > 0
    assert set(row["tokens_per_second"]) == {"features", "live LM"}


def test_smollm2_heads_sh_dry_run_commands_parse():
    """benchmarks/smollm2_heads.sh --dry-run prints one `mtpc train` per head of the RQ2 table, each parsing
    with today's flags and each writing the run folder benchmarks/smollm2_heads.py collects."""
    run = subprocess.run(["bash", str(BENCHMARKS / "smollm2_heads.sh"), "--dry-run"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    commands = [shlex.split(line) for line in run.stdout.splitlines()]
    assert all(c[:2] == ["mtpc", "train"] for c in commands)
    parser = build_parser()
    for argv in commands:
        parser.parse_args(argv[1:])
    module = script("smollm2_heads")
    assert [Path(c[c.index("--out") + 1]).name for c in commands] == list(module.RUNS)
    bad = subprocess.run(["bash", str(BENCHMARKS / "smollm2_heads.sh"), "--now"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


@pytest.mark.parametrize("name, tools", [("smollm2_trees.sh", {"bench"}),
                                         ("smollm2_own_text.sh", {"distill-data", "features", "train"}),
                                         ("smollm2_rq2.sh", {"features", "train", "bench"}),
                                         ("smollm2_own_head.sh", {"distill-data", "features", "train"}),
                                         ("smollm2_hour.sh", {"features", "train"}),
                                         ("smollm2_chat_adds.sh", {"train"})])
def test_smollm2_scripts_dry_run_commands_parse(name, tools):
    """benchmarks/smollm2_*.sh --dry-run print their commands: every `mtpc` one parses with today's flags, every
    Python one names a script that exists, and a wrong argument is refused."""
    run = subprocess.run(["bash", str(BENCHMARKS / name), "--dry-run"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    commands = [shlex.split(line) for line in run.stdout.splitlines()]
    parser = build_parser()
    for argv in commands:
        if argv[0] == "mtpc":
            parser.parse_args(argv[1:])
        else:
            assert argv[0] == "python" and (ROOT / argv[1]).is_file(), argv
    assert {argv[1] for argv in commands if argv[0] == "mtpc"} == tools
    trainings = [a for a in commands if a[1:2] == ["train"]]
    if name == "smollm2_trees.sh":
        assert all("--tree" in argv for argv in commands) and len(commands) == 3  # greedy, t1, chat
    elif name == "smollm2_own_text.sh":
        assert len(trainings) == 2  # the same steps on each text
    elif name == "smollm2_rq2.sh":  # every head of the table, the same steps, the same text
        assert [Path(a[a.index("--out") + 1]).name for a in trainings] == list(script("smollm2_rq2").RUNS)
        assert {a[1] for a in commands if a[0] == "mtpc"} == {"features", "train", "bench"}
        assert len({a[a.index("--steps") + 1] for a in trainings}) == 1
    elif name == "smollm2_chat_adds.sh":  # the same steps on each store
        assert len(trainings) == 2 and len({a[a.index("--steps") + 1] for a in trainings}) == 1
    elif name == "smollm2_hour.sh":
        assert len(trainings) == 3 and "examples/cp.pc" in trainings[0]
        for earlier, later in zip(trainings, trainings[1:]):  # each stage starts from the one before
            assert later[later.index("--init-head") + 1] == earlier[earlier.index("--out") + 1]
    else:
        assert len(trainings) == 1 and "--chat" in commands[1] and "--init-head" in trainings[0]
    bad = subprocess.run(["bash", str(BENCHMARKS / name), "--now"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip() and not bad.stdout  # refused before running anything


def test_smollm2_common_sh_preamble_honours_dry_run_and_refuses_a_wrong_argument(tmp_path):
    """benchmarks/smollm2_common.sh, sourced by a script in benchmarks/: `run` and `logged` print under --dry-run
    and run (logging) without it, G names the wheel's GGUF file, NX networkx's folder, one thread per job."""
    probe = BENCHMARKS / f"_probe_{os.getpid()}.sh"  # the preamble cds to its caller's parent: it must live here
    log = tmp_path / "log.txt"
    probe.write_text('source "$(dirname "$0")/smollm2_common.sh"\n'
                     f'run echo ran; logged {log} echo logged\n'
                     'echo "G=$G"; echo "NX=$NX"; echo "threads=$OMP_NUM_THREADS"; pwd\n')
    try:
        dry = subprocess.run(["bash", str(probe), "--dry-run"], capture_output=True, text=True, timeout=120)
        logged_dry = log.exists()
        real = subprocess.run(["bash", str(probe)], capture_output=True, text=True, timeout=120)
        bad = subprocess.run(["bash", str(probe), "--now"], capture_output=True, text=True, timeout=120)
    finally:
        probe.unlink()
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[:2] == ["echo ran", "echo logged"] and not logged_dry
    assert lines[2].startswith("G=") and lines[2].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert lines[3].startswith("NX=") and lines[3].endswith("networkx") and lines[4] == "threads=1"
    assert lines[5] == str(ROOT)
    assert real.returncode == 0 and real.stdout.splitlines()[0] == "ran" and log.read_text() == "logged\n"
    assert bad.returncode == 2 and "usage" in bad.stderr and not bad.stdout


def test_smollm2_rq2_collects_training_scores_and_bench_rows(tmp_path, monkeypatch):
    module = script("smollm2_rq2")
    monkeypatch.setattr(module, "RECORD", tmp_path / "record.json")
    runs = tmp_path / "rq2"
    (runs / "btree4").mkdir(parents=True)
    (runs / "cp4").mkdir()  # trained, not scored: left out
    (runs / "btree4" / "head.safetensors").write_bytes(b"\0" * 1_500_000)
    for name in ("btree4", "cp4"):
        (runs / name / "train_config.json").write_text(json.dumps({
            "bindings": {"n": 4}, "steps": 64, "train_tokens": 262144, "train_seconds": 240.0, "tokens_per_second": 1092}))
    topk = {"token": [[0.4, 0.5, 0.6, 0.7], [0.2, 0.3, 0.4, 0.5], [0.1, 0.2, 0.3, 0.4]],
            "path": [[0.4, 0.5, 0.6, 0.7], [0.1, 0.2, 0.3, 0.4], [0.01, 0.05, 0.1, 0.2]]}
    (runs / "score-btree4-nx-own.json").write_text(json.dumps({"val_windows": 2048, "val_accepted": 1.5678,
                                                              "val_depth_topk": topk}))
    data = module.collect(runs, runs / "bench" / "bench.json")
    assert [h["run"] for h in data["heads"]] == ["btree4"] and "plain_ms_per_step" not in data
    assert module.table(data).splitlines()[2] == ("| BTree | 4 |  | 262,144 | 1,092 | 4 | 1.5 | 0.40 / 0.20 / 0.10 | "
                                                 "0.70 / 0.50 / 0.40 | 1.57 |")
    (runs / "bench").mkdir()
    (runs / "bench" / "bench.json").write_text(json.dumps({
        "plain": {"mu_lat": {"mean": 0.032}},
        "heads": [{"head": "runs/rq2/btree4", "compiled": False, "lookup": False, "mu_acc": {"mean": 1.4567},
                   "mu_lat": {"mean": 0.0381}, "tok_s": {"mean": 38.2}}]}))
    data = module.collect(runs, runs / "bench" / "bench.json")
    assert data["plain_ms_per_step"] == 32.0 and json.loads((tmp_path / "record.json").read_text()) == data
    assert module.table(data).splitlines()[2].endswith("| 1.57 | 1.46 | 38.1 |")


def test_smollm2_heads_collects_each_runs_record(tmp_path, monkeypatch):
    module = script("smollm2_heads")
    monkeypatch.setattr(module, "RECORD", tmp_path / "record.json")
    folder = tmp_path / "runs" / "h-cp4"
    folder.mkdir(parents=True)
    (folder / "head.safetensors").write_bytes(b"\0" * 2_500_000)
    (folder / "train_config.json").write_text(json.dumps({
        "draft_vocab": 2048, "minutes": 7.0, "steps": 62, "train_tokens": 253952, "tokens_per_second": 604,
        "val_loss": 7.66381, "val_accepted": 1.53218, "val_accept_hist": [0, 600, 300, 74, 50],
        "draft_vocabulary": {"val_coverage": 0.934}, "dtype": "bf16", "loss": "kl", "first_token_mlp": 1024}))
    data = module.collect(tmp_path / "runs")
    assert [h["run"] for h in data["heads"]] == ["h-cp4"]  # the runs not made are left out
    assert json.loads((tmp_path / "record.json").read_text()) == data
    assert module.table(data).splitlines()[2] == "| CP | 4 | 8 | 2,048 | 7 | 253,952 | 604 | 2.5 | 7.66 | 1.53 |"


@pytest.mark.slow  # compiles a cycle step
def test_bench_compile_once_compiles_for_the_first_generation_only(lab, tmp_path, capsys):
    out = tmp_path / "once.json"
    rows = script("bench_compile_once").main(["--model", lab["model"], "--head", lab["heads"]["btree4"],
                                              "--max-context", "64", "--generations", "8:8", "20:24", "12:40",
                                              "--out", str(out)])  # the tiny LM's whole context: 64 positions
    assert [r["allocations"] for r in rows] == [1, 1, 1] and rows[0]["compile_seconds"] > 0
    assert all(r["compile_seconds"] < 0.5 for r in rows[1:]) and rows[2]["cache_positions"] == 65
    assert json.loads(out.read_text())["generations"] == rows


def test_depth_acceptance_scores_a_head_on_a_stores_held_out_split(lab, tmp_path, capsys):
    store = tmp_path / "store"
    assert mtpc(["features", "--model", lab["model"], "--data", lab["corpus"], "--out", str(store), "--seq-len", "32",
                 "--max-tokens", "32", "--val-sequences", "4", "--no-progress"]) == 0
    out = tmp_path / "depth.json"
    record = script("depth_acceptance").main(["--model", lab["model"], "--head", lab["heads"]["btree4"], "--features",
                                              str(store), "--windows", "16", "--out", str(out)])
    table = record["val_depth_topk"]
    assert table["k"] == [1, 2, 4, 8] and table["windows"] == record["val_windows"] > 0
    assert json.loads(out.read_text()) == record and "| depth | top-1 |" in capsys.readouterr().out


def test_smollm2_own_head_collects_the_files_and_each_scored_head(tmp_path, monkeypatch):
    module = script("smollm2_own_head")
    monkeypatch.setattr(module, "RECORD", tmp_path / "record.json")
    runs = tmp_path / "own2"
    runs.mkdir()
    (runs / "stdlib-chat.jsonl").write_text("\n".join(json.dumps({"prompt_ids": [1] * p, "completion_ids": [2] * c})
                                                      for p, c in ((30, 100), (40, 7))) + "\n")
    topk = {"token": [[0.45, 0.5, 0.6, 0.7]], "path": [[0.45, 0.5, 0.6, 0.7]]}
    for name, accepted in (("shipped", 1.5), ("cp4-hour", 1.875)):
        for text in module.TEXTS:
            (runs / f"score-{name}-{text}.json").write_text(json.dumps({
                "val_accepted": accepted, "val_windows": 2048, "val_depth_topk": topk}))
    (runs / "score-own-nx.json").write_text("{}")  # not scored on every text: left out
    (runs / "cp4-hour").mkdir()
    (runs / "cp4-hour" / "train_config.json").write_text(json.dumps({
        "features": "runs/own2/features-continuations", "circuit": "examples/cp.pc", "bindings": {"n": 4, "r": 8},
        "steps": 1000, "train_tokens": 4096000, "train_seconds": 3600.0, "tokens_per_second": 1137, "lr": 0.002,
        "val_accepted": 1.9}))
    data = module.collect(runs)
    assert data["files"] == {"stdlib-chat.jsonl": {"records": 2, "prompt_tokens": 70, "completion_tokens": 107}}
    assert list(data["heads"]) == ["shipped", "cp4-hour"] and data["heads"]["cp4-hour"]["training"]["minutes"] == 60
    assert json.loads((tmp_path / "record.json").read_text()) == data
    assert module.table(data).splitlines()[3] == ("| CP r = 8 from scratch, 60 min of the continuations |"
                                                 " 0.450 | 1.88 | 0.450 | 1.88 | 0.450 | 1.88 |")


def test_first_token_gap_splits_the_first_drafted_token_by_vocabulary(lab, tmp_path, capsys):
    head, store = tmp_path / "tied", tmp_path / "store"
    assert mtpc(["train", "--model", lab["model"], "--circuit", str(ROOT / "examples" / "cp.pc"), "-D", "n=4",
                 "-D", "r=2", "--parameterisation", "tied", "--draft-vocab", "24", "--first-token-mlp", "8",
                 "--data", lab["corpus"], "--out", str(head), "--steps", "1", "--seq-len", "32", "--batch-size", "2",
                 "--val-sequences", "1", "--val-windows", "8", "--no-progress"]) == 0
    assert mtpc(["features", "--model", lab["model"], "--data", lab["corpus"], "--out", str(store), "--seq-len", "32",
                 "--max-tokens", "32", "--val-sequences", "4", "--no-progress"]) == 0
    out = tmp_path / "gap.json"
    record = script("first_token_gap").main(["--model", lab["model"], "--head", str(head), "--bench", lab["bench"],
                                             "--features", str(store), "--out", str(out)])
    decoded, sources = record["decoded"], record["sources"]
    bench = json.loads(Path(lab["bench"]).read_text())
    prompts = [p for group in bench["prompt_ids"] for p in group]
    # x_0 is each new token but the last (the token after it is the target)
    assert decoded["every_position"]["positions"] == len(prompts) * (bench["config"]["max_new_tokens"] - 1)
    inside, wider = decoded["x0_and_x1_in_vocabulary"], decoded["x0_and_x1_in_widened_vocabulary"]
    assert inside["positions"] == wider["positions"] and inside["hits"] <= wider["hits"]  # added states only add
    assert decoded["every_position"]["hits"] <= decoded["x0_and_x1_in_vocabulary_only"]["hits"] + \
        decoded["x0_outside_vocabulary"]["hits"]
    # the windows depth_acceptance scores are a subset of every window
    assert 0 < sources["windows_scored_by_depth_acceptance"]["positions"] <= sources["every_window_against_text"]["positions"]
    assert json.loads(out.read_text()) == record and "first drafted token right" in capsys.readouterr().out
