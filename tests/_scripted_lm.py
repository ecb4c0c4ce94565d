"""A byte LM and head whose greedy decoding is scripted: the LM repeats TEXT, the head drafts it
perfectly, so every cycle commits N bytes and cycle boundaries fall inside UTF-8 characters."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from circuitc import builders
from mtpc import MTPHead

D, VOCAB, N = 32, 264, 3
TEXT = "a✓ é"  # 7 distinct bytes: 61 e2 9c 93 20 c3 a9, repeated by the scripted LM
CYCLE = list(TEXT.encode())


def scripted_lm():
    """A byte LM whose greedy continuation repeats TEXT: decoder layers silenced, so the hidden state
    at token t is its (normalised) embedding, and the LM head scores s by the embedding of the byte
    before s in TEXT (a bigram lookup). Other tokens map to themselves."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=2 * D, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).to(torch.float64).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.copy_(4 * model.model.embed_tokens.weight[previous(1)])
    return model


def previous(steps: int) -> torch.Tensor:
    """`[V]`: the token `steps` bytes before s in TEXT's cycle (s itself off the cycle)."""
    prev = torch.arange(VOCAB)
    for i, b in enumerate(CYCLE):
        prev[b] = CYCLE[(i - steps) % len(CYCLE)]
    return prev


def oracle_head(model):
    """An FF head over bytes whose window position i drafts the byte i+1 after the current one: every
    draft is accepted, so every cycle commits N tokens and cycle boundaries fall inside characters."""
    embed = model.model.embed_tokens.weight
    tables = [4 * embed[previous(i + 1)] for i in range(N)]
    return MTPHead(builders.ff_graph(N, 256), D, init_from=tables, dtype=torch.float64)
