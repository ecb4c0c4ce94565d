"""The `mtpc` command line: one `add_*` (arguments) and one `run_*` (action) function per subcommand.

A subcommand's options are its config dataclass's option fields (`mtpc.settings`: type, default and
help written once, in the field), and `command_config(args)` builds the config from them.

Every subcommand shares one error path (`main`): a mistake is one `mtpc: error: <message>` line on
stderr with exit status 2 (usage and input errors: bad flags, missing or damaged files, unsupported
models), a run that fails exits with 1, and tracebacks are printed only with `--debug`. Parsers made
by `sub.add_parser(...)` inherit this (and `--debug`, and defaults in `--help`) from `Parser`.

Importing this module must stay cheap (`mtpc --help` runs in a fraction of a second): the config
modules import no torch; torch, transformers and the modules that run the commands are imported
inside the `run_*` functions only.
"""

from __future__ import annotations

import argparse
import sys

from ..bench.config import BenchConfig
from ..checks import check_sampling_settings
from ..errors import InputError, MtpcError, first_line
from ..settings import add_settings, config_from_args
from ..training.config import DistillConfig, FeaturesConfig, TinyLMConfig, TrainConfig
from .generate_config import GenerateConfig
from .serving_config import ExportConfig, ServeConfig


class HelpFormatter(argparse.HelpFormatter):
    """Appends `(default: X)` to every option with a default worth showing (not None, a switch's
    True/False or empty), once: not when the help text already names its default. (Python 3.11's
    BooleanOptionalAction appends its own `(default: %(default)s)` to the help; that copy is dropped
    and judged like any other.)"""

    def _get_help_string(self, action):
        text = (action.help or "").replace(" (default: %(default)s)", "")
        default = action.default
        hidden = default is None or isinstance(default, bool) or default is argparse.SUPPRESS or default in ([], ())
        if "default" in text or hidden or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An argparse parser whose mistakes become `InputError`s (reported by `main`), with `--debug` on
    every (sub)command and defaults shown in `--help`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                          help="print the full traceback of an error")

    def error(self, message: str):
        where = self.prog.removeprefix("mtpc").strip()
        raise InputError(f"{where + ': ' if where else ''}{message} (see {self.prog} --help)")


def version() -> str:
    from .. import __version__  # the distribution's version (circuitc ships both packages)

    return __version__


def add_command(sub, name: str, config: type, run, help: str, description: str) -> None:
    """A subcommand whose options are the option fields of `config` (`mtpc.settings`), run by `run(args)`."""
    p = sub.add_parser(name, help=help, description=description)
    add_settings(p, config)
    p.set_defaults(func=run, config=config)


def command_config(args: argparse.Namespace, **given):
    """The config of the command `args` were parsed for (`args.config`), built from its options, its
    sampling settings checked (`check_sampling_settings`: one rule for every command that has them, before
    any model loads); `given`: the fields the command reads its own way (`generate`'s standard input)."""
    config = config_from_args(args.config, args, **given)
    check_sampling_settings(config)
    return config


def add_tiny_lm(sub) -> None:
    add_command(sub, "tiny-lm", TinyLMConfig, run_tiny_lm,
                help="train a small byte-level Llama from scratch on a local corpus",
                description="Train a ~1.9M-parameter byte-level LlamaForCausalLM (default: on the Python "
                            "standard library sources) and save it as a local Hugging Face checkpoint.")


def run_tiny_lm(args) -> int:
    from ..training.tiny_lm import train_tiny_lm

    s = train_tiny_lm(command_config(args))
    if "stopped_at" in s:
        print(f"stopped at step {s['stopped_at']}; {args.out}/checkpoint.pt resumes it (rerun the same command)")
        return 0
    if not s:  # not rank 0 under torchrun
        return 0
    print(f"saved {args.out}: {s['parameters'] / 1e6:.2f}M parameters, {s['steps']} steps, "
          f"{s['train_tokens']:,} tokens in {s['train_seconds']:.0f} s ({s['tokens_per_second']:,} tok/s), "
          f"held-out {s['val_bits_per_byte']:.3f} bits/byte (start {s['val_bits_per_byte_at_start']:.3f})")
    if "tokenizer" in s:
        print(f"subword LM, {s['tokenizer']['vocab_size']:,} tokens: held-out {s['val_bits_per_token']:.3f} bits/token, "
              f"{s['tokenizer']['val_bytes_per_token']} bytes/token")
    if "mtp_head" in s:
        print(f"saved the jointly trained head in {args.out}/mtp_head: held-out MTP loss "
              f"{s['mtp_head']['val_mtp_loss']:.4f}")
    return 0


