"""mtpc heads drafting inside vLLM (`mtpc.vllm_options`, `mtpc.serving.vllm_proposer`), on vLLM's CPU build and the
shipped byte LM (float32, one bound core). Skipped where vLLM is not installed (the default environment).

- Greedy text through vLLM with a head (ff8; btree8-r8 with prompt lookup) equals plain vLLM greedy and mtpc's own
  plain greedy, on a batch of four held-out prompts (networkx sources) of different lengths.
- The proposer drafts from the right row: the hidden state it drafted from equals the byte LM's (transformers) at
  the position that gave the last token, and its draft is mtpc's own `Drafter`'s there; vLLM accepts drafts.
- Sampling is lossless through vLLM's rejection sampler: the joint of the first two sampled tokens against the
  exact joint from transformers (chi-square), and a control at the wrong temperature that must be rejected.
- Refusals, in one line and before any engine starts: a missing head folder, a folder that is no head, a head that
  does not fit the model, a model layout the proposer does not know, a GGUF file, an unsupported vLLM version.

Each engine (plain, ff8, btree8-r8 on the byte LM; the tied head on models/subword-lm) starts once, in this
process, and is shut down before the next starts.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

vllm = pytest.importorskip("vllm")

import mtpc  # noqa: E402
from mtpc.decoding.drafts.drafting import Drafter  # noqa: E402
from mtpc.errors import InputError  # noqa: E402
from mtpc.sampling import GREEDY  # noqa: E402
from mtpc.serving.options import ProposerSettings, check_vllm_version  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")  # vLLM's own deprecation and experimental-feature warnings

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "byte-lm"
SUBWORD_MODEL = ROOT / "models" / "subword-lm"  # 2,048 BPE tokens; subword-btree4-r4-tied reads its output layer
HEADS = ROOT / "models" / "heads"
NEW_TOKENS = 64
# the engine and its worker in this process ("uni", no multiprocessing): a start costs ~5 s instead of ~45 s of
# imports in two new processes, and collective_rpc runs a test's function on the worker as it is
ENGINE = {"skip_tokenizer_init": True, "dtype": "float32", "enforce_eager": True, "max_model_len": 512,
          "disable_log_stats": False, "seed": 0, "distributed_executor_backend": "uni"}
# one bound core and a small KV cache (the machine's other work keeps the rest)
ENGINE_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
SAMPLES = 2000  # sampled continuations of one prompt at each temperature, for the chi-square
SAMPLING_TEMPERATURES = (1.0, 0.7)


@contextlib.contextmanager
def engine(model: Path = MODEL, engine_args: dict | None = None, **options):
    """A vLLM engine on `model` (the byte LM) with `engine_args` (default `ENGINE`) and `options`, shut down on
    leaving (the next may start)."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in ENGINE_ENV.items():
            env.setenv(name, os.environ.get(name, value))
        llm = vllm.LLM(model=str(model), **(ENGINE if engine_args is None else engine_args), **options)
        try:
            yield llm
        finally:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()
            cleanup_dist_env_and_memory()  # the next engine of this process sets up its own


def greedy(llm, prompts: list[list[int]]) -> list[list[int]]:
    params = vllm.SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def spec_counts(llm) -> dict:
    """vLLM's speculative-decoding counters: drafts, drafted and accepted tokens, accepted per draft position."""
    counts = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_position": []}
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    for metric in llm.get_metrics():
        if metric.name in names:
            counts[names[metric.name]] += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            counts["per_position"] = list(metric.values)
    return counts


