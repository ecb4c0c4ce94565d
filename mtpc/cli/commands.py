"""The `mtpc` command line: one `add_*` (arguments) and one `run_*` (action) function per subcommand.

Every subcommand shares one error path (`main`): a mistake is one `mtpc: error: <message>` line on
stderr with exit status 2 (usage and input errors: bad flags, missing or damaged files, unsupported
models), a run that fails exits with 1, and tracebacks are printed only with `--debug`. Parsers made
by `sub.add_parser(...)` inherit this (and `--debug`, and defaults in `--help`) from `Parser`.

Importing this module must stay cheap (`mtpc --help` runs in a fraction of a second): torch,
transformers and the training/decoding modules are imported inside the `run_*` functions only.
"""

from __future__ import annotations

import argparse
import sys

from ..checks import MAX_THREADS, int_in, seed, non_negative_float, non_negative_int, positive_float, positive_int, probability, unit_interval, width_or_adaptive
from ..errors import InputError, MtpcError, first_line


class HelpFormatter(argparse.HelpFormatter):
    """Appends `(default: X)` to every option with a default worth showing (not None, False or empty),
    once: not when the help text already names its default. (Python 3.11's BooleanOptionalAction
    appends its own `(default: %(default)s)` to the help; that copy is dropped and judged like any other.)"""

    def _get_help_string(self, action):
        text = (action.help or "").replace(" (default: %(default)s)", "")
        default = action.default
        hidden = default is None or default is False or default is argparse.SUPPRESS or default == []
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


