"""How the backbone runs one Hugging Face model family: the split layer loop's adapters and the whole-model path.

Two ways to get the verifier's logits and the draft path's hidden state for a token block:

- **The whole-model path** (`WholeModelPath`, any decoder-only `AutoModelForCausalLM`; what
  `SplitBackbone` runs at `lora_layers = 0` unless given a family):
  the model's own `forward` with its own KV cache, `output_hidden_states=True`; the draft hidden
  state is the final hidden state (after the final norm), the logits are the model's own (so any
  logit soft-capping or scaling is the model's). Nothing family-specific is needed.
- **The split loop** (`LayeredFamily`, `lora_layers >= 0`): the decoder layer by layer, so the last
  `k` layers can run twice (verifier and LoRA draft path). It needs to know where the modules are
  (`DecoderLayout`) and how one layer is called; `FAMILIES` maps `model_type` to an adapter.

Adding a family to the split loop: if its decoder is `embed -> layers -> final norm -> LM head`,
with at most a learned position table added to the embeddings, one rotary module (optionally per
layer type) and layers taking `(hidden, attention_mask=, position_ids=, position_embeddings=,
<cache>=)`, a `DecoderLayout` naming its modules is all it takes (see `GPT2_LAYOUT`); otherwise
subclass `BackboneFamily`. `tests/test_families.py` checks each adapter against the model's own
forward.

Caches: both paths use a `DynamicCache` of full (never sliding) layers: a sliding-window layer drops
old keys and cannot be cropped back after a rejection, while a full cache under the sliding-window
*mask* gives the same attention, exactly.
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache, StaticLayer
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

__all__ = ["OutputLayer", "output_logits", "DecoderParts", "DecoderLayout", "BackboneFamily", "LayeredFamily", "LlamaFamily", "WholeModelPath",
           "FAMILIES", "LLAMA_LAYOUT", "GPT2_LAYOUT", "GPT_NEOX_LAYOUT", "family_for", "split_family", "has_adapter",
           "decoder_layers", "SlotCache", "slot_mask"]

MASKS = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}


@dataclass(frozen=True)
class DecoderParts:
    """The pieces of a decoder-only LM the backbone needs (all owned by the model, never copied)."""

    embed: nn.Module  # token ids [B, T] -> [B, T, d]
    layers: nn.ModuleList  # decoder layers, in order
    norm: nn.Module  # final norm, [B, T, d] -> [B, T, d] (the whole-model path: the module a call ends in)
    rotary: nn.Module | None  # (hidden, position_ids[, layer_type]) -> position embeddings
    lm_head: nn.Module  # [B, T, d] -> [B, T, V]
    positions: nn.Module | None = None  # a learned position table added to the embeddings (GPT-2)


class BackboneFamily(ABC):
    """How to run one model family's decoder layer by layer. Subclass it for a new family.

    `parts(model)` finds the modules; `masks(...)` builds one attention mask per layer from the
    verifier cache *before* it is updated; `embed`, `position_embeddings`, `call_layer` and `logits`
    run the pieces exactly as the family's own `forward` does. `lora_targets` / `layers_pattern` tell
    `attach_draft_lora` which linear maps to adapt and what the layer list is called.
    """

    lora_targets: tuple[str, ...] = ()
    layers_pattern: str = "layers"

    @abstractmethod
    def parts(self, model: nn.Module) -> DecoderParts:
        """Defined by each subclass."""

    def check_config(self, config) -> None:
        """Raise `ValueError` for configurations the split loop cannot run exactly."""

    def embed(self, parts: DecoderParts, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """`[B, T]` ids -> `[B, T, d]` the first layer's input."""
        x = parts.embed(input_ids)
        return x if parts.positions is None else x + parts.positions(position_ids).to(x.device)

    @abstractmethod
    def masks(self, config, embeds: torch.Tensor, cache, position_ids: torch.Tensor, num_layers: int) -> list:
        """Defined by each subclass."""

    @abstractmethod
    def position_embeddings(self, config, parts: DecoderParts, hidden: torch.Tensor, position_ids: torch.Tensor,
                            num_layers: int) -> list:
        """One entry per layer (None where the family has no rotary embedding)."""

    @abstractmethod
    def call_layer(self, layer: nn.Module, hidden: torch.Tensor, mask, position_embeddings,
                   position_ids: torch.Tensor, cache) -> torch.Tensor:
        """Defined by each subclass."""

    def logits(self, config, parts: DecoderParts, hidden: torch.Tensor) -> torch.Tensor:
        """`[B, T, d]` final hidden states -> `[B, T, V]`, as the family's CausalLM head computes them."""
        return output_logits(config, parts.lm_head, hidden)


