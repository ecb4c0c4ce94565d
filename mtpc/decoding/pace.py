"""Never slower than plain decoding: a speculative generation that measures its cycles against a plain step
and hands the rest of the generation to plain decoding when they fall behind.

A speculative cycle pays when the tokens it commits outnumber the plain steps its time would have bought.
What was expected at the start (the head's recorded acceptance, this machine's verify costs) can be wrong for
the text at hand: a chat answer accepts fewer drafts than the code a head was measured on, a lookup finds no
matches, a verify costs more under load. `PaceCheck` watches one row's cycles: when they (all of them, and the
latest 16) commit fewer tokens a second than 0.9 times plain decoding (`plain_step`: a plain step measured in
the same mode, eager or compiled: `measured_pace`), the speculative decoder stops before its next cycle,
committing the next token it already decided, and `generate_paced` goes on with a `PlainDecoder` that takes
over the speculative decoder's caches (a copy of their slots: re-reading the text costs, with bf16 on an
AVX2-only CPU, about a step a token). `benchmarks/pace_rules.py` scores such rules on recorded generations.

Exact: the decided token is part of the speculative decoder's output (after a rejected draft it is the
residual's draw; dropping it and sampling the target instead would not be exact: the chi-square test of
`tests/test_pace.py` caught that), each decoder's tokens follow the target's conditionals given everything
before them, and the moment of the hand-over depends only on the past (the cycles' times and tokens), so the
whole sequence follows the target exactly, and greedy output is plain greedy output. A hand-over is for the
rest of the generation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..sampling import GREEDY, Sampling
from .choice.costs import plain_step_seconds
from .cycle.decoder import SpeculativeDecoder
from .inputs import eos_set
from .plain import PlainDecoder
from .stats import DecodeStats, GenerateOutput, Handover

__all__ = ["PaceCheck", "measured_pace", "generate_paced"]


@dataclass(frozen=True)
class PaceCheck:
    """`plain_step`: seconds a token of plain decoding of one row, measured in the decoder's mode (`measured_pace`).
    `cycles`: none is judged before this many cycles ran. `margin`: behind below `margin` times plain decoding's
    tokens a second (a plain step measured at the start read 7% faster than the plain generation beside it,
    SmolLM2 in bf16 on a Xeon: at 0.95 two of six forced chains that ended 1.39x and 1.82x ahead were handed
    over; `benchmarks/pace_rules.py`)."""

    plain_step: float
    cycles: int = 16
    margin: float = 0.9

    def __post_init__(self):
        for name in ("plain_step", "margin"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"PaceCheck: {name} must be a positive number, got {value!r}")
        if isinstance(self.cycles, bool) or not isinstance(self.cycles, int) or self.cycles < 1:
            raise ValueError(f"PaceCheck: cycles must be an int >= 1, got {self.cycles!r}")

    @property
    def plain_rate(self) -> float:
        """Plain decoding's tokens a second."""
        return 1.0 / self.plain_step

    def rate(self, stats: DecodeStats, upto: int | None = None) -> float | None:
        """Tokens a second of the generation's cycles (those before cycle `upto`; default: all); None before
        `cycles` of them ran."""
        upto = stats.cycles if upto is None else upto
        return None if upto < self.cycles else _rate(stats, 0, upto)

    def recent_rate(self, stats: DecodeStats) -> float | None:
        """Tokens a second of the latest `cycles` cycles; None before that many ran."""
        return None if stats.cycles < self.cycles else _rate(stats, stats.cycles - self.cycles, stats.cycles)

    def behind(self, stats: DecodeStats) -> bool:
        """Whether the cycles so far, and the latest `cycles` of them too, run below `margin` times plain
        decoding: all of them, as a stretch of text that drafts badly is no reason to hand over a generation
        that is ahead; the latest too, as drafts that got better (prompt lookup finding the text's own
        repetitions) are no reason to hand over either."""
        bar = self.margin * self.plain_rate
        rate, recent = self.rate(stats), self.recent_rate(stats)
        return rate is not None and rate < bar and recent < bar


