"""The `circuitc` command: check, export, show, fmt and compile `.pc` (or graph-spec `.json`) files.

Bad input never ends in a traceback: a usage or input error prints `circuitc: error: <message>` (or
located `file:line:col: error:` diagnostics) on stderr and exits 2; a failed run (an unwritable
output, graphviz failing, a bug) exits 1. `--debug` shows the traceback of an unexpected error.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import errno
import subprocess
import tempfile
import sys
import traceback
from dataclasses import fields
from pathlib import Path
from typing import Any, NoReturn, TextIO

from .errors import CircuitError
from .graph import RegionGraph
from .limits import DEFAULT_LIMITS, Limits, compiled_size, flag
from .load import load_graph

EXIT_OK, EXIT_FAILED, EXIT_INPUT = 0, 1, 2


class RunFailed(Exception):
    """A run that could not finish for a reason outside the input (exit status 1)."""


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 2 usage or input error, 1 failure)."""
    out, err = sys.stdout, sys.stderr
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse has printed its help, version or error message
        return e.code if isinstance(e.code, int) else EXIT_INPUT
    try:
        output = getattr(args, "output", None)
        if output is not None and _same_file(output, args.file):  # before reading: b.pc -o b.pc
            raise CircuitError(f"the output {output} is the input file {args.file}; writing it would destroy the "
                               "source (choose another -o)")
        status = args.run(args, out, err)
        out.flush()  # a full standard output fails here, inside the error path, not at exit
        return status
    except CircuitError as e:
        print(_with_prefix(e.render()), file=err)
        return EXIT_INPUT
    except RunFailed as e:
        print(f"circuitc: error: {e}", file=err)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("circuitc: error: interrupted", file=err)
        return 130
    except BrokenPipeError:  # `circuitc show big.pc | head`: the reader left; nothing more to say
        _silence_stdout()
        return EXIT_FAILED
    except OSError as e:  # writing the output failed: `circuitc show x.pc > /dev/full`
        if e.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO):
            raise
        _silence_stdout()
        print(f"circuitc: error: cannot write the output: {e.strerror}", file=err)
        return EXIT_FAILED
    except Exception as e:  # a bug in circuitc, not in the input: say so plainly
        if args.debug:
            traceback.print_exc(file=err)
        what = "out of memory" if isinstance(e, MemoryError) else f"internal error ({type(e).__name__}: {e})"
        print(f"circuitc: error: {what}; rerun with --debug for the traceback and please report it with the "
              f"input file", file=err)
        return EXIT_FAILED


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that flushing it at exit cannot raise again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass


def _with_prefix(report: str) -> str:
    """Unlocated diagnostics (`error: ...`) name the program, as every other CLI error does."""
    return "\n".join(f"circuitc: {line}" if line.startswith("error: ") else line for line in report.split("\n"))


