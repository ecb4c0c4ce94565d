"""mtpc: multi-token prediction with probabilistic circuits, and lossless self-speculative decoding.

The package follows its pipeline; imports run only downward (tests/test_layers.py checks it):

    errors, checks, settings, files,     ground floor: used by every stage
    sampling, hardware, lazy
    lm/          where a model comes from: folders, GGUF files, tokenizers, chat templates, LoRA, the backbone
    heads/       hidden state -> circuit parameters; the NLL and KL losses
    decoding/    windows, drafts, proposers, acceptance, the one speculative loop, the one plain decoder
    training/    data, mtpc train, mtpc tiny-lm, mtpc distill-data
    serving/     a head as vLLM's speculative proposer (vllm_options; vLLM imported only inside its engine)
    bench/       prompts, timed runs, peers, the report
    cli/         the mtpc command
"""

import importlib
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("circuitc")  # one distribution carries circuitc and mtpc
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

# Public names and the module defining each. They are imported on first use: most of them need
# torch and transformers (seconds to import), which `mtpc --help` and input checks do not.
_EXPORTS = {
    "SpeculativeDecoder": "decoding.cycle.decoder", "AdaptiveWidth": "decoding.cycle.decoder",
    "PlainDecoder": "decoding.plain", "Sampling": "sampling", "GREEDY": "sampling",
    "MTPHead": "heads.head", "load_head": "heads.head", "save_head": "heads.head",
    "DataStats": "training.data", "Document": "training.data", "PackedDataset": "training.data",
    "load_documents": "training.data", "split_documents": "training.data",
    "mtp_loss": "heads.nll_loss", "teacher_forced_accepted": "heads.nll_loss", "kl_loss": "heads.kl_loss",
    "TinyLMConfig": "training.config", "train_tiny_lm": "training.tiny_lm",
    "ByteTokenizer": "lm.tokenizer",
    "TrainConfig": "training.config", "train": "training.trainer",
    "InputError": "errors", "MtpcError": "errors",
    "vllm_options": "serving.options",
}
__all__ = sorted(_EXPORTS) + ["__version__"]


def __dir__() -> list[str]:
    # The lazy names are not in globals() until first use, so the default dir() (and with it help(),
    # tab completion) would not show them; the module's own dunders stay, its helper imports do not.
    return sorted(set(__all__) | {name for name in globals() if name.startswith("__")})


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mtpc' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
