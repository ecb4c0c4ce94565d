"""`mtpc distill-data`: the LM's own continuations of training prompts, as head-training data.

    mtpc distill-data --model DIR [--data SRC] --out FILE.jsonl [--num-prompts N] [--prompt-len L]
                      [--max-new-tokens M] [--temperature T] [--top-p P] [--greedy-fraction G]
                      [--seed S] [--head DIR] [--chat] [--no-progress]

A head trained on corpus text learns what the *text* does next; a draft is accepted when it matches
what the *LM* does next (sequence-level self-distillation). This command writes one record per prompt:

    {"index": i, "prompt": ..., "completion": ..., "mode": "greedy" | "sample", "stop": "eos" | "special" | "length"}

- Prompts are `L`-byte spans (a byte LM) starting at a line start, drawn from the *training* documents of `SRC`
  (the deterministic document split of `mtpc tiny-lm` / `mtpc train` / `mtpc bench --corpus`, with the
  same default fraction), never from the held-out ones the benchmarks prompt with.
- The LM sees `<bos> prompt` (exactly what `mtpc train` will feed it for this record) and continues
  it for up to `M` tokens, stopping at its first special token (`<eos>` or any other: the record keeps
  only what the LM wrote as bytes, never a special dropped from the middle). A share `G` of the
  records is greedy, the rest sampled at temperature `T` (and top-p `P`).
- `mtpc train --data FILE.jsonl` reads the records as `<bos> prompt completion <eos>` with the prompt
  masked out of the loss (`mtpc.training.data.completion_document`).
- Bytes: `prompt` and `completion` are the exact bytes decoded as UTF-8 with Python's
  `surrogateescape` (an invalid byte 0x80..0xFF becomes the lone surrogate U+DC80..U+DCFF, which JSON
  writes as `\\udc80`..`\\udcff`); `mtpc.lm.tokenizer.to_bytes` gives back the bytes exactly.
- Deterministic: record `i`'s prompt, mode and sampling generator are seeded from `(seed, i)` only,
  so the file does not depend on `--num-prompts`, on batching, or on being resumed.
- Resumable: rerunning the same command appends the missing records; a partial last line (a killed
  run) is cut off first. The settings are kept next to the file (`FILE.jsonl.meta.json`); a rerun with
  different settings is refused instead of mixing two kinds of records.
- A subword LM (its own tokenizer, `mtpc.lm.loading.model_tokenizer`): `L` is in tokens, the first `L` of
  the text from a line start; the record also holds `prompt_ids` and `completion_ids`, the LM's own
  tokens, and `prompt`/`completion` are their text. The ids are what `mtpc train` reads: decoding is
  exact (a byte-level BPE spells every byte), but a sampled token sequence need not be the one its text
  encodes to (the LM may write `de` `f` where the tokenizer writes `def`), and invalid UTF-8 decodes to
  U+FFFD, so re-tokenizing the text would train on other tokens than the LM wrote. The training reader
  checks that the ids spell the text under the model's tokenizer.
- `--chat` (a subword LM with a chat template): each prompt is an instruction about a training document,
  written from its module name and docstrings (`mtpc.training.instructions`), rendered as one user turn
  by the model's own template exactly as `mtpc generate --chat` renders one; the completion is the LM's
  answer, up to its end-of-turn token. The record says `"chat": true`, and `mtpc train` reads it as the
  rendered turn, answer, `<eos>` (no `<bos>` of its own: the template writes the first token). Prompts
  of different lengths decode together, left-padded.
- With `--head DIR` (a folder from `mtpc train`, its LoRA adapter included) the continuations come
  from `SpeculativeDecoder`: greedy records are the same as plain greedy decoding's, sampled ones are
  exact draws from the same distribution (but not the same draws as without the head).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from pathlib import Path

import numpy as np
import torch

from ..lm import loading
from ..errors import InputError, MtpcError, first_line
from ..files import OutputLock, atomic_write, read_json
from ..sampling import GREEDY, Sampling
from .config import DistillConfig

META_SUFFIX = ".meta.json"
NEWLINE = ord("\n")
SPAN_BYTES_PER_TOKEN = 32  # a subword prompt of L tokens is cut from the first 32 L bytes of its line on
PROMPT_TRIES = 64  # line starts drawn for a subword prompt before giving up


def distill_data(cfg: DistillConfig) -> dict:
    """Write (or complete) `cfg.out`; returns a summary of the whole file and of this run. One run at a
    time writes a file: a second one on the same --out is refused while the first holds its lock."""
    _check_config(cfg)
    out = Path(cfg.out)
    with OutputLock(out.parent, f"--out {cfg.out}", name=f".{out.name}.lock"):
        try:
            return _distill(cfg)
        except OSError as e:  # a full disk: the records written so far stay, a rerun completes the file
            raise MtpcError(f"writing {cfg.out} failed: {e.strerror or first_line(e)}; the complete records "
                            "written so far are kept (rerun the same command to finish)") from e


def _distill(cfg: DistillConfig) -> dict:
    from .progress import progress_bar

    tok = model_tokenizer(cfg)
    prompts = TrainingPrompts(cfg.data, tok, cfg.prompt_len, cfg.val_fraction)  # also validates --data
    if cfg.chat:
        prompts = ChatPrompts(prompts, cfg, tok)
    out = Path(cfg.out)
    done = _resume(out, run_settings(cfg, prompts))
    summary = {"records": max(done, cfg.num_prompts), "new_records": 0, "new_bytes": 0, "seconds": 0.0}
    if done >= cfg.num_prompts:
        return summary
    generate = _generator(cfg, tok)

    bar = progress_bar(cfg.num_prompts, "record", cfg.progress, "mtpc distill-data")
    bar.update(done)
    start = time.perf_counter()
    tokens = cycles_total = 0
    batch = 1 if cfg.head is not None else cfg.batch_size
    with out.open("ab") as f:
        for first in range(done, cfg.num_prompts, batch):
            indices = range(first, min(first + batch, cfg.num_prompts))
            for record, new_bytes, new_tokens, cycles in _records(indices, cfg, prompts, generate, tok):
                f.write(json.dumps(record).encode("ascii") + b"\n")
                summary["new_records"] += 1
                summary["new_bytes"] += new_bytes
                if cycles is not None:  # speculative: tokens committed per backbone call, over the run so far
                    tokens += new_tokens
                    cycles_total += cycles
                    summary["mean_accepted"] = round(tokens / max(cycles_total, 1), 3)
            f.flush()
            bar.update(len(indices))
            elapsed = time.perf_counter() - start
            bar.set_postfix_str(f"{summary['new_bytes'] / max(elapsed, 1e-9):,.0f} bytes/s"
                                + (f", accepted {summary['mean_accepted']:.2f}" if cycles is not None else ""))
        os.fsync(f.fileno())
    bar.close()
    summary["seconds"] = round(time.perf_counter() - start, 1)
    return summary


# ------------------------------------------------------------------ checks and resuming


def model_tokenizer(cfg: DistillConfig):
    """The model's byte tokenizer, or its own subword one (a tokenizer that cannot be read, or with more
    ids than the model's embedding, is one `InputError` before any record)."""
    info = loading.model_info(cfg.model, allow_non_byte_vocab=True, trust_remote_code=cfg.trust_remote_code)
    return loading.model_tokenizer(info, trust_remote_code=cfg.trust_remote_code)


