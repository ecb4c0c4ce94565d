"""A byte tokenizer: ids 0..255 are the bytes themselves, special tokens follow.

Byte ids equal byte values, so a circuit over `v = 256` states scores exactly the byte ids and any
id `>= 256` is a special token. The vocabulary can be padded beyond the specials (e.g. to 320, the
size EvaByte uses) so that an embedding matrix has room for more specials later; padded ids decode
to nothing.

`SubwordTokenizer` is the other kind: a subword model's own Hugging Face tokenizer behind the same
surface (`encode`, `decode`, `bos_id`, `eos_id`, `pad_id`, `vocab_size`), for heads that suit any
vocabulary (the `tied` parameterisation).

Encoding never fails: `bytes` are taken as they are, and a `str` holding lone surrogates (as produced
by ``bytes.decode("utf-8", "surrogateescape")``) is encoded back to its original bytes. Decoding
invalid UTF-8 yields U+FFFD replacement characters by default; `decode_bytes` round-trips exactly.

The same vocabulary as a Hugging Face tokenizer (`ByteTokenizer.to_hf()`; `save` writes it next to
`mtpc_tokenizer.json`, so a model folder loads with `AutoTokenizer.from_pretrained(DIR)`, no remote
code): a `tokenizers` byte-level BPE without merges whose 256 base tokens are GPT-2's printable
stand-ins for the bytes, numbered by byte value (id == byte), the specials (and `<unused_N>` padding)
as special added tokens after them, and the chat template of `mtpc.training.data`. Text encodes to its UTF-8
bytes; any id sequence decodes (invalid UTF-8 as U+FFFD); `hf_ids_to_bytes` recovers raw bytes exactly.
`save_hf_tokenizer(DIR)` adds these files to a model folder written before they existed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

NUM_BYTES = 256
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>")
ROLES = ("system", "user", "assistant", "tool")
TOKENIZER_FILE = "mtpc_tokenizer.json"
TINY_LM_RECORD = "tiny_lm.json"  # written by `mtpc tiny-lm` beside the LM it trained
MAX_VOCAB = 2**22  # ids a byte tokenizer may describe (its Hugging Face view names every one)


class ByteTokenizer:
    """Bytes at ids 0..255, then `specials` in order, then unused ids up to `vocab_size`."""

    kind = "byte"

    def __init__(self, vocab_size: int | None = None, specials: Sequence[str] = SPECIAL_TOKENS):
        self.specials = tuple(specials)
        if len(set(self.specials)) != len(self.specials):
            raise ValueError(f"special tokens must be distinct, got {self.specials}")
        minimum = NUM_BYTES + len(self.specials)
        self.vocab_size = minimum if vocab_size is None else int(vocab_size)
        if self.vocab_size < minimum:
            raise ValueError(f"vocab_size {self.vocab_size} is too small: 256 bytes + {len(self.specials)} "
                             f"special tokens need at least {minimum}")
        self._special_ids = {name: NUM_BYTES + i for i, name in enumerate(self.specials)}

    # ------------------------------------------------------------------ special ids

    def special_id(self, name: str) -> int:
        try:
            return self._special_ids[name]
        except KeyError:
            raise KeyError(f"unknown special token {name!r}; known: {', '.join(self.specials)}") from None

    @property
    def pad_id(self) -> int:
        return self.special_id("<pad>")

    @property
    def bos_id(self) -> int:
        return self.special_id("<bos>")

    @property
    def eos_id(self) -> int:
        return self.special_id("<eos>")

    @property
    def end_of_turn_id(self) -> int:
        return self.special_id("<|end|>")

    def role_id(self, role: str) -> int:
        if role not in ROLES:
            raise KeyError(f"unknown chat role {role!r}; known: {', '.join(ROLES)}")
        return self.special_id(f"<|{role}|>")

    def is_byte(self, token_id: int) -> bool:
        return 0 <= token_id < NUM_BYTES

    # ------------------------------------------------------------------ encode / decode

    def encode(self, text: str | bytes, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Token ids of `text` (a `str` is UTF-8 encoded; lone surrogates map back to their bytes)."""
        data = text if isinstance(text, (bytes, bytearray, memoryview)) else to_bytes(text)
        ids = list(bytes(data))
        if add_bos:
            ids.insert(0, self.bos_id)
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def encode_prompt(self, text: str | bytes) -> list[int]:
        """A prompt's ids: <bos>, then the bytes (mtpc's byte LMs saw their documents so)."""
        return self.encode(text, add_bos=True)

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes among `ids`, special and unused ids dropped: the exact inverse of `encode`."""
        return bytes(int(i) for i in ids if 0 <= int(i) < NUM_BYTES)

    def decode(self, ids: Iterable[int], *, skip_special: bool = True, errors: str = "replace") -> str:
        """Text of `ids`; invalid UTF-8 becomes U+FFFD (`errors="replace"`) and never raises.
        With `skip_special=False` special tokens appear by name and unused ids as `<unused_N>`."""
        if skip_special:
            return self.decode_bytes(ids).decode("utf-8", errors=errors)
        pieces: list[str] = []
        run = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < NUM_BYTES:
                run.append(i)
                continue
            pieces.append(run.decode("utf-8", errors=errors))
            run.clear()
            pieces.append(self.token_name(i))
        pieces.append(run.decode("utf-8", errors=errors))
        return "".join(pieces)

    def token_name(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary 0..{self.vocab_size - 1}")
        if token_id < NUM_BYTES:
            return f"<0x{token_id:02X}>"
        k = token_id - NUM_BYTES
        return self.specials[k] if k < len(self.specials) else f"<unused_{token_id}>"

    # ------------------------------------------------------------------ persistence

    def to_dict(self) -> dict:
        return {"type": "mtpc-byte-tokenizer", "vocab_size": self.vocab_size, "specials": list(self.specials)}

    @classmethod
    def from_dict(cls, data: dict, where: str = "the tokenizer description") -> "ByteTokenizer":
        """The tokenizer `to_dict` describes; `ValueError` naming `where` and the key for anything else
        (the message never quotes the file's strings)."""
        if not isinstance(data, dict) or data.get("type") != "mtpc-byte-tokenizer":
            raise ValueError(f"{where}: type must be 'mtpc-byte-tokenizer'")
        vocab, specials = data.get("vocab_size"), data.get("specials", list(SPECIAL_TOKENS))
        if not isinstance(vocab, int) or isinstance(vocab, bool) or not NUM_BYTES < vocab <= MAX_VOCAB:
            raise ValueError(f"{where}: vocab_size must be an integer in {NUM_BYTES + 1}..{MAX_VOCAB:,}")
        if not isinstance(specials, list) or not all(isinstance(t, str) and 0 < len(t) <= 64 for t in specials):
            raise ValueError(f"{where}: specials must be a list of token names (strings of 1..64 characters)")
        missing = [t for t in SPECIAL_TOKENS if t not in specials]
        if missing:
            raise ValueError(f"{where}: specials lacks {', '.join(missing)} (mtpc needs all of "
                             f"{', '.join(SPECIAL_TOKENS)})")
        if len(set(specials)) != len(specials):
            raise ValueError(f"{where}: specials names a token twice")
        return cls(vocab, specials)

    def save(self, directory: str | Path) -> Path:
        """Write `mtpc_tokenizer.json` and the Hugging Face tokenizer files (`to_hf().save_pretrained`)."""
        path = Path(directory) / TOKENIZER_FILE
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        self.to_hf().save_pretrained(str(directory))
        return path

    # ------------------------------------------------------------------ Hugging Face view

    def chat_template(self) -> str:
        """Jinja text of the `mtpc.training.data` chat format: `<bos>`, then `<|role|> content <|end|>` per
        message, then `<eos>` (or `<|assistant|>` with `add_generation_prompt`, where the model writes)."""
        roles = ", ".join(f"'{r}'" for r in ROLES)
        end = self.token_name(self.end_of_turn_id)
        return ("{{ bos_token }}{% for m in messages %}"
                f"{{% if m['role'] not in [{roles}] %}}"
                "{{ raise_exception('unknown chat role ' + m['role'] + '; known: " + ", ".join(ROLES) + "') }}"
                "{% endif %}"
                f"{{{{ '<|' + m['role'] + '|>' + m['content'] + '{end}' }}}}"
                "{% endfor %}"
                f"{{% if add_generation_prompt %}}{{{{ '{self.token_name(self.role_id('assistant'))}' }}}}"
                "{% else %}{{ eos_token }}{% endif %}")

    def to_hf(self):
        """This vocabulary as a transformers `PreTrainedTokenizerFast` (ids, specials and chat template
        all from this object)."""
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        vocab = {char: byte for byte, char in enumerate(_byte_chars())}
        backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: one token per byte
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.decoder = decoders.ByteLevel()
        names = [self.token_name(i) for i in range(NUM_BYTES, self.vocab_size)]
        backend.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in names])
        if backend.get_vocab_size() != self.vocab_size:
            raise ValueError(f"a special token name collides with another token: {self.specials}")
        return PreTrainedTokenizerFast(
            tokenizer_object=backend, bos_token=self.token_name(self.bos_id), eos_token=self.token_name(self.eos_id),
            pad_token=self.token_name(self.pad_id), chat_template=self.chat_template())

    @classmethod
    def load(cls, directory: str | Path) -> "ByteTokenizer":
        """The tokenizer saved in `directory`, or a default one sized to its HF config's vocabulary."""
        from ..files import read_json

        directory = Path(directory)
        path = directory / TOKENIZER_FILE
        if path.exists() or path.is_symlink():
            return cls.from_dict(read_json(path, "the byte tokenizer", folder=directory), str(path))
        config = directory / "config.json"
        if config.exists() or config.is_symlink():
            vocab = read_json(config, "the model's configuration", folder=directory).get("vocab_size")
            if not isinstance(vocab, int) or isinstance(vocab, bool) or not NUM_BYTES < vocab <= MAX_VOCAB:
                raise ValueError(f"{config}: vocab_size must be an integer in {NUM_BYTES + 1}..{MAX_VOCAB:,}")
            return cls(vocab)
        raise FileNotFoundError(f"no {TOKENIZER_FILE} or config.json in {directory}")

    def byte_lengths(self) -> list[int]:
        """Bytes each id stands for: 1 for the 256 byte ids, 0 for the specials and unused ids."""
        return [1] * NUM_BYTES + [0] * (self.vocab_size - NUM_BYTES)

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size}, specials={len(self.specials)})"


