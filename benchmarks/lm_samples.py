"""Write the LM's own continuations as a training corpus for draft heads (self-distillation).

A head trained on corpus text learns what the *text* does next; a draft is accepted when it matches
what the *LM* does next. This script takes prompts from the training side of the corpus split (never
the held-out documents `mtpc bench --corpus` draws from), lets the LM continue each one (a share
greedily, the rest by sampling at temperature 1), and writes `{"text": prompt + continuation}` lines
that `mtpc train --data FILE.jsonl` reads.

Usage: python benchmarks/lm_samples.py --model runs/tiny-lm --out runs/lm-samples.jsonl \
           [--count 1024] [--prompt-len 64] [--new-tokens 448] [--greedy-fraction 0.5] [--batch 32]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch


def training_prompts(tok, count: int, length: int, seed: int, val_fraction: float = 0.02) -> list[list[int]]:
    """`count` spans of `length` tokens from the training side of the default corpus split."""
    from mtpc.data import load_documents, split_documents

    docs, _ = load_documents(None, tok)
    train, _ = split_documents(docs, val_fraction)
    rng = random.Random(seed)
    pool = [d for d in train if len(d) > length + 1]
    out = []
    for _ in range(count):
        doc = rng.choice(pool)
        start = rng.randrange(0, len(doc) - length)
        out.append(doc.tokens[start:start + length].astype("int64").tolist())
    return out


@torch.no_grad()
def continue_batch(model, prompts: list[list[int]], new_tokens: int, greedy: bool, eos: int, pad: int) -> list[list[int]]:
    """Continuations (up to the first EOS) of equal-length prompts, one batched `generate` call."""
    ids = torch.tensor(prompts, dtype=torch.long)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=not greedy,
                         temperature=1.0, top_k=0, top_p=1.0, eos_token_id=eos, pad_token_id=pad)
    result = []
    for row in out[:, ids.shape[1]:].tolist():
        result.append(row[:row.index(eos)] if eos in row else row)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--count", type=int, default=1024)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=448)
    parser.add_argument("--greedy-fraction", type=float, default=0.5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from mtpc.tokenizer import ByteTokenizer

    torch.manual_seed(args.seed)
    tok = ByteTokenizer.load(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    prompts = training_prompts(tok, args.count, args.prompt_len, args.seed)
    greedy_batches = round(args.greedy_fraction * len(prompts) / args.batch)
    written = 0
    with Path(args.out).open("w") as f:
        for b, start in enumerate(range(0, len(prompts), args.batch)):
            batch = prompts[start:start + args.batch]
            for prompt, cont in zip(batch, continue_batch(model, batch, args.new_tokens, b < greedy_batches,
                                                          tok.eos_id, tok.pad_id)):
                data = bytes(t for t in prompt + cont if tok.is_byte(t))
                f.write(json.dumps({"text": data.decode("utf-8", "surrogateescape")}) + "\n")
                written += 1
            print(f"{written}/{len(prompts)} continuations", flush=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
