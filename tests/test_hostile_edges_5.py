"""Hostile edges, part 5 (issue 71): caches bounded by what will be allocated, a step store that never ends a
run, and one rule per flag pair.

- `max_context` is checked against the model's context and against the memory its caches take, when a
  decoder is built and when `mtpc generate` reads its flags (before the model loads); a generation's own
  check counts the caches it will allocate (`max_context` slots at least), and the refusal states the bytes;
- anything where a stored step file should be (a folder, a FIFO, a socket, a dangling link) is a warning and
  a fresh trace, never an abort nor a hang;
- `mtpc generate` and `mtpc bench` refuse `--tree` with `--window` alike, every `K` of `--peers
  prompt-lookup:K` is checked with its range before anything loads, and every bad argument of
  `SpeculativeDecoder` / `PlainDecoder` is a `ValueError` with a message.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import pytest
import torch

from mtpc import SpeculativeDecoder
from mtpc.cli.commands import main
from mtpc.decoding import AdaptiveWidth, PlainDecoder, PromptLookup
from mtpc.decoding.compiling import precompiled_step, steps_can_be_stored
from mtpc.decoding.drafts.trees import TreeBudget
from mtpc.decoding.cycle.verify import cache_bytes
from mtpc.bench import run_bench
from mtpc.errors import InputError
from test_bench import config, setup  # noqa: F401  the bench's module-scoped model and heads
from test_decode import random_head, tiny_lm
from test_generate import folders, refused  # noqa: F401  the module-scoped model and head folders
from test_step_store import Scale

pytestmark = pytest.mark.usefixtures("one_thread")


def limit_memory(monkeypatch, available: int) -> None:
    """Every memory check of the decoders sees `available` bytes free (what a small machine would say)."""
    for module in ("cycle.verify", "cycle.decoder", "plain"):
        monkeypatch.setattr(f"mtpc.decoding.{module}.available_memory", lambda device: available, raising=False)


def no_loading(*args, **kwargs):
    raise AssertionError("the model was loaded before the flags were refused")


def refusal(argv: list[str], capsys) -> str:
    """The one `mtpc: error:` line `main(argv)` reports, with exit status 2, for an input error."""
    capsys.readouterr()
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert err.startswith("mtpc: error:") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ------------------------------------------------------------------ memory: max_context and cache sizes

def test_a_max_context_past_the_models_context_is_refused_when_the_decoder_is_built():
    model = tiny_lm(12)  # 128 positions
    head = random_head("hmm", 3, 12, seed=2, init_from=model.lm_head.weight)
    for build in (lambda: PlainDecoder(model, max_context=2**22), lambda: SpeculativeDecoder(model, head, max_context=2**22),
                  lambda: PlainDecoder(model, compile=True, max_context=129)):
        with pytest.raises(ValueError, match=r"max_context [\d,]+ is more than the 128 positions of the model's context"):
            build()
    assert PlainDecoder(model, max_context=128).reserve == 128  # the whole context is fine


def test_caches_that_would_not_fit_are_refused_with_their_bytes_before_allocating(monkeypatch):
    """A model with 4M positions and `max_context=2**22`: one row's caches take 2 GiB, refused at once (the
    generation's own check counted only its prompt and new tokens, and the caches were then allocated)."""
    model = tiny_lm(12)
    model.config.max_position_embeddings = 2**22
    head = random_head("hmm", 3, 12, seed=2, init_from=model.lm_head.weight)
    need = cache_bytes(model.config, 2, 2**22 + 1, 1, 8)  # 2 layers of float64 keys and values, 4M + 1 slots
    limit_memory(monkeypatch, 2**29)
    start = time.perf_counter()
    for build in (lambda: PlainDecoder(model, max_context=2**22), lambda: SpeculativeDecoder(model, head, max_context=2**22)):
        with pytest.raises(ValueError, match=rf"max_context 4,194,304 needs about 2.00 GiB \({need:,} bytes\) .* "
                                             rf"more than the 0.50 GiB \({2**29:,} bytes\) available"):
            build()
    assert time.perf_counter() - start < 5  # nothing was allocated


