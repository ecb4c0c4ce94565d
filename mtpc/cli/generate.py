"""`mtpc generate`: text in, text out, with or without a draft head.

    mtpc generate --model DIR [--head DIR] [--lora DIR --lora-layers k] [PROMPT | --prompt-file F | stdin]
                  [--max-new-tokens N] [--temperature T --top-k K --top-p P] [--seed S] [--chat]
                  [--stream/--no-stream] [--stats] [--compare]
    mtpc generate --model DIR --head DIR --prompts FILE [--batch-size B] [...]

The prompt is taken as bytes (a file or stdin exactly as stored) after a `<bos>`, as `mtpc tiny-lm`
saw its documents (a pretrained subword model's prompt: what its own tokenizer makes of the text, as
transformers' `generate` would get it; `TokenStreamer` writes their text); `--chat` renders it as one user turn with the model's chat
template (the tokenizer files in the model folder) and stops at the end of the assistant's turn.
Temperature 0 (the default) decodes greedily; above 0 it samples the shaped target exactly.

Output is written as cycles commit it (`Utf8Streamer`: incremental UTF-8, so a character split across
cycles is printed once, whole, and invalid bytes as U+FFFD). `--stats` and `--compare` report on
stderr, so stdout holds only the text: bytes per cycle, tok/s (prefill excluded) and the per-cycle
breakdown measured inside the decoding loop with `mtpc.decoding.clock`; `--compare` decodes the same
prompt plainly too and reports the speed-up and whether the greedy outputs are identical.

`--prompts FILE` (one prompt per line, or `.jsonl`: a JSON string or an object with a "prompt" per line)
decodes the prompts as left-padded batches of `--batch-size` (default: all of them) with the
speculative decoder (`SpeculativeDecoder.generate(ids [B, T], attention_mask=...)`) and writes one JSON
line per prompt, in order, to stdout: `{"prompt": ..., "text": ...}`; `--stats` reports each batch.

Everything the user gave is checked before a model is loaded (`InputError`).
"""

from __future__ import annotations

import codecs
import json
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TextIO

import torch

from ..lm import loading, lora
from ..lm.backbone import SplitBackbone
from ..checks import MAX_THREADS, ROUNDING_DTYPES, ROUNDING_NOTE, check_sampling_settings, tree_and_window
from ..errors import InputError, MtpcError
from ..files import regular_file
from ..sampling import Sampling
from ..lm.tokenizer import NUM_BYTES, ByteTokenizer, SubwordTokenizer, to_bytes
from .generate_choice import HeadPlan, plan_head, resolved_dtype
from .generate_config import DEFAULT_NEW_TOKENS, MAX_LOOKUP, GenerateConfig

__all__ = ["GenerateConfig", "Utf8Streamer", "TokenStreamer", "run_generate", "load_prompt"]

MAX_PROMPT_BYTES = 64 * 2**20
MAX_BATCH = 4096  # prompts in one batch (--batch-size); the decoder also refuses a batch the memory cannot hold
PACE_PROMPT = 512  # the longest random prompt a plain step is measured after (a step's cost grows slowly with it)


class Utf8Streamer:
    """A transformers `BaseStreamer` (`put`/`end`) that writes the bytes of the tokens after the prompt
    to a text stream as they come: incremental UTF-8 decoding holds back an incomplete character until
    its last byte arrives; invalid bytes become U+FFFD; special tokens are not printed."""

    def __init__(self, out: TextIO, skip_prompt: bool = True):
        self.out = out
        self._skip = skip_prompt
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def put(self, value: torch.Tensor) -> None:
        if self._skip:  # transformers puts the prompt first
            self._skip = False
            return
        data = bytes(i for i in value.flatten().tolist() if 0 <= i < NUM_BYTES)
        self.out.write(self._utf8.decode(data))
        self.out.flush()

    def end(self) -> None:
        self.out.write(self._utf8.decode(b"", final=True) + "\n")
        self.out.flush()


