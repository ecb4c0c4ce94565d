"""Hostile model configurations and stored steps found by a second attacker's pass over part 4 (issue 61):
a config's window sizes and other integers are checked before transformers builds from them, and a
stored compiled step past any real step's size is refused unread."""

import json
import os
import shutil
from pathlib import Path

import pytest

from _tiny import save_tiny_lm
from mtpc.lm import loading
from mtpc.step_store import MAX_STEP_BYTES, UntrustedStore, read_stored_step
from mtpc.errors import InputError


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return Path(save_tiny_lm(tmp_path_factory.mktemp("lm")))


@pytest.mark.parametrize("window, fragment", [
    (10**99, "sliding_window must be in 1..4,194,304, got a huge integer"),  # was: an overflow inside the model
    (-5, "sliding_window must be in 1..4,194,304, got -5"),  # was: an arange with an inconsistent step
])
def test_a_sliding_window_out_of_range_is_refused_before_building(lm, tmp_path, window, fragment):
    model = Path(shutil.copytree(lm, tmp_path / "m"))
    config = json.loads((model / "config.json").read_text())
    config.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=window)
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=fragment):
        loading.model_info(model)


def test_another_integer_past_any_size_is_refused(lm, tmp_path):
    model = Path(shutil.copytree(lm, tmp_path / "m"))
    config = json.loads((model / "config.json").read_text())
    config["bos_token_id"] = 10**30
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="'bos_token_id' is a huge integer"):
        loading.model_info(model)


def test_a_stored_step_larger_than_any_step_is_refused_unread(tmp_path):
    step = tmp_path / "step.bin"
    with open(step, "wb") as f:
        f.truncate(MAX_STEP_BYTES + 1)  # sparse: reading it whole took 3.6 GB
    os.chmod(step, 0o600)
    with pytest.raises(UntrustedStore, match="more than the 268,435,456 of a step"):
        read_stored_step(step)
    step.write_bytes(b"a step")
    assert read_stored_step(step) == b"a step"
