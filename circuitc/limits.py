"""Bounds on the work a structure source may ask for, checked before anything is allocated.

A `.pc` file is a small program and a graph spec is data, both possibly written by someone else:
`vars x[10**9]`, a kronecker product of three 10^4-unit regions (10^12 sum inputs) or an
exponential recursion would otherwise end in a MemoryError, an OOM kill or an hour of work. Every
bound is a field of `Limits`; each has a `--max-<field>` flag on the `circuitc` command line
(underscores become dashes) and is a keyword of `Limits(...)`, passed as `limits=` to `load_graph`,
`elaborate`, `RegionGraph.from_json` and `compile`. Exceeding one is a located `CircuitError` that
names the bound and how to raise it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .errors import CircuitError, Diagnostic, SourceSpan


@dataclass(frozen=True)
class Limits:
    """The bounds (defaults fit any circuit a multi-token head or a benchmark uses, with room)."""

    variables: int = 100_000  # variables of a structure
    states: int = 1_000_000  # states of each variable
    regions: int = 250_000  # regions of a structure (partitions are bounded by the same number)
    units: int = 65_536  # units of one region
    parameters: int = 2**30  # logits of the compiled circuit (4 GiB in float32); also bounds the plan
    steps: int = 1_000_000  # evaluation steps of a .pc program: statements run, calls, loop turns
    scope_entries: int = 20_000_000  # variables named by subscripts and held by all regions' scopes
    int_bits: int = 256  # size of any integer a .pc program computes or binds
    call_depth: int = 64  # nested calls of user functions (recursion is for trees, depth log n)
    loop: int = 1_000_000  # length of one for loop, list comprehension or list
    repetitions: int = 1024  # repetitions of random_tree
    file_bytes: int = 16 * 2**20  # size of one .pc or .json source file

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Limits.{f.name} must be a positive integer, got {value!r}")


DEFAULT_LIMITS = Limits()

# What each bound counts, for messages ("too many regions: ...").
_WHAT = {
    "variables": "variables", "states": "states per variable", "regions": "regions", "units": "units in one region",
    "parameters": "parameters", "steps": "evaluation steps",
    "scope_entries": "variables in region scopes, counted over all regions", "int_bits": "bits in an integer",
    "call_depth": "nested calls", "loop": "items in one loop or list", "repetitions": "random_tree repetitions",
    "file_bytes": "bytes in one source file",
}


def flag(name: str) -> str:
    """The command-line flag of a bound: `int_bits` -> `--max-int-bits`."""
    return "--max-" + name.replace("_", "-")


def limit_message(name: str, value: int | str | None, limits: Limits, what: str | None = None,
                  detail: str = "") -> str:
    """`too many regions (1,000,001; the limit is 1,000,000): raise it with --max-regions or
    circuitc.Limits(regions=...)`; without a value the limit is left to `what` to say."""
    bound = getattr(limits, name)
    shown = f"{value:,}" if isinstance(value, int) else value
    amount = "" if value is None else f" ({shown}; the limit is {bound:,}{detail})"
    return (f"{what or 'too many ' + _WHAT[name]}{amount}: raise it with {flag(name)} or "
            f"circuitc.Limits({name}=...)")


def limit_error(name: str, value: int | str | None, limits: Limits, span: SourceSpan | None = None,
                what: str | None = None, detail: str = "") -> CircuitError:
    return CircuitError(Diagnostic(limit_message(name, value, limits, what, detail), span))


def check_at_most(name: str, value: int, limits: Limits, span: SourceSpan | None = None,
                  what: str | None = None) -> None:
    if value > getattr(limits, name):
        raise limit_error(name, value, limits, span, what)


@dataclass(frozen=True)
class CompiledSize:
    """What compiling a checked graph will allocate, computed from the graph alone (exact ints)."""

    parameters: int  # logits per example: U*v per input region, U*K per inner region
    largest_region: str | None  # the inner region with the most sum weights
    largest_units: int  # its U
    largest_inputs: int  # its K (a kronecker partition multiplies its children's units)

    def describe(self) -> str:
        text = f"{self.parameters:,} parameters"
        if self.largest_region is not None:
            text += (f", largest sum region {self.largest_region} "
                     f"({self.largest_units:,} x {self.largest_inputs:,} weights)")
        return text


def compiled_size(graph) -> CompiledSize:
    """The parameter count of `graph` as the spec defines it (equal to `compile(graph).num_params`)
    and its widest sum region; `graph` must name only existing regions."""
    by_parent: dict[str, int] = {}
    for p in graph.partitions:
        units = [graph.regions[c].units for c in p.children]
        k = units[0] if p.product == "hadamard" else _product(units)
        by_parent[p.parent] = by_parent.get(p.parent, 0) + k
    total, largest = 0, (None, 0, 0)
    for rid, region in graph.regions.items():
        k = by_parent.get(rid)
        if k is None:
            total += region.units * graph.states
        else:
            total += region.units * k
            if region.units * k > largest[1] * largest[2]:
                largest = (rid, region.units, k)
    return CompiledSize(total, *largest)


def check_compiled_size(graph, limits: Limits) -> CompiledSize:
    """Refuse a graph whose compiled circuit would exceed `limits.parameters` (before lowering)."""
    size = compiled_size(graph)
    if size.parameters > limits.parameters:
        largest = f"; the largest sum region, {size.largest_region}, has {size.largest_units:,} x " \
                  f"{size.largest_inputs:,}" if size.largest_region is not None else ""
        span = graph.regions[size.largest_region].span if size.largest_region is not None else graph.span
        raise limit_error("parameters", size.parameters, limits, span,
                          what="the compiled circuit would have too many parameters", detail=largest)
    return size


def _product(values: list[int]) -> int:
    total = 1
    for v in values:
        total *= v
    return total
