"""`load_graph`: any structure source -> a checked `RegionGraph`; `load_plan`: any source -> its `Plan`.

A source is a path to a `.pc` or `.json` file (a graph spec, or a plan file that `circuitc compile`
wrote), `.pc` text, JSON text, a graph-spec or plan dict, or a `RegionGraph`. `.pc` sources are parsed
and elaborated with the given parameter bindings; JSON sources keep their region ids unchanged, and
their regions and partitions are located in the file so structural errors point at the offending lines.
Every graph is checked, and its compiled size bounded (`circuitc.limits`), before it is returned. A
plan file is read as its inline graph spec, checked the same way, and refused unless the plan lowered
again from that graph is the stored one (`circuitc.plan_file`).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .check import check_graph
from .elaborate import elaborate
from .errors import CircuitError, SourceSpan
from .graph import RegionGraph, parse_json, read_source
from .limits import DEFAULT_LIMITS, Limits, check_compiled_size
from .plan_file import check_same_plan, damaged_plan, graph_spec_of, is_plan, looks_like_plan
from .syntax import parse

if TYPE_CHECKING:
    from .plan import Plan


@dataclass
class StoredPlan:
    """A plan file's JSON data, its graph (read, not yet checked) and its name for messages."""

    data: dict[str, Any]
    graph: RegionGraph
    where: str


def load_graph(source: str | Path | dict | RegionGraph, *, include_paths: Sequence[str | Path] = (),
               limits: Limits = DEFAULT_LIMITS, **bindings: Any) -> RegionGraph:
    """Load, elaborate (`.pc`, with `bindings` such as `n=16`) and check a structure.

    `include_paths`: extra folders `include` may read `.pc` files from (besides the including
    file's own folder tree); `limits`: the bounds on its size and work (`circuitc.Limits`).
    A plan file gives its graph, once its plan is checked against it (see `load_plan`).
    Raises `CircuitError` carrying every diagnostic when the source is invalid or too large."""
    source = _read(source, bindings, tuple(include_paths), _checked_limits(limits))
    if isinstance(source, StoredPlan):
        return _agreeing_plan(source, limits).graph
    return _checked_graph(source, limits)


def load_plan(source: str | Path | dict | RegionGraph, *, include_paths: Sequence[str | Path] = (),
              limits: Limits = DEFAULT_LIMITS, **bindings: Any) -> Plan:
    """The `Plan` of any source `load_graph` takes, keeping its checked graph (`plan.graph`): a plan
    file's own plan, refused unless it equals the plan lowered again from the file's graph; any other
    source's graph, lowered."""
    source = _read(source, bindings, tuple(include_paths), _checked_limits(limits))
    if isinstance(source, StoredPlan):
        return _agreeing_plan(source, limits)
    from .plan import lower  # the back end pulls in torch

    return lower(_checked_graph(source, limits))


def _checked_limits(limits: Any) -> Limits:
    if not isinstance(limits, Limits):
        raise TypeError(f"limits must be a circuitc.Limits, got {type(limits).__name__}")
    return limits


def _checked_graph(graph: RegionGraph, limits: Limits) -> RegionGraph:
    graph = check_graph(graph)
    check_compiled_size(graph, limits)
    return graph


def _agreeing_plan(stored: StoredPlan, limits: Limits) -> Plan:
    """The plan lowered from a plan file's checked graph, after refusing a stored plan that differs."""
    from .plan import lower  # the back end pulls in torch

    plan = lower(_checked_graph(stored.graph, limits))
    check_same_plan(stored.data, plan.to_json(), stored.where)
    return plan


def _read(source: Any, bindings: dict[str, Any], include_paths: tuple, limits: Limits) -> RegionGraph | StoredPlan:
    """The unchecked graph of a source, or a plan file's data and graph."""
    if isinstance(source, RegionGraph):
        _no_bindings(bindings, "a RegionGraph")
        return source
    if isinstance(source, dict):
        _no_bindings(bindings, "a plan" if is_plan(source) else "a graph-spec dict")
        return _from_json_data(source, None, None, limits)
    if isinstance(source, Path) or (isinstance(source, str) and _looks_like_path(source)):
        return _read_file(Path(source), bindings, include_paths, limits)
    if isinstance(source, str):
        if source.lstrip().startswith("{"):
            _no_bindings(bindings, "a graph spec or plan")
            return _from_json_text(source, None, limits)
        return elaborate(parse(source, limits=limits), include_paths=include_paths, limits=limits, **bindings)
    raise CircuitError(f"cannot load a structure from {type(source).__name__}: pass a path, .pc text, "
                       f"a graph-spec or plan dict, or a RegionGraph")


