"""A tiny Llama with a tiny byte-level BPE written as a GGUF file, as llama.cpp's converter lays one
out (the `gguf` package's own writer; F32 tensors, Q and K rows permuted to llama.cpp's rotary
order), so transformers' GGUF loader reads it back without any 93 MB download."""

from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent


def tiny_bpe(vocab_size: int = 600):  # above 512: a smaller vocabulary without mtpc_tokenizer.json reads as bytes
    from mtpc.training.bpe import train_bpe

    text = (ROOT / "mtpc" / "training" / "data.py").read_text()
    return train_bpe([text[i:i + 2000] for i in range(0, len(text), 2000)], vocab_size)


def tiny_llama(tokenizer, seed: int = 0, context: int = 128, hidden: int = 32, heads: int = 4):
    """A random 2-layer Llama (d = 32, 4 heads) over the tokenizer's vocabulary, tied embeddings, output sharpened
    (no near-ties between greedy choices) and its final norm negated (a random tied LM otherwise repeats
    its last token, a poor test of decoding). `hidden` and `heads`: another width and head count (vLLM's
    CPU attention runs head sizes of 32 and more)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                         max_position_embeddings=context,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True, rms_norm_eps=1e-5)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(8)
        model.model.norm.weight.mul_(-1)
    return model.eval()


def llama_cpp_order(weight: torch.Tensor, heads: int) -> np.ndarray:
    """Q or K rows in llama.cpp's rotary layout (each head's two halves interleaved), which transformers'
    GGUF loader undoes."""
    w = weight.detach().numpy()
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, model, tokenizer, add_bos: bool = False, leave_out: tuple[str, ...] = ()) -> Path:
    import gguf

    c = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny test llama")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    writer.add_vocab_size(c.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = tokenizer.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    # transformers' GGUF loader builds a GPT-2 tokenizer, which adds "<|endoftext|>" when the vocabulary lacks
    # it (SmolLM2's has it at id 0): name the pad token so, and the sizes of model and tokenizer agree
    tokens[tokenizer.pad_token_id] = "<|endoftext|>"
    special = set(tokenizer.all_special_tokens)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    import json

    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(add_bos)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"].numpy())
    writer.add_tensor("output_norm.weight", state["model.norm.weight"].numpy())
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(c.num_hidden_layers):
        for hf, ours in names.items():
            w = state[f"model.layers.{i}.{hf}.weight"]
            if ours == "attn_q":
                array = llama_cpp_order(w, c.num_attention_heads)
            elif ours == "attn_k":
                array = llama_cpp_order(w, c.num_key_value_heads)
            else:
                array = w.numpy()
            if ours not in leave_out:  # a damaged file for the tests: a layer without some of its weights
                writer.add_tensor(f"blk.{i}.{ours}.weight", np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
