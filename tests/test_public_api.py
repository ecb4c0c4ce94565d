"""`dir(mtpc)` and `help(mtpc)` show the public API although its names are imported lazily.

`mtpc.__getattr__` imports each public name on first use (most need torch and transformers), so the
names are not in the module's globals until then; `mtpc.__dir__` lists them anyway, and pydoc, which
reads `dir()` and `__all__`, documents them."""

from __future__ import annotations

import pydoc
import subprocess
import sys

import mtpc


def test_every_public_name_resolves_to_what_its_module_defines():
    for name in mtpc.__all__:
        assert getattr(mtpc, name) is not None, name
    assert "__version__" in mtpc.__all__ and len(mtpc.__all__) == len(set(mtpc.__all__))


def test_dir_lists_the_public_names_before_any_is_imported_and_without_torch():
    # a fresh interpreter: in this one other tests have already resolved (and cached) the names
    code = ("import sys, mtpc; names = dir(mtpc); "
            "assert 'torch' not in sys.modules, 'dir() imported torch'; print(' '.join(names))")
    names = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert set(mtpc.__all__) <= set(names)
    assert {"importlib", "version", "PackageNotFoundError"}.isdisjoint(names)  # helpers, not API
    assert names == sorted(names)


def test_help_documents_every_public_class_and_function():
    text = pydoc.render_doc(mtpc, renderer=pydoc.plaintext)
    for name in mtpc.__all__:
        if name != "__version__":
            assert f"\n    {name}" in text or f"class {name}" in text or f"{name}(" in text, name
    assert f"VERSION\n    {mtpc.__version__}" in text


def test_the_model_packages_names_resolve_from_their_modules_and_importing_it_needs_no_torch():
    """`mtpc.lm` exports its names lazily: each is the object its module defines, and importing the package (as
    every loader's `from ..lm import loading` does, on the command line's quick path) pulls in no torch."""
    import importlib

    import mtpc.lm as lm

    for name in lm.__all__:
        module = importlib.import_module(f"mtpc.lm.{lm._EXPORTS[name]}")
        assert getattr(lm, name) is getattr(module, name), name
    code = "import sys, mtpc.lm, mtpc.lm.loading, mtpc.lm.lora; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
