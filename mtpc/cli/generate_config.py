"""`mtpc generate`'s settings (`GenerateConfig`); each field made with `mtpc.settings.setting` is also
the command's option. Importable without torch (the parser is built from it for `--help`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import (HELP_DECODING_DTYPE, MAX_THREADS, decoding_dtype_name, int_in, non_negative_float,
                      non_negative_int, positive_float, positive_int, probability)
from ..checks import MAX_CONTEXT, MAX_LOOKUP_TOKENS, tree_or_auto
from ..checks import seed as parse_seed
from ..sampling import Sampling
from ..settings import setting
from ..training.config import HELP_MODEL, HELP_REMOTE_CODE

__all__ = ["GenerateConfig", "DEFAULT_NEW_TOKENS", "MAX_LOOKUP"]

DEFAULT_NEW_TOKENS = 256
MAX_LOOKUP = MAX_LOOKUP_TOKENS  # tokens one prompt-lookup match may propose
MAX_WINDOW = 1024  # the widest verify width a flag may ask for (a head's n bounds it further)


@dataclass
class GenerateConfig:
    model: str = setting(help=HELP_MODEL)
    prompt: str | None = setting(None, flag="prompt", help="the prompt text (default: --prompt-file or stdin)")
    trust_remote_code: bool = setting(False, help=HELP_REMOTE_CODE)
    head: str | None = setting(None, help="a head folder written by mtpc train (default: plain decoding)")
    lora: str | None = setting(  # the draft path's adapter (default: HEAD/lora when the head has one)
        None, help="the draft path's LoRA adapter folder (default: HEAD/lora if any)")
    lora_layers: int | None = setting(  # checked against the adapter's layers when given
        None, type=non_negative_int, help="the adapter's layer count (checked)")
    prompt_file: str | None = setting(None, help="read the prompt from this file")
    max_new_tokens: int | None = setting(  # None: DEFAULT_NEW_TOKENS, fewer when the context has less room
        None, type=positive_int,
        help=f"tokens to generate at most (bytes for a byte-level model; default: {DEFAULT_NEW_TOKENS}, fewer when the "
             "model's context has less room)")
    temperature: float = setting(0.0, type=non_negative_float, help="0: greedy; above 0: sample")
    top_k: int | None = setting(None, type=positive_int, help="sample from the k most likely tokens")
    top_p: float | None = setting(None, type=probability, help="sample from the nucleus of this mass")
    seed: int = setting(0, type=parse_seed, help="random seed for sampling")
    chat: bool = setting(False, help="render the prompt as a user turn with the chat template")
    stream: bool = setting(True, help="print as cycles commit (default) or all at the end")
    stats: bool = setting(False, help="tokens (and bytes) per cycle, tok/s and the per-cycle breakdown (stderr)")
    compare: bool = setting(
        False, help="also decode plainly: speed-up and whether greedy outputs are identical (stderr)")
    # the commands all pick CUDA when there is one; the library does as its command does
    device: str = setting("auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:1, ...")
    dtype: str = setting("auto", type=decoding_dtype_name, help=HELP_DECODING_DTYPE)
    threads: int | None = setting(None, type=int_in(1, MAX_THREADS), help="torch CPU threads (default: torch's choice)")
    lookup: int | None = setting(  # prompt-lookup drafting inside the speculative decoder (tokens per match)
        None, type=int_in(1, MAX_LOOKUP), metavar="K",
        help="with --head: also draft n-gram continuations of the prompt and the text so far (K tokens a match "
             "proposes), chosen per cycle by past acceptance; still lossless")
    window: int | None = setting(  # verify width of the circuit window, 2 .. the head's n (None: n)
        None, type=int_in(2, MAX_WINDOW), metavar="K",
        help="with --head: verify K tokens per cycle (x_0 and K-1 drafted ones), 2 .. the head's n (default: n)")
    tree: int | str | None = setting(  # None: a chain (decoding.drafts.trees: the circuit chooses the tree)
        None, type=tree_or_auto, metavar="N",
        help="with --head: verify a tree of N drafted tokens per cycle (x_0 included), chosen by the circuit's "
             "exact prefix probabilities, instead of one chain (with --lookup K, a match is a branch of K more); "
             "'auto': the tree with the most tokens per unit of cost by the head's recorded per-depth "
             "acceptance and this machine's verify costs, measured at start (printed); still lossless")
    draft_temperature: float | None = setting(  # None: the decoder's default, the target's temperature
        None, type=positive_float, metavar="T",
        help="with --head and --temperature > 0: the temperature the circuit drafts at (default: --temperature, "
             "as the verifier samples); any value stays lossless")
    pace: bool = setting(  # decoding.pace: speculative cycles measured against a plain step, one prompt at a time
        True, help="with --head: hand the rest of a generation to plain decoding when its latest cycles measure "
                   "fewer tokens a second than a plain step measured at start (one prompt; --no-pace: never)")
    compile: bool = setting(  # torch.compile the speculative decoder's cycle step (compiled in the warm-up)
        False, help="with --head: torch.compile each decoding cycle (the verify call as one graph, acceptance and "
                    "draft as another; static caches, one pair per verify width; compiled before the first cycle)")
    max_context: int | None = setting(  # None: the model's context, at most 8,192 (decoding.cycle.verify.context_reserve)
        None, type=int_in(1, MAX_CONTEXT), metavar="N",
        help="with --compile: positions the decoder's caches hold from the start (default: the model's context, "
             "at most 8,192), so no generation within them compiles again; a notice states what they take")
    prompts: str | None = setting(
        None, metavar="FILE",
        help="with --head: decode the prompts of FILE (one per line, or .jsonl: a string or {\"prompt\": ...} per "
             "line) as batches; one JSON line per prompt on stdout")
    batch_size: int | None = setting(
        None, type=positive_int, metavar="B", help="with --prompts: prompts per batch (default: all of them in one batch)")
    stdin: bytes | None = None  # the prompt read from standard input, when neither PROMPT nor --prompt-file

    def sampling(self) -> Sampling:
        """The tokens' `Sampling` (`--temperature 0`: greedy); a `ValueError` says what is wrong."""
        return Sampling(self.temperature, self.top_k, self.top_p)
