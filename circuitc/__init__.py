"""circuitc: a compiler for probabilistic circuits.

Pipeline (one module per stage): `.pc` text --syntax--> syntax tree --elaborate--> RegionGraph
--check--> valid RegionGraph --plan--> Plan --runtime--> CompiledCircuit (log_prob, marginals,
prefix marginals, sampling, MAP).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("circuitc")  # the distribution that carries circuitc and mtpc
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

from .errors import CircuitError, Diagnostic, SourceSpan  # noqa: E402
from .graph import Partition, Region, RegionGraph  # noqa: E402
from .check import check_graph  # noqa: E402
from .elaborate import elaborate  # noqa: E402
from .limits import Limits  # noqa: E402
from .load import load_graph  # noqa: E402
from .syntax import parse  # noqa: E402

__all__ = ["CircuitError", "Diagnostic", "Limits", "SourceSpan", "Partition", "Region", "RegionGraph",
           "check_graph", "compile", "elaborate", "load_graph", "parse", "__version__"]


def __getattr__(name: str):
    # `compile` needs torch; importing it lazily keeps `circuitc check` and friends quick to start.
    # Importing the submodule binds `circuitc.compile` to it, so bind the function over it.
    if name == "compile":
        from .compiler import compile

        globals()["compile"] = compile
        return compile
    raise AttributeError(f"module 'circuitc' has no attribute {name!r}")
