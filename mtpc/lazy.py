"""Packages whose public names are imported on first use (their modules pull in torch, which the
command line's `--help` and input checks do not need)."""

from __future__ import annotations

import importlib
from typing import Any, Callable

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A package's module-level `__getattr__`: public name `name` comes from its module `exports[name]`
    (relative to `package`), imported when the name is first asked for."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f".{module}", package), name)

    return __getattr__
