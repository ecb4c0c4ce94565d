"""Prompts for `mtpc bench` (a file, or held-out spans of a corpus; `--chat`: a file's prompts as user turns of
the model's chat template), the ids that end an answer, and how repetitive a continuation is."""

from __future__ import annotations

import json
import random
from pathlib import Path

from ..lm import loading
from ..errors import InputError
from ..lm.tokenizer import ByteTokenizer, SubwordTokenizer

__all__ = ["load_prompts", "encode_prompts", "prompts_from_file", "prompt_texts", "prompts_from_corpus",
           "answer_end_ids", "repetition"]


# --------------------------------------------------------------------------- prompts

def load_prompts(cfg, tok: ByteTokenizer | SubwordTokenizer) -> list[list[int]]:
    """`repeats * num_prompts` prompts (token ids), from `cfg.prompts` (with `cfg.chat` each a user turn of
    the model's chat template) or sampled from `cfg.corpus`."""
    need = cfg.repeats * cfg.num_prompts
    if (cfg.prompts is None) == (cfg.corpus is None):
        raise InputError("give exactly one of prompts (a file) or corpus (a path)")
    check_chat_source(cfg)
    if cfg.prompts is not None:
        texts = prompt_texts(Path(cfg.prompts))
        if len(texts) < need:
            raise InputError(f"{cfg.prompts} has {len(texts)} prompts; {cfg.repeats} sets of {cfg.num_prompts} "
                             f"need {need}")
        # only the prompts used are encoded: a chat template is rendered in a child process per prompt
        return encode_prompts(texts[:need], tok, chat_model=cfg.model if cfg.chat else None)
    return prompts_from_corpus(cfg.corpus, tok, need, cfg.prompt_len, cfg.seed, cfg.val_fraction)


def check_chat_source(cfg) -> None:
    """`--chat` renders instructions: a corpus's spans of documents are no user turns."""
    if cfg.chat and cfg.corpus is not None:
        raise InputError("--chat needs instruction prompts from --prompts, not spans of --corpus documents")


def encode_prompts(texts: list[str], tok: ByteTokenizer | SubwordTokenizer,
                   chat_model: str | None = None) -> list[list[int]]:
    """Each text's ids as `mtpc generate` takes a prompt (`encode_prompt`: a byte LM's after `<bos>`, a
    pretrained model's as its own tokenizer makes them); with `chat_model` (a `--model`) one user
    turn through that model's own chat template, as `mtpc generate --chat` renders it (`mtpc.lm.chat.chat_ids`:
    the text stays text, never a special id)."""
    if chat_model is None:
        return [tok.encode_prompt(text) for text in texts]
    from ..lm.chat import chat_ids

    folder = loading.model_folder(chat_model)  # a GGUF file's converted folder holds its chat template
    return [chat_ids(folder, [{"role": "user", "content": text}], tok) for text in texts]


def answer_end_ids(cfg, tok: ByteTokenizer | SubwordTokenizer) -> set[int]:
    """The ids that end a generated answer: eos; with `--chat` also where `mtpc generate --chat` stops, any
    special token of a subword model (its template's end of turn is one) or a byte model's end of turn."""
    if not cfg.chat:
        return {tok.eos_id}
    if isinstance(tok, SubwordTokenizer):
        return tok.special_ids()
    return {tok.eos_id, tok.end_of_turn_id}


def prompts_from_file(path: Path, tok: ByteTokenizer | SubwordTokenizer) -> list[list[int]]:
    """The prompts of `prompt_texts(path)`, each encoded as `mtpc generate` takes a prompt."""
    return encode_prompts(prompt_texts(path), tok)


def prompt_texts(path: Path) -> list[str]:
    """`.jsonl`: one JSON string or `{"prompt": ...}` per line; otherwise one prompt per non-empty line."""
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="surrogateescape").splitlines(), 1):
        if not line.strip():
            continue
        text = line
        if path.suffix == ".jsonl":
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{number}: invalid JSON: {e.msg}") from None
            except RecursionError:  # a line of 100,000 "[": the parser recurses once per level
                raise InputError(f"{path}:{number}: JSON nested too deeply") from None
            text = record.get("prompt") if isinstance(record, dict) else record
            if not isinstance(text, str):
                raise InputError(f"{path}:{number}: expected a JSON string or an object with a string 'prompt'")
        prompts.append(text)
    return prompts


def prompts_from_corpus(corpus: str, tok: ByteTokenizer | SubwordTokenizer, count: int, length: int, seed: int,
                        val_fraction: float) -> list[list[int]]:
    """`count` distinct spans of `length` tokens from the held-out documents of `corpus` (the same
    deterministic split `mtpc tiny-lm` and `mtpc train` use), each starting at a line start; a subword
    model's documents are its own tokenizer's ids, so `length` counts its tokens."""
    from ..training.data import load_documents, split_documents

    docs, _ = load_documents(None if corpus == "stdlib" else corpus, tok)
    _, held_out = split_documents(docs, val_fraction)
    line_ends = line_end_ids(tok)
    candidates = [(d, s) for d in held_out for s in _line_starts(d.tokens, length, line_ends)]
    if len(candidates) < count:
        raise InputError(f"the held-out part of {corpus} has only {len(candidates)} spans of {length} tokens; "
                         f"{count} prompts were asked for")
    rng = random.Random(seed)
    picked = rng.sample(candidates, count)
    return [d.tokens[s:s + length].astype("int64").tolist() for d, s in picked]


def line_end_ids(tok: ByteTokenizer | SubwordTokenizer) -> set[int]:
    """Ids after which a token starts a line's text: the newline byte, or a subword token whose text ends
    in a newline and perhaps the next line's indentation (a byte-level BPE merges `\\n` with the spaces)."""
    if isinstance(tok, SubwordTokenizer):
        specials = tok.special_ids()
        return {i for i in range(tok.vocab_size) if i not in specials
                and tok.decode([i]).rstrip(" \t").endswith("\n")}
    return {ord("\n")}


def _line_starts(tokens, length: int, line_ends: set[int], step: int = 512) -> list[int]:
    """Offsets (at most one per `step` tokens) where a span of `length` tokens starts a line."""
    starts, last = [], -step
    for i in range(len(tokens) - length):
        if (i == 0 or int(tokens[i - 1]) in line_ends) and i - last >= step:
            starts.append(i)
            last = i
    return starts



def repetition(prompt: list[int], continuation: list[int], size: int = 8) -> float:
    """The share of the continuation's `size`-grams (those ending inside it) that already occurred
    earlier in prompt + continuation: 0 for text that never repeats itself, near 1 for a degenerate
    loop. Anything that copies from the context (prompt lookup) is flattered by a high value."""
    text = list(prompt) + list(continuation)
    seen: set[tuple[int, ...]] = set()
    repeated = total = 0
    for end in range(size, len(text) + 1):
        gram = tuple(text[end - size:end])
        if end > len(prompt):
            total += 1
            repeated += gram in seen
        seen.add(gram)
    return repeated / total if total else 0.0
