"""Builders shared by the trainer tests: a tiny byte-level Llama saved as `mtpc tiny-lm` saves one,
and a corpus of slices of this repository's own source."""

import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def save_tiny_lm(path, sharpen: float = 1.0) -> str:
    """A 2-layer d=32 LM (seed 0) with the byte tokenizer. `sharpen` scales the output layer: a
    confident LM has no float near-ties between greedy choices and a peaky teacher for the KL loss."""
    from mtpc.training.tiny_lm import TinyLMConfig, build_model
    from mtpc.lm.tokenizer import ByteTokenizer

    torch.manual_seed(0)
    tok = ByteTokenizer()
    model = build_model(TinyLMConfig(out="", context=64, d_model=32, layers=2, heads=2, ffn=64), tok)
    if sharpen != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(sharpen)
    model.save_pretrained(path)
    tok.save(path)
    return str(path)


def save_subword_llama(path, tokenizer, vocab_size: int, context: int) -> str:
    """A random 2-layer d=32 Llama (seed 0) of `vocab_size` tokens beside `tokenizer` (a transformers
    tokenizer, saved with it), its output layer sharpened: a decided LM, no float near-ties between
    greedy choices. A model folder without mtpc_tokenizer.json, as a subword checkpoint has none."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(8)
    model.save_pretrained(path)
    return str(path)


def write_source_corpus(path, parts: int = 12, length: int = 900, overlap: int = 400) -> str:
    """`parts` files, each `length + overlap` characters of mtpc/training/data.py starting `length` apart."""
    text = (ROOT / "mtpc" / "training" / "data.py").read_text()
    for i in range(parts):
        (Path(path) / f"part{i}.py").write_text(text[i * length:(i + 1) * length + overlap])
    return str(path)


# every family the backbone is tested on: model_type -> (config class, its size arguments)
FAMILY_CONFIGS = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {"sliding_window": 5}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 8}),
    "gemma2": ("Gemma2Config", {"head_dim": 8, "sliding_window": 5}),
    "gemma3_text": ("Gemma3TextConfig", {"head_dim": 8, "sliding_window": 5, "sliding_window_pattern": 2}),
    "phi3": ("Phi3Config", {}),
    "olmo2": ("Olmo2Config", {}),
    "gpt_neox": ("GPTNeoXConfig", {"num_key_value_heads": None}),
    "gpt2": ("GPT2Config", {}),
}


def family_config(model_type: str, vocab: int, hidden: int = 32, layers: int = 3, **overrides):
    """A small random-initialisable config of a real transformers family (no special token ids, so
    any vocabulary size works)."""
    import transformers

    cls_name, extra = FAMILY_CONFIGS[model_type]
    cls = getattr(transformers, cls_name)
    if model_type == "gpt2":
        args = dict(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=4, n_positions=256)
    else:
        args = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    args.update(extra)
    args = {k: v for k, v in args.items() if v is not None}
    args.update({"bos_token_id": None, "eos_token_id": None, "pad_token_id": None, **overrides})
    return cls(**args)


def family_lm(model_type: str, vocab: int = 40, seed: int = 0, dtype=torch.float64, **config):
    """A random-initialised causal LM of `model_type`, in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(family_config(model_type, vocab, **config)).to(dtype).eval()


def save_family_lm(path, model_type: str, layers: int = 2) -> str:
    """A byte-level (ByteTokenizer vocabulary) random LM of `model_type` saved as a model folder."""
    from mtpc.lm.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    model = family_lm(model_type, tok.vocab_size, dtype=torch.float32, layers=layers,
                      bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    model.save_pretrained(path)
    tok.save(path)
    return str(path)


def random_lora(model, k, seed=1):
    """`model` with draft-path LoRA on its last `k` layers whose B matrices are random (peft starts them
    at zero), so the adapters really change the draft path's outputs."""
    from mtpc.lm.lora import attach_draft_lora

    peft_model = attach_draft_lora(model, k, rank=4)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    return peft_model.eval()


def planted_remote_model(tmp_path) -> tuple[str, Path]:
    """A byte-level model folder whose config names its own modelling code; the code writes a marker
    file the moment it is imported. Returns (folder, marker)."""
    folder = Path(tmp_path) / "remote"
    save_family_lm(folder, "llama")
    marker = Path(tmp_path) / "the_code_ran"
    (folder / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder), marker
