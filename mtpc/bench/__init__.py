"""Stage: bench. Prompts -> interleaved timed runs of plain decoding, peers and every head variant ->
a report (table, JSON, markdown, plot). `mtpc bench` is `run.run_bench`.

Takes: a model folder, head folders and prompts; hands on: the report dict and its files.
Modules: `config` (what to measure), `prompts`, `timing` (one timed generation), `peers` (transformers'
prompt lookup and assisted generation, static-cache plain decoding), `run` (load, interleave,
measure), `report` (metrics, table, markdown, plots).
"""

from .config import BenchConfig, Variant
from .report import format_table, plot_tradeoff, write_markdown
from .run import run_bench

__all__ = ["BenchConfig", "Variant", "run_bench", "format_table", "plot_tradeoff", "write_markdown"]
