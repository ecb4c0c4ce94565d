"""Held-out bits per byte of a byte LM on each corpus's held-out split, as `mtpc tiny-lm` measures it.

For every `--corpus` (default: the Python standard library, the corpus `mtpc tiny-lm` trains on) the
documents are split by the current rule (CRC-32 of each document's path relative to the corpus
root) and the LM is scored on the first `--tokens` tokens of the held-out part, packed into
`--context`-byte sequences as in training. With `--old-rule`, the documents the previous rule held out
(CRC-32 of the absolute path on this machine) are scored too, and so are those both rules hold out:
an LM trained under the previous rule has seen the rest of the current held-out part.

Usage:
    python benchmarks/heldout_bpb.py [--model models/byte-lm] [--corpus stdlib PATH ...] [--old-rule]
        [--tokens 262144] [--threads 1] [--out runs/heldout_bpb.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: other processes share the cores

import dataclasses  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from mtpc.checks import positive_int  # noqa: E402
from mtpc.lm.loading import load_model  # noqa: E402
from mtpc.lm.tokenizer import ByteTokenizer  # noqa: E402
from mtpc.training.data import (PackedDataset, corpus_root, default_corpus, load_documents,  # noqa: E402
                                split_documents)
from mtpc.training.tiny_lm_model import bits_per_byte  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from script_args import ScriptParser, output_file, run_main, torch_threads  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def absolute_names(docs: list, source: Path) -> list:
    """The documents named as the previous rule named them: by their absolute path on this machine."""
    root = corpus_root(source)
    return [dataclasses.replace(d, name=str(root / d.name)) for d in docs]


def score(model, docs: list, tok: ByteTokenizer, context: int, tokens: int) -> dict:
    if not docs:
        return {"documents": 0, "bits_per_byte": None, "tokens": 0}
    data = PackedDataset(docs, context, tok.pad_id)
    return {"documents": len(docs), "tokens": min(data.num_tokens, tokens // context * context),
            "bits_per_byte": bits_per_byte(model, data, tokens, None)}


def evaluate(model, tok: ByteTokenizer, corpus: str, fraction: float, context: int, tokens: int,
             old_rule: bool) -> dict:
    source = default_corpus() if corpus == "stdlib" else Path(corpus)
    docs, _ = load_documents(None if corpus == "stdlib" else corpus, tok)
    _, held_out = split_documents(docs, fraction)
    result = {"corpus": corpus if corpus == "stdlib" else Path(corpus).name, "rule": "relative path",
              **score(model, held_out, tok, context, tokens)}
    if old_rule:
        renamed = absolute_names(docs, Path(source))
        _, old = split_documents(renamed, fraction)
        old_names, held_names = {d.name for d in old}, {d.name for d in held_out}
        both = [d for d, r in zip(docs, renamed) if r.name in old_names and d.name in held_names]
        result["previous rule (absolute path)"] = score(model, old, tok, context, tokens)
        result["held out by both rules"] = score(model, both, tok, context, tokens)
    return result


def main(argv=None) -> list[dict]:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "byte-lm"))
    parser.add_argument("--corpus", nargs="+", default=["stdlib"], help="'stdlib' or corpus folders")
    parser.add_argument("--fraction", type=float, default=0.02, help="the held-out share (mtpc tiny-lm's default)")
    parser.add_argument("--context", type=positive_int, default=1024, help="bytes per scored sequence (as in training)")
    parser.add_argument("--tokens", type=positive_int, default=1 << 18,
                        help="tokens scored per split (tiny-lm's final)")
    parser.add_argument("--old-rule", action="store_true", help="also the previous absolute-path split")
    parser.add_argument("--threads", type=torch_threads, default=1)
    parser.add_argument("--out", type=output_file, default=None,
                        help="write the results as JSON here (default: print only)")
    args = parser.parse_args(argv)
    if not 0 < args.fraction < 1:  # NaN included
        parser.error(f"--fraction is the held-out share, in (0, 1); got {args.fraction}")
    missing = [c for c in args.corpus if c != "stdlib" and not Path(c).is_dir()]
    if missing:
        parser.error(f"--corpus: no such folder: {', '.join(missing)} (give 'stdlib' or corpus folders)")
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model).eval(), ByteTokenizer.load(args.model)
    results = [evaluate(model, tok, c, args.fraction, args.context, args.tokens, args.old_rule) for c in args.corpus]
    print(f"held-out bits/byte of {Path(args.model).name} (first {args.tokens:,} tokens of each split)")
    for r in results:
        for label, part in [("held out (relative-path rule)", r)] + [(k, v) for k, v in r.items() if isinstance(v, dict)]:
            bpb = "-" if part["bits_per_byte"] is None else f"{part['bits_per_byte']:.3f}"
            print(f"  {r['corpus']:<12} {label:<32} {part['documents']:>5} documents  {part['tokens']:>8,} tokens  {bpb}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"model": Path(args.model).name, "results": results}, indent=1))
        print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    run_main(main)
