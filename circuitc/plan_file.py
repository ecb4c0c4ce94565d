"""Plan files read back: what `circuitc compile` writes (`Plan.to_json`, format `circuitc-plan/1`) as a
circuit source.

A plan file carries, inline under `"graph"`, the graph spec it was lowered from. Reading one treats the
file as hostile: `circuitc.load` reads and checks that graph spec as any graph spec (within `Limits`),
lowers it again, and `check_same_plan` compares the stored plan with the new one, key by key. A plan
that disagrees with its graph is refused, naming the first place that differs; it is never silently
re-lowered. `counts` (estimates recomputed from the plan) and the graph itself are not compared.

Plain data only: no torch here, so detecting a plan costs nothing to the front end.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import CircuitError

PLAN_FORMAT = "circuitc-plan/1"
RECOMPILE = "recompile its source with `circuitc compile` of this version"
NOT_COMPARED = ("graph", "counts")  # the plan's source, and estimates derived from the plan
_PLAN_START = re.compile(r'\s*\{\s*"format"\s*:\s*"circuitc-plan/')  # how every plan file circuitc writes begins


def is_plan(data: Any) -> bool:
    """Whether JSON data claims to be a plan (of any version): a dict whose `format` is `circuitc-plan/...`."""
    return isinstance(data, dict) and isinstance(data.get("format"), str) and data["format"].startswith("circuitc-plan/")


def looks_like_plan(text: str) -> bool:
    """Whether JSON text begins as a plan file does (told before parsing, for `damaged_plan`)."""
    return _PLAN_START.match(text[:200]) is not None


def damaged_plan(error: CircuitError, where: str) -> CircuitError:
    """A plan file's located JSON syntax error as one line: a machine-written file cut short or garbled
    is recompiled, not edited, so its text (a line of numbers) is not echoed with a caret. An unlocated
    error (a repeated key, too deep) is one line already and is returned as it is."""
    first = error.diagnostics[0]
    if first.span is None:
        return error
    return CircuitError(f"{where}: the plan file is truncated or damaged ({first.message}; line {first.line}, "
                        f"column {first.column}): {RECOMPILE}")


def graph_spec_of(plan: dict[str, Any], where: str) -> dict[str, Any]:
    """The inline graph spec of a stored plan; a plan of another format, or one written before plans
    carried their graph, is refused with what to do about it."""
    if plan.get("format") != PLAN_FORMAT:
        raise CircuitError(f"{where}: the plan's format is {shown(plan.get('format'))}; this circuitc reads "
                           f"{shown(PLAN_FORMAT)}: {RECOMPILE}")
    if "graph" not in plan:
        raise CircuitError(f"{where}: this plan file holds no graph (it was written by circuitc 0.3.0 or earlier, "
                           f"whose plans did not keep the structure they were lowered from): {RECOMPILE}")
    spec = plan["graph"]
    if not isinstance(spec, dict):  # never a path: a plan file does not point at other files
        raise CircuitError(f"{where}: the plan's graph must be the inline graph-spec JSON object, "
                           f"got {type(spec).__name__}")
    return spec


def check_same_plan(stored: dict[str, Any], lowered: dict[str, Any], where: str) -> None:
    """Refuse a stored plan (JSON data) that differs from `lowered` (`Plan.to_json()` of its graph) outside
    `NOT_COMPARED`, naming the first key path that differs."""
    stored_part = {k: v for k, v in stored.items() if k not in NOT_COMPARED}
    lowered_part = json.loads(json.dumps({k: v for k, v in lowered.items() if k not in NOT_COMPARED}))
    if stored_part == lowered_part:
        return
    place = first_difference(stored_part, lowered_part) or "the plan"
    raise CircuitError(f"{where}: the plan disagrees with its graph at {place}: lowering the graph again gives "
                       f"another plan, so the file was edited or written by another circuitc version; {RECOMPILE}")


def first_difference(stored: Any, lowered: Any, path: str = "") -> str | None:
    """The key path (`layers[1].sums[0].param_offset`) of the first place where `stored` differs from
    `lowered`, or None. It walks `lowered`, so its depth bounds the walk, however deep `stored` nests."""
    if isinstance(lowered, dict):
        if not isinstance(stored, dict):
            return path or "the plan"
        for key, value in lowered.items():
            where = f"{path}.{key}" if path else key
            if key not in stored:
                return f"{where} (missing)"
            found = first_difference(stored[key], value, where)
            if found is not None:
                return found
        extra = next((key for key in stored if key not in lowered), None)
        return None if extra is None else f"{path + '.' if path else ''}{shown(extra)} (not a key of a plan)"
    if isinstance(lowered, list):
        if not isinstance(stored, list) or len(stored) != len(lowered):
            return path or "the plan"
        for i, (a, b) in enumerate(zip(stored, lowered)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    return None if stored == lowered and isinstance(stored, bool) == isinstance(lowered, bool) else path


def shown(value: Any) -> str:
    """A value from the file in a message: JSON-quoted (no control characters), cut at 60 characters."""
    text = json.dumps(value) if isinstance(value, (str, int, float, bool)) or value is None else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."
