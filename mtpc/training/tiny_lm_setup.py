"""`mtpc tiny-lm`, setting up: the checks of its settings (`TinyLMConfig`, in `config`), the fresh LM and the
jointly trained head, the data and its order, the optimizer.

User mistakes are reported by `check_config` and `mtp_graph` before any slow work.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import torch
from torch import nn

from ..lm import loading
from ..errors import InputError
from ..heads.head import PARAMETERISATIONS, MTPHead
from ..lm.tokenizer import NUM_BYTES, TOKENIZER_FILE, ByteTokenizer, SubwordTokenizer
from .bpe import train_bpe
from .config import TinyLMConfig
from .data import DataStats, Document, EpochSampler, PackedDataset, load_documents, split_documents

MIN_SUBWORD_VOCAB = loading.MAX_BYTE_VOCAB + 1  # a smaller vocabulary without mtpc_tokenizer.json reads as bytes
MTP_HEAD_DIR = "mtp_head"  # the jointly trained head's folder inside the LM's (mtpc.load_head reads it)


def lm_tokenizer(cfg: TinyLMConfig) -> ByteTokenizer | SubwordTokenizer:
    """The LM's tokenizer: bytes, the subword one of `--tokenizer DIR`, or a byte-level BPE of `--bpe-vocab N`
    tokens trained on the training documents of `--data` (the held-out ones never seen)."""
    if cfg.tokenizer is None and cfg.bpe_vocab is None:
        return ByteTokenizer(cfg.vocab_size)
    if cfg.tokenizer is not None:
        where = f"--tokenizer {cfg.tokenizer}"
        tok = loading.subword_tokenizer(loading.readable_folder(cfg.tokenizer, "--tokenizer"), cfg.vocab_size)
    else:
        where = f"--bpe-vocab {cfg.bpe_vocab} (the corpus gave {{}} tokens)"
        docs, _ = load_documents(cfg.data, ByteTokenizer())
        train, _ = split_documents(docs, cfg.val_fraction)
        tok = SubwordTokenizer(train_bpe(map(document_text, train), cfg.bpe_vocab), cfg.vocab_size, "--bpe-vocab")
        where = where.format(len(tok.hf))
    if tok.vocab_size < MIN_SUBWORD_VOCAB:
        raise InputError(f"{where}: an LM of {tok.vocab_size} tokens would be read as bytes by mtpc's loaders (a "
                         f"vocabulary of at most {loading.MAX_BYTE_VOCAB} without {TOKENIZER_FILE}); pad it with "
                         f"--vocab-size {MIN_SUBWORD_VOCAB}")
    return tok


def document_text(doc: Document) -> str:
    """A byte document's text (its bytes as UTF-8, invalid ones as U+FFFD as a subword tokenizer reads them)."""
    body = doc.tokens[(doc.tokens >= 0) & (doc.tokens < NUM_BYTES)]  # [len] the bytes, specials dropped
    return body.astype("uint8").tobytes().decode("utf-8", errors="replace")


def build_model(cfg: TinyLMConfig, tok: ByteTokenizer | SubwordTokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=tok.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
        max_position_embeddings=cfg.context, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id,
    )
    return LlamaForCausalLM(config)


def build_mtp_head(cfg: TinyLMConfig, graph, model) -> MTPHead:
    """A head on the final hidden states, its units initialised from the (fresh) LM's unembedding,
    as `mtpc train` does, so at step 0 it is the fully factorised product of the LM's softmax."""
    unembed = model.get_output_embeddings().weight.detach()  # [V, d]
    return MTPHead(graph, cfg.d_model, init_from=unembed, sum_init_std=cfg.mtp_sum_init_std,
                   parameterisation=cfg.mtp_parameterisation)


class ShuffledOrder(EpochSampler):
    """The order `tiny-lm` has always used: epoch `e` is the `e + 1`-th shuffle of one
    `random.Random(seed)`, so a resumed run replays the shuffles up to its epoch."""

    def _permutation(self) -> list[int]:
        rng = random.Random(self.seed)
        for _ in range(self.epoch + 1):
            perm = list(range(self.size))
            rng.shuffle(perm)
        return perm


