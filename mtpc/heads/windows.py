"""Windows of targets: for every position `t` of a batch, the next `n` tokens and which of them count.

A head scores the window `x[t + 1 .. t + n]` at position `t`; a target counts when it exists, lies in
the same document as `t` (`doc_ids`) and inside the loss mask (what `mtpc.training.data` packs).
"""

from __future__ import annotations

import torch

__all__ = ["target_validity", "window_targets"]


def target_validity(doc_ids: torch.Tensor, loss_mask: torch.Tensor, n: int) -> torch.Tensor:
    """`valid[b, t, j-1]`: target `t + j` (j = 1..n) is in the sequence, in the same document as `t`,
    and inside the loss mask. `doc_ids`, `loss_mask`: [B, T] -> [B, T, n] bool."""
    B, T = doc_ids.shape
    pad_ids = torch.cat([doc_ids, doc_ids.new_full((B, n), -2)], 1)  # [B, T + n]
    pad_mask = torch.cat([loss_mask, loss_mask.new_zeros((B, n))], 1)  # [B, T + n]
    ahead_ids = pad_ids.unfold(1, n, 1)[:, 1:]  # [B, T, n]: doc_ids[t + j]
    ahead_mask = pad_mask.unfold(1, n, 1)[:, 1:]  # [B, T, n]
    return (ahead_ids == doc_ids.unsqueeze(-1)) & ahead_mask & (doc_ids >= 0).unsqueeze(-1)


def window_targets(tokens: torch.Tensor, n: int, fill: int = 0) -> torch.Tensor:
    """`x[b, t, j-1] = tokens[b, t + j]` (j = 1..n), `fill` past the end. [B, T] -> [B, T, n]."""
    B, _ = tokens.shape
    padded = torch.cat([tokens, tokens.new_full((B, n), fill)], 1)  # [B, T + n]
    return padded.unfold(1, n, 1)[:, 1:].contiguous()