class TokenStreamer:
    """The same for a subword tokenizer: the text of all tokens so far is decoded again at each put and
    the new part written, except a trailing U+FFFD (a character whose bytes span tokens still to come)."""

    def __init__(self, out: TextIO, tok: SubwordTokenizer, skip_prompt: bool = True):
        self.out, self.tok = out, tok
        self._skip = skip_prompt
        self._ids: list[int] = []
        self._written = 0  # characters of the decoded text already written

    def put(self, value: torch.Tensor) -> None:
        if self._skip:
            self._skip = False
            return
        self._ids += value.flatten().tolist()
        self._write(self.tok.decode(self._ids).rstrip("\ufffd"))

    def end(self) -> None:
        self._write(self.tok.decode(self._ids))
        self.out.write("\n")
        self.out.flush()

    def _write(self, text: str) -> None:
        if len(text) > self._written:
            self.out.write(text[self._written:])
            self.out.flush()
            self._written = len(text)


# --------------------------------------------------------------------------- checks (before slow work)

def check_config(cfg: GenerateConfig) -> None:
    if cfg.max_new_tokens is not None and cfg.max_new_tokens < 1:
        raise InputError(f"--max-new-tokens must be >= 1, got {cfg.max_new_tokens}")
    check_sampling_settings(cfg)  # the one check of temperature, top-k, top-p and the draft temperature
    if cfg.temperature == 0 and (cfg.top_k is not None or cfg.top_p is not None):
        raise InputError("--top-k/--top-p shape sampling: give a --temperature above 0 too")
    if cfg.head is None and (cfg.lora or cfg.lora_layers):
        raise InputError("--lora/--lora-layers belong to a draft head's path: give --head too")
    if cfg.lora_layers is not None and cfg.lora_layers < 1:
        raise InputError(f"--lora-layers must be >= 1, got {cfg.lora_layers}")
    if cfg.lookup is not None and cfg.head is None:
        raise InputError("--lookup drafts inside the speculative decoder: give --head too")
    if cfg.lookup is not None and (isinstance(cfg.lookup, bool) or not isinstance(cfg.lookup, int) or cfg.lookup < 1):
        raise InputError(f"--lookup must be a positive integer (tokens a match proposes), got {cfg.lookup!r}")
    if cfg.compile and cfg.head is None:
        raise InputError("--compile compiles the speculative decoder's cycle steps: give --head too")
    if cfg.max_context is not None and not cfg.compile:
        raise InputError("--max-context sets the room a compiled decoder's caches hold: give --compile too")
    if cfg.window is not None and cfg.head is None:
        raise InputError("--window is the draft head's verify width: give --head too")
    if cfg.window is not None and (isinstance(cfg.window, bool) or not isinstance(cfg.window, int) or cfg.window < 2):
        raise InputError(f"--window must be an integer >= 2 (x_0 and at least one drafted token), got {cfg.window!r}")
    if cfg.tree is not None and cfg.head is None:
        raise InputError("--tree is the draft head's tree of drafts: give --head too")
    tree_and_window((cfg.tree,), (cfg.window,))  # the rule mtpc bench applies to its lists
    if cfg.compare and cfg.head is None:
        raise InputError("--compare compares a draft head with plain decoding: give --head")
    if cfg.draft_temperature is not None and (cfg.head is None or cfg.temperature == 0):
        raise InputError("--draft-temperature is the temperature a draft head samples at: give --head and a "
                         "--temperature above 0")
    if cfg.threads is not None and not 1 <= cfg.threads <= MAX_THREADS:
        raise InputError(f"--threads must be in 1..{MAX_THREADS} (4 per CPU core), got {cfg.threads}")
    if cfg.lookup is not None and cfg.lookup > MAX_LOOKUP:
        raise InputError(f"--lookup must be at most {MAX_LOOKUP} tokens a match proposes, got {cfg.lookup}")
    if not (isinstance(cfg.seed, int) and 0 <= cfg.seed < 2**63):
        raise InputError(f"--seed must be an integer in 0..2**63-1, got {cfg.seed!r}")
    check_batch_config(cfg)


def check_batch_config(cfg: GenerateConfig) -> None:
    if cfg.batch_size is not None and cfg.prompts is None:
        raise InputError("--batch-size splits the prompts of --prompts FILE into batches: give --prompts too")
    if cfg.batch_size is not None and not (isinstance(cfg.batch_size, int) and 1 <= cfg.batch_size <= MAX_BATCH):
        raise InputError(f"--batch-size must be an integer in 1..{MAX_BATCH}, got {cfg.batch_size!r}")
    if cfg.prompts is None:
        return
    if cfg.prompt is not None or cfg.prompt_file is not None:
        raise InputError("give the prompts either with --prompts FILE or as one prompt (argument, --prompt-file), "
                         "not both")
    if cfg.head is None:
        raise InputError("--prompts decodes its prompts in batches with the speculative decoder: give --head too")
    if cfg.compare:
        raise InputError("--compare measures one prompt against plain decoding; it does not take --prompts")


