"""The split backbone: one causal LM run as a verifier path and a draft path that share their first layers.

With `lora_layers = k`, the first `L - k` decoder layers run once; their output feeds the last `k`
layers twice: once as the *verifier* (the base model, LoRA adapters disabled, so its logits are always
the base model's) and once as the *draft* path (the same layers with their LoRA adapters enabled),
whose final hidden states feed the MTP head. Each path keeps its own KV cache for the last `k` layers
(the shared layers' cache lives in the verifier cache), and both are cropped together after a
rejection. `k = 0` is one path: the draft hidden state is the verifier's.

The model is never copied or patched. A peft `PeftModel` is used through its public API
(`disable_adapter()` around the verifier tail). The decoder-layer loop is written against a small
per-family adapter (`BackboneFamily`: embeddings, layers, final norm, rotary embedding, LM head, mask
and layer call), so other Hugging Face families plug in by adding an adapter.

Positions: the backbone keeps no state of its own; a `BackboneState` holds the caches and the number
of tokens they hold, and `crop(state, length)` forgets everything after `length` tokens. With
`new_state(max_len=...)` the caches are preallocated (`transformers.StaticCache`): a call writes its
rows at positions `length ..`, cropping only moves the write position back (a rejected suffix is
overwritten by the next call, and the causal mask by position hides it until then), and the same
state serves generation after generation (`crop(state, 0)`).
"""

from __future__ import annotations

import contextlib
import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache, StaticCache
from transformers.masking_utils import create_causal_mask

from ..loading import SPLIT_MODEL_TYPES

__all__ = [
    "BackboneFamily",
    "LlamaFamily",
    "BackboneState",
    "BackboneOutput",
    "SplitBackbone",
    "attach_draft_lora",
    "family_for",
    "is_peft",
    "lora_depth",
    "lora_layer_indices",
]


# --------------------------------------------------------------------------- family adapters

@dataclass(frozen=True)
class DecoderParts:
    """The pieces of a decoder-only LM the split loop needs (all owned by the model, never copied)."""

    embed: nn.Module  # token ids [B, T] -> [B, T, d]
    layers: nn.ModuleList  # decoder layers, in order
    norm: nn.Module  # final norm, [B, T, d] -> [B, T, d]
    rotary: nn.Module | None  # (hidden, position_ids) -> position embeddings shared by all layers
    lm_head: nn.Module  # [B, T, d] -> [B, T, V]


class BackboneFamily(ABC):
    """How to run one model family's decoder layer by layer. Subclass it for a new family.

    `parts(model)` finds the modules; `masks(...)` builds one attention mask per layer from the
    verifier cache *before* it is updated; `position_embeddings(...)` and `call_layer(...)` run one
    layer exactly as the family's own `forward` does.
    """

    @abstractmethod
    def parts(self, model: nn.Module) -> DecoderParts:
        """Defined by each subclass."""

    def check_config(self, config) -> None:
        """Raise `ValueError` for configurations the split loop cannot run exactly."""

    @abstractmethod
    def masks(self, config, embeds: torch.Tensor, cache, position_ids: torch.Tensor, num_layers: int) -> list:
        """Defined by each subclass."""

    @abstractmethod
    def position_embeddings(self, parts: DecoderParts, hidden: torch.Tensor, position_ids: torch.Tensor):
        """Defined by each subclass."""

    @abstractmethod
    def call_layer(self, layer: nn.Module, hidden: torch.Tensor, mask, position_embeddings,
                   position_ids: torch.Tensor, cache) -> torch.Tensor:
        """Defined by each subclass."""


