"""A graph spec (or any `RegionGraph`) back to `.pc` text: `circuitc fmt FILE.json`.

The text declares the variables with the graph's defaults, gives every inner region one definition
listing its partitions in order (`R = A * B | C ** D`), sets the units that differ from the default
and names the root; `circuitc fmt` prints it in canonical layout. Elaborating the text gives the
same graph. A region id that a `.pc` file cannot write (`.pc` names a region by its scope and an
optional `@tag`) becomes the tag of its scope: JSON id `"r"` over variables 0..3 is `x[0:4]@"r"`;
`decompile_names` returns that renaming.
"""

from __future__ import annotations

import re

from .format import format_module
from .graph import RegionGraph, scope_name
from .syntax import parse

VARIABLE = "x"
_STRING_SAFE = re.compile(r'[^"\\\n\r]+')  # what a .pc string literal can hold


def decompile(graph: RegionGraph) -> str:
    """Canonical `.pc` text that elaborates to `graph` (ids renamed as `decompile_names` says)."""
    return format_module(parse(_text(graph, decompile_names(graph))))


def decompile_names(graph: RegionGraph) -> dict[str, str]:
    """Region id in `graph` -> the id the decompiled `.pc` text gives that region."""
    names: dict[str, str] = {}
    used: set[str] = set()
    for rid, region in graph.regions.items():
        scope = scope_name(region.scope, VARIABLE)
        if rid == scope or (rid.startswith(scope + "@") and _STRING_SAFE.fullmatch(rid[len(scope) + 1:])):
            name = rid  # already a .pc name (exported from a .pc file)
        else:
            tag = rid if _STRING_SAFE.fullmatch(rid) else "r"
            name, k = f"{scope}@{tag}", 1
            while name in used or (name in graph.regions and name != rid):
                name, k = f"{scope}@{tag}#{k}", k + 1
        used.add(name)
        names[rid] = name
    return names


def _text(graph: RegionGraph, names: dict[str, str]) -> str:
    source = f" from {graph.source_name}" if graph.source_name else ""
    lines = [f"# decompiled{source} by circuitc fmt"]
    if graph.variable_names:
        lines.append("# variables: " + ", ".join(n.replace("\n", " ") for n in graph.variable_names))
    lines.append(f"vars {VARIABLE}[{graph.variables}] states {graph.states} units {graph.units} "
                 f"product {graph.product}")
    for rid in graph.regions:
        partitions = graph.partitions_of(rid)
        if partitions:
            products = " | ".join(_product(graph, p, names) for p in partitions)
            lines.append(f"{_ref(graph, rid, names)} = {products}")
    for rid, region in graph.regions.items():
        default = 1 if rid == graph.root else graph.units
        if region.units != default:
            lines.append(f"{_ref(graph, rid, names)}.units = {region.units}")
    lines.append(f"root {_ref(graph, graph.root, names)}")
    return "\n".join(lines) + "\n"


def _product(graph: RegionGraph, partition, names: dict[str, str]) -> str:
    children = [_ref(graph, c, names) for c in partition.children]
    if partition.product == graph.product and len(children) > 1:
        return " * ".join(children)
    if partition.product == "kronecker" and len(children) > 1:
        return " ** ".join(children)
    # one child of a non-default kind, or hadamard under a kronecker default: the built-ins say it
    builtin = "kron" if partition.product == "kronecker" else "hadamard"
    return children[0] if partition.product == graph.product else f"{builtin}({', '.join(children)})"


def _ref(graph: RegionGraph, rid: str, names: dict[str, str]) -> str:
    """The `.pc` expression naming region `rid`: `x[0:4]`, `x3`, `x[0, 2, 5:7]@"tag"`."""
    region = graph.regions[rid]
    name = names[rid]
    scope = scope_name(region.scope, VARIABLE)
    expression = _subscript(region.scope)
    if name == scope:
        return expression
    return f'{expression}@"{name[len(scope) + 1:]}"'


def _subscript(scope: tuple[int, ...]) -> str:
    if len(scope) == 1:
        return f"{VARIABLE}[{scope[0]}]"
    runs: list[list[int]] = []
    for i in scope:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    parts = [str(a) if a == b else f"{a}:{b + 1}" for a, b in runs]
    return f"{VARIABLE}[{', '.join(parts)}]"
