"""`mtpc train`, validation: the loss and the teacher-forced mean accepted length of the circuit's
greedy draft on held-out windows (run on rank 0); `val_committed` counts as a greedy cycle commits
(the verifier's `x_0`, then the draft's leading matches after it), the same for every head."""

from __future__ import annotations

import torch

from ..heads.nll_loss import teacher_forced_accepted
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
    loss, _, _ = module(batch["tokens"], batch["doc_ids"], batch["loss_mask"], None, hidden=cached)
    h = (module.hidden(batch["tokens"]) if cached is None else cached).float()  # [B, T, d]
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
    accepted = lengths(head.reads_first_token)
    committed = accepted if head.reads_first_token else lengths(True)
    mean = lambda t: t.float().mean().item() if len(t) else float("nan")  # noqa: E731
    return {"val_loss": loss.item(), "val_accepted": mean(accepted), "val_committed": mean(committed),
            "val_windows": len(x), "val_accept_hist": torch.bincount(accepted, minlength=n + 1).tolist()}