def output_logits(config, lm_head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head, then the final logit soft-capping of the families that have one (Gemma 2/3)."""
    logits = lm_head(hidden)
    cap = getattr(config, "final_logit_softcapping", None)
    return logits if cap is None else torch.tanh(logits / cap) * cap


class OutputLayer:
    """A model's output layer as its own forward applies it: the LM head, then the family's final
    logit soft-capping (Gemma 2/3). Callable on final hidden states `[..., d]` -> `[..., V]`;
    `weight` is the LM head's (referenced, never copied), for callers that read its dtype."""

    def __init__(self, model: nn.Module, rows: torch.Tensor | None = None):
        """`rows` `[K]` long: only these tokens' logits (a draft vocabulary's), `[..., K]`."""
        self.lm_head = model.get_output_embeddings()
        config = model.config
        self.config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.rows = rows

    @property
    def weight(self) -> torch.Tensor:
        return self.lm_head.weight

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.rows is None:
            return output_logits(self.config, self.lm_head, hidden)
        # soft-capping is elementwise, so capping the chosen rows' logits is capping all, then choosing
        rows = self.rows.to(self.weight.device)
        bias = getattr(self.lm_head, "bias", None)
        logits = F.linear(hidden, self.weight.index_select(0, rows), None if bias is None else bias.index_select(0, rows))
        cap = getattr(self.config, "final_logit_softcapping", None)
        return logits if cap is None else torch.tanh(logits / cap) * cap


def layer_types(config, num_layers: int) -> list[str]:
    """Each layer's attention kind: the config's `layer_types`, else one sliding or full kind for all."""
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    sliding = getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
    return ["sliding_attention" if sliding else "full_attention"] * num_layers


@dataclass(frozen=True)
class DecoderLayout:
    """Where a family keeps its modules: `model.<base>.<embed|layers|norm|rotary|positions>` and
    `model.<lm_head>` (None: the family has no such module)."""

    base: str
    embed: str
    layers: str
    norm: str
    lm_head: str
    rotary: str | None = None
    positions: str | None = None


LLAMA_LAYOUT = DecoderLayout("model", "embed_tokens", "layers", "norm", "lm_head", rotary="rotary_emb")
GPT2_LAYOUT = DecoderLayout("transformer", "wte", "h", "ln_f", "lm_head", positions="wpe")
GPT_NEOX_LAYOUT = DecoderLayout("gpt_neox", "embed_in", "layers", "final_layer_norm", "lm_head", rotary="rotary_emb")


class LayeredFamily(BackboneFamily):
    """A decoder `embed (+ position table) -> layers -> norm -> LM head` whose layers take
    `(hidden, attention_mask=, position_ids=, position_embeddings=, <cache>=, use_cache=)`; one causal
    or sliding-window mask per layer type (`config.layer_types`), one rotary embedding (per layer
    type when the rotary module takes one, as Gemma 3's does)."""

    def __init__(self, layout: DecoderLayout = LLAMA_LAYOUT, lora_targets: tuple[str, ...] = (),
                 layers_pattern: str | None = None):
        self.layout = layout
        self._forward_names: dict[type, frozenset[str]] = {}  # module class -> its forward's argument names
        self.lora_targets = lora_targets
        self.layers_pattern = layers_pattern or layout.layers

    def parts(self, model: nn.Module) -> DecoderParts:
        lay = self.layout
        inner = getattr(model, lay.base, None)
        wanted = [lay.embed, lay.layers, lay.norm, *(n for n in (lay.rotary, lay.positions) if n)]
        missing = [f"{lay.base}.{name}" for name in wanted if not hasattr(inner, name)]
        if not hasattr(model, lay.lm_head):
            missing.append(lay.lm_head)
        if missing:
            raise ValueError(f"{type(model).__name__} does not have the layout {lay} (missing {missing}); write a "
                             "BackboneFamily adapter for it")
        optional = lambda name: getattr(inner, name) if name else None  # noqa: E731
        return DecoderParts(getattr(inner, lay.embed), getattr(inner, lay.layers), getattr(inner, lay.norm),
                            optional(lay.rotary), getattr(model, lay.lm_head), optional(lay.positions))

    def check_config(self, config) -> None:
        other = sorted(set(layer_types(config, 1)) - set(MASKS))
        if other:
            raise ValueError(f"{config.model_type}: layers with {other} attention are not supported by the split "
                             f"backbone (it knows {sorted(MASKS)})")
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError(f"{config.model_type} is an encoder-decoder model; mtpc runs decoder-only LMs")

    def masks(self, config, embeds, cache, position_ids, num_layers):
        kinds = layer_types(config, num_layers)
        if isinstance(cache, SlotCache):
            made = {kind: cache.mask(config, embeds.dtype, kind) for kind in set(kinds)}
            return [made[kind] for kind in kinds[:num_layers]]
        # the cache by position: its parameter is past_key_values in transformers 5.17, cache in 5.25
        made = {kind: MASKS[kind](config, embeds, None, cache, position_ids=position_ids) for kind in set(kinds)}
        return [made[kind] for kind in kinds[:num_layers]]

    def position_embeddings(self, config, parts, hidden, position_ids, num_layers):
        if parts.rotary is None:
            return [None] * num_layers
        if "layer_type" not in self._forward_names_of(parts.rotary):
            return [parts.rotary(hidden, position_ids)] * num_layers
        kinds = layer_types(config, num_layers)
        made = {kind: parts.rotary(hidden, position_ids, kind) for kind in set(kinds)}
        return [made[kind] for kind in kinds[:num_layers]]

    def call_layer(self, layer, hidden, mask, position_embeddings, position_ids, cache):
        extra = {} if position_embeddings is None else {"position_embeddings": position_embeddings}
        return layer(hidden, attention_mask=mask, position_ids=position_ids, use_cache=True,
                     **{self._cache_kwarg(layer): cache}, **extra)

    def _cache_kwarg(self, layer: nn.Module) -> str:
        return cache_keyword(self._forward_names_of(layer))

    def _forward_names_of(self, module: nn.Module) -> frozenset[str]:
        # read on the first (eager) call and kept here, so a compiled step never traces a signature lookup:
        # `inspect.signature` inside the step was a tenth of the source lines dynamo traced in it
        names = self._forward_names.get(type(module))
        if names is None:
            names = self._forward_names[type(module)] = _forward_parameters(type(module))
        return names


class LlamaFamily(LayeredFamily):
    """The Llama layout: `model.model.{embed_tokens, layers, norm, rotary_emb}` and `model.lm_head`
    (also Mistral, Qwen 2/3, Phi-3, OLMo 2, Gemma 2/3)."""

    def __init__(self):
        super().__init__(LLAMA_LAYOUT, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))