def _check_config(cfg: DistillConfig) -> None:
    for name in ("num_prompts", "prompt_len", "max_new_tokens", "batch_size"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or value < 1:
            raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
    try:
        sampled = cfg.sampling()  # the one check of temperature and top-p
    except ValueError as e:
        raise InputError(f"--{e}") from None
    if sampled.greedy:
        raise InputError("--temperature must be > 0 (the sampled records' temperature; --greedy-fraction 1 "
                         "makes every record greedy)")
    if not 0 <= cfg.greedy_fraction <= 1:
        raise InputError(f"--greedy-fraction must be in [0, 1], got {cfg.greedy_fraction}")
    config = loading.model_config(cfg.model)  # a missing folder, or one without config.json, is named
    # the whole folder, before any record: custom code (auto_map) only with --trust-remote-code
    loading.model_info(cfg.model, allow_non_byte_vocab=True, trust_remote_code=cfg.trust_remote_code)
    context = config.get("max_position_embeddings")
    if cfg.chat:
        _check_chat(cfg)
    elif context is not None and 1 + cfg.prompt_len + cfg.max_new_tokens > context:
        raise InputError(f"<bos> + --prompt-len {cfg.prompt_len} + --max-new-tokens {cfg.max_new_tokens} exceeds "
                         f"the model's context of {context} tokens")
    if cfg.head is not None:
        loading.head_folder(cfg.head)
    out = Path(cfg.out)
    if out.is_dir():
        raise InputError(f"--out {cfg.out} is a folder; give a .jsonl file")
    if out.exists() and not out.is_file():  # /dev/full, a FIFO: nothing may be written beside it either
        raise InputError(f"--out {cfg.out} is not a regular file; give a .jsonl file")
    above = next((folder for folder in (out.parent, *out.parent.parents) if folder.exists()), None)
    if above is not None and not above.is_dir():  # a missing folder is made by OutputLock, as for train's OUT
        raise InputError(f"--out {cfg.out}: {above} is not a folder")


def _check_chat(cfg: DistillConfig) -> None:
    """--chat needs a subword model with a chat template (a byte record cannot hold the template's specials)."""
    from ..lm.chat import find_template

    tok = model_tokenizer(cfg)
    if tok.kind == "byte":
        raise InputError("--chat needs a model with its own subword tokenizer and chat template; this is a byte LM "
                         "(its chat data is mtpc tiny-lm's own format)")
    find_template(loading.model_folder(cfg.model))  # no template: one line naming the folder


def run_settings(cfg: DistillConfig, prompts: "TrainingPrompts") -> dict:
    """What the records depend on: the settings, and what the named paths hold (the model's weights, the
    head's files, the training text), so a rerun after any of them changed is refused, not appended to."""
    from ..files import file_sha256

    head = None if cfg.head is None else [file_sha256(Path(cfg.head) / name) for name in loading.HEAD_FILES]
    return {**cfg.settings(), "model_fingerprint": loading.model_fingerprint(cfg.model),
            "head_sha256": head, "data_sha256": prompts.fingerprint()}


def _resume(out: Path, settings: dict) -> int:
    """Records already in `out` (after cutting a partial last line); writes the settings file."""
    meta = Path(str(out) + META_SUFFIX)
    if out.exists() and out.stat().st_size > 0:
        if not meta.exists():
            raise InputError(f"{out} exists but was not written by mtpc distill-data (no {meta.name}); "
                             "choose another --out")
        previous = read_json(meta, "the settings of the run that wrote --out")
        changed = sorted(k for k in set(settings) | set(previous) if settings.get(k) != previous.get(k))
        if changed:
            raise InputError(f"{out} was written with other settings ({', '.join(changed)} differ); rerun with the "
                             "same settings to complete it, or choose another --out")
        return _complete_records(out)
    atomic_write(meta, json.dumps(settings, indent=1) + "\n")
    out.write_bytes(b"")
    return 0


def _complete_records(out: Path) -> int:
    """Count the records of `out`, checking they are 0, 1, 2, ...; a last line without its newline
    (or not valid JSON) is what a killed run leaves: it is cut off so the rerun rewrites it."""
    data = out.read_bytes()
    keep = data.rfind(b"\n") + 1  # everything after the last newline is a partial record
    lines = data[:keep].splitlines()
    if lines:
        try:
            json.loads(lines[-1])
        except ValueError:  # a torn write that happened to end in a newline byte
            keep -= len(lines[-1]) + 1
            lines = lines[:-1]
    for i, line in enumerate(lines):
        try:
            index = json.loads(line).get("index")
        except (ValueError, AttributeError):
            index = None
        if index != i:
            raise InputError(f"{out}:{i + 1}: not record {i} of an mtpc distill-data run; choose another --out")
    if keep < len(data):
        with out.open("r+b") as f:
            f.truncate(keep)
    return len(lines)


# ------------------------------------------------------------------ prompts


class TrainingPrompts:
    """Prompts of `length` tokens starting at line starts of the training documents of `source`: byte
    spans for a byte LM; for a subword LM the first `length` tokens of the text from a line start (its
    own tokenizer's spelling, as `mtpc train` reads the documents)."""

    def __init__(self, source: str | None, tok, length: int, val_fraction: float):
        from ..lm.tokenizer import ByteTokenizer, SubwordTokenizer
        from .data import load_documents, split_documents

        self.subword = tok if isinstance(tok, SubwordTokenizer) else None
        try:  # the documents as bytes: lines are found in bytes, whatever the tokenizer
            docs, _ = load_documents(None if source in (None, "stdlib") else source, ByteTokenizer())
        except (FileNotFoundError, ValueError) as e:
            raise InputError(f"--data: {e}") from None
        train, _ = split_documents(docs, val_fraction)
        self.docs, self.length = train, length
        doc_of, start_of = [], []
        for k, d in enumerate(train):
            starts = _line_starts(d.tokens, length)
            doc_of.append(np.full(len(starts), k, dtype=np.int64))
            start_of.append(starts)
        self.doc_of, self.start_of = np.concatenate(doc_of), np.concatenate(start_of)
        if len(self.doc_of) == 0:
            raise InputError(f"no training document of {source or 'stdlib'} has a line of {length} bytes "
                             "to prompt with; lower --prompt-len")

    def fingerprint(self) -> str:
        """The SHA-256 of the training documents' bytes, in order (what the prompts are cut from)."""
        digest = hashlib.sha256()
        for doc in self.docs:
            digest.update(f"{len(doc.tokens)}\n".encode())
            digest.update(np.asarray(doc.tokens, dtype="<i4").tobytes())
        return digest.hexdigest()

    def __getitem__(self, rng: random.Random) -> list[int]:
        """The prompt's token ids (without `<bos>`); the same `rng` state gives the same prompt."""
        if self.subword is None:
            return list(self._span(rng, self.length))
        for _ in range(PROMPT_TRIES):
            ids = self.subword.encode(self._span(rng, self.length * SPAN_BYTES_PER_TOKEN))[:self.length]
            if len(ids) == self.length:
                return ids
        raise InputError(f"no line of the training documents spells {self.length} tokens within "
                         f"{self.length * SPAN_BYTES_PER_TOKEN} bytes ({PROMPT_TRIES} tried); lower --prompt-len")

    def _span(self, rng: random.Random, size: int) -> bytes:
        """Up to `size` bytes from a random line start (at least `length` bytes, no special token, are there)."""
        c = rng.randrange(len(self.doc_of))
        tokens = self.docs[int(self.doc_of[c])].tokens
        s = int(self.start_of[c])
        span = tokens[s:s + size]  # [<= size]
        special = np.flatnonzero((span < 0) | (span >= 256))  # the document's <eos>, where the span reaches it
        return bytes(span[: special[0] if len(special) else len(span)].astype(np.uint8))


def _line_starts(tokens: np.ndarray, length: int) -> np.ndarray:
    """Offsets where `length` bytes (no special token) begin at the document's first byte or after a newline."""
    is_byte = (tokens >= 0) & (tokens < 256)
    first = np.flatnonzero(is_byte)[:1]
    after_newline = np.flatnonzero(tokens[:-1] == NEWLINE) + 1
    starts = np.unique(np.concatenate([first, after_newline]))
    ends = starts + length
    # a span qualifies when its `length` tokens exist and are all bytes
    run = np.concatenate([[0], np.cumsum(~is_byte)])  # specials before each offset
    ok = ends <= len(tokens)
    ok[ok] = run[ends[ok]] == run[starts[ok]]
    return starts[ok]


class ChatPrompts:
    """`--chat`: prompts that are instructions (`mtpc.training.instructions`) about the training documents of
    `prompts`, each rendered as one user turn with the model's chat template, exactly as `mtpc generate --chat`
    renders a prompt (no `<bos>` is added: the template writes its own)."""

    def __init__(self, prompts: TrainingPrompts, cfg: DistillConfig, tok):
        from .instructions import Instructions, document_bytes

        self.tok, self.max_new_tokens = tok, cfg.max_new_tokens
        self.folder = loading.model_folder(cfg.model)
        self.context = loading.model_config(cfg.model).get("max_position_embeddings")
        self.instructions = Instructions([(d.name, document_bytes(d.tokens)) for d in prompts.docs])
        self.fingerprint = prompts.fingerprint

    def __getitem__(self, rng: random.Random) -> list[int]:
        from ..lm.chat import chat_ids

        ids = chat_ids(self.folder, [{"role": "user", "content": self.instructions[rng]}], self.tok)
        if self.context is not None and len(ids) + self.max_new_tokens > self.context:
            raise InputError(f"a chat prompt of {len(ids)} tokens + --max-new-tokens {self.max_new_tokens} exceeds "
                             f"the model's context of {self.context} tokens")
        return ids


# ------------------------------------------------------------------ generation


def _record_seed(seed: int, index: int) -> int:
    return int.from_bytes(hashlib.sha256(f"mtpc-distill:{seed}:{index}".encode()).digest()[:8], "little") >> 1


def _records(indices, cfg: DistillConfig, prompts: TrainingPrompts, generate, tok
             ) -> list[tuple[dict, int, int, int | None]]:
    """Records `indices` (generated together), each with the numbers of bytes and tokens the LM wrote for
    it (the stopping special included) and the decoding cycles it took (None without a head)."""
    requests = []
    for i in indices:
        seed = _record_seed(cfg.seed, i)
        rng = random.Random(seed)
        prompt = prompts[rng]
        greedy = rng.random() < cfg.greedy_fraction
        requests.append((i, prompt, greedy, seed))
    lead = [] if cfg.chat else [tok.bos_id]  # a chat template writes its own first token
    outputs = generate([(lead + prompt, greedy, seed) for _, prompt, greedy, seed in requests])
    return [_record(i, prompt, greedy, new, cycles, tok, cfg.chat) for (i, prompt, greedy, _), (new, cycles)
            in zip(requests, outputs)]


def _record(i: int, prompt: list[int], greedy: bool, new: list[int], cycles: int | None, tok, chat: bool = False
            ) -> tuple[dict, int, int, int | None]:
    """Record `i` from the LM's new tokens: those up to the first special token (which names the stop)."""
    stop_set = set(stop_ids(tok))
    specials = [k for k, t in enumerate(new) if t in stop_set]
    cut = specials[0] if specials else len(new)
    stop = "length" if not specials else ("eos" if new[cut] == tok.eos_id else "special")
    tokens = cut + (stop != "length")
    mode = "greedy" if greedy else "sample"
    if tok.kind == "byte":
        completion = bytes(new[:cut])
        record = {"index": i, "prompt": _as_text(bytes(prompt)), "completion": _as_text(completion), "mode": mode,
                  "stop": stop}
        return record, len(completion), tokens, cycles
    # a subword LM: its own tokens are the record (their text need not encode back to them), the text beside
    completion = tok.decode(new[:cut])
    record = {"index": i, "prompt": tok.decode(prompt), "completion": completion, "prompt_ids": prompt,
              "completion_ids": new[:cut], "mode": mode, "stop": stop}
    if chat:  # the prompt ids are the whole rendered turn: `mtpc train` adds no <bos> before them
        record["chat"] = True
    return record, len(completion.encode("utf-8", errors="surrogateescape")), tokens, cycles


def stop_ids(tok) -> list[int]:
    """The ids that end a continuation: a byte LM's every non-byte id, a subword LM's special tokens."""
    if tok.kind == "byte":
        return [t for t in range(tok.vocab_size) if not tok.is_byte(t)]
    return sorted(tok.special_ids())


def _as_text(data: bytes) -> str:
    return data.decode("utf-8", errors="surrogateescape")


def _generator(cfg: DistillConfig, tok):
    """`generate([(ids, greedy, seed), ...]) -> [(new token ids, decoding cycles or None), ...]`: plain
    batched sampling, or one prompt at a time through the speculative decoder with `--head`."""
    from ..decoding import PlainDecoder, SpeculativeDecoder

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # checked first (no custom code without trust_remote_code, safetensors only, local files only)
    dtype = loading.torch_dtype(cfg.dtype)
    model = loading.load_model(cfg.model, dtype, device, trust_remote_code=cfg.trust_remote_code)
    stop = stop_ids(tok)
    sampled = cfg.sampling()
    if cfg.head is None:
        plain = PlainDecoder(model)
        return lambda requests: [(new, None) for new in plain_batch(plain, requests, cfg.max_new_tokens, sampled,
                                                                    stop, device)]

    from ..decoding.head_entry import load_head_entry

    try:
        entry = load_head_entry(cfg.head, model, cfg.model, dtype, None, device,
                                trust_remote_code=cfg.trust_remote_code)
        decoder = SpeculativeDecoder(entry.model, entry.head, entry.lora_layers)
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"--head {cfg.head}: {e}") from None
    def generate(requests):
        outputs = []
        for ids, greedy, seed in requests:
            generator = torch.Generator(device).manual_seed(seed)
            out = decoder.generate(torch.tensor([ids], device=device), cfg.max_new_tokens,
                                   GREEDY if greedy else sampled, eos_token_id=stop, generator=generator)
            outputs.append((out.sequences[0, len(ids):].tolist(), out.stats.cycles))
        return outputs
    return generate


