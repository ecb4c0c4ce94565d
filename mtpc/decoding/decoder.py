"""Lossless self-speculative decoding with a circuit draft head (MtPC, Algorithm 2), and plain decoding.

One loop and one step for every batch size, eager or compiled alike. `generate` takes one prompt or a
batch of left-padded prompts `[B, T]` with their `attention_mask`; every row keeps its own length and
positions in the static caches, and rows advance by different amounts each cycle. Before a cycle the
decoder holds, on the device, each row's next `Window` `[x_0, d_1 .. d_{S-1}]`: `x_0` already decided
(the verifier's next token: its argmax, or a draw from its target or from a residual), the circuit's
draft conditioned on it, the proposal rows and its verify width (the decoder's fixed width, or with
`AdaptiveWidth` the one the row's draft chose). A cycle is one fixed-shape step, `cycle_step`, for the
whole batch:

1. one backbone call on the windows' first `W` tokens (`W` the widest row's width: every row verifies
   the same width, each tests only its own) at each row's own slots and positions in static caches
   (`Verifier.forward`): the verifier's targets `p_1 .. p_W` and the draft path's hidden states;
2. `accept_window` decides every drafted token of every row at once on the device (greedy: equal to
   `argmax p_j`; sampling: block verification against the proposal's exact conditionals, or the
   token-by-token Leviathan/Chen rule) and draws each row's next `x_0` from the target at its last
   accepted position, or from the rule's residual `norm(max(0, w p_j - r_j))` when a tested token
   after it was not kept (`w` = 1 token by token; so the deferred token is still exactly distributed);
3. the circuit drafts each row's next window after that `x_0`, from the hidden state there
   (`Drafter.circuit_window`), with its verify width; when sampling, at the target's temperature (each
   conditional sharpened as the verifier's distribution is, `draft_temperature`).

The host then reads one small tensor for the batch (`CyclePacket`: per row the accepted count, the
next `x_0` and width, the window's tokens), advances each row's length in the caches by its committed
tokens (rejected rows stay in the static caches, hidden by the mask, and are overwritten by the row's
next call), and starts the next cycle. Rows that finished (EOS or budget) still ride in the
fixed-shape step but test nothing and their results are dropped. Every cycle makes one backbone call
and commits 1 .. width tokens per row; greedy output equals plain greedy decoding of each row alone,
sampled output is exactly distributed as the verifier's shaped target, row by row. Every draw of a
sampling cycle comes from one uniforms tensor per row (`cycle_uniforms`), so a seed gives the same text
eager and compiled, and with one generator per row a row's text depends on its own generator only;
with `compile=True` the step is one graph per verify width.

Prompt lookup (`lookup=K` or a `mtpc.decoding.proposals.PromptLookup`; off by default): before a
cycle the host may replace a row's circuit window with `x_0`, the `K` tokens that followed the latest
earlier occurrence of the row's last few tokens (point-mass proposals, decided by the same rule:
token by token a token `c` is kept with probability `p(c)`, its residual is `p` without `c`,
renormalised), and the circuit's draft after them; the choice
reads only the row's past (`LookupState.use`), so decoding stays exact. It enters the same step.

Also usable from transformers: `model.generate(ids, custom_generate=decoder.custom_generate, ...)`
(transformers 5.x accepts a callable; see `SpeculativeDecoder.custom_generate`). Streaming: any
transformers `BaseStreamer` (`TextStreamer`, `TextIteratorStreamer`) as `generate(..., streamer=)`;
in a batch it streams row 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable

import torch
from torch import nn

from circuitc.draft import inverse_cdf

from ..heads import MTPHead
from .acceptance import AcceptanceRule, BlockVerification, Target, accept_window, cycle_uniforms
from .backbone import SplitBackbone, lora_depth
from .compiling import CompiledStep, compile_step, dynamic_length, precompiled_step
from .drafting import AdaptiveWidth, Drafter, Window, window_widths
from .host import HostReads
from .inputs import (available_memory, check_batch, check_budget, check_eval, check_memory, check_processors,
                     check_prompt, eos_set)
from .proposals import LookupState, PromptLookup
from .verify import Places, Verifier

__all__ = ["AdaptiveWidth", "CyclePacket", "DecodeStats", "GenerateOutput", "SpeculativeDecoder", "StepOutput",
           "generate_autoregressive"]


# --------------------------------------------------------------------------- outputs

@dataclass
class DecodeStats:
    """Per-generation measurements, over the batch. `accepted_per_cycle[c]` = tokens committed by cycle
    `c` over all rows (at batch size 1: 1..width, the paper's accepted length),
    `draft_accepted_per_cycle[c]` = how many of them were drafted tokens (all but each row's `x_0`),
    `rows_per_cycle[c]` = the rows that committed tokens in it, `width_per_cycle[c]` = the positions
    it verified (0: no backbone call, each row's `x_0` ended its generation). Times exclude the prefill,
    and `compile_seconds`, the compilation of the step variants this generation was the first to need
    (`compile=True`), is timed on its own."""

    prefill_seconds: float = 0.0
    compile_seconds: float = 0.0
    cycle_seconds: list[float] = field(default_factory=list)
    accepted_per_cycle: list[int] = field(default_factory=list)
    draft_accepted_per_cycle: list[int] = field(default_factory=list)
    width_per_cycle: list[int] = field(default_factory=list)
    rows_per_cycle: list[int] = field(default_factory=list)
    lookup_cycles: int = 0  # windows (one per row and cycle) drafted by prompt lookup

    @property
    def cycles(self) -> int:
        return len(self.cycle_seconds)

    @property
    def new_tokens(self) -> int:
        return sum(self.accepted_per_cycle)

    @property
    def mean_accepted(self) -> float:
        """Tokens a row commits per cycle, on average."""
        windows = sum(self.rows_per_cycle)
        return self.new_tokens / windows if windows else 0.0

    @property
    def mean_cycle_latency(self) -> float:
        return sum(self.cycle_seconds) / self.cycles if self.cycles else 0.0

    @property
    def tokens_per_second(self) -> float:
        total = sum(self.cycle_seconds)
        return self.new_tokens / total if total > 0 else 0.0

    def record(self, seconds: float, committed: list[list[int]], width: int) -> None:
        """One cycle: its time, each row's committed tokens (empty for a row that was done), its width."""
        rows = [len(c) for c in committed if c]
        self.cycle_seconds.append(seconds)
        self.accepted_per_cycle.append(sum(rows))
        self.draft_accepted_per_cycle.append(sum(rows) - len(rows))
        self.width_per_cycle.append(width)
        self.rows_per_cycle.append(len(rows))

    def as_dict(self) -> dict:
        return {"cycles": self.cycles, "new_tokens": self.new_tokens, "mean_accepted": self.mean_accepted,
                "mean_cycle_latency": self.mean_cycle_latency, "tokens_per_second": self.tokens_per_second,
                "prefill_seconds": self.prefill_seconds, "compile_seconds": self.compile_seconds,
                "accepted_per_cycle": list(self.accepted_per_cycle),
                "draft_accepted_per_cycle": list(self.draft_accepted_per_cycle),
                "width_per_cycle": list(self.width_per_cycle), "rows_per_cycle": list(self.rows_per_cycle),
                "lookup_cycles": self.lookup_cycles}


class CompiledSteps(dict):
    """A decoder's compiled step variants, `{variant key: step}`. They belong to the process: a pickled
    copy is empty (saving a precompiled step pickles the decoder it reads, with its guards' values, and
    the steps compiled before it do not pickle)."""

    def __reduce__(self):
        return CompiledSteps, ()


@dataclass
class GenerateOutput:
    sequences: torch.Tensor  # [B, T + new] long: the prompts as given, then each row's tokens, then padding
    stats: DecodeStats


# --------------------------------------------------------------------------- what a cycle hands on

@dataclass
class StepOutput:
    """What `cycle_step` returns, on the device: the `packet` the host reads, the next windows and the
    draft hidden states `hidden` `[B, d]` at each row's last committed token (a lookup window is drafted
    from it)."""

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
    """The host's view of the next cycle: the windows on the device with each row's first token and
    verify width as read, and the draft hidden states `[B, d]` at each row's last committed token."""

    window: Window
    first: list[int]
    width: list[int]
    hidden: torch.Tensor


@dataclass
class Rows:
    """The host's view of each row of a generation: its new tokens, its budget left, whether it is done."""

    new: list[list[int]]
    left: list[int]
    live: list[bool]

    def add(self, committed: list[list[int]], eos: set[int]) -> None:
        for b, tokens in enumerate(committed):
            if tokens:
                self.new[b] += tokens
                self.left[b] -= len(tokens)
                self.live[b] = self.left[b] > 0 and tokens[-1] not in eos


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
    later generation; on the CPU each compiled step is also kept on disk and a later process loads it
    instead of tracing it again (`mtpc.decoding.compiling.precompiled_step`). `acceptance`: the
    speculative-sampling rule (default `BlockVerification`, which keeps more tokens than the
    token-by-token `AcceptanceRule()`; replace it only to compare the two or to study wrong rules).
    `draft_temperature`: the temperature the circuit's conditionals are sampled at when sampling (None, the default: the target's own `temperature`, so a circuit distilled at
    T = 1 is sharpened as the verifier is; a number: always that one, 1 for the circuit as trained).
    Any draft temperature is exact: the windows carry the tempered conditionals they were drawn from.
    `family`: a `BackboneFamily` for a model family mtpc does not know.

    The host reads one small tensor per cycle through `host_reads` (its `count` is what the sync
    tests check), and one after the prefill, whatever the batch size.
    """

    def __init__(self, model: nn.Module, head: MTPHead, lora_layers: int = 0, *, lookup: int | PromptLookup | None = None,
                 window: int | AdaptiveWidth | None = None, compile: bool = False,
                 acceptance: AcceptanceRule | None = None, draft_temperature: float | None = None, family=None):
        self.backbone = SplitBackbone(model, lora_layers, family=family)
        if head.hidden_size != self.backbone.hidden_size:
            raise ValueError(f"the head was built for hidden size {head.hidden_size}, the model's is "
                             f"{self.backbone.hidden_size}")
        if head.max_token_id >= self.backbone.vocab_size:
            what = (f"circuit has {head.num_states} states (token ids 0..{head.num_states - 1})" if head.vocabulary
                    is None else f"draft vocabulary names token ids up to {head.max_token_id}")
            raise ValueError(f"the head's {what} but the model's vocabulary has only {self.backbone.vocab_size} tokens")
        self.head = head
        if draft_temperature is not None and (isinstance(draft_temperature, bool) or
                                              not isinstance(draft_temperature, (int, float)) or
                                              not 0 < draft_temperature < float("inf")):
            raise ValueError(f"draft_temperature must be a positive number or None, got {draft_temperature!r}")
        self.draft_temperature = draft_temperature
        self.lookup = PromptLookup.of(lookup)
        self.acceptance = acceptance or BlockVerification()
        widths, position_cost = window_widths(window, head.num_variables)
        self.widths = widths  # the verify widths of circuit windows
        self.span = max(widths[-1], 1 + self.lookup.tokens) if self.lookup is not None else widths[-1]
        self.drafter = Drafter(head, widths, position_cost, self.span, self.backbone.vocab_size)
        self.n = head.num_variables
        self.verifier = Verifier(self.backbone)
        self.compile = compile
        self._compiled = CompiledSteps()  # step variants compiled in a warm-up (see `_variant`, `_weights`)
        self._ready = CompiledSteps()  # the variants this generation runs, their guards checked once (`_warm`)
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
                 generator: torch.Generator | list[torch.Generator] | None = None, streamer=None, phase_clock=None,
                 attention_mask: torch.Tensor | None = None, pad_token_id: int | None = None) -> GenerateOutput:
        """Generate up to `max_new_tokens` tokens after each prompt of `input_ids` (`[B, T]`, or `[T]`),
        each row stopping after its first EOS. Greedy by default; `do_sample` samples the shaped target
        exactly.

        A batch: `attention_mask` `[B, T]` (1 for real tokens, 0 for padding) marks left-padded prompts
        of different lengths (None: no padding). `sequences` is `[B, T + m]`, `m` the longest row's new
        tokens (`max_new_tokens` unless every row ended early): the prompt columns as given, then each
        row's tokens, then `pad_token_id` (default: the model's pad id, else the first EOS id, else 0)
        after a row's end. `generator`: one `torch.Generator` for the batch, or a list of one per row
        (a row's text then depends on its own generator alone).

        `phase_clock`: a `PhaseClock`; for a compiled decoder one without hooks (a hook inside a compiled
        call would be traced by the compiler). The decoder stamps the start (`backbone_start`) and end
        (`step_end`) of every cycle step: compiled, the step's acceptance and next draft run in one
        graph with the backbone call and are timed as its part.

        `streamer`: any transformers `BaseStreamer`, fed as transformers' own loops feed it: `put` the
        prompt `[1, T]`, then `put` each cycle's committed tokens `[1, k]` (as assisted decoding does),
        then `end()` once; in a batch, row 0's (its prompt without the padding)."""
        prompt, pads = check_batch(input_ids, attention_mask, self.backbone.vocab_size, self._context())
        check_budget(max_new_tokens)
        check_eval(self.backbone.model)
        B, T = prompt.shape
        self.check_batch(B, T, max_new_tokens, prompt.device, generator)
        target = Target(do_sample, temperature, top_k, top_p)
        eos = eos_set(eos_token_id)
        stats = DecodeStats()
        if streamer is not None:
            streamer.put(prompt[:1, pads[0]:].cpu())
        if max_new_tokens == 0:
            _end(streamer)
            return GenerateOutput(prompt.clone(), stats)

        start = time.perf_counter()
        stamp = phase_clock.stamp if phase_clock is not None else _no_stamp
        stamp("backbone_start")
        logits, h = self.verifier.start(prompt, pads, max_new_tokens + self.span)
        eos_ids = torch.tensor(sorted(eos) or [-1], dtype=torch.long, device=prompt.device)
        if self.compile:
            compiling = time.perf_counter()
            self._warm(h, target, eos_ids)
            stats.compile_seconds = time.perf_counter() - compiling
            start += stats.compile_seconds
        stamp("backbone_end")  # after the compiling: the phase clock counts it with the prefill, not a cycle
        pending = self._first(target, logits, h, generator)
        lookups = None
        if self.lookup is not None:
            lookups = [LookupState(self.lookup) for _ in range(B)]
            for b, lookup in enumerate(lookups):
                lookup.extend(prompt[b, pads[b]:].tolist())
        stats.prefill_seconds = time.perf_counter() - start

        rows = Rows([[] for _ in range(B)], [max_new_tokens] * B, [True] * B)
        while any(rows.live):
            start = time.perf_counter()
            committed, width, pending = self._cycle(pending, rows, eos, target, eos_ids, generator, lookups, stats,
                                                    stamp)
            stats.record(time.perf_counter() - start, committed, width)
            rows.add(committed, eos)
            if streamer is not None and committed[0]:
                streamer.put(torch.tensor([committed[0]], dtype=torch.long))
        _end(streamer)
        return GenerateOutput(self._sequences(prompt, rows.new, eos, pad_token_id), stats)

    # ----------------------------------------------------------------- one cycle

    def _first(self, target: Target, logits: torch.Tensor, h: torch.Tensor, generator) -> Pending:
        """The first windows, after the prefill: each row's `x_0` from the target at its prompt's last
        token, the circuit's draft after it, and the one read of the first tokens and widths."""
        n = self.n
        uniforms = self._uniforms(target, generator, h)
        if target.do_sample:
            first = inverse_cdf(target.probs(logits), uniforms[:, 2 * n])  # [B]
        else:
            first = logits.argmax(-1)  # [B]
        window = self.drafter.circuit_window(h, first, None if uniforms is None else uniforms[:, :n],
                                             self.draft_temperature_for(target))
        first_tokens, widths = self.host_reads(torch.stack([window.tokens[:, 0], window.width]))
        return Pending(window, first_tokens, widths, h)

    def _cycle(self, pending: Pending, rows: Rows, eos: set[int], target: Target, eos_ids, generator,
               lookups: list[LookupState] | None, stats: DecodeStats, stamp) -> tuple[list[list[int]], int, Pending]:
        """Verify and accept the live rows' windows (a lookup window in place of a row's circuit window
        where its lookup prefers it), draft the next ones. A row whose `x_0` ends it (EOS, or its last
        token of budget) commits it without verifying. Returns (each row's committed ids, the verified
        width, 0 when nothing was verified, the next pending windows)."""
        B = len(rows.live)
        ends = [live and (left == 1 or first in eos) for live, left, first in zip(rows.live, rows.left, pending.first)]
        verify = [live and not end for live, end in zip(rows.live, ends)]
        committed = [[first] if end else [] for first, end in zip(pending.first, ends)]
        if not any(verify):
            return committed, 0, pending
        uniforms = self._uniforms(target, generator, pending.hidden)
        window, widths = pending.window, list(pending.width)
        lengths = [min(w, self.n) for w in widths]  # the real tokens of each row's window
        from_lookup = [False] * B
        if lookups is not None:
            for b in (b for b in range(B) if verify[b]):
                chosen = self._lookup_window(pending, b, lookups[b], uniforms,
                                             self.draft_temperature_for(target))
                if chosen is not None:
                    window = window.with_row(b, chosen[0])
                    widths[b], lengths[b], from_lookup[b] = chosen[1], chosen[2], True
            stats.lookup_cycles += sum(from_lookup)
        W = max(w for w, v in zip(widths, verify) if v)
        limit = [min(length, left) if v else 1 for length, left, v in zip(lengths, rows.left, verify)]
        step = self._step_for(target, eos_ids, W, B)
        stamp("backbone_start")  # a compiled step is one graph: its acceptance and draft count as the backbone's
        out = step(target, window, self.verifier.places(W), torch.tensor(limit, device=pending.hidden.device),
                   eos_ids, uniforms)
        stamp("step_end")
        packet = CyclePacket.read(self.host_reads, out.packet)
        accepted = [a if v else 0 for a, v in zip(packet.accepted, verify)]
        self.verifier.commit(accepted)
        for b in (b for b in range(B) if verify[b]):
            committed[b] = packet.tokens[b][:accepted[b]]
            if lookups is not None:
                if not from_lookup[b]:
                    lookups[b].record_circuit(accepted[b] - 1)
                lookups[b].extend(committed[b][1:])  # x_0 was added when choosing the window
        return committed, W, Pending(out.window, packet.next_first, packet.next_width, out.hidden)

    def cycle_step(self, target: Target, window: Window, places: Places, limit: torch.Tensor,
                   eos_ids: torch.Tensor, uniforms: torch.Tensor | None) -> StepOutput:
        """A cycle of the whole batch as one function of fixed-shape tensors (with `compile=True` one
        graph): verify the windows' first `W` tokens at `places` (`[B, W]` slots and positions), accept
        (`limit` `[B]`: the tokens each row may commit, 1 for a row that tests nothing; `eos_ids` `[E]`),
        draft the next windows. `uniforms` `[B, 2n + S]` float64 (sampling; None when greedy): per row
        `[:n]` draw the next window, `[n:2n]` a lookup window's circuit tokens (see `_lookup_window`),
        `[2n:2n + W]` decide this one (each row's next `x_0` with the uniform after its own width's tests)."""
        n, W = self.n, places.slots.shape[1]
        tokens = window.tokens[:, :W]  # [B, W]
        logits, hidden = self.verifier.forward(tokens, places)  # [B, W, V], [B, W, d]
        rows = None if window.rows is None else window.rows[:, :W]
        tests = None if uniforms is None else uniforms[:, 2 * n:2 * n + W]
        verdict = accept_window(target, self.acceptance, tokens, logits, hidden, limit, eos_ids, rows, tests,
                                window.width)
        draws = None if uniforms is None else uniforms[:, :n]
        nxt = self.drafter.circuit_window(verdict.hidden, verdict.next_first, draws,
                                          self.draft_temperature_for(target))
        return StepOutput(CyclePacket.pack(verdict.accepted, nxt, tokens), nxt, verdict.hidden)

    def _lookup_window(self, pending: Pending, b: int, lookup: LookupState, uniforms,
                       temperature: float) -> tuple[Window, int, int] | None:
        """A lookup window for row `b` in place of the circuit's, when its lookup has a match it prefers
        (read from the past only): (one row's window, verify width, real tokens), or None."""
        lookup.extend([pending.first[b]])
        proposal = lookup.propose()
        if proposal is None or not lookup.use(proposal):
            return None
        tokens = proposal.tokens[:lookup.length(proposal, self.width)]
        length = self.drafter.lookup_length(tokens)
        width = next((w for w in self.widths if w >= length), self.span)
        fill = None if uniforms is None else uniforms[b, self.n:2 * self.n]  # never the next window's draws
        window = self.drafter.lookup_window(pending.hidden[b], pending.first[b], tokens, width, fill, temperature)
        return window, width, length

    def draft_temperature_for(self, target: Target) -> float:
        """The temperature the circuit drafts at for `target` (1 when greedy: an argmax ignores it)."""
        if not target.do_sample:
            return 1.0
        return float(self.draft_temperature if self.draft_temperature is not None else target.temperature)

    def _uniforms(self, target: Target, generator, h: torch.Tensor) -> torch.Tensor | None:
        """`[B, 2n + S]` (`h` `[B, d]` gives the batch and device), or None when greedy."""
        if not target.do_sample:
            return None
        return cycle_uniforms(h.shape[0], 2 * self.n + self.span, generator, h.device)

    # ----------------------------------------------------------------- batches

    def _context(self) -> int | None:
        """The model's context in positions, if its config says."""
        return getattr(self.backbone.config, "max_position_embeddings", None)

    def check_batch(self, B: int, T: int, max_new_tokens: int, device: torch.device, generator=None) -> None:
        """Refuse (`ValueError`) a batch of `B` prompts `[B, T]` this decoder cannot run, before anything is
        allocated for it: a batch of a model without a family adapter, one generator per row of the wrong
        count, or caches and cycle tensors that would not fit in the device's available memory."""
        if B > 1 and self.backbone.whole_model:
            raise ValueError(f"a batch of {B} prompts needs the split loop's per-row caches, and mtpc has no "
                             f"adapter for model_type {getattr(self.backbone.config, 'model_type', None)!r}: "
                             "decode its prompts one at a time, or pass family=LlamaFamily() if its decoder "
                             "follows the Llama layout")
        if isinstance(generator, (list, tuple)) and len(generator) != B:
            raise ValueError(f"generator: a list of generators needs one per row, got {len(generator)} for {B} rows")
        check_memory(self._batch_bytes(B, T, max_new_tokens), available_memory(device), B)

    def _batch_bytes(self, B: int, T: int, max_new_tokens: int) -> int:
        """About the memory a batch takes: its keys and values in every cache layer (an upper bound: the
        hidden size for the heads' width), the prefill's activations and a cycle's logits and rows."""
        backbone = self.backbone
        element = backbone.parts.lm_head.weight.element_size()
        slots = T + max_new_tokens + self.span
        caches = 2 * (backbone.num_layers + backbone.k) * slots * backbone.hidden_size * element
        prefill = 16 * T * backbone.hidden_size * element
        cycle = 3 * self.span * backbone.vocab_size * 8  # logits, probabilities and proposal rows (float64)
        return B * (caches + prefill + cycle)

    def _sequences(self, prompt: torch.Tensor, new: list[list[int]], eos: set[int], pad: int | None) -> torch.Tensor:
        """`[B, T + longest]`: the prompts as given, each row's new tokens, then padding."""
        if pad is None:
            pad = getattr(self.backbone.config, "pad_token_id", None)
        if pad is None:
            pad = min(eos) if eos else 0
        longest = max(len(tokens) for tokens in new)
        tail = torch.tensor([tokens + [pad] * (longest - len(tokens)) for tokens in new], dtype=torch.long)
        return torch.cat([prompt, tail.to(prompt.device)], 1)

    # ----------------------------------------------------------------- compiled steps

    def _step_for(self, target: Target, eos_ids: torch.Tensor, width: int, batch: int):
        """The compiled step if this variant was compiled in a warm-up, else the eager one: a cycle never
        compiles."""
        return self._ready.get(self._variant(target, eos_ids, width, batch), self.cycle_step)

    def _variant(self, target: Target, eos_ids: torch.Tensor, width: int, batch: int) -> tuple:
        # a compiled step specialises on the target, the EOS count, the verify width, the batch size and the
        # cache tensors it writes (new ones after every allocation)
        return target, eos_ids.numel(), self.verifier.allocations, width, batch

    def _weights(self) -> tuple:
        """The shape, dtype and device of every parameter and buffer of the model and the head: what a
        compiled step also specialises on, and its guards (as torch saves them) do not check."""
        tensors = [*self.backbone.model.named_parameters(), *self.backbone.model.named_buffers(),
                   *self.head.named_parameters(), *self.head.named_buffers()]
        return tuple((name, tuple(t.shape), t.dtype, t.device) for name, t in tensors)

    def _warm(self, h: torch.Tensor, target: Target, eos_ids: torch.Tensor) -> None:
        """Make ready, on this generation's caches and on inputs of the cycles' shapes, the step variant of
        every verify width this decoder's windows take: compiled now if no earlier generation compiled it,
        and its guards checked once (every cycle of a generation has these inputs' shapes and constants;
        only the attended length grows, the compiled step's one dynamic dimension). The rows written here
        are overwritten by the first cycle."""
        B = h.shape[0]
        widths = set(self.widths) | ({self.span} if self.lookup is not None else set())
        uniforms = self._uniforms(target, None, h)
        first = torch.zeros(B, dtype=torch.long, device=h.device)
        window = self.drafter.circuit_window(h, first, None if uniforms is None else uniforms[:, :self.n])
        self._ready.clear()
        weights = self._weights()
        for width in sorted(widths):
            key = self._variant(target, eos_ids, width, B)
            places = self.verifier.places(width)
            args = (target, window, places, torch.full((B,), width, device=h.device), eos_ids, uniforms)
            compiled = self._compiled.get((key, weights))
            ready = None if compiled is None else compiled.checked(*args)
            if ready is None:  # not compiled yet, or its guards refuse (a constant it read changed since)
                self._compiled[key, weights] = compiled = self._compile(key, weights, args)
                # a step is not refused by its own arguments; if it were, it would run with its guards
                ready = compiled.checked(*args) or compiled
            self._ready[key] = ready

    def _compile(self, key: tuple, weights: tuple, args: tuple) -> CompiledStep:
        """The step compiled for `args` (their `places.kv_slots` length left dynamic: every later cycle
        attends over more slots, one graph serves them all)."""
        places = args[2]
        # eagerly first: the circuit's draft program builds its plans on first use, and a trace that saw them
        # built would be recompiled on the next call
        self.cycle_step(*args)
        if places.kv_slots.is_cuda:
            dynamic_length(places.kv_slots)
            step = CompiledStep(self, traced=compile_step(self.cycle_step, cuda=True))
        else:
            step = precompiled_step(self.cycle_step, args, self._identity(key, weights), dynamic=[places.kv_slots])
        step(*args)
        return step

    def _identity(self, variant: tuple, weights: tuple) -> str | None:
        """What a compiled variant of the step depends on besides the tensors its guards check (see
        `precompiled_step`): the model's and the head's configurations and weights' shapes and dtypes, the
        decoder's settings, the variant.
        None when the step runs code of a class outside mtpc, transformers and peft (a user's acceptance
        rule or model family, a model's remote code), whose changes the stored step would not notice."""
        parts = (self.backbone.model, self.backbone.family, self.acceptance, self.head)
        if not all(type(part).__module__.startswith(("mtpc.", "transformers.", "peft.")) for part in parts):
            return None
        config = self.backbone.model.config.to_dict()
        config.pop("_name_or_path", None)
        head = self.head
        # the allocation count only tells this process's caches apart; their length is what a step specialises on
        target, eos_count, _, width, batch = variant
        return repr((sorted(config.items(), key=repr), weights, type(head).__name__, head.options, head.hidden_size,
                     str(head.dtype), head.circ.plan.to_json(), self.backbone.k, self.lookup,
                     type(self.acceptance).__name__, vars(self.acceptance), self.draft_temperature, self.widths,
                     self.drafter.position_cost, self.span, self.verifier.max_len, target, eos_count, width, batch))

    # ----------------------------------------------------------------- transformers integration

    def custom_generate(self, model, input_ids, logits_processor=None, stopping_criteria=None,
                        generation_config=None, mtpc_streamer=None, **model_kwargs):
        """`model.generate(input_ids, custom_generate=decoder.custom_generate, max_new_tokens=..., ...)`.

        Streaming: pass the streamer as `mtpc_streamer=...` (it gets the prompt, each cycle's tokens and
        `end()`, as in `generate`). transformers 5.x hands a callable `custom_generate` only the keyword
        arguments its own `_sample` lacks, so a plain `streamer=` would receive the prompt from
        transformers and nothing after it.

        transformers 5.x prepares the generation config (max length, do_sample, temperature, top_k,
        top_p, eos, pad) and calls this as the decoding loop; we read those settings and run `generate`
        (a left-padded batch with its `attention_mask` as well). Other logits processors or stopping
        criteria are refused (they would change the target). Returns the sequences `[B, prompt + new]`
        (a `GenerateDecoderOnlyOutput` with `return_dict_in_generate`); use `decoder.generate` for the
        stats.
        """
        if model is not self.backbone.base and model is not self.backbone.model:
            raise ValueError("custom_generate belongs to a SpeculativeDecoder built for another model")
        check_processors(logits_processor, stopping_criteria)
        cfg = generation_config
        top_k = cfg.top_k if cfg.do_sample else None
        top_p = cfg.top_p if cfg.do_sample else None
        out = self.generate(input_ids, max_new_tokens=cfg.max_length - input_ids.shape[-1], do_sample=bool(cfg.do_sample),
                            temperature=cfg.temperature if cfg.do_sample and cfg.temperature is not None else 1.0,
                            top_k=top_k, top_p=top_p, eos_token_id=cfg.eos_token_id, streamer=mtpc_streamer,
                            attention_mask=model_kwargs.get("attention_mask"), pad_token_id=cfg.pad_token_id)
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
        stats.rows_per_cycle.append(1)
        if done:
            break
    _end(streamer)
    return GenerateOutput(torch.tensor([tokens], dtype=torch.long, device=prompt.device), stats)


def _no_stamp(kind: str) -> None:
    """No phase clock: nothing to stamp."""


def _end(streamer) -> None:
    if streamer is not None:
        streamer.end()
