"""Plain decoding: one token per row and step, the reference every speculative run is measured against.

`PlainDecoder(model, compile=False).generate(ids, max_new_tokens, sampling)` is the library's one plain
loop: `mtpc generate --compare`, the bench's plain rows (eager, compiled, batched) and `mtpc
distill-data` all run it. A batch of left-padded prompts `[B, T]` with its `attention_mask` decodes
together, each row at its own positions in preallocated caches (the split backbone's `SlotCache`,
as the speculative decoder's verifier keeps them); rows advance together and a row that reached its
EOS rides along, padded. The prompt is read by an eager forward; the one-token step runs eagerly or,
with `compile=True`, through `torch.compile` as the speculative decoder's cycle steps are compiled
(`StepVariants`: fixed shapes, the attended length its one dynamic dimension; on the CPU kept in the
step store for later processes), which makes it the static-cache compiled plain decoding a user would
pick instead of a draft head. A compiled step is made ready before the first timed step on caches it
has not run on, announced in one line when it compiles (`stats.compile_seconds`, out of the steps'
times, as the speculative decoder's).

A model mtpc has no family adapter for runs through its own forward and a dynamic cache: eager only,
and its rows must be unpadded (equal lengths). A peft model runs with its adapters disabled (the
verifier). Tokens follow `sampling` (`mtpc.sampling.Sampling`): the argmax, or one draw per row, from
one generator or one per row (a row's text then depends on its own generator only).
"""

from __future__ import annotations

import time
from functools import partial

import torch
from torch import nn

from ..sampling import GREEDY, Sampling
from ..lm.backbone import BackboneState, SplitBackbone
from ..lm.families import SlotCache
from ..lm.lora import lora_depth
from .compiling import PlainVariant, StepVariants, derived_identity, tensor_layout
from .inputs import available_memory, check_batch, check_budget, check_eval, check_memory, checked_switch, eos_set
from .stats import DecodeStats, GenerateOutput, pad_id, padded_sequences
from .cycle.verify import attended_slots, cache_length, check_reserve, context_reserve, generation_cache_bytes

__all__ = ["PlainDecoder"]


