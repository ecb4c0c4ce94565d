"""A byte-level BPE tokenizer trained here with the `tokenizers` library (`mtpc tiny-lm --bpe-vocab N`).

`train_bpe(texts, vocab_size)` learns merges over byte-level pre-tokens (GPT-2's byte-to-character
table, so every string has a tokenization and decoding gives back exactly the text encoded) and returns
a transformers `PreTrainedTokenizerFast` with mtpc's special tokens first (`<pad>`, `<bos>`, `<eos>`, the
chat roles and `<|end|>` at ids 0..7, never produced by text) and the chat template of
`mtpc.training.data` (the byte tokenizer's), so `mtpc generate --chat` renders the same turns.

Deterministic: the same texts in the same order give the same vocabulary and merges
(`tests/test_subword_e2e.py` trains it twice on the same files and compares).
Only the training documents are shown to it (`mtpc tiny-lm` passes its training split), so held-out
files stay unseen by the tokenizer too.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..lm.tokenizer import SPECIAL_TOKENS, ByteTokenizer

__all__ = ["train_bpe", "MIN_BPE_VOCAB"]

MIN_BPE_VOCAB = 256 + len(SPECIAL_TOKENS)  # the byte alphabet and the specials; merges come on top


def train_bpe(texts: Iterable[str], vocab_size: int):
    """A byte-level BPE of `vocab_size` tokens (specials included) learnt from `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < MIN_BPE_VOCAB:
        raise ValueError(f"a byte-level BPE needs at least {MIN_BPE_VOCAB} tokens (256 bytes + "
                         f"{len(SPECIAL_TOKENS)} specials), got {vocab_size}")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(texts, trainer)
    names = ByteTokenizer()  # the byte tokenizer's special names and chat template
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=names.token_name(names.bos_id), eos_token=names.token_name(names.eos_id),
        pad_token=names.token_name(names.pad_id), additional_special_tokens=list(SPECIAL_TOKENS[3:]),
        chat_template=names.chat_template())
