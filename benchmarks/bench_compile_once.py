"""A compiled decoder compiles once per process: generations whose lengths cross several powers of two,
one after another in one process, each with its compile time and the decoder's cache allocations.

Before caches held `max_context` positions from the start, a generation that needed more room than every
one before it allocated caches twice as long and compiled its cycle again (on SmolLM2 a 160-token prompt
decoded for 16 tokens, then for 128, compiled twice, 30 s each with a warm inductor cache).

    python benchmarks/bench_compile_once.py --model SmolLM2-135M-Instruct.Q4_1.gguf \\
        --head models/heads/smollm2-ff4-k2048 --dtype bf16 --out benchmarks/results/compile_once_smollm2.json

Prints a table (one row per generation) and writes it as JSON.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mtpc import SpeculativeDecoder  # noqa: E402

from mtpc.lm import loading  # noqa: E402
from mtpc.checks import dtype_name, positive_int  # noqa: E402
from mtpc.decoding import load_head_entry  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from results_file import write_results  # noqa: E402
from script_args import ScriptParser, output_file, run_main, torch_threads  # noqa: E402

# prompt tokens:new tokens, one after another: totals of about 180, 290, 420 and 700 positions
GENERATIONS = ("160:16", "160:128", "290:128", "500:200")


def prompt_ids(tok, length: int) -> torch.Tensor:
    """`length` tokens of a held-out source file (networkx), as the model's tokenizer reads it."""
    import networkx

    text = (Path(networkx.__file__).parent / "algorithms" / "shortest_paths" / "weighted.py").read_text()
    ids = tok.encode_prompt(text)
    return torch.tensor([ids[:length]])


def generation(text: str) -> tuple[int, int]:
    """P:N, the prompt tokens and new tokens of one generation (both positive)."""
    prompt, colon, new = text.partition(":")
    try:
        return positive_int(prompt), positive_int(new)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected P:N (prompt tokens:new tokens, both positive), got {text!r}"
                                         ) from None


def main(argv=None) -> list[dict]:
    parser = ScriptParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--head", required=True)
    parser.add_argument("--dtype", type=dtype_name, default="fp32")
    parser.add_argument("--threads", type=torch_threads, default=1)
    parser.add_argument("--max-context", type=positive_int, default=None)
    parser.add_argument("--generations", nargs="+", type=generation, default=GENERATIONS, metavar="P:N",
                        help="prompt tokens and new tokens of each generation, in order")
    parser.add_argument("--out", type=output_file, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    info = loading.model_info(args.model, subword_ok=True)
    tok = loading.model_tokenizer(info)
    dtype, cpu = loading.torch_dtype(args.dtype), torch.device("cpu")
    entry = load_head_entry(args.head, loading.load_model(args.model, dtype), args.model, dtype, None, cpu)
    decoder = SpeculativeDecoder(entry.model, entry.head, entry.lora_layers, compile=True,
                                 max_context=args.max_context)
    rows = []
    for length, budget in args.generations:
        ids = prompt_ids(tok, length)
        start = time.perf_counter()
        out = decoder.generate(ids, budget)
        rows.append({"prompt_tokens": ids.shape[1], "new_tokens": out.stats.new_tokens,
                     "compile_seconds": round(out.stats.compile_seconds, 2),
                     "seconds": round(time.perf_counter() - start, 2), "allocations": decoder.verifier.allocations,
                     "cache_positions": decoder.verifier.max_len})
        print(" | ".join(f"{k} {v}" for k, v in rows[-1].items()), flush=True)
    record = {"model": Path(args.model).name, "head": str(args.head), "dtype": args.dtype, "threads": args.threads,
              "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
              "cache_mib": round(decoder.verifier.cache_bytes() / 2**20, 1), "generations": rows}
    write_results(record, args.out)
    return rows


if __name__ == "__main__":
    run_main(main)
