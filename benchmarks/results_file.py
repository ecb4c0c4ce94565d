"""Where a benchmark script's results go: one JSON file, its folder made first."""

from __future__ import annotations

import json
from pathlib import Path


def write_results(result: dict, out: str | None) -> None:
    """Write `result` as indented JSON to `out` (nothing when None) and say so."""
    if not out:
        return
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
