"""GGUF files (llama.cpp's format) read with bounded work, before any library parses them.

    layout = read_gguf_layout(Path("SmolLM2-135M-Instruct.Q4_1.gguf"))  # -> GGUFLayout, or InputError

A GGUF is a header, metadata (key, type, value; arrays of values), tensor descriptions (name, shape,
quantization type, offset) and the tensors' data. Every count and length in it is a number the file
claims, and the `gguf` package's reader (which transformers' loader uses) believes them: it builds one
Python object per array element, about 1 KB and 11 us each (measured on SmolLM2's file: 147,204
elements, 1.7 s and 190 MB). So the file is walked here first, through a read-only memory map, and
nothing it claims is believed before it is checked against the bytes that are there:

- every count and string length against the bytes left (a string takes at least its 8-byte length, an
  element of a numeric array its own size), in Python integers (no wraparound);
- the tokenizer's arrays at most `MAX_GGUF_VOCAB` tokens, and no more tokens than the embedding has
  rows; its merges at most `MAX_MERGES_PER_TOKEN` per token; every other array together at most
  `MAX_OTHER_ARRAY_ELEMENTS` elements; no arrays of arrays (no language-model GGUF has them);
- every tensor's bytes inside the data section, aligned, not overlapping another's;
- the sizes the metadata gives the model (layers, width, feed-forward width, heads, context) in range,
  tensors present for every layer it claims, and the weights they imply present in the file (a
  90-byte file must not make transformers build and initialise a default-size model).

Bounds, for a file of S bytes: memory is the map (page cache, not the heap) plus one small record per
metadata key and tensor (at most 65,536 of each); time is one step per key, tensor and string array
element, at most S / 8 steps and at most 4 + 3 * `MAX_GGUF_VOCAB` + `MAX_OTHER_ARRAY_ELEMENTS`
elements; numeric arrays are skipped in one step. The real 98 MB SmolLM2 file is walked in about 0.1 s.
Errors are one `InputError` naming the file; nothing from the file is echoed but short identifiers.
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError
from ..checks import MAX_CONTEXT, MAX_HIDDEN, MAX_LAYERS  # a model's sizes, bounded as for a checkpoint folder

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
MAX_GGUF_TENSORS = 1 << 16
MAX_GGUF_KEYS = 1 << 16
MAX_NAME_BYTES = 1024  # a metadata key or tensor name ("blk.29.ffn_down.weight")
MAX_KEPT_STRING = 256  # longer string values (a chat template) are checked, not kept
MAX_GGUF_VOCAB = 1 << 19  # 524,288 tokens: the largest published vocabularies have 262,144
MAX_MERGES_PER_TOKEN = 4  # BPE merges per token (SmolLM2 1.0, Llama 3 2.2)
MAX_OTHER_ARRAY_ELEMENTS = 1 << 16  # all arrays besides the tokenizer's, together
BYTES_PER_ELEMENT = 256  # a file of S bytes holds at most max(S / 256, MIN_ELEMENT_BUDGET) array values in all
MIN_ELEMENT_BUDGET = 1 << 16
MAX_STRING_BYTES = 1 << 20  # one string value (a chat template: a few KB; `--chat` reads at most 1 MiB)
MAX_ARRAY_STRING_BYTES = 1 << 16  # one string of an array (a token, a merge)
MAX_STRING_VALUE_BYTES = 4 << 20  # every string value together (chat templates, names: a few KB in real files)
MAX_KEPT_ARRAY = 1024  # numeric arrays up to this long are kept (per-layer sizes: transformers reads them)
MAX_TENSOR_DIMS = 4
DEFAULT_ALIGNMENT = 32
TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")
MERGES = "tokenizer.ggml.merges"
LAYER = re.compile(r"blk\.(0|[1-9]\d{0,8})\.")  # blk.<layer>.: "blk.00." names no layer (transformers skips it)

STRING, ARRAY = 8, 9
FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor description: GGUF's dimension order (the fastest-varying first) and its bytes' place."""

    shape: tuple[int, ...]
    quantization: int
    start: int  # absolute offset in the file
    size: int  # bytes

    @property
    def numel(self) -> int:
        total = 1
        for n in self.shape:
            total *= n
        return total


