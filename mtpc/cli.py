"""The `mtpc` command line: one `add_*` (arguments) and one `run_*` (action) function per subcommand."""

from __future__ import annotations

import argparse
import json
import sys


def add_tiny_lm(sub) -> None:
    p = sub.add_parser("tiny-lm", help="train a small byte-level Llama from scratch on a local corpus",
                       description="Train a ~3M-parameter byte-level LlamaForCausalLM (default: on the Python "
                                   "standard library sources) and save it as a local Hugging Face checkpoint.")
    p.add_argument("--out", required=True, help="output folder (save_pretrained layout)")
    p.add_argument("--data", default=None, help="file, folder, glob or .jsonl (default: the Python stdlib)")
    p.add_argument("--minutes", type=float, default=10.0, help="wall-clock training budget (default 10)")
    p.add_argument("--steps", type=int, default=None, help="train a fixed number of steps instead")
    p.add_argument("--context", type=int, default=1024, help="sequence length in bytes (default 1024)")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=704)
    p.add_argument("--vocab-size", type=int, default=None, help="pad the vocabulary (e.g. 320)")
    p.add_argument("--batch-size", type=int, default=4, help="sequences per step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_tiny_lm)


def run_tiny_lm(args) -> int:
    from .tinylm import TinyLMConfig, train_tiny_lm

    cfg = TinyLMConfig(out=args.out, data=args.data, minutes=args.minutes, steps=args.steps, context=args.context,
                       d_model=args.d_model, layers=args.layers, heads=args.heads, ffn=args.ffn,
                       vocab_size=args.vocab_size, batch_size=args.batch_size, lr=args.lr,
                       precision=args.precision, seed=args.seed, progress=not args.no_progress)
    s = train_tiny_lm(cfg)
    print(f"saved {args.out}: {s['parameters'] / 1e6:.2f}M parameters, {s['steps']} steps, "
          f"{s['train_tokens']:,} tokens in {s['train_seconds']:.0f} s ({s['tokens_per_second']:,} tok/s), "
          f"held-out {s['val_bits_per_byte']:.3f} bits/byte (start {s['val_bits_per_byte_at_start']:.3f})")
    return 0


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train an MTP circuit head (and LoRA adapters) on a frozen LM",
                       description="Train a circuit draft head on a frozen byte-level LM; the same command under "
                                   "`torchrun --nproc_per_node N` trains data-parallel. Rerunning it resumes from "
                                   "OUT/checkpoint.pt.")
    p.add_argument("--model", required=True, help="local Hugging Face checkpoint folder (e.g. from mtpc tiny-lm)")
    p.add_argument("--circuit", default=None, help=".pc or graph-spec .json file (optional with --init-head)")
    p.add_argument("-D", dest="defines", action="append", default=[], metavar="K=V",
                   help="bind a .pc parameter, e.g. -D n=16 -D r=32 (repeatable)")
    p.add_argument("--data", default=None, help="file, folder, glob or .jsonl (default: the Python stdlib)")
    p.add_argument("--out", required=True)
    p.add_argument("--lora-layers", type=int, default=0, help="LoRA adapters on the last k decoder layers")
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--init-head", default=None, help="continue from a trained head folder (two-stage schedule)")
    p.add_argument("--parameterisation", choices=("full", "shared", "factorised"), default="full",
                   help="head weights: full (the paper's n*r*v*d), shared (per-position unembedding + low-rank "
                        "per-unit adapters), factorised (low-rank unembedding + adapters)")
    p.add_argument("--adapter-rank", type=int, default=16, help="shared/factorised: per-unit adapter rank")
    p.add_argument("--factor-rank", type=int, default=64, help="factorised: unembedding rank")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--steps", type=int, help="optimizer steps")
    budget.add_argument("--minutes", type=float, help="time budget (turned into a step count after 2 steps)")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step over all ranks")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--lora-lr", type=float, default=2e-4)
    p.add_argument("--gamma", type=float, default=0.9, help="discount of window position j: gamma**(j-1)")
    p.add_argument("--window-stride", type=int, default=1,
                   help="score the windows at every s-th position only (s x cheaper head; default 1)")
    p.add_argument("--val-every", type=int, default=50)
    p.add_argument("--val-sequences", type=int, default=8, help="held-out sequences scored at each validation")
    p.add_argument("--val-windows", type=int, default=1024, help="of their windows, how many score acceptance")
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-resume", action="store_true", help="start over even if OUT/checkpoint.pt exists")
    p.add_argument("--stop-after", type=int, default=None, help="leave at this step with a checkpoint (resume later)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_train)


def parse_defines(items: list[str]) -> dict:
    """`["n=16", "name=x"]` -> `{"n": 16, "name": "x"}` (ints and floats parsed)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"mtpc train: -D expects KEY=VALUE, got {item!r}")
        out[key.strip()] = _number(value.strip())
    return out


def _number(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def run_train(args) -> int:
    from .train import TrainConfig, train

    cfg = TrainConfig(model=args.model, out=args.out, circuit=args.circuit, bindings=parse_defines(args.defines),
                      data=args.data, lora_layers=args.lora_layers, lora_rank=args.lora_rank,
                      init_head=args.init_head, parameterisation=args.parameterisation,
                      adapter_rank=args.adapter_rank, factor_rank=args.factor_rank, seq_len=args.seq_len, batch_size=args.batch_size,
                      grad_accum=args.grad_accum, steps=args.steps, minutes=args.minutes, lr=args.lr,
                      lora_lr=args.lora_lr, gamma=args.gamma, window_stride=args.window_stride,
                      val_every=args.val_every, val_sequences=args.val_sequences, val_windows=args.val_windows,
                      save_every=args.save_every, precision=args.precision,
                      seed=args.seed, progress=not args.no_progress, resume=not args.no_resume,
                      stop_after=args.stop_after)
    s = train(cfg)
    if s.get("val_accepted") is not None:
        print(f"saved {args.out}: {s['steps']} steps, {s['train_tokens']:,} tokens in {s['train_seconds']:.0f} s; "
              f"held-out loss {s['val_loss']:.4f}, teacher-forced mean accepted length {s['val_accepted']:.3f} "
              f"over {s['val_windows']} windows")
    return 0


def add_bench(sub) -> None:
    p = sub.add_parser("bench", help="measure draft heads against plain decoding (throughput, latency breakdown)",
                       description="Decode the same prompts with plain autoregressive decoding and with every head "
                                   "(x draft strategy x bonus setting), interleaved in one process; print a table, "
                                   "write bench.json, bench.md and tradeoff.png (accepted tokens vs latency). "
                                   "Greedy runs are checked token for token against plain greedy decoding "
                                   "(exit status 1 on any mismatch).")
    p.add_argument("--model", required=True, help="local Hugging Face checkpoint folder (e.g. from mtpc tiny-lm)")
    p.add_argument("--heads", nargs="+", required=True, metavar="DIR", help="head folders written by mtpc train")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", help=".txt (one prompt per line) or .jsonl (strings or {\"prompt\": ...})")
    source.add_argument("--corpus", help="sample prompts from the held-out documents of this corpus "
                                         "('stdlib': the Python standard library, mtpc tiny-lm's default)")
    p.add_argument("--num-prompts", type=int, default=8, help="prompts per set (default 8)")
    p.add_argument("--repeats", type=int, default=3, help="K disjoint prompt sets; mean ± std over them (default 3)")
    p.add_argument("--prompt-len", type=int, default=128, help="corpus prompts: tokens per prompt (default 128)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--mode", choices=("greedy", "sample"), default="greedy")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--draft", nargs="+", default=["conditional"], metavar="STRATEGY",
                   help="greedy draft strategies to compare: conditional, marginal, map, sample (default conditional)")
    p.add_argument("--bonus", choices=("off", "on", "both"), default="off",
                   help="bonus-conditioned drafting: off, on, or both side by side (default off)")
    p.add_argument("--lookup", choices=("off", "on", "both"), default="off",
                   help="prompt-lookup drafting inside the heads' decoder: off, on, or both side by side (default off)")
    p.add_argument("--lookup-tokens", type=int, default=10, help="tokens a lookup match proposes (default 10)")
    p.add_argument("--peers", nargs="+", default=[], metavar="PEER",
                   help="also run transformers' own decoders: prompt-lookup[:K] (default K 10) and/or assisted:DIR "
                        "(a small draft LM folder)")
    p.add_argument("--compile", action="store_true",
                   help="also run plain decoding with a static KV cache, eager and torch.compile'd (compiled in the "
                        "warm-up); speed-ups are then reported against the compiled baseline too")
    p.add_argument("--max-repetition", type=float, default=None, metavar="R",
                   help="leave out prompts whose plain continuation repeats more than R of its 8-byte n-grams "
                        "(degenerate loops; reported)")
    p.add_argument("--dtype", choices=("fp32", "fp64", "bf16"), default="fp32", help="the LM's dtype")
    p.add_argument("--head-dtype", choices=("fp32", "fp64", "bf16"), default=None,
                   help="cast the heads for inference (default: as saved)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="folder for bench.json, bench.md, tradeoff.png")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_bench)


def run_bench(args) -> int:
    from .bench import BenchConfig, format_table, run_bench as bench

    cfg = BenchConfig(model=args.model, heads=args.heads, prompts=args.prompts, corpus=args.corpus,
                      num_prompts=args.num_prompts, repeats=args.repeats, prompt_len=args.prompt_len,
                      max_new_tokens=args.max_new_tokens, mode=args.mode, temperature=args.temperature,
                      top_k=args.top_k, top_p=args.top_p, drafts=args.draft,
                      bonus={"off": (False,), "on": (True,), "both": (False, True)}[args.bonus],
                      lookup={"off": (False,), "on": (True,), "both": (False, True)}[args.lookup],
                      lookup_tokens=args.lookup_tokens, peers=args.peers, compile=args.compile,
                      max_repetition=args.max_repetition, dtype=args.dtype,
                      head_dtype=args.head_dtype, device=args.device, threads=args.threads, seed=args.seed,
                      out=args.out, progress=not args.no_progress)
    report = bench(cfg)
    print(format_table(report))
    if report["context_warning"]:
        print(f"warning: {report['context_warning']}")
    if report["greedy_identical"] is not None:
        verdict = "yes" if report["greedy_identical"] else "NO (see greedy_check in bench.json)"
        print(f"greedy output identical to plain greedy decoding for every prompt: {verdict}")
    if args.out:
        print(f"wrote {args.out}/bench.json, bench.md, tradeoff.png")
    return 1 if report["greedy_identical"] is False else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mtpc", description="multi-token prediction with probabilistic circuits")
    sub = parser.add_subparsers(dest="command", required=True)
    add_tiny_lm(sub)
    add_train(sub)
    add_bench(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