class _Parser(argparse.ArgumentParser):
    """argparse with the project's one error line: `circuitc: error: <message>` and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_INPUT, f"circuitc: error: {message}\n")


class _HelpFormatter(argparse.HelpFormatter):
    """Says each option's default once: appends `(default: X)` unless the help text already names its
    default, or the default says nothing (None, False, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        silent = default is None or default is False or default is argparse.SUPPRESS or default == []
        if silent or not action.option_strings or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def _version() -> str:
    from . import __version__

    return f"circuitc {__version__}"


_LIMIT_HELP = {
    "variables": "most variables of a structure", "states": "most states of a variable",
    "regions": "most regions (and partitions) of a structure", "units": "most units of one region",
    "parameters": "most parameters of the compiled circuit", "steps": "most evaluation steps (statements, calls, loop turns) of a .pc program",
    "scope_entries": "most variables named by all region scopes together",
    "int_bits": "largest integer a .pc program may compute, in bits", "call_depth": "most nested function calls",
    "loop": "longest for loop, list comprehension or list", "repetitions": "most random_tree repetitions",
    "file_bytes": "largest source file, in bytes",
}


def _common_options() -> argparse.ArgumentParser:
    common = _Parser(add_help=False, formatter_class=_HelpFormatter)
    common.add_argument("-I", dest="include_paths", action="append", default=[], metavar="DIR",
                        help="a folder `include` may read .pc files from, besides the file's own folder tree "
                             "(repeatable)")
    limits = common.add_argument_group("limits", "bounds on the work a structure may ask for, checked before "
                                       "anything is allocated (circuitc.Limits from Python)")
    for f in fields(Limits):
        limits.add_argument(flag(f.name), dest=f"max_{f.name}", type=_positive_int, metavar="N",
                            default=getattr(DEFAULT_LIMITS, f.name), help=_LIMIT_HELP[f.name])
    common.add_argument("--debug", action="store_true", help="show the traceback of an unexpected error")
    return common


def _parser() -> argparse.ArgumentParser:
    formatter = _HelpFormatter
    parser = _Parser(prog="circuitc", description="A compiler for probabilistic circuits.", formatter_class=formatter)
    parser.add_argument("--version", action="version", version=_version())
    parser.set_defaults(debug=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _common_options()

    def command(name: str, run, help: str, bindings: bool = True, what: str = ".pc structure file or "
                "graph-spec .json") -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help, formatter_class=formatter, parents=[common])
        sub.add_argument("file", metavar="FILE", help=what)
        if bindings:
            sub.add_argument("-D", dest="bindings", action="append", default=[], type=_binding,
                             metavar="NAME=VALUE", help="set a parameter of the file, e.g. -D n=16 (repeatable)")
        sub.set_defaults(run=run)
        return sub

    command("check", _check, "check a structure; print a one-line summary with its compiled size")
    export = command("export", _export, "write the graph-spec JSON of the elaborated structure")
    export.add_argument("-o", "--output", metavar="OUT", help="output file (default: standard output)")
    show = command("show", _show, "show the region graph as a text tree, graphviz DOT or PNG")
    show.add_argument("--format", choices=("text", "dot", "png"), default="text", help="what to draw")
    show.add_argument("-o", "--output", metavar="OUT",
                      help="output file (default: standard output; a PNG: <stem>.png beside FILE)")
    show.add_argument("--dot-timeout", type=_positive, default=60, metavar="SECONDS",
                      help="png: stop graphviz `dot` after this long (default: 60)")
    fmt = command("fmt", _fmt, "print a .pc file in canonical form, or a graph-spec .json as an equivalent .pc file",
                  bindings=False)
    fmt.add_argument("--in-place", action="store_true", help="rewrite a .pc file instead of printing it")
    compile_ = command("compile", _compile, "check and lower a structure; write the plan JSON, print a summary")
    compile_.add_argument("-o", "--output", metavar="OUT",
                          help="plan JSON file (default: <stem>.plan.json beside FILE)")
    compile_.add_argument("--fuse", action="store_true",
                          help="also build the fused (torch.compile) likelihood programs for --batch sizes, time "
                               "them against eager and print which is faster (fills torch's on-disk compile cache)")
    compile_.add_argument("--batch", type=_batches, default=(1, 1024), metavar="B[,B...]",
                          help="batch sizes for --fuse (default: 1,1024)")
    compile_.add_argument("--threads", type=_positive, default=1, metavar="N",
                          help="torch threads for --fuse")
    return parser


def _positive_int(text: str) -> int:
    if not re.fullmatch(r"[0-9_]{1,30}", text) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


def _limits(args) -> Limits:
    return Limits(**{f.name: getattr(args, f"max_{f.name}") for f in fields(Limits)})


def _binding(text: str) -> tuple[str, Any]:
    """`n=16` -> ("n", 16); `true`/`false` are booleans, anything else not a number is a string."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip().isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    value = value.strip()
    if re.fullmatch(r"-?[0-9]+", value):
        if len(value) > 100:  # int() of thousands of digits is slow, and no parameter needs it
            raise argparse.ArgumentTypeError(f"the number given to {name.strip()} has {len(value):,} digits; "
                                             f"at most 100 are accepted")
        return name.strip(), int(value)
    if value in ("true", "false"):
        return name.strip(), value == "true"
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return name.strip(), value


def _positive(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _batches(text: str) -> tuple[int, ...]:
    """`1,1024` -> (1, 1024)."""
    return tuple(_positive(part) for part in text.split(","))


def _load(args) -> RegionGraph:
    return load_graph(Path(args.file), include_paths=args.include_paths, limits=_limits(args),
                      **_bindings(getattr(args, "bindings", [])))


def _beside(source: str, suffix: str) -> Path:
    """`dir/btree.pc` -> `dir/btree<suffix>`: outputs land next to their source, as a compiler's do."""
    path = Path(source)
    return path.with_name(path.stem + suffix)


def _bindings(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`-D` pairs as keywords; a name given twice is refused (which value was meant is not known)."""
    bindings: dict[str, Any] = {}
    for name, value in pairs:
        if name in bindings:
            raise CircuitError(f"-D {name} is given twice ({bindings[name]!r} and {value!r}); give it once")
        bindings[name] = value
    return bindings


def _write(text: str, output: str | None, out: TextIO, source: str | None = None) -> None:
    """`text` to `output` (replaced atomically) or to `out`; an output that is the input `source` is refused."""
    if output is None:
        out.write(text)
        return
    if source is not None and _same_file(output, source):
        raise CircuitError(f"the output {output} is the input file {source}; writing it would destroy the source "
                           "(choose another -o)")
    try:
        write_atomically(Path(output), text)
    except OSError as e:
        raise RunFailed(f"cannot write {output}: {e.strerror or e}; the file was left as it was") from None


def _same_file(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve() or (Path(a).exists() and os.path.samefile(a, b))
    except OSError:
        return False


def write_atomically(path: Path, text: str) -> None:
    """Write a temporary file beside `path`, fsync it, rename it over `path`: a full disk or a kill leaves
    either the old file or the new one, never a torn one, and no temporary file behind."""
    if path.exists() and not path.is_file():  # /dev/null, a FIFO: write it as it is (nothing to keep)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    mode = path.stat().st_mode & 0o7777 if path.exists() else None
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ----------------------------------------------------------------------------- commands

def _check(args, out: TextIO, err: TextIO) -> int:
    graph = _load(args)  # refuses a graph whose compiled size exceeds the limits
    print(f"{args.file}: ok: {summary(graph)}; compiled: {compiled_size(graph).describe()}", file=out)
    return EXIT_OK


def summary(graph: RegionGraph) -> str:
    inputs = len(graph.input_regions())
    return (f"{_count(graph.variables, 'variable')}, {_count(graph.states, 'state')}, "
            f"{_count(len(graph.regions), 'region')} ({inputs} input, {len(graph.regions) - inputs} inner), "
            f"{_count(len(graph.partitions), 'partition')}, root {graph.root}")


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _export(args, out: TextIO, err: TextIO) -> int:
    _write(spec_text(_load(args)), args.output, out, args.file)
    return EXIT_OK


def spec_text(graph: RegionGraph) -> str:
    """The graph-spec JSON laid out for people: one line per region and per partition."""
    spec = graph.to_json()
    head = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in spec.items() if k not in ("regions", "partitions")]
    regions = [f"  {json.dumps(rid)}: {json.dumps(entry)}" for rid, entry in spec["regions"].items()]
    partitions = [f"  {json.dumps(entry)}" for entry in spec["partitions"]]
    return "\n".join(["{", *head, ' "regions": {', ",\n".join(regions), " },", ' "partitions": [',
                      ",\n".join(partitions), " ]", "}"]) + "\n"


def _show(args, out: TextIO, err: TextIO) -> int:
    graph = _load(args)
    if args.format == "text":
        _write(text_tree(graph), args.output, out, args.file)
    elif args.format == "dot":
        _write(dot(graph), args.output, out, args.file)
    else:
        output = args.output or str(_beside(args.file, ".png"))
        if _same_file(output, args.file):
            raise CircuitError(f"the output {output} is the input file {args.file}; choose another -o")
        _render_png(dot(graph), output, args.dot_timeout)
        print(f"wrote {output}", file=out)
    return EXIT_OK


def _fmt(args, out: TextIO, err: TextIO) -> int:
    from .format import format_module
    from .graph import read_source
    from .syntax import parse

    path = Path(args.file)
    if path.suffix == ".json":  # a graph spec: print the .pc file that elaborates to the same graph
        from .decompile import decompile

        if args.in_place:
            raise CircuitError(f"--in-place rewrites a .pc file; {path} is a graph spec: print its .pc form "
                               f"with `circuitc fmt {path} > FILE.pc`")
        out.write(decompile(_load(args)))
        return EXIT_OK
    if path.suffix != ".pc":
        raise CircuitError(f"cannot read {path}: fmt reads a .pc file or a graph-spec .json file")
    if args.in_place and path.is_symlink():  # never read (and echo) or replace what the link points at
        raise CircuitError(f"--in-place does not rewrite through a symlink: {path} is one; run it on the file the "
                           "link points to")
    text = read_source(path, _limits(args))
    formatted = format_module(parse(text, file=str(path), limits=_limits(args)))
    if args.in_place:
        if formatted != text:
            try:
                write_atomically(path, formatted)
            except OSError as e:
                raise RunFailed(f"cannot rewrite {path}: {e.strerror or e}; the file was left as it was") from None
    else:
        out.write(formatted)
    return EXIT_OK


def _compile(args, out: TextIO, err: TextIO) -> int:
    from .plan import lower  # the back end pulls in torch; only this command needs it

    graph = _load(args)
    plan = lower(graph)
    output = args.output or str(_beside(args.file, ".plan.json"))
    _write(json.dumps(plan.to_json(), indent=1) + "\n", output, out, args.file)
    print(plan.summary(), file=out)
    print(f"wrote {output}", file=out)
    if args.fuse:
        print(_fused_report(plan, args.batch, args.threads), file=out)
    return EXIT_OK


def _fused_report(plan, batches: tuple[int, ...], threads: int) -> str:
    """Warm up the fused likelihood programs (random inputs, shared parameters) and tabulate them."""
    import torch

    from .runtime import CompiledCircuit

    caller_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _warm_up_table(CompiledCircuit(plan, fuse=True), batches, threads)
    finally:
        torch.set_num_threads(caller_threads)


def _warm_up_table(circ, batches: tuple[int, ...], threads: int) -> str:
    import torch

    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(circ.num_params, generator=gen)
    head = f"{'program':<22} {'B':>6} {'compile s':>10} {'eager ms':>10} {'fused ms':>10}  uses"
    lines = [f"fused programs (torch.compile, {threads} thread(s), shared parameters, no grad):", head, "-" * len(head)]
    for batch in batches:
        x = torch.randint(circ.num_states, (batch, circ.num_vars), generator=gen)
        with torch.no_grad():
            report = circ.warm_up(x, theta, repeats=10)
        for name, r in report.items():
            lines.append(f"{name:<22} {batch:>6} {r['compile_s']:>10.1f} {r['eager_ms']:>10.3f} {r['fused_ms']:>10.3f}  "
                         f"{r['uses']}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- pictures

def text_tree(graph: RegionGraph) -> str:
    """The region graph top-down, one line per region, children indented below their parent:
    `x[0:4] (1 unit) = x[0:2] * x[2:4]`. A region reached again is listed once, then marked `^`."""
    lines = [f"{summary(graph)}"]
    seen: set[str] = set()
    stack: list[tuple[str, int]] = [(graph.root, 0)]
    while stack:  # iterative depth-first walk: chains thousands of regions deep are fine
        rid, depth = stack.pop()
        indent = "  " * depth
        if rid in seen:
            lines.append(f"{indent}{rid} ^")
            continue
        seen.add(rid)
        lines.append(f"{indent}{_region_line(graph, rid)}")
        children = [c for p in graph.partitions_of(rid) for c in p.children]
        stack.extend((c, depth + 1) for c in reversed(children))
    return "\n".join(lines) + "\n"


def _region_line(graph: RegionGraph, rid: str) -> str:
    region = graph.regions[rid]
    units = f"{region.units} unit{'s' if region.units != 1 else ''}"
    if graph.is_input(rid):
        return f"{rid} ({units}, input)"
    return f"{rid} ({units}) = " + " | ".join(_product_text(p) for p in graph.partitions_of(rid))


def _product_text(partition) -> str:
    return (" ** " if partition.product == "kronecker" else " * ").join(partition.children)


def dot(graph: RegionGraph) -> str:
    """Graphviz DOT: regions as boxes (inputs shaded), each partition as a small product node
    (x hadamard, (x) kronecker) between its parent and its children."""
    lines = ["digraph circuit {", "  rankdir=TB;", '  node [shape=box, fontname="Helvetica"];']
    for region in graph.regions.values():
        label = f"{region.id}\\n{region.units} unit{'s' if region.units != 1 else ''}"
        style = ', style=filled, fillcolor="#e8eef7"' if graph.is_input(region.id) else ""
        lines.append(f"  {_quote(region.id)} [label={_quote(label, escape=False)}{style}];")
    for k, p in enumerate(graph.partitions):
        node = f"p{k}"
        symbol = "⊗" if p.product == "kronecker" else "×"
        lines.append(f'  {node} [shape=circle, label="{symbol}", width=0.3, fixedsize=true];')
        lines.append(f"  {_quote(p.parent)} -> {node};")
        lines.extend(f"  {node} -> {_quote(c)};" for c in p.children)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _quote(text: str, escape: bool = True) -> str:
    if escape:
        text = text.replace("\\", "\\\\")
    return '"' + text.replace('"', '\\"') + '"'


def _render_png(dot_text: str, output: str, seconds: int = 60) -> None:
    program = shutil.which("dot")
    if program is None:
        raise RunFailed("cannot draw a PNG: the graphviz program `dot` is not installed; "
                           "install graphviz, or use `--format dot` and render the DOT text elsewhere")
    try:
        result = subprocess.run([program, "-Tpng", "-o", output], input=dot_text, text=True, capture_output=True,
                                timeout=seconds)
    except subprocess.TimeoutExpired:
        raise RunFailed(f"graphviz `dot` did not finish within {seconds} s (raise --dot-timeout, or draw a "
                        "smaller structure)") from None
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        raise RunFailed(f"graphviz `dot` failed: {lines[0][:300] if lines else f'exit status {result.returncode}'}")


if __name__ == "__main__":
    sys.exit(main())
