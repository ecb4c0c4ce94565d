"""Stage: lm. Where a model comes from and how its layers are called: model and head folders checked before
anything loads, GGUF files walked and converted, tokenizers and chat templates, LoRA adapters, and the
backbone that runs one model as a verifier path and a draft path.

Takes: paths the user names (a model folder or GGUF file, a head folder, a LoRA adapter); hands on: a
checked folder, a model in eval mode, a tokenizer, and a `SplitBackbone` over the model.
Modules: `loading` (model and head folders, dtypes, devices), `lora` (adapter folders; every peft load and
attach), `tokenizer` (byte and subword tokenizers behind one surface), `chat` (a chat template rendered in a
sandbox), `gguf_format` (a GGUF file walked with bounded work), `gguf_files` (a GGUF converted once into a
checkpoint folder), `gguf_export` (`mtpc export-hf`), `families` (how each model family's layers are called),
`backbone` (the verifier/draft split of one model).
Imported lazily (`from mtpc.lm import SplitBackbone`): most modules pull in torch or transformers, which the
command line's input checks do not need.
"""

from ..lazy import lazy_getattr

_EXPORTS = {
    "SplitBackbone": "backbone", "BackboneState": "backbone", "BackboneOutput": "backbone",
    "BackboneFamily": "families", "LlamaFamily": "families", "family_for": "families",
    "attach_draft_lora": "lora", "load_lora": "lora",
    "load_model": "loading", "model_info": "loading", "ModelInfo": "loading",
    "ByteTokenizer": "tokenizer", "SubwordTokenizer": "tokenizer",
}
__all__ = list(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
