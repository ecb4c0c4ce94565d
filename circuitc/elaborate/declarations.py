"""What a program has declared so far: its variables (`vars x[16] states 256 units 8 product
kronecker`) and its root. The declarations fill it in as they run; the interpreter, the region table
and the built-ins read it (a built-in needs the variables and the default units, for instance)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SourceSpan
from ..syntax import Vars
from .values import RegionRef, VarSet


@dataclass
class Declarations:
    varset: VarSet | None = None  # None until `vars` has run
    vars_node: Vars | None = None  # the `vars` statement: where messages and the graph point
    states: int = 0
    default_units: int = 1
    default_product: str = "hadamard"
    root: RegionRef | None = None
    root_span: SourceSpan | None = None

    def variable_name(self) -> str:
        """The variables' name, for region ids; only asked once a region exists, so after `vars`."""
        assert self.varset is not None, "regions exist only after the vars declaration"
        return self.varset.name
