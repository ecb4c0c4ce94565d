"""Decoding chosen from measured costs (issue 70): `--dtype auto`, the verify curve kept per machine
(`mtpc.decoding.choice.costs`), and the choice between plain decoding, chains and trees
(`mtpc.decoding.choice.auto_decoding`) that `mtpc generate` makes with a head when neither --window nor --tree is given.

- `choose_decoding` picks a chain or tree only when it expects it to beat plain decoding by `MARGIN`, plain
  where a verify of k positions costs k steps (a CPU without native bf16), and the widest chain or a tree where
  verifying is free;
- `--dtype auto` is bf16 exactly where the CPU has bf16 instructions (or on CUDA);
- a curve is measured once, then read from the store for the same key; another thread count or dtype is another
  key; a damaged file, or one in a folder others may write, is measured afresh, never trusted;
- `mtpc generate` states its choice in one line, decodes plainly when plain is expected to be faster (the same
  text as plain decoding), and warns when a forced --window is expected to be slower than plain; a head that
  records no acceptance decodes its chains as before, with nothing more said.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch

import mtpc
from mtpc import hardware
from mtpc.lm import loading
from mtpc.cli.commands import main
from mtpc.decoding.choice.auto_decoding import MARGIN, chain_tokens, choose_decoding, expected_choice
from mtpc.lm.backbone import SplitBackbone
from mtpc.decoding.choice.costs import MachineCosts, cost_key, machine_costs
from mtpc.decoding.drafts.trees import AUTO_TREE_WIDTHS, tree_budget

ROOT = Path(__file__).resolve().parent.parent
MODEL = str(ROOT / "models" / "byte-lm")
HEAD = ROOT / "models" / "heads" / "ff8"
pytestmark = pytest.mark.usefixtures("one_thread")

# the README head's recorded table (smollm2-cp4-k2048-own: n = 4)
TABLE = {"k": [1, 2, 4, 8], "depth": [1, 2, 3],
         "path": [[0.4878, 0.6157, 0.7314, 0.8228], [0.1772, 0.3047, 0.479, 0.6421], [0.0615, 0.1406, 0.2993, 0.4927]]}
LINEAR = {w: 0.05 * w for w in AUTO_TREE_WIDTHS}  # k positions cost k steps: bf16 on a CPU without native bf16
FREE = {w: 0.05 for w in AUTO_TREE_WIDTHS}  # any width costs one step: a GPU, or native bf16 at these widths


def test_chain_tokens_add_the_greedy_path_rates():
    assert chain_tokens(TABLE, 2) == pytest.approx(1.4878)
    assert chain_tokens(TABLE, 4) == pytest.approx(1 + 0.4878 + 0.1772 + 0.0615)
    assert chain_tokens(TABLE, 5) is None  # depth 4 is not recorded
    assert chain_tokens({"k": [2], "depth": [1], "path": [[0.5]]}, 2) is None  # no greedy column


def test_where_k_positions_cost_k_steps_plain_decoding_is_chosen():
    choice = choose_decoding(TABLE, LINEAR, overhead=0.04, n=4, states=2048)
    assert choice.kind == "plain" and choice.rate() == 1.0
    assert "plain decoding" in choice.describe()


def test_where_verifying_is_free_the_head_decodes_with_all_it_drafts():
    chain_only = choose_decoding(TABLE, FREE, overhead=0.0, n=4, states=2048, trees=False)
    assert (chain_only.kind, chain_only.window) == ("chain", 4)
    assert chain_only.tokens == pytest.approx(chain_tokens(TABLE, 4))
    with_trees = choose_decoding(TABLE, FREE, overhead=0.0, n=4, states=2048)
    assert with_trees.kind == "tree" and with_trees.rate() > chain_only.rate()


def test_the_cycles_work_besides_its_verify_call_and_the_measured_step_are_counted():
    cheap = choose_decoding(TABLE, FREE, overhead=0.0, n=4, states=2048, trees=False)
    slow = choose_decoding(TABLE, FREE, overhead=1.0, n=4, states=2048, trees=False)  # the draft = a step
    assert cheap.kind == "chain" and slow.kind == "plain"
    assert expected_choice(TABLE, FREE, 0.5, window=4).cost == pytest.approx(1.5)


def test_the_choice_beats_plain_by_the_margin_or_is_plain_and_is_the_best_scored():
    rng = random.Random(0)
    for _ in range(300):
        path = sorted((rng.random() for _ in range(3)), reverse=True)
        table = {"k": [1], "depth": [1, 2, 3], "path": [[p] for p in path]}
        seconds = {w: rng.uniform(0.01, 0.1) * (1 + rng.uniform(0, 1) * w) for w in AUTO_TREE_WIDTHS}
        draft = rng.uniform(0, 0.5)
        choice = choose_decoding(table, seconds, draft, n=4, states=16)
        forced = [expected_choice(table, seconds, draft, window=w) for w in (2, 3, 4)]
        if choice.kind == "plain":  # nothing beats plain decoding by the margin
            assert choice.rate() == 1.0 and all(f.rate() <= MARGIN for f in forced)
        else:
            assert choice.rate() > MARGIN and all(choice.rate() >= f.rate() - 1e-12 for f in forced)


def test_a_forced_tree_is_scored_from_below_by_the_full_trees_that_fit():
    choice = expected_choice(TABLE, FREE, 0.0, tree=tree_budget(7, 4, 2048))  # 1 + 2 + 4: k = 2, depth 2
    assert choice.tokens == pytest.approx(1 + 0.6157 + 0.3047)


# --------------------------------------------------------------------------- --dtype auto

@pytest.mark.parametrize("flags, native", [({"avx2", "fma"}, False), ({"avx512f", "avx512_bf16"}, True),
                                           ({"amx_bf16", "amx_tile"}, True), ({"fp", "asimd", "bf16"}, True)])
def test_dtype_auto_is_bf16_only_where_the_cpu_has_bf16_instructions(monkeypatch, flags, native):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
    assert hardware.native_bf16("cpu") is native
    assert loading.resolve_dtype("auto", torch.device("cpu")) == ("bf16" if native else "fp32")
    assert loading.resolve_dtype("fp32", torch.device("cpu")) == "fp32"  # a given dtype stays
    assert ("no native bf16" in hardware.machine_summary()) is not native


@pytest.mark.parametrize("variable, limit, native", [("ONEDNN_MAX_CPU_ISA", "avx2", False),
                                                     ("DNNL_MAX_CPU_ISA", "AVX512_CORE", False),
                                                     ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX", True),
                                                     ("ONEDNN_MAX_CPU_ISA", "ALL", True)])
def test_onednn_limited_below_its_bf16_kernels_is_no_native_bf16(monkeypatch, variable, limit, native):
    """`ONEDNN_MAX_CPU_ISA=AVX2` on a CPU with AMX: its bf16 products run as an AVX2-only CPU's (measured 7.5x for 8
    rows), so bf16 is not native there, the summary says why, and a verify curve is another cost key."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx512f", "amx_bf16", "avx512_bf16"}))
    plain_key = cost_key({"a": 1}, torch.bfloat16, torch.device("cpu"), 1, (1, 2))
    monkeypatch.setenv(variable, limit)
    assert hardware.native_bf16("cpu") is native and hardware.isa_limit() == limit.upper()
    assert f"oneDNN limited to {limit.upper()}" in hardware.machine_summary()
    assert ("no native bf16" in hardware.machine_summary()) is not native
    assert loading.resolve_dtype("auto", torch.device("cpu")) == ("bf16" if native else "fp32")
    assert cost_key({"a": 1}, torch.bfloat16, torch.device("cpu"), 1, (1, 2)) != plain_key