class PlainDecoder:
    """Plain decoding of `model` (its verifier: a peft model's adapters off). `compile`: the one-token step
    through `torch.compile` (needs a family adapter: fixed shapes come from the preallocated caches), whose
    caches hold `max_context` positions from the start (default: the model's context, up to 8,192), so
    that no generation within them compiles the step again."""

    def __init__(self, model: nn.Module, compile: bool = False, max_context: int | None = None):
        self.backbone = SplitBackbone(model, lora_depth(model))
        compile = checked_switch("compile", compile)
        self.reserve = context_reserve(self.backbone.config, max_context, compile)  # see `cache_length`
        if not self.backbone.whole_model:  # its caches: the verifier's layers, from the first allocation on
            weight = self.backbone.parts.lm_head.weight
            check_reserve(self.backbone.config, self.backbone.num_layers, self.reserve, weight.element_size(),
                          weight.device)
        if compile:
            self.backbone.require_slot_caches("compiled plain decoding", "decode it eagerly")
        self.compile = compile
        self.state: BackboneState | None = None
        self.max_len, self.batch = 0, 0
        self.allocations, self.compiled_for = 0, 0  # cache allocations; the one the compiled step last ran on
        self.steps = StepVariants(self._step, partial(plain_identity, self))
        self.step = self._step  # the compiled variant once `_warm` made it ready

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, sampling: Sampling = GREEDY, *,
                 attention_mask: torch.Tensor | None = None, eos_token_id=None,
                 generator: torch.Generator | list[torch.Generator] | None = None, streamer=None,
                 pad_token_id: int | None = None) -> GenerateOutput:
        """Up to `max_new_tokens` tokens after each prompt of `input_ids` (`[B, T]` or `[T]`; left-padded
        rows marked by `attention_mask`), each row stopping after its first EOS. `sequences` `[B, T + m]`:
        the prompts as given, each row's tokens, then `pad_token_id` (default: the model's pad id, else the
        first EOS id, else 0). `streamer`: a transformers `BaseStreamer`, fed row 0 (its prompt, then one
        token `[1]` per step, then `end()`, as transformers' own loop feeds it)."""
        if not isinstance(sampling, Sampling):
            raise TypeError(f"sampling must be a mtpc.sampling.Sampling (GREEDY, or Sampling(temperature=...)), "
                            f"got {type(sampling).__name__}")
        backbone = self.backbone
        context = getattr(backbone.config, "max_position_embeddings", None)
        prompt, pads = check_batch(input_ids, attention_mask, backbone.vocab_size, context)
        check_budget(max_new_tokens)
        check_eval(backbone.model)
        B, T = prompt.shape
        if isinstance(generator, (list, tuple)) and len(generator) != B:
            raise ValueError(f"generator: a list of generators needs one per row, got {len(generator)} for {B} rows")
        if any(pads):
            backbone.require_slot_caches("a batch of padded prompts", "decode prompts of equal lengths, or one at a time")
        self._check_memory(B, T, max_new_tokens, prompt.device)
        eos = eos_set(eos_token_id)
        if streamer is not None:
            streamer.put(prompt[:1, pads[0]:].cpu())
        stats = DecodeStats()
        new = [[] for _ in range(B)]
        if max_new_tokens:
            start = time.perf_counter()
            logits = self._prefill(prompt, pads, max_new_tokens)  # [B, V]
            stats.prefill_seconds = time.perf_counter() - start
            stats.compile_seconds = self._warm(B, T, prompt.device)
            self._decode(logits, T, max_new_tokens, sampling, eos, generator, streamer, new, stats)
        if streamer is not None:
            streamer.end()
        return GenerateOutput(padded_sequences(prompt, new, pad_id(backbone.config, eos, pad_token_id)), stats)

    @torch.no_grad()
    def continue_from(self, cache, length: int, token: int, max_new_tokens: int, sampling: Sampling = GREEDY, *,
                      eos_token_id=None, generator: torch.Generator | list[torch.Generator] | None = None,
                      streamer=None) -> GenerateOutput:
        """Continue one row whose text so far is the `length` tokens whose keys and values `cache` holds (a
        `SlotCache` of this model: a speculative decoder's verifier caches, `SpeculativeDecoder.verifier`) and
        then `token`, decided but not yet read. The cache's slots are copied into this decoder's own caches, so
        the text is not read again; `token` is fed, and up to `max_new_tokens` tokens follow it. `sequences`
        `[1, m]`: the new tokens only; `prefill_seconds`: the copy and the feeding of `token`; a `streamer` gets
        the new tokens and `end()`, no prompt."""
        self._check_cache(cache, length)
        check_budget(max_new_tokens)
        eos = eos_set(eos_token_id)
        device = cache.layers[0].keys.device
        self._check_memory(1, length + 1, max_new_tokens, device)
        stats, new = DecodeStats(), [[]]
        if max_new_tokens:
            start = time.perf_counter()
            self._adopt(cache, length, max_new_tokens)
            stats.compile_seconds = self._warm(1, length, device)
            logits = self._next(torch.tensor([token], device=device), length)
            stats.prefill_seconds = time.perf_counter() - start - stats.compile_seconds
            self._decode(logits, length + 1, max_new_tokens, sampling, eos, generator, streamer, new, stats)
        if streamer is not None:
            streamer.end()
        return GenerateOutput(torch.tensor(new, dtype=torch.long, device=device), stats)

    def _check_cache(self, cache, length: int) -> None:
        """Refuse a cache this decoder cannot continue from: another kind, batch or layer count, or fewer slots."""
        if self.backbone.whole_model:
            raise ValueError("continue_from needs a model mtpc has a family adapter for (preallocated caches)")
        layers = getattr(cache, "layers", None)
        if not isinstance(cache, SlotCache) or len(layers) != self.backbone.num_layers:
            raise ValueError(f"continue_from needs the SlotCache of this model's {self.backbone.num_layers} layers")
        if not layers[0].is_initialized or layers[0].keys.shape[0] != 1:
            raise ValueError("continue_from continues one row: a cache of batch 1 that holds its text")
        if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= cache.max_len:
            raise ValueError(f"continue_from: length must be 1 .. the cache's {cache.max_len} slots, got {length!r}")

    def _adopt(self, cache, length: int, budget: int) -> None:
        """Caches of this decoder for one row and `length + 1 + budget` slots (new ones, or the ones it has),
        holding `cache`'s first `length` slots."""
        need = cache_length(length + 1 + budget, self.reserve)
        if not self._reuses(1, need):
            self.max_len, self.batch = need, 1
            self.state = self.backbone.new_state(draft=False, max_len=self.max_len)
            self.allocations += 1
        for own, theirs in zip(self.state.verifier.layers, cache.layers):
            if not own.is_initialized:
                own.lazy_initialization(theirs.keys[:, :, :1], theirs.values[:, :, :1])
            own.keys[:, :, :length].copy_(theirs.keys[:, :, :length])
            own.values[:, :, :length].copy_(theirs.values[:, :, :length])
        self.starts = torch.zeros(1, dtype=torch.long, device=own.keys.device)  # [1]: no padding

    def _decode(self, logits: torch.Tensor, T: int, budget: int, sampling: Sampling, eos: set[int], generator,
                streamer, new: list[list[int]], stats: DecodeStats) -> None:
        """The steps: choose each live row's token, feed the batch's tokens back, until every row is done."""
        live = [True] * len(new)
        for step in range(budget):
            start = time.perf_counter()
            token = _choose(sampling, logits, generator)  # [B]
            chosen = token.tolist()
            committed = [[t] if alive else [] for t, alive in zip(chosen, live)]
            for b, tokens in enumerate(committed):
                new[b] += tokens
                live[b] = live[b] and chosen[b] not in eos
            if streamer is not None and committed[0]:
                streamer.put(token[:1].cpu())
            done = step == budget - 1 or not any(live)
            if not done:
                logits = self._next(token, T + step)
            stats.record(time.perf_counter() - start, committed, 1)
            if done:
                return

    def _prefill(self, prompt: torch.Tensor, pads: list[int], budget: int) -> torch.Tensor:
        """Read the prompts into fresh (or reused) caches; the logits `[B, V]` at their last column."""
        B, T = prompt.shape
        backbone = self.backbone
        if backbone.whole_model:
            self.state = backbone.new_state(draft=False)
            return backbone(prompt, self.state, keep=1).logits[:, -1]
        length = cache_length(T + budget, self.reserve)
        if not self._reuses(B, length):
            self.max_len, self.batch = length, B
            self.state = backbone.new_state(draft=False, max_len=self.max_len)
            self.allocations += 1
        self.starts = torch.tensor(pads, dtype=torch.long, device=prompt.device)  # [B] each row's padding
        slots = torch.arange(T, device=prompt.device)[None].expand(B, T)  # [B, T]
        positions = (slots - self.starts[:, None]).clamp_min(0)  # [B, T]: the padding sits at position 0
        return backbone(prompt, self._view(), keep=1, position_ids=positions, slots=slots,
                        starts=self.starts).logits[:, -1]

    def _reuses(self, B: int, length: int) -> bool:
        """Whether a generation of `B` rows needing caches of `length` slots runs in the ones allocated."""
        return not self.backbone.whole_model and self.state is not None and length <= self.max_len and B == self.batch

    def _check_memory(self, B: int, T: int, budget: int, device: torch.device) -> None:
        """Refuse, before allocating, a generation whose new caches (as `_prefill` allocates them) and logits
        would not fit in the device's available memory."""
        backbone = self.backbone
        reused = self._reuses(B, cache_length(T + budget, self.reserve))
        caches = 0 if reused else generation_cache_bytes(backbone, backbone.num_layers, B, T, budget, self.reserve)
        logits = 2 * B * backbone.vocab_size * backbone.parts.lm_head.weight.element_size()  # a step's, and a copy
        check_memory(caches + logits, available_memory(device), f"a batch of {B} prompts", "its caches and logits",
                     "use a smaller batch, fewer new tokens or a smaller max_context")

    def _warm(self, B: int, T: int, device: torch.device) -> float:
        """Seconds spent compiling the step for these caches before the first timed step (compiled, on caches
        it has not run on: a first call traces, new caches may trace again). It writes slot `T` of every
        row, which the first step overwrites."""
        if not self.compile or self.compiled_for == self.allocations:
            return 0.0
        start = time.perf_counter()
        slots = torch.full((B, 1), T, device=device)  # [B, 1]
        kv_slots = attended_slots(T + 1, self.max_len, device)  # [S]
        args = (torch.zeros(B, 1, dtype=torch.long, device=device), slots, slots - self.starts[:, None], self.starts,
                kv_slots)
        variant = PlainVariant(self.allocations, B)
        self.steps.start()
        self.steps.make_ready(variant, tensor_layout(self.backbone.model), args, [kv_slots])
        self.step = self.steps.step_for(variant)
        self.compiled_for = self.allocations
        return time.perf_counter() - start

    def _next(self, token: torch.Tensor, slot: int) -> torch.Tensor:
        """Feed each row's token `[B]` at cache slot `slot`; the logits `[B, V]` after it."""
        if self.backbone.whole_model:
            return self.backbone(token[:, None], self.state).logits[:, -1]
        B = token.shape[0]
        slots = torch.full((B, 1), slot, device=token.device)  # [B, 1]
        kv_slots = attended_slots(slot + 1, self.max_len, token.device)  # [S]
        logits = self.step(token[:, None], slots, slots - self.starts[:, None], self.starts, kv_slots)
        return logits.clone() if self.compile else logits  # a compiled step's output may be overwritten

    def _step(self, tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, starts: torch.Tensor,
              kv_slots: torch.Tensor) -> torch.Tensor:
        """`[B, 1]` tokens at `[B, 1]` slots and positions, attending over `kv_slots` `[S]` -> `[B, V]` logits
        (caches written in place). The function `compile=True` compiles."""
        return self.backbone(tokens, self._view(), position_ids=positions, slots=slots, starts=starts,
                             kv_slots=kv_slots).logits[:, -1]

    def _view(self) -> BackboneState:
        # the caches with a constant host length: the rows' places come in as tensors, so a compiled step never
        # specialises on a position
        return BackboneState(self.state.verifier, None, 0, False)


def plain_identity(decoder: PlainDecoder, variant: PlainVariant, layout: tuple) -> str | None:
    """What a compiled variant of the plain step depends on besides the tensors its guards check (see
    `precompiled_step`), derived (`derived_identity`) from what it closes over: the model and its caches'
    length; None for a model of a class outside mtpc, transformers and peft."""
    return derived_identity(variant, layout, decoder.backbone.model, decoder.max_len)


def _choose(sampling: Sampling, logits: torch.Tensor, generator) -> torch.Tensor:
    """`[B, V]` logits -> `[B]` long: the argmax, or a draw per row (from one generator, or each row's own)."""
    if not isinstance(generator, (list, tuple)):
        return sampling.pick(logits, generator)
    return torch.cat([sampling.pick(row[None], g) for row, g in zip(logits, generator)])
