"""Peak memory and time of the MTP loss (forward + backward): chunked/recomputed leaves vs naive.

Both variants run on the same batch (same seed) in a fresh subprocess each, so one cannot inherit
the other's allocator state. Memory is measured as

- CUDA: `torch.cuda.max_memory_allocated()` after `reset_peak_memory_stats()`, minus the memory
  allocated before the loss (weights, hidden states);
- CPU: the kernel's peak resident set size (`VmHWM` in /proc/self/status), reset just before the
  loss by writing 5 to /proc/self/clear_refs, minus the RSS at that moment. glibc's malloc is told to
  serve every allocation above 64 KiB with mmap (`MALLOC_MMAP_THRESHOLD_`), so freed tensors really
  leave the resident set and the peak is the peak of live tensors (plus allocator slack).

Subword vocabularies: `--parameterisation tied --v 152064 [--loss kl]` measures the tied head (the
LM's output layer `[v, d]`, frozen and referenced, behind per-unit adapters; the KL teacher is that
same layer) at a real vocabulary size; the naive variant then materialises `[tokens, Q, v]`.

Every module the loss needs is imported, and the loss run once on a few positions, before the
measured pass: a module imported lazily inside it would otherwise be counted in its peak (each row
lists the modules first imported during the measured pass; there should be none).

Usage: python benchmarks/bench_loss_memory.py [--n 16 --r 32 --tokens 2048] [--parameterisation tied --v 32000]
       [--loss nll|kl] [--json PATH]
Prints a table; `--json PATH` also writes it as JSON (benchmarks/results/loss_memory.json is the recorded run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mtpc.checks import positive_int  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # its sibling scripts
from script_args import ScriptParser, output_file  # noqa: E402


def measure(args) -> dict:
    """Run one variant in this process and return its numbers."""
    import torch

    import circuitc
    from circuitc import builders
    from mtpc.heads.head import MTPHead
    from mtpc.heads.kl_loss import kl_loss, lm_teacher
    from mtpc.heads.nll_loss import mtp_loss

    torch.manual_seed(0)
    device = torch.device(args.device)
    graph = {"btree": builders.btree_graph, "hmm": builders.hmm_graph, "cp": builders.cp_graph}[args.structure](
        args.n, args.r, args.v)
    output = torch.nn.Linear(args.d, args.v, bias=False).to(device).requires_grad_(False)  # the LM's, frozen
    init = output if args.parameterisation == "tied" else None
    head = MTPHead(circuitc.compile(graph), args.d, init_from=init, sum_init_std=0.02,
                   parameterisation=args.parameterisation).to(device)
    B, T = args.batch, args.tokens // args.batch
    hidden = torch.randn(B, T, args.d, device=device, requires_grad=True)  # [B, T, d]
    tokens = torch.randint(0, args.v, (B, T), device=device)
    doc_ids = torch.zeros(B, T, dtype=torch.long, device=device)
    mask = torch.ones(B, T, dtype=torch.bool, device=device)
    _warm_up(head, hidden, tokens, doc_ids, mask, fused=args.variant == "fused")
    for p in head.parameters():  # gradients of the weights exist in both variants; allocate them up front
        p.grad = torch.zeros_like(p)
    hidden.grad = torch.zeros_like(hidden)

    modules = set(sys.modules)
    before = _start(device)
    t0 = time.perf_counter()
    fused = args.variant == "fused"
    if args.loss == "kl":
        teacher = lm_teacher(output, hidden.detach())
        out = kl_loss(head, hidden, teacher, tokens, doc_ids, mask, fused=fused)
    else:
        out = mtp_loss(head, hidden, tokens, doc_ids, mask, fused=fused)
    out.loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = _peak(device) - before
    imported = sorted(set(sys.modules) - modules)
    return {"variant": args.variant, "peak_bytes": peak, "seconds": seconds, "loss": out.loss.item(),
            "imported_during": imported,
            "grad_norm": float(torch.linalg.vector_norm(next(head.parameters()).grad)),
            "method": ("cuda max_memory_allocated" if device.type == "cuda"
                       else "peak RSS (VmHWM, reset via clear_refs)")}


def _warm_up(head, hidden, tokens, doc_ids, mask, fused: bool) -> None:
    """The same loss on the first few positions of one sequence (forward + backward), so that every
    module it imports on first use is in memory before the measured pass; its gradients are dropped."""
    from mtpc.heads.nll_loss import mtp_loss

    few = head.num_variables + 2
    h = hidden[:1, :few].detach().clone().requires_grad_()
    mtp_loss(head, h, tokens[:1, :few], doc_ids[:1, :few], mask[:1, :few], fused=fused).loss.backward()
    for p in head.parameters():
        p.grad = None


def _start(device) -> int:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kb("VmRSS") * 1024


def _peak(device) -> int:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated()
    return _status_kb("VmHWM") * 1024


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def run_child(args, variant: str) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, __file__, "--child", "--variant", variant] + _shared(args)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _shared(args) -> list[str]:
    return ["--structure", args.structure, "--n", str(args.n), "--r", str(args.r), "--v", str(args.v), "--d",
            str(args.d), "--tokens", str(args.tokens), "--batch", str(args.batch), "--device", args.device,
            "--parameterisation", args.parameterisation, "--loss", args.loss]


def main(argv: list[str] | None = None) -> None:
    p = ScriptParser(description=__doc__.splitlines()[0])
    p.add_argument("--structure", default="btree", choices=("btree", "hmm", "cp"))
    p.add_argument("--n", type=positive_int, default=16)
    p.add_argument("--r", type=positive_int, default=32)
    p.add_argument("--v", type=positive_int, default=256)
    p.add_argument("--d", type=positive_int, default=256)
    p.add_argument("--tokens", type=positive_int, default=2048, help="window positions in the batch")
    p.add_argument("--batch", type=positive_int, default=4)
    p.add_argument("--parameterisation", default="full", choices=("full", "shared", "factorised", "tied"))
    p.add_argument("--loss", default="nll", choices=("nll", "kl"))
    p.add_argument("--device", default="cuda" if _cuda() else "cpu")
    p.add_argument("--json", type=output_file, default=None,
                   help="also write the table as JSON here (default: print only)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", default="fused", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args)))
        return
    rows = [run_child(args, v) for v in ("fused", "naive")]
    fused, naive = rows
    ratio = fused["peak_bytes"] / naive["peak_bytes"] if naive["peak_bytes"] else None  # tiny runs: 0, no ratio
    print(f"MTP {args.loss} loss, {args.parameterisation} head, {args.structure} n={args.n} r={args.r} v={args.v} d={args.d}, {args.tokens} tokens, "
          f"{args.device}; memory: {fused['method']}")
    print(f"{'variant':8} {'peak MiB':>10} {'seconds':>9} {'loss':>12} {'|grad W|':>12}")
    for r in rows:
        print(f"{r['variant']:8} {r['peak_bytes'] / 2**20:10.1f} {r['seconds']:9.2f} {r['loss']:12.6f} "
              f"{r['grad_norm']:12.6f}")
    print(f"fused / naive peak memory: {'n/a' if ratio is None else f'{ratio:.3f}'} (target <= 0.125)")
    late = sorted({m for r in rows for m in r["imported_during"]})
    if late:
        print(f"warning: modules first imported during a measured pass (counted in its peak): {', '.join(late)}")
    if args.json:
        keys = ("structure", "n", "r", "v", "d", "tokens", "batch", "device", "parameterisation", "loss")
        result = {"config": {k: getattr(args, k) for k in keys}, "rows": rows, "fused_over_naive": ratio}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    main()