def model_config(path: str) -> dict:
    """The model folder's checked config.json (`mtpc.lm.loading.model_config`), or InputError."""
    return loading.model_config(path)  # a missing folder: `loading.readable_folder`'s MissingFolderError


def check_context(n_prompt: int, cfg: GenerateConfig, config: dict) -> None:
    """Prompt + new tokens must fit the positions the model has (refused before loading it); an unset
    --max-new-tokens becomes `DEFAULT_NEW_TOKENS` or the room left, whichever is smaller."""
    context = config.get("max_position_embeddings")
    room = context - n_prompt if context else None
    asked = cfg.max_new_tokens or DEFAULT_NEW_TOKENS
    if cfg.max_new_tokens is None:
        cfg.max_new_tokens = DEFAULT_NEW_TOKENS if room is None else max(1, min(DEFAULT_NEW_TOKENS, room))
    if room is not None and cfg.max_new_tokens > room:
        fix = f"lower --max-new-tokens to {room} or less" if room >= 1 else "shorten the prompt"
        raise InputError(f"{n_prompt} prompt + {asked} new tokens exceed the {context} positions the model has "
                         f"({fix})")


def load_prompt(cfg: GenerateConfig) -> bytes:
    """The prompt's bytes: PROMPT (UTF-8; undecodable command-line bytes come back as they were),
    --prompt-file (its bytes), or standard input."""
    given = [x is not None for x in (cfg.prompt, cfg.prompt_file)]
    if all(given):
        raise InputError("give the prompt either as an argument or with --prompt-file, not both")
    if cfg.prompt is not None:
        return to_bytes(cfg.prompt)
    if cfg.prompt_file is not None:
        path = Path(cfg.prompt_file)
        if not path.exists():
            raise InputError(f"--prompt-file {cfg.prompt_file}: no such file")
        return regular_file(path, "--prompt-file", MAX_PROMPT_BYTES).read_bytes()
    if cfg.stdin is not None:
        return cfg.stdin
    raise InputError("no prompt: give it as an argument, with --prompt-file F, or on standard input")


def load_prompts(path: str) -> list[bytes]:
    """The prompts of a --prompts file, as `mtpc bench --prompts` reads them (`.jsonl`: a JSON string or
    an object with a "prompt" string per line; otherwise one prompt per non-empty line)."""
    from ..bench.prompts import prompt_texts

    file = Path(path)
    if not file.exists():
        raise InputError(f"--prompts {path}: no such file")
    prompts = [to_bytes(text) for text in prompt_texts(regular_file(file, "--prompts", MAX_PROMPT_BYTES))]
    if not prompts:
        raise InputError(f"--prompts {path}: no prompts (the file has no non-empty line)")
    return prompts


def prompt_ids(cfg: GenerateConfig, text: bytes, tok: ByteTokenizer | SubwordTokenizer) -> tuple[list[int], set[int]]:
    """Token ids of the prompt and the ids that end the answer (`--chat`: `mtpc.lm.chat`, the template
    rendered bounded and the prompt kept as text: bytes, or a subword model's own tokens of it, never a
    special id). A subword model's prompt is `encode_prompt`'s: its own tokenizer's ids under its own
    special-token rule; with `--chat` its own chat template, and the answer ends at any special token."""
    if not cfg.chat:
        return tok.encode_prompt(text), {tok.eos_id}
    from ..lm.chat import chat_ids

    folder = loading.model_folder(cfg.model)  # a GGUF file's converted folder holds its chat template
    if isinstance(tok, SubwordTokenizer):  # its own template; the answer ends at any special token
        return chat_ids(folder, [{"role": "user", "content": text}], tok), tok.special_ids()
    if not (folder / "tokenizer.json").exists():
        raise InputError(f"--chat needs the model's chat template, but {cfg.model} has no tokenizer.json (written by "
                         f"mtpc tiny-lm since it saves the tokenizer); add it with: python -c \"from mtpc.lm.tokenizer "
                         f"import save_hf_tokenizer; save_hf_tokenizer('{cfg.model}')\"")
    ids = chat_ids(folder, [{"role": "user", "content": text}], tok)
    return ids, {tok.eos_id, tok.end_of_turn_id}