class SlotCache(Cache):
    """Preallocated full-attention layers (`StaticLayer`s of `max_len` slots) in which every row of a batch
    writes at its own slots: rows of a batch of speculative windows commit different numbers of tokens,
    so each keeps its own length. Before a call the backbone `place`s it: `slots` `[B, T]` long, where the
    call's tokens go, and `starts` `[B]` long, each row's first real slot (a left-padded prompt's
    padding comes before it). Row `b`'s query at slot `s` attends to the slots `starts[b] .. s` (and
    to itself: a padding query must attend to something, or its NaN would reach the values), so rows
    written after the committed ones by a rejected window are hidden until the next call overwrites them.

    A call attends over the cache's first `S` slots only, `kv_slots` `[S]` (`arange(S)`, `S` at least one past
    the call's last slot; default all `max_len`): attention over slots no row has reached yet is all masked,
    and at batch 8 it was a quarter of a verify call. `S` travels as a tensor's length, so a compiled step
    marks that one dimension dynamic and one graph serves every `S`."""

    def __init__(self, num_layers: int, max_len: int):
        super().__init__(layers=[StaticLayer(max_cache_len=max_len) for _ in range(num_layers)])
        self.max_len = max_len
        self.slots: torch.Tensor | None = None
        self.starts: torch.Tensor | None = None
        self.rows: torch.Tensor | None = None
        self.kv_slots: torch.Tensor | None = None
        self.ancestors: torch.Tensor | None = None

    def place(self, slots: torch.Tensor, starts: torch.Tensor, kv_slots: torch.Tensor | None = None,
              ancestors: torch.Tensor | None = None) -> None:
        """Where the next call writes (`slots` `[B, T]`), where each row's text begins (`starts` `[B]`),
        which slots it attends over (`kv_slots` `[S]`, `arange(S)`; None: all) and, for a tree of tokens
        written at consecutive slots, which of them each may see (`ancestors` `[B, T, T]` bool; None: a chain)."""
        self.slots, self.starts, self.ancestors = slots, starts, ancestors
        self.rows = torch.arange(slots.shape[0], device=slots.device)[:, None].expand_as(slots)  # [B, T]
        if kv_slots is None:
            kv_slots = torch.arange(self.max_len, device=slots.device)
        self.kv_slots = kv_slots

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        """Write `[B, H, T, D]` keys and values at the placed slots; return the attended `[B, H, S, D]`."""
        layer = self.layers[layer_idx]
        if not layer.is_initialized:
            layer.lazy_initialization(key_states, value_states)
        layer.keys[self.rows, :, self.slots] = key_states.transpose(1, 2)  # [B, T, H, D] at [B, T] places
        layer.values[self.rows, :, self.slots] = value_states.transpose(1, 2)
        S = self.kv_slots.shape[0]
        return layer.keys[:, :, :S], layer.values[:, :, :S]

    def move(self, sources: torch.Tensor, targets: torch.Tensor) -> None:
        """Copy every layer's keys and values of row `b` from slots `sources[b]` to `targets[b]` (`[B, P]`
        long each; all read before any is written): a tree's accepted path moved to consecutive slots."""
        rows = torch.arange(sources.shape[0], device=sources.device)[:, None]  # [B, 1]
        for layer in self.layers:
            if layer.is_initialized:
                layer.keys[rows, :, targets] = layer.keys[rows, :, sources]
                layer.values[rows, :, targets] = layer.values[rows, :, sources]

    def mask(self, config, dtype: torch.dtype, kind: str) -> torch.Tensor:
        """The attention mask of one layer kind for the placed call: `[B, 1, T, S]`, bool for SDPA,
        additive (0 or the dtype's minimum) for eager attention."""
        window = config.sliding_window if kind == "sliding_attention" else None
        allowed = slot_mask(self.slots, self.starts, self.kv_slots, window, self.ancestors)
        implementation = config._attn_implementation
        if implementation == "sdpa":
            return allowed
        if implementation == "eager":
            return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)
        raise ValueError(f"attention implementation {implementation!r}: the preallocated caches of the decoding "
                         "cycle build their masks for 'sdpa' or 'eager' attention; load the model with one of them")


