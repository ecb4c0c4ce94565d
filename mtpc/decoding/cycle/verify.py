"""The verify seam of a cycle: one fixed-width backbone call per batch at explicit slots into preallocated caches.

`Verifier` holds one generation's `BackboneState` with preallocated caches (`SlotCache`, reused from
generation to generation while they are large enough and of the same batch size). Every row of a
batch `[B, T]` of left-padded prompts keeps its own length in the caches: its prompt fills slots
`0 .. T-1` (its padding first, from slot 0 to its `start`), and each cycle writes its window at the
slots after its own committed tokens, at positions counted from its first real token. `places(W)`
gives a call's `Places` (slots, positions, starts); `forward(windows, places)` runs the backbone on
`windows` `[B, W]` and touches no host state, so the decoder traces it inside its compiled cycle step;
`commit(accepted)` then advances each row by the tokens it committed, so the rows a rejection left
behind are overwritten by the row's next call (no crop of tensors, no new shapes, hidden by the mask
until then). A model without a family adapter runs through its own forward and `DynamicCache` (one
row; `commit` crops it).

`allocations` counts cache allocations: a compiled step specialises on the cache tensors it writes, so
the decoder compiles again (before its first cycle) when they change.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ...checks import MAX_CONTEXT  # what `max_context` may ask for: the longest context a model may have
from ...lm.backbone import BackboneState, SplitBackbone, forget_last
from ..drafts.drafting import WindowShape
from ..inputs import available_memory, check_memory

__all__ = ["Verifier", "Places", "MIN_CACHE", "attended_slots", "cache_length", "context_reserve", "cache_bytes",
           "check_max_context", "check_reserve", "generation_cache_bytes", "verify_call_seconds"]

MIN_CACHE = 128  # the shortest cache: lengths are powers of two from here
ATTENTION_ROUNDING = 16  # attended lengths are rounded up to this (a few more masked slots, fewer distinct shapes)
DEFAULT_MAX_CONTEXT = 8192  # a compiled decoder's caches hold the model's context, up to this many positions


def cache_length(need: int, reserve: int = 0) -> int:
    """Slots for `need` positions: one more than they fill (never written). Within `reserve` (a compiled
    decoder's context, `context_reserve`) exactly `reserve + 1`: the first allocation is the last, so the
    step compiled on it serves every later generation. Past it (or with no reserve: an eager decoder),
    rounded up to a power of two (at least `MIN_CACHE`): a process decoding prompts of many lengths
    allocates again only when a prompt needs twice the room of every one before it, at most twice the
    memory the longest needs. The spare slot keeps every attended length below the cache's: a compiled
    step traced on a call that attends over the whole cache would specialise its dynamic length to it
    (on the CPU a call attends only up to its furthest slot, whatever the cache)."""
    if need <= reserve:
        return reserve + 1
    return max(MIN_CACHE, 1 << need.bit_length())


def context_reserve(config, max_context: int | None, compile: bool) -> int:
    """The positions a decoder's caches hold from their first allocation: `max_context` when given (at most
    the model's context, `check_max_context`), else for a compiled decoder the model's context
    (`max_position_embeddings`) up to `DEFAULT_MAX_CONTEXT`, else 0 (an eager decoder allocates what each
    generation needs: it compiles nothing)."""
    context = getattr(config, "max_position_embeddings", None)
    if max_context is not None:
        check_max_context(max_context, context)
        return max_context
    if not compile or not isinstance(context, int) or context < 1:
        return 0
    return min(context, DEFAULT_MAX_CONTEXT)


def check_max_context(max_context, context, name: str = "max_context") -> None:
    """`max_context` (the flag or argument `name`) is an integer in 1..`MAX_CONTEXT` and at most the model's
    `context` (its `max_position_embeddings`; None or not an integer: no such bound): caches reserved past
    the positions the model has would hold room for text it was not made to read. `mtpc generate` asks it
    before loading the model, the decoders when they are built."""
    if isinstance(max_context, bool) or not isinstance(max_context, int) or not 1 <= max_context <= MAX_CONTEXT:
        raise ValueError(f"{name} must be an integer in 1..{MAX_CONTEXT:,} (positions), got {max_context!r}")
    if isinstance(context, int) and not isinstance(context, bool) and 1 <= context < max_context:
        raise ValueError(f"{name} {max_context:,} is more than the {context:,} positions of the model's context "
                         f"(max_position_embeddings): give at most {context:,}")


def check_reserve(config, layers: int, reserve: int, element: int, device: torch.device,
                  name: str = "max_context") -> None:
    """Refuse, before anything is allocated, caches that hold `reserve` positions from the start
    (`context_reserve`) where one row's keys and values in `layers` cache layers of `element`-byte numbers
    would not fit in `device`'s available memory; the refusal states the bytes. The decoders check when they
    are built, `mtpc generate` before it loads the model."""
    if not reserve:
        return
    slots = cache_length(0, reserve)
    check_memory(cache_bytes(config, layers, slots, 1, element), available_memory(device), f"{name} {reserve:,}",
                 f"one row's keys and values in {layers} cache layers of {slots:,} positions", f"give a smaller {name}")


def generation_cache_bytes(backbone: SplitBackbone, layers: int, B: int, T: int, budget: int, reserve: int) -> int:
    """What the caches a generation of `B` rows of `T` prompt and `budget` more positions allocates take, in
    `layers` cache layers: `cache_length` slots (a whole model's own cache: the positions it comes to hold)."""
    slots = T + budget if backbone.whole_model else cache_length(T + budget, reserve)
    return cache_bytes(backbone.config, layers, slots, B, backbone.parts.lm_head.weight.element_size())


def cache_bytes(config, layers: int, slots: int, batch: int, element: int) -> int:
    """The bytes of keys and values `layers` cache layers of `slots` positions take for `batch` rows."""
    heads = getattr(config, "num_attention_heads", 1) or 1
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * layers * batch * kv_heads * head_dim * slots * element


def attended_slots(furthest: int, max_len: int, device: torch.device) -> torch.Tensor:
    """`[S]` long, `arange(S)`: the slots a call attends over when no row writes past slot `furthest - 1`
    (`furthest < max_len`, see `cache_length`). On the CPU, `furthest` rounded up to `ATTENTION_ROUNDING`
    (attention over unfilled slots is a quarter of a batch-8 verify call there); on CUDA every slot but the
    spare one (it costs next to nothing there, while each new length would record another CUDA graph of the
    compiled step). Always below `max_len`."""
    S = -(-furthest // ATTENTION_ROUNDING) * ATTENTION_ROUNDING if device.type != "cuda" else max_len
    return torch.arange(min(S, max_len - 1), device=device)


@dataclass
class Places:
    """Where one call's window goes, per row: `slots` `[B, W]` long (cache slots written), `positions`
    `[B, W]` long (positions in the row's own text: the slots less its padding), `starts` `[B]` long
    (the row's first real slot); and `kv_slots` `[S]` long (`arange(S)`, see `attended_slots`), the slots
    the call attends over: up to the furthest slot any row writes (its length varies from call to call; a
    compiled step takes it as its one dynamic dimension); `ancestors` `[B, W, W]` bool for a tree (None: a
    chain), which of the window's tokens each may attend to."""

    slots: torch.Tensor
    positions: torch.Tensor
    starts: torch.Tensor
    kv_slots: torch.Tensor
    ancestors: torch.Tensor | None = None

    def for_tree(self, shape: WindowShape, max_depth: int) -> "Places":
        """These places for a tree of `shape` at the same slots: each node at position `P + depth` (`P` its
        row's first window position), seeing the prefix and its ancestors. Tensor ops only."""
        shape = shape.first(self.slots.shape[1])  # the nodes this call verifies
        positions = self.positions[:, :1] + shape.depths  # [B, W]
        return Places(self.slots, positions, self.starts, self.kv_slots, shape.ancestors(max_depth))


torch.utils._pytree.register_dataclass(Places)  # a compiled step takes it as tensors


class Verifier:
    def __init__(self, backbone: SplitBackbone, reserve: int = 0):
        self.backbone = backbone
        self.reserve = reserve  # positions the caches hold from the first allocation (`cache_length`)
        self.layers = backbone.num_layers + backbone.k  # cache layers: the verifier's and the draft path's
        if not backbone.whole_model:  # a whole model's own cache holds what it is given, never the reserve
            weight = backbone.parts.lm_head.weight
            check_reserve(backbone.config, self.layers, reserve, weight.element_size(), weight.device)
        self.state: BackboneState | None = None
        self.max_len = 0
        self.batch = 0
        self.allocations = 0
        self.lengths: list[int] = []  # per row: slots holding its committed text (padding included)
        self.starts: torch.Tensor | None = None  # [B] long, each row's padding

    def start(self, prompt: torch.Tensor, pads: list[int], budget: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill `prompt` `[B, T]` (row `b` left-padded by `pads[b]` columns; eager: its length varies)
        into caches with room for `budget` more positions. Returns the logits `[B, V]` and draft hidden
        states `[B, d]` at its last column."""
        B, T = prompt.shape
        length = cache_length(T + budget, self.reserve)
        if not self.reuses(B, length):
            self.max_len = length
            self.state = self.backbone.new_state(max_len=self.max_len)
            self.batch = B
            self.allocations += 1
        self.lengths = [T] * B
        self.starts = torch.tensor(pads, dtype=torch.long, device=prompt.device)  # [B]
        if self.backbone.whole_model:  # the model's own cache, one row: it places rows by its length
            self._keep(0)
            out = self.backbone(prompt, self._view(), keep=1)
            return out.logits[:, -1], out.hidden[:, -1]
        kv_slots = attended_slots(T, self.max_len, prompt.device)  # [S]
        slots = torch.arange(T, device=prompt.device)[None].expand(B, T)  # [B, T]
        positions = (slots - self.starts[:, None]).clamp_min(0)  # [B, T]: the padding sits at position 0
        out = self.backbone(prompt, self._view(), keep=1, position_ids=positions, slots=slots, starts=self.starts,
                            kv_slots=kv_slots)
        return out.logits[:, -1], out.hidden[:, -1]

    def reuses(self, B: int, length: int) -> bool:
        """Whether a generation of `B` rows needing caches of `length` slots runs in the ones allocated."""
        return self.state is not None and length <= self.max_len and B == self.batch

    def new_cache_bytes(self, B: int, T: int, budget: int) -> int:
        """What the caches `start` allocates for a prompt `[B, T]` and `budget` more positions take (0: it
        reuses the ones it has)."""
        if self.reuses(B, cache_length(T + budget, self.reserve)):
            return 0
        return generation_cache_bytes(self.backbone, self.layers, B, T, budget, self.reserve)

    def cache_bytes(self) -> int:
        """What the allocated caches (verifier and draft path) take."""
        element = self.backbone.parts.lm_head.weight.element_size()
        return cache_bytes(self.backbone.config, self.layers, self.max_len, self.batch, element)

    def places(self, width: int) -> Places:
        """The `Places` of the next `width` slots of every row."""
        device = self.starts.device
        kv_slots = attended_slots(max(self.lengths) + width, self.max_len, device)  # [S]
        slots = torch.tensor(self.lengths, device=device)[:, None] + kv_slots[:width]  # [B, W] (kv_slots is an arange)
        return Places(slots, slots - self.starts[:, None], self.starts, kv_slots)

    def forward(self, windows: torch.Tensor, places: Places) -> tuple[torch.Tensor, torch.Tensor]:
        """`windows` `[B, W]` at `places` -> verifier logits `[B, W, V]`, draft hidden `[B, W, d]`."""
        out = self.backbone(windows, self._view(), position_ids=places.positions, slots=places.slots,
                            starts=places.starts, kv_slots=places.kv_slots, ancestors=places.ancestors)
        return out.logits, out.hidden

    def keep_path(self, slots: torch.Tensor, path: torch.Tensor) -> None:
        """After a tree's call at `slots` `[B, W]`: move each row's accepted `path` `[B, D + 1]` (node indices,
        depth by depth) to the slots after its committed text, in every cache (verifier and draft path), so
        that `commit` can count them as a chain's. On the device, inside the step."""
        path = path[:, :slots.shape[1]]  # a path is never longer than the nodes verified (the rest repeat)
        sources = slots.gather(1, path)  # [B, D + 1]
        targets = slots[:, :path.shape[1]]
        self.state.verifier.move(sources, targets)
        if self.state.draft is not None:
            self.state.draft.move(sources, targets)

    def commit(self, accepted: list[int]) -> None:
        """Row `b` committed `accepted[b]` more tokens (0 for a row that did not verify)."""
        self.lengths = [length + a for length, a in zip(self.lengths, accepted)]
        if self.backbone.whole_model:
            self._keep(self.lengths[0])

    def _keep(self, length: int) -> None:
        """The whole-model path's `DynamicCache`: forget every token after the first `length`."""
        remove = self.state.verifier.get_seq_length() - length
        if remove > 0:
            forget_last(self.state.verifier, remove)

    def _view(self) -> BackboneState:
        # a view of the same caches whose host length is a constant: the rows' lengths live here, so a
        # compiled step never reads (and never specialises on) a position as a Python int
        state = self.state
        return BackboneState(state.verifier, state.draft, 0, True)


def verify_call_seconds(backbone: SplitBackbone, widths: tuple[int, ...], context: int = 256,
                        repeats: int = 3) -> dict[int, float]:
    """The verify-cost curve of this model on this machine: the seconds of one eager verify call over each
    width of `widths` after a `context`-token prefix (the median of `repeats`, after one warm-up call), in
    the slot caches a decoder uses (`mtpc.decoding.drafts.trees.auto_tree` sizes a tree from it). A tree call over
    `w` nodes costs what a chain call over `w` positions does: the mask differs, not the work."""
    device = backbone.parts.lm_head.weight.device
    limit = getattr(backbone.config, "max_position_embeddings", None) or context + max(widths)
    context = max(1, min(context, limit - max(widths) - 1))
    prompt = torch.randint(0, backbone.vocab_size, (1, context), generator=torch.Generator().manual_seed(0))
    verifier = Verifier(backbone)
    verifier.start(prompt.to(device), [0], max(widths))
    seconds = {}
    for w in widths:
        tokens, places = torch.randint(0, backbone.vocab_size, (1, w), device=device), verifier.places(w)
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            verifier.forward(tokens, places)
            times.append(time.perf_counter() - start)
        seconds[w] = sorted(times[1:])[repeats // 2]
    return seconds
