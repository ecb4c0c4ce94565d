"""Never slower than plain decoding: a speculative generation that measures its cycles against a plain step
and hands the rest of the generation to plain decoding when they fall behind.

A speculative cycle pays when the tokens it commits outnumber the plain steps its time would have bought.
What was expected at the start (the head's recorded acceptance, this machine's verify costs) can be wrong for
the text at hand: a chat answer accepts fewer drafts than the code a head was measured on, a lookup finds no
matches, a verify costs more under load. `PaceCheck` watches one row's cycles: when they commit fewer tokens
a second than plain decoding (`plain_step`: the seconds of one plain step measured in the same mode, eager or
compiled: `measured_pace`), and plain decoding is expected to finish the rest of the budget sooner, its read
of the text so far included, the speculative decoder stops before its next cycle, committing the next token
it already decided, and `generate_paced` goes on with a `PlainDecoder` from the prompt and the tokens so far
(one read of both: its cost is counted in the first plain step).

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
from .choice.costs import plain_costs
from .cycle.decoder import SpeculativeDecoder
from .inputs import eos_set
from .plain import PlainDecoder
from .stats import DecodeStats, GenerateOutput, Handover

__all__ = ["PaceCheck", "measured_pace", "generate_paced"]


@dataclass(frozen=True)
class PaceCheck:
    """`plain_step`: seconds of one plain decoding step of one row, measured in the decoder's mode. `read`:
    seconds per token of the plain decoder's read of a text (what a hand-over pays for the text so far).
    `cycles`: none is judged before this many cycles ran. `margin`: judged behind below `margin` times plain
    decoding's tokens a second."""

    plain_step: float
    read: float = 0.0
    cycles: int = 16
    margin: float = 1.0

    def __post_init__(self):
        for name in ("plain_step", "margin"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"PaceCheck: {name} must be a positive number, got {value!r}")
        if isinstance(self.read, bool) or not isinstance(self.read, (int, float)) or not 0 <= self.read < math.inf:
            raise ValueError(f"PaceCheck: read must be a number of seconds >= 0, got {self.read!r}")
        if isinstance(self.cycles, bool) or not isinstance(self.cycles, int) or self.cycles < 1:
            raise ValueError(f"PaceCheck: cycles must be an int >= 1, got {self.cycles!r}")

    @property
    def plain_rate(self) -> float:
        """Plain decoding's tokens a second."""
        return 1.0 / self.plain_step

    def rate(self, stats: DecodeStats, upto: int | None = None) -> float | None:
        """Tokens a second of the generation's cycles (those before cycle `upto`; default: all); None before
        `cycles` of them ran. All of them: a stretch of text that drafts badly is no reason to hand over a
        generation that is ahead."""
        upto = stats.cycles if upto is None else upto
        if upto < self.cycles:
            return None
        seconds = sum(stats.cycle_seconds[:upto])
        return sum(stats.accepted_per_cycle[:upto]) / seconds if seconds > 0 else math.inf

    def behind(self, stats: DecodeStats, left: int, length: int) -> bool:
        """Whether plain decoding is expected to finish a row's `left` tokens sooner, its read of the `length`
        tokens of text so far included: the cycles measured below `margin` times plain decoding's rate, and the
        time plain decoding saves over the rest (at those rates) outweighs the read."""
        rate = self.rate(stats)
        if rate is None or rate >= self.margin * self.plain_rate:
            return False
        return left * (1.0 / rate - self.plain_step) > self.read * length


def measured_pace(plain: PlainDecoder, prompt_length: int = 64) -> PaceCheck:
    """A `PaceCheck` from `plain`'s costs measured now (`plain_costs`: its step and its read, decoding a few
    tokens after a random prompt of `prompt_length` tokens; a compiled decoder compiles or loads its step)."""
    costs = plain_costs(plain, prompt_length)
    return PaceCheck(plain_step=costs.step, read=costs.read)


def generate_paced(speculative: SpeculativeDecoder, plain: PlainDecoder, input_ids: torch.Tensor,
                   max_new_tokens: int, sampling: Sampling = GREEDY, *, pace: PaceCheck, eos_token_id=None,
                   generator: torch.Generator | list[torch.Generator] | None = None, streamer=None,
                   phase_clock=None) -> GenerateOutput:
    """`speculative.generate` of one prompt (`[1, T]` or `[T]`) asked by `pace` before every cycle; when it fell
    behind, the rest of the `max_new_tokens` by `plain` (the same model, its verifier: a peft model's
    adapters off) from the prompt and the tokens so far, with the same `generator`. The stats are both parts'
    cycles, the hand-over said in `stats.handover`; a streamer sees one generation (the prompt once, `end()`
    once)."""
    if not isinstance(pace, PaceCheck):
        raise TypeError(f"pace must be a mtpc.decoding.pace.PaceCheck, got {type(pace).__name__}")
    if not isinstance(plain, PlainDecoder):
        raise TypeError(f"plain must be a mtpc.decoding.PlainDecoder, got {type(plain).__name__}")
    if input_ids.dim() == 2 and input_ids.shape[0] != 1:
        raise ValueError(f"generate_paced decodes one prompt at a time, got a batch of {input_ids.shape[0]} "
                         "(a batch decodes with SpeculativeDecoder.generate, which does not hand over)")
    eos = eos_set(eos_token_id)
    first = speculative.generate(input_ids, max_new_tokens, sampling, eos_token_id=eos, generator=generator,
                                 streamer=_relay(streamer, prompt=True), phase_clock=phase_clock, pace=pace)
    T = input_ids.shape[-1]
    new = first.sequences[0, T:].tolist()
    if len(new) >= max_new_tokens or (new and new[-1] in eos) or not max_new_tokens:
        if streamer is not None:
            streamer.end()
        return first
    stats = first.stats
    cycles = stats.cycles - 1  # the last commits the decided x_0 without verifying
    rate = pace.rate(stats, upto=cycles)
    rest = plain.generate(first.sequences, max_new_tokens - len(new), sampling, eos_token_id=eos,
                          generator=generator, streamer=_relay(streamer, prompt=False))
    handover = Handover(cycles, len(new), rate if rate is not None else 0.0, pace.plain_rate,
                        rest.stats.prefill_seconds)
    stats.extend(rest.stats, handover)
    return GenerateOutput(rest.sequences, stats)


def _relay(streamer, prompt: bool):
    return None if streamer is None else _Relay(streamer, prompt)


class _Relay:
    """A streamer for one part of a paced generation: the first part streams the prompt and its tokens but not
    the end (a plain part may follow), the plain part its tokens and the end but not its prompt (the first
    part's prompt and tokens, already streamed)."""

    def __init__(self, streamer, prompt: bool):
        self.streamer, self.prompt, self.first = streamer, prompt, True

    def put(self, value: torch.Tensor) -> None:
        skip = self.first and not self.prompt
        self.first = False
        if not skip:
            self.streamer.put(value)

    def end(self) -> None:
        if not self.prompt:
            self.streamer.end()