def check_head_fits(head, config: dict, head_dir: str) -> None:
    """A head drafts for one model: its hidden size and its states must match the model's."""
    hidden = config.get("hidden_size")
    if hidden is not None and head.hidden_size != hidden:
        raise InputError(f"--head {head_dir} was trained for hidden size {head.hidden_size}; the model's is {hidden}")
    if head.max_token_id >= config["vocab_size"]:
        raise InputError(f"--head {head_dir} drafts token ids up to {head.max_token_id}; the model's vocabulary has "
                         f"only {config['vocab_size']}")


def check_tree_fits(tree: int, head, head_dir: str) -> None:
    """A tree budget the head can fill (`mtpc.decoding.drafts.trees.tree_budget`'s rule), before any model loads."""
    from ..decoding.drafts.trees import tree_budget

    try:
        tree_budget(tree, head.num_variables, head.num_states)
    except ValueError as e:
        raise InputError(f"--tree {tree} with --head {head_dir}: {e}") from None


def _head_plan(cfg: GenerateConfig, base, head, depth_topk: dict | None, dtype, device, dtype_note: str | None,
               err: TextIO) -> HeadPlan:
    """How the head decodes: `--tree auto`'s tree; with --prompts (batches) the flags as given; else
    `generate_choice.plan_head`'s measured choice (or its warning about a forced one)."""
    if cfg.tree == "auto":
        return HeadPlan(False, cfg.window, auto_tree_budget(base, head, depth_topk, err))
    if cfg.prompts is not None:
        return HeadPlan(False, cfg.window, cfg.tree)
    return plan_head(base, head, depth_topk, cfg.window, cfg.tree, cfg.lookup, dtype, device, dtype_note, err)


def auto_tree_budget(model, head, depth_topk: dict, err: TextIO):
    """`--tree auto`: the tree of most tokens per unit of cycle cost from the head's recorded per-depth
    acceptance and this model's verify costs measured now (`mtpc.decoding.choice.auto_trees`, as `mtpc bench`
    chooses it); said in one line. None (a chain) when no tree of the head's recorded k beats plain decoding."""
    from ..decoding.choice.auto_trees import choose_auto_tree, verify_costs

    choice = choose_auto_tree(depth_topk, verify_costs(model, "decode chains (no --tree)"), head.num_variables,
                              head.num_states)
    err.write(choice.line() + "\n")
    return choice.budget


def check_context_room(cfg: GenerateConfig, config: dict, k: int, device) -> None:
    """--max-context by the decoders' own rules (`mtpc.decoding.cycle.verify`), before the model loads: at most the
    model's context (`check_max_context`), and caches holding it, in the verifier's layers and the draft
    path's `k`, that fit in the device's available memory (`check_reserve`; the refusal states the bytes)."""
    from types import SimpleNamespace

    from ..decoding.cycle.verify import check_max_context, check_reserve

    if cfg.max_context is None:
        return
    try:
        check_max_context(cfg.max_context, config.get("max_position_embeddings"), "--max-context")
        if isinstance(config.get("num_hidden_layers"), int) and isinstance(config.get("hidden_size"), int):
            element = loading.torch_dtype(cfg.dtype).itemsize
            check_reserve(SimpleNamespace(**config), config["num_hidden_layers"] + k, cfg.max_context, element, device,
                          "--max-context")
    except ValueError as e:
        raise InputError(str(e)) from None


def lora_folder(cfg: GenerateConfig) -> Path | None:
    """The draft path's adapter folder: --lora, else HEAD/lora when `mtpc train` saved one there."""
    if cfg.lora is not None:
        return lora.lora_folder(cfg.lora)
    return lora.head_lora_folder(cfg.head)


# --------------------------------------------------------------------------- the run

