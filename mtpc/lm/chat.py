"""Chat prompts from a model folder's chat template, rendered as untrusted code (ground floor).

A chat template (`chat_template.jinja`, or `chat_template` in `tokenizer_config.json`) is Jinja code
the user did not write. `chat_ids(folder, messages, tok)` renders it

- in a child Python process with `jinja2`'s immutable sandbox, a wall-clock timeout
  (`RENDER_SECONDS`), an address-space limit (`RENDER_MEMORY`) and an output cap (`RENDER_CHARS`):
  nested loops, string bombs and huge outputs end in one `InputError` naming the template, as do
  syntax errors, sandbox violations, `{% include %}` (no loader) and `raise_exception`;
- with every message's content replaced by a random marker, so the template's own text is tokenized
  with the special tokens (`<|user|>`, ...) while the content is spliced back in as its bytes (a byte
  model) or as its own tokenizer's tokens with special-token names read as plain text (a subword model,
  `SubwordTokenizer.encode`): no user text can produce a special id, whatever it contains.

A template that rewrites the content (filters, slicing) is refused: the markers would not survive.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
from pathlib import Path

from ..errors import InputError
from ..files import field, read_json, read_text
from .tokenizer import NUM_BYTES, ByteTokenizer, SubwordTokenizer, to_bytes

RENDER_SECONDS = 5.0
RENDER_MEMORY = 256 * 2**20  # bytes of address space for the child: Python + jinja2 peak near 25 MiB
RENDER_CHARS = 2**20  # characters of rendered template text (content markers count a few each)
MAX_TEMPLATE_BYTES = 2**20
TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"

# The child: reads {"template", "variables", "max_chars"} as JSON on stdin, writes {"text"} or
# {"error"} as JSON on stdout. Only the standard library and jinja2 are imported.
_CHILD = r"""
import json, resource, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
job = json.loads(sys.stdin.read())
def reply(**kw):
    sys.stdout.write(json.dumps(kw)); sys.exit(0)
try:
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    def raise_exception(message):
        raise ValueError("raise_exception: " + str(message)[:200])
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(job["template"])
    pieces, size = [], 0
    for piece in template.generate(**job["variables"]):
        size += len(piece)
        if size > job["max_chars"]:
            reply(error="its output is longer than %d characters" % job["max_chars"])
        pieces.append(piece)
    reply(text="".join(pieces))
except MemoryError:
    reply(error="it ran out of memory (more than %d MiB)" % (limit >> 20))
except RecursionError:
    reply(error="it recursed too deeply")
except Exception as e:
    text = (str(e).strip().splitlines() or [""])[0][:200]
    reply(error=type(e).__name__ + (": " + text if text else ""))
