"""Lossless self-speculative decoding with a circuit draft head (MtPC, Algorithm 2), and plain decoding.

One loop, eager or compiled alike. Before a cycle the decoder holds, on the device, the next `Window`
`[x_0, d_1 .. d_{S-1}]`: `x_0` already decided (the verifier's next token: its argmax, or a draw
from its target or from a residual), the circuit's draft conditioned on it, the proposal rows and
its verify width (the decoder's fixed width, or with `AdaptiveWidth` the one the draft chose). A cycle is one fixed-shape step, `cycle_step`:

1. one backbone call on the window's first `width` tokens at explicit positions into static caches
   (`Verifier.forward`): the verifier's targets `p_1 .. p_width` and the draft path's hidden states;
2. `accept_window` decides every drafted token at once on the device (greedy: equal to `argmax
   p_j`; sampling: the Leviathan/Chen rule against the proposal's exact conditionals) and draws the
   next `x_0` from the target at the last accepted position, or from the residual `norm(max(0, p_j -
   r_j))` after a rejection at `j` (so the deferred token is still exactly distributed);
3. the circuit drafts the next window after that `x_0`, from the hidden state there
   (`Drafter.circuit_window`), with its verify width.

The host then reads one small tensor (`CyclePacket`: accepted count, the next `x_0` and width, the
window's tokens), moves the caches' write position back to the committed tokens (rejected rows stay
in the static caches, hidden by the causal mask by position, and are overwritten by the next call),
and starts the next cycle. Every cycle makes one backbone call and commits 1 .. width tokens; greedy
output equals plain greedy decoding, sampled output is exactly distributed as the verifier's shaped
target. Every draw of a sampling cycle comes from one uniforms tensor (`cycle_uniforms`), so a seed
gives the same text eager and compiled; with `compile=True` the step is one graph per verify width.

Prompt lookup (`lookup=K` or a `mtpc.decoding.proposals.PromptLookup`; off by default): before a
cycle the host may replace the circuit's window with `x_0`, the `K` tokens that followed the latest
earlier occurrence of the text's last few tokens (point-mass proposals: accepted with probability
`p(c)`, residual `p` without `c`, renormalised), and the circuit's draft after them; the choice
reads only the past (`LookupState.use`), so decoding stays exact. It enters the same step.

Also usable from transformers: `model.generate(ids, custom_generate=decoder.custom_generate, ...)`
(transformers 5.x accepts a callable; see `SpeculativeDecoder.custom_generate`). Streaming: any
transformers `BaseStreamer` (`TextStreamer`, `TextIteratorStreamer`) as `generate(..., streamer=)`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable

import torch
from torch import nn

from circuitc.draft import inverse_cdf

from ..heads import MTPHead
from .acceptance import AcceptanceRule, Target, accept_window, cycle_uniforms
from .backbone import SplitBackbone, lora_depth
from .compiling import compile_step
from .drafting import AdaptiveWidth, Drafter, Window, window_widths
from .host import HostReads
from .inputs import check_budget, check_eval, check_processors, check_prompt, eos_set
from .proposals import LookupState, PromptLookup
from .verify import Verifier

__all__ = ["AdaptiveWidth", "CyclePacket", "DecodeStats", "GenerateOutput", "SpeculativeDecoder", "StepOutput",
           "generate_autoregressive"]


# --------------------------------------------------------------------------- outputs

@dataclass
class DecodeStats:
    """Per-generation measurements. `accepted_per_cycle[c]` = tokens committed by cycle `c` (1..width;
    the paper's accepted length), `draft_accepted_per_cycle[c]` = how many of them were drafted
    tokens (all but `x_0`), `width_per_cycle[c]` = the positions it verified (0: no backbone call,
    its `x_0` ended the generation). Times exclude the prefill."""

    prefill_seconds: float = 0.0
    cycle_seconds: list[float] = field(default_factory=list)
    accepted_per_cycle: list[int] = field(default_factory=list)
    draft_accepted_per_cycle: list[int] = field(default_factory=list)
    width_per_cycle: list[int] = field(default_factory=list)
    lookup_cycles: int = 0  # cycles whose draft came from prompt lookup

    @property
    def cycles(self) -> int:
        return len(self.cycle_seconds)

    @property
    def new_tokens(self) -> int:
        return sum(self.accepted_per_cycle)

    @property
    def mean_accepted(self) -> float:
        return self.new_tokens / self.cycles if self.cycles else 0.0

    @property
    def mean_cycle_latency(self) -> float:
        return sum(self.cycle_seconds) / self.cycles if self.cycles else 0.0

    @property
    def tokens_per_second(self) -> float:
        total = sum(self.cycle_seconds)
        return self.new_tokens / total if total > 0 else 0.0

    def as_dict(self) -> dict:
        return {"cycles": self.cycles, "new_tokens": self.new_tokens, "mean_accepted": self.mean_accepted,
                "mean_cycle_latency": self.mean_cycle_latency, "tokens_per_second": self.tokens_per_second,
                "prefill_seconds": self.prefill_seconds, "accepted_per_cycle": list(self.accepted_per_cycle),
                "draft_accepted_per_cycle": list(self.draft_accepted_per_cycle),
                "width_per_cycle": list(self.width_per_cycle), "lookup_cycles": self.lookup_cycles}


@dataclass
class GenerateOutput:
    sequences: torch.Tensor  # [1, prompt + new] long
    stats: DecodeStats


# --------------------------------------------------------------------------- what a cycle hands on

@dataclass
class StepOutput:
    """What `cycle_step` returns, on the device: the `packet` the host reads, the next `window` and the
    draft hidden state `hidden` `[d]` at the last committed token (a lookup window is drafted from it)."""

    packet: torch.Tensor
    window: Window
    hidden: torch.Tensor


torch.utils._pytree.register_dataclass(StepOutput)


@dataclass
class CyclePacket:
    """The one tensor a cycle reads to the host, `[3 + width]` long, and its fields once read: how many
    tokens the window committed, the next window's `x_0` and verify width, and the window's tokens
    (the first `accepted` are the committed ones)."""

    accepted: int
    next_first: int
    next_width: int
    tokens: list[int]

    @staticmethod
    def pack(accepted: torch.Tensor, next_window: Window, tokens: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.stack([accepted, next_window.tokens[0], next_window.width]), tokens])

    @classmethod
    def read(cls, host_reads: HostReads, packet: torch.Tensor) -> "CyclePacket":
        accepted, next_first, next_width, *tokens = host_reads(packet)
        return cls(accepted, next_first, next_width, tokens)


@dataclass
class Pending:
    """The host's view of the next cycle: its window on the device with its first token and verify
    width as read, and the draft hidden state at the last committed token."""

    window: Window
    first: int
    width: int
    hidden: torch.Tensor


# --------------------------------------------------------------------------- the decoder

class SpeculativeDecoder:
    """Self-speculative decoding of `model` (verifier) with `head` drafting from the draft path.

    `lora_layers`: the last `k` layers run twice (see `SplitBackbone`). `lookup`: prompt-lookup
    drafting inside the same loop (`K` tokens per match, or a `PromptLookup`; off by default, see
    `mtpc.decoding.proposals`). `window`: the verify width of a circuit window, `x_0` and `window - 1`
    drafted tokens (an int from 2 to n; default n), or an `AdaptiveWidth`: each window verifies as many
    positions as its own draft's probabilities justify (measured against fixed widths in
    docs/results.md). `compile`: run the cycle step through
    `torch.compile`, one graph per verify width, compiled before the first cycle and kept for every
    later generation. `acceptance`: the speculative-sampling rule (an `AcceptanceRule`; replace it
    only to study wrong rules). `family`: a `BackboneFamily` for a model family mtpc does not know.

    The host reads one small tensor per cycle through `host_reads` (its `count` is what the sync
    tests check), and one after the prefill.
    """

    def __init__(self, model: nn.Module, head: MTPHead, lora_layers: int = 0, *, lookup: int | PromptLookup | None = None,
                 window: int | AdaptiveWidth | None = None, compile: bool = False,
                 acceptance: AcceptanceRule | None = None, family=None):
        self.backbone = SplitBackbone(model, lora_layers, family=family)
        if head.hidden_size != self.backbone.hidden_size:
            raise ValueError(f"the head was built for hidden size {head.hidden_size}, the model's is "
                             f"{self.backbone.hidden_size}")
        if head.num_states > self.backbone.vocab_size:
            raise ValueError(f"the head's circuit has {head.num_states} states (token ids 0..{head.num_states - 1}) "
                             f"but the model's vocabulary has only {self.backbone.vocab_size} tokens")
        self.head = head
        self.lookup = PromptLookup.of(lookup)
        self.acceptance = acceptance or AcceptanceRule()
        widths, position_cost = window_widths(window, head.num_variables)
        self.widths = widths  # the verify widths of circuit windows
        self.span = max(widths[-1], 1 + self.lookup.tokens) if self.lookup is not None else widths[-1]
        self.drafter = Drafter(head, widths, position_cost, self.span, self.backbone.vocab_size)
        self.n = head.num_variables
        self.verifier = Verifier(self.backbone)
        self.compile = compile
        cuda = self.backbone.parts.lm_head.weight.is_cuda
        self._compiled_step = compile_step(self.cycle_step, cuda) if compile else None
        self._compiled: set[tuple] = set()  # step variants compiled in a warm-up (see `_variant`)
        self.host_reads = HostReads()

    @property
    def width(self) -> int:
        """The widest verify width of a circuit window."""
        return self.widths[-1]

    # ----------------------------------------------------------------- public API

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 eos_token_id: int | Iterable[int] | None = None,
                 generator: torch.Generator | None = None, streamer=None, phase_clock=None) -> GenerateOutput:
        """Generate up to `max_new_tokens` tokens after `input_ids` (`[1, T]` or `[T]`), stopping after the
        first EOS. Greedy by default; `do_sample` samples the shaped target exactly.

        `phase_clock`: a `PhaseClock`; for a compiled decoder one without hooks (a hook inside a compiled
        call would be traced by the compiler). The decoder stamps the start (`backbone_start`) and end
        (`step_end`) of every cycle step: compiled, the step's acceptance and next draft run in one
        graph with the backbone call and are timed as its part.

        `streamer`: any transformers `BaseStreamer`, fed as transformers' own loops feed it: `put` the
        prompt `[1, T]`, then `put` each cycle's committed tokens `[1, k]` (as assisted decoding does),
        then `end()` once."""
        prompt = check_prompt(input_ids, self.backbone.vocab_size)
        check_budget(max_new_tokens)
        check_eval(self.backbone.model)
        target = Target(do_sample, temperature, top_k, top_p)
        eos = eos_set(eos_token_id)
        stats = DecodeStats()
        tokens = prompt[0].tolist()
        if streamer is not None:
            streamer.put(prompt.cpu())
        if max_new_tokens == 0:
            _end(streamer)
            return GenerateOutput(prompt.clone(), stats)

        start = time.perf_counter()
        stamp = phase_clock.stamp if phase_clock is not None else _no_stamp
        stamp("backbone_start")
        logits, h = self.verifier.start(prompt, max_new_tokens + self.span)
        stamp("backbone_end")
        eos_ids = torch.tensor(sorted(eos) or [-1], dtype=torch.long, device=prompt.device)
        if self.compile:
            self._warm(h, target, eos_ids)
        pending = self._first(target, logits, h, generator)
        lookup = None
        if self.lookup is not None:
            lookup = LookupState(self.lookup)
            lookup.extend(tokens)
        stats.prefill_seconds = time.perf_counter() - start

        left = max_new_tokens
        while left > 0:
            start = time.perf_counter()
            if left == 1 or pending.first in eos:  # its first token ends the generation: nothing to verify
                committed, width, source = [pending.first], 0, "circuit"
            else:
                committed, width, source, pending = self._cycle(pending, left, target, eos_ids, generator, lookup,
                                                                stamp)
            stats.cycle_seconds.append(time.perf_counter() - start)
            stats.accepted_per_cycle.append(len(committed))
            stats.draft_accepted_per_cycle.append(len(committed) - 1)
            stats.width_per_cycle.append(width)
            stats.lookup_cycles += source == "lookup"
            tokens += committed
            left -= len(committed)
            if streamer is not None:
                streamer.put(torch.tensor([committed], dtype=torch.long))
            if committed[-1] in eos:
                break
        _end(streamer)
        return GenerateOutput(torch.tensor([tokens], dtype=torch.long, device=prompt.device), stats)

    # ----------------------------------------------------------------- one cycle

    def _first(self, target: Target, logits: torch.Tensor, h: torch.Tensor, generator) -> Pending:
        """The first window, after the prefill: `x_0` from the target at the prompt's last token, the
        circuit's draft after it, and the one read of its first token and width."""
        n = self.n
        uniforms = self._uniforms(target, generator, h.device)
        if target.do_sample:
            first = inverse_cdf(target.probs(logits), uniforms[2 * n])
        else:
            first = logits.argmax()
        window = self.drafter.circuit_window(h, first, None if uniforms is None else uniforms[:n])
        first_token, width = self.host_reads(torch.stack([window.tokens[0], window.width]))
        return Pending(window, first_token, width, h)

    def _cycle(self, pending: Pending, left: int, target: Target, eos_ids, generator, lookup: LookupState | None,
               stamp) -> tuple[list[int], int, str, Pending]:
        """Verify and accept `pending`'s window (or a lookup window in its place), draft the next one.
        Returns (committed ids, the verified width, the window's source, the next pending window)."""
        uniforms = self._uniforms(target, generator, pending.hidden.device)
        window, width, length, source = pending.window, pending.width, min(pending.width, self.n), "circuit"
        if lookup is not None:
            chosen = self._lookup_window(pending, lookup, uniforms)
            if chosen is not None:
                window, width, length = chosen
                source = "lookup"
        base = self.verifier.length
        limit = torch.tensor(min(length, left), device=pending.hidden.device)
        step = self._step_for(target, eos_ids, width)
        stamp("backbone_start")  # a compiled step is one graph: its acceptance and draft count as the backbone's
        out = step(target, window, self.verifier.positions(width), limit, eos_ids, uniforms)
        stamp("step_end")
        self.verifier.written(width)
        packet = CyclePacket.read(self.host_reads, out.packet)
        self.verifier.commit(base + packet.accepted)
        committed = packet.tokens[:packet.accepted]
        if lookup is not None:
            if source == "circuit":
                lookup.record_circuit(packet.accepted - 1)
            lookup.extend(committed[1:])  # x_0 was added when choosing the window
        return committed, width, source, Pending(out.window, packet.next_first, packet.next_width, out.hidden)

    def cycle_step(self, target: Target, window: Window, positions: torch.Tensor, limit: torch.Tensor,
                   eos_ids: torch.Tensor, uniforms: torch.Tensor | None) -> StepOutput:
        """A cycle as one function of fixed-shape tensors (with `compile=True` one graph): verify the
        window's first `W` tokens at `positions` `[1, W]`, accept (`limit` `[]`: the tokens that may be
        committed; `eos_ids` `[E]`), draft the next window. `uniforms` `[2n + S]` float64 (sampling;
        None when greedy): `[:n]` draw the next window, `[n:2n]` a lookup window's circuit tokens (see
        `_lookup_window`), `[2n:2n + W]` decide this one."""
        n, W = self.n, positions.shape[1]
        tokens = window.tokens[:W]  # [W]
        logits, hidden = self.verifier.forward(tokens, positions)  # [W, V], [W, d]
        rows = None if window.rows is None else window.rows[:W]
        tests = None if uniforms is None else uniforms[2 * n:2 * n + W]
        verdict = accept_window(target, self.acceptance, tokens, logits, hidden, limit, eos_ids, rows, tests)
        nxt = self.drafter.circuit_window(verdict.hidden, verdict.next_first, None if uniforms is None else uniforms[:n])
        return StepOutput(CyclePacket.pack(verdict.accepted, nxt, tokens), nxt, verdict.hidden)

    def _lookup_window(self, pending: Pending, lookup: LookupState, uniforms) -> tuple[Window, int, int] | None:
        """A lookup window in place of the circuit's, when the lookup has a match it prefers (read from the
        past only): (window, verify width, real tokens), or None."""
        lookup.extend([pending.first])
        proposal = lookup.propose()
        if proposal is None or not lookup.use(proposal):
            return None
        tokens = proposal.tokens[:lookup.length(proposal, self.width)]
        length = self.drafter.lookup_length(tokens)
        width = next((w for w in self.widths if w >= length), self.span)
        fill = None if uniforms is None else uniforms[self.n:2 * self.n]  # never the next window's draws
        return self.drafter.lookup_window(pending.hidden, pending.first, tokens, width, fill), width, length

    def _uniforms(self, target: Target, generator, device) -> torch.Tensor | None:
        return cycle_uniforms(2 * self.n + self.span, generator, device) if target.do_sample else None

    # ----------------------------------------------------------------- compiled steps

    def _step_for(self, target: Target, eos_ids: torch.Tensor, width: int):
        """The compiled step if this variant was compiled in a warm-up, else the eager one: a cycle never
        compiles."""
        return self._compiled_step if self._variant(target, eos_ids, width) in self._compiled else self.cycle_step

    def _variant(self, target: Target, eos_ids: torch.Tensor, width: int) -> tuple:
        # a compiled step specialises on the target, the EOS count, the verify width, and the cache
        # tensors it writes (new ones after every allocation)
        return target, eos_ids.numel(), self.verifier.allocations, width

    def _warm(self, h: torch.Tensor, target: Target, eos_ids: torch.Tensor) -> None:
        """Compile now, on this generation's caches and on inputs of the cycles' shapes, the step variant
        of every verify width this decoder's windows take. The rows written here are overwritten by the
        first cycle."""
        widths = set(self.widths) | ({self.span} if self.lookup is not None else set())
        uniforms = self._uniforms(target, None, h.device)
        first = torch.zeros((), dtype=torch.long, device=h.device)
        window = self.drafter.circuit_window(h, first, None if uniforms is None else uniforms[:self.n])
        for width in sorted(widths):
            key = self._variant(target, eos_ids, width)
            if key in self._compiled:
                continue
            # eagerly first: the circuit's draft program builds its plans on first use, and a trace that saw
            # them built would be recompiled on the next call
            for step in (self.cycle_step, self._compiled_step):
                base = self.verifier.length
                step(target, window, self.verifier.positions(width), torch.tensor(width, device=h.device), eos_ids,
                     uniforms)
                self.verifier.written(width)
                self.verifier.commit(base)
            self._compiled.add(key)

    # ----------------------------------------------------------------- transformers integration

    def custom_generate(self, model, input_ids, logits_processor=None, stopping_criteria=None,
                        generation_config=None, mtpc_streamer=None, **model_kwargs):
        """`model.generate(input_ids, custom_generate=decoder.custom_generate, max_new_tokens=..., ...)`.

        Streaming: pass the streamer as `mtpc_streamer=...` (it gets the prompt, each cycle's tokens and
        `end()`, as in `generate`). transformers 5.x hands a callable `custom_generate` only the keyword
        arguments its own `_sample` lacks, so a plain `streamer=` would receive the prompt from
        transformers and nothing after it.

        transformers 5.x prepares the generation config (max length, do_sample, temperature, top_k,
        top_p, eos) and calls this as the decoding loop; we read those settings and run `generate`.
        Other logits processors or stopping criteria are refused (they would change the target). Returns
        the sequences `[1, prompt + new]` (a `GenerateDecoderOnlyOutput` with `return_dict_in_generate`);
        use `decoder.generate` for the stats.
        """
        if model is not self.backbone.base and model is not self.backbone.model:
            raise ValueError("custom_generate belongs to a SpeculativeDecoder built for another model")
        mask = model_kwargs.get("attention_mask")
        if mask is not None and not bool((mask == 1).all()):
            raise ValueError("padded input is not supported: speculative decoding runs at batch size 1")
        check_processors(logits_processor, stopping_criteria)
        cfg = generation_config
        top_k = cfg.top_k if cfg.do_sample else None
        top_p = cfg.top_p if cfg.do_sample else None
        out = self.generate(input_ids, max_new_tokens=cfg.max_length - input_ids.shape[-1], do_sample=bool(cfg.do_sample),
                            temperature=cfg.temperature if cfg.do_sample and cfg.temperature is not None else 1.0,
                            top_k=top_k, top_p=top_p, eos_token_id=cfg.eos_token_id, streamer=mtpc_streamer)
        if cfg.return_dict_in_generate:
            from transformers.generation.utils import GenerateDecoderOnlyOutput

            return GenerateDecoderOnlyOutput(sequences=out.sequences)
        return out.sequences


