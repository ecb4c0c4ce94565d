"""Streaming: SpeculativeDecoder.generate, plain decoding and the custom_generate path feed any
transformers BaseStreamer as transformers does (prompt, then committed tokens, end() once), so
TextStreamer and TextIteratorStreamer work unchanged, also when a UTF-8 character is split across
cycles."""

import threading

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, TextIteratorStreamer, TextStreamer
from transformers.generation.streamers import BaseStreamer

from circuitc import builders
from mtpc import MTPHead, SpeculativeDecoder
from mtpc.decode import generate_autoregressive
from mtpc.tokenizer import ByteTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

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


class Recorder(BaseStreamer):
    def __init__(self):
        self.puts, self.ends = [], 0

    def put(self, value):
        assert self.ends == 0, "put after end()"
        self.puts.append(value.clone())

    def end(self):
        self.ends += 1


@pytest.fixture(scope="module")
def setup():
    model = scripted_lm()
    return model, SpeculativeDecoder(model, oracle_head(model)), ByteTokenizer(VOCAB).to_hf()


PROMPT = torch.tensor([CYCLE[:1]])  # "a"; cycles of N = 3 then split "✓" and "é" from the third on


def test_the_scripted_lm_repeats_the_text_and_cycles_split_characters(setup):
    model, decoder, tok = setup
    out = decoder.generate(PROMPT, 20)
    assert torch.equal(out.sequences, generate_autoregressive(model, PROMPT, 20).sequences)
    assert tok.decode(out.sequences[0]) == TEXT * 3  # 1 + 20 = 21 bytes = 3 repetitions
    assert out.stats.accepted_per_cycle[:-1] == [N] * (len(out.stats.accepted_per_cycle) - 1)
    ends = [1 + sum(out.stats.accepted_per_cycle[:c + 1]) for c in range(out.stats.cycles)]
    text = out.sequences[0].tolist()
    assert any(0x80 <= text[e] < 0xC0 for e in ends[:-1])  # some cycle ends inside a character


def test_streamer_gets_the_prompt_then_each_cycle_then_end_once(setup):
    model, decoder, _ = setup
    rec = Recorder()
    out = decoder.generate(PROMPT, 20, streamer=rec)
    assert rec.ends == 1 and torch.equal(rec.puts[0], PROMPT)
    assert [p.shape[-1] for p in rec.puts[1:]] == out.stats.accepted_per_cycle
    assert torch.equal(torch.cat([p.view(1, -1) for p in rec.puts], 1), out.sequences)
    plain = Recorder()
    ref = generate_autoregressive(model, PROMPT, 5, streamer=plain)
    assert plain.ends == 1 and [p.tolist() for p in plain.puts[1:]] == [[t] for t in ref.sequences[0, 1:].tolist()]
    empty = Recorder()
    decoder.generate(PROMPT, 0, streamer=empty)
    assert len(empty.puts) == 1 and empty.ends == 1


def test_text_streamer_prints_split_characters_whole(setup, capsys):
    _, decoder, tok = setup
    out = decoder.generate(PROMPT, 20, streamer=TextStreamer(tok, skip_prompt=True))
    printed = capsys.readouterr().out
    assert printed == tok.decode(out.sequences[0, 1:]) + "\n"
    assert "\ufffd" not in printed and printed.count("✓") == 3


def test_text_iterator_streamer_yields_whole_characters_as_cycles_commit(setup):
    _, decoder, tok = setup
    streamer = TextIteratorStreamer(tok, skip_prompt=True, timeout=60)
    result = {}
    worker = threading.Thread(target=lambda: result.update(out=decoder.generate(PROMPT, 20, streamer=streamer)))
    worker.start()
    pieces = list(streamer)
    worker.join()
    assert "".join(pieces) == tok.decode(result["out"].sequences[0, 1:])
    assert len([p for p in pieces if p]) > 1 and all("\ufffd" not in p for p in pieces)


def test_custom_generate_streams_through_mtpc_streamer(setup):
    model, decoder, tok = setup
    rec = Recorder()
    ids = model.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), pad_token_id=VOCAB - 1,
                         custom_generate=decoder.custom_generate, max_new_tokens=10, do_sample=False,
                         mtpc_streamer=rec)
    assert rec.ends == 1 and torch.equal(torch.cat([p.view(1, -1) for p in rec.puts], 1), ids)
    streamer = TextIteratorStreamer(tok, skip_prompt=True, timeout=60)
    worker = threading.Thread(target=lambda: model.generate(
        PROMPT, attention_mask=torch.ones_like(PROMPT), pad_token_id=VOCAB - 1,
        custom_generate=decoder.custom_generate, max_new_tokens=10, mtpc_streamer=streamer))
    worker.start()
    text = "".join(streamer)
    worker.join()
    assert text == tok.decode(ids[0, 1:])
