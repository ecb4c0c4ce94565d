"""mtpc: multi-token prediction with probabilistic circuits, and lossless self-speculative decoding."""

import importlib

# Public names and the submodule defining each. They are imported on first use: most of them need
# torch and transformers (seconds to import), which `mtpc --help` and input checks do not.
_EXPORTS = {
    "SpeculativeDecoder": "decode",
    "MTPHead": "head", "load_head": "head", "save_head": "head",
    "DataStats": "data", "Document": "data", "PackedDataset": "data", "load_documents": "data",
    "split_documents": "data",
    "mtp_loss": "loss", "teacher_forced_accepted": "loss",
    "TinyLMConfig": "tinylm", "train_tiny_lm": "tinylm",
    "ByteTokenizer": "tokenizer",
    "TrainConfig": "train", "train": "train",
    "InputError": "errors", "MtpcError": "errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mtpc' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # also rebinds `mtpc.train` from the submodule to the function, as before
    return value
