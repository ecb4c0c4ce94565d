"""The training loop `mtpc train` and `mtpc tiny-lm` share: the training log (started afresh, or
trimmed back to the checkpoint on a resume), the clock (seconds of training carried across resumes),
the budget (`schedule`), periodic evaluation, checkpoints every `save_every` steps, at the end and at
`--stop-after`, and the progress bar.

What differs between the trainers is theirs, behind `Run`: one optimizer step, the evaluation of
the untrained model and during training, what a checkpoint holds, the progress bar's numbers.
Under `torchrun` every rank runs the loop; only rank 0 writes the log and shows the bar.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .checkpoints import append_log, trim_log
from .distributed import Dist, barrier
from .progress import advance, progress_bar
from .schedule import ClockBudget, StepBudget

__all__ = ["Run", "LoopSettings", "run_loop"]


class Run(Protocol):
    """What a trainer gives the loop. `step` counts optimizer steps (a resume restores it); the loop
    keeps `elapsed`, the seconds of training so far, resumes included."""

    step: int
    elapsed: float

    def train_step(self) -> dict:
        """One optimizer step at the budget's `done`; its log record (`step` and `tokens` among them)."""

    def first_record(self) -> dict:
        """Rank 0, a fresh run: the log's step-0 record (the untrained model evaluated)."""

    def evaluate(self, final: bool) -> dict:
        """Fields added to this step's record (empty when no evaluation is due; `final`: the last step)."""

    def postfix(self, record: dict) -> str:
        """The progress bar's text after this step."""

    def save_checkpoint(self) -> None:
        """Write `OUT/checkpoint.pt` (rank 0)."""


@dataclass(frozen=True)
class LoopSettings:
    log: Path  # the JSONL training log
    save_every: int
    stop_after: int | None  # leave the run at this step with a checkpoint
    progress: bool  # show the progress bar (on rank 0)
    name: str  # the progress bar's label


def run_loop(run: Run, budget: StepBudget | ClockBudget, settings: LoopSettings, d: Dist, resumed: bool) -> bool:
    """Train until `budget` is spent (True) or `stop_after` is reached first (False); either way the
    last step is checkpointed. `resumed`: `run` was loaded from its checkpoint."""
    if d.main:
        if resumed:
            trim_log(settings.log, run.step)
        else:
            settings.log.write_text("")
            append_log(settings.log, run.first_record())
    barrier(d)
    budget.update(run.step, run.elapsed, d)
    with progress_bar(budget.bar_total, budget.unit, settings.progress and d.main, settings.name) as bar:
        advance(bar, budget.bar_value(run.step, run.elapsed))
        start = time.perf_counter() - run.elapsed
        while budget.done < 1:
            record = run.train_step()
            run.elapsed = time.perf_counter() - start
            budget.update(run.step, run.elapsed, d)
            final = budget.done >= 1
            record["time_s"] = round(run.elapsed, 2)
            record.update(run.evaluate(final))
            if d.main:
                append_log(settings.log, record)
            bar.total = budget.bar_total  # a time budget re-sizes its step count
            advance(bar, budget.bar_value(run.step, run.elapsed))
            bar.set_postfix_str(run.postfix(record))
            stop = settings.stop_after is not None and run.step >= settings.stop_after
            if run.step % settings.save_every == 0 or final or stop:
                run.save_checkpoint()
                barrier(d)
            if stop and not final:
                return False
    return True