def slot_mask(slots: torch.Tensor, starts: torch.Tensor, kv_slots: torch.Tensor, window: int | None = None,
              ancestors: torch.Tensor | None = None) -> torch.Tensor:
    """`[B, 1, T, S]` bool, True where the query written at `slots` `[B, T]` may attend among `kv_slots`
    `[S]`: the slots from its row's `starts` `[B]` to its own (within `window` of it for a sliding-window
    layer), and always its own slot. A tree (`ancestors` `[B, T, T]` bool, its `T` tokens at consecutive
    slots from each row's `slots[:, 0]`): the row's slots before the tree and, inside it, the query's own
    ancestors only (a sliding window then counts from the query's depth, not its slot). Built on the
    device without reading anything to the host."""
    query = slots[:, None, :, None]  # [B, 1, T, 1]
    first = torch.minimum(starts[:, None, None, None], query)  # [B, 1, T, 1] a padding query: its own slot
    if ancestors is None:
        allowed = (kv_slots >= first) & (kv_slots <= query)  # [B, 1, T, S]
        if window is not None:
            allowed = allowed & (kv_slots > query - window)
        return allowed
    B, T = slots.shape
    base = slots[:, None, :1, None]  # [B, 1, 1, 1] the tree's first slot
    before = (kv_slots >= first) & (kv_slots < base)  # [B, 1, T, S]
    if window is not None:
        depth = ancestors.sum(-1)[:, None, :, None] - 1  # [B, 1, T, 1]
        before = before & (kv_slots > base + depth - window)
    offset = kv_slots - base  # [B, 1, 1, S] the kv slot's node, where it is one
    inside = (offset >= 0) & (offset < T)
    seen = ancestors[:, None].gather(3, offset.clamp(0, T - 1).expand(B, 1, T, kv_slots.shape[0]))  # [B, 1, T, S]
    return before | (inside & seen)


@functools.lru_cache(maxsize=None)
def _forward_parameters(module_class: type) -> frozenset[str]:
    """The argument names of a module class's `forward`, read once per class (not per call or layer)."""
    return frozenset(inspect.signature(module_class.forward).parameters)


def cache_keyword(params: frozenset[str]) -> str:
    """The name a layer (or model) whose forward takes `params` takes its cache by: `cache` (transformers
    5.x), `past_key_values`, or `layer_past` (GPT-NeoX)."""
    return next((name for name in ("cache", "past_key_values", "layer_past") if name in params), "cache")