def check_config(cfg: TinyLMConfig) -> None:
    """User mistakes, reported before any slow work."""
    if cfg.steps is not None and cfg.steps < 1:
        raise InputError(f"--steps must be at least 1, got {cfg.steps}")
    if cfg.steps is None and not cfg.minutes > 0:
        raise InputError(f"--minutes must be positive, got {cfg.minutes}")
    if cfg.d_model % cfg.heads:
        raise InputError(f"--heads {cfg.heads} must divide --d-model {cfg.d_model}")
    if cfg.tokenizer is not None and cfg.bpe_vocab is not None:
        raise InputError("give --tokenizer or --bpe-vocab, not both")
    if cfg.bpe_vocab is not None and cfg.bpe_vocab < MIN_SUBWORD_VOCAB:
        raise InputError(f"--bpe-vocab {cfg.bpe_vocab} is too small: a subword LM needs at least {MIN_SUBWORD_VOCAB} "
                         f"tokens (mtpc's loaders read a vocabulary of at most {loading.MAX_BYTE_VOCAB} without "
                         f"{TOKENIZER_FILE} as bytes)")
    subword = cfg.tokenizer is not None or cfg.bpe_vocab is not None
    if cfg.vocab_size is not None and cfg.bpe_vocab is not None and cfg.vocab_size < cfg.bpe_vocab:
        raise InputError(f"--vocab-size {cfg.vocab_size} is smaller than --bpe-vocab {cfg.bpe_vocab}")
    if cfg.vocab_size is not None and not subword and cfg.vocab_size < loading.MIN_BYTE_VOCAB:
        raise InputError(f"--vocab-size {cfg.vocab_size} is too small: 256 bytes + 8 special tokens need at least "
                         f"{loading.MIN_BYTE_VOCAB}")
    if cfg.mtp_circuit is None:
        defaults = TinyLMConfig(out=cfg.out)
        given = [flag for flag, name in (("-D", "mtp_bindings"), ("--mtp-weight", "mtp_weight"),
                                         ("--mtp-window-stride", "mtp_window_stride"))
                 if getattr(cfg, name) != getattr(defaults, name)]
        if given:
            raise InputError(f"{', '.join(given)} only apply with --mtp-circuit")
        return
    if cfg.mtp_parameterisation not in PARAMETERISATIONS:
        raise InputError(f"--mtp-parameterisation must be one of {', '.join(PARAMETERISATIONS)}, "
                         f"got {cfg.mtp_parameterisation!r}")
    if not (cfg.mtp_weight >= 0 and math.isfinite(cfg.mtp_weight)):
        raise InputError(f"--mtp-weight must be a finite number >= 0, got {cfg.mtp_weight}")
    if cfg.mtp_window_stride < 1:
        raise InputError(f"--mtp-window-stride must be at least 1, got {cfg.mtp_window_stride}")
    if not 0 < cfg.mtp_gamma <= 1:
        raise InputError(f"--mtp-gamma must be in (0, 1], got {cfg.mtp_gamma}")


def mtp_graph(cfg: TinyLMConfig):
    """The checked region graph of `--mtp-circuit` (None without one)."""
    if cfg.mtp_circuit is None:
        return None
    import circuitc
    from circuitc.errors import CircuitError

    path = Path(cfg.mtp_circuit)
    if not path.is_file():
        raise InputError(f"--mtp-circuit {cfg.mtp_circuit}: no such file")
    try:
        graph = circuitc.load_graph(path, **cfg.mtp_bindings)
    except CircuitError as e:
        raise InputError(f"--mtp-circuit {cfg.mtp_circuit}: {e}") from None
    if cfg.tokenizer is None and cfg.bpe_vocab is None:
        check_states(cfg, graph, ByteTokenizer(cfg.vocab_size).vocab_size)
    return graph


def check_states(cfg: TinyLMConfig, graph, vocab: int) -> None:
    """The circuit's states are token ids of the LM (a subword LM's vocabulary is known once its tokenizer is)."""
    import circuitc

    states = circuitc.compile(graph).num_states
    if states > vocab:
        raise InputError(f"--mtp-circuit {cfg.mtp_circuit}: {states} states, but the LM has {vocab} tokens")


def datasets(cfg: TinyLMConfig, tok: ByteTokenizer | SubwordTokenizer) -> tuple[PackedDataset, PackedDataset, DataStats]:
    docs, stats = load_documents(cfg.data, tok)
    train_docs, val_docs = split_documents(docs, cfg.val_fraction)
    return (PackedDataset(train_docs, cfg.context, tok.pad_id), PackedDataset(val_docs, cfg.context, tok.pad_id),
            stats)


def stats_dict(stats: DataStats) -> dict:
    return {k: getattr(stats, k) for k in ("files", "documents", "tokens", "skipped_empty", "skipped_corrupt",
                                           "skipped_binary")}


def optimizer(module: nn.Module, cfg: TinyLMConfig) -> torch.optim.Optimizer:
    """AdamW over the LM (and the joint head, same rule): weight decay on matrices only."""
    decay = [p for p in module.parameters() if p.dim() >= 2]
    no_decay = [p for p in module.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
