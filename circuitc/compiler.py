"""`compile(source, **bindings)`: any circuit source to an executable `CompiledCircuit`.

A `RegionGraph` is checked and lowered as is; anything else (a path to a `.pc` or `.json` file, a
graph spec or a plan file that `circuitc compile` wrote; `.pc` text; a graph-spec or plan dict) goes
through `circuitc.load.load_plan` first, which parses, elaborates with the bindings, checks, lowers
(and refuses a plan file whose plan disagrees with its graph). Either way the compiled size is bounded
by `limits` before anything is lowered, and the circuit keeps its checked graph (`circ.graph`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .graph import RegionGraph
from .limits import DEFAULT_LIMITS, Limits, check_compiled_size
from .plan import lower
from .runtime import CompiledCircuit


def compile(source: RegionGraph | dict[str, Any] | str | Path, *, fuse: bool = False,  # noqa: A001
            include_paths: Sequence[str | Path] = (), limits: Limits = DEFAULT_LIMITS,
            **bindings: Any) -> CompiledCircuit:
    """Check and lower `source` and return the compiled circuit (a `torch.nn.Module`; `circ.graph` is
    the checked `RegionGraph`, which a head needs to be saved).

    `include_paths` and `limits` are as for `circuitc.load_graph`. `fuse=True` runs the likelihood
    programs through torch.compile (see `CompiledCircuit.warm_up`)."""
    if isinstance(source, RegionGraph):
        if bindings:
            raise TypeError(f"bindings {sorted(bindings)} only apply to .pc sources, not to a RegionGraph")
        from .check import check_graph  # imported here: the front end is independent of the back end

        graph = check_graph(source)
        check_compiled_size(graph, limits)
        return CompiledCircuit(lower(graph), fuse=fuse)
    from .load import load_plan

    return CompiledCircuit(load_plan(source, include_paths=include_paths, limits=limits, **bindings), fuse=fuse)