def add_train(sub) -> None:
    add_command(sub, "train", TrainConfig, run_train,
                help="train an MTP circuit head (and LoRA adapters) on a frozen LM",
                description="Train a circuit draft head on a frozen LM (byte-level, or subword with "
                            "--parameterisation tied, on the model's own tokenizer); the same command under "
                            "`torchrun --nproc_per_node N` trains data-parallel. Rerunning it resumes from "
                            "OUT/checkpoint.pt when its settings match the checkpoint's (only --steps, "
                            "--minutes, --val-every, --save-every, --stop-after and --no-progress may "
                            "change); --no-resume starts over.")


def run_train(args) -> int:
    from ..training.trainer import train
    from ..training.trainer_validation import depth_line

    s = train(command_config(args), announce=print)  # a subword model: which head reads its vocabulary, first
    if "steps" not in s:  # --stop-after: stopped before the end, the checkpoint is kept (nothing saved yet)
        return 0
    rate = f" ({s['tokens_per_second']:,} tok/s)" if s.get("tokens_per_second") else ""
    line = f"saved {args.out}: {s['steps']} steps, {s['train_tokens']:,} tokens in {s['train_seconds']:.0f} s{rate}"
    if s.get("val_windows"):
        line += (f"; held-out loss {s['val_loss']:.4f}, teacher-forced mean accepted length {s['val_accepted']:.3f} "
                 f"over {s['val_windows']} windows")
        depths = depth_line(s)  # e.g. "top-1 by depth 1..3: 0.36 0.16 0.08; top-8: 0.71 0.52 0.40"
        if depths:  # a line of its own, before: the summary stays the last line, which scripts read
            print(f"held-out acceptance, {depths}")
    elif "val_windows" in s:  # a tiny held-out part holds no whole window: say so, not "nan over 0 windows"
        line += "; no held-out window to validate on (the held-out documents are shorter than a window)"
    print(line)
    return 0


def add_bench(sub) -> None:
    add_command(sub, "bench", BenchConfig, run_bench,
                help="measure draft heads against plain decoding (throughput, latency breakdown)",
                description="Decode the same prompts with plain autoregressive decoding and with every head "
                            "(x lookup x verify width), interleaved in one process; print a table, "
                            "write bench.json, bench.md and tradeoff.png (accepted tokens vs latency). "
                            "Greedy runs are checked token for token against plain greedy decoding "
                            "(exit status 1 on any mismatch).")


def run_bench(args) -> int:
    from ..bench import format_table, run_bench as bench

    cfg = command_config(args)
    report = bench(cfg)
    if cfg.batch_size is not None:
        from ..bench.batch import format_batch_table

        print(format_batch_table(report))
        if cfg.out:
            print(f"wrote {cfg.out}/bench.json, bench.md")
        mismatches = sum(row.get("greedy_mismatches", 0) for row in report["rows"])
        return 1 if mismatches else 0
    print(format_table(report))
    if report["context_warning"]:
        print(f"warning: {report['context_warning']}")
    note = report.get("greedy_exactness_note")
    if report["greedy_identical"] is not None:
        verdict = "yes" if report["greedy_identical"] else "NO (see greedy_check in bench.json)"
        print(f"greedy output identical to plain greedy decoding for every prompt: {verdict}"
              + (f" ({note})" if note and not report["greedy_identical"] else ""))
    if args.out:
        print(f"wrote {args.out}/bench.json, bench.md, tradeoff.png")
    return 1 if report["greedy_identical"] is False and not note else 0  # bf16: a rounding difference, not a bug


def add_distill_data(sub) -> None:
    add_command(sub, "distill-data", DistillConfig, run_distill_data,
                help="write the LM's own continuations of training prompts (JSONL for mtpc train)",
                description="Let the LM continue prompts drawn from the training documents of --data (never the "
                            "held-out ones) and write {\"prompt\", \"completion\"} records that `mtpc train "
                            "--data` reads with the prompt masked out. Deterministic under --seed; rerunning "
                            "the same command completes an interrupted file.")


