"""The state of one elaboration, handed from step to step of `program.elaborate`: the limits and the
caller's parameter values, the program's names, what it has declared, its regions and its work."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..limits import Limits
from ..syntax import Param
from .declarations import Declarations
from .regions import RegionTable, WorkMeter


@dataclass
class ElaborationState:
    limits: Limits
    bindings: dict[str, Any]  # parameter values given by the caller (`n=16`)
    declared: Declarations
    work: WorkMeter
    regions: RegionTable
    params: dict[str, Param] = field(default_factory=dict)  # the program's parameter declarations, by name
    globals: dict[str, Any] = field(default_factory=dict)  # names bound at the top level, functions included

    @classmethod
    def start(cls, limits: Limits, bindings: dict[str, Any]) -> ElaborationState:
        """The state before the program runs: nothing declared, no regions, no work done."""
        declared, work = Declarations(), WorkMeter(limits)
        return cls(limits, bindings, declared, work, RegionTable(declared, work))