class LlamaFamily(BackboneFamily):
    """Llama layout (also Mistral, Qwen2, Qwen3 without sliding windows): `model.model.{embed_tokens,
    layers, norm, rotary_emb}` and `model.lm_head`; one rotary embedding and one causal mask shared by
    all layers; each layer called as `layer(hidden, attention_mask, position_ids, cache, use_cache,
    position_embeddings)`."""

    def parts(self, model: nn.Module) -> DecoderParts:
        inner = getattr(model, "model", None)
        missing = [name for name in ("embed_tokens", "layers", "norm", "rotary_emb") if not hasattr(inner, name)]
        if inner is None or missing or not hasattr(model, "lm_head"):
            raise ValueError(
                f"{type(model).__name__} does not have the Llama layout (model.model.embed_tokens/layers/norm/"
                f"rotary_emb and model.lm_head; missing {missing or ['model' if inner is None else 'lm_head']}); "
                "write a BackboneFamily adapter for it"
            )
        return DecoderParts(inner.embed_tokens, inner.layers, inner.norm, inner.rotary_emb, model.lm_head)

    def check_config(self, config) -> None:
        types = getattr(config, "layer_types", None) or []
        other = sorted({t for t in types if t != "full_attention"})
        if other or getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
            raise ValueError(
                f"{config.model_type}: layers with {other or ['sliding_attention']} are not supported by the split "
                "backbone (a sliding-window cache cannot be cropped back after a rejection); use full attention "
                "(e.g. sliding_window=None)"
            )

    def masks(self, config, embeds, cache, position_ids, num_layers):
        mask = create_causal_mask(config=config, inputs_embeds=embeds, attention_mask=None, cache=cache,
                                  position_ids=position_ids)
        return [mask] * num_layers

    def position_embeddings(self, parts, hidden, position_ids):
        return parts.rotary(hidden, position_ids)

    def call_layer(self, layer, hidden, mask, position_embeddings, position_ids, cache):
        return layer(hidden, attention_mask=mask, position_ids=position_ids, position_embeddings=position_embeddings,
                     use_cache=True, **{_cache_kwarg(layer): cache})


FAMILIES: dict[str, type[BackboneFamily]] = {model_type: LlamaFamily for model_type in SPLIT_MODEL_TYPES}


def family_for(config) -> BackboneFamily:
    """The adapter for a config's `model_type`, with a clear error for families without one."""
    cls = FAMILIES.get(getattr(config, "model_type", None))
    if cls is None:
        raise ValueError(
            f"no split-backbone adapter for model_type {config.model_type!r} (known: {sorted(FAMILIES)}); pass "
            "family=LlamaFamily() if its decoder follows the Llama layout, or subclass BackboneFamily"
        )
    return cls()