# --------------------------------------------------------------------------- plain decoding

@torch.no_grad()
def generate_autoregressive(model: nn.Module, input_ids: torch.Tensor, max_new_tokens: int, do_sample: bool = False,
                            temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                            eos_token_id: int | Iterable[int] | None = None,
                            generator: torch.Generator | None = None, streamer=None) -> GenerateOutput:
    """Plain one-token-per-step decoding of the verifier (a PeftModel runs with adapters disabled), for
    comparison; same targets, same stats (one token per cycle), same `streamer` protocol (one token
    `[1]` per step, as transformers' greedy/sampling loop puts it)."""
    backbone = SplitBackbone(model, lora_depth(model))
    prompt = check_prompt(input_ids, backbone.vocab_size)
    check_budget(max_new_tokens)
    target = Target(do_sample, temperature, top_k, top_p)
    eos = eos_set(eos_token_id)
    check_eval(backbone.model)
    stats, tokens = DecodeStats(), prompt[0].tolist()
    if streamer is not None:
        streamer.put(prompt.cpu())
    state = backbone.new_state(draft=False)
    start = time.perf_counter()
    logits = backbone(prompt, state, keep=1).logits[0, -1]  # [V]
    stats.prefill_seconds = time.perf_counter() - start
    for step in range(max_new_tokens):
        start = time.perf_counter()
        token = target.pick(logits, generator)
        tokens.append(token)
        if streamer is not None:
            streamer.put(torch.tensor([token], dtype=torch.long))
        done = token in eos or step == max_new_tokens - 1
        if not done:
            logits = backbone(prompt.new_tensor([[token]]), state).logits[0, -1]
        stats.cycle_seconds.append(time.perf_counter() - start)
        stats.accepted_per_cycle.append(1)
        stats.draft_accepted_per_cycle.append(0)
        if done:
            break
    _end(streamer)
    return GenerateOutput(torch.tensor([tokens], dtype=torch.long, device=prompt.device), stats)


def _no_stamp(kind: str) -> None:
    """No phase clock: nothing to stamp."""


def _end(streamer) -> None:
    if streamer is not None:
        streamer.end()
