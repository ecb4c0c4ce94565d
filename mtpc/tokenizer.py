"""A byte tokenizer: ids 0..255 are the bytes themselves, special tokens follow.

Byte ids equal byte values, so a circuit over `v = 256` states scores exactly the byte ids and any
id `>= 256` is a special token. The vocabulary can be padded beyond the specials (e.g. to 320, the
size EvaByte uses) so that an embedding matrix has room for more specials later; padded ids decode
to nothing.

Encoding never fails: `bytes` are taken as they are, and a `str` holding lone surrogates (as produced
by ``bytes.decode("utf-8", "surrogateescape")``) is encoded back to its original bytes. Decoding
invalid UTF-8 yields U+FFFD replacement characters by default; `decode_bytes` round-trips exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

NUM_BYTES = 256
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>")
ROLES = ("system", "user", "assistant", "tool")
TOKENIZER_FILE = "mtpc_tokenizer.json"


class ByteTokenizer:
    """Bytes at ids 0..255, then `specials` in order, then unused ids up to `vocab_size`."""

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
    def from_dict(cls, data: dict) -> "ByteTokenizer":
        if data.get("type") != "mtpc-byte-tokenizer":
            raise ValueError(f"not an mtpc byte tokenizer description: {data!r}")
        return cls(data["vocab_size"], data["specials"])

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / TOKENIZER_FILE
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | Path) -> "ByteTokenizer":
        """The tokenizer saved in `directory`, or a default one sized to its HF config's vocabulary."""
        directory = Path(directory)
        path = directory / TOKENIZER_FILE
        if path.exists():
            return cls.from_dict(json.loads(path.read_text()))
        config = directory / "config.json"
        if config.exists():
            return cls(json.loads(config.read_text()).get("vocab_size"))
        raise FileNotFoundError(f"no {TOKENIZER_FILE} or config.json in {directory}")

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size}, specials={len(self.specials)})"


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
