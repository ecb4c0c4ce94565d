"""The compiled cycle step kept on disk (`mtpc.decoding.compiling.precompiled_step`): a later process (here a
later decoder) loads the traced step instead of tracing it again, the loaded step reads the weights of the
decoder it runs for (none are baked in), and a stored file that is damaged, writable by others, or whose
guards refuse the call is compiled again."""

import os

import pytest
import torch

from mtpc.sampling import Sampling

from mtpc import SpeculativeDecoder
from mtpc.decoding import AdaptiveWidth
from mtpc.decoding.compiling import precompiled_step, savable_guards, steps_can_be_stored
from test_decode import cyclic_lm, oracle_tables, prompts, random_head

pytestmark = pytest.mark.usefixtures("one_thread")


class Scale:
    """A step of the shape the decoder's is: a method reading its owner's tensor."""

    def __init__(self, k: float):
        self.k = torch.tensor(k)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * self.k


def sine(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    return torch.sin(x) * scale  # torch guards the default, read through the closure


def wrapped(function):
    """`function` inside an instance of a class made in a function, called through the class's closure, as
    the `kernels` package wraps transformers' functions (Llama's rotary embedding, from transformers 5.25)."""

    class Func(torch.nn.Module):
        def forward(self, *args):
            return function(*args)

    return Func()


class WrappedScale(Scale):
    """A `Scale` whose step calls a wrapped function held by its owner."""

    def __init__(self, k: float, cells: int = 0):
        super().__init__(k)
        self.sine = wrapped(sine)
        for cell in range(cells):  # a wrapper holding a tensor keeps its type check, which cannot be saved
            self.sine.register_buffer(f"cell{cell}", torch.zeros(1))

    def step(self, x: torch.Tensor) -> torch.Tensor:
        return self.sine(x) * self.k


# what stores a step: torch's ahead-of-time compile, which older torch (2.11) lacks
needs_store = pytest.mark.skipif(not steps_can_be_stored(), reason="this torch has no aot_compile")


def no_compiling(*args, **kwargs):
    raise AssertionError("a stored step was compiled again")


@pytest.mark.slow  # a cold compile of the whole step: 20 s
@needs_store
def test_a_second_decoder_loads_the_step_and_runs_its_own_weights(monkeypatch):
    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    first = random_head("btree", n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n, wrong_last=True))
    ids = prompts(vocab, 1, seed=9)[0]
    SpeculativeDecoder(model, first, compile=True).generate(ids, 9, sampling=Sampling(1.0))  # compiled, or loaded
    second = random_head("btree", n, vocab, seed=4, std=0.3, init_from=oracle_tables(model, n))  # other weights
    eager = SpeculativeDecoder(model, second).generate(ids, 19, sampling=Sampling(1.0),
                                                       generator=torch.Generator().manual_seed(5))
    monkeypatch.setattr(torch, "compile", no_compiling)
    loaded = SpeculativeDecoder(model, second, compile=True).generate(ids, 19, sampling=Sampling(1.0),
                                                                       generator=torch.Generator().manual_seed(5))
    assert torch.equal(loaded.sequences, eager.sequences)
    baked = SpeculativeDecoder(model, first).generate(ids, 19, sampling=Sampling(1.0),
                                                      generator=torch.Generator().manual_seed(5))
    assert not torch.equal(baked.sequences, eager.sequences)  # the first head's weights would show


