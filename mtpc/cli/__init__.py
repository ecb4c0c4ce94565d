"""Stage: the command line. `mtpc SUBCOMMAND ...`: argument parsing, one error path (`mtpc: error: ...`),
and the commands; `generate` (text in, text out) is a command here, not a library stage.

Modules: `commands` (the parser, every subcommand's flags and runner, `main()`), `generate` (`mtpc generate`),
`serving_config` and `serve` (`mtpc export-hf`'s and `mtpc serve`'s settings; `mtpc serve`: checks, then vLLM's
server).
"""

from .commands import build_parser, describe_error, main

__all__ = ["main", "build_parser", "describe_error"]
