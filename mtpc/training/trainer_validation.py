"""`mtpc train`, validation: the loss and the teacher-forced mean accepted length of the circuit's
greedy draft on held-out windows (run on rank 0); `val_committed` counts as a greedy cycle commits
(the verifier's `x_0`, then the draft's leading matches after it), the same for every head.
`val_depth_topk`: on the same windows, the top-1/2/4/8 acceptance at each drafted depth
(`mtpc.heads.nll_loss.depth_topk`); `depth_table` writes it as a model card's Markdown table."""

from __future__ import annotations

import torch

from ..heads.nll_loss import depth_topk, teacher_forced_accepted, teacher_forced_ranks
from ..heads.windows import target_validity, window_targets
from .data import collate, spread, to_device
from .trainer_setup import DraftModel, TrainConfig


@torch.no_grad()
def validate(module: DraftModel, val_set: torch.utils.data.Dataset, cfg: TrainConfig, device: torch.device) -> dict:
    """Loss and teacher-forced mean accepted length on `val_sequences` held-out sequences (of a
    `PackedDataset`, or a `FeatureSet` whose items carry the LM's hidden states) spread
    evenly over the validation set, and `val_windows` of their full windows, also evenly spread."""
    head = module.head
    n = head.num_variables
    picks = spread(len(val_set), cfg.val_sequences)
    batch = to_device(collate(val_set[i] for i in picks), device)
    module.eval()
    cached = batch.get("hidden")  # [B, T, d] the LM's cached hidden states (mtpc train --features), or None
    inner = batch.get("inner")  # [B, T, d] the last layers' input (a store made with --draft-layers), or None
    loss, _, _ = module(batch["tokens"], batch["doc_ids"], batch["loss_mask"], None, hidden=cached, inner=inner)
    h = module.draft_hidden(batch["tokens"], cached, inner).float()  # [B, T, d] what the head reads
    states = head.states_of(batch["tokens"])  # [B, T] (a token outside a draft vocabulary: no state)
    valid = target_validity(batch["doc_ids"], batch["loss_mask"], n)  # [B, T, n]
    valid &= window_targets(states, n, fill=-1) < head.num_states
    full = valid.all(-1).flatten()  # windows whose n targets all exist
    x = window_targets(states, n).flatten(0, 1)[full]  # [W, n]
    hw = h.flatten(0, 1)[full]  # [W, d]
    chosen = torch.tensor(spread(len(x), cfg.val_windows), dtype=torch.long, device=x.device)
    x, hw = x[chosen], hw[chosen]
    hw = head.with_first_token(hw, x[:, 0])  # [W, d] the head's input

    def lengths(first_given: bool) -> torch.Tensor:  # [W]
        if not len(x):
            return torch.zeros(0, dtype=torch.long)
        return torch.cat([teacher_forced_accepted(head, hw[i:i + 128], x[i:i + 128], first_given)
                          for i in range(0, len(x), 128)])

    # a head that reads x_0 is scored after it; `val_committed` scores every head so (as the decoder drafts)
    first = head.reads_first_token
    accepted = lengths(first)
    committed = accepted if first else lengths(True)
    ranks = torch.cat([teacher_forced_ranks(head, hw[i:i + 128], x[i:i + 128], first)  # [W, n - first]
                       for i in range(0, len(x), 128)]) if len(x) else torch.zeros(0, n - first, dtype=torch.long)
    mean = lambda t: t.float().mean().item() if len(t) else float("nan")  # noqa: E731
    return {"val_loss": loss.item(), "val_accepted": mean(accepted), "val_committed": mean(committed),
            "val_windows": len(x), "val_accept_hist": torch.bincount(accepted, minlength=n + 1).tolist(),
            "val_depth_topk": depth_topk(ranks.cpu(), int(first))}


def depth_table(summary: dict) -> str:
    """A summary's `val_depth_topk` (`train_config.json`, or what `mtpc train` returns) as a Markdown
    table for a model card: a row per drafted depth, each k's teacher-forced top-k acceptance of that
    depth's token and of the whole path up to it ("" when the summary has none)."""
    table = summary.get("val_depth_topk")
    if not table:
        return ""
    cell = lambda f: "-" if f is None else f"{f:.3f}"  # noqa: E731
    head = " | ".join(f"top-{k}" for k in table["k"])
    lines = [f"| depth | {head} | {' | '.join(f'path top-{k}' for k in table['k'])} |",
             "| ---: |" + " ---: |" * (2 * len(table["k"]))]
    for d, token, path in zip(table["depth"], table["token"], table["path"]):
        lines.append(f"| {d} | {' | '.join(map(cell, token))} | {' | '.join(map(cell, path))} |")
    return "\n".join(lines)


def depth_line(summary: dict, ks: tuple[int, ...] = (1, 8)) -> str:
    """`top-1 by depth 1..3: 0.36 0.16 0.08; top-8: 0.71 0.52 0.40` (each depth's token, teacher-forced)
    for `mtpc train`'s last line; "" when the summary has no table or no window."""
    table = summary.get("val_depth_topk")
    if not table or not table["token"] or table["token"][0][0] is None:
        return ""
    parts = [" ".join(f"{row[table['k'].index(k)]:.2f}" for row in table["token"]) for k in ks if k in table["k"]]
    labels = [f"top-{k}" for k in ks if k in table["k"]]
    if not parts:
        return ""
    span = f"{table['depth'][0]}..{table['depth'][-1]}"
    return f"{labels[0]} by depth {span}: {parts[0]}" + "".join(f"; {a}: {b}" for a, b in zip(labels[1:], parts[1:]))
