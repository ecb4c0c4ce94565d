"""The phase clock: stamps inside the decoding loop (from module hooks) summed into draft / verify / accept phases."""

from __future__ import annotations

import time
from typing import Sequence

import torch

from ..lm.backbone import SplitBackbone

__all__ = ["PHASES", "PhaseClock", "split_phases", "backbone_marks"]

PHASES = ("head", "circuit", "backbone", "accept")


# --------------------------------------------------------------------------- timing inside the loop

class PhaseClock:
    """Stamps points of the decoding loop through module hooks on the head (before/after its forward),
    the backbone's embedding (a backbone call starts) and its final norm / LM head (a backbone call
    may end there). CPU: `perf_counter`; CUDA: events, read after a synchronize.

    Use as a context manager around one generation; `split_phases(clock.times())` sums the phases.
    """

    def __init__(self, head: torch.nn.Module | None, embed: torch.nn.Module | None, ends: Sequence[torch.nn.Module],
                 cuda: bool):
        self.cuda = cuda
        self.kinds: list[str] = []
        self.marks: list = []
        self._targets = (head, embed, ends)
        self._handles = []

    def stamp(self, kind: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())
        self.kinds.append(kind)

    def _hook(self, kind: str):
        return lambda *args: self.stamp(kind)

    def __enter__(self) -> "PhaseClock":
        head, embed, ends = self._targets
        if head is not None:
            self._handles.append(head.register_forward_pre_hook(self._hook("head_start")))
            self._handles.append(head.register_forward_hook(self._hook("head_end")))
        if embed is not None:  # None: the caller stamps its backbone calls (a compiled call has no hooks)
            self._handles.append(embed.register_forward_pre_hook(self._hook("backbone_start")))
        for module in ends:
            self._handles.append(module.register_forward_hook(self._hook("backbone_end")))
        return self

    def __exit__(self, *exc) -> None:
        self.stamp("end")
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def times(self) -> list[tuple[str, float]]:
        """`(kind, seconds)` for every stamp, seconds measured from the first stamp."""
        if not self.marks:
            return []
        if self.cuda:
            torch.cuda.synchronize()
            first = self.marks[0]
            return [(k, first.elapsed_time(e) / 1e3) for k, e in zip(self.kinds, self.marks)]
        return [(k, t - self.marks[0]) for k, t in zip(self.kinds, self.marks)]


def split_phases(stamps: Sequence[tuple[str, float]]) -> tuple[dict[str, float], float]:
    """Sum the time between consecutive stamps into `PHASES`; the prefill (everything up to the end of
    the first backbone call) is left out. Returns (seconds per phase, decoding seconds).

    An interval is attributed to what was running since its opening stamp: after `head_start` the
    head, after `head_end` the circuit, after `backbone_start` (or a `backbone_end` followed by another
    end of the same call) the backbone, after the last `backbone_end` of a call the acceptance."""
    totals = dict.fromkeys(PHASES, 0.0)
    prefill_end = _end_of_call(stamps, 0)
    if prefill_end is None:
        return totals, 0.0
    for i in range(prefill_end, len(stamps) - 1):
        kind, t = stamps[i]
        nxt_kind, nxt_t = stamps[i + 1]
        if kind == "head_start":
            phase = "head"
        elif kind == "head_end":
            phase = "circuit"
        elif kind == "backbone_start" or kind == "backbone_end" and nxt_kind == "backbone_end":
            phase = "backbone"
        else:
            phase = "accept"
        totals[phase] += nxt_t - t
    return totals, stamps[-1][1] - stamps[prefill_end][1]


def _end_of_call(stamps, start: int) -> int | None:
    """Index of the last `backbone_end` of the backbone call opened at or after `start`."""
    i = next((j for j in range(start, len(stamps)) if stamps[j][0] == "backbone_start"), None)
    if i is None:
        return None
    end = None
    for j in range(i + 1, len(stamps)):
        if stamps[j][0] != "backbone_end":
            break
        end = j
    return end


def backbone_marks(model: torch.nn.Module) -> tuple[torch.nn.Module, list[torch.nn.Module]]:
    """The modules whose hooks open (embedding) and may close (final norm, LM head) a backbone call."""
    parts = SplitBackbone(model).parts
    return parts.embed, [parts.norm, parts.lm_head]
