"""`load_graph`: any structure source -> a checked `RegionGraph`.

A source is a path to a `.pc` or `.json` (graph spec) file, `.pc` text, JSON text, a graph-spec
dict or a `RegionGraph`. `.pc` sources are parsed and elaborated with the given parameter bindings;
JSON sources keep their region ids unchanged, and their regions and partitions are located in the
file so structural errors point at the offending lines. Every graph is checked, and its compiled
size bounded (`circuitc.limits`), before it is returned.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .check import check_graph
from .elaborate import elaborate
from .errors import CircuitError, SourceSpan
from .graph import RegionGraph, parse_json, read_source
from .limits import DEFAULT_LIMITS, Limits, check_compiled_size
from .syntax import parse


def load_graph(source: str | Path | dict | RegionGraph, *, include_paths: Sequence[str | Path] = (),
               limits: Limits = DEFAULT_LIMITS, **bindings: Any) -> RegionGraph:
    """Load, elaborate (`.pc`, with `bindings` such as `n=16`) and check a structure.

    `include_paths`: extra folders `include` may read `.pc` files from (besides the including
    file's own folder tree); `limits`: the bounds on its size and work (`circuitc.Limits`).
    Raises `CircuitError` carrying every diagnostic when the source is invalid or too large."""
    if not isinstance(limits, Limits):
        raise TypeError(f"limits must be a circuitc.Limits, got {type(limits).__name__}")
    graph = check_graph(_unchecked_graph(source, bindings, tuple(include_paths), limits))
    check_compiled_size(graph, limits)
    return graph


def _unchecked_graph(source: Any, bindings: dict[str, Any], include_paths: tuple, limits: Limits) -> RegionGraph:
    if isinstance(source, RegionGraph):
        _no_bindings(bindings, "a RegionGraph")
        return source
    if isinstance(source, dict):
        _no_bindings(bindings, "a graph-spec dict")
        return RegionGraph.from_json(source, limits=limits)
    if isinstance(source, Path) or (isinstance(source, str) and _looks_like_path(source)):
        return _graph_from_file(Path(source), bindings, include_paths, limits)
    if isinstance(source, str):
        if source.lstrip().startswith("{"):
            _no_bindings(bindings, "a graph spec")
            return _graph_from_json_text(source, None, limits)
        return elaborate(parse(source, limits=limits), include_paths=include_paths, limits=limits, **bindings)
    raise CircuitError(f"cannot load a structure from {type(source).__name__}: pass a path, .pc text, "
                       f"a graph-spec dict or a RegionGraph")


def _looks_like_path(text: str) -> bool:
    return "\n" not in text and text.strip().endswith((".pc", ".json"))


def _no_bindings(bindings: dict[str, Any], what: str) -> None:
    if bindings:
        raise CircuitError(f"parameters ({', '.join(bindings)}) apply to .pc sources, not to {what}")


def _graph_from_file(path: Path, bindings: dict[str, Any], include_paths: tuple, limits: Limits) -> RegionGraph:
    if path.suffix not in (".pc", ".json"):  # anything else is not ours to read (nor to echo in messages)
        raise CircuitError(f"cannot read {path}: a structure file ends in .pc or .json")
    text = read_source(path, limits)
    if path.suffix == ".json":
        _no_bindings(bindings, f"the graph spec {path}")
        return _graph_from_json_text(text, str(path), limits)
    return elaborate(parse(text, file=str(path), limits=limits), include_paths=include_paths, limits=limits,
                     **bindings)


def _graph_from_json_text(text: str, file: str | None, limits: Limits) -> RegionGraph:
    graph = RegionGraph.from_json(parse_json(text, file), source_name=file, limits=limits)
    _locate_json(graph, text, file, text.splitlines())
    return graph


# A key opening an object (`"x[0:4]": {`) and a partition's parent key, found in one pass each.
_OBJECT_KEY = re.compile(r'"((?:[^"\\]|\\.)*)"\s*:\s*\{')
_PARENT_KEY = re.compile(r'"parent"\s*:')
_ROOT_KEY = re.compile(r'"root"\s*:')


def _locate_json(graph: RegionGraph, text: str, file: str | None, lines: list[str]) -> None:
    """Give regions and partitions the span of their entry in the JSON text, for messages."""
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def span_at(pos: int) -> SourceSpan:
        line = bisect.bisect_right(line_starts, pos)
        return SourceSpan(file, line, pos - line_starts[line - 1] + 1, source_line=lines[line - 1])

    for m in _OBJECT_KEY.finditer(text):
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

