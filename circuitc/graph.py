"""The region graph: the plain data structure every stage after elaboration works on.

A `RegionGraph` is exactly the meaning of `docs/graph-spec.md` (`circuitc-graph/1`): regions
with a scope and a unit count, partitions (parent, children, product kind) in order, a root, the
number of variables and their number of states. Regions and partitions remember the source span that
created them, so structural errors found later still point into the `.pc` file.

It is a plain container; `digraph` gives the networkx view the checks and the lowering walk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import networkx as nx

from .errors import CircuitError, Diagnostic, SourceSpan
from .limits import DEFAULT_LIMITS, Limits, check_at_most, limit_error

FORMAT = "circuitc-graph/1"
PRODUCTS = ("hadamard", "kronecker")


@dataclass
class Region:
    id: str
    scope: tuple[int, ...]  # sorted variable indices
    units: int
    span: SourceSpan | None = None


@dataclass
class Partition:
    parent: str
    children: tuple[str, ...]
    product: str = "hadamard"
    span: SourceSpan | None = None


@dataclass
class RegionGraph:
    variables: int
    states: int
    units: int  # default units of a region (the root defaults to 1)
    product: str  # default product kind of a partition
    root: str
    regions: dict[str, Region]
    partitions: list[Partition]
    variable_names: list[str] | None = None
    span: SourceSpan | None = None  # where the graph as a whole was declared
    source_name: str | None = None  # the file it came from, for messages without a span

    # ----------------------------------------------------------------- structure queries

    @cached_property
    def digraph(self) -> nx.DiGraph:
        """Regions as nodes, an edge parent -> child for every partition child (networkx view).

        Cached: build a new `RegionGraph` rather than mutating one after its view was taken.
        """
        g = nx.DiGraph()
        g.add_nodes_from(self.regions)
        for p in self.partitions:
            for c in p.children:
                g.add_edge(p.parent, c)
        return g

    @cached_property
    def partitions_by_parent(self) -> dict[str, list[Partition]]:
        by_parent: dict[str, list[Partition]] = {rid: [] for rid in self.regions}
        for p in self.partitions:
            by_parent.setdefault(p.parent, []).append(p)
        return by_parent

    def partitions_of(self, region_id: str) -> list[Partition]:
        return self.partitions_by_parent.get(region_id, [])

    def is_input(self, region_id: str) -> bool:
        return not self.partitions_of(region_id)

    def input_regions(self) -> list[Region]:
        return [r for r in self.regions.values() if self.is_input(r.id)]

    def inner_regions(self) -> list[Region]:
        return [r for r in self.regions.values() if not self.is_input(r.id)]

    def num_inputs(self, partition: Partition) -> int:
        """The number of product units a partition feeds into its parent's sums."""
        sizes = [self.regions[c].units for c in partition.children]
        if partition.product == "hadamard":
            return sizes[0]
        total = 1
        for s in sizes:
            total *= s
        return total

    def sum_inputs(self, region_id: str) -> int:
        """K: the length of a sum unit's weight vector (all partitions' outputs concatenated)."""
        return sum(self.num_inputs(p) for p in self.partitions_of(region_id))

    def bottom_up(self) -> list[str]:
        """Region ids, every child before its parents (requires an acyclic graph)."""
        return list(reversed(list(nx.topological_sort(self.digraph))))

    def describe(self, region_id: str) -> str:
        """A region as people read it in messages: its id, and its scope when the id hides it."""
        region = self.regions.get(region_id)
        if region is None:
            return repr(region_id)
        name = scope_name(region.scope)
        return region_id if region_id.split("#")[0] == name else f"{region_id} (scope {name})"

    # ----------------------------------------------------------------- JSON (the spec's dict)

    def to_json(self) -> dict[str, Any]:
        """Exactly the `circuitc-graph/1` dict; units and products only where they differ from
        the defaults (the root's units always), so `from_json(g.to_json()).to_json()` is stable."""
        regions: dict[str, Any] = {}
        for r in self.regions.values():
            entry: dict[str, Any] = {"scope": list(r.scope)}
            if r.id == self.root or r.units != self.units:
                entry["units"] = r.units
            regions[r.id] = entry
        partitions = []
        for p in self.partitions:
            entry = {"parent": p.parent, "children": list(p.children)}
            if p.product != self.product:
                entry["product"] = p.product
            partitions.append(entry)
        return {
            "format": FORMAT,
            "variables": list(self.variable_names) if self.variable_names else self.variables,
            "states": self.states,
            "units": self.units,
            "product": self.product,
            "root": self.root,
            "regions": regions,
            "partitions": partitions,
        }

    def dumps(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_json(), indent=indent)

    @classmethod
    def from_json(cls, data: dict[str, Any] | str | Path, *, source_name: str | None = None,
                  limits: Limits = DEFAULT_LIMITS) -> "RegionGraph":
        """Read a graph spec dict (or a path to a `.json` file). Malformed JSON, duplicate keys and
        sizes beyond `limits` raise `CircuitError`; structural rules are left to `circuitc.check`."""
        if isinstance(data, (str, Path)):
            path = Path(data)
            source_name = source_name or str(path)
            if path.suffix != ".json":  # never read (and echo in a message) a file that is not a spec
                raise CircuitError(f"cannot read {path}: a graph spec file ends in .json")
            data = parse_json(read_source(path, limits), source_name)
        return _graph_from_dict(data, source_name, limits)