@dataclass
class GGUFLayout:
    """What `read_gguf_layout` found: small metadata values by key (long strings and arrays as their
    lengths, `array_lengths`), and the tensors by name."""

    size: int
    version: int
    values: dict[str, object] = field(default_factory=dict)
    array_lengths: dict[str, int] = field(default_factory=dict)
    tensors: dict[str, GGUFTensor] = field(default_factory=dict)

    def string(self, key: str) -> str | None:
        value = self.values.get(key)
        return value if isinstance(value, str) else None

    def integer(self, key: str) -> int | None:
        value = self.values.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Cursor:
    """A position in the mapped file; every read checks the bytes are there first."""

    def __init__(self, data, file: Path):
        self.data, self.pos, self.end, self.file = data, 0, len(data), file

    def left(self) -> int:
        return self.end - self.pos

    def damaged(self, what: str) -> InputError:
        return InputError(f"{self.file} is damaged or truncated: {what} (at byte {self.pos:,} of {self.end:,})")

    def fixed(self, kind: int):
        fmt = FIXED[kind]
        size = struct.calcsize(fmt)
        if size > self.left():
            raise self.damaged("a value runs past the end of the file")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def skip(self, count: int, size: int, what: str) -> None:
        if count * size > self.left():
            raise self.damaged(f"{what} claims {count:,} values, more than the bytes left hold")
        self.pos += count * size

    def string(self, max_kept: int, max_bytes: int = MAX_STRING_BYTES) -> str | None:
        """A string value of at most `max_bytes`, kept when at most `max_kept` bytes of UTF-8, else skipped
        (None)."""
        length = self.fixed(10)
        if length > self.left():
            raise self.damaged(f"a string claims {length:,} bytes, more than the file has left")
        if length > max_bytes:
            raise self.damaged(f"a string of {length:,} bytes, more than the {max_bytes:,} mtpc reads")
        raw = self.data[self.pos:self.pos + length] if length <= max_kept else None
        self.pos += length
        try:
            return raw.decode("utf-8") if raw is not None else None
        except UnicodeDecodeError:
            return None


