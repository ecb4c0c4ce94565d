"""The named data of a speculative cycle: its settings, what the step returns, the one tensor the host reads,
and the host's view of each row.

A cycle's decide step (`SpeculativeDecoder.decide_step`) returns a `StepOutput` on the device; the host reads its
`packet` once (`CyclePacket.read`) and keeps, per row, a `Row`: the tokens it added, its budget left,
whether it is live, and its next window's first token and verify width. `Pending` is the next cycle's
windows as they sit on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..drafts.drafting import Window
from ..drafts.layout import WindowLayout
from .acceptance import AcceptanceRule
from .host import HostReads

__all__ = ["CycleSettings", "CyclePacket", "Pending", "Row", "StepOutput"]


@dataclass(frozen=True)
class CycleSettings:
    """What a decoder's cycle steps read besides their arguments and the model's and head's tensors: the window
    `layout`, the `acceptance` rule, the `draft_temperature` setting (None: the target's) and the draft path's
    `lora_layers`. A compiled step's key holds it whole (`compiling.derived_identity`), so a setting added
    here cannot leave a stale stored step loadable."""

    layout: WindowLayout
    acceptance: AcceptanceRule
    draft_temperature: float | None
    lora_layers: int


@dataclass
class StepOutput:
    """What `decide_step` returns, on the device: the `packet` the host reads, the next windows and the
    draft hidden states `hidden` `[B, d]` at each row's last committed token (a host proposer drafts from
    it)."""

    packet: torch.Tensor
    window: Window
    hidden: torch.Tensor


torch.utils._pytree.register_dataclass(StepOutput)


@dataclass
class CyclePacket:
    """The one tensor a cycle reads to the host, `[B, 3 + W]` long, and its fields once read, per row:
    how many tokens the window committed, the next window's `x_0` and verify width, and the window's
    tokens (the first `accepted[b]` are row `b`'s committed ones)."""

    accepted: list[int]
    next_first: list[int]
    next_width: list[int]
    tokens: list[list[int]]

    @staticmethod
    def pack(accepted: torch.Tensor, next_window: Window, tokens: torch.Tensor) -> torch.Tensor:
        heads = torch.stack([accepted, next_window.tokens[:, 0], next_window.width], 1)  # [B, 3]
        return torch.cat([heads, tokens], 1)

    @classmethod
    def read(cls, host_reads: HostReads, packet: torch.Tensor) -> "CyclePacket":
        rows = host_reads(packet)
        return cls([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3:] for r in rows])


@dataclass
class Pending:
    """The next cycle's windows on the device (the circuit's, one per row) and the draft hidden states
    `[B, d]` at each row's last committed token."""

    window: Window
    hidden: torch.Tensor


@dataclass
class Row:
    """The host's view of one row of a generation: `new` its tokens so far, `left` its budget, `live`
    whether it goes on, and its pending window's `first` token (`x_0`, already decided) and verify `width`."""

    left: int
    first: int = 0
    width: int = 0
    live: bool = True
    new: list[int] = field(default_factory=list)

    def ends_with_first(self, eos: set[int]) -> bool:
        """Its `x_0` is its last token (an EOS, or its last token of budget): committed without verifying."""
        return self.live and (self.left == 1 or self.first in eos)

    def add(self, tokens: list[int], eos: set[int]) -> None:
        if tokens:
            self.new += tokens
            self.left -= len(tokens)
            self.live = self.left > 0 and tokens[-1] not in eos
