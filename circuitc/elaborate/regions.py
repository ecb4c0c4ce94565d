"""The elaborator's bookkeeping of the graph being built: regions enter it when used, get their
partitions (a repeat identical definition is harmless, a different one an error) and units; and the
count of work (steps, scope entries) every statement, expression and built-in charges against
`circuitc.Limits`."""

from __future__ import annotations

from typing import Any

from ..errors import CircuitError, SourceSpan
from ..graph import scope_name
from ..limits import check_at_most, limit_error
from .values import Definition, Mixture, Product, RegionInfo, RegionRef, describe_value, fail, length


class Regions:
    """Part of `Elaborator` (state set up in its `__init__`): regions, partitions, work counting."""

    def _materialize(self, region: RegionRef) -> RegionInfo:
        info = self.regions.get(region.id)
        if info is None:
            check_at_most("regions", len(self.regions) + 1, self.limits, region.span)
            self._entries(len(region.scope), region.span)  # a region holds its scope
            info = self.regions[region.id] = RegionInfo(region.scope, region.span)
        elif info.scope != region.scope:
            raise fail(f"region {region.id} is used for {scope_name(region.scope, self.varset.name)} here, "
                       f"but for {scope_name(info.scope, self.varset.name)} at {info.span}", region.span)
        return info

    def _set_units(self, region_id: str, units: int, span: SourceSpan | None) -> None:
        info = self.regions[region_id]
        if info.units is not None and info.units != units:
            raise fail(f"region {region_id} gets {units} units here, but {info.units} at {info.units_span}", span)
        info.units, info.units_span = units, span

    def _as_partitions(self, value: Any, span: SourceSpan | None) -> tuple[Product, ...]:
        if isinstance(value, RegionRef):  # a single child passes its units through
            return (Product(self.default_product, (value,)),)
        if isinstance(value, Product):
            return (value,)
        if isinstance(value, Mixture):
            return value.products
        raise fail(f"a region is defined by products of regions (A * B | C ** D), got {describe_value(value)}",
                   span)

    def _define(self, target: RegionRef, products: tuple[Product, ...], span: SourceSpan | None) -> None:
        """Give a region its partitions. Defining it again identically is harmless (recursive
        definitions often reach a shared region twice); defining it differently is an error."""
        info = self._materialize(target)
        for product in products:
            for child in product.children:
                self._materialize(child)
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

    def _region_ref(self, scope: tuple[int, ...], tag: str | None, span) -> RegionRef:
        rid = scope_name(scope, self.varset.name)
        return RegionRef(rid if tag is None else f"{rid}@{tag}", scope, tag, span)

    def _step(self, cost: int, span: SourceSpan | None) -> None:
        """Count `cost` steps of work (a loop turn, the entries of a scope or a list)."""
        self.steps += cost
        if self.steps > self.limits.steps:
            raise self._too_many_steps(span)

    def _entries(self, count: int, span: SourceSpan | None) -> None:
        self.entries += count
        if self.entries > self.limits.scope_entries:
            raise limit_error("scope_entries", self.entries, self.limits, span,
                              what="the regions' scopes name too many variables in all")

    def _too_many_steps(self, span: SourceSpan | None) -> CircuitError:
        return limit_error("steps", self.steps, self.limits, span,
                           what="the program takes too many evaluation steps (is a recursion exponential?)")

    def _check_length(self, items: range | tuple, span: SourceSpan | None, what: str) -> None:
        check_at_most("loop", length(items), self.limits, span, what=f"{what} is too long")