def read_source(path: Path, limits: Limits = DEFAULT_LIMITS, span: SourceSpan | None = None,
                shown: str | None = None) -> str:
    """The UTF-8 text of a regular file no larger than `limits.file_bytes` (no FIFOs or devices:
    reading one could block or never end)."""
    import stat

    shown = shown or str(path)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise CircuitError(Diagnostic(f"cannot read {shown}: not a regular file", span))
        check_at_most("file_bytes", info.st_size, limits, span, what=f"{shown} is too large")
        with path.open("rb") as f:
            data = f.read(limits.file_bytes + 1)
        check_at_most("file_bytes", len(data), limits, span, what=f"{shown} is too large")
        return data.decode("utf-8")
    except OSError as e:
        raise CircuitError(Diagnostic(f"cannot read {shown}: {e.strerror or e}", span)) from None
    except UnicodeDecodeError as e:
        raise CircuitError(Diagnostic(f"cannot read {shown}: not UTF-8 text (byte {e.start})", span)) from None
    except ValueError as e:  # a NUL byte in the path
        raise CircuitError(Diagnostic(f"cannot read {shown}: {e}", span)) from None


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return result


def parse_json(text: str, file: str | None) -> Any:
    """JSON text -> data; a syntax error, a repeated key in one object (JSON leaves its meaning open,
    so it is refused rather than resolved) or nesting too deep for the parser is a `CircuitError`."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        span = SourceSpan(file, e.lineno, e.colno, source_line=_line_of(e.doc, e.lineno))
        raise CircuitError(Diagnostic(f"invalid JSON: {e.msg}", span)) from None
    except _DuplicateKey as e:
        raise CircuitError(f"{file or 'graph spec'}: invalid JSON: the key {_quoted(e.args[0])} appears "
                           f"twice in one object") from None
    except RecursionError:
        raise CircuitError(f"{file or 'graph spec'}: invalid JSON: arrays or objects nest too deeply") from None
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise CircuitError(f"{file or 'graph spec'}: invalid JSON: a number of too many digits") from None


def _quoted(text: str) -> str:
    """A user-supplied string in a message: JSON-quoted (no control characters or lone surrogates),
    cut at 80 characters."""
    quoted = json.dumps(text)
    return quoted if len(quoted) <= 80 else quoted[:77] + '..."'


def scope_name(scope: tuple[int, ...] | list[int], var: str = "x") -> str:
    """`x3` for one variable, `x[2:6]` for a contiguous run, `x{0,3,5}` otherwise."""
    s = sorted(scope)
    if len(s) == 1:
        return f"{var}{s[0]}"
    if s and s == list(range(s[0], s[-1] + 1)):
        return f"{var}[{s[0]}:{s[-1] + 1}]"
    return var + "{" + ",".join(map(str, s)) + "}"


def _line_of(text: str, lineno: int) -> str | None:
    lines = text.splitlines()
    return lines[lineno - 1] if 0 < lineno <= len(lines) else None


def _graph_from_dict(data: Any, source_name: str | None, limits: Limits = DEFAULT_LIMITS) -> RegionGraph:
    where = source_name or "graph spec"
    problems: list[str] = []

    def fail() -> CircuitError:
        return CircuitError([Diagnostic(f"{where}: {p}") for p in problems])

    def bounded(name: str, value: int, what: str | None = None) -> None:
        if value > getattr(limits, name):
            raise limit_error(name, value, limits, what=f"{where}: {what or _TOO_MANY[name]}")

    if not isinstance(data, dict):
        raise CircuitError(f"{where}: a graph spec is a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        problems.append(f'"format" must be "{FORMAT}", got {_shown(data.get("format"))}')
    for key in ("variables", "states", "root", "regions", "partitions"):
        if key not in data:
            problems.append(f'missing key "{key}"')
    if problems:
        raise fail()

    names = None
    variables = data["variables"]
    if isinstance(variables, list):
        bounded("variables", len(variables))
        if not all(isinstance(v, str) and _is_text(v) for v in variables):
            problems.append('"variables" names must be strings')
        elif len(set(variables)) != len(variables):
            problems.append('"variables" names must be distinct')
        names = list(variables)
        variables = len(variables)
    elif not _is_int(variables) or variables < 1:
        problems.append(f'"variables" must be a positive integer or a list of names, got {_shown(variables)}')
    else:
        bounded("variables", variables)
    states = data["states"]
    if not _is_int(states) or states < 1:
        problems.append(f'"states" must be a positive integer, got {_shown(states)}')
    else:
        bounded("states", states)
    units = data.get("units", 1)
    if not _is_int(units) or units < 1:
        problems.append(f'"units" must be a positive integer, got {_shown(units)}')
    else:
        bounded("units", units, 'the default "units" is too large')
    product = data.get("product", "hadamard")
    if product not in PRODUCTS:
        problems.append(f'"product" must be "hadamard" or "kronecker", got {_shown(product)}')
    root = data["root"]
    if not _is_id(root):
        problems.append(f'"root" must be a region id (a string), got {_shown(root)}')
    if not isinstance(data["regions"], dict):
        problems.append('"regions" must be an object mapping region ids to {"scope": [...]}')
    if not isinstance(data["partitions"], list):
        problems.append('"partitions" must be a list')
    if problems:
        raise fail()
    bounded("regions", len(data["regions"]))
    bounded("regions", len(data["partitions"]), "too many partitions")

    regions: dict[str, Region] = {}
    for rid, entry in data["regions"].items():
        if not _is_id(rid):
            problems.append(f"region ids must be non-empty strings of valid Unicode, got {_shown(rid)}")
            continue
        name = _quoted(rid)
        if not isinstance(entry, dict) or "scope" not in entry:
            problems.append(f'region {name} must be an object with a "scope"')
            continue
        scope = entry["scope"]
        if not isinstance(scope, list) or not all(_is_int(i) for i in scope):
            problems.append(f'region {name}: "scope" must be a list of variable indices')
            continue
        if len(set(scope)) != len(scope):
            problems.append(f'region {name}: "scope" repeats a variable')
            continue
        region_units = entry.get("units", 1 if rid == root else units)
        if not _is_int(region_units) or region_units < 1:
            problems.append(f'region {name}: "units" must be a positive integer, got {_shown(region_units)}')
            continue
        bounded("units", region_units, f"region {name} has too many units")
        regions[rid] = Region(rid, tuple(sorted(scope)), region_units)

    partitions: list[Partition] = []
    for k, entry in enumerate(data["partitions"]):
        if not isinstance(entry, dict) or "parent" not in entry or "children" not in entry:
            problems.append(f'partition {k} must be an object with "parent" and "children"')
            continue
        children = entry["children"]
        if not _is_id(entry["parent"]):
            problems.append(f'partition {k}: "parent" must be a region id (a string), got {_shown(entry["parent"])}')
            continue
        if not isinstance(children, list) or not all(_is_id(c) for c in children):
            problems.append(f'partition {k}: "children" must be a list of region ids (strings)')
            continue
        kind = entry.get("product", product)
        if kind not in PRODUCTS:
            problems.append(f'partition {k}: "product" must be "hadamard" or "kronecker", got {_shown(kind)}')
            continue
        partitions.append(Partition(entry["parent"], tuple(children), kind))
    if problems:
        raise fail()

    return RegionGraph(
        variables=variables,
        states=states,
        units=units,
        product=product,
        root=root,
        regions=regions,
        partitions=partitions,
        variable_names=names,
        source_name=source_name,
    )


_TOO_MANY = {"variables": "too many variables", "states": "too many states", "regions": "too many regions"}


def _is_text(value: str) -> bool:
    """Valid Unicode (no lone surrogates, which no file or terminal can hold)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_id(value: Any) -> bool:
    return isinstance(value, str) and value != "" and _is_text(value)


def _shown(value: Any) -> str:
    """A JSON value in a message, short: its JSON text cut at 80 characters, or its Python type."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return f"a {type(value).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
