"""What decoding costs on the machine at hand, measured once and kept: the seconds of one verify call over each
width (`verify_call_seconds`, the curve `--tree auto` and the auto choice read), and the seconds of one draft.

A verify curve depends on the model's shape, the dtype, the device (the CPU's model and instruction sets, or the
GPU) and the thread count, not on the weights: it is kept in the compiled-step store (`mtpc.step_store`,
under the same trust rules: a file is read only from folders no one else could have written, and it is JSON,
bounded, never unpickled) under a key of exactly those, so a second process on the same machine reads it in
milliseconds instead of measuring for seconds. What a plain step and a cycle's work besides its verify call
(the draft, the acceptance, the host) cost depends on the head too, and is measured by decoding a few tokens
each time (`cycle_costs`): in eager mode on a CPU a SmolLM2 cycle spends tens of milliseconds outside the verify
call, which the verify curve alone does not see.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from ... import hardware
from ...files import atomic_write, parse_json
from ...step_store import UntrustedStore, check_store, read_stored_step, step_store
from ...heads.head import MTPHead
from ...lm.backbone import SplitBackbone
from ..drafts.trees import AUTO_TREE_WIDTHS, call_cost, checked_call_seconds
from ..cycle.verify import verify_call_seconds

__all__ = ["MachineCosts", "machine_costs", "CycleCosts", "cycle_costs", "plain_step_seconds", "cost_key"]

COSTS_FOLDER = "costs"  # below the step store
MAX_COST_BYTES = 64 * 1024  # a cost file holds a few widths' seconds


@dataclass(frozen=True)
class MachineCosts:
    """A verify curve (width -> seconds of one call), where it came from (`measured` now or read from `path`),
    and the machine it describes (`machine`: `hardware.machine_summary`, the dtype and thread count)."""

    call_seconds: dict[int, float]
    measured: bool
    machine: str
    path: Path | None

    def describe(self) -> str:
        curve = ", ".join(f"{w}: {s * 1e3:.1f}" for w, s in sorted(self.call_seconds.items()))
        return f"verify ms by width {curve}, {'measured now' if self.measured else 'measured before'} ({self.machine})"


def cost_key(config: dict, dtype: torch.dtype, device: torch.device, threads: int, widths: tuple[int, ...]) -> dict:
    """What a verify curve depends on: the model's shape (its config, less where it was loaded from), the dtype,
    the device (the CPU's name, flags and oneDNN's instruction-set limit, or the GPU's name), the torch threads,
    torch's version, the widths."""
    shape = {k: v for k, v in sorted(config.items()) if not k.startswith("_") and k not in ("name_or_path",)}
    if device.type == "cuda":
        where = {"gpu": torch.cuda.get_device_name(device)}
    else:
        where = {"cpu": hardware.cpu_name(), "flags": sorted(hardware.cpu_flags()), "isa_limit": hardware.isa_limit()}
    return {"model": shape, "dtype": str(dtype), "device": where, "threads": threads, "torch": torch.__version__,
            "widths": list(widths)}


def machine_costs(backbone: SplitBackbone, dtype: torch.dtype, device: torch.device,
                  widths: tuple[int, ...] = AUTO_TREE_WIDTHS, store: Path | None = None) -> MachineCosts:
    """This model's verify curve on this machine: read from the store when it holds one for the same key,
    else measured now (`verify_call_seconds`, a few seconds) and kept there."""
    threads = torch.get_num_threads()
    key = cost_key(backbone.config.to_dict(), dtype, device, threads, widths)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:32]
    summary = f"{hardware.machine_summary(str(device))}, {str(dtype).removeprefix('torch.')}, {threads} threads"
    folder = (store if store is not None else step_store()) / COSTS_FOLDER
    path = folder / f"{digest}.json"
    stored = _read(folder, path, key)
    if stored is not None:
        return MachineCosts(stored, False, summary, path)
    seconds = verify_call_seconds(backbone, widths)
    saved = _write(folder, path, key, seconds)
    return MachineCosts(seconds, True, summary, path if saved else None)