class SubwordTokenizer:
    """A subword model's own tokenizer (the Hugging Face one saved in its folder) behind the surface
    mtpc's data, training and decoding use: `encode`, `decode`, `bos_id`, `eos_id`, `pad_id`,
    `vocab_size`. Bytes are read as UTF-8 (invalid bytes as U+FFFD: a subword vocabulary need not
    spell every byte string) and tokenized whole, without the tokenizer's own special tokens; a
    document's `<bos>` is the tokenizer's bos token, else its eos token (GPT-2's `<|endoftext|>`
    separates documents), the padding its pad token, else the eos token. Text never yields a special id:
    a special token's name inside it is tokenized as the characters it is made of."""

    kind = "subword"

    def __init__(self, hf, vocab_size: int | None = None, where: str = "the tokenizer"):
        vocab_size = len(hf) if vocab_size is None else vocab_size  # None: exactly the tokenizer's own ids
        if len(hf) > vocab_size:
            raise ValueError(f"{where}: the tokenizer has {len(hf):,} tokens, the model only {vocab_size:,}")
        eos = hf.eos_token_id
        bos = hf.bos_token_id if hf.bos_token_id is not None else eos
        if bos is None:
            raise ValueError(f"{where}: the tokenizer names neither a bos nor an eos token (documents need a "
                             "separator)")
        self.hf, self.vocab_size = hf, vocab_size
        self.bos_id, self.eos_id = bos, eos if eos is not None else bos
        self.pad_id = hf.pad_token_id if hf.pad_token_id is not None else self.eos_id
        self.trained_by_mtpc = False  # an LM of `mtpc tiny-lm`: its prompts start with <bos>, as its documents did

    @classmethod
    def load(cls, directory: str | Path, vocab_size: int | None, trust_remote_code: bool = False) -> "SubwordTokenizer":
        """The tokenizer saved in a model folder (local files only; its own code only when trusted)."""
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=trust_remote_code)
        tok = cls(hf, vocab_size, str(directory))
        tok.trained_by_mtpc = (Path(directory) / TINY_LM_RECORD).is_file()
        return tok

    def encode(self, text: str | bytes, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        if isinstance(text, (bytes, bytearray, memoryview)):
            text = bytes(text).decode("utf-8", errors="replace")
        # text stays text: a special token's name in it (`<eos>`, `<|user|>`) is tokenized as characters,
        # never read as the special id (user text cannot forge a turn or an end)
        ids = self.hf(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

    def encode_prompt(self, text: str | bytes) -> list[int]:
        """A prompt's ids: what the model's own tokenizer makes of the text under its own special-token rule
        (SmolLM2's adds nothing, Llama's a bos), as transformers' `generate`, vLLM and llama.cpp give a
        pretrained model; an LM `mtpc tiny-lm` trained gets its <bos> first, as its documents had.
        Special-token names in the text stay characters, as in `encode`."""
        if self.trained_by_mtpc:
            return self.encode(text, add_bos=True)
        if isinstance(text, (bytes, bytearray, memoryview)):
            text = bytes(text).decode("utf-8", errors="replace")
        return list(self.hf(text, add_special_tokens=True, split_special_tokens=True)["input_ids"])

    def decode(self, ids: Iterable[int], *, skip_special: bool = True, errors: str = "replace") -> str:
        # the tokens' own text: no clean-up of spaces before punctuation (it would change the text)
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special, clean_up_tokenization_spaces=False)

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The UTF-8 bytes of the text of `ids`, special tokens dropped (what a reader of the output gets)."""
        return self.decode(ids).encode("utf-8", errors="surrogateescape")

    def is_byte(self, token_id: int) -> bool:
        """No id is a byte: every token is text (the stop tokens are the specials, `special_ids`)."""
        return False

    def special_ids(self) -> set[int]:
        return {int(i) for i in self.hf.all_special_ids} | {self.eos_id}

    def special_names(self) -> dict[str, int]:
        """The special tokens' names and ids (a chat template writes them by name)."""
        return {name: int(i) for name, i in zip(self.hf.all_special_tokens, self.hf.all_special_ids)}

    def byte_lengths(self) -> list[int]:
        """Bytes of text each id `0 .. vocab_size - 1` stands for (0: special or unused ids). Exact for a
        byte-level BPE (GPT-2's table) and for byte-fallback tokens `<0xNN>`; otherwise the UTF-8 length of
        the token's own decoded text."""
        byte_chars = set(_byte_chars())
        specials = self.special_ids()
        tokens = self.hf.convert_ids_to_tokens(list(range(min(len(self.hf), self.vocab_size))))
        lengths = [0] * self.vocab_size
        for i, token in enumerate(tokens):
            if i in specials or token is None:
                continue
            if all(ch in byte_chars for ch in token):
                lengths[i] = len(token)
            elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                lengths[i] = 1
            else:
                lengths[i] = len(self.hf.decode([i]).encode("utf-8", errors="surrogateescape"))
        return lengths

    def save(self, directory: str | Path) -> None:
        """The Hugging Face tokenizer files in `directory` (`AutoTokenizer.from_pretrained` reads them)."""
        self.hf.save_pretrained(str(directory))

    def __repr__(self) -> str:
        return f"SubwordTokenizer({type(self.hf).__name__}, vocab_size={self.vocab_size})"


def save_hf_tokenizer(directory: str | Path, tok: ByteTokenizer | None = None) -> Path:
    """Add the tokenizer files (`mtpc_tokenizer.json` and the Hugging Face ones) to a model folder, e.g.
    one written before `mtpc tiny-lm` saved them; `tok` defaults to `ByteTokenizer.load(directory)`."""
    directory = Path(directory)
    if not directory.is_dir():
        from ..errors import InputError

        raise InputError(f"{directory} is not a folder")
    (tok or ByteTokenizer.load(directory)).save(directory)
    return directory


def _byte_chars() -> list[str]:
    """GPT-2's byte-to-unicode table, the one `tokenizers`' ByteLevel uses: entry `b` is the printable
    character that stands for byte `b`."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table = bytes_to_unicode()
    return [table[b] for b in range(NUM_BYTES)]


def hf_ids_to_bytes(tokenizer, ids: Iterable[int]) -> bytes:
    """The exact bytes of byte ids under a tokenizer from `to_hf()` (special ids dropped), through its
    own tokens, so that invalid UTF-8 survives where `tokenizer.decode` would substitute U+FFFD."""
    byte_of = {char: b for b, char in enumerate(_byte_chars())}
    tokens = tokenizer.convert_ids_to_tokens([int(i) for i in ids])
    return bytes(byte_of[t] for t in tokens if t in byte_of)


def to_bytes(text: str) -> bytes:
    """UTF-8 bytes of `text`; surrogates from `surrogateescape` decoding become their raw bytes again,
    any other lone surrogate is written as its (ill-formed) 3-byte UTF-8 sequence."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="surrogatepass")