"""


def find_template(folder: str | Path) -> tuple[str, str, dict]:
    """(template text, where it came from, tokenizer_config.json's object or {})."""
    folder = Path(folder)
    config = read_json(folder / CONFIG_FILE, "the tokenizer's configuration", folder=folder) \
        if (folder / CONFIG_FILE).exists() else {}
    if (folder / TEMPLATE_FILE).exists():
        path = folder / TEMPLATE_FILE
        return read_text(path, "the chat template", MAX_TEMPLATE_BYTES, folder=folder), str(path), config
    where = f"{folder / CONFIG_FILE}: chat_template"
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is None:
        raise InputError(f"--chat: the tokenizer in {folder} has no chat template")
    if not isinstance(template, str) or len(template) > MAX_TEMPLATE_BYTES:
        raise InputError(f"{where} must be a string of at most {MAX_TEMPLATE_BYTES:,} characters")
    return template, where, config


def _token_text(config: dict, key: str, default: str, where: str) -> str:
    value = config.get(key, default)
    if isinstance(value, dict):  # {"content": "<bos>", ...}
        value = field(value, "content", f"{where}: {key}", "str")
    if not isinstance(value, str):
        raise InputError(f"{where}: {key} must be a string")
    return value


def render(template: str, variables: dict, where: str, *, seconds: float = RENDER_SECONDS,
           memory: int = RENDER_MEMORY, max_chars: int = RENDER_CHARS) -> str:
    """`template` rendered with `variables` in a bounded child process (see the module docstring)."""
    job = json.dumps({"template": template, "variables": variables, "max_chars": max_chars})
    try:
        run = subprocess.run([sys.executable, "-I", "-c", _CHILD, str(memory)], input=job, capture_output=True,
                             text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        raise InputError(f"the chat template {where} did not finish rendering within {seconds:g} s") from None
    try:
        result = json.loads(run.stdout)
    except json.JSONDecodeError:
        raise InputError(f"the chat template {where} could not be rendered (the renderer ended with status "
                         f"{run.returncode})") from None
    if "error" in result:
        raise InputError(f"the chat template {where} failed: {result['error']}")
    return result["text"]


def chat_ids(folder: str | Path, messages: list[dict], tok: ByteTokenizer | SubwordTokenizer,
             add_generation_prompt: bool = True) -> list[int]:
    """Token ids of `messages` under the folder's chat template; content stays text (bytes, or the subword
    tokenizer's tokens of it), never special tokens."""
    template, where, config = find_template(folder)
    nonce = secrets.token_hex(12)
    markers = [f"\x1e{nonce}:{i}\x1e" for i in range(len(messages))]
    masked = [{"role": str(m["role"]), "content": markers[i]} for i, m in enumerate(messages)]
    variables = {"messages": masked, "add_generation_prompt": add_generation_prompt,
                 "bos_token": _token_text(config, "bos_token", special_name(tok, tok.bos_id), where),
                 "eos_token": _token_text(config, "eos_token", special_name(tok, tok.eos_id), where)}
    text = render(template, variables, where)
    ids: list[int] = []
    for i, marker in enumerate(markers):
        before, found, text = text.partition(marker)
        if not found or marker in text:
            raise InputError(f"the chat template {where} does not write each message's content exactly once, "
                             "unchanged; mtpc keeps the content's bytes as bytes and cannot use it")
        ids += template_ids(before, tok)
        ids += content_ids(messages[i]["content"], tok)
    if nonce in text:
        raise InputError(f"the chat template {where} changes the messages' content; mtpc cannot use it")
    return ids + template_ids(text, tok)


def special_name(tok: ByteTokenizer | SubwordTokenizer, token_id: int) -> str:
    """How a template writes a special token (`<bos>`, `<|endoftext|>`, ...)."""
    if isinstance(tok, SubwordTokenizer):
        return tok.hf.convert_ids_to_tokens(token_id)
    return tok.token_name(token_id)


def content_ids(content: str | bytes, tok: ByteTokenizer | SubwordTokenizer) -> list[int]:
    """A message's content as plain text: its bytes, or its subword tokens (special names read as text)."""
    if isinstance(tok, SubwordTokenizer):
        return tok.encode(content)
    return list(to_bytes(content) if isinstance(content, str) else bytes(content))


def template_ids(text: str, tok: ByteTokenizer | SubwordTokenizer) -> list[int]:
    """The template's own text: special-token names become their ids, the rest its text (`content_ids`)."""
    if isinstance(tok, SubwordTokenizer):
        return _subword_template_ids(text, tok)
    names = {tok.token_name(i): i for i in range(NUM_BYTES, tok.vocab_size)}
    ids: list[int] = []
    start = 0
    while start < len(text):
        cut = text.find("<", start)
        if cut < 0:
            break
        end = text.find(">", cut)
        if end >= 0 and text[cut:end + 1] in names:
            ids += list(to_bytes(text[start:cut])) + [names[text[cut:end + 1]]]
            start = end + 1
        else:
            ids += list(to_bytes(text[start:cut + 1]))
            start = cut + 1
    return ids + list(to_bytes(text[start:]))


def _subword_template_ids(text: str, tok: SubwordTokenizer) -> list[int]:
    """`template_ids` of a subword model: its special names (any spelling) found in one pass, longest first,
    so `<|end|>` is not read as a shorter name it starts with; the text between them tokenized."""
    names = tok.special_names()
    ids: list[int] = []
    start = 0
    pattern = re.compile("|".join(re.escape(n) for n in sorted(filter(None, names), key=len, reverse=True)))
    for found in pattern.finditer(text) if names else ():
        ids += tok.encode(text[start:found.start()]) + [names[found.group()]]
        start = found.end()
    return ids + tok.encode(text[start:])