@dataclass(frozen=True)
class CycleCosts:
    """What decoding costs besides the verify curve, measured by decoding: `step`, the median seconds of a
    `PlainDecoder` step; `overhead`, a cycle's work besides its verify call (the draft, the acceptance, the host's
    reads) in plain steps: the median cycle of the head's default chain over `step`, less its verify call on the
    curve (scaled so that one position is one step: the curve's calls and a decoder's steps differ by a constant
    the curve does not care about)."""

    step: float
    overhead: float


def cycle_costs(model: torch.nn.Module, head: MTPHead, call_seconds: dict[int, float], tokens: int = 16,
                prompt_length: int = 64) -> CycleCosts:
    """Decode `tokens` tokens after a random prompt plainly and with the head's default chain (greedy; the
    drafts of a random prompt are rejected, so every cycle is timed alike), after a warm-up of each."""
    from ..cycle.decoder import SpeculativeDecoder
    from ..plain import PlainDecoder

    prompt = _random_prompt(model, prompt_length)
    step, cycle = (_median(_timed(decoder, prompt, tokens)) for decoder in (PlainDecoder(model),
                                                                           SpeculativeDecoder(model, head)))
    width = max(head.num_variables, 2)
    relative_call = call_cost(call_seconds, width) / call_cost(call_seconds, 1)
    return CycleCosts(step, max(cycle / step - relative_call, 0.0))


def plain_step_seconds(decoder, prompt_length: int = 64, tokens: int = 16) -> float:
    """A `PlainDecoder`'s seconds a token (eager or compiled, as it decodes: a compiled one compiles or loads its
    step here), one row decoding `tokens` tokens after a random prompt of `prompt_length` tokens, after a
    warm-up of the same: the timed steps' mean, as a generation's tokens a second count them."""
    stats = _timed(decoder, _random_prompt(decoder.backbone.model, prompt_length), tokens)
    return statistics.fmean(stats.cycle_seconds[1:] or stats.cycle_seconds)


def _random_prompt(model: torch.nn.Module, length: int) -> torch.Tensor:
    device = next(model.parameters()).device
    vocab = model.get_output_embeddings().weight.shape[0]
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(0)).to(device)


def _median(stats) -> float:
    """A generation's median cycle, its first (which may pay for the first call's work) left out."""
    return statistics.median(stats.cycle_seconds[1:] or stats.cycle_seconds)


def _timed(decoder, prompt: torch.Tensor, tokens: int):
    """The stats of a second generation of `tokens` tokens after `prompt` (the first warms every shape)."""
    decoder.generate(prompt, tokens)
    return decoder.generate(prompt, tokens).stats


def _read(folder: Path, path: Path, key: dict) -> dict[int, float] | None:
    """The stored curve for `key`, or None: no file, another key (a digest collision), a damaged file, or a store
    someone else could have written (then it is not read)."""
    try:
        real = check_store(folder)
        data = read_stored_step(real / path.name)
    except UntrustedStore:
        return None
    if data is None or len(data) > MAX_COST_BYTES:
        return None
    try:
        record = parse_json(data, str(path))
        if not isinstance(record, dict) or record.get("key") != json.loads(json.dumps(key, default=str)):
            return None
        return checked_call_seconds({int(w): s for w, s in record["call_seconds"].items()})
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _write(folder: Path, path: Path, key: dict, seconds: dict[int, float]) -> bool:
    """Keep the curve (a read-only or untrusted store: not kept, nothing else changes)."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        real = check_store(folder)
        record = {"key": key, "call_seconds": {str(w): s for w, s in seconds.items()}}
        atomic_write(real / path.name, json.dumps(record, default=str))
        return True
    except (UntrustedStore, OSError):
        return False