def run_generate(cfg: GenerateConfig, out: TextIO | None = None, err: TextIO | None = None) -> dict:
    """Decode `cfg`'s prompt; writes the text to `out` (default stdout) and stats/comparison to `err`
    (default stderr); returns a summary with the prompt and generated ids and, when measured, the stats
    and the comparison."""
    from ..heads import load_head

    out, err = out or sys.stdout, err or sys.stderr
    check_config(cfg)
    config = model_config(cfg.model)
    tok = _model_tokenizer(cfg, config)
    if cfg.prompts is not None:
        texts = load_prompts(cfg.prompts)
        rows = [prompt_ids(cfg, text, tok) for text in texts]
        ids, eos = max((r[0] for r in rows), key=len), rows[0][1]
    else:
        texts, rows = None, None
        ids, eos = prompt_ids(cfg, load_prompt(cfg), tok)
    check_context(len(ids), cfg, config)
    head = depth_topk = None
    if cfg.head is not None:
        head = load_head(cfg.head)
        check_head_fits(head, config, cfg.head)
        if cfg.window is not None and cfg.window > max(head.num_variables, 2):
            raise InputError(f"--window {cfg.window}: the head {cfg.head} verifies windows of 2 to "
                             f"{max(head.num_variables, 2)} tokens")
        if cfg.tree == "auto":
            from ..decoding.choice.auto_trees import recorded_acceptance

            depth_topk = recorded_acceptance(cfg.head, cfg.head)  # checked before the model loads
        else:
            if cfg.tree is not None:
                check_tree_fits(cfg.tree, head, cfg.head)
            depth_topk = loading.head_depth_topk(cfg.head)  # checked before the model loads; None: not recorded
    adapter = lora_folder(cfg) if head is not None else None
    k = lora.adapter_layers(adapter, cfg.lora_layers) if adapter is not None else 0
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)

    device = loading.resolve_device(cfg.device)
    resolved, dtype_note = resolved_dtype(cfg.dtype, device, loading.stored_dtype(cfg.model, config))
    cfg = replace(cfg, dtype=resolved)
    check_context_room(cfg, config, k, device)
    sampling = cfg.sampling()
    with _quiet_loading():  # stderr is for the stats; the text goes to stdout
        dtype = loading.torch_dtype(cfg.dtype)
        base = loading.load_model(cfg.model, dtype, device, trust_remote_code=cfg.trust_remote_code)
        decode, fallback = _plain(base, sampling, eos), None
        if head is not None:
            head = head.to(device).eval()
            plan = _head_plan(cfg, base, head, depth_topk, dtype, device, dtype_note, err)
            if plan.plain:  # plain decoding is expected to be faster here: the head is left out
                head = None
                decode = _plain(base, sampling, eos, compile=cfg.compile, max_context=cfg.max_context)
            else:
                paced = cfg.pace and rows is None and not SplitBackbone(base).whole_model
                fallback = _fallback(cfg, base, min(len(ids), PACE_PROMPT)) if paced else None
                decode, decoder = _speculative(cfg.model, head, adapter, k, device, sampling, eos, cfg.lookup,
                                               plan.window, cfg.compile, cfg.trust_remote_code,
                                               cfg.draft_temperature, dtype, cfg.max_context, plan.tree, fallback)
    prompt = torch.tensor([ids], dtype=torch.long, device=device)
    check_logits(base, prompt)
    if rows is not None:
        return _run_batches(decode, decoder, texts, [r[0] for r in rows], eos, tok, cfg, device, out, err)
    streamer = None if not cfg.stream else Utf8Streamer(out) if isinstance(tok, ByteTokenizer) else \
        TokenStreamer(out, tok)
    run = _measure(decode, prompt, cfg, streamer, _warm_up(cfg, speculative=head is not None))
    new = run["sequence"][len(ids):]
    if not cfg.stream:
        out.write(tok.decode(new) + "\n")
        out.flush()
    summary = {"prompt_ids": ids, "new_tokens": new, "text": tok.decode(new), "stats": run}
    if run.get("handover"):
        err.write(format_handover(run["handover"]) + "\n")
    if cfg.stats:
        err.write(format_stats("speculative" if head is not None else "plain", run, tok) + "\n")
    if cfg.compare:
        # compiled decoding is compared with plain decoding compiled the same way (static cache, one graph)
        # when auto chose plain decoding, the same decoder again (a second decoder's first run pays its warm-up)
        baseline = decode if head is None else _plain(base, sampling, eos, compile=cfg.compile,
                                                      max_context=cfg.max_context,
                                                      decoder=fallback[0] if fallback else None)
        plain = _measure(baseline, prompt, cfg, None, _warm_up(cfg, speculative=False))
        summary["plain"] = plain
        summary["compare"] = comparison(run, plain, greedy=cfg.sampling().greedy,
                                        baseline="static cache, compiled" if cfg.compile else "eager",
                                        rounding=cfg.dtype in ROUNDING_DTYPES)
        if cfg.stats:
            err.write(format_stats("plain", plain, tok) + "\n")
        err.write(format_comparison(summary["compare"], torch.get_num_threads()) + "\n")
    err.flush()
    return summary


