"""Streaming: SpeculativeDecoder.generate, plain decoding and the custom_generate path feed any
transformers BaseStreamer as transformers does (prompt, then committed tokens, end() once), so
TextStreamer and TextIteratorStreamer work unchanged, also when a UTF-8 character is split across
cycles."""

import threading

import pytest
import torch
from _scripted_lm import CYCLE, N, TEXT, VOCAB, oracle_head, scripted_lm
from transformers import TextIteratorStreamer, TextStreamer
from transformers.generation.streamers import BaseStreamer

from mtpc import SpeculativeDecoder
from mtpc.decoding import PlainDecoder
from mtpc.lm.tokenizer import ByteTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


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
    assert torch.equal(out.sequences, PlainDecoder(model).generate(PROMPT, 20).sequences)
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
    ref = PlainDecoder(model).generate(PROMPT, 5, streamer=plain)
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