def add_tiny_lm(sub) -> None:
    p = sub.add_parser("tiny-lm", help="train a small byte-level Llama from scratch on a local corpus",
                       description="Train a ~1.9M-parameter byte-level LlamaForCausalLM (default: on the Python "
                                   "standard library sources) and save it as a local Hugging Face checkpoint.")
    p.add_argument("--out", required=True, help="output folder (save_pretrained layout)")
    p.add_argument("--data", default=None, help="file, folder, glob or .jsonl (default: the Python stdlib)")
    p.add_argument("--minutes", type=positive_float, default=10.0, help="wall-clock training budget")
    p.add_argument("--steps", type=positive_int, default=None, help="train a fixed number of steps instead")
    p.add_argument("--context", type=positive_int, default=1024, help="sequence length in bytes")
    # TinyLMConfig's defaults, written out: importing it here would load torch for `mtpc --help`
    p.add_argument("--d-model", type=positive_int, default=192, help="hidden size (models/byte-lm's shape)")
    p.add_argument("--layers", type=positive_int, default=4, help="decoder layers")
    p.add_argument("--heads", type=positive_int, default=4, help="attention heads (must divide --d-model)")
    p.add_argument("--ffn", type=positive_int, default=512, help="MLP intermediate size")
    p.add_argument("--vocab-size", type=positive_int, default=None,
                   help="pad the vocabulary (e.g. 320; at least 256 bytes + 8 specials)")
    p.add_argument("--batch-size", type=positive_int, default=4, help="sequences per step")
    p.add_argument("--lr", type=positive_float, default=2e-3, help="peak learning rate")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="autocast dtype (auto: bf16 where the hardware has it)")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:N")
    p.add_argument("--seed", type=seed, default=0, help="random seed")
    p.add_argument("--save-every", type=positive_int, default=100, help="steps between checkpoints (OUT/checkpoint.pt)")
    p.add_argument("--no-resume", action="store_true", help="start over even if OUT/checkpoint.pt exists")
    p.add_argument("--stop-after", type=positive_int, default=None,
                   help="leave at this step with a checkpoint (resume later)")
    mtp = p.add_argument_group("MTP-aware pretraining", "train a circuit draft head jointly with the LM (loss = "
                               "next-byte CE + weight x windowed MTP loss, gradients into the LM); the head is "
                               "saved in OUT/mtp_head (mtpc.load_head, mtpc train --init-head)")
    mtp.add_argument("--mtp-circuit", default=None, metavar="FILE.pc", help="the head's circuit structure")
    mtp.add_argument("-D", dest="defines", action="append", default=[], metavar="K=V",
                     help="bind a .pc parameter of --mtp-circuit, e.g. -D n=8 (repeatable)")
    mtp.add_argument("--mtp-weight", type=non_negative_float, default=0.1,
                     help="weight of the MTP loss, a gamma-weighted average over window positions")
    mtp.add_argument("--mtp-parameterisation", choices=("full", "shared", "factorised"), default="full",
                     help="head weights (see mtpc train --parameterisation)")
    mtp.add_argument("--mtp-window-stride", type=positive_int, default=1,
                     help="score the windows at every s-th position only")
    mtp.add_argument("--mtp-gamma", type=probability, default=0.9, help="discount of window position j: gamma**(j-1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_tiny_lm)


def run_tiny_lm(args) -> int:
    from ..training.tiny_lm import TinyLMConfig, train_tiny_lm

    cfg = TinyLMConfig(out=args.out, data=args.data, minutes=args.minutes, steps=args.steps, context=args.context,
                       d_model=args.d_model, layers=args.layers, heads=args.heads, ffn=args.ffn,
                       vocab_size=args.vocab_size, batch_size=args.batch_size, lr=args.lr,
                       precision=args.precision, device=args.device, seed=args.seed, progress=not args.no_progress,
                       save_every=args.save_every, resume=not args.no_resume, stop_after=args.stop_after,
                       mtp_circuit=args.mtp_circuit, mtp_bindings=parse_defines(args.defines),
                       mtp_weight=args.mtp_weight, mtp_parameterisation=args.mtp_parameterisation,
                       mtp_window_stride=args.mtp_window_stride, mtp_gamma=args.mtp_gamma)
    s = train_tiny_lm(cfg)
    if "stopped_at" in s:
        print(f"stopped at step {s['stopped_at']}; {args.out}/checkpoint.pt resumes it (rerun the same command)")
        return 0
    if not s:  # not rank 0 under torchrun
        return 0
    print(f"saved {args.out}: {s['parameters'] / 1e6:.2f}M parameters, {s['steps']} steps, "
          f"{s['train_tokens']:,} tokens in {s['train_seconds']:.0f} s ({s['tokens_per_second']:,} tok/s), "
          f"held-out {s['val_bits_per_byte']:.3f} bits/byte (start {s['val_bits_per_byte_at_start']:.3f})")
    if "mtp_head" in s:
        print(f"saved the jointly trained head in {args.out}/mtp_head: held-out MTP loss "
              f"{s['mtp_head']['val_mtp_loss']:.4f}")
    return 0


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train an MTP circuit head (and LoRA adapters) on a frozen LM",
                       description="Train a circuit draft head on a frozen LM (byte-level, or subword with "
                                   "--parameterisation tied, on the model's own tokenizer); the same command under "
                                   "`torchrun --nproc_per_node N` trains data-parallel. Rerunning it resumes from "
                                   "OUT/checkpoint.pt when its settings match the checkpoint's (only --steps, "
                                   "--minutes, --val-every, --save-every, --stop-after and --no-progress may "
                                   "change); --no-resume starts over.")
    p.add_argument("--model", required=True, help="local Hugging Face checkpoint folder (e.g. from mtpc tiny-lm)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a model folder whose config names its own modelling code (auto_map): runs that code")
    p.add_argument("--allow-non-byte-vocab", action="store_true",
                   help="train any head on a model whose vocabulary is not byte-level, token ids 0..255 taken as "
                        "bytes (a tied head needs no flag: it reads the model's own tokenizer)")
    p.add_argument("--circuit", default=None, help=".pc or graph-spec .json file (optional with --init-head)")
    p.add_argument("-D", dest="defines", action="append", default=[], metavar="K=V",
                   help="bind a .pc parameter, e.g. -D n=16 -D r=32 (repeatable)")
    p.add_argument("--data", default=None, help="file, folder, glob or .jsonl (default: the Python stdlib)")
    p.add_argument("--out", required=True, help="output folder: the head, checkpoint, config and log")
    p.add_argument("--lora-layers", type=non_negative_int, default=0,
                   help="LoRA adapters on the last k decoder layers")
    p.add_argument("--lora-rank", type=positive_int, default=8, help="LoRA rank")
    p.add_argument("--init-head", default=None, help="continue from a trained head folder (two-stage schedule)")
    p.add_argument("--parameterisation", choices=("full", "shared", "factorised", "tied"), default="full",
                   help="head weights: full (the paper's n*r*v*d), shared (per-position unembedding + low-rank "
                        "per-unit adapters), factorised (low-rank unembedding + adapters), tied (the LM's own "
                        "output layer, not copied, behind low-rank per-unit adapters in hidden space: subword LMs)")
    p.add_argument("--adapter-rank", type=positive_int, default=16,
                   help="shared/factorised/tied: per-unit adapter rank")
    p.add_argument("--factor-rank", type=positive_int, default=64, help="factorised: unembedding rank")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--steps", type=positive_int, help="optimizer steps")
    budget.add_argument("--minutes", type=positive_float,
                        help="wall-clock budget (a step count, re-sized after every step from the mean step time)")
    p.add_argument("--seq-len", type=positive_int, default=512, help="tokens per training sequence")
    p.add_argument("--batch-size", type=positive_int, default=8, help="sequences per step over all ranks")
    p.add_argument("--grad-accum", type=positive_int, default=1, help="micro-batches per step")
    p.add_argument("--lr", type=positive_float, default=2e-3, help="peak learning rate of the head")
    p.add_argument("--lora-lr", type=positive_float, default=2e-4, help="peak learning rate of the LoRA adapters")
    p.add_argument("--gamma", type=probability, default=0.9, help="discount of window position j: gamma**(j-1)")
    p.add_argument("--loss", choices=("nll", "kl", "nll+kl"), default="nll",
                   help="nll: likelihood of the gold bytes; kl: KL from the frozen LM's own next-byte "
                        "distributions to the head's conditionals (self-distillation); nll+kl: their sum")
    p.add_argument("--window-stride", type=positive_int, default=1,
                   help="score the windows at every s-th position only (s x cheaper head)")
    p.add_argument("--val-every", type=positive_int, default=50, help="validate every this many steps")
    p.add_argument("--val-sequences", type=positive_int, default=8,
                   help="held-out sequences scored at each validation")
    p.add_argument("--val-windows", type=positive_int, default=1024,
                   help="of their windows, how many score acceptance")
    p.add_argument("--save-every", type=positive_int, default=50, help="write OUT/checkpoint.pt every this many steps")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="autocast dtype (auto: bf16 where the hardware has it)")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:N")
    p.add_argument("--seed", type=seed, default=0, help="random seed (head init, data order)")
    p.add_argument("--no-resume", action="store_true", help="start over even if OUT/checkpoint.pt exists")
    p.add_argument("--stop-after", type=positive_int, default=None,
                   help="leave at this step with a checkpoint (resume later)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_train)


def parse_defines(items: list[str]) -> dict:
    """`["n=16", "name=x"]` -> `{"n": 16, "name": "x"}` (ints and floats parsed)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise InputError(f"-D expects NAME=VALUE with NAME a parameter name, got {item!r}")
        if key in out:
            raise InputError(f"-D {key} is given twice")
        out[key] = _number(value.strip())
    return out


def _number(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def run_train(args) -> int:
    from ..training.trainer import TrainConfig, train

    cfg = TrainConfig(model=args.model, out=args.out, circuit=args.circuit, bindings=parse_defines(args.defines),
                      data=args.data, lora_layers=args.lora_layers, lora_rank=args.lora_rank,
                      init_head=args.init_head, parameterisation=args.parameterisation,
                      adapter_rank=args.adapter_rank, factor_rank=args.factor_rank, seq_len=args.seq_len, batch_size=args.batch_size,
                      grad_accum=args.grad_accum, steps=args.steps, minutes=args.minutes, lr=args.lr,
                      lora_lr=args.lora_lr, gamma=args.gamma, loss=args.loss, window_stride=args.window_stride,
                      val_every=args.val_every, val_sequences=args.val_sequences, val_windows=args.val_windows,
                      save_every=args.save_every, precision=args.precision, device=args.device,
                      seed=args.seed, progress=not args.no_progress, resume=not args.no_resume,
                      stop_after=args.stop_after, allow_non_byte_vocab=args.allow_non_byte_vocab,
                      trust_remote_code=args.trust_remote_code)
    s = train(cfg, announce=print)  # a subword model: which head reads its vocabulary, first
    if "steps" not in s:  # --stop-after: stopped before the end, the checkpoint is kept (nothing saved yet)
        return 0
    rate = f" ({s['tokens_per_second']:,} tok/s)" if s.get("tokens_per_second") else ""
    line = f"saved {args.out}: {s['steps']} steps, {s['train_tokens']:,} tokens in {s['train_seconds']:.0f} s{rate}"
    if s.get("val_accepted") is not None:
        line += (f"; held-out loss {s['val_loss']:.4f}, teacher-forced mean accepted length {s['val_accepted']:.3f} "
                 f"over {s['val_windows']} windows")
    print(line)
    return 0


def add_bench(sub) -> None:
    p = sub.add_parser("bench", help="measure draft heads against plain decoding (throughput, latency breakdown)",
                       description="Decode the same prompts with plain autoregressive decoding and with every head "
                                   "(x lookup x verify width), interleaved in one process; print a table, "
                                   "write bench.json, bench.md and tradeoff.png (accepted tokens vs latency). "
                                   "Greedy runs are checked token for token against plain greedy decoding "
                                   "(exit status 1 on any mismatch).")
    p.add_argument("--model", required=True, help="local Hugging Face checkpoint folder (e.g. from mtpc tiny-lm)")
    p.add_argument("--allow-non-byte-vocab", action="store_true",
                   help="accept a model whose vocabulary is not byte-level (token ids 0..255 are taken as bytes)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a model folder whose config names its own modelling code (auto_map): runs that code")
    p.add_argument("--heads", nargs="+", required=True, metavar="DIR", help="head folders written by mtpc train")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", help=".txt (one prompt per line) or .jsonl (strings or {\"prompt\": ...})")
    source.add_argument("--corpus", help="sample prompts from the held-out documents of this corpus "
                                         "('stdlib': the Python standard library, mtpc tiny-lm's default)")
    p.add_argument("--num-prompts", type=positive_int, default=8, help="prompts per set")
    p.add_argument("--repeats", type=positive_int, default=3, help="K disjoint prompt sets; mean ± std over them")
    p.add_argument("--prompt-len", type=positive_int, default=128, help="corpus prompts: tokens per prompt")
    p.add_argument("--max-new-tokens", type=positive_int, default=256, help="tokens generated per prompt")
    p.add_argument("--mode", choices=("greedy", "sample"), default="greedy", help="decoding mode")
    p.add_argument("--temperature", type=positive_float, default=1.0, help="sampling temperature")
    p.add_argument("--top-k", type=positive_int, default=None, help="sample: keep the k most likely tokens")
    p.add_argument("--top-p", type=probability, default=None, help="sample: nucleus mass in (0, 1]")
    p.add_argument("--lookup", choices=("off", "on", "both"), default="off",
                   help="prompt-lookup drafting inside the heads' decoder: off, on, or both side by side")
    p.add_argument("--lookup-tokens", type=int_in(1, 1024), default=10, help="tokens a lookup match proposes")
    p.add_argument("--window", nargs="+", type=width_or_adaptive, default=None, metavar="K",
                   help="verify widths of the circuit window to compare side by side: 2 .. each head's n, or "
                        "'adaptive' (each window's width chosen from its draft's probabilities); default: n")
    p.add_argument("--peers", nargs="+", default=[], metavar="PEER",
                   help="also run transformers' own decoders: prompt-lookup[:K] (default K 10), assisted:DIR "
                        "(a small draft LM folder) and/or static (generate with cache_implementation=\"static\")")
    p.add_argument("--compile", action="store_true",
                   help="also run plain decoding with a static KV cache, eager and torch.compile'd, and every head "
                        "variant again with its cycle (draft, verify, accept) compiled as one graph (compiled in "
                        "the warm-up); speed-ups are then reported against the compiled baseline too")
    p.add_argument("--max-repetition", type=unit_interval, default=None, metavar="R",
                   help="leave out prompts whose plain continuation repeats more than R of its 8-byte n-grams "
                        "(degenerate loops; reported)")
    p.add_argument("--batch-size", type=int_in(1, 4096), default=None, metavar="B",
                   help="decode batches of B left-padded prompts (--num-prompts a multiple of B) and report tok/s "
                        "over the batch against plain batched decoding (eager; with --compile also compiled) and "
                        "transformers' batched generate")
    p.add_argument("--dtype", choices=("fp32", "fp64", "bf16"), default="fp32", help="the LM's dtype")
    p.add_argument("--head-dtype", choices=("fp32", "fp64", "bf16"), default=None,
                   help="cast the heads for inference (default: as saved)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--threads", type=int_in(1, MAX_THREADS), default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=seed, default=0, help="random seed (prompt choice, sampling)")
    p.add_argument("--out", default=None, help="folder for bench.json, bench.md, tradeoff.png")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_bench)


def run_bench(args) -> int:
    from ..bench import BenchConfig, format_table, run_bench as bench

    cfg = BenchConfig(model=args.model, heads=args.heads, prompts=args.prompts, corpus=args.corpus,
                      num_prompts=args.num_prompts, repeats=args.repeats, prompt_len=args.prompt_len,
                      max_new_tokens=args.max_new_tokens, mode=args.mode, temperature=args.temperature,
                      top_k=args.top_k, top_p=args.top_p,
                      lookup={"off": (False,), "on": (True,), "both": (False, True)}[args.lookup],
                      lookup_tokens=args.lookup_tokens, windows=tuple(args.window) if args.window else (None,),
                      peers=args.peers, compile=args.compile,
                      max_repetition=args.max_repetition, dtype=args.dtype,
                      head_dtype=args.head_dtype, device=args.device, threads=args.threads, seed=args.seed,
                      out=args.out, progress=not args.no_progress, allow_non_byte_vocab=args.allow_non_byte_vocab,
                      trust_remote_code=args.trust_remote_code, batch_size=args.batch_size)
    report = bench(cfg)
    if cfg.batch_size is not None:
        from ..bench.batch import format_batch_table

        print(format_batch_table(report))
        if args.out:
            print(f"wrote {args.out}/bench.json, bench.md")
        mismatches = sum(row.get("greedy_mismatches", 0) for row in report["rows"])
        return 1 if mismatches else 0
    print(format_table(report))
    if report["context_warning"]:
        print(f"warning: {report['context_warning']}")
    if report["greedy_identical"] is not None:
        verdict = "yes" if report["greedy_identical"] else "NO (see greedy_check in bench.json)"
        print(f"greedy output identical to plain greedy decoding for every prompt: {verdict}")
    if args.out:
        print(f"wrote {args.out}/bench.json, bench.md, tradeoff.png")
    return 1 if report["greedy_identical"] is False else 0


def add_distill_data(sub) -> None:
    p = sub.add_parser("distill-data", help="write the LM's own continuations of training prompts (JSONL for mtpc train)",
                       description="Let the LM continue prompts drawn from the training documents of --data (never the "
                                   "held-out ones) and write {\"prompt\", \"completion\"} records that `mtpc train "
                                   "--data` reads with the prompt masked out. Deterministic under --seed; rerunning "
                                   "the same command completes an interrupted file.")
    p.add_argument("--model", required=True, help="local Hugging Face checkpoint folder (e.g. from mtpc tiny-lm)")
    p.add_argument("--data", default=None, help="file, folder, glob or .jsonl to draw prompts from "
                                                "(default: the Python stdlib, mtpc tiny-lm's corpus)")
    p.add_argument("--out", required=True, help="the .jsonl file to write (or complete)")
    p.add_argument("--num-prompts", type=positive_int, default=1024, help="records in the file")
    p.add_argument("--prompt-len", type=positive_int, default=64, help="bytes per prompt")
    p.add_argument("--max-new-tokens", type=positive_int, default=448, help="longest continuation")
    p.add_argument("--temperature", type=positive_float, default=1.0, help="sampled records' temperature")
    p.add_argument("--top-p", type=probability, default=None, help="sampled records' nucleus (default: none)")
    p.add_argument("--greedy-fraction", type=unit_interval, default=0.0,
                   help="share of greedy records (0: all sampled at --temperature, on-policy for sampling heads)")
    p.add_argument("--batch-size", type=positive_int, default=16,
                   help="records sampled together (plain batched decoding; --head decodes one at a time)")
    p.add_argument("--seed", type=seed, default=0, help="random seed (prompts, sampling)")
    p.add_argument("--head", default=None, help="a head folder from mtpc train: decode speculatively (faster)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a model folder whose config names its own modelling code (auto_map): runs that code")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_distill_data)


def run_distill_data(args) -> int:
    from ..training.distill import DistillConfig, distill_data

    cfg = DistillConfig(model=args.model, out=args.out, data=args.data, num_prompts=args.num_prompts,
                        prompt_len=args.prompt_len, max_new_tokens=args.max_new_tokens,
                        temperature=args.temperature, top_p=args.top_p, greedy_fraction=args.greedy_fraction,
                        batch_size=args.batch_size,
                        seed=args.seed, head=args.head, progress=not args.no_progress,
                        trust_remote_code=args.trust_remote_code)
    s = distill_data(cfg)
    rate = f", {s['new_bytes'] / s['seconds']:,.0f} bytes/s" if s["seconds"] > 0 else ""
    print(f"{args.out}: {s['records']} records ({s['new_records']} new, {s['new_bytes']:,} new bytes in "
          f"{s['seconds']:.1f} s{rate}"
          + (f"; {s['mean_accepted']:.2f} tokens per decoding cycle" if "mean_accepted" in s else "") + ")")
    return 0


def add_generate(sub) -> None:
    p = sub.add_parser("generate", help="write text with the model, plainly or with a draft head",
                       description="Decode a prompt (argument, --prompt-file or standard input) after <bos> and "
                                   "print the continuation as cycles commit it. With --head it decodes "
                                   "speculatively (lossless: greedy output equals plain greedy decoding).")
    p.add_argument("prompt", nargs="?", default=None, help="the prompt text (default: --prompt-file or stdin)")
    p.add_argument("--model", required=True, help="local Hugging Face checkpoint folder (e.g. from mtpc tiny-lm)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a model folder whose config names its own modelling code (auto_map): runs that code")
    p.add_argument("--head", default=None, help="a head folder written by mtpc train (default: plain decoding)")
    p.add_argument("--lora", default=None, help="the draft path's LoRA adapter folder (default: HEAD/lora if any)")
    p.add_argument("--lora-layers", type=non_negative_int, default=None, help="the adapter's layer count (checked)")
    p.add_argument("--prompt-file", default=None, help="read the prompt's bytes from this file")
    p.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help="bytes to generate at most (default: 256, fewer when the model's context has less room)")
    p.add_argument("--temperature", type=non_negative_float, default=0.0, help="0: greedy; above 0: sample")
    p.add_argument("--top-k", type=positive_int, default=None, help="sample from the k most likely bytes")
    p.add_argument("--top-p", type=probability, default=None, help="sample from the nucleus of this mass")
    p.add_argument("--seed", type=seed, default=0, help="random seed for sampling")
    p.add_argument("--chat", action="store_true", help="render the prompt as a user turn with the chat template")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                   help="print as cycles commit (default) or all at the end")
    p.add_argument("--stats", action="store_true", help="bytes per cycle, tok/s and the per-cycle breakdown (stderr)")
    p.add_argument("--compare", action="store_true",
                   help="also decode plainly: speed-up and whether greedy outputs are identical (stderr)")
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:1, ...")
    p.add_argument("--threads", type=int_in(1, MAX_THREADS), default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--lookup", type=int_in(1, 1024), default=None, metavar="K",
                   help="with --head: also draft n-gram continuations of the prompt and the text so far (K tokens "
                        "a match proposes), chosen per cycle by past acceptance; still lossless")
    p.add_argument("--window", type=int_in(2, 1024), default=None, metavar="K",
                   help="with --head: verify K tokens per cycle (x_0 and K-1 drafted ones), 2 .. the head's n "
                        "(default: each window's width chosen from its own draft's probabilities)")
    p.add_argument("--compile", action="store_true",
                   help="with --head: torch.compile each decoding cycle (verify, accept, draft) as one graph "
                        "(static caches, one graph per verify width; compiled before the first cycle)")
    p.add_argument("--prompts", default=None, metavar="FILE",
                   help="with --head: decode the prompts of FILE (one per line, or .jsonl: a string or "
                        "{\"prompt\": ...} per line) as batches; one JSON line per prompt on stdout")
    p.add_argument("--batch-size", type=positive_int, default=None, metavar="B",
                   help="with --prompts: prompts per batch (default: all of them in one batch)")
    p.set_defaults(func=run_generate)


def run_generate(args) -> int:
    from .generate import GenerateConfig, run_generate as generate

    stdin = None
    if args.prompt is None and args.prompt_file is None and args.prompts is None and not sys.stdin.isatty():
        stdin = sys.stdin.buffer.read()
    cfg = GenerateConfig(model=args.model, head=args.head, lora=args.lora, lora_layers=args.lora_layers,
                         prompt=args.prompt, prompt_file=args.prompt_file, stdin=stdin,
                         max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                         top_p=args.top_p, seed=args.seed, chat=args.chat, stream=args.stream, stats=args.stats,
                         compare=args.compare, device=args.device, threads=args.threads, lookup=args.lookup,
                         window=args.window, compile=args.compile, trust_remote_code=args.trust_remote_code,
                         prompts=args.prompts, batch_size=args.batch_size)
    summary = generate(cfg)
    return 1 if summary.get("compare", {}).get("greedy_identical") is False else 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="mtpc", description="multi-token prediction with probabilistic circuits")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_tiny_lm(sub)
    add_train(sub)
    add_bench(sub)
    add_distill_data(sub)
    add_generate(sub)
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
