"""The settings of the training commands: `TrainConfig` (`mtpc train`), `TinyLMConfig` (`mtpc tiny-lm`)
and `DistillConfig` (`mtpc distill-data`). Each field made with `mtpc.settings.setting` is also the
command's option (flag, type, default and help written once, here); the plain fields are Python-API
settings. Importable without torch: the command line builds its parsers from these classes.

Changing a field's name or default changes what a checkpoint's resume check compares
(`trainer_checkpoints.settings`, `tiny_lm_checkpoints.resume_key`): existing runs would start over.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ..checks import (HELP_DTYPE, MAX_THREADS, dtype_name, int_in, non_negative_float, non_negative_int,
                      parse_defines, positive_float, positive_int, probability, unit_interval)
from ..checks import seed as parse_seed
from ..heads.constants import DEFAULT_ADAPTER_RANK, DEFAULT_CHUNK_ELEMENTS, DEFAULT_FACTOR_RANK, PARAMETERISATIONS
from ..lm.loading import MAX_HIDDEN
from ..sampling import Sampling
from ..settings import setting

__all__ = ["TrainConfig", "TinyLMConfig", "DistillConfig", "FeaturesConfig", "LOSSES", "PRECISIONS", "JOINT_PARAMETERISATIONS"]

LOSSES = ("nll", "kl", "nll+kl", "tv")
PRECISIONS = ("auto", "fp32", "bf16")  # autocast dtypes (auto: bf16 where the hardware runs it natively)
# tiny-lm's joint head copies the fresh LM's unembedding rows; a tied head would read the output layer itself
JOINT_PARAMETERISATIONS = tuple(p for p in PARAMETERISATIONS if p != "tied")
# mtpc features --max-tokens: a quadrillion tokens, far past any corpus (a bf16 store of d = 576: an exabyte)
MAX_FEATURE_TOKENS = 10**15

# help texts of options that several commands share (generate and bench use them too)
HELP_MODEL = ("local Hugging Face checkpoint folder (e.g. from mtpc tiny-lm), or a GGUF file (dequantized once "
              "by transformers, kept in mtpc's cache)")
HELP_REMOTE_CODE = "allow a model folder whose config names its own modelling code (auto_map): runs that code"
HELP_DATA = "file, folder, glob or .jsonl (default: the Python stdlib)"
HELP_PRECISION = "autocast dtype (auto: bf16 where the hardware has it)"
HELP_DEVICE = "auto (CUDA when available), cpu, cuda, cuda:N"
HELP_RESUME = "start over even if OUT/checkpoint.pt exists"
HELP_STOP_AFTER = "leave at this step with a checkpoint (resume later)"
HELP_PROGRESS = "no progress bar"


@dataclass
class TrainConfig:
    model: str = setting(help=HELP_MODEL)
    out: str = setting(help="output folder: the head, checkpoint, config and log")
    trust_remote_code: bool = setting(False, help=HELP_REMOTE_CODE)
    allow_non_byte_vocab: bool = setting(  # accept a model whose vocabulary is not bytes
        False, help="train any head on a model whose vocabulary is not byte-level, token ids 0..255 taken as bytes "
                    "(a tied head needs no flag: it reads the model's own tokenizer)")
    circuit: str | None = setting(None, help=".pc or graph-spec .json file (optional with --init-head)")
    bindings: dict = setting(factory=dict, flag="-D", metavar="K=V", repeat=True, parse=parse_defines,
                             help="bind a .pc parameter, e.g. -D n=16 -D r=32 (repeatable)")
    data: str | None = setting(None, help=HELP_DATA)  # None: the Python standard library sources
    features: str | None = setting(  # mtpc features' shards: the LM is not run while training
        None, metavar="DIR",
        help="train from the LM's cached final hidden states in DIR (written by mtpc features for this --model) "
             "instead of running the LM on --data: same loss, far faster; the sequences are the ones DIR holds "
             "(with --lora-layers K, a store made with --draft-layers K: only the last K layers run)")
    draft_vocab: int | None = setting(  # mtpc.training.vocabulary; None: state s = token id s
        None, type=positive_int, metavar="K",
        help="draft over the K tokens the LM most often outputs on the training text (with --features; else the "
             "text's most frequent tokens): the circuit's states are those tokens (the .pc's `v` is bound to K "
             "unless -D v= is given), every leaf costs K/V of a full unembedding, and decoding stays exact")
    lora_layers: int = setting(0, type=non_negative_int, help="LoRA adapters on the last k decoder layers")
    lora_rank: int = setting(8, type=positive_int, help="LoRA rank")
    init_head: str | None = setting(  # a trained head's folder to continue from
        None, help="continue from a trained head folder (two-stage schedule)")
    parameterisation: str = setting(  # see mtpc.heads.head; tied suits any vocabulary
        "full", choices=PARAMETERISATIONS,
        help="head weights: full (the paper's n*r*v*d), shared (per-position unembedding + low-rank per-unit "
             "adapters), factorised (low-rank unembedding + adapters), tied (the LM's own output layer, not "
             "copied, behind low-rank per-unit adapters in hidden space: subword LMs)")
    first_token: bool = setting(  # see MTPHead.read_first_token; an init head's own choice is kept
        False, help="the head also reads the window's first token x_0 (an embedding added to its input, zero at the "
                    "start: an --init-head head starts from its own distributions); x_0 is the verifier's, known "
                    "before the draft")
    first_token_mlp: int = setting(  # see MTPHead.read_first_token(mlp)
        0, type=int_in(0, MAX_HIDDEN),
        help="with a width m > 0 the head also reads x_0 through a residual MLP of width m over its input plus "
             "x_0's embedding (zero at the start, like the embedding; implies --first-token)")
    adapter_rank: int = setting(DEFAULT_ADAPTER_RANK, type=positive_int,
                                help="shared/factorised/tied: per-unit adapter rank")
    factor_rank: int = setting(DEFAULT_FACTOR_RANK, type=positive_int, help="factorised: unembedding rank")
    steps: int | None = setting(None, type=positive_int, exclusive="budget", help="optimizer steps")
    minutes: float | None = setting(  # steps re-sized after every step
        None, type=positive_float, exclusive="budget",
        help="wall-clock budget (a step count, re-sized after every step from the mean step time)")
    seq_len: int = setting(512, type=positive_int, help="tokens per training sequence")
    batch_size: int = setting(8, type=positive_int, help="sequences per step over all ranks")
    grad_accum: int = setting(1, type=positive_int, help="micro-batches per step")
    lr: float = setting(2e-3, type=positive_float, help="peak learning rate of the head")
    lora_lr: float = setting(2e-4, type=positive_float, help="peak learning rate of the LoRA adapters")
    gamma: float = setting(0.9, type=probability, help="discount of window position j: gamma**(j-1)")
    loss: str = setting(  # see mtpc.training.trainer
        "nll", choices=LOSSES,
        help="nll: likelihood of the gold tokens; kl: KL from the frozen LM's own next-token distributions to the "
             "head's conditionals (self-distillation); nll+kl: their sum; tv: total variation between the same "
             "two (1 - sum min(p, q): one minus the rate at which sampling keeps a drafted token)")
    window_stride: int = setting(  # shifting with the step
        1, type=positive_int, help="score the windows at every s-th position only (s x cheaper head)")
    val_every: int = setting(50, type=positive_int, help="validate every this many steps")
    val_sequences: int = setting(8, type=positive_int, help="held-out sequences scored at each validation")
    val_windows: int = setting(1024, type=positive_int, help="of their windows, how many score acceptance")
    save_every: int = setting(50, type=positive_int, help="write OUT/checkpoint.pt every this many steps")
    precision: str = setting("auto", choices=PRECISIONS, help=HELP_PRECISION)
    dtype: str = setting("fp32", type=dtype_name, help=HELP_DTYPE)
    device: str = setting("auto", help=HELP_DEVICE)
    seed: int = setting(0, type=parse_seed, help="random seed (head init, data order)")
    resume: bool = setting(True, flag="--no-resume", help=HELP_RESUME)
    stop_after: int | None = setting(None, type=positive_int, help=HELP_STOP_AFTER)  # pre-emptible jobs, tests
    progress: bool = setting(True, flag="--no-progress", help=HELP_PROGRESS)
    lora_alpha: float = 16.0
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    sum_init_std: float = 0.02
    val_fraction: float = 0.02
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS


MTP_GROUP = ("MTP-aware pretraining", "train a circuit draft head jointly with the LM (loss = next-byte CE + weight "
             "x windowed MTP loss, gradients into the LM); the head is saved in OUT/mtp_head (mtpc.load_head, mtpc "
             "train --init-head)")


@dataclass
class TinyLMConfig:
    out: str = setting(help="output folder (save_pretrained layout)")
    data: str | None = setting(None, help=HELP_DATA)  # None: the Python standard library sources
    minutes: float = setting(10.0, type=positive_float, help="wall-clock training budget")
    steps: int | None = setting(None, type=positive_int, help="train a fixed number of steps instead")
    context: int = setting(1024, type=positive_int, help="sequence length in tokens (bytes for a byte LM)")
    # the reference shape (models/README.md): d = 192 beat d = 256 at equal wall-clock time on a CPU
    d_model: int = setting(192, type=positive_int, help="hidden size (models/byte-lm's shape)")
    layers: int = setting(4, type=positive_int, help="decoder layers")
    heads: int = setting(4, type=positive_int, help="attention heads (must divide --d-model)")
    ffn: int = setting(512, type=positive_int, help="MLP intermediate size")
    vocab_size: int | None = setting(  # None: 256 bytes + the tokenizer's specials
        None, type=positive_int,
        help="pad the vocabulary (e.g. 320; at least 256 bytes + 8 specials; a subword LM: at least its tokenizer's)")
    # a subword LM: its tokenizer read from a folder, or a byte-level BPE trained on the training documents
    tokenizer: str | None = setting(  # None: bytes (or --bpe-vocab)
        None, metavar="DIR", help="a Hugging Face tokenizer folder (tokenizer.json, ...): train a subword LM on its "
                                  "tokens (saved with the model) instead of bytes")
    bpe_vocab: int | None = setting(  # None: bytes (or --tokenizer); see mtpc.training.bpe
        None, type=positive_int, metavar="N",
        help="train a byte-level BPE of N tokens (mtpc's 8 specials included) on the training documents first and "
             "train a subword LM on it (saved with the model)")
    batch_size: int = setting(  # small: a 10-minute CPU budget is step-limited
        4, type=positive_int, help="sequences per step")
    lr: float = setting(2e-3, type=positive_float, help="peak learning rate")
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    val_fraction: float = 0.02
    val_tokens: int = 65536  # per periodic evaluation
    final_val_tokens: int = 1 << 18
    eval_every_s: float = 120.0
    precision: str = setting("auto", choices=PRECISIONS, help=HELP_PRECISION)
    device: str = setting("auto", help=HELP_DEVICE)
    seed: int = setting(0, type=parse_seed, help="random seed")
    save_every: int = setting(  # rerunning the command resumes from OUT/checkpoint.pt
        100, type=positive_int, help="steps between checkpoints (OUT/checkpoint.pt)")
    resume: bool = setting(True, flag="--no-resume", help=HELP_RESUME)
    stop_after: int | None = setting(None, type=positive_int, help=HELP_STOP_AFTER)  # pre-emptible jobs, tests
    progress: bool = setting(True, flag="--no-progress", help=HELP_PROGRESS)
    # MTP-aware pretraining: a circuit head trained jointly, loss = CE + mtp_weight * Eq. 5 loss
    mtp_circuit: str | None = setting(  # None: next-byte loss only
        None, metavar="FILE.pc", group=MTP_GROUP, help="the head's circuit structure")
    mtp_bindings: dict = setting(
        factory=dict, flag="-D", metavar="K=V", repeat=True, parse=parse_defines, group=MTP_GROUP,
        help="bind a .pc parameter of --mtp-circuit, e.g. -D n=8 (repeatable)")
    mtp_weight: float = setting(  # normalised by sum_j gamma^(j-1)
        0.1, type=non_negative_float, group=MTP_GROUP,
        help="weight of the MTP loss, a gamma-weighted average over window positions")
    mtp_parameterisation: str = setting("full", choices=JOINT_PARAMETERISATIONS, group=MTP_GROUP,
                                        help="head weights (see mtpc train --parameterisation)")
    mtp_window_stride: int = setting(  # shifting with the step
        1, type=positive_int, group=MTP_GROUP, help="score the windows at every s-th position only")
    mtp_gamma: float = setting(0.9, type=probability, group=MTP_GROUP,
                               help="discount of window position j: gamma**(j-1)")
    mtp_sum_init_std: float = 0.02


@dataclass
class DistillConfig:
    model: str = setting(help=HELP_MODEL)
    out: str = setting(help="the .jsonl file to write (or complete)")
    data: str | None = setting(  # None or "stdlib": the Python standard library sources
        None, help="file, folder, glob or .jsonl to draw prompts from (default: the Python stdlib, mtpc tiny-lm's "
                   "corpus)")
    num_prompts: int = setting(1024, type=positive_int, help="records in the file")
    prompt_len: int = setting(64, type=positive_int, help="tokens per prompt (bytes for a byte LM)")
    max_new_tokens: int = setting(448, type=positive_int, help="longest continuation")
    temperature: float = setting(1.0, type=positive_float, help="sampled records' temperature")
    top_p: float | None = setting(None, type=probability, help="sampled records' nucleus (default: none)")
    greedy_fraction: float = setting(  # on-policy by default: every record sampled at the decoding temperature
        0.0, type=unit_interval,
        help="share of greedy records (0: all sampled at --temperature, on-policy for sampling heads)")
    batch_size: int = setting(  # plain batched sampling (without --head)
        16, type=positive_int, help="records sampled together (plain batched decoding; --head decodes one at a time)")
    seed: int = setting(0, type=parse_seed, help="random seed (prompts, sampling)")
    head: str | None = setting(None, help="a head folder from mtpc train: decode speculatively (faster)")
    dtype: str = setting("fp32", type=dtype_name, help=HELP_DTYPE)
    trust_remote_code: bool = setting(False, help=HELP_REMOTE_CODE)
    progress: bool = setting(True, flag="--no-progress", help=HELP_PROGRESS)
    chat: bool = setting(  # mtpc.training.instructions; --prompt-len does not apply
        False, help="prompts are instructions written from the training documents' module names and docstrings, "
                    "rendered as a user turn with the model's chat template; the records are its answers")
    val_fraction: float = 0.02  # the held-out share of documents (mtpc tiny-lm / train / bench default)

    def settings(self) -> dict:
        """What the records depend on (not how many there are, nor the progress bar)."""
        keep = asdict(self)
        for key in ("num_prompts", "progress", "out", "batch_size", "trust_remote_code"):
            keep.pop(key)
        if not self.chat:  # files written before --chat existed have no such key, and still resume
            keep.pop("chat")
        else:
            keep.pop("prompt_len")
        keep["model"] = str(Path(self.model).resolve())
        keep["head"] = str(Path(self.head).resolve()) if self.head else None
        return keep

    def sampling(self) -> Sampling:
        """How the sampled records are drawn (the greedy ones: `GREEDY`)."""
        return Sampling(self.temperature, None, self.top_p)


@dataclass
class FeaturesConfig:
    model: str = setting(help=HELP_MODEL)
    out: str = setting(help="the folder of feature shards to write (or complete)")
    data: str | None = setting(None, help=HELP_DATA)  # None: the Python standard library sources
    seq_len: int = setting(512, type=positive_int, help="tokens per sequence (mtpc train --seq-len must match)")
    max_tokens: int | None = setting(  # None: every training sequence of --data
        None, type=int_in(1, MAX_FEATURE_TOKENS),
        help="stop after this many training tokens (default: all of --data)")
    val_sequences: int = setting(64, type=positive_int, help="held-out sequences cached for validation")
    shard_sequences: int = setting(  # a shard is written whole, then recorded: a kill loses at most one
        64, type=int_in(1, 1 << 16), help="sequences per shard file (a killed run redoes at most one shard)")
    batch_size: int = setting(4, type=positive_int, help="sequences per LM forward")
    draft_layers: int = setting(  # 0: the final hidden states only; mtpc.training.features, "inner"
        0, type=non_negative_int, metavar="K",
        help="also store the input of the LM's last K decoder layers, so that mtpc train --features --lora-layers K "
             "trains a LoRA draft path without running the first layers (K x d more values a token on disk)")
    dtype: str = setting("fp32", type=dtype_name, help=HELP_DTYPE + "; the features are stored in it")
    device: str = setting("auto", help=HELP_DEVICE)
    threads: int | None = setting(None, type=int_in(1, MAX_THREADS), help="torch CPU threads (default: torch's choice)")
    trust_remote_code: bool = setting(False, help=HELP_REMOTE_CODE)
    progress: bool = setting(True, flag="--no-progress", help=HELP_PROGRESS)
    val_fraction: float = 0.02  # the held-out share of documents, as mtpc train splits them
