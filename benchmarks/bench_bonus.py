"""Bonus-conditioned drafting against plain drafting: accepted tokens per cycle and draft cost.

For each trained head folder and mode (greedy, sampling), decodes the same prompts with
`SpeculativeDecoder(..., bonus=False)` and `bonus=True` and reports the mean accepted length
(tokens committed per backbone call). Both variants make exactly one backbone call per cycle and run
the same circuit program (with or without `x_0` given), so tokens/s follows the accepted length; the
script also times the two drafts from one theta to show that.

Usage:
    python benchmarks/bench_bonus.py --model runs/tiny-lm --heads runs/heads/ff8 runs/heads/cp8-r8
        [--prompts 12] [--prompt-len 128] [--new 128] [--seeds 3] [--modes greedy sample]
        [--draft-repeats 200] [--out runs/bonus.json]

Without `--out` the table is printed only (benchmarks/results/bonus*.json are the recorded runs).

Sampled generations differ between the two variants (different random streams, so different texts
of different difficulty): compare them over several seeds per prompt.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: other processes share the cores

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from circuitc.draft import DraftProgram  # noqa: E402
from mtpc import SpeculativeDecoder, load_head  # noqa: E402

PROMPT_SOURCE = Path(os.__file__).parent  # the Python standard library (the tiny LM's corpus)


def prompts(count: int, length: int, bos: int | None) -> list[torch.Tensor]:
    """`count` byte prompts taken from spread-out standard-library files (deterministic)."""
    files = sorted(p for p in PROMPT_SOURCE.glob("*.py") if p.stat().st_size > 4 * length)
    step = max(1, len(files) // count)
    out = []
    for path in files[::step][:count]:
        data = path.read_bytes()
        start = len(data) // 2
        ids = ([bos] if bos is not None else []) + list(data[start:start + length])
        out.append(torch.tensor([ids]))
    return out


def mean_accepted(decoder: SpeculativeDecoder, batch: list[torch.Tensor], new: int, sample: bool,
                  seeds: int) -> float:
    """Tokens per cycle over all prompts (and, when sampling, `seeds` generations per prompt)."""
    accepted = []
    for i, ids in enumerate(batch):
        for seed in range(seeds if sample else 1):
            gen = torch.Generator().manual_seed(1000 * seed + i)
            out = decoder.generate(ids, new, do_sample=sample, generator=gen)
            accepted += out.stats.accepted_per_cycle
    return sum(accepted) / len(accepted)


def draft_ms(head, sample: bool, bonus: bool, repeats: int = 200) -> float:
    """Median ms of the circuit's draft from one theta, as the decoder runs it: the greedy (or, when
    sampling, the sampled) window, given the bonus token `x_0` or not."""
    program = DraftProgram(head.graph, head.circ.param_layout)
    with torch.no_grad():
        theta = head(torch.randn(head.hidden_size, dtype=head.dtype)).float()  # [P]
    given = torch.tensor([32]) if bonus else None  # x_0: a space
    gen = torch.Generator().manual_seed(0)
    draft = (lambda: program.sample(theta, gen, given)) if sample else (lambda: program.greedy(theta, given))
    times = []
    for k in range(repeats + 10):
        start = time.perf_counter()
        draft()
        if k >= 10:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--heads", nargs="+", required=True)
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=3, help="sampled generations per prompt")
    parser.add_argument("--modes", nargs="+", default=["greedy", "sample"], choices=["greedy", "sample"])
    parser.add_argument("--draft-repeats", type=int, default=200, help="timed calls of each draft")
    parser.add_argument("--out", default=None, help="write the rows as JSON here (default: print only)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    batch = prompts(args.prompts, args.prompt_len, model.config.bos_token_id)
    rows = []
    print(f"{'head':24} {'mode':7} {'acc plain':>10} {'acc bonus':>10} {'ratio':>6} {'draft ms plain':>15} "
          f"{'draft ms bonus':>15}")
    for folder in args.heads:
        head = load_head(folder).eval()
        for mode in args.modes:
            sample = mode == "sample"
            row = {"head": folder, "mode": mode}
            for bonus in (False, True):
                decoder = SpeculativeDecoder(model, head, bonus=bonus)
                row[f"accepted_{'bonus' if bonus else 'plain'}"] = mean_accepted(decoder, batch, args.new, sample,
                                                                                 args.seeds)
                row[f"draft_ms_{'bonus' if bonus else 'plain'}"] = draft_ms(head, sample, bonus, args.draft_repeats)
            rows.append(row)
            print(f"{Path(folder).name:24} {mode:7} {row['accepted_plain']:10.3f} {row['accepted_bonus']:10.3f} "
                  f"{row['accepted_bonus'] / row['accepted_plain']:6.3f} {row['draft_ms_plain']:15.3f} "
                  f"{row['draft_ms_bonus']:15.3f}")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"config": vars(args), "rows": rows}, indent=1))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
