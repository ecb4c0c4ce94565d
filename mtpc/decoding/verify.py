"""The verify seam of a cycle: one fixed-width backbone call at explicit positions into preallocated caches.

`Verifier` holds one generation's `BackboneState` with static caches (reused from generation to
generation while they are large enough). `forward(window, positions)` runs the backbone on `window`
`[W]` at `positions` (`positions(W)`: `length .. length + W - 1`) and touches no host state, so the
decoder traces it inside its compiled cycle step; `written(W)` then advances the host's count of
cached rows and `commit(accepted)` moves the write position back to the committed tokens, so the
rejected rows are overwritten by the next call (no crop of tensors, no new shapes). `verify(window)`
is the three together, for callers outside a compiled step.

`allocations` counts cache allocations: a compiled step specialises on the cache tensors it writes, so
the decoder compiles again (before its first cycle) when they change.
"""

from __future__ import annotations

import torch

from .backbone import BackboneState, SplitBackbone

__all__ = ["Verifier", "CACHE_ROUNDING"]

CACHE_ROUNDING = 64  # cache lengths are rounded up to this: nearby prompt lengths share one compiled shape
# (every call attends over the whole cache, so a coarser rounding costs attention time in every cycle)


class Verifier:
    def __init__(self, backbone: SplitBackbone):
        self.backbone = backbone
        self.state: BackboneState | None = None
        self.max_len = 0
        self.allocations = 0

    def start(self, prompt: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill `prompt` `[1, T]` (eager: its length varies) into caches with room for `budget` more
        positions. Returns the logits `[V]` and draft hidden state `[d]` at its last token."""
        need = prompt.shape[1] + budget
        if self.state is None or need > self.max_len:
            self.max_len = -(-need // CACHE_ROUNDING) * CACHE_ROUNDING
            self.state = self.backbone.new_state(max_len=self.max_len)
            self.allocations += 1
        self.backbone.crop(self.state, 0)
        out = self.backbone(prompt, self.state, keep=1)
        return out.logits[0, -1], out.hidden[0, -1]

    @property
    def length(self) -> int:
        return self.state.length

    def positions(self, width: int) -> torch.Tensor:
        """`[1, width]` long: the positions of the next `width` rows."""
        start = self.state.length
        return torch.arange(start, start + width, device=self.backbone.parts.lm_head.weight.device)[None]

    def forward(self, window: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`window` `[W]` at `positions` `[1, W]` -> verifier logits `[W, V]`, draft hidden `[W, d]`."""
        # a view of the same caches whose host length is a constant: the caller advances the real one, so
        # a compiled step never reads (and never specialises on) the position as a Python int
        state = self.state
        out = self.backbone(window[None], BackboneState(state.verifier, state.draft, 0, True), position_ids=positions)
        return out.logits[0], out.hidden[0]

    def written(self, width: int) -> None:
        """`forward` wrote `width` rows after the cached ones."""
        self.state.length += width

    def verify(self, window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` of `window` `[W]` at the next positions, then `written`."""
        out = self.forward(window, self.positions(window.shape[0]))
        self.written(window.shape[0])
        return out

    def commit(self, length: int) -> None:
        """Keep the first `length` cached tokens; later rows are overwritten by the next call."""
        self.backbone.crop(self.state, length)
