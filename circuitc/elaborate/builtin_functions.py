"""The built-in functions of `.pc` programs: the structure generators of `circuitc.builders`
(`ff`, `cp`, `hmm`, `btree`, `random_tree`), merged into the program's graph; the products `prod`,
`hadamard`, `kron`; and `len`, `range`, `min`, `max`.

Each is a `Builtin` whose `run(context, args, kwargs, node)` gets the evaluated arguments and a
`BuiltinContext`: the declarations, the region table and the work meter, nothing of the interpreter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import builders
from ..builders import GraphBuilder
from ..limits import Limits, check_at_most, limit_error
from ..syntax import Call
from .declarations import Declarations
from .regions import RegionTable, WorkMeter
from .values import (DEFAULT_UNITS, REQUIRED, Builtin, Product, RegionRef, VarSet, bind_call, describe_value, fail,
                     is_int, length)

# The bounds on a program's work live in `circuitc.limits.Limits`: user recursion is for trees
# (depth log n) and chains are written with `for`, so `call_depth` keeps the interpreter well inside
# Python's own recursion limit; `int_bits` stops `10**10**10` and `k = k * k` from hanging; `steps`
# stops exponential recursion; `loop` stops `for i in 0..10**18` before its first turn.
STEPS_PER_GENERATED_REGION = 4


@dataclass(frozen=True)
class BuiltinContext:
    """What a built-in may use of the elaboration running it."""

    declared: Declarations
    regions: RegionTable
    work: WorkMeter
    limits: Limits
    generated: dict[tuple, RegionRef] = field(default_factory=dict)  # structure calls merged already


def _structure_builtin(name: str, generator: Callable, options: dict[str, Any], doc: str) -> Builtin:
    """A built-in generator from circuitc.builders: it adds its regions over the scope of its first
    argument (a region or the variable set; a tag on the region tags all of its regions) and
    returns the region covering that scope."""
    params = {"region": REQUIRED, **options}

    def run(context: BuiltinContext, args: list, kwargs: dict, node: Call) -> RegionRef:
        if context.declared.varset is None:
            raise fail(f"{name}: declare the variables first, e.g. `vars x[16] states 256`", node.span)
        bound = bind_call(name, params, args, kwargs, node)
        region = bound.pop("region")
        if isinstance(region, VarSet):
            context.work.enter(region.count, node.span)
            region = context.regions.ref(tuple(range(region.count)), None, node.span)
        if not isinstance(region, RegionRef):
            raise fail(f"{name} builds over a region like x[0:n] (or the variable set), got "
                       f"{describe_value(region)}", node.args[0].span if node.args else node.span)
        for key in ("units", "top", "depth", "repetitions"):
            if key in bound and bound[key] is DEFAULT_UNITS:
                bound[key] = context.declared.default_units
            if key in bound and bound[key] is not None and not (is_int(bound[key]) and bound[key] >= 1):
                raise fail(f"{name}: {key} must be a number of at least 1, got {describe_value(bound[key])}",
                           node.span)
        if "seed" in bound and not is_int(bound["seed"]):
            raise fail(f"{name}: seed must be a number, got {describe_value(bound['seed'])}", node.span)
        for key, limit in (("units", "units"), ("top", "units"), ("repetitions", "repetitions")):
            if key in bound:
                check_at_most(limit, bound[key], context.limits, node.span, what=f"{name}: {key} is too large")
        # a generator is deterministic: the same call again adds nothing, so it is not run again
        key = (name, region.id, tuple(sorted(bound.items())))
        if key not in context.generated:
            context.generated[key] = _merge_structure(context, generator, region, bound, node)
        return context.generated[key]

    return Builtin(name, run, f"{name}({', '.join(params)})  {doc}")


def _merge_structure(context: BuiltinContext, generator: Callable, region: RegionRef,
                     options: dict[str, Any], node: Call) -> RegionRef:
    # the builder stops at the regions still allowed, before generating more
    limits = context.limits
    b = GraphBuilder(context.declared.varset.name, max_regions=limits.regions - len(context.regions) + 1,
                     max_entries=context.work.entries_left() + 1)
    keywords = {"top_units": options.pop("top")} if "top" in options else {}
    try:
        top = generator(b, region.scope, *([options.pop("units")] if "units" in options else []), **keywords,
                        **options)
    except builders.BuilderLimit as e:
        if e.args[0] == "regions":
            raise limit_error("regions", f"more than {limits.regions:,}", limits, node.span,
                              what="this structure has too many regions") from None
        raise limit_error("scope_entries", f"more than {limits.scope_entries:,}", limits, node.span,
                          what="this structure's scopes name too many variables in all") from None
    # generating is work even where the regions exist already: its scopes, and steps per region
    # (merging a region costs about as much as running a few statements)
    context.work.enter(context.work.entries_left() + 1 - b.entries_left, node.span)
    context.work.step(STEPS_PER_GENERATED_REGION * len(b.regions), node.span)

    def ref(rid: str) -> RegionRef:
        return RegionRef(rid if region.tag is None else f"{rid}@{region.tag}", b.regions[rid].scope, region.tag,
                         node.span)

    for rid, generated in b.regions.items():
        context.regions.materialize(ref(rid))
        context.regions.set_units(ref(rid).id, generated.units, node.span)
    by_parent: dict[str, list[Product]] = {}
    for p in b.partitions:
        by_parent.setdefault(p.parent, []).append(Product(p.product, tuple(ref(c) for c in p.children)))
    for parent, products in by_parent.items():
        context.regions.define(ref(parent), tuple(products), node.span)
    return ref(top)


def _product_builtin(name: str, kind: str | None) -> Builtin:
    def run(context: BuiltinContext, args: list, kwargs: dict, node: Call) -> Product:
        if kwargs:
            raise fail(f"{name} takes no keyword arguments", node.span)
        regions = args[0] if len(args) == 1 and isinstance(args[0], tuple) else tuple(args)
        if not regions or not all(isinstance(r, RegionRef) for r in regions):
            raise fail(f"{name} multiplies regions: {name}([x[0], x[1]]) or {name}(x[0], x[1])", node.span)
        return Product(kind or context.declared.default_product, tuple(regions))

    what = f"a {kind} product" if kind else "a product of the declared kind"
    return Builtin(name, run, f"{name}(regions)  {what} of a list of regions, like A * B * ...")


def _run_len(context: BuiltinContext, args: list, kwargs: dict, node: Call) -> int:
    if kwargs or len(args) != 1 or not isinstance(args[0], (tuple, range, RegionRef)):
        raise fail("len takes one list or region", node.span)
    return len(args[0].scope) if isinstance(args[0], RegionRef) else length(args[0])


def _run_range(context: BuiltinContext, args: list, kwargs: dict, node: Call) -> range:
    if kwargs or not 1 <= len(args) <= 3 or not all(is_int(a) for a in args):
        raise fail("range takes 1 to 3 numbers: range(stop), range(start, stop), range(start, stop, step)",
                   node.span)
    if len(args) == 3 and args[2] == 0:
        raise fail("range step must not be 0", node.span)
    return range(*args)


def _min_max(name: str, pick: Callable) -> Builtin:
    def run(context: BuiltinContext, args: list, kwargs: dict, node: Call) -> int:
        values = args[0] if len(args) == 1 and isinstance(args[0], (tuple, range)) else args
        if isinstance(values, range) and values and not kwargs:  # by its ends: 0..10**70 is not walked
            return pick(values[0], values[-1])
        if kwargs or not values or not all(is_int(v) for v in values):
            raise fail(f"{name} takes numbers: {name}(a, b, ...) or {name}(list)", node.span)
        return pick(values)

    return Builtin(name, run, f"{name}(a, b, ...)  the {'smallest' if name == 'min' else 'largest'} number")


BUILTINS: dict[str, Builtin] = {
    "ff": _structure_builtin("ff", builders.ff, {},
                             "fully factorised: one partition into single variables, 1 unit everywhere"),
    "cp": _structure_builtin("cp", builders.cp, {"units": DEFAULT_UNITS, "top": 1},
                             "canonical polyadic: one hadamard partition into single variables"),
    "hmm": _structure_builtin("hmm", builders.hmm, {"units": DEFAULT_UNITS, "top": 1},
                              "hidden Markov chain: x[i:] = x[i] * x[i+1:]"),
    "btree": _structure_builtin("btree", builders.btree, {"units": DEFAULT_UNITS, "top": 1},
                                "balanced binary tree: split in halves recursively"),
    "random_tree": _structure_builtin("random_tree", builders.random_tree,
                                      {"units": DEFAULT_UNITS, "top": 1, "depth": None, "repetitions": 1, "seed": 0},
                                      "RAT-SPN: random balanced splits of random permutations, mixed at the top"),
    "prod": _product_builtin("prod", None),
    "hadamard": _product_builtin("hadamard", "hadamard"),
    "kron": _product_builtin("kron", "kronecker"),
    "len": Builtin("len", _run_len, "len(list or region)  its length / number of variables"),
    "range": Builtin("range", _run_range, "range(start, stop, step)  like start..stop, with a step"),
    "min": _min_max("min", min),
    "max": _min_max("max", max),
}
