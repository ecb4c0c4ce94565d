import random

import pytest

from mtpc.tokenizer import NUM_BYTES, SPECIAL_TOKENS, ByteTokenizer


def test_bytes_are_their_own_ids_and_specials_follow():
    tok = ByteTokenizer()
    assert tok.encode(b"\x00A\xff") == [0, 65, 255]
    assert tok.vocab_size == NUM_BYTES + len(SPECIAL_TOKENS)
    assert tok.pad_id == 256 and tok.bos_id == 257 and tok.eos_id == 258
    assert len({tok.pad_id, tok.bos_id, tok.eos_id, tok.end_of_turn_id, tok.role_id("user"),
                tok.role_id("assistant"), tok.role_id("system")}) == 7
    assert tok.encode("hi", add_bos=True, add_eos=True) == [tok.bos_id, 104, 105, tok.eos_id]


def test_random_bytes_round_trip_exactly():
    tok = ByteTokenizer(320)
    rng = random.Random(0)
    for _ in range(200):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
        assert tok.decode_bytes(tok.encode(data, add_bos=True, add_eos=True)) == data
        text = tok.decode(tok.encode(data))  # never raises on invalid UTF-8
        assert text == data.decode("utf-8", errors="replace")


def test_invalid_utf8_decodes_with_replacement():
    tok = ByteTokenizer()
    ids = tok.encode(b"ok\xff\xfe\xc3")
    assert tok.decode(ids) == "ok\ufffd\ufffd\ufffd"


def test_surrogateescape_strings_encode_to_their_original_bytes():
    tok = ByteTokenizer()
    raw = b"caf\xc3\xa9 \xff\x80 end"
    text = raw.decode("utf-8", errors="surrogateescape")
    assert bytes(tok.encode(text)) == raw
    assert tok.encode("\ud800") == list("\ud800".encode("utf-8", "surrogatepass"))  # lone surrogate: no crash


def test_unicode_text_round_trips():
    tok = ByteTokenizer()
    s = "héllo ✓ 𝔘 — naïve"
    assert tok.decode(tok.encode(s)) == s


def test_specials_named_when_not_skipped_and_vocab_padding():
    tok = ByteTokenizer(320)
    ids = [tok.bos_id] + tok.encode("a") + [tok.role_id("assistant"), 300, tok.eos_id]
    assert tok.decode(ids) == "a"
    assert tok.decode(ids, skip_special=False) == "<bos>a<|assistant|><unused_300><eos>"
    with pytest.raises(ValueError):
        tok.token_name(320)


def test_vocab_too_small_is_rejected():
    with pytest.raises(ValueError, match="too small"):
        ByteTokenizer(260)


def test_save_and_load(tmp_path):
    tok = ByteTokenizer(320)
    tok.save(tmp_path)
    back = ByteTokenizer.load(tmp_path)
    assert back.vocab_size == 320 and back.specials == tok.specials