def difference(after: dict, before: dict) -> dict:
    per_position = [a - (before["per_position"][j] if j < len(before["per_position"]) else 0)
                    for j, a in enumerate(after["per_position"])]
    return {**{k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")}, "per_position": per_position}


def drafter_call(llm, method: str):
    """A method of the engine's proposer, called inside the engine (its worker)."""
    return llm.collective_rpc(lambda worker: getattr(worker.model_runner.drafter, method)())[0]


# --------------------------------------------------------------------------- shared inputs

@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    """Four held-out prompts of different lengths: networkx sources (third-party code the byte LM never saw)."""
    import networkx

    root = Path(networkx.__file__).parent
    files = ["algorithms/shortest_paths/weighted.py", "algorithms/cycles.py", "classes/graph.py", "algorithms/dag.py"]
    tokenizer = mtpc.ByteTokenizer()
    return [tokenizer.encode_prompt((root / f).read_bytes()[3000:3000 + length])
            for f, length in zip(files, (170, 260, 350, 430))]


@pytest.fixture(scope="module")
def byte_lm():
    from mtpc.lm.loading import load_model

    return load_model(MODEL, torch.float32)


@pytest.fixture(scope="module")
def mtpc_greedy(byte_lm, prompts) -> list[list[int]]:
    decoder = mtpc.PlainDecoder(byte_lm)
    return [decoder.generate(torch.tensor([p]), NEW_TOKENS).sequences[0, len(p):].tolist() for p in prompts]


@dataclass
class HeadRun:
    greedy: list[list[int]]
    spec: dict  # spec_counts of the greedy generation
    stats: dict  # the proposer's own counters after it
    recorded: list[dict]
    pairs: dict = field(default_factory=dict)  # temperature -> [SAMPLES, 2] the first two tokens of each continuation
    sampling_spec: dict | None = None


@pytest.fixture(scope="module")
def plain_vllm(prompts) -> list[list[int]]:
    with engine() as llm:
        return greedy(llm, prompts)


@pytest.fixture(scope="module")
def ff8(prompts, sampling_prompt) -> HeadRun:
    """The ff8 head: greedy on the prompts (its drafts recorded), then SAMPLES continuations at T = 1."""
    options = mtpc.vllm_options(HEADS / "ff8", model=MODEL)
    options["additional_config"]["mtpc"]["record_drafts"] = 1000
    with engine(**options) as llm:
        before = spec_counts(llm)
        texts = greedy(llm, prompts)
        run = HeadRun(texts, difference(spec_counts(llm), before), drafter_call(llm, "stats"),
                      drafter_call(llm, "recorded_drafts"))
        before = spec_counts(llm)
        # the engine's seed, not one per request: vLLM 0.32's CPU runner fails on a seeded request whose prefill
        # is split across steps ("CPU Generator does not use offset")
        for temperature in SAMPLING_TEMPERATURES:
            params = vllm.SamplingParams(temperature=temperature, max_tokens=2, ignore_eos=True)
            outputs = llm.generate([{"prompt_token_ids": sampling_prompt} for _ in range(SAMPLES)], params,
                                   use_tqdm=False)
            run.pairs[temperature] = np.array([list(o.outputs[0].token_ids) for o in outputs])
        run.sampling_spec = difference(spec_counts(llm), before)
        return run


@pytest.fixture(scope="module")
def btree_lookup(prompts) -> HeadRun:
    """The btree8-r8 head (a shared parameterisation, an MLP on x_0) with prompt lookup beside it."""
    with engine(**mtpc.vllm_options(HEADS / "btree8-r8", model=MODEL, lookup=8)) as llm:
        before = spec_counts(llm)
        texts = greedy(llm, prompts)
        return HeadRun(texts, difference(spec_counts(llm), before), drafter_call(llm, "stats"), [])


# --------------------------------------------------------------------------- greedy

def test_plain_vllm_greedy_is_mtpc_plain_greedy(plain_vllm, mtpc_greedy):
    assert plain_vllm == mtpc_greedy


def test_greedy_with_the_ff8_head_is_plain_greedy_and_vllm_accepts_its_drafts(ff8, plain_vllm, mtpc_greedy):
    assert ff8.greedy == plain_vllm == mtpc_greedy
    assert ff8.spec["drafts"] > 0 and ff8.spec["accepted"] > 0
    # every draft vLLM verified came from the proposer (its last draft for a request that then finished is not)
    assert 0 < ff8.spec["draft_tokens"] <= ff8.stats["drafted"]


def test_greedy_with_btree_and_lookup_is_plain_greedy(btree_lookup, plain_vllm, mtpc_greedy):
    assert btree_lookup.greedy == plain_vllm == mtpc_greedy
    assert btree_lookup.spec["accepted"] > 0
    assert btree_lookup.stats["lookup_windows"] > 0  # prompt lookup's matches replaced some circuit drafts


# --------------------------------------------------------------------------- the row and the draft

def final_hidden_states(model, texts: list[list[int]]) -> list[torch.Tensor]:
    """Each text's final hidden state at the position that gave its last token (`[d]`), from transformers: one
    forward per text no other text extends (a request's drafts are all prefixes of its last text)."""
    computed: list[tuple[list[int], torch.Tensor]] = []  # (text, [T, d] its hidden states)
    found = []
    for text in texts:
        for full, hidden in computed:
            if len(full) >= len(text) and full[:len(text)] == text:
                break
        else:
            longest = max((t for t in texts if t[:len(text)] == text), key=len)
            with torch.no_grad():
                hidden = model(torch.tensor([longest]), output_hidden_states=True).hidden_states[-1][0]
            computed.append((longest, hidden))
        found.append(hidden[len(text) - 2])
    return found


def recorded_drafts_are_mtpcs(recorded: list[dict], model, head) -> None:
    """Each recorded draft came from the model's final hidden state at the position that gave its `x_0` (the
    text's last token), and is what mtpc's own `Drafter` drafts from there."""
    drafter = Drafter(head, (head.num_variables,), None, head.num_variables, model.config.vocab_size)
    expected = final_hidden_states(model, [record["text"] for record in recorded])
    for record, wanted in zip(recorded, expected):
        captured = torch.tensor(record["hidden"])
        assert torch.allclose(captured, wanted, atol=1e-4, rtol=1e-4), (len(record["text"]),
                                                                         (captured - wanted).abs().max())
        first = torch.tensor([record["text"][-1]])
        assert drafter.circuit_window(captured[None], first, GREEDY).tokens[0, 1:].tolist() == record["draft"]
        # from transformers' own hidden state too: float32 through either engine, no argmax lands elsewhere
        assert drafter.circuit_window(wanted[None], first, GREEDY).tokens[0, 1:].tolist() == record["draft"]


def test_drafts_come_from_the_row_that_gave_the_last_token_and_equal_mtpcs(ff8, byte_lm):
    assert 0 < len(ff8.recorded) == ff8.stats["requests"] < 1000  # every draft of the greedy run, recorded
    recorded_drafts_are_mtpcs(ff8.recorded, byte_lm, mtpc.load_head(HEADS / "ff8").float().eval())


@pytest.fixture(scope="module")
def subword_prompts(prompts) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(SUBWORD_MODEL)
    byte = mtpc.ByteTokenizer()
    return [[tokenizer.bos_token_id] + tokenizer.encode(byte.decode(p), add_special_tokens=False) for p in prompts]


def test_a_tied_head_drafts_with_vllms_own_output_layer(subword_prompts):
    """subword-btree4-r4-tied has no unembedding of its own: inside vLLM it reads vLLM's lm_head."""
    from mtpc.lm.loading import load_model

    options = mtpc.vllm_options(HEADS / "subword-btree4-r4-tied", model=SUBWORD_MODEL)
    options["additional_config"]["mtpc"]["record_drafts"] = 1000
    with engine(SUBWORD_MODEL, **options) as llm:
        before = spec_counts(llm)
        texts = greedy(llm, subword_prompts)
        spec, recorded = difference(spec_counts(llm), before), drafter_call(llm, "recorded_drafts")
    model = load_model(SUBWORD_MODEL, torch.float32)
    decoder = mtpc.PlainDecoder(model)
    assert texts == [decoder.generate(torch.tensor([p]), NEW_TOKENS).sequences[0, len(p):].tolist()
                     for p in subword_prompts]
    assert spec["accepted"] > 0 and recorded
    head = mtpc.load_head(HEADS / "subword-btree4-r4-tied").float().eval().tie_to(model.get_output_embeddings())
    recorded_drafts_are_mtpcs(recorded, model, head)


# --------------------------------------------------------------------------- sampling

@pytest.fixture(scope="module")
def sampling_prompt() -> list[int]:
    return mtpc.ByteTokenizer().encode_prompt(b"import networkx as nx\n\n\ndef all_")


def exact_joint(model, prompt: list[int], temperature: float = 1.0) -> np.ndarray:
    """`[V, V]` float64: P(x_1, x_2 | prompt) of the byte LM sampled at `temperature` (no top-k or top-p)."""
    with torch.no_grad():
        first = model(torch.tensor([prompt])).logits[0, -1].double()  # [V]
        V = first.shape[0]
        batch = torch.cat([torch.tensor([prompt]).expand(V, -1), torch.arange(V)[:, None]], 1)  # [V, T + 1]
        second = model(batch).logits[:, -1].double()  # [V, V]: the second token's logits after each first
    p1 = torch.softmax(first / temperature, -1)
    p2 = torch.softmax(second / temperature, -1)
    return (p1[:, None] * p2).numpy()


def chi_square_pvalue(pairs: np.ndarray, joint: np.ndarray) -> float:
    """Pearson's test of observed pairs against a joint: outcomes expected 5 times or more are their own bins, the
    rest one bin together."""
    from scipy.stats import chisquare

    V = joint.shape[0]
    observed = np.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V * V).astype(float)
    expected = joint.reshape(-1) / joint.sum() * len(pairs)
    kept = expected >= 5
    observed = np.append(observed[kept], observed[~kept].sum())
    expected = np.append(expected[kept], expected[~kept].sum())
    return chisquare(observed, expected).pvalue


def test_sampling_through_vllm_with_the_head_is_exactly_the_models(ff8, byte_lm, sampling_prompt):
    # every continuation's second token went through the rejection sampler: each request drafted once
    assert ff8.sampling_spec["drafts"] == SAMPLES * len(SAMPLING_TEMPERATURES) and ff8.sampling_spec["accepted"] > 0
    joints = {t: exact_joint(byte_lm, sampling_prompt, t) for t in (1.0, 0.8, 0.7)}
    assert chi_square_pvalue(ff8.pairs[1.0], joints[1.0]) > 1e-3
    assert chi_square_pvalue(ff8.pairs[0.7], joints[0.7]) > 1e-3
    # the controls: the same draws against another temperature's joint must be rejected (the test can tell)
    assert chi_square_pvalue(ff8.pairs[1.0], joints[0.8]) < 1e-6
    assert chi_square_pvalue(ff8.pairs[0.7], joints[1.0]) < 1e-6


def test_the_repaired_expansion_spreads_each_requests_value_over_its_positions():
    from mtpc.serving.vllm_repairs import expand_by_request, expand_is_correct

    for values, wanted in ((torch.tensor([0.5, -1.0, 2.5]), [0.5, 0.5, 1.0, 2.5, 2.5, 2.5]),
                           (torch.tensor([5, -1, 7], dtype=torch.int32), [5, 5, 1, 7, 7, 7])):
        out = torch.full((7,), 9, dtype=values.dtype)
        expand_by_request(out, values, torch.tensor([2, 3, 6], dtype=torch.int32), -1, 1)
        assert out.tolist() == wanted + [9]  # positions past the requests' own are left alone
    assert expand_is_correct()  # in this process the engines' proposer repaired vLLM's CPU expansion


# --------------------------------------------------------------------------- refusals, before any engine

def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message and message
    return message


def test_options_are_the_json_vllm_takes_for_this_head():
    options = mtpc.vllm_options(HEADS / "ff8", lookup=5)
    assert json.loads(json.dumps(options)) == options
    assert options["speculative_config"] == {"method": "custom_class", "num_speculative_tokens": 7,
                                             "model": "mtpc.serving.vllm_proposer.CircuitHeadProposer"}
    assert options["additional_config"] == {"mtpc": {"head": str((HEADS / "ff8").resolve()), "lookup": 5}}
    assert mtpc.vllm_options(HEADS / "ff8", lookup=12)["speculative_config"]["num_speculative_tokens"] == 12
    assert mtpc.vllm_options(HEADS / "ff8", num_speculative_tokens=3)["speculative_config"][
        "num_speculative_tokens"] == 3


@pytest.mark.parametrize("head, model, words", [
    ("missing-head", None, "no such head folder"),
    ("../../models/byte-lm", None, "is not a head folder"),
    ("smollm2-ff4-k2048", MODEL, "hidden size 576"),
])
def test_a_head_that_cannot_draft_is_refused_in_one_line(head, model, words):
    with pytest.raises(InputError) as error:
        mtpc.vllm_options(HEADS / head, model=model)
    assert words in one_line(error)


def test_a_model_vllm_or_the_capture_cannot_take_is_refused_in_one_line(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(InputError) as error:
        mtpc.vllm_options(HEADS / "ff8", model=gguf)
    assert "mtpc export-hf" in one_line(error)
    other = tmp_path / "other-layout"
    shutil.copytree(MODEL, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(InputError) as error:
        mtpc.vllm_options(HEADS / "ff8", model=other)
    assert "'GPT2LMHeadModel', whose layout it does not know" in one_line(error)


@pytest.mark.parametrize("settings", [{"lookup": 0}, {"lookup": 2000}, {"num_speculative_tokens": 8},
                                      {"num_speculative_tokens": 0}])
def test_bad_options_are_refused(settings):
    with pytest.raises(ValueError) as error:
        mtpc.vllm_options(HEADS / "ff8", **settings)
    one_line(error)


@pytest.mark.parametrize("version", ["0.31.2", "0.33.0", "1.32.0", "0.32", "", "dev"])
def test_an_unsupported_vllm_version_is_refused_in_one_line(version):
    if version == "0.32":  # a release without its patch number is still 0.32
        check_vllm_version(version)
        return
    with pytest.raises(InputError) as error:
        check_vllm_version(version)
    assert "supports vLLM 0.32.x" in one_line(error)


def test_the_installed_vllm_is_a_supported_one():
    check_vllm_version(vllm.__version__)
    check_vllm_version("0.32.7+cpu")


@pytest.mark.parametrize("config", [None, {}, {"mtpc": {}}, {"mtpc": {"head": "x", "window": 3}},
                                    {"mtpc": {"head": "x", "record_drafts": -1}}])
def test_settings_written_by_hand_are_checked_inside_the_engine_too(config):
    with pytest.raises(InputError) as error:
        ProposerSettings.from_additional_config(config)
    one_line(error)


def test_the_proposer_checks_hand_written_options_when_the_engine_starts():
    """Options written by hand (`vllm serve --additional-config ...`) meet the same checks inside the engine: the
    proposer is built from vLLM's own configuration of the model (no engine started here)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform

    from mtpc.serving.vllm_proposer import CircuitHeadProposer

    current_platform.register_triton_kernel_overrides()  # as an engine's worker does before building its proposer

    def proposer(head: str) -> CircuitHeadProposer:
        options = mtpc.vllm_options(HEADS / "ff8")
        options["additional_config"]["mtpc"]["head"] = str(HEADS / head)
        args = {k: v for k, v in ENGINE.items() if k not in ("disable_log_stats", "seed")}
        return CircuitHeadProposer(EngineArgs(model=str(MODEL), **args, **options).create_engine_config())

    for head, words in (("smollm2-ff4-k2048", "hidden size 576"), ("missing-head", "no such head folder")):
        with pytest.raises(InputError) as error:
            proposer(head)
        assert words in one_line(error)
    built = proposer("ff8")
    assert (built.n, built.tokens) == (8, 7)
    with pytest.raises(InputError) as error:
        built.load_model(torch.nn.Linear(192, 264))  # a model class whose forward the capture does not know
    assert "'Linear', whose layout it does not know" in one_line(error)


# --------------------------------------------------------------------------- the speed benchmark

def test_the_speed_benchmark_runs_each_method_in_its_own_engine_and_compares_greedy_text(tmp_path):
    """benchmarks/vllm_speed.py (docs/results.md's vLLM table) at tiny sizes on the byte LM: plain and the ff8 head,
    eager, each in a process of its own; the record holds every phase, the head's greedy text is plain's, its
    drafts were accepted, and plain's verify-cost probe measured every M."""
    import subprocess
    import sys

    import networkx

    out = tmp_path / "speed.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vllm_speed.py"), "--model", str(MODEL),
                          "--head", str(HEADS / "ff8"), "--code", str(Path(networkx.__file__).parent),
                          "--dtype", "float32", "--methods", "plain", "head", "--modes", "eager", "--single", "2",
                          "--batch", "2", "--new-tokens", "16", "--cost-repeats", "1", "--out", str(out)],
                         capture_output=True, text=True, timeout=900, env={**os.environ, **ENGINE_ENV})
    assert run.returncode == 0, run.stderr[-3000:]
    records = {r["method"]: r for r in json.loads(out.read_text())["records"]}
    plain, head = records["plain"], records["head"]
    for phase in ("single_greedy", "single_t1", "batch_greedy", "batch_t1"):
        assert head[phase]["tokens"] == plain[phase]["tokens"] == 2 * 16
    assert head["single_greedy"]["outputs"] == plain["single_greedy"]["outputs"]
    assert head["batch_greedy"]["outputs"] == plain["batch_greedy"]["outputs"]
    assert head["single_greedy"]["spec"]["num_accepted_tokens"] > 0 and head["single_greedy"]["proposer"]["calls"] > 0
    assert sorted(plain["verify_cost"]["relative"], key=int) == ["1", "2", "4", "8", "16"]
    assert "| head | eager | single greedy |" in run.stdout and "| relative (M = 1:" in run.stdout
