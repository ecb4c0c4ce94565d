"""circuitc: a compiler for probabilistic circuits.

Pipeline (one module per stage): `.pc` text --syntax--> syntax tree --elaborate--> RegionGraph
--check--> valid RegionGraph --plan--> Plan --runtime--> CompiledCircuit (log_prob, marginals,
prefix marginals, sampling, MAP).
"""

from .errors import CircuitError, Diagnostic, SourceSpan
from .graph import Partition, Region, RegionGraph
from .check import check_graph
from .elaborate import elaborate
from .limits import Limits
from .load import load_graph
from .syntax import parse

__all__ = ["CircuitError", "Diagnostic", "Limits", "SourceSpan", "Partition", "Region", "RegionGraph",
           "check_graph", "compile", "elaborate", "load_graph", "parse"]


def __getattr__(name: str):
    # `compile` needs torch; importing it lazily keeps `circuitc check` and friends quick to start.
    # Importing the submodule binds `circuitc.compile` to it, so bind the function over it.
    if name == "compile":
        from .compiler import compile

        globals()["compile"] = compile
        return compile
    raise AttributeError(f"module 'circuitc' has no attribute {name!r}")
