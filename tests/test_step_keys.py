"""A compiled step's key (`mtpc.decoding.compiling.derived_identity`) is derived from what the step closes over, not
listed by hand: every setting of a decoder changes it, decoders built alike share it (so a later process loads
the stored step), and code the key cannot follow (a user's class) keeps the step out of the store."""

from dataclasses import fields, replace

import pytest
import torch

from mtpc import PlainDecoder, SpeculativeDecoder
from mtpc.decoding import AcceptanceRule, AdaptiveWidth, TreeBudget
from mtpc.decoding.compiling import (PlainVariant, StepVariant, Undescribable, VerifyVariant, described, tensor_layout)
from mtpc.decoding.cycle.data import CycleSettings
from mtpc.decoding.cycle.decoder import step_identity, verify_identity
from mtpc.decoding.drafts.layout import WindowLayout
from mtpc.decoding.plain import plain_identity
from mtpc.lm.lora import attach_draft_lora
from mtpc.sampling import GREEDY, Sampling
from test_decode import cyclic_lm, random_head

VOCAB, N = 12, 4


@pytest.fixture(scope="module")
def model():
    return cyclic_lm(VOCAB)


@pytest.fixture(scope="module")
def head():
    return random_head("btree", N, VOCAB, seed=3)


def keys(decoder: SpeculativeDecoder, sampling: Sampling = GREEDY, width: int = 3) -> tuple:
    """The decide step's and the verify step's keys for one variant of `decoder`, its caches allocated (their
    length is in the keys) as a generation's start allocates them."""
    if decoder.verifier.max_len == 0:
        decoder.verifier.start(torch.zeros(1, 2, dtype=torch.long), [0], 8)
    layout = tensor_layout(decoder.backbone.model) + tensor_layout(decoder.head)
    return (step_identity(decoder, StepVariant(sampling, 1, 0, width, 1), layout),
            verify_identity(decoder, VerifyVariant(0, width, 1), tensor_layout(decoder.backbone.model)))


class OwnRule(AcceptanceRule):
    """A user's acceptance rule: its code is not the library's, so no stored step may stand for it."""


# Another value of every field of the settings and the layout; a field added to either fails the test below
# until it is given one here, and then it must change the keys.
OTHER_SETTINGS = {"acceptance": AcceptanceRule(), "draft_temperature": 0.5, "lora_layers": 1}
OTHER_LAYOUT = {"n": 5, "widths": (2, 4), "position_cost": 0.3, "tree": TreeBudget(6), "lookup_tokens": 3,
                "proposer_spans": (7,)}


def test_every_setting_and_every_layout_field_changes_the_decide_steps_key(model, head):
    decoder = SpeculativeDecoder(model, head, window=4)
    base_decide, base_verify = keys(decoder)
    assert base_decide is not None and base_verify is not None
    assert set(OTHER_SETTINGS) | {"layout"} == {f.name for f in fields(CycleSettings)}
    assert set(OTHER_LAYOUT) == {f.name for f in fields(WindowLayout)}
    settings = decoder.settings
    changed = {name: replace(settings, **{name: value}) for name, value in OTHER_SETTINGS.items()}
    changed |= {f"layout.{name}": replace(settings, layout=replace(settings.layout, **{name: value}))
                for name, value in OTHER_LAYOUT.items()}
    for name, other in changed.items():
        assert other != settings, name
        decoder.settings = other
        decide, verify = keys(decoder)
        assert decide != base_decide, f"{name} leaves the decide step's key as it was"
        # the verify step reads the layout and the draft path's layers, not the acceptance or the draft's
        # temperature: decoders that differ only there share it
        shares = name in ("acceptance", "draft_temperature")
        assert (verify == base_verify) == shares, name
    decoder.settings = settings
    assert keys(decoder) == (base_decide, base_verify)


def test_the_variant_and_the_tensors_change_the_key_and_the_allocation_does_not(model, head):
    decoder = SpeculativeDecoder(model, head, window=4)
    layout = tensor_layout(model) + tensor_layout(head)
    key = step_identity(decoder, StepVariant(GREEDY, 1, 0, 3, 1), layout)
    assert step_identity(decoder, StepVariant(GREEDY, 1, 5, 3, 1), layout) == key  # only this process's caches
    for variant in (StepVariant(Sampling(1.0), 1, 0, 3, 1), StepVariant(Sampling(1.0, top_k=3), 1, 0, 3, 1),
                    StepVariant(GREEDY, 2, 0, 3, 1), StepVariant(GREEDY, 1, 0, 4, 1), StepVariant(GREEDY, 1, 0, 3, 2)):
        assert step_identity(decoder, variant, layout) != key, variant
    wider = layout[:-1] + ((layout[-1][0], (99,), layout[-1][2], layout[-1][3]),)
    assert step_identity(decoder, StepVariant(GREEDY, 1, 0, 3, 1), wider) != key