def test_a_generation_counts_the_caches_it_will_allocate_and_not_those_it_reuses(monkeypatch):
    model = tiny_lm(12)
    model.config.max_position_embeddings = 2**16
    head = random_head("hmm", 3, 12, seed=2, init_from=model.lm_head.weight)
    plain, speculative = PlainDecoder(model, max_context=2**16), SpeculativeDecoder(model, head, max_context=2**16)
    need = cache_bytes(model.config, 2, 2**16 + 1, 1, 8)  # 16 MiB: what 2**16 + 1 slots take, whatever the budget
    limit_memory(monkeypatch, need // 2)
    ids = torch.tensor([[1, 2, 3]])
    for decoder in (plain, speculative):
        with pytest.raises(ValueError, match=rf"a batch of 1 prompts needs about .* GiB \([\d,]+ bytes\) for its caches"):
            decoder.generate(ids, 2)
    assert plain.allocations == speculative.verifier.allocations == 0  # refused before allocating
    limit_memory(monkeypatch, 2**40)
    first = plain.generate(ids, 2).sequences
    speculative.generate(ids, 2)
    limit_memory(monkeypatch, need // 2)  # the caches are allocated: a generation in them needs no more
    assert torch.equal(plain.generate(ids, 2).sequences, first) and speculative.generate(ids, 2).stats.new_tokens == 2


def test_generate_checks_max_context_before_loading_the_model(folders, capsys, monkeypatch):  # noqa: F811
    lm, head = str(folders / "lm"), str(folders / "head")  # a 256-position model
    monkeypatch.setattr("mtpc.lm.loading.load_model", no_loading)
    refused(["generate", "--model", lm, "--head", head, "a", "--compile", "--max-context", "4194304"], capsys,
            "--max-context 4,194,304 is more than the 256 positions of the model's context")
    limit_memory(monkeypatch, 1000)
    need = 2 * 1 * 2 * 8 * 257 * 4  # keys and values: 1 layer, 2 kv heads of 8 dims, 257 slots, fp32
    err = refusal(["generate", "--model", lm, "--head", head, "a", "--compile", "--max-context", "256"], capsys)
    assert f"--max-context 256 needs about 0.00 GiB ({need:,} bytes)" in err, err
    assert "0.00 GiB (1,000 bytes) available: give a smaller --max-context" in err, err


def test_a_batched_bench_checks_every_decoders_batch_before_timing_any(setup, monkeypatch):  # noqa: F811
    limit_memory(monkeypatch, 10**5)
    monkeypatch.setattr("mtpc.bench.batch._measure", no_loading)  # refused before anything is timed
    with pytest.raises(InputError, match=r"--batch-size 2 \(ff4\): a batch of 2 prompts needs about [\d.]+ GiB "
                                         r"\([\d,]+ bytes\) for its caches and cycle tensors"):
        run_bench(config(setup, batch_size=2))


# ------------------------------------------------------------------ the compiled-step store

@pytest.mark.skipif(not steps_can_be_stored(), reason="this torch has no aot_compile")
def test_anything_where_a_step_file_should_be_is_a_warning_and_a_fresh_trace(tmp_path, caplog, monkeypatch):
    x = torch.linspace(-1, 1, 6)
    precompiled_step(Scale(2.0).step, (x,), "scale", store=tmp_path / "first")
    [name] = [path.name for path in (tmp_path / "first").iterdir()]  # the step's file, in every store

    def folder():
        stored.mkdir()
        (stored / "inside").write_bytes(b"x")

    def fifo():  # opened to read, a FIFO without a writer would block the run for ever
        os.mkfifo(stored)

    def dangling():
        stored.symlink_to(tmp_path / "nowhere")

    def bound_socket():
        server = socket.socket(socket.AF_UNIX)
        monkeypatch.chdir(stored.parent)  # a socket's path is at most 108 bytes: bound by its name alone
        server.bind(stored.name)
        return server

    for plant in (folder, fifo, dangling, bound_socket):
        store = tmp_path / plant.__name__  # a store of its own: each problem is warned about once a process
        store.mkdir(mode=0o700)
        stored = store / name
        kept = plant()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mtpc.decoding.compiling"):
            step = precompiled_step(Scale(3.0).step, (x,), "scale", store=store)
        assert torch.allclose(step(x), torch.sin(x) * 3), plant.__name__
        assert any("traced afresh" in r.getMessage() and str(stored) in r.getMessage() for r in caplog.records), \
            (plant.__name__, [r.getMessage() for r in caplog.records])
        if kept is not None:
            kept.close()


# ------------------------------------------------------------------ one rule per flag pair

def test_generate_and_bench_refuse_a_tree_with_a_window_alike(folders, tmp_path, capsys, monkeypatch):  # noqa: F811
    lm, head = str(folders / "lm"), str(folders / "head")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a\n")
    monkeypatch.setattr("mtpc.lm.loading.load_model", no_loading)
    lines = []
    for command in (["generate", "--model", lm, "--head", head, "a", "--tree", "6", "--window", "2"],
                    ["bench", "--model", lm, "--heads", head, "--prompts", str(prompts), "--tree", "6", "--window", "2"],
                    ["bench", "--model", lm, "--heads", head, "--prompts", str(prompts), "--tree", "auto", "--window",
                     "adaptive"]):
        err = refusal(command, capsys)
        assert "give one" in err, err
        lines.append(err)
    assert lines[0] == lines[1]  # the same rule, the same words


@pytest.mark.parametrize("peer, shown", [("prompt-lookup:", "''"), ("prompt-lookup:" + "9" * 26, "9" * 26),
                                         ("prompt-lookup:1025", "'1025'"), ("prompt-lookup:²", "'²'"),
                                         ("static:", "takes no argument")])
def test_every_peer_argument_is_checked_with_its_range_before_loading(folders, tmp_path, capsys, monkeypatch,  # noqa: F811
                                                                      peer, shown):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a\n")
    monkeypatch.setattr("mtpc.lm.loading.load_model", no_loading)
    err = refusal(["bench", "--model", str(folders / "lm"), "--heads", str(folders / "head"), "--prompts",
                   str(prompts), "--peers", peer], capsys)
    assert shown in err, err
    if peer.startswith("prompt-lookup"):
        assert "K in prompt-lookup:K" in err and "1..1,024" in err, err


def bad_arguments(model, head):
    """(what, a call that must raise ValueError) for every argument of the two decoders."""
    speculative = {"tree": [-3, 0, 1, 2.5, True, 10**30, TreeBudget(-3), "8"],
                   "window": [-3, 0, 1, 2.5, True, 10**30, "3"],
                   "lookup": [-3, 2.5, True, 10**30, 2**63, "4"],
                   "max_context": [-3, 0, 2.5, True, 2**22, "512"],
                   "draft_temperature": [-3, 0, float("nan"), float("inf"), True, "1"],
                   "lora_layers": [-3, 2.5, True, 10**30],
                   "compile": [1, 2.5, "no", None],
                   "acceptance": ["block", 1, True],
                   "proposers": [None, 3, "lookup", [object()]],
                   "family": ["llama", 1, True]}
    for name, values in speculative.items():
        for value in values:
            yield f"SpeculativeDecoder({name}={value!r})", lambda n=name, v=value: SpeculativeDecoder(model, head, **{n: v})
    for name, values in {"compile": [1, "no", None], "max_context": [-3, 2.5, True, 2**22]}.items():
        for value in values:
            yield f"PlainDecoder({name}={value!r})", lambda n=name, v=value: PlainDecoder(model, **{n: v})
    yield "SpeculativeDecoder(model='x')", lambda: SpeculativeDecoder("x", head)
    yield "SpeculativeDecoder(head=None)", lambda: SpeculativeDecoder(model, None)
    yield "PlainDecoder(model=None)", lambda: PlainDecoder(None)
    for lookup in ({"tokens": 10**6}, {"max_ngram": 10**9}, {"min_ngram": 1.5}, {"decay": "x"}, {"prefer": []}):
        yield f"PromptLookup(**{lookup})", lambda kw=lookup: SpeculativeDecoder(model, head, lookup=PromptLookup(**kw))
    for width in ({"widths": (2, 10**9)}, {"widths": 5}, {"widths": (2, True)}, {"position_cost": "x"}):
        yield f"AdaptiveWidth(**{width})", lambda kw=width: SpeculativeDecoder(model, head, window=AdaptiveWidth(**kw))


def test_every_bad_decoder_argument_is_a_value_error_with_a_message():
    model = tiny_lm(12)
    head = random_head("hmm", 3, 12, seed=2, init_from=model.lm_head.weight)
    wrong = []
    for what, call in bad_arguments(model, head):
        try:
            call()
            wrong.append(f"{what}: accepted")
        except ValueError as e:
            if not str(e):
                wrong.append(f"{what}: a ValueError without a message")
        except Exception as e:  # noqa: BLE001 -- what the test looks for
            wrong.append(f"{what}: {type(e).__name__}: {e}")
    assert not wrong, "\n".join(wrong)
    with pytest.raises(ValueError, match=r"tree must have 2 \.\. \d+ nodes .* got -3"):
        SpeculativeDecoder(model, head, tree=-3)