PHI3_TARGETS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
FAMILIES: dict[str, BackboneFamily] = {
    **{t: LlamaFamily() for t in ("llama", "mistral", "qwen2", "qwen3", "olmo2", "gemma2", "gemma3_text")},
    "phi3": LayeredFamily(LLAMA_LAYOUT, PHI3_TARGETS),
    "gpt2": LayeredFamily(GPT2_LAYOUT, ("c_attn", "c_proj", "c_fc")),
    "gpt_neox": LayeredFamily(GPT_NEOX_LAYOUT, ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h")),
}


def has_adapter(model_type: str | None) -> bool:
    """Whether the split loop (and so a LoRA draft path) knows this `model_type`."""
    return model_type in FAMILIES


# --------------------------------------------------------------------------- the whole-model path

def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder-layer list of any model: the `ModuleList` with as many entries as the config has
    layers (the first such list, in module order); empty when there is none."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    count = getattr(config, "num_hidden_layers", None)
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == count:
            return module
    return nn.ModuleList()


def _final_norm(model: nn.Module, layers: nn.ModuleList) -> nn.Module | None:
    """The last norm module after the decoder layers (the module a decoder call ends in), if any."""
    inside = {id(m) for m in layers.modules()}
    norms = [m for m in model.modules() if id(m) not in inside and "norm" in type(m).__name__.lower()]
    return norms[-1] if norms else None


class WholeModelPath:
    """Any decoder-only causal LM run through its own `forward`: logits and the final hidden state of
    a token block after the cached ones. Only for `lora_layers = 0` (the draft hidden state is the
    verifier's); `parts(model)` names the modules the phase clock hooks."""

    def check_config(self, config) -> None:
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError(f"{config.model_type} is an encoder-decoder model; mtpc runs decoder-only LMs")

    def parts(self, model: nn.Module) -> DecoderParts:
        embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
        if embed is None or lm_head is None:
            raise ValueError(f"{type(model).__name__} has no input or output embeddings (get_input_embeddings/"
                             "get_output_embeddings); is it a causal LM?")
        layers = decoder_layers(model)
        return DecoderParts(embed, layers, _final_norm(model, layers) or lm_head, None, lm_head)

    @staticmethod
    def run(model: nn.Module, input_ids: torch.Tensor, cache, keep: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """`input_ids` `[B, T]` after the cached tokens -> (logits `[B, T', V]`, final hidden `[B, T', d]`)
        for the last `keep` positions (all when None); `cache` is updated in place."""
        params = _forward_parameters(type(model))
        keeps = "logits_to_keep" in params
        kwargs = {"logits_to_keep": keep or 0} if keeps else {}
        kwargs[cache_keyword(params)] = cache  # transformers 5.x renamed it
        out = model(input_ids=input_ids, use_cache=True, output_hidden_states=True, **kwargs)
        start = 0 if keep is None else input_ids.shape[1] - keep
        logits = out.logits if keeps else out.logits[:, start:]
        return logits, out.hidden_states[-1][:, start:]


def family_for(config, lora_layers: int = 0) -> BackboneFamily | WholeModelPath:
    """How `SplitBackbone` runs a model: through the `model_type`'s adapter (`FAMILIES`) when there is
    one (the layer loop writes preallocated caches at explicit positions: the fixed-shape, compilable
    cycle of `mtpc.decoding.cycle.verify`); else, with `lora_layers == 0`, the whole-model path (any
    decoder-only LM; the draft hidden state is the verifier's); else a clear error."""
    if lora_layers == 0 and getattr(config, "model_type", None) not in FAMILIES:
        return WholeModelPath()
    return split_family(config, f"a LoRA draft path (lora_layers={lora_layers})")


def split_family(config, needed_by: str = "the split loop") -> BackboneFamily:
    """The split-loop adapter of a config's `model_type` (`ValueError` naming `needed_by` if none)."""
    model_type = getattr(config, "model_type", None)
    family = FAMILIES.get(model_type)
    if family is None:
        raise ValueError(f"no split-backbone adapter for model_type {model_type!r} (known: {sorted(FAMILIES)}), which "
                         f"{needed_by} needs; use lora_layers=0 (the model's own forward), pass family=LlamaFamily() "
                         "if its decoder follows the Llama layout, or add a BackboneFamily (mtpc.lm.families)")
    return family
