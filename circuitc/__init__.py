"""circuitc: a compiler for probabilistic circuits.

Pipeline (one module per stage): `.pc` text --syntax--> syntax tree --elaborate--> RegionGraph
--check--> valid RegionGraph --plan--> Plan --runtime--> CompiledCircuit (log_prob, marginals,
prefix marginals, sampling, MAP).
"""

from .errors import CircuitError, Diagnostic, SourceSpan
from .graph import Partition, Region, RegionGraph
from .check import check_graph
from .elaborate import elaborate
from .load import load_graph
from .syntax import parse
from .compile import compile  # noqa: A004  circuitc.compile(source, **bindings) -> CompiledCircuit

__all__ = ["CircuitError", "Diagnostic", "SourceSpan", "Partition", "Region", "RegionGraph", "check_graph", "elaborate", "load_graph", "parse"]
