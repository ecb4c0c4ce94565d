"""A draft vocabulary (`mtpc train --draft-vocab K`): the `K` tokens a head drafts over, chosen as the ones
the LM itself most often outputs on the training sequences (the `greedy` tokens a feature store holds),
or, training on the live LM, the training text's most frequent tokens; and how much of a split they cover.

A draft vocabulary keeps decoding exact (the verifier scores the whole vocabulary; a token outside it
has draft probability 0) and makes every leaf of the circuit `V / K` times cheaper.
"""

from __future__ import annotations

import torch

__all__ = ["token_counts", "choose_vocabulary", "coverage"]


def token_counts(dataset, vocab_size: int) -> torch.Tensor:
    """`[V]` how often each token is the LM's greedy choice in a `FeatureSet` (at real positions), or
    appears in a `PackedDataset`'s text."""
    if hasattr(dataset, "greedy_counts"):
        return dataset.greedy_counts(vocab_size)
    return torch.bincount(dataset.tokens.long(), minlength=vocab_size)[:vocab_size]


def choose_vocabulary(counts: torch.Tensor, size: int) -> list[int]:
    """The `size` most counted token ids, most counted first (ties: the lower id first)."""
    if not 1 <= size <= counts.numel():
        raise ValueError(f"a draft vocabulary of {size} tokens needs 1 <= K <= the LM's {counts.numel()} tokens")
    order = torch.argsort(-counts.double() - torch.arange(counts.numel()) / (2.0 * counts.numel()), stable=True)
    return order[:size].tolist()


def coverage(vocabulary: list[int], counts: torch.Tensor) -> float:
    """The share of the counted tokens that the vocabulary holds."""
    total = int(counts.sum())
    return float(counts[torch.tensor(vocabulary, dtype=torch.long)].sum()) / total if total else float("nan")
