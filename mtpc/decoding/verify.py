"""The verify seam of a cycle: one fixed-width backbone call at explicit positions into preallocated caches.

`Verifier` holds one generation's `BackboneState` with static caches (reused from generation to
generation while they are large enough). `verify(window)` runs the backbone on `window` `[W]` at
positions `length .. length + W - 1`; `commit(accepted)` moves the write position to the committed
tokens, so the rejected rows are overwritten by the next call (no crop of tensors, no new shapes).

`compile=True` runs the call through `torch.compile` (fixed shapes: one graph per width, the position
an input tensor; CUDA: `mode="reduce-overhead"`, CUDA graphs). The compiled call is cached on the
verifier, so every generation of one decoder reuses it; every width is compiled when the caches are
allocated (the first generation, or one that needs longer caches), never in the middle of a generation.
"""

from __future__ import annotations

import torch

from .backbone import BackboneState, SplitBackbone
from .compiling import compile_step

__all__ = ["Verifier", "CACHE_ROUNDING"]

CACHE_ROUNDING = 256  # cache lengths are rounded up to this: nearby prompt lengths share one compiled shape


class Verifier:
    def __init__(self, backbone: SplitBackbone, widths: tuple[int, ...], compile: bool = False):
        self.backbone = backbone
        self.widths = tuple(sorted(set(widths)))
        self.compile = compile
        self.state: BackboneState | None = None
        self.max_len = 0
        self._call = self._compiled() if compile else self._eager

    def start(self, prompt: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill `prompt` `[1, T]` (eager: its length varies) into caches with room for `budget` more
        positions. Returns the logits `[V]` and draft hidden state `[d]` at its last token."""
        need = prompt.shape[1] + budget
        if self.state is None or need > self.max_len:
            self.max_len = -(-need // CACHE_ROUNDING) * CACHE_ROUNDING
            self.state = self.backbone.new_state(max_len=self.max_len)
            if self.compile:
                self._compile_widths(prompt)
        self.backbone.crop(self.state, 0)
        out = self.backbone(prompt, self.state, keep=1)
        return out.logits[0, -1], out.hidden[0, -1]

    @property
    def length(self) -> int:
        return self.state.length

    def verify(self, window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`window` `[W]` at positions `length ..` -> verifier logits `[W, V]`, draft hidden `[W, d]`."""
        state = self.state
        positions = torch.arange(state.length, state.length + window.shape[0], device=window.device)[None]  # [1, W]
        logits, hidden = self._call(window[None], positions)
        state.length += window.shape[0]
        return logits[0], hidden[0]

    def commit(self, length: int) -> None:
        """Keep the first `length` cached tokens; later rows are overwritten by the next call."""
        self.backbone.crop(self.state, length)

    def _compile_widths(self, prompt: torch.Tensor) -> None:
        """Run every verify width once (the compiler traces it now, not inside a timed cycle). transformers'
        cache layers allocate lazily on their first write, and a compiled call specialises on whether
        they have: one eager write first, so the traced variant is the one every cycle runs (else the
        first cycle after a new allocation compiled again, seconds inside a timed generation)."""
        self.backbone.crop(self.state, 0)
        self.backbone(prompt[:, :1], self.state)
        for width in self.widths:
            self.backbone.crop(self.state, 0)
            self.verify(prompt.new_zeros(width))
        self.backbone.crop(self.state, 0)

    def _eager(self, ids: torch.Tensor, positions: torch.Tensor):
        # a view of the same caches whose host length is a constant: `verify` advances the real one, so a
        # compiled call never reads (and never specialises on) the position as a Python int
        state = self.state
        out = self.backbone(ids, BackboneState(state.verifier, state.draft, 0, True), position_ids=positions)
        return out.logits, out.hidden

    def _compiled(self):
        return compile_step(self._eager, self.backbone.parts.lm_head.weight.is_cuda)