def _cache_kwarg(layer: nn.Module) -> str:
    """transformers 5.x renamed the layer argument `past_key_values` to `cache`; accept either."""
    params = inspect.signature(layer.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


# --------------------------------------------------------------------------- peft helpers

def is_peft(model: nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # peft is a dependency, but the split works without it
        return False
    return isinstance(model, PeftModel)


def lora_layer_indices(base: nn.Module, layers: nn.ModuleList) -> tuple[set[int], list[str]]:
    """Decoder-layer indices holding LoRA modules, and names of LoRA modules outside any decoder layer."""
    from peft.tuners.lora import LoraLayer

    owner = {id(m): i for i, layer in enumerate(layers) for m in layer.modules()}
    inside, outside = set(), []
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            if id(module) in owner:
                inside.add(owner[id(module)])
            else:
                outside.append(name)
    return inside, outside


def lora_depth(model: nn.Module) -> int:
    """For a PeftModel: the number of trailing layers that carry adapters (0 for a plain model)."""
    if not is_peft(model):
        return 0
    base = model.get_base_model()
    layers = family_for(base.config).parts(base).layers
    inside, _ = lora_layer_indices(base, layers)
    return len(layers) - min(inside) if inside else 0


def attach_draft_lora(model: nn.Module, lora_layers: int, rank: int = 8, alpha: float = 16.0,
                      dropout: float = 0.0, target_modules: tuple[str, ...] | None = None):
    """Wrap `model` into a peft `PeftModel` with LoRA adapters on its last `lora_layers` decoder layers
    (`layers_to_transform`), the layout `SplitBackbone(peft_model, lora_layers)` expects.

    peft injects the adapter modules into `model` itself (that is how peft works); nothing is copied.
    Default targets: every linear map of a Llama-style layer.
    """
    from peft import LoraConfig, get_peft_model

    num_layers = model.config.num_hidden_layers
    _check_k(lora_layers, num_layers)
    if lora_layers == 0:
        raise ValueError("attach_draft_lora needs lora_layers >= 1 (k = 0 has no draft-only layers)")
    targets = list(target_modules or ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                        layers_to_transform=list(range(num_layers - lora_layers, num_layers)), layers_pattern="layers")
    return get_peft_model(model, config)


def _check_k(k: int, num_layers: int) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ValueError(f"lora_layers must be an integer >= 0, got {k!r}")
    if k > num_layers:
        raise ValueError(f"lora_layers={k} is larger than the model's {num_layers} decoder layers")


# --------------------------------------------------------------------------- the split backbone

@dataclass
class BackboneState:
    """KV caches of one generation: `verifier` holds all layers of the base model, `draft` the last
    `k` layers of the draft path (None when k = 0). `length` = tokens held by both."""

    verifier: DynamicCache | StaticCache
    draft: DynamicCache | StaticCache | None
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

    def __init__(self, model: nn.Module, lora_layers: int = 0, family: BackboneFamily | None = None):
        self.model = model
        self.peft = model if is_peft(model) else None
        self.base = self.peft.get_base_model() if self.peft is not None else model
        self.config = self.base.config
        self.family = family or family_for(self.config)
        self.family.check_config(self.config)
        self.parts = self.family.parts(self.base)
        self.num_layers = len(self.parts.layers)
        _check_k(lora_layers, self.num_layers)
        self.k = lora_layers
        self._check_adapters()

    # ----------------------------------------------------------------- properties

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

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
            return DynamicCache(config=self.config) if max_len is None else StaticCache(self.config, max_len)

        return BackboneState(cache(), cache() if with_draft else None, draft_path=draft)

    def crop(self, state: BackboneState, length: int) -> None:
        """Forget every cached token after the first `length` (both paths)."""
        if not 0 <= length <= state.length:
            raise ValueError(f"cannot crop a cache of {state.length} tokens to {length}")
        remove = state.length - length
        if remove:
            state.verifier.crop(-remove)
            if state.draft is not None:
                state.draft.crop(-remove)
        state.length = length

    # ----------------------------------------------------------------- forward

    def _verifier_mode(self):
        return self.peft.disable_adapter() if self.peft is not None else contextlib.nullcontext()

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, state: BackboneState, keep: int | None = None,
                position_ids: torch.Tensor | None = None) -> BackboneOutput:
        """Process `input_ids` `[B, T]` after the `state.length` cached tokens; update both caches.

        Returns verifier logits and draft hidden states for the last `keep` positions (all if None).
        `position_ids` `[1, T]`: `state.length ..` given as a tensor (a compiled caller passes it so the
        position is an input of the graph, not a constant baked into it).
        """
        parts, family = self.parts, self.family
        T = input_ids.shape[1]
        if position_ids is None:
            position_ids = torch.arange(state.length, state.length + T, device=input_ids.device)[None]  # [1, T]
        x = parts.embed(input_ids)  # [B, T, d]
        masks = family.masks(self.config, x, state.verifier, position_ids, self.num_layers)
        pos_emb = family.position_embeddings(parts, x, position_ids)

        def run(h, layer_ids, cache):
            for i in layer_ids:
                h = family.call_layer(parts.layers[i], h, masks[i], pos_emb, position_ids, cache)
            return h

        tail = range(self.shared_layers, self.num_layers)
        with self._verifier_mode():  # shared layers carry no adapters; the verifier tail runs without them
            shared = run(x, range(self.shared_layers), state.verifier)
            verifier = run(shared, tail, state.verifier)
        state.length += T
        start = 0 if keep is None else T - keep
        verifier_hidden = parts.norm(verifier[:, start:])  # [B, T', d]
        logits = parts.lm_head(verifier_hidden)  # [B, T', V]
        if not state.draft_path:
            return BackboneOutput(logits, None)
        if not self.k:
            return BackboneOutput(logits, verifier_hidden)
        draft = run(shared, tail, state.draft)
        return BackboneOutput(logits, parts.norm(draft[:, start:]))  # hidden [B, T', d]

    __call__ = forward