def _run_batches(decode, decoder, texts: list[bytes], rows: list[list[int]], eos: set[int], tok,
                 cfg: GenerateConfig, device, out: TextIO, err: TextIO) -> dict:
    """Decode the prompts of --prompts in left-padded batches of --batch-size (each checked by the decoder
    before anything is allocated for it); one JSON line per prompt, in order."""
    size = cfg.batch_size or len(rows)
    summary = {"prompts": [], "texts": [], "batches": []}
    for first in range(0, len(rows), size):
        batch = rows[first:first + size]
        ids, mask = left_padded(batch, tok.pad_id, device)
        try:
            decoder.check_batch(len(batch), ids.shape[1], cfg.max_new_tokens, device)
        except ValueError as e:
            raise InputError(f"--batch-size {len(batch)}: {e}") from None
        run = _measure(decode, ids, cfg, None, speculative_warm_up(cfg), attention_mask=mask)
        for text, row, sequence in zip(texts[first:first + size], batch, run["sequences"]):
            new = row_tokens(sequence[ids.shape[1]:], eos)
            line = {"prompt": text.decode("utf-8", errors="replace"), "text": tok.decode(new)}
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
            summary["prompts"].append(row)
            summary["texts"].append(line["text"])
        out.flush()
        summary["batches"].append(run)
        if cfg.stats:
            err.write(format_stats(f"speculative, batch of {len(batch)}", run, tok) + "\n")
    err.flush()
    return summary


def row_tokens(tail: list[int], eos: set[int]) -> list[int]:
    """A batch row's new tokens: up to and with its first EOS (the padding after it dropped), else all."""
    end = next((i for i, t in enumerate(tail) if t in eos), None)
    return tail if end is None else tail[:end + 1]


def left_padded(rows: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """`[B, T]` ids of the rows padded on the left with `pad`, and their attention mask."""
    T = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (T - len(r)) + r for r in rows], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (T - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device)
    return ids, mask


@contextmanager
def _quiet_loading():
    """transformers' weight-loading progress bar off while loading (restored afterwards)."""
    from transformers.utils import logging

    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()


def _model_tokenizer(cfg: GenerateConfig, config: dict) -> ByteTokenizer | SubwordTokenizer:
    """The model's byte tokenizer, or its own subword one when the vocabulary is not byte-level and the
    folder has one (`loading.model_tokenizer`); the folder is checked whole first (`model_info`: no
    custom code without `--trust-remote-code`)."""
    model = cfg.model
    info = loading.model_info(model, allow_non_byte_vocab=True, trust_remote_code=cfg.trust_remote_code)
    tok = loading.model_tokenizer(info, trust_remote_code=cfg.trust_remote_code)
    if tok.vocab_size > config["vocab_size"]:
        raise InputError(f"--model {model}: the tokenizer has {tok.vocab_size} ids, the model only "
                         f"{config['vocab_size']}")
    return tok


@torch.no_grad()
def check_logits(model, prompt: torch.Tensor) -> None:
    """The model's logits over the prompt are finite (NaN or inf weights would otherwise decode
    "successfully" in greedy mode and fail deep inside sampling)."""
    logits = model(prompt[:, -1:]).logits  # [1, 1, V]
    if not torch.isfinite(logits).all():
        raise MtpcError("the model's logits are not finite (NaN or inf); its weights are damaged")


def _plain(base, sampling: Sampling, eos: set[int], compile: bool = False, max_context: int | None = None,
           decoder=None):
    """`(ids, budget, generator, streamer) -> (GenerateOutput, PhaseClock)` for plain decoding (`compile`: its
    step compiled as the speculative cycle is, preallocated caches: what a compiled decoder is measured
    against; the phase clock then has no hooks, which a compiled step would trace); `decoder`: a
    `PlainDecoder` made so already (the paced decoder's fallback), else a new one."""
    from ..decoding import PhaseClock, backbone_marks

    decoder = decoder or _plain_decoder(base, compile, max_context)
    embed, ends = backbone_marks(base) if not compile else (None, [])

    def decode(ids, budget, generator, streamer):
        clock = PhaseClock(None, embed, ends, cuda=ids.device.type == "cuda")
        with clock:
            out = decoder.generate(ids, budget, sampling, eos_token_id=eos, generator=generator, streamer=streamer)
        return out, clock

    return decode