def test_decoders_built_alike_share_their_keys_and_each_argument_changes_them(model, head):
    """What a later process relies on to load a stored step, and what keeps it from loading another's."""
    base = keys(SpeculativeDecoder(model, head, window=4))
    assert keys(SpeculativeDecoder(model, head, window=4)) == base
    assert keys(SpeculativeDecoder(model, random_head("btree", N, VOCAB, seed=4), window=4)) == base  # weights only
    others = {
        "window": dict(window=3), "adaptive": dict(window=AdaptiveWidth(position_cost=0.2)),
        "tree": dict(tree=5), "lookup": dict(lookup=3), "acceptance": dict(acceptance=AcceptanceRule()),
        "draft_temperature": dict(draft_temperature=0.7),
    }
    for name, arguments in others.items():
        settings = {"window": 4, **arguments} if "tree" not in arguments and "window" not in arguments else arguments
        assert keys(SpeculativeDecoder(model, head, **settings))[0] != base[0], name
    compiled = keys(SpeculativeDecoder(model, head, window=4, compile=True))  # caches of the model's whole context
    assert compiled[0] != base[0] and compiled == keys(SpeculativeDecoder(model, head, window=4, compile=True))
    assert keys(SpeculativeDecoder(model, head, window=4, compile=True, max_context=32)) != compiled
    other_circuit = random_head("cp", N, VOCAB, seed=3)
    assert keys(SpeculativeDecoder(model, other_circuit, window=4))[0] != base[0]
    other_model = cyclic_lm(VOCAB, seed=1)
    other_model.config.rms_norm_eps = 1e-3  # a configuration value the traced step reads as a constant
    assert keys(SpeculativeDecoder(other_model, head, window=4)) != base


def test_a_lora_draft_path_is_in_the_key(head):
    plain_keys = keys(SpeculativeDecoder(cyclic_lm(VOCAB), head, window=4))
    adapted = attach_draft_lora(cyclic_lm(VOCAB), 1, rank=2)
    lora_keys = keys(SpeculativeDecoder(adapted, head, 1, window=4))
    assert None not in lora_keys and lora_keys[0] != plain_keys[0] and lora_keys[1] != plain_keys[1]


def test_code_the_key_cannot_follow_keeps_the_step_in_its_process(model, head):
    assert keys(SpeculativeDecoder(model, head, window=4, acceptance=OwnRule()))[0] is None

    class OwnNorm(torch.nn.Module):  # a user's layer inside a known model
        def forward(self, x):
            return x

    foreign = cyclic_lm(VOCAB)
    foreign.model.layers[0].extra = OwnNorm()
    assert keys(SpeculativeDecoder(foreign, head, window=4)) == (None, None)


def plain_key(model, max_context: int, variant: PlainVariant) -> str | None:
    decoder = PlainDecoder(model, max_context=max_context)
    decoder.generate(torch.zeros(1, 2, dtype=torch.long), 1)  # its caches allocated: their length is in the key
    return plain_identity(decoder, variant, tensor_layout(model))


def test_the_plain_steps_key_follows_its_caches_and_model(model):
    key = plain_key(model, 64, PlainVariant(0, 1))
    assert key is not None and plain_key(model, 64, PlainVariant(3, 1)) == key
    assert plain_key(model, 32, PlainVariant(0, 1)) != key
    assert plain_key(model, 64, PlainVariant(0, 2)) != key


def test_described_values():
    assert described(torch.zeros(2, 3)) == described(torch.ones(2, 3)) == ("tensor", (2, 3), "torch.float32", "cpu")
    assert described({"b": 1, "a": (2, None)}) == described({"a": [2, None], "b": 1})
    assert described(TreeBudget(5)) != described(TreeBudget(5, 3))
    with pytest.raises(Undescribable):
        described(OwnRule())
    deep = []
    for _ in range(40):
        deep = [deep]
    with pytest.raises(Undescribable, match="nested deeper"):
        described(deep)