def plain_batch(decoder, requests: list[tuple[list[int], bool, int]], max_new_tokens: int, sampled: Sampling,
                stop: list[int], device: torch.device) -> list[list[int]]:
    """Plain batched decoding (`mtpc.decoding.plain.PlainDecoder`; prompts of different lengths left-padded): the greedy
    requests together, the sampled ones together, each sampled row with its own generator (seeded by its
    request), so a record does not depend on which records share its batch (up to float rounding of
    batched matrix products). Rows stop at their first `stop` token. Returns each row's new tokens, the
    stop token included."""
    rows: list[list[int] | None] = [None] * len(requests)
    for greedy, sampling in ((True, GREEDY), (False, sampled)):
        chosen = [i for i, request in enumerate(requests) if request[1] == greedy]
        if not chosen:
            continue
        ids, mask = _left_padded([requests[i][0] for i in chosen], device)  # [B, L]: chat prompts differ in length
        generators = [torch.Generator(device).manual_seed(requests[i][2]) for i in chosen]
        out = decoder.generate(ids, max_new_tokens, sampling, attention_mask=mask, eos_token_id=stop,
                               generator=generators)
        for i, row in zip(chosen, out.sequences[:, ids.shape[1]:].tolist()):
            rows[i] = _until_stop(row, set(stop))
    return rows


def _left_padded(rows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`[B, L]` ids with the shorter rows padded on the left, and their mask (None when all are as long)."""
    width = max(len(row) for row in rows)
    if all(len(row) == width for row in rows):
        return torch.tensor(rows, dtype=torch.long, device=device), None
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    mask = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    for b, row in enumerate(rows):
        ids[b, width - len(row):] = torch.tensor(row, dtype=torch.long)
        mask[b, width - len(row):] = 1
    return ids, mask


def _until_stop(row: list[int], stop: set[int]) -> list[int]:
    cut = next((k for k, t in enumerate(row) if t in stop), None)
    return row if cut is None else row[:cut + 1]