def _plain_decoder(base, compile: bool, max_context: int | None):
    from ..decoding import PlainDecoder

    try:  # its checks of memory, after the model took its share (the flags were checked before loading)
        return PlainDecoder(base, compile=compile, max_context=max_context)
    except ValueError as e:
        raise InputError(str(e)) from None


def _fallback(cfg: GenerateConfig, base, prompt_length: int):
    """`--pace`: the plain decoder a paced generation hands over to (compiled as the speculative decoder is) and
    its `PaceCheck`, from a plain step measured now after a prompt of the prompt's length (said only by a
    hand-over's line)."""
    from ..decoding.pace import measured_pace

    decoder = _plain_decoder(base, cfg.compile, cfg.max_context)
    pace = measured_pace(decoder, prompt_length)
    return decoder, pace


def _speculative(model_path: str, head, adapter: Path | None, k: int, device, sampling: Sampling, eos: set[int],
                 lookup: int | None = None, window: int | None = None, compile: bool = False,
                 trust_remote_code: bool = False, draft_temperature: float | None = None, dtype=None,
                 max_context: int | None = None, tree: int | None = None, fallback=None):
    """The same for a SpeculativeDecoder (its own model copy when a LoRA adapter wraps it), and the decoder;
    its `decode` also takes a batch's `attention_mask`. `compile`: its cycle step through torch.compile;
    the decoder then stamps its steps (no hooks in a compiled call). `fallback`: a `PlainDecoder` and a
    `PaceCheck`: one prompt decodes paced (`generate_paced`), handing over to it when it falls behind."""
    from ..decoding import PhaseClock, SpeculativeDecoder
    from ..decoding.pace import generate_paced

    model = loading.load_model(model_path, dtype or torch.float32, device, trust_remote_code=trust_remote_code)
    if head.parameterisation == "tied":  # its input units are this model's own output layer
        head.tie_to(model.get_output_embeddings())
    if adapter is not None:
        model = lora.load_lora(model, adapter)
    try:  # its checks of memory, after the model took its share (the flags were checked before loading)
        decoder = SpeculativeDecoder(model, head, k, lookup=lookup, window=window, compile=compile,
                                     draft_temperature=draft_temperature, max_context=max_context, tree=tree)
    except ValueError as e:
        raise InputError(str(e)) from None
    parts = decoder.backbone.parts

    def decode(ids, budget, generator, streamer, attention_mask=None):
        cuda = ids.device.type == "cuda"
        if compile:  # no hooks inside compiled steps (the head runs in the draft's graph): the decoder stamps
            clock = PhaseClock(None, None, [], cuda=cuda)
            extra = {"phase_clock": clock}
        else:
            clock, extra = PhaseClock(decoder.head, parts.embed, [parts.norm, parts.lm_head], cuda=cuda), {}
        with clock:
            if fallback is not None and attention_mask is None and ids.shape[0] == 1:
                out = generate_paced(decoder, fallback[0], ids, budget, sampling, pace=fallback[1],
                                     eos_token_id=eos, generator=generator, streamer=streamer, **extra)
            else:
                out = decoder.generate(ids, budget, sampling, eos_token_id=eos, generator=generator,
                                       streamer=streamer, attention_mask=attention_mask, **extra)
        return out, clock

    return decode, decoder


def speculative_warm_up(cfg: GenerateConfig) -> int:
    """Tokens of the untimed generation before a speculative decoder's timed one. Compiled: none, because
    the decoder compiles its step before its first cycle, on the caches of the generation it is in (a
    shorter warm-up would allocate smaller caches, and the timed run would compile again for its own)."""
    return 0 if cfg.compile else 4


def _warm_up(cfg: GenerateConfig, speculative: bool) -> int:
    """The untimed tokens before a timed generation: with --compare as many as the timed run decodes, so both
    runs meet every shape warm (on a CPU the first step at each new cache length pays for its kernels: a plain
    decoder's first 64-token run read 0.94x its second); else a few (`speculative_warm_up`)."""
    if speculative and cfg.compile:
        return speculative_warm_up(cfg)
    return cfg.max_new_tokens if cfg.compare else speculative_warm_up(cfg) if speculative else 4


