"""Lossless self-speculative decoding with a circuit draft head (MtPC, Algorithm 2), and plain decoding.

One cycle, with the verifier's next-token target `p_0` carried over from the previous cycle (the
"re-used verifier state") and the draft hidden state `h` at the last committed token:

1. `theta = head(h)`; the circuit drafts a window `d_0 .. d_{n-1}`.
2. Position 0 is decided *before* any backbone call, against `p_0`: greedy takes `argmax p_0`;
   sampling accepts `d_0` with probability `min(1, p_0(d_0) / q(d_0))`, else draws the bonus token from
   `norm(max(0, p_0 - q_0))`. Either way one token `x_0` is committed; the bonus is kept only when
   the draft's first token was not accepted.
3. One backbone call on `[x_0, d_1 .. d_{w-1}]` (`w = min(n, tokens left)`) gives the verifier's
   targets `p_1 .. p_w` and the draft path's hidden states. Drafts `d_1 ..` are accepted left to
   right (greedy: equal to `argmax p_j`; sampling: the Leviathan/Chen rule against the proposal's
   exact conditionals `r_j`, from ratios of prefix marginals).
4. The caches are cropped to the committed tokens. The next cycle re-uses `p_a` at the last committed
   position and `h` there. After a rejection at position `j` the token there is *not* drawn now: the
   next cycle's target for that position is the residual `norm(max(0, p_j - r_j))`, so the
   deferred token is still exactly distributed (dropping the residual and re-drafting against `p_j`
   would bias the output towards the draft).

So every cycle makes exactly one backbone call and commits 1 .. n tokens; greedy output equals plain
greedy decoding, sampled output is exactly distributed as the verifier's (shaped) target.

`bonus=True` (bonus-conditioned drafting, the default): `x_0` is taken from `p_0` directly (argmax
or a sample) and the circuit drafts `d_1 ..` conditioned on it (exact conditionals of the same
circuit). It costs the same as `bonus=False` (one backbone call, one circuit program with or without
`x_0` given) and its drafts are conditioned on the token actually committed, so it accepts at least
as much: measured on the tiny LM (benchmarks/bench_bonus.py) equal for FF (whose drafts do not depend
on `x_0`) and up to 1.3x more tokens per cycle for CP in sampling mode. `bonus=False` keeps the
circuit's own first token when the verifier accepts it (steps 1-2 above).

Greedy draft strategies (`draft=`): `"conditional"` (sequential argmax of the circuit's exact
conditionals; default: it accepted most in our measurements), `"marginal"` (per-position marginal
argmax), `"map"` (the circuit's max-product MAP), `"sample"` (a circuit sample). Sampling mode always
drafts circuit samples.

Prompt lookup (`lookup=K` or a `mtpc.decoding.proposals.PromptLookup`; off by default): after `x_0`, a cycle may
draft the `K` tokens that followed the latest earlier occurrence of the text's last few tokens instead
of (or, when shorter than the window, before) the circuit's tokens. They are point-mass proposals:
accepted with probability `p(c)`, residual `p` without `c`, renormalised, the same `AcceptanceRule`
with `q = delta_c`; the choice of source reads only the past (`mtpc.decoding.proposals.LookupState.use`), so
greedy output still equals plain greedy and sampling stays exact. Proposal sources live in
`mtpc.decoding.proposals`; this module keeps the one loop, the targets and the acceptance rule.

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

from ..heads import MTPHead
from .acceptance import AcceptanceRule, Target, accept_window, window_uniforms
from .backbone import SplitBackbone, lora_depth
from .compiling import compile_step
from .drafting import Drafter
from .host import HostReads
from .inputs import check_budget, check_eval, check_processors, check_prompt, eos_set
from .proposals import LookupState, PromptLookup
from .verify import Verifier

__all__ = ["DecodeStats", "GenerateOutput", "SpeculativeDecoder", "generate_autoregressive", "DRAFT_STRATEGIES"]

DRAFT_STRATEGIES = ("conditional", "marginal", "map", "sample")


# --------------------------------------------------------------------------- outputs

@dataclass
class DecodeStats:
    """Per-generation measurements. `accepted_per_cycle[c]` = tokens committed by cycle `c` (1..n;
    the paper's accepted length), `draft_accepted_per_cycle[c]` = how many of them were the circuit's
    drafted tokens. Times exclude the prefill."""

    prefill_seconds: float = 0.0
    cycle_seconds: list[float] = field(default_factory=list)
    accepted_per_cycle: list[int] = field(default_factory=list)
    draft_accepted_per_cycle: list[int] = field(default_factory=list)
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
                "draft_accepted_per_cycle": list(self.draft_accepted_per_cycle), "lookup_cycles": self.lookup_cycles}


@dataclass
class GenerateOutput:
    sequences: torch.Tensor  # [1, prompt + new] long
    stats: DecodeStats


# --------------------------------------------------------------------------- the decoder

class SpeculativeDecoder:
    """Self-speculative decoding of `model` (verifier) with `head` drafting from the draft path.

    `lora_layers`: the last `k` layers run twice (see `SplitBackbone`). `draft`: greedy draft strategy
    (`DRAFT_STRATEGIES`). `bonus`: bonus-conditioned drafting (default). `acceptance`: the speculative-sampling
    rule (an `AcceptanceRule`; replace it only to study wrong rules). `lookup`: prompt-lookup drafting
    inside the same loop (`K` tokens per match, or a `PromptLookup`; off by default, see
    `mtpc.decoding.proposals`). `window`: the verify width of a circuit window, `x_0` and `window - 1`
    drafted tokens (2 .. n; default n): every verified position costs backbone time, so on hardware
    where a verify call grows with its width a shorter window can decode faster (`mtpc bench
    --window`). `compile`: run each cycle step through `torch.compile` as one graph, compiled before the
    first cycle and kept for every later generation.

    A cycle is three seams: `Drafter` (head -> circuit -> a fixed-width window with its proposal rows),
    `Verifier.forward` (one backbone call at explicit positions into static caches) and `accept_window`
    (every position decided at once on the device). Once the window is chosen on the host (lookup or
    the circuit, from past acceptance), the rest is `cycle_step`, a pure function of fixed-shape
    tensors: for the common window, the circuit's after `x_0`, the draft runs inside it too. The host
    reads one small tensor per cycle through `host_reads` (its `count` is what the sync tests check);
    without bonus-conditioned drafting, a cycle that consults prompt lookup reads the first token once
    more (the lookup matches on it).
    """

    def __init__(self, model: nn.Module, head: MTPHead, lora_layers: int = 0, *, draft: str = "conditional",
                 bonus: bool = True, acceptance: AcceptanceRule | None = None, lookup: int | PromptLookup | None = None,
                 family=None, window: int | None = None, compile: bool = False):
        if draft not in DRAFT_STRATEGIES:
            raise ValueError(f"unknown draft strategy {draft!r}; choose one of {DRAFT_STRATEGIES}")
        self.backbone = SplitBackbone(model, lora_layers, family=family)
        if head.hidden_size != self.backbone.hidden_size:
            raise ValueError(f"the head was built for hidden size {head.hidden_size}, the model's is "
                             f"{self.backbone.hidden_size}")
        if head.num_states > self.backbone.vocab_size:
            raise ValueError(f"the head's circuit has {head.num_states} states (token ids 0..{head.num_states - 1}) "
                             f"but the model's vocabulary has only {self.backbone.vocab_size} tokens")
        self.head = head
        self.draft, self.bonus = draft, bonus
        self.lookup = PromptLookup.of(lookup)
        self.acceptance = acceptance or AcceptanceRule()
        self.width = window_width(window, head.num_variables)  # the verify width of a circuit window
        lookup_width = max(self.width, 1 + self.lookup.tokens) if self.lookup is not None else self.width
        self.drafter = Drafter(head, draft, bonus, self.acceptance, self.width, lookup_width, self.backbone.vocab_size)
        self.circuit = self.drafter.circuit
        self.verifier = Verifier(self.backbone)
        self.compile = compile
        cuda = self.backbone.parts.lm_head.weight.is_cuda
        self._compiled_step = compile_step(self.cycle_step, cuda) if compile else None
        self._compiled: set[tuple] = set()  # step variants compiled in a warm-up (see `_variant`)
        self.host_reads = HostReads()

    # ----------------------------------------------------------------- public API

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 eos_token_id: int | Iterable[int] | None = None,
                 generator: torch.Generator | None = None, streamer=None, phase_clock=None) -> GenerateOutput:
        """Generate up to `max_new_tokens` tokens after `input_ids` (`[1, T]` or `[T]`), stopping after the
        first EOS. Greedy by default; `do_sample` samples the shaped target exactly.

        `phase_clock`: a `PhaseClock`; for a compiled decoder one without hooks (a hook inside a compiled
        call would be traced by the compiler). The decoder stamps the start of every draft, and the start
        (`backbone_start`) and end (`step_end`) of every cycle step: compiled, the step's draft and
        acceptance run in one graph with the backbone call and are timed as its part.

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
        logits, h = self.verifier.start(prompt, max_new_tokens + self.drafter.lookup_width)
        stamp("backbone_end")
        carried = _carry(target, logits)
        first = _pick(target, carried, generator)[None] if self.bonus else None  # [1] x_0 on the device
        x0 = self.host_reads(first)[0] if self.bonus else None
        eos_ids = torch.tensor(sorted(eos) or [-1], dtype=torch.long, device=prompt.device)
        if self.compile:
            self._warm(h, logits, target, eos_ids)
        lookup = None
        if self.lookup is not None:
            lookup = LookupState(self.lookup)
            lookup.extend(tokens)
        stats.prefill_seconds = time.perf_counter() - start

        left = max_new_tokens
        while left > 0:
            start = time.perf_counter()
            cycle = self._cycle(h, carried, x0, first, left, target, eos, eos_ids, generator, lookup, stamp)
            committed, from_draft, source, h, carried, x0, first = cycle
            stats.cycle_seconds.append(time.perf_counter() - start)
            stats.accepted_per_cycle.append(len(committed))
            stats.draft_accepted_per_cycle.append(from_draft)
            stats.lookup_cycles += source == "lookup"
            tokens += committed
            left -= len(committed)
            if streamer is not None:
                streamer.put(torch.tensor([committed], dtype=torch.long))
            if committed[-1] in eos:
                break
        _end(streamer)
        return GenerateOutput(torch.tensor([tokens], dtype=torch.long, device=prompt.device), stats)

    # ----------------------------------------------------------------- one cycle: draft, verify, accept

    def _cycle(self, h, carried, x0: int | None, first: torch.Tensor | None, left: int, target: Target, eos: set[int],
               eos_ids, generator, lookup: LookupState | None, stamp):
        """`x0` / `first` `[1]`: the committed first token on the host and on the device (bonus-conditioned
        drafting; else None). `stamp(kind)` marks the draft and the cycle step for a phase clock.
        Returns (committed ids, how many came from the draft, the window's source, next h `[d]`, next
        carried target `[V]`, the next first token on the host and on the device, or None and None)."""
        n = self.circuit.n
        uniforms = window_uniforms(n + self.drafter.lookup_width, generator, h.device) if target.do_sample else None
        stamp("head_start")  # choosing the window, and drafting the windows drafted outside the step
        if self.bonus and (left == 1 or x0 in eos):  # the committed x_0 ends the generation: nothing to draft
            return [x0], 0, "circuit", h, carried, None, None
        draft = self.drafter.draft(h, carried, x0, target, generator, lookup, self._read_first)  # None: the circuit's
        if left == 1 or x0 in eos:  # nothing left to verify: no backbone call
            token, own = self.host_reads(torch.stack([draft.window[0], draft.own.long()]))
            return [token], own, draft.source, h, carried, None, None
        width = self.width if draft is None else draft.window.shape[0]
        length = self.drafter.length if draft is None else draft.length
        base = self.verifier.length
        positions = self.verifier.positions(width)
        limit = torch.tensor(min(length, left), device=h.device)
        given = (None, None, None) if draft is None else (draft.window, draft.rows, draft.own)
        step = self._step_for(target, eos_ids, draft is None, width)
        stamp("backbone_start")  # a compiled step is one graph: its draft and acceptance count as the backbone's
        packet, next_hidden, next_carried = step(target, h, first, *given, positions, limit, eos_ids, uniforms)
        stamp("step_end")
        self.verifier.written(width)
        accepted, own, next_first, *window = self.host_reads(packet)
        self.verifier.commit(base + accepted)
        committed = window[:accepted]
        source = "circuit" if draft is None else draft.source
        if lookup is not None:
            if source == "circuit":
                lookup.record_circuit(accepted - 1)
            lookup.extend(committed[1:])  # x_0 was added when drafting
        return (committed, own + accepted - 1, source, next_hidden, next_carried,
                *((next_first, packet[2:3]) if self.bonus else (None, None)))

    def cycle_step(self, target: Target, h, first, window, rows, own, positions, limit, eos_ids, uniforms):
        """A cycle once its window is chosen, as one function of fixed-shape tensors (with `compile=True`
        one graph): the window, the verify call at `positions` `[1, W]` and `decide`.

        `window` `[W]` long with its proposal `rows` `[W, V]` (sampling) and `own` `[]` bool, or all
        three None: then it is the circuit window after `first` `[1]`, drafted here from `h` `[d]`
        (`Drafter.circuit_window`). `limit` `[]`: the tokens that may be committed; `uniforms` `[n +
        lookup width]` float64 (sampling): the first `n` draw the circuit window, the next `W` decide the
        window. Returns `decide`'s (packet, next draft hidden state, next carried target)."""
        n = self.circuit.n
        if window is None:
            window, rows = self.drafter.circuit_window(h, first, None if uniforms is None else uniforms[:n],
                                                       target.do_sample)
            own = h.new_zeros((), dtype=torch.bool)
        logits, hidden = self.verifier.forward(window, positions)  # [W, V], [W, d]
        tests = None if uniforms is None else uniforms[n:n + window.shape[0]]
        return decide(target, self.acceptance, window, logits, hidden, limit, eos_ids, rows, tests, own)

    def _step_for(self, target: Target, eos_ids: torch.Tensor, circuit_window: bool, width: int):
        """The compiled step if this variant was compiled in a warm-up, else the eager one: a cycle never
        compiles (a rare variant, such as a bonus token the circuit cannot observe, runs eagerly)."""
        return self._compiled_step if self._variant(target, eos_ids, circuit_window, width) in self._compiled \
            else self.cycle_step

    def _variant(self, target: Target, eos_ids: torch.Tensor, circuit_window: bool, width: int) -> tuple:
        # a compiled step specialises on the target, the EOS count, the window's kind and width, and the
        # cache tensors it writes (new ones after every allocation)
        return target, eos_ids.numel(), self.verifier.allocations, circuit_window, width

    def _read_first(self, token: torch.Tensor) -> int:
        return self.host_reads(token[None])[0]

    def _warm(self, h: torch.Tensor, logits: torch.Tensor, target: Target, eos_ids: torch.Tensor) -> None:
        """Compile now, on this generation's caches and on inputs of the cycles' shapes, the step variants
        this target's cycles run: the circuit window after `x_0` (bonus-conditioned drafting) or else an
        eager window of the circuit's width, and with lookup a lookup window. The rows written here are
        overwritten by the first cycle."""
        fused = self.bonus and self.drafter.is_fused(0, target)  # without bonus every window is drafted eagerly
        variants = {(fused, self.width)}
        if self.lookup is not None:
            variants.add((False, self.drafter.lookup_width))
        n, vocab = self.circuit.n, logits.shape[-1]
        uniforms = h.new_zeros(n + self.drafter.lookup_width, dtype=torch.float64) if target.do_sample else None
        first = torch.zeros(1, dtype=torch.long, device=h.device) if self.bonus else None  # as the cycles pass it
        for circuit_window, width in sorted(variants):
            key = self._variant(target, eos_ids, circuit_window, width)
            if key in self._compiled:
                continue
            given = (None, None, None) if circuit_window else (
                torch.zeros(width, dtype=torch.long, device=h.device),
                logits.new_zeros(width, vocab, dtype=torch.float64) if target.do_sample else None,
                h.new_zeros((), dtype=torch.bool))
            # eagerly first: the circuit's draft program builds its plans on first use, and a trace that saw
            # them built would be recompiled on the next call
            for step in (self.cycle_step, self._compiled_step):
                base = self.verifier.length
                step(target, h, first, *given, self.verifier.positions(width), torch.tensor(width, device=h.device),
                     eos_ids, uniforms)
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


def decide(target: Target, rule: AcceptanceRule, window, logits, hidden, limit, eos_ids, rows, uniforms, own):
    """The accept step of a cycle: `accept_window`, then the one packet the host reads, `[3 + W]` long
    (accepted count, whether `x_0` is the circuit's own, the next first token, the window). Returns
    (packet, the next draft hidden state `[d]`, the next carried target `[V]`)."""
    verdict = accept_window(target, rule, window, logits, hidden, limit, eos_ids, rows, uniforms)
    packet = torch.cat([torch.stack([verdict.accepted, own.long(), verdict.next_first]), window])
    return packet, verdict.hidden, verdict.carried


def window_width(window: int | None, n: int) -> int:
    """The verify width of a circuit window: `x_0` and `window - 1` drafted tokens, from 2 (one token to
    test) to the circuit's `n` (None: `n`, or 2 for `n = 1`)."""
    widest = max(n, 2)
    if window is None:
        return widest
    if not isinstance(window, int) or isinstance(window, bool) or not 2 <= window <= widest:
        raise ValueError(f"window must be an integer from 2 to the circuit's {widest} positions, got {window!r}")
    return window


def _carry(target: Target, logits: torch.Tensor) -> torch.Tensor:
    """What the next cycle verifies its first token against: logits (greedy) or probabilities."""
    return target.probs(logits) if target.do_sample else logits


def _pick(target: Target, carried: torch.Tensor, generator) -> torch.Tensor:
    """`[]` the first token from a carried target, on the device."""
    return torch.multinomial(carried, 1, generator=generator)[0] if target.do_sample else carried.argmax()


def _no_stamp(kind: str) -> None:
    """No phase clock: nothing to stamp."""


def _end(streamer) -> None:
    if streamer is not None:
        streamer.end()


