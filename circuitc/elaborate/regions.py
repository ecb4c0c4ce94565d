"""The graph being built, as a table of regions, and the meter of the work that builds it.

`RegionTable`: a region enters it when used, gets its partitions (a repeat identical definition is
harmless, a different one an error) and its units. `WorkMeter`: the steps and scope entries every
statement, expression and built-in charges against `circuitc.Limits`."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SourceSpan
from ..graph import scope_name
from ..limits import Limits, check_at_most, limit_error
from .declarations import Declarations
from .values import Product, RegionRef, fail, length


class WorkMeter:
    """Steps (statements run, calls and loop turns: every repetition of work is one of these) and
    scope entries (variables named by the scopes and lists held), each bounded by `limits`."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.steps = 0
        self.entries = 0

    def step(self, cost: int, span: SourceSpan | None) -> None:
        """Count `cost` steps of work (a loop turn, the entries of a scope or a list)."""
        self.steps += cost
        if self.steps > self.limits.steps:
            raise limit_error("steps", self.steps, self.limits, span,
                              what="the program takes too many evaluation steps (is a recursion exponential?)")

    def enter(self, count: int, span: SourceSpan | None) -> None:
        """Count `count` scope entries."""
        self.entries += count
        if self.entries > self.limits.scope_entries:
            raise limit_error("scope_entries", self.entries, self.limits, span,
                              what="the regions' scopes name too many variables in all")

    def entries_left(self) -> int:
        return self.limits.scope_entries - self.entries

    def check_length(self, items: range | tuple, span: SourceSpan | None, what: str) -> None:
        """A loop or list is bounded before its first turn."""
        check_at_most("loop", length(items), self.limits, span, what=f"{what} is too long")


@dataclass
class RegionInfo:
    scope: tuple[int, ...]
    span: SourceSpan | None
    units: int | None = None  # explicit units; None = settled at the end
    units_span: SourceSpan | None = None


@dataclass
class Definition:
    key: tuple  # the partitions, compared to tell a harmless repeat from a conflict
    span: SourceSpan | None


class RegionTable:
    """The regions used so far (by id, in order of first use), their definitions and partitions."""

    def __init__(self, declared: Declarations, work: WorkMeter):
        self.declared = declared
        self.work = work
        self.regions: dict[str, RegionInfo] = {}
        self.definitions: dict[str, Definition] = {}
        self.partitions: list[tuple[str, Product, SourceSpan | None]] = []  # (parent id, product, span)

    def __len__(self) -> int:
        return len(self.regions)

    def ref(self, scope: tuple[int, ...], tag: str | None, span: SourceSpan | None) -> RegionRef:
        """The region over `scope` (sorted variable indices), tagged or not; it enters the table only when used."""
        rid = scope_name(scope, self.declared.variable_name())
        return RegionRef(rid if tag is None else f"{rid}@{tag}", scope, tag, span)

    def materialize(self, region: RegionRef) -> RegionInfo:
        """Enter a used region (once; the same id must always mean the same scope)."""
        info = self.regions.get(region.id)
        if info is None:
            check_at_most("regions", len(self.regions) + 1, self.work.limits, region.span)
            self.work.enter(len(region.scope), region.span)  # a region holds its scope
            info = self.regions[region.id] = RegionInfo(region.scope, region.span)
        elif info.scope != region.scope:
            name = self.declared.variable_name()
            raise fail(f"region {region.id} is used for {scope_name(region.scope, name)} here, "
                       f"but for {scope_name(info.scope, name)} at {info.span}", region.span)
        return info

    def set_units(self, region_id: str, units: int, span: SourceSpan | None) -> None:
        info = self.regions[region_id]
        if info.units is not None and info.units != units:
            raise fail(f"region {region_id} gets {units} units here, but {info.units} at {info.units_span}", span)
        info.units, info.units_span = units, span

    def define(self, target: RegionRef, products: tuple[Product, ...], span: SourceSpan | None) -> None:
        """Give a region its partitions. Defining it again identically is harmless (recursive
        definitions often reach a shared region twice); defining it differently is an error."""
        info = self.materialize(target)
        for product in products:
            for child in product.children:
                self.materialize(child)
        key = tuple((p.kind, tuple(c.id for c in p.children)) for p in products)
        previous = self.definitions.get(target.id)
        if previous is not None:
            if previous.key == key:
                return
            raise fail(f"region {target.id} is already defined at {previous.span} with other partitions; "
                       f"write all its partitions in one definition: R = A * B | C * D", span)
        self.definitions[target.id] = Definition(key, span)
        info.span = span  # messages about a defined region point at its definition
        for product in products:
            self.partitions.append((target.id, product, span))
