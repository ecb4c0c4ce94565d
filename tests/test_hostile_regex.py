"""No regular expression over a training file or a user's file backtracks: crafted text costs what its length does.

Each case is timed by an interval timer that interrupts the pass, so a pattern that backtracks fails the
test in seconds instead of running for minutes (the crafted `def` lines below took ~2.4 s per 469 bytes)."""

import contextlib
import json
import random
import signal
from pathlib import Path

import pytest

from circuitc import load_graph
from mtpc.training.instructions import Instructions, definitions, module_name

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LONG_NAME = b"a" * 64  # the longest name a header holds: every shorter one was a way to match too


@contextlib.contextmanager
def within(seconds: float):
    def too_slow(signum, frame):
        raise TimeoutError(f"took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# a header, then a line that almost ends a continued signature (`)` and `:` everywhere, never a final `:`)
CRAFTED_BLOCKS = {
    "blanks then `):` pairs": b"def " + LONG_NAME + b"\n" + b" " * 200 + b"):" * 99 + b"x\n",
    "blanks then `)`s": b"def " + LONG_NAME + b"\n" + b" " * 100 + b")" * 300 + b":x\n",
}


@pytest.mark.parametrize("block", CRAFTED_BLOCKS.values(), ids=CRAFTED_BLOCKS.keys())
def test_crafted_definition_lines_are_scanned_in_linear_time(block):
    last = b'def after_them(x):\n    """A definition found after the crafted lines."""\n'
    text = block * (100_000 // len(block)) + last  # ~100 KB
    with within(2.0):
        summary, found = definitions(text)
    assert summary == ""
    assert [(d.kind, d.name, d.summary) for d in found] == [
        ("def", "after_them", "A definition found after the crafted lines.")]


def test_instructions_name_a_module_by_its_dotted_name():
    """A document cut in two by the train/validation split (`json/decoder.py#train`) is still `json.decoder`."""
    from mtpc.lm.tokenizer import ByteTokenizer
    from mtpc.training.data import split_documents, text_document

    source = b'"""JSON decoding."""\n\ndef scanstring(s, end):\n    """Scan the string s for a JSON string."""\n'
    train, _ = split_documents([text_document("json/decoder.py", source * 4, ByteTokenizer())], 0.5)
    assert [d.name for d in train] == ["json/decoder.py#train"]
    for name in ("json/decoder.py#train", "json/decoder.py#val", "json/decoder.py", "json/decoder.py:3"):
        assert module_name(name) == "json.decoder"
    assert module_name("notes#val.md") == "notes#val"  # only the split's own suffix is dropped
    instructions = Instructions([(train[0].name, source)])
    texts = [instructions[random.Random(seed)] for seed in range(60)]
    assert any("`json.decoder`" in t or "`json.decoder.scanstring`" in t for t in texts)
    assert not any(".py" in t or "#train" in t for t in texts)


def test_a_graph_spec_with_a_region_id_of_quotes_is_located_in_linear_time(tmp_path):
    """circuitc locates each region's key in the JSON text; a key of 30,000 escaped quotes once took minutes."""
    spec = load_graph(EXAMPLES / "cp.pc").to_json()
    odd = '"' * 30_000
    path = tmp_path / "g.json"
    path.write_text(json.dumps(spec).replace('"x15"', json.dumps(odd)))
    with within(2.0):
        graph = load_graph(path)
    assert graph.regions[odd].span is not None and graph.regions[odd].span.line == 1
    assert graph.regions["x14"].span.column < graph.regions[odd].span.column
