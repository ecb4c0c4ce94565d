"""What every decoder of mtpc hands back: the sequences and the measurements of one generation.

`DecodeStats` counts per cycle (plain decoding: a cycle is one step, one token per row), so a report
reads the speculative and the plain decoder alike.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

__all__ = ["DecodeStats", "Handover", "GenerateOutput", "pad_id", "padded_sequences"]


@dataclass(frozen=True)
class Handover:
    """Where a paced generation (`mtpc.decoding.pace`) handed over to plain decoding: after `cycles` speculative
    cycles and `tokens` tokens, when those cycles measured `speculative_tok_s` against plain decoding's
    `plain_tok_s`; `seconds`: the plain decoder's read of the prompt and the tokens so far (counted in its
    first step)."""

    cycles: int
    tokens: int
    speculative_tok_s: float
    plain_tok_s: float
    seconds: float


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
    proposer_windows: dict[str, int] = field(default_factory=dict)  # windows (one per row and cycle) by proposer
    handover: Handover | None = None  # a paced generation's hand-over to plain decoding, if it made one

    @property
    def lookup_cycles(self) -> int:
        """Windows drafted by prompt lookup."""
        return self.proposer_windows.get("lookup", 0)

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

    def count_windows(self, proposers: list[str]) -> None:
        """A cycle's verified windows, by the name of the proposer of each."""
        for name in proposers:
            self.proposer_windows[name] = self.proposer_windows.get(name, 0) + 1

    def record(self, seconds: float, committed: list[list[int]], width: int) -> None:
        """One cycle: its time, each row's committed tokens (empty for a row that was done), its width."""
        rows = [len(c) for c in committed if c]
        self.cycle_seconds.append(seconds)
        self.accepted_per_cycle.append(sum(rows))
        self.draft_accepted_per_cycle.append(sum(rows) - len(rows))
        self.width_per_cycle.append(width)
        self.rows_per_cycle.append(len(rows))

    def extend(self, later: "DecodeStats", handover: Handover) -> None:
        """Append the cycles of the plain decoding a paced generation handed over to (`later`), its read of the
        text so far counted in its first step: the generation's rate pays for the hand-over."""
        seconds = list(later.cycle_seconds)
        if seconds:
            seconds[0] += handover.seconds
        self.cycle_seconds += seconds
        self.accepted_per_cycle += later.accepted_per_cycle
        self.draft_accepted_per_cycle += later.draft_accepted_per_cycle
        self.width_per_cycle += later.width_per_cycle
        self.rows_per_cycle += later.rows_per_cycle
        self.compile_seconds += later.compile_seconds
        self.handover = handover

    def as_dict(self) -> dict:
        return {"cycles": self.cycles, "new_tokens": self.new_tokens, "mean_accepted": self.mean_accepted,
                "mean_cycle_latency": self.mean_cycle_latency, "tokens_per_second": self.tokens_per_second,
                "prefill_seconds": self.prefill_seconds, "compile_seconds": self.compile_seconds,
                "cycle_seconds": list(self.cycle_seconds), "accepted_per_cycle": list(self.accepted_per_cycle),
                "draft_accepted_per_cycle": list(self.draft_accepted_per_cycle),
                "width_per_cycle": list(self.width_per_cycle), "rows_per_cycle": list(self.rows_per_cycle),
                "lookup_cycles": self.lookup_cycles, "proposer_windows": dict(self.proposer_windows),
                "handover": asdict(self.handover) if self.handover is not None else None}


@dataclass
class GenerateOutput:
    sequences: torch.Tensor  # [B, T + new] long: the prompts as given, then each row's tokens, then padding
    stats: DecodeStats


def pad_id(config, eos: set[int], pad: int | None) -> int:
    """The id after a row's end: `pad` if given, else the model's pad id, else the first EOS id, else 0."""
    if pad is None:
        pad = getattr(config, "pad_token_id", None)
    if pad is None:
        pad = min(eos) if eos else 0
    return pad


def padded_sequences(prompt: torch.Tensor, new: list[list[int]], pad: int) -> torch.Tensor:
    """`[B, T + longest]`: the prompts `[B, T]` as given, each row's new tokens, then `pad`."""
    longest = max(len(tokens) for tokens in new)
    tail = torch.tensor([tokens + [pad] * (longest - len(tokens)) for tokens in new], dtype=torch.long)
    return torch.cat([prompt, tail.reshape(len(new), longest).to(prompt.device)], 1)