def _rate(stats: DecodeStats, start: int, end: int) -> float:
    seconds = sum(stats.cycle_seconds[start:end])
    return sum(stats.accepted_per_cycle[start:end]) / seconds if seconds > 0 else math.inf


def measured_pace(plain: PlainDecoder, prompt_length: int = 64, cycles: int = 16, margin: float = 0.9
                  ) -> PaceCheck:
    """A `PaceCheck` from `plain`'s step measured now (`plain_step_seconds`: a few tokens after a random prompt of
    `prompt_length` tokens, as it decodes: a compiled decoder compiles or loads its step here)."""
    return PaceCheck(plain_step=plain_step_seconds(plain, prompt_length), cycles=cycles, margin=margin)


def generate_paced(speculative: SpeculativeDecoder, plain: PlainDecoder, input_ids: torch.Tensor,
                   max_new_tokens: int, sampling: Sampling = GREEDY, *, pace: PaceCheck, eos_token_id=None,
                   generator: torch.Generator | list[torch.Generator] | None = None, streamer=None,
                   phase_clock=None) -> GenerateOutput:
    """`speculative.generate` of one prompt (`[1, T]` or `[T]`) asked by `pace` before every cycle; when it fell
    behind, the rest of the `max_new_tokens` by `plain` (the same model: a peft model's adapters off), which
    takes over the speculative decoder's caches (`PlainDecoder.continue_from`: the text is not read again) and
    the same `generator`. The stats are both parts' cycles, the hand-over said in `stats.handover`; a streamer
    sees one generation (the prompt once, `end()` once). Both decoders need a model mtpc has a family adapter
    for (preallocated caches)."""
    if not isinstance(pace, PaceCheck):
        raise TypeError(f"pace must be a mtpc.decoding.pace.PaceCheck, got {type(pace).__name__}")
    if not isinstance(plain, PlainDecoder):
        raise TypeError(f"plain must be a mtpc.decoding.PlainDecoder, got {type(plain).__name__}")
    if input_ids.dim() == 2 and input_ids.shape[0] != 1:
        raise ValueError(f"generate_paced decodes one prompt at a time, got a batch of {input_ids.shape[0]} "
                         "(a batch decodes with SpeculativeDecoder.generate, which does not hand over)")
    if speculative.backbone.whole_model or plain.backbone.whole_model:
        raise ValueError("generate_paced needs a model mtpc has a family adapter for (its caches are handed over)")
    eos = eos_set(eos_token_id)
    first = speculative.generate(input_ids, max_new_tokens, sampling, eos_token_id=eos, generator=generator,
                                 streamer=_relay(streamer), phase_clock=phase_clock, pace=pace)
    T = input_ids.shape[-1]
    new = first.sequences[0, T:].tolist()
    if len(new) >= max_new_tokens or (new and new[-1] in eos) or not max_new_tokens:
        if streamer is not None:
            streamer.end()
        return first
    stats = first.stats
    cycles = stats.cycles - 1  # the last commits the decided x_0 without verifying
    rate = pace.rate(stats, upto=cycles)
    cache, length = speculative.verifier.state.verifier, speculative.verifier.lengths[0]  # the text less x_0
    rest = plain.continue_from(cache, length, new[-1], max_new_tokens - len(new), sampling, eos_token_id=eos,
                               generator=generator, streamer=streamer)
    handover = Handover(cycles, len(new), rate if rate is not None else 0.0, pace.plain_rate,
                        rest.stats.prefill_seconds)
    stats.extend(rest.stats, handover)
    return GenerateOutput(torch.cat([first.sequences, rest.sequences.to(first.sequences.device)], 1), stats)


def _relay(streamer):
    return None if streamer is None else _NoEnd(streamer)


class _NoEnd:
    """The speculative part's streamer: the prompt and its tokens, not the end (a plain part may follow)."""

    def __init__(self, streamer):
        self.streamer = streamer

    def put(self, value: torch.Tensor) -> None:
        self.streamer.put(value)

    def end(self) -> None:
        pass
