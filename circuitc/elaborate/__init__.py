"""Stage: elaborate a parsed `.pc` module, with its parameters bound, into a `RegionGraph`.

One interpreter walks the syntax tree: statements run in order, expressions evaluate to plain
values (ints, bools, strings, lists, and the three structural values below). A region is named by
its variables (`x[0:4]`, plus an optional `@tag`), so writing the same scope twice means the same
region; it enters the graph when it is used: defined (`x[0:4] = A * B`), used as a child, given
units, or made the root. Unit counts are settled at the end (explicit `.units`, else the root's 1,
else the declared default), so a region may be mentioned before its units are set.

Every error is a `CircuitError` located at the source span of the offending expression.

Modules, each importing only those listed after it: `program` (the entry `elaborate`: parameters,
hoisted functions, the files run in order, the final graph), `sources` (the main file and its
includes), `interpreter` (statements and expressions, one rule per syntax node), `state` (one
elaboration's typed state), `operators` (binary operators on values), `builtin_functions` (`ff`,
`cp`, ..., `len`, `range`; each sees only a `BuiltinContext`), `regions` (the region table and the
work meter), `declarations` (what `vars` and `root` declared) and `values` (what expressions
evaluate to).
"""

from .builtin_functions import BUILTINS
from .program import elaborate
from .values import Builtin, Function, Mixture, Product, RegionRef, VarSet, describe_value

__all__ = ["elaborate", "BUILTINS", "Builtin", "Function", "Mixture", "Product", "RegionRef", "VarSet",
           "describe_value"]