def _looks_like_path(text: str) -> bool:
    return "\n" not in text and text.strip().endswith((".pc", ".json"))


def _no_bindings(bindings: dict[str, Any], what: str) -> None:
    if bindings:
        raise CircuitError(f"parameters ({', '.join(bindings)}) apply to .pc sources, not to {what}")


def _read_file(path: Path, bindings: dict[str, Any], include_paths: tuple,
               limits: Limits) -> RegionGraph | StoredPlan:
    if path.suffix not in (".pc", ".json"):  # anything else is not ours to read (nor to echo in messages)
        raise CircuitError(f"cannot read {path}: a structure file ends in .pc or .json")
    text = read_source(path, limits)
    if path.suffix == ".json":
        _no_bindings(bindings, f"the JSON file {path}")
        return _from_json_text(text, str(path), limits)
    return elaborate(parse(text, file=str(path), limits=limits), include_paths=include_paths, limits=limits,
                     **bindings)


def _from_json_text(text: str, file: str | None, limits: Limits) -> RegionGraph | StoredPlan:
    try:
        data = parse_json(text, file)
    except CircuitError as e:
        if looks_like_plan(text) or (file or "").endswith(".plan.json"):  # the name `circuitc compile` gives
            raise damaged_plan(e, file or "plan") from None
        raise
    return _from_json_data(data, text, file, limits)


def _from_json_data(data: Any, text: str | None, file: str | None, limits: Limits) -> RegionGraph | StoredPlan:
    """A graph spec's graph, or a plan's data and inline graph; located in `text` when there is one (a
    plan file holds its graph first, so the graph's keys are found before the plan's)."""
    if not is_plan(data):
        return _located(RegionGraph.from_json(data, source_name=file, limits=limits), text, file)
    where = file or "plan"
    graph = RegionGraph.from_json(graph_spec_of(data, where), source_name=f"{where}: graph", limits=limits)
    return StoredPlan(data, _located(graph, text, file), where)


def _located(graph: RegionGraph, text: str | None, file: str | None) -> RegionGraph:
    if text is not None:
        _locate_json(graph, text, file, text.splitlines())
    return graph


# Every string, whole, and whether it is a key opening an object (`"x[0:4]": {`); a partition's parent key.
# Found in one pass each. Strings are matched whole so that no match starts inside one (from each of a
# string's escaped quotes, a key pattern read to the string's end: quadratic in a string of `\"`).
_STRING_OR_OBJECT_KEY = re.compile(r'"([^"\\]*(?:\\.[^"\\]*)*)"(\s*:\s*\{)?')
_PARENT_KEY = re.compile(r'"parent"\s*:')
_ROOT_KEY = re.compile(r'"root"\s*:')


def _locate_json(graph: RegionGraph, text: str, file: str | None, lines: list[str]) -> None:
    """Give regions and partitions the span of their entry in the JSON text, for messages."""
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def span_at(pos: int) -> SourceSpan:
        line = bisect.bisect_right(line_starts, pos)
        return SourceSpan(file, line, pos - line_starts[line - 1] + 1, source_line=lines[line - 1])

    for m in _STRING_OR_OBJECT_KEY.finditer(text):
        if m.group(2) is None:
            continue
        try:
            key = parse_json(f'"{m.group(1)}"', file)
        except CircuitError:
            continue
        region = graph.regions.get(key)
        if region is not None and region.span is None:
            region.span = span_at(m.start())
    for partition, m in zip(graph.partitions, _PARENT_KEY.finditer(text)):
        partition.span = span_at(m.start())
    root = _ROOT_KEY.search(text)
    if root:
        graph.span = span_at(root.start())