def read_gguf_layout(file: Path) -> GGUFLayout:
    """The file walked and checked as the module's docstring says; an `InputError` otherwise."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(24)
        _check_header(file, head, size)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            cursor = _Cursor(data, file)
            cursor.pos = 24
            layout = GGUFLayout(size, int.from_bytes(head[4:8], "little"))
            keys, tensors = int.from_bytes(head[16:24], "little"), int.from_bytes(head[8:16], "little")
            _read_metadata(cursor, layout, keys)
            _read_tensors(cursor, layout, tensors)
    check_model_shape(layout, file)
    return layout


def _check_header(file: Path, head: bytes, size: int) -> None:
    """Magic, version and the tensor and key counts, from the fixed 24-byte header."""
    if head[:4] != GGUF_MAGIC:
        raise InputError(f"{file} is not a GGUF file (it does not start with GGUF's magic bytes)")
    if len(head) < 24:
        raise InputError(f"{file} is truncated: {size} bytes, shorter than a GGUF header")
    version = int.from_bytes(head[4:8], "little")
    tensors, keys = int.from_bytes(head[8:16], "little"), int.from_bytes(head[16:24], "little")
    if version not in GGUF_VERSIONS:
        raise InputError(f"{file}: GGUF version {version} is not one transformers reads "
                         f"({', '.join(map(str, GGUF_VERSIONS))})")
    if tensors > MAX_GGUF_TENSORS or keys > MAX_GGUF_KEYS:
        raise InputError(f"{file} is damaged: its header claims {tensors:,} tensors and {keys:,} metadata keys "
                         f"(at most {MAX_GGUF_TENSORS:,} each)")


def _name(cursor: _Cursor, what: str) -> str:
    name = cursor.string(MAX_NAME_BYTES)
    if name is None or not name.isprintable():
        raise cursor.damaged(f"a {what} is not a short printable name")
    return name


def _read_metadata(cursor: _Cursor, layout: GGUFLayout, keys: int) -> None:
    other_elements, elements, string_bytes = 0, 0, 0
    budget = max(layout.size // BYTES_PER_ELEMENT, MIN_ELEMENT_BUDGET)  # what transformers' reader then builds
    for _ in range(keys):
        key = _name(cursor, "metadata key")
        if key in layout.values or key in layout.array_lengths:
            raise cursor.damaged("a metadata key appears twice")
        kind = cursor.fixed(4)
        if kind in FIXED:
            layout.values[key] = cursor.fixed(kind)
        elif kind == STRING:
            start = cursor.pos
            layout.values[key] = cursor.string(MAX_KEPT_STRING)
            string_bytes += cursor.pos - start
            if string_bytes > MAX_STRING_VALUE_BYTES:  # transformers took 43 s over sixty strings of 1 MiB
                raise InputError(f"{cursor.file} is damaged: its string values hold more than "
                                 f"{MAX_STRING_VALUE_BYTES:,} bytes together")
        elif kind == ARRAY:
            layout.array_lengths[key] = count = _skip_array(cursor, key, layout)
            elements += count
            if elements > budget:
                raise InputError(f"{cursor.file} is damaged: its metadata arrays hold more than {budget:,} values, "
                                 f"more than a file of {layout.size:,} bytes holds (one per {BYTES_PER_ELEMENT} bytes)")
            if key not in TOKENIZER_ARRAYS and key != MERGES:
                other_elements += count
                if other_elements > MAX_OTHER_ARRAY_ELEMENTS:
                    raise InputError(f"{cursor.file} is damaged: its metadata arrays besides the tokenizer's hold "
                                     f"more than {MAX_OTHER_ARRAY_ELEMENTS:,} values")
        else:
            raise cursor.damaged("a metadata value has an unknown type")


def _skip_array(cursor: _Cursor, key: str, layout: GGUFLayout) -> int:
    """Check an array value's elements are there and step over them; returns its length."""
    kind, count = cursor.fixed(4), cursor.fixed(10)
    cap = MAX_GGUF_VOCAB if key in TOKENIZER_ARRAYS else \
        MAX_MERGES_PER_TOKEN * MAX_GGUF_VOCAB if key == MERGES else MAX_OTHER_ARRAY_ELEMENTS
    if count > cap:
        raise InputError(f"{cursor.file} is damaged: its metadata array {key[:MAX_KEPT_STRING]!r} claims "
                         f"{count:,} values (at most {cap:,})")
    if kind in FIXED:
        start = cursor.pos
        cursor.skip(count, struct.calcsize(FIXED[kind]), f"array {key[:MAX_KEPT_STRING]!r}")
        if count <= MAX_KEPT_ARRAY:  # a per-layer size, or one written as a one-value array: checked as sizes
            layout.values[key] = struct.unpack_from(f"<{count}{FIXED[kind][1]}", cursor.data, start)
    elif kind == STRING:
        if count * 8 > cursor.left():
            raise cursor.damaged(f"array {key[:MAX_KEPT_STRING]!r} claims {count:,} strings, more than the bytes left hold")
        for _ in range(count):
            cursor.string(0, MAX_ARRAY_STRING_BYTES)
    else:
        raise cursor.damaged("a metadata array holds arrays or values of an unknown type")
    return count