def _measure(decode, prompt: torch.Tensor, cfg: GenerateConfig, streamer, warm: int = 4, **batch) -> dict:
    """One generation, after an untimed warm-up of `warm` tokens (0: none), with its stats and per-cycle
    breakdown. `batch`: a batch's `attention_mask` (its rows are in "sequences")."""
    from ..decoding import split_phases

    if warm:
        decode(prompt, min(warm, cfg.max_new_tokens), torch.Generator(prompt.device).manual_seed(cfg.seed), None,
               **batch)
    out, clock = decode(prompt, cfg.max_new_tokens, torch.Generator(prompt.device).manual_seed(cfg.seed), streamer,
                        **batch)
    phases, _ = split_phases(clock.times())
    stats = out.stats
    return {**stats.as_dict(), "decode_seconds": sum(stats.cycle_seconds),
            "phase_ms_per_cycle": {k: 1e3 * v / max(stats.cycles, 1) for k, v in phases.items()},
            "sequence": out.sequences[0].tolist(), **({"sequences": out.sequences.tolist()} if batch else {})}


def comparison(spec: dict, plain: dict, greedy: bool, baseline: str = "eager", rounding: bool = False) -> dict:
    """`rounding`: a dtype whose verify calls round differently from one-position steps (bf16): a greedy
    difference is then said to be rounding, and is no failure."""
    speedup = spec["tokens_per_second"] / plain["tokens_per_second"] if plain["tokens_per_second"] else None
    identical = spec["sequence"] == plain["sequence"] if greedy else None
    return {"speculative_tok_s": spec["tokens_per_second"], "plain_tok_s": plain["tokens_per_second"],
            "speedup": speedup, "greedy_identical": identical, "baseline": baseline,
            "rounding_note": ROUNDING_NOTE if rounding and identical is False else None}


def format_stats(label: str, run: dict, tok: ByteTokenizer | SubwordTokenizer | None = None) -> str:
    """One stats line; a subword model's counts are tokens, with the bytes they spell (one prompt's run)."""
    phases = "  ".join(f"{k} {v:.2f}" for k, v in run["phase_ms_per_cycle"].items())
    lookup = f", {run['lookup_cycles']} drafted by lookup" if run.get("lookup_cycles") else ""
    if isinstance(tok, SubwordTokenizer):
        count = f"{run['new_tokens']} tokens"
        per_cycle = f"{run['mean_accepted']:.2f} tokens/cycle"
        if "sequences" not in run:  # one row: the bytes its new tokens spell
            lengths = tok.byte_lengths()
            spelled = sum(lengths[t] for t in run["sequence"][len(run["sequence"]) - run["new_tokens"]:])
            count += f" ({spelled} bytes)"
            per_cycle += f", {spelled / max(run['cycles'], 1):.2f} bytes/cycle"
    else:
        count, per_cycle = f"{run['new_tokens']} bytes", f"{run['mean_accepted']:.2f} bytes/cycle"
    return (f"[{label}] {count} in {run['cycles']} cycles{lookup} ({per_cycle}), "
            f"{run['tokens_per_second']:.1f} tok/s, {1e3 * run['mean_cycle_latency']:.2f} ms/cycle "
            f"(prefill {1e3 * run['prefill_seconds']:.1f} ms{compiling(run)} excluded); per cycle, ms: {phases}")


def format_handover(handover: dict) -> str:
    """The line of a paced generation's hand-over to plain decoding."""
    return (f"mtpc: pace: handed over to plain decoding after {handover['tokens']} tokens: the head's cycles ran "
            f"{handover['speculative_tok_s']:.1f} tok/s, plain steps {handover['plain_tok_s']:.1f} tok/s "
            f"(taking over its caches took {handover['seconds'] * 1e3:.0f} ms)")


def compiling(run: dict) -> str:
    """", compiling 3.2 s" when the run compiled its decoding step, else nothing."""
    seconds = run.get("compile_seconds", 0.0)
    return f", compiling {seconds:.1f} s" if seconds else ""


def format_comparison(c: dict, threads: int) -> str:
    if c["greedy_identical"] is None:
        verdict = "sampling: outputs are not expected to match"
    else:
        verdict = "greedy outputs identical: " + ("yes" if c["greedy_identical"] else "NO") + \
            (f" ({c['rounding_note']})" if c.get("rounding_note") else "")
    plain = "plain" if c.get("baseline", "eager") == "eager" else f"plain ({c['baseline']})"
    return (f"speculative {c['speculative_tok_s']:.1f} tok/s vs {plain} {c['plain_tok_s']:.1f} tok/s: "
            f"{c['speedup']:.2f}x speed-up ({threads} torch thread{'' if threads == 1 else 's'}); {verdict}")
