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
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mtpc", description="multi-token prediction with probabilistic circuits")
    sub = parser.add_subparsers(dest="command", required=True)
    add_tiny_lm(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
