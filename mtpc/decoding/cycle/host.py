"""The decoder's one door from the device to the host.

Every value a speculative cycle needs on the host (how many tokens it committed, which ones, the next
first token) is packed into one small tensor and read through `HostReads`, which counts its calls:
on a GPU each read is a host-device synchronisation, and a test asserts there is one per cycle.
"""

from __future__ import annotations

import torch

__all__ = ["HostReads"]


class HostReads:
    """Reads `[k]` integer tensors to Python lists and counts the reads (`count`)."""

    def __init__(self):
        self.count = 0

    def __call__(self, values: torch.Tensor) -> list[int]:
        self.count += 1
        return values.tolist()