def run_distill_data(args) -> int:
    from ..training.distill import distill_data

    s = distill_data(command_config(args))
    rate = f", {s['new_bytes'] / s['seconds']:,.0f} bytes/s" if s["seconds"] > 0 else ""
    print(f"{args.out}: {s['records']} records ({s['new_records']} new, {s['new_bytes']:,} new bytes in "
          f"{s['seconds']:.1f} s{rate}"
          + (f"; {s['mean_accepted']:.2f} tokens per decoding cycle" if "mean_accepted" in s else "") + ")")
    return 0


def add_features(sub) -> None:
    add_command(sub, "features", FeaturesConfig, run_features,
                help="cache the LM's final hidden states of the training text (for mtpc train --features)",
                description="Run the frozen LM once over the training sequences of --data (packed and split as "
                            "mtpc train does) and write its final hidden states to shard files in --out, which "
                            "`mtpc train --features OUT` trains heads from without running the LM. Prints a size "
                            "estimate first; rerunning the same command completes an interrupted run, and a larger "
                            "--max-tokens extends it.")


def run_features(args) -> int:
    from ..training.features import write_features

    s = write_features(command_config(args))
    rate = f", {s['new_tokens'] / s['seconds']:,.0f} tok/s" if s["new_tokens"] and s["seconds"] > 0 else ""
    print(f"{args.out}: {s['sequences']:,} sequences ({s['tokens']:,} tokens) in {s['shards']} shards, "
          f"{s['bytes'] / 2**30:.2f} GiB; {s['new_tokens']:,} tokens computed now in {s['seconds']:.0f} s{rate}")
    return 0


def add_generate(sub) -> None:
    add_command(sub, "generate", GenerateConfig, run_generate,
                help="write text with the model, plainly or with a draft head",
                description="Decode a prompt (argument, --prompt-file or standard input) as the model's "
                            "tokenizer reads it (mtpc's byte LMs: after <bos>) and "
                            "print the continuation as cycles commit it. With --head it decodes "
                            "speculatively (lossless: greedy output equals plain greedy decoding).")


def run_generate(args) -> int:
    from .generate import run_generate as generate

    stdin = None
    if args.prompt is None and args.prompt_file is None and args.prompts is None and not sys.stdin.isatty():
        stdin = sys.stdin.buffer.read()
    summary = generate(command_config(args, stdin=stdin))
    compare = summary.get("compare", {})
    return 1 if compare.get("greedy_identical") is False and not compare.get("rounding_note") else 0


def add_export_hf(sub) -> None:
    add_command(sub, "export-hf", ExportConfig, run_export_hf,
                help="write a GGUF model file as a checkpoint folder vLLM and transformers load",
                description="Read a GGUF file as --model x.gguf does (checked with bounded work, refused when "
                            "damaged or of an architecture transformers cannot build, dequantized once into "
                            "mtpc's cache) and write it as a Hugging Face checkpoint folder: config.json, "
                            "model.safetensors, tokenizer files, chat template, generation config. The folder "
                            "is written beside OUT and renamed into place when whole.")


def run_export_hf(args) -> int:
    from ..lm.gguf_export import export_gguf
    from .serve import vllm_architecture_note

    cfg = command_config(args)
    s = export_gguf(cfg.model, cfg.out, dtype=cfg.dtype, force=cfg.force)
    count = f"{s.parameters / 1e6:,.1f}M" if s.parameters >= 10**6 else f"{s.parameters:,}"
    print(f"wrote {s.folder}: {s.architecture}, {count} parameters in {s.dtype}, {s.bytes / 2**20:,.1f} MiB in "
          f"{s.seconds:.1f} s")
    print(vllm_architecture_note(s.folder))
    return 0


