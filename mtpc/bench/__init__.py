"""Stage: bench. Prompts -> interleaved timed runs of plain decoding, peers and every head variant ->
a report (table, JSON, markdown, plot). `mtpc bench` is `run.run_bench`.

Takes: a model folder, head folders and prompts; hands on: the report dict and its files.
Modules: `config` (what to measure), `prompts`, `timing` (one timed generation), `peers` (transformers'
prompt lookup and assisted generation, static-cache plain decoding), `run` (load, interleave,
measure), `report` (metrics, table, markdown, plots).
Imported lazily (`from mtpc.bench import run_bench`): its modules pull in torch, which `config` (what
the command line reads its options from) does not.
"""

from ..lazy import lazy_getattr

_EXPORTS = {"BenchConfig": "config", "Variant": "config", "run_bench": "run", "format_table": "report",
            "plot_tradeoff": "report", "write_markdown": "report"}
__all__ = list(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