@pytest.mark.parametrize("native", [False, True])
def test_dtype_auto_keeps_a_float32_checkpoint_in_float32(monkeypatch, tmp_path, native):
    """A checkpoint stored in float32 (the shipped byte and subword LMs) decodes in float32 on any machine, so the
    docs' texts hold there too; a bf16 checkpoint, or a GGUF file's quantized weights, follow the hardware."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"amx_bf16"} if native else {"avx2"}))
    cpu = torch.device("cpu")
    byte_lm = ROOT / "models" / "byte-lm"
    stored = loading.stored_dtype(byte_lm, loading.model_config(byte_lm))
    assert stored == "fp32" and loading.resolve_dtype("auto", cpu, stored) == "fp32"
    assert loading.resolve_dtype("bf16", cpu, stored) == "bf16"  # a given dtype still wins
    assert loading.resolve_dtype("auto", cpu, "bf16") == ("bf16" if native else "fp32")
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert loading.stored_dtype(gguf, {"dtype": "float32"}) is None  # the converted folder's config says float32
    assert loading.stored_dtype(tmp_path, {"torch_dtype": "bfloat16"}) == "bf16"
    assert loading.stored_dtype(tmp_path, {}) is None and loading.stored_dtype(tmp_path, {"dtype": 7}) is None


def test_this_machines_summary_names_its_cpu():
    assert hardware.cpu_name() in hardware.machine_summary()


# --------------------------------------------------------------------------- the cost store

@pytest.fixture(scope="module")
def byte_lm():
    return loading.load_model(MODEL, torch.float32)


@pytest.fixture(scope="module")
def backbone(byte_lm):
    return SplitBackbone(byte_lm)


def test_a_plain_step_and_a_cycles_other_work_are_measured_by_decoding(byte_lm):
    from mtpc.decoding.choice.costs import cycle_costs

    model = byte_lm
    call_seconds = {1: 1.0, 8: 1.0}  # a flat curve: the whole chain cycle over the step is the overhead
    costs = cycle_costs(model, mtpc.load_head(HEAD), call_seconds, tokens=6)
    assert costs.step > 0 and costs.overhead >= 0
    steep = cycle_costs(model, mtpc.load_head(HEAD), {1: 1.0, 8: 100.0}, tokens=6)
    assert steep.overhead == 0.0  # a curve that says more than the cycle took leaves nothing besides it


def test_a_verify_curve_is_measured_once_then_read_for_the_same_key(backbone, tmp_path):
    first = machine_costs(backbone, torch.float32, torch.device("cpu"), (1, 2, 4), store=tmp_path)
    again = machine_costs(backbone, torch.float32, torch.device("cpu"), (1, 2, 4), store=tmp_path)
    assert first.measured and not again.measured
    assert again.call_seconds == first.call_seconds and sorted(first.call_seconds) == [1, 2, 4]
    assert "measured before" in again.describe() and hardware.cpu_name() in again.describe()
    other_widths = machine_costs(backbone, torch.float32, torch.device("cpu"), (1, 8), store=tmp_path)
    assert other_widths.measured


def test_another_thread_count_is_another_key(backbone, tmp_path):
    machine_costs(backbone, torch.float32, torch.device("cpu"), (1, 2), store=tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert machine_costs(backbone, torch.float32, torch.device("cpu"), (1, 2), store=tmp_path).measured
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("damage", ["not json", "[]", '{"key": 1}', "{\"key\": KEY, \"call_seconds\": {\"1\": -1}}",
                                    "{\"key\": KEY, \"call_seconds\": {\"x\": 1}}"])
def test_a_damaged_cost_file_is_measured_afresh(backbone, tmp_path, damage):
    costs = machine_costs(backbone, torch.float32, torch.device("cpu"), (1, 2), store=tmp_path)
    key = json.loads(costs.path.read_text())["key"]
    costs.path.write_text(damage.replace("KEY", json.dumps(key)))
    again = machine_costs(backbone, torch.float32, torch.device("cpu"), (1, 2), store=tmp_path)
    assert again.measured and min(again.call_seconds.values()) >= 0


def test_a_store_others_may_write_is_not_read(backbone, tmp_path):
    store = tmp_path / "shared"
    costs = machine_costs(backbone, torch.float32, torch.device("cpu"), (1, 2), store=store)
    costs.path.write_text(json.dumps({**json.loads(costs.path.read_text()), "call_seconds": {"1": 9.0, "2": 9.0}}))
    store.chmod(0o777)  # writable by anyone, not sticky: what lies below may be anyone's
    again = machine_costs(backbone, torch.float32, torch.device("cpu"), (1, 2), store=store)
    assert again.measured and again.call_seconds != {1: 9.0, 2: 9.0}


# --------------------------------------------------------------------------- mtpc generate

def head_with(tmp_path: Path, table: dict) -> Path:
    """A copy of the shipped ff8 head recording `table` as its per-depth acceptance."""
    folder = Path(shutil.copytree(HEAD, tmp_path / "head"))
    (folder / loading.DEPTH_TOPK_FILE).write_text(json.dumps(table))
    return folder


def ff8_table(rate: float) -> dict:
    return {"k": [1], "depth": list(range(1, 8)), "path": [[rate ** d] for d in range(1, 8)]}


def generate(capsys, *flags: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["generate", "--model", MODEL, "--max-new-tokens", "24", "--no-stream", *flags, "def f(x):"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def plain_text(capsys) -> str:
    code, out, _ = generate(capsys)
    assert code == 0
    return out


@pytest.fixture
def costs_in(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def test_generate_decodes_plainly_where_no_chain_is_expected_to_pay(tmp_path, capsys, plain_text, costs_in):
    head = head_with(tmp_path, ff8_table(0.0))  # the head is never right: nothing beats plain decoding
    code, out, err = generate(capsys, "--head", str(head), "--stats")
    assert code == 0 and out == plain_text
    assert err.startswith("mtpc: auto: fp32 (") or err.startswith("mtpc: auto: bf16 (")  # --dtype auto's choice
    assert "; plain decoding (" in err.splitlines()[0]


def test_generate_chooses_a_chain_when_the_head_is_right_and_states_it(tmp_path, capsys, plain_text, costs_in):
    head = head_with(tmp_path, ff8_table(0.99))
    code, out, err = generate(capsys, "--head", str(head))
    assert code == 0 and out == plain_text  # greedy: the text of plain decoding
    line = next(line for line in err.splitlines() if line.startswith("mtpc: auto: "))
    assert "tokens a cycle expected" in line and "verify ms by width" in line and "measured now" in line
    _, _, again = generate(capsys, "--head", str(head))
    assert "measured before" in again  # the curve was kept


def test_a_forced_window_expected_slower_than_plain_is_a_warning(tmp_path, capsys, costs_in):
    head = head_with(tmp_path, ff8_table(0.0))
    code, _, err = generate(capsys, "--head", str(head), "--window", "8")
    assert code == 0 and "mtpc: warning: a chain of 8" in err and "slower than plain decoding" in err


def test_a_head_without_a_table_decodes_its_chains_with_nothing_to_say(capsys, plain_text, costs_in):
    code, out, err = generate(capsys, "--head", str(HEAD), "--stats")
    assert code == 0 and out == plain_text
    assert "mtpc: auto" not in err and err.startswith("[speculative] ")  # the head decoded, with nothing said


def test_the_auto_choice_benchmark_compares_each_setting_with_plain(tmp_path, capsys, costs_in):
    """benchmarks/auto_choice.py at tiny sizes: a chat and a code prompt, the head's defaults, the table and
    the record (what auto said, a speed-up against plain decoding measured beside it)."""
    import importlib.util

    import networkx

    spec = importlib.util.spec_from_file_location("auto_choice", ROOT / "benchmarks" / "auto_choice.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    head = head_with(tmp_path, ff8_table(0.9))
    out = tmp_path / "auto_choice.json"
    script.main(["--model", MODEL, "--head", str(head), "--code", str(Path(networkx.__file__).parent),
                 "--prompts", "1", "--new-tokens", "8", "--settings", "auto", "--costs", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "| auto | `(none)` | chat |" in printed and "| auto | `(none)` | code |" in printed
    runs = json.loads(out.read_text())["runs"]["auto"]
    assert [r["kind"] for r in runs] == ["chat", "code"]
    assert all(r["speedup"] > 0 and r["identical"] and r["said"][0].startswith("mtpc: auto: ") for r in runs)
    assert "| fp32 |" in printed and "| bf16 |" in printed  # --costs: the curves auto chose by
    assert set(json.loads(out.read_text())["verify_call_seconds"]) == {"fp32", "bf16"}


def test_a_tied_head_is_timed_on_the_models_own_output_layer(tmp_path, capsys, costs_in):
    """A tied head (its input units are the model's output layer, as the README's SmolLM2 head) drafts for the
    auto choice's timing before the decoder ties it: the choice is made and the text is plain decoding's."""
    head = Path(shutil.copytree(ROOT / "models" / "heads" / "subword-btree4-r4-tied", tmp_path / "tied"))
    table = {"k": [1], "depth": [1, 2, 3], "path": [[0.9], [0.8], [0.7]]}
    (head / loading.DEPTH_TOPK_FILE).write_text(json.dumps(table))
    model = str(ROOT / "models" / "subword-lm")
    argv = ["generate", "--model", model, "--max-new-tokens", "12", "--no-stream", "def f(x):"]
    capsys.readouterr()
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main(argv[:3] + ["--head", str(head)] + argv[3:]) == 0
    captured = capsys.readouterr()
    assert captured.out == plain and "mtpc: auto: " in captured.err and "a plain step " in captured.err


def test_with_lookup_plain_decoding_is_still_chosen_where_the_head_does_not_pay(tmp_path, capsys, plain_text,
                                                                                costs_in):
    """Never slower than plain: the table cannot foresee prompt lookup's matches, so --lookup does not keep a head
    that is expected to lose; the line says how to force it."""
    head = head_with(tmp_path, ff8_table(0.0))
    code, out, err = generate(capsys, "--head", str(head), "--lookup", "10")
    assert code == 0 and out == plain_text
    assert "; plain decoding (" in err and "--window N decodes with both" in err