def add_serve(sub) -> None:
    p = sub.add_parser("serve", help="serve a model folder with vLLM's OpenAI-compatible server, a head drafting",
                       description="Start vLLM's OpenAI-compatible server on a model folder, with --head "
                                   "drafting for vLLM's speculative decoding (mtpc.vllm_options), or plainly. "
                                   "Everything is checked before the server starts; then the exact vLLM command is "
                                   "printed and run. Arguments after -- go to the server as they are (e.g. -- "
                                   "--max-model-len 2048 --enforce-eager).")
    add_settings(p, ServeConfig)
    p.add_argument("vllm_args", nargs="*", default=(), metavar="-- VLLM_ARG",
                   help="arguments for vLLM's server, after --")
    p.set_defaults(func=run_serve, config=ServeConfig)


def run_serve(args) -> int:
    from .serve import run_serve as serve

    return serve(command_config(args, vllm_args=tuple(args.vllm_args)))


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="mtpc", description="multi-token prediction with probabilistic circuits")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_tiny_lm(sub)
    add_train(sub)
    add_bench(sub)
    add_distill_data(sub)
    add_features(sub)
    add_generate(sub)
    add_export_hf(sub)
    add_serve(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 done, 1 the run failed, 2 bad usage or input)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv  # known even when parsing fails
    with _InterruptWatch() as interrupt:
        try:
            args = build_parser().parse_args(argv)
            debug = getattr(args, "debug", False)
            return args.func(args)
        except SystemExit as e:  # --help and --version (argparse errors are InputErrors, see Parser.error)
            if isinstance(e.code, int) or e.code is None:
                return e.code or 0
            return _report(InputError(str(e.code)), debug)
        except KeyboardInterrupt:
            return _interrupted()
        except Exception as e:  # noqa: BLE001 -- the one place that turns every error into one line
            # a library that caught the KeyboardInterrupt and raised its own error (an `except Exception`
            # around a model load) must not turn Ctrl-C into an input error (exit status 2)
            return _interrupted() if interrupt.seen else _report(e, debug)


def _interrupted() -> int:
    print("mtpc: interrupted", file=sys.stderr)
    return 130  # 128 + SIGINT, as shells report a command ended by Ctrl-C


class _InterruptWatch:
    """Python's own SIGINT handler (raise KeyboardInterrupt) that also remembers that Ctrl-C came; a
    no-op where SIGINT is ignored or handled by someone else, or off the main thread."""

    def __enter__(self):
        import signal
        import threading

        self.seen, self._previous = False, None
        if threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        self.seen = True
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self._previous is not None:
            import signal

            signal.signal(signal.SIGINT, self._previous)
        return False


def _report(e: Exception, debug: bool) -> int:
    status, message = describe_error(e)
    if debug:
        import traceback

        traceback.print_exception(e)
    print(f"mtpc: error: {message}", file=sys.stderr)
    return status


def _allocator_failure(e: BaseException) -> bool:
    """torch's CPU allocator reports a failed allocation as a RuntimeError (`DefaultCPUAllocator:
    can't allocate memory`), not as a MemoryError."""
    text = str(e)
    return isinstance(e, RuntimeError) and ("DefaultCPUAllocator" in text or "can't allocate memory" in text)


def describe_error(e: BaseException) -> tuple[int, str]:
    """(exit status, message) for an exception reaching the command line.

    `InputError` 2 and `MtpcError` 1 carry their own message; a circuit error (bad `.pc`, unknown
    `-D` name) is an input error; a missing or unreadable file the user named is an input error, other
    OS errors (disk full) a failure; anything else is an internal error (a bug): one line naming the
    exception, exit status 1, the traceback with `--debug`."""
    from circuitc.errors import CircuitError

    if isinstance(e, MtpcError):
        return e.exit_status, str(e)
    if isinstance(e, CircuitError):  # circuitc's rendering: `[file:line:col: ]error: message` (+ source, caret)
        text = str(e)
        return 2, f"--circuit: {text.removeprefix('error: ')}" if "\n" not in text else f"invalid --circuit:\n{text}"
    if isinstance(e, OSError):
        message = f"{e.strerror}: {e.filename}" if e.strerror and e.filename else str(e)
        user = isinstance(e, (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError))
        return (2 if user else 1), message
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or _allocator_failure(e):
        return 1, f"out of memory: {first_line(e)} (try a smaller --batch-size or --seq-len)"
    return 1, f"internal error: {type(e).__name__}: {first_line(e)} (rerun with --debug for the traceback)"
