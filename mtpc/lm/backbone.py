"""The split backbone: one causal LM run as a verifier path and a draft path that share their first layers.

With `lora_layers = k`, the first `L - k` decoder layers run once; their output feeds the last `k`
layers twice: once as the *verifier* (the base model, LoRA adapters disabled, so its logits are always
the base model's) and once as the *draft* path (the same layers with their LoRA adapters enabled),
whose final hidden states feed the MTP head. Each path keeps its own KV cache for the last `k` layers
(the shared layers' cache lives in the verifier cache), and both are cropped together after a
rejection. `k = 0` is one path: the draft hidden state is the verifier's.

The model is never copied or patched. A peft `PeftModel` is used through its public API
(`disable_adapter()` around the verifier tail). With `k = 0` (and no family given) the backbone is
the model's own forward (`mtpc.lm.families.WholeModelPath`: any decoder-only LM). The
decoder-layer loop is written against a small per-family adapter (`BackboneFamily`: embeddings,
layers, final norm, rotary embedding, LM head, mask and layer call, in `mtpc.lm.families`), so
other Hugging Face families plug in by adding an adapter.

Positions: the backbone keeps no state of its own; a `BackboneState` holds the caches and the number
of tokens they hold, and `crop(state, length)` forgets everything after `length` tokens. With
`new_state(max_len=...)` the caches are preallocated (`SlotCache`: transformers `StaticLayer`s in which
each row of a batch writes at its own slots): a call gives its rows' `slots` `[B, T]` (where they are
written), `position_ids` `[B, T]` (their positions in their own text: a left-padded row's slots run
ahead of its positions by its padding) and `starts` `[B]` (each row's first real slot); the mask
hides everything before a row's start and after the query's slot, so a rejected suffix stays hidden
until the next call overwrites it, and the same state serves generation after generation. The
caller (`mtpc.decoding.cycle.verify.Verifier`) keeps each row's length.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import Cache

from .lora import check_lora_layers, is_peft, lora_layer_indices
from .families import BackboneFamily, LlamaFamily, SlotCache, WholeModelPath, family_for

__all__ = [
    "BackboneFamily",
    "LlamaFamily",
    "BackboneState",
    "BackboneOutput",
    "SplitBackbone",
    "family_for",
    "forget_last",
    "WholeModelPath",
]


def _check_parts(model, family) -> None:
    """A decoder's `model` is a torch module with a transformers config (a causal LM, or a peft model over
    one), its `family` None or a `BackboneFamily`: anything else is refused here, not deep in a forward."""
    if not isinstance(model, nn.Module) or getattr(model, "config", None) is None:
        raise ValueError(f"model must be a transformers causal LM (a torch module with a config), got "
                         f"{type(model).__name__}")
    if family is not None and not isinstance(family, (BackboneFamily, WholeModelPath)):
        raise ValueError(f"family must be None or a BackboneFamily (e.g. LlamaFamily()), got {family!r}")


# --------------------------------------------------------------------------- the split backbone

@dataclass
class BackboneState:
    """KV caches of one generation: `verifier` holds all layers of the base model, `draft` the last
    `k` layers of the draft path (None when k = 0). `length` = tokens held by both."""

    verifier: Cache  # a DynamicCache, or preallocated full-attention StaticLayers
    draft: Cache | None
    length: int = 0
    draft_path: bool = True  # False: verifier only, no draft hidden states


@dataclass
class BackboneOutput:
    logits: torch.Tensor  # [B, T', V] verifier (base model) logits for the kept positions
    hidden: torch.Tensor | None  # [B, T', d] draft-path hidden states after the final norm (the head's input)


class SplitBackbone:
    """Run a causal LM as verifier + draft paths sharing their first `L - k` layers.

    `model`: a transformers causal LM (Llama family first) or a peft `PeftModel` over one whose LoRA
    adapters sit only on the last `k` layers. Adapters elsewhere, or adapters with `k = 0`, are an
    error (they would silently change the verifier or be ignored).
    """

    def __init__(self, model: nn.Module, lora_layers: int = 0, family: BackboneFamily | WholeModelPath | None = None):
        _check_parts(model, family)
        self.model = model
        self.peft = model if is_peft(model) else None
        self.base = self.peft.get_base_model() if self.peft is not None else model
        self.config = self.base.config
        self.family = family or family_for(self.config, lora_layers if isinstance(lora_layers, int) else 0)
        self.whole_model = isinstance(self.family, WholeModelPath)
        if self.whole_model and lora_layers:
            raise ValueError("the whole-model path runs lora_layers=0 only; a LoRA draft path needs a BackboneFamily")
        self.family.check_config(self.config)
        self.parts = self.family.parts(self.base)
        self.num_layers = len(self.parts.layers)
        check_lora_layers(lora_layers, self.num_layers)
        self.k = lora_layers
        self._check_adapters()

    def require_slot_caches(self, what: str, instead: str) -> None:
        """The one refusal of everything that needs the split loop's preallocated per-row caches (a tree, a
        batch, padded prompts, a compiled step) on a model without a family adapter: `what` needs them, and
        `instead` says what the user can do. A `ValueError`; the command line says it as one line."""
        if self.whole_model:
            raise ValueError(f"{what} needs the split loop's slot caches, and mtpc has no adapter for model_type "
                             f"{getattr(self.config, 'model_type', None)!r}: {instead}")

    # ----------------------------------------------------------------- properties

    @property
    def hidden_size(self) -> int:
        return self.parts.lm_head.weight.shape[1]  # what the head reads: the final hidden state

    @property
    def vocab_size(self) -> int:
        return self.parts.lm_head.weight.shape[0]

    @property
    def shared_layers(self) -> int:
        return self.num_layers - self.k

    def _check_adapters(self) -> None:
        if self.peft is None:
            return
        kinds = sorted({str(getattr(c.peft_type, "value", c.peft_type)) for c in self.peft.peft_config.values()})
        if kinds != ["LORA"]:
            raise ValueError(f"only LoRA adapters are supported on the draft path, the model has {kinds}")
        inside, outside = lora_layer_indices(self.base, self.parts.layers)
        if outside:
            raise ValueError(f"LoRA adapters outside the decoder layers ({outside[:3]}) would change the verifier; "
                             "only adapters on the last lora_layers decoder layers are supported")
        shared = sorted(i for i in inside if i < self.shared_layers)
        if shared:
            need = self.num_layers - shared[0]
            raise ValueError(
                f"the model has LoRA adapters on layer(s) {shared}, but with lora_layers={self.k} only layers "
                f"{self.shared_layers}..{self.num_layers - 1} run twice; use lora_layers={need}"
            )

    # ----------------------------------------------------------------- caches

    def new_state(self, draft: bool = True, max_len: int | None = None) -> BackboneState:
        """Empty caches. `draft=False`: verifier only (plain decoding); `forward` then returns no hidden.
        `max_len`: preallocated caches of that many positions (fixed shapes, see the module docstring)."""
        with_draft = draft and self.k > 0

        def cache():
            # The whole-model path lets the model place rows by its cache's length: it needs a real crop.
            # Dynamic caches have full layers everywhere (no config): a sliding-window layer could not be
            # cropped back, and under the sliding-window mask a full cache attends as the model does; the
            # preallocated caches are full-attention layers for the same reason.
            if max_len is None or self.whole_model:
                return DynamicCache()
            return SlotCache(self.num_layers, max_len)

        return BackboneState(cache(), cache() if with_draft else None, draft_path=draft)

    def crop(self, state: BackboneState, length: int) -> None:
        """Forget every cached token after the first `length` (both paths)."""
        if not 0 <= length <= state.length:
            raise ValueError(f"cannot crop a cache of {state.length} tokens to {length}")
        remove = state.length - length
        if remove:
            forget_last(state.verifier, remove)
            if state.draft is not None:
                forget_last(state.draft, remove)
        state.length = length

    # ----------------------------------------------------------------- forward

    def _verifier_mode(self):
        return self.peft.disable_adapter() if self.peft is not None else contextlib.nullcontext()

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, state: BackboneState, keep: int | None = None,
                position_ids: torch.Tensor | None = None, slots: torch.Tensor | None = None,
                starts: torch.Tensor | None = None, kv_slots: torch.Tensor | None = None,
                ancestors: torch.Tensor | None = None) -> BackboneOutput:
        """Process `input_ids` `[B, T]` after the `state.length` cached tokens; update both caches.

        Returns verifier logits and draft hidden states for the last `keep` positions (all if None).
        `position_ids` `[B, T]` (or `[1, T]`): `state.length ..` unless given as a tensor (a compiled
        caller passes it so the position is an input of the graph, not a constant baked into it).
        Preallocated caches (`new_state(max_len=...)`): `slots` `[B, T]` and `starts` `[B]` say where each
        row writes and where its text begins (default: at the positions, from slot 0; see the module
        docstring), `kv_slots` `[S]` (`arange(S)`) the slots the call attends over (default: all), and
        `ancestors` `[B, T, T]` bool a tree's shape (`SlotCache.place`; None: the tokens are a chain).
        """
        if self.whole_model:
            logits, hidden = self.family.run(self.base, input_ids, state.verifier, keep)
            state.length += input_ids.shape[1]
            return BackboneOutput(logits, hidden if state.draft_path else None)
        parts, family = self.parts, self.family
        T = input_ids.shape[1]
        if position_ids is None:
            position_ids = torch.arange(state.length, state.length + T, device=input_ids.device)[None]  # [1, T]
        if isinstance(state.verifier, SlotCache):
            B = input_ids.shape[0]
            slots = position_ids.expand(B, T) if slots is None else slots  # [B, T]
            starts = slots.new_zeros(B) if starts is None else starts  # [B]
            for cache in (state.verifier, state.draft):
                if cache is not None:
                    cache.place(slots, starts, kv_slots, ancestors)
        x = family.embed(parts, input_ids, position_ids)  # [B, T, d]
        masks = family.masks(self.config, x, state.verifier, position_ids, self.num_layers)
        pos_emb = family.position_embeddings(self.config, parts, x, position_ids, self.num_layers)

        def run(h, layer_ids, cache):
            for i in layer_ids:
                h = family.call_layer(parts.layers[i], h, masks[i], pos_emb[i], position_ids, cache)
            return h

        tail = range(self.shared_layers, self.num_layers)
        with self._verifier_mode():  # shared layers carry no adapters; the verifier tail runs without them
            shared = run(x, range(self.shared_layers), state.verifier)
            verifier = run(shared, tail, state.verifier)
        state.length += T
        start = 0 if keep is None else T - keep
        verifier_hidden = parts.norm(verifier[:, start:])  # [B, T', d]
        logits = family.logits(self.config, parts, verifier_hidden)  # [B, T', V]
        if not state.draft_path:
            return BackboneOutput(logits, None)
        if not self.k:
            return BackboneOutput(logits, verifier_hidden)
        draft = run(shared, tail, state.draft)
        return BackboneOutput(logits, parts.norm(draft[:, start:]))  # hidden [B, T', d]

    __call__ = forward


def forget_last(cache: Cache, tokens: int) -> None:
    """Forget the last `tokens` tokens of every layer of `cache` that holds any. The layers of a
    `DynamicCache` a path never ran are skipped: transformers 5.17's `crop` fails on them (5.25 skips them
    itself)."""
    if isinstance(cache, DynamicCache):
        for layer in cache.layers:
            if layer.is_initialized:
                layer.crop(-tokens)
    else:
        cache.crop(-tokens)
