"""`mtpc tiny-lm`, the model being trained and its losses: `JointLM` (the LM and, for MTP-aware
pretraining, a circuit head on its final hidden states), the next-token NLL sums, and the held-out
measures a run reports (bits per byte, the head's windowed loss)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..heads.nll_loss import mtp_loss, valid_counts
from ..lm.tokenizer import NUM_BYTES
from ..heads.windows import target_validity
from .data import PackedDataset, collate, to_device
from .precision import autocast

LN2 = math.log(2.0)


def lm_nll(model, batch: dict[str, torch.Tensor], dtype: torch.dtype | None, byte_lengths: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Next-token NLL over valid targets (same document, in the loss mask). `byte_lengths` `[V]`: the bytes
    of text each id stands for (default: a byte LM's, 1 for ids 0..255, 0 for the specials).
    Returns (sum over all targets, number of targets, sum over text targets, bytes of the text targets,
    number of text targets); a text target is one that stands for some bytes."""
    device = next(model.parameters()).device
    with autocast(device, dtype):
        logits = model(input_ids=batch["tokens"]).logits  # [B, T, V]
    return _nll_sums(logits, batch, byte_lengths)


def byte_level_lengths(vocab_size: int) -> torch.Tensor:
    """`[V]` a byte LM's bytes per id: 1 for the 256 byte ids, 0 after them."""
    return (torch.arange(vocab_size) < NUM_BYTES).long()


def _nll_sums(logits: torch.Tensor, batch: dict[str, torch.Tensor], byte_lengths: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens = batch["tokens"]  # [B, T]
    if byte_lengths is None:
        byte_lengths = byte_level_lengths(logits.shape[-1])
    valid = target_validity(batch["doc_ids"], batch["loss_mask"], 1)[:, :-1, 0]  # [B, T-1]
    nll = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    nll = nll.view_as(valid) * valid  # [B, T-1]
    target_bytes = byte_lengths.to(tokens.device)[tokens[:, 1:]] * valid  # [B, T-1]
    is_text = target_bytes > 0  # [B, T-1]
    return nll.sum(), valid.sum(), (nll * is_text).sum(), target_bytes.sum(), is_text.sum()


@torch.no_grad()
def held_out_bits(model, data: PackedDataset, max_tokens: int, dtype: torch.dtype | None,
                  byte_lengths: torch.Tensor | None = None, batch_size: int = 8) -> tuple[float, float]:
    """Held-out (bits per byte, bits per text token) over the first `max_tokens` tokens of `data`
    (`byte_lengths` as in `lm_nll`; special targets such as `<eos>` are in neither)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    count = min(len(data), max(1, max_tokens // data.seq_len))
    nll_text, n_bytes, n_text = 0.0, 0, 0
    for lo in range(0, count, batch_size):
        batch = to_device(collate(data[i] for i in range(lo, min(lo + batch_size, count))), device)
        _, _, s, b, c = lm_nll(model, batch, dtype, byte_lengths)
        nll_text, n_bytes, n_text = nll_text + s.item(), n_bytes + int(b), n_text + int(c)
    model.train(was_training)
    return nll_text / max(1, n_bytes) / LN2, nll_text / max(1, n_text) / LN2


def bits_per_byte(model, data: PackedDataset, max_tokens: int, dtype: torch.dtype | None,
                  batch_size: int = 8, byte_lengths: torch.Tensor | None = None) -> float:
    """Held-out bits per byte over the first `max_tokens` tokens of `data` (`held_out_bits`)."""
    return held_out_bits(model, data, max_tokens, dtype, byte_lengths, batch_size)[0]


class JointLM(nn.Module):
    """The LM and, for MTP-aware pretraining, a circuit head on its final hidden states; `forward`
    returns the loss of this rank's share of a batch, so DistributedDataParallel can wrap the whole
    computation. Both normalisers are the *global* batch's counts: the ranks' losses add up to the
    loss of the whole batch (and one process gives the same number).

    The MTP term is the windowed loss divided by `sum_j gamma^(j-1)`: a weighted *average* over window
    positions, on the scale of one next-byte cross-entropy, so `mtp_weight` means the same for every
    window length and discount (undivided, an n = 8, gamma = 0.9 term was 5.7 cross-entropies)."""

    def __init__(self, model: nn.Module, head: nn.Module | None, mtp_weight: float, gamma: float,
                 amp: torch.dtype | None):
        super().__init__()
        self.model, self.head = model, head
        self.mtp_weight, self.gamma, self.amp = mtp_weight, gamma, amp
        n = head.num_variables if head is not None else 1
        self.mtp_scale = 1.0 / sum(gamma ** j for j in range(n))  # 1 / sum_j gamma^(j-1)

    def forward(self, tokens, doc_ids, loss_mask, ce_count, mtp_counts=None, window_mask=None):
        """Returns (loss, cross-entropy share, MTP-loss share); the shares are detached."""
        with autocast(tokens.device, self.amp):
            hidden = self.model.get_decoder()(input_ids=tokens).last_hidden_state  # [B, T, d]
            logits = self.model.get_output_embeddings()(hidden)  # [B, T, V]
        nll, _, _, _, _ = _nll_sums(logits, {"tokens": tokens, "doc_ids": doc_ids, "loss_mask": loss_mask})
        ce = nll / ce_count.clamp(min=1)
        if self.head is None:
            return ce, ce.detach(), torch.zeros((), device=ce.device)
        with autocast(tokens.device, self.amp):
            mtp = mtp_loss(self.head, hidden, tokens, doc_ids, loss_mask, gamma=self.gamma, normalizer=mtp_counts,
                           window_mask=window_mask).loss * self.mtp_scale
        return ce + self.mtp_weight * mtp, ce.detach(), mtp.detach()


@torch.no_grad()
def mtp_val_loss(joint: JointLM, data: PackedDataset, max_tokens: int, batch_size: int = 8) -> float:
    """The head's held-out windowed MTP loss (Eq. 5, every window) over the first `max_tokens` tokens."""
    was_training = joint.training
    joint.eval()
    count = min(len(data), max(1, max_tokens // data.seq_len))
    batch = collate(data[i] for i in range(count))
    device = next(joint.parameters()).device
    n, v = joint.head.num_variables, joint.head.num_states
    counts = valid_counts(batch["doc_ids"], batch["loss_mask"], batch["tokens"], n, v).to(device)
    total = 0.0
    for lo in range(0, count, batch_size):
        part = to_device({k: t[lo:lo + batch_size] for k, t in batch.items()}, device)
        with autocast(device, joint.amp):
            hidden = joint.model.get_decoder()(input_ids=part["tokens"]).last_hidden_state
            total += mtp_loss(joint.head, hidden, part["tokens"], part["doc_ids"], part["loss_mask"],
                              gamma=joint.gamma, normalizer=counts).loss.item() * joint.mtp_scale
    joint.train(was_training)
    return total