@pytest.mark.slow  # a cold compile of the plain step into a store of its own
@needs_store
def test_a_compiled_plain_step_is_announced_stored_and_loaded_by_the_next_plain_decoder(tmp_path, monkeypatch, caplog):
    from mtpc.decoding import PlainDecoder

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # an empty step store
    model = cyclic_lm(12)
    ids = prompts(12, 1, seed=9)[0]
    eager = PlainDecoder(model).generate(ids, 19).sequences
    with caplog.at_level("WARNING", logger="mtpc.decoding.compiling"):
        assert torch.equal(PlainDecoder(model, compile=True).generate(ids, 19).sequences, eager)
    said = [r.getMessage() for r in caplog.records if "compiling" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("mtpc: compiling the plain decoding step for 1 row"), said
    caplog.clear()
    monkeypatch.setattr(torch, "compile", no_compiling)
    with caplog.at_level("WARNING", logger="mtpc.decoding.compiling"):
        assert torch.equal(PlainDecoder(model, compile=True).generate(ids, 19).sequences, eager)
    assert not caplog.records  # loaded from the store: nothing compiled, nothing said


def counting_compiles(monkeypatch) -> list:
    compile_, compiles = torch.compile, []

    def counted(*args, **kwargs):
        compiles.append(1)
        return compile_(*args, **kwargs)

    monkeypatch.setattr(torch, "compile", counted)
    return compiles


@needs_store
def test_a_stored_step_is_loaded_with_its_owners_tensors_and_its_guards(tmp_path, monkeypatch, caplog):
    x = torch.linspace(-1, 1, 6)
    with caplog.at_level("WARNING", logger="mtpc.decoding.compiling"):
        step = precompiled_step(Scale(2.0).step, (x,), "scale", store=tmp_path, label="the scale step")
    # announced before it compiled, as kept for later processes
    assert [r.getMessage() for r in caplog.records if "compiling" in r.getMessage()] == [
        "mtpc: compiling the scale step; kept in the step store if torch can save it: later processes load it in "
        "seconds"]
    assert torch.allclose(step(x), torch.sin(x) * 2)
    caplog.clear()
    with monkeypatch.context() as patch, caplog.at_level("WARNING", logger="mtpc.decoding.compiling"):
        patch.setattr(torch, "compile", no_compiling)
        assert torch.allclose(precompiled_step(Scale(3.0).step, (x,), "scale", store=tmp_path)(x), torch.sin(x) * 3)
    assert not caplog.records  # loaded: nothing to announce
    compiles = counting_compiles(monkeypatch)
    y = torch.linspace(-1, 1, 7)  # a shape the stored step's guards refuse: compiled for it
    assert torch.allclose(precompiled_step(Scale(3.0).step, (y,), "scale", store=tmp_path)(y), torch.sin(y) * 3)
    assert len(compiles) == 1
    # guards checked once for a run of calls of one shape: the step without them, or None when they refuse
    assert step.checked(y) is None and torch.allclose(step.checked(x)(x), torch.sin(x) * 2)


@needs_store
def test_a_step_through_a_wrapped_function_is_stored_and_loaded(tmp_path, monkeypatch, caplog):
    x = torch.linspace(-1, 1, 6)
    assert torch.allclose(precompiled_step(WrappedScale(2.0).step, (x,), "wrapped", store=tmp_path)(x), torch.sin(x) * 2)
    assert [path.suffix for path in tmp_path.iterdir()] == [".bin"]
    with monkeypatch.context() as patch:
        patch.setattr(torch, "compile", no_compiling)
        loaded = precompiled_step(WrappedScale(3.0).step, (x,), "wrapped", store=tmp_path)
        assert loaded.aot is not None and torch.allclose(loaded(x), torch.sin(x) * 3)
    # a wrapper with state keeps its type check: not saved, and a marker stops later processes from trying
    compiles = counting_compiles(monkeypatch)
    holding = precompiled_step(WrappedScale(2.0, cells=1).step, (x,), "holding", store=tmp_path)
    assert holding.aot is None and torch.allclose(holding(x), torch.sin(x) * 2)
    assert sorted(path.suffix for path in tmp_path.iterdir()) == [".bin", ".unsaved"]
    with caplog.at_level("WARNING", logger="mtpc.decoding.compiling"):
        precompiled_step(WrappedScale(2.0, cells=1).step, (x,), "holding", store=tmp_path)
    assert len(compiles) == 3  # the attempt to save, its fallback, and only the fallback the second time
    assert "for this process only: another traces it again" in caplog.records[-1].getMessage()  # not "kept"


@needs_store
def test_a_step_known_unsavable_is_traced_once_and_never_stored(tmp_path, monkeypatch, caplog):
    """`savable=False` (a decide step drafting under vmap): one trace for this process, no attempt to save it
    (which traced a SmolLM2 tree's step twice), nothing written, and the line says so."""
    x = torch.linspace(-1, 1, 6)
    compiles = counting_compiles(monkeypatch)
    with caplog.at_level("WARNING", logger="mtpc.decoding.compiling"):
        step = precompiled_step(Scale(2.0).step, (x,), "scale", store=tmp_path, label="the scale step", savable=False)
        assert step.aot is None and torch.allclose(step(x), torch.sin(x) * 2)
    assert len(compiles) == 1 and list(tmp_path.iterdir()) == []
    assert "for this process only" in caplog.records[-1].getMessage()


def test_decide_steps_that_draft_under_vmap_are_not_offered_to_the_store():
    from mtpc.decoding.compiling import StepVariant
    from mtpc.decoding.cycle.decoder import decide_savable

    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    head = random_head("btree", n, vocab, seed=3, std=0.3)
    chain, tree = SpeculativeDecoder(model, head), SpeculativeDecoder(model, head, tree=5)
    one, eight = (StepVariant(Sampling(1.0), 1, 1, n, batch) for batch in (1, 8))
    assert decide_savable(chain, one) and not decide_savable(chain, eight) and not decide_savable(tree, one)


def test_saved_guards_leave_out_only_what_torch_cannot_rebuild():
    from torch._dynamo.types import GuardFilterEntry

    def entry(name, value, kind, is_global=False):
        return GuardFilterEntry(name=name, has_value=True, value=value, guard_type=kind, derived_guard_types=(),
                                is_global=is_global, orig_guard=None)

    closure = "dict(type(L['self'].sine).__dict__)['forward'].__closure__[0].cell_contents"
    holding = WrappedScale(1.0, cells=1).sine
    kept = savable_guards([
        entry("L['x']", torch.ones(2), "TENSOR_MATCH"),
        entry(f"{closure}.__defaults__", (1.0,), "SEQUENCE_LENGTH"),  # what a closure holds: left out
        entry(f"{closure}.weight", torch.ones(2), "TENSOR_MATCH"),  # a tensor in a closure: kept
        entry("L['self'].sine", wrapped(sine), "TYPE_MATCH"),  # a stateless wrapper's class: left out
        entry("L['self'].sine", holding, "TYPE_MATCH"),  # a wrapper with a buffer: kept (and not savable)
        entry("L['self'].k", Scale(1.0), "TYPE_MATCH"),  # a class torch can import: kept
        entry("G['sine']", sine, "TYPE_MATCH", is_global=True),  # globals: left out, as torch's default does
        entry("L['self']", None, "ID_MATCH"),
    ])
    assert kept == [True, False, True, False, True, True, False, False]


@pytest.mark.slow  # two cold compiles of the whole step
def test_a_compiled_decoder_checks_its_steps_guards_at_each_generation():
    """A generation runs its steps without per-call guards, so each generation checks them first: here a
    constant the step was traced with (the adaptive width's cost of a verified position) changes between
    two generations of the same variant, and the second compiles again and decodes as the eager decoder
    does (the first graph would choose widths by the old cost); then the head's weights change dtype, and
    the third decodes as the eager decoder does too."""
    vocab, n = 12, 4
    model = cyclic_lm(vocab)
    head = random_head("btree", n, vocab, seed=3, std=0.3, init_from=oracle_tables(model, n, wrong_last=True))
    ids = prompts(vocab, 1, seed=9)[0]
    decoder = SpeculativeDecoder(model, head, window=AdaptiveWidth(position_cost=0.0), compile=True)
    decoder.generate(ids, 9, sampling=Sampling(1.0))
    decoder.drafter.position_cost = 2.0  # every window now verifies its narrowest width
    sample = {"sampling": Sampling(1.0), "generator": torch.Generator().manual_seed(2)}
    again = decoder.generate(ids, 19, **sample)
    eager = SpeculativeDecoder(model, head, window=AdaptiveWidth(position_cost=2.0))
    sample["generator"] = torch.Generator().manual_seed(2)
    assert torch.equal(again.sequences, eager.generate(ids, 19, **sample).sequences)
    assert set(again.stats.width_per_cycle) <= {0, 2}
    head.to(torch.float64)  # weights of another dtype, which the guards torch saves do not check
    sample["generator"] = torch.Generator().manual_seed(3)
    wider = decoder.generate(ids, 19, **sample)
    sample["generator"] = torch.Generator().manual_seed(3)
    assert torch.equal(wider.sequences, eager.generate(ids, 19, **sample).sequences)


@pytest.mark.slow
@needs_store
def test_a_stored_step_that_cannot_be_trusted_is_compiled_again(tmp_path, monkeypatch):
    y = torch.linspace(-1, 1, 7)
    precompiled_step(Scale(2.0).step, (y,), "scale", store=tmp_path)
    [stored] = tmp_path.iterdir()
    compiles = counting_compiles(monkeypatch)
    os.chmod(stored, 0o666)  # others could have written it: not unpickled
    precompiled_step(Scale(3.0).step, (y,), "scale", store=tmp_path)
    stored.write_bytes(b"not a pickle")
    os.chmod(stored, 0o600)
    precompiled_step(Scale(3.0).step, (y,), "scale", store=tmp_path)
    assert len(compiles) == 2
    precompiled_step(Scale(3.0).step, (y,), "scale", store=tmp_path)  # the last one stored a good file again
    assert len(compiles) == 2
    precompiled_step(Scale(3.0).step, (y,), None, store=tmp_path / "none")  # nothing names its code: not stored
    assert len(compiles) == 3 and not (tmp_path / "none").exists()