def _read_tensors(cursor: _Cursor, layout: GGUFLayout, count: int) -> None:
    """The tensor descriptions, then every tensor's bytes placed inside the data section."""
    from gguf.constants import GGML_QUANT_SIZES

    described = []
    for _ in range(count):
        name = _name(cursor, "tensor name")
        dims = cursor.fixed(4)
        if not 1 <= dims <= MAX_TENSOR_DIMS:
            raise cursor.damaged(f"tensor {name[:80]!r} claims {dims:,} dimensions")
        shape = tuple(cursor.fixed(10) for _ in range(dims))
        quantization, offset = cursor.fixed(4), cursor.fixed(10)
        if name in layout.tensors or any(name == n for n, *_ in described):
            raise cursor.damaged(f"tensor {name[:80]!r} appears twice")
        if quantization not in GGML_QUANT_SIZES:
            raise cursor.damaged(f"tensor {name[:80]!r} has an unknown quantization type")
        described.append((name, shape, quantization, offset))
    alignment = layout.integer("general.alignment") or DEFAULT_ALIGNMENT
    if alignment <= 0 or alignment & (alignment - 1) or alignment > 1 << 16:
        raise InputError(f"{cursor.file} is damaged: general.alignment must be a power of two up to 65,536")
    data_start = -(-cursor.pos // alignment) * alignment
    for name, shape, quantization, offset in described:
        layout.tensors[name] = _place(cursor.file, name, shape, quantization, offset, data_start, alignment,
                                      layout.size, GGML_QUANT_SIZES[quantization])
    _check_no_overlap(cursor.file, layout.tensors)


def _place(file: Path, name: str, shape, quantization: int, offset: int, data_start: int, alignment: int,
           size: int, block: tuple[int, int]) -> GGUFTensor:
    """A tensor's bytes: `offset` from the data section's start, a whole number of quantization blocks,
    ending inside the file (Python integers: an offset of 2^64 - 64 cannot wrap around to the metadata)."""
    shown = name[:80]
    block_size, block_bytes = block
    if any(n < 1 for n in shape) or shape[0] % block_size:
        raise InputError(f"{file} is damaged: tensor {shown!r} has shape {shape}, not whole blocks of its type")
    if offset % alignment:
        raise InputError(f"{file} is damaged: tensor {shown!r} is not aligned to {alignment} bytes")
    numel = 1
    for n in shape:
        numel *= n
    start, nbytes = data_start + offset, numel // block_size * block_bytes
    if start + nbytes > size:
        raise InputError(f"{file} is truncated or damaged: tensor {shown!r} ends past the end of the file "
                         f"({size:,} bytes)")
    return GGUFTensor(shape, quantization, start, nbytes)


def _check_no_overlap(file: Path, tensors: dict[str, GGUFTensor]) -> None:
    end = 0
    for name, tensor in sorted(tensors.items(), key=lambda kv: kv[1].start):
        if tensor.start < end:
            raise InputError(f"{file} is damaged: tensor {name[:80]!r} overlaps the one before it")
        end = tensor.start + tensor.size


def check_model_shape(layout: GGUFLayout, file: Path) -> None:
    """The sizes the metadata gives the model against the tensors the file holds."""
    architecture = layout.string("general.architecture")
    if not architecture or len(architecture) > 40 or not architecture.replace("-", "_").isidentifier():
        raise InputError(f"{file}: no general.architecture in its metadata (not a language model GGUF that "
                         "transformers reads)")
    check_architecture(architecture, file)
    embedding = layout.tensors.get("token_embd.weight")
    if embedding is None or len(embedding.shape) != 2:
        raise InputError(f"{file}: no token embedding (token_embd.weight, two dimensions); not a language model")
    width, rows = embedding.shape
    config = model_sizes(layout, architecture, file)
    if "num_hidden_layers" not in config:
        raise InputError(f"{file}: no {architecture}.block_count in its metadata (how many layers the model has)")
    if config.get("hidden_size") != width:
        raise InputError(f"{file}: {architecture}.embedding_length must be token_embd.weight's width, {width:,}")
    _check_layers_present(layout, config["num_hidden_layers"], file)
    implied, stored = implied_weights(config, rows), sum(t.numel for t in layout.tensors.values())
    if implied > 2 * stored + (1 << 20):
        raise InputError(f"{file}: its metadata implies a model of about {implied:,} weights, but its tensors hold "
                         f"only {stored:,}; the metadata does not describe these tensors")
    _check_tokenizer(layout, rows, file)


# the sizes transformers builds a model from (its GGUF key table maps them), and what each may be
SIZE_LIMITS = {"hidden_size": MAX_HIDDEN, "num_hidden_layers": MAX_LAYERS, "intermediate_size": 1 << 20,
               "head_dim": 1 << 12, "num_attention_heads": 1 << 12, "num_key_value_heads": 1 << 12,
               "max_position_embeddings": MAX_CONTEXT, "vocab_size": MAX_GGUF_VOCAB, "num_experts": 1 << 12,
               "num_experts_per_tok": 1 << 12, "moe_intermediate_size": 1 << 20}
MAX_OTHER_SIZE = MAX_CONTEXT  # any other integer of the architecture's metadata (a sliding window, ...)


def check_architecture(architecture: str, file: Path) -> None:
    """An architecture transformers' GGUF loader builds (its metadata keys are read through that loader's
    mapping: for any other, no size could be checked)."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    built = sorted(k for k in GGUF_CONFIG_MAPPING if k not in ("general", "tokenizer"))
    if architecture not in built:
        raise InputError(f"{file}: architecture {architecture!r} is not one transformers' GGUF loader builds "
                         f"(it builds: {', '.join(built)})")


def model_sizes(layout: GGUFLayout, architecture: str, file: Path) -> dict[str, int]:
    """The model's sizes under transformers' config names, as its GGUF loader maps the metadata keys
    (`<architecture>.embedding_length` -> `hidden_size`, ...), each an integer in range; every other
    integer of the architecture's metadata in 0..`MAX_OTHER_SIZE`."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    names = {f"{architecture}.{key}": name for key, name in GGUF_CONFIG_MAPPING.get(architecture, {}).items() if name}
    names[f"{architecture}.expert_feed_forward_length"] = "moe_intermediate_size"
    sizes = {}
    for key, value in layout.values.items():
        # transformers reads a one-value array as that value, a longer one per layer: every value is checked
        values = value if isinstance(value, tuple) else (value,)
        numbers = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
        if not key.startswith(architecture + ".") or not numbers:
            continue
        name = names.get(key)
        low, high = (1, SIZE_LIMITS[name]) if name in SIZE_LIMITS else (0, MAX_OTHER_SIZE)
        if not all(low <= v <= high for v in numbers):
            raise InputError(f"{file}: {key[:80]} must be an integer in {low}..{high:,} in its metadata")
        if name in SIZE_LIMITS:
            sizes[name] = max(numbers)
    return sizes


def implied_weights(config: dict[str, int], rows: int) -> int:
    """The weights a model of these sizes has, counted as for the Llama layout (embedding, attention at its
    head width, a gated MLP per expert): within a small factor for the other families, which is all the
    check needs."""
    d, layers = config["hidden_size"], config["num_hidden_layers"]
    heads = config.get("num_attention_heads", 1)
    head_dim = config.get("head_dim", d // heads or 1)
    kv = config.get("num_key_value_heads", heads)
    attention = 2 * d * heads * head_dim + 2 * d * kv * head_dim
    experts = config.get("num_experts", 1)
    feed_forward = config.get("moe_intermediate_size" if experts > 1 else "intermediate_size", 4 * d)
    return rows * d + layers * (attention + 3 * d * feed_forward * experts)


def _check_layers_present(layout: GGUFLayout, layers: int, file: Path) -> None:
    found = {int(m.group(1)) for name in layout.tensors if (m := LAYER.match(name))}
    missing = [i for i in range(layers) if i not in found]
    if missing:
        raise InputError(f"{file}: its metadata claims {layers:,} layers, but it holds no tensors for layer "
                         f"{missing[0]}{f' and {len(missing) - 1:,} more' if len(missing) > 1 else ''}")
    if found and max(found) >= layers:
        raise InputError(f"{file}: it holds tensors for layer {max(found)}, but its metadata claims {layers:,} layers")


def _check_tokenizer(layout: GGUFLayout, rows: int, file: Path) -> None:
    """A tokenizer of the model's own: its tokens, no more of them than the embedding has rows, its
    other per-token arrays as long, its merges bounded by its tokens."""
    model = layout.string("tokenizer.ggml.model")
    if not model or len(model) > 40 or not model.replace("-", "_").isidentifier():
        raise InputError(f"{file}: no tokenizer.ggml.model in its metadata (not a language model GGUF that "
                         "transformers reads)")
    tokens = layout.array_lengths.get(TOKENIZER_ARRAYS[0])
    if not tokens:
        raise InputError(f"{file}: no tokenizer.ggml.tokens in its metadata (its tokenizer is missing)")
    if tokens > rows:
        raise InputError(f"{file}: its tokenizer has {tokens:,} tokens, more than the {rows:,} rows of its "
                         "embedding (ids past the embedding cannot be decoded)")
    for key in TOKENIZER_ARRAYS[1:]:
        if key in layout.array_lengths and layout.array_lengths[key] != tokens:
            raise InputError(f"{file}: {key} has {layout.array_lengths[key]:,} values for {tokens:,} tokens")
    if layout.array_lengths.get(MERGES, 0) > MAX_MERGES_PER_TOKEN * tokens + 1024:
        raise InputError(f"{file}: {MERGES} has {layout.array_lengths[MERGES]:,} merges for {tokens:,} tokens")
