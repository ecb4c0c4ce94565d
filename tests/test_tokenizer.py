import random

import pytest

from mtpc.lm.tokenizer import NUM_BYTES, SPECIAL_TOKENS, ByteTokenizer


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


# ------------------------------------------------------------------ the Hugging Face view

@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A folder as `mtpc tiny-lm` leaves it: config.json (a Llama) plus the saved tokenizer."""
    import json

    folder = tmp_path_factory.mktemp("lm")
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 320}))
    ByteTokenizer(320).save(folder)
    return folder


@pytest.fixture(scope="module")
def hf_tok(hf_folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf_folder)  # no trust_remote_code


def test_hf_tokenizer_ids_are_byte_values_and_specials_follow(hf_tok):
    ours = ByteTokenizer(320)
    assert len(hf_tok) == 320
    assert hf_tok.bos_token_id == ours.bos_id and hf_tok.eos_token_id == ours.eos_id
    assert hf_tok.pad_token_id == ours.pad_id
    for name in SPECIAL_TOKENS:
        assert hf_tok.convert_tokens_to_ids(name) == ours.special_id(name)
    assert hf_tok.convert_tokens_to_ids("<unused_300>") == 300
    every_byte = bytes(range(256))
    assert [hf_tok.convert_tokens_to_ids(t) for t in hf_tok.convert_ids_to_tokens(list(every_byte))] == list(every_byte)
    assert hf_tok("héllo ✓ <|user|>", add_special_tokens=False).input_ids == \
        list("héllo ✓ ".encode()) + [ours.role_id("user")]


def test_hf_tokenizer_round_trips_every_byte_and_random_byte_strings(hf_tok):
    from mtpc.lm.tokenizer import hf_ids_to_bytes

    for b in range(256):
        assert hf_ids_to_bytes(hf_tok, [b]) == bytes([b])
        assert hf_tok.decode([b]) == bytes([b]).decode("utf-8", errors="replace")
    rng = random.Random(1)
    for _ in range(200):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 48)))
        ids = list(data)
        assert hf_ids_to_bytes(hf_tok, [257] + ids + [258, 300]) == data
        assert hf_tok.decode(ids) == data.decode("utf-8", errors="replace")  # invalid UTF-8: U+FFFD
        text = data.decode("utf-8", errors="ignore")
        assert hf_tok.encode(text, add_special_tokens=False) == list(text.encode())
        assert hf_tok.decode(hf_tok.encode(text, add_special_tokens=False)) == text
    assert hf_tok.decode([257, 104, 105, 258], skip_special_tokens=True) == "hi"


def test_hf_chat_template_gives_exactly_the_training_bytes(hf_tok):
    from mtpc.training.data import chat_template

    ours = ByteTokenizer(320)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo?"},
                {"role": "assistant", "content": "hi ✓\n"}, {"role": "tool", "content": "{}"}]
    trained, _ = chat_template(messages, ours)
    rendered = hf_tok.apply_chat_template(messages, tokenize=True, return_dict=False)
    assert list(rendered) == trained
    prompt = hf_tok.apply_chat_template(messages[:2], add_generation_prompt=True, tokenize=True, return_dict=False)
    assert list(prompt) == chat_template(messages[:2], ours)[0][:-1] + [ours.role_id("assistant")]
    with pytest.raises(Exception, match="unknown chat role"):
        hf_tok.apply_chat_template([{"role": "narrator", "content": "x"}], tokenize=False)


def test_save_hf_tokenizer_adds_the_files_to_an_old_model_folder(tmp_path):
    import json

    from transformers import AutoTokenizer

    from mtpc.errors import InputError
    from mtpc.lm.tokenizer import save_hf_tokenizer

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 264}))
    save_hf_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tok) == 264 and tok.decode([104, 105]) == "hi"
    assert ByteTokenizer.load(tmp_path).vocab_size == 264
    with pytest.raises(InputError, match="not a folder"):
        save_hf_tokenizer(tmp_path / "missing")
