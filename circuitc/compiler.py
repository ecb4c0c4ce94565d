"""`compile(source, **bindings)`: any circuit source to an executable `CompiledCircuit`.

A `RegionGraph` is checked and lowered as is; anything else (a path to a `.pc` or `.json` file,
`.pc` text, a graph-spec dict) goes through `circuitc.load.load_graph` first, which parses,
elaborates with the bindings, and checks. Either way the compiled size is bounded by `limits`
before anything is lowered.
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
    """Check and lower `source` and return the compiled circuit (a `torch.nn.Module`).

    `include_paths` and `limits` are as for `circuitc.load_graph`. `fuse=True` runs the likelihood
    programs through torch.compile (see `CompiledCircuit.warm_up`)."""
    if isinstance(source, RegionGraph):
        if bindings:
            raise TypeError(f"bindings {sorted(bindings)} only apply to .pc sources, not to a RegionGraph")
        from .check import check_graph  # imported here: the front end is independent of the back end

        graph = check_graph(source)
        check_compiled_size(graph, limits)
    else:
        from .load import load_graph

        graph = load_graph(source, include_paths=include_paths, limits=limits, **bindings)
    return CompiledCircuit(lower(graph), fuse=fuse)
