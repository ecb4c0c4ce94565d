"""vLLM's OpenAI-compatible server started by `mtpc serve` on the loopback address, with a head drafting and
plainly, answering real HTTP requests (completion and chat, streamed and not): greedy text identical to plain
vLLM's and to mtpc's own greedy decoding; and a GGUF exported by `mtpc export-hf` served by vLLM as
transformers decodes it.

Needs vLLM (skipped without it). One server at a time, each on one core (`VLLM_CPU_OMP_THREADS_BIND=0`),
eager, 512 positions; every wait is bounded in count and in time, and every server is stopped (terminated,
waited for, killed with its process group if it lingers)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parent.parent
BYTE_LM = ROOT / "models" / "byte-lm"
HEAD = ROOT / "models" / "heads" / "ff8"
HOST = "127.0.0.1"
MAX_TOKENS = 48
ENGINE = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "512"]
ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
START_SECONDS = 420  # an engine starts in ~45 s on this 2-core machine when it is quiet
POLL_SECONDS = 0.5
MAX_POLLS = int(START_SECONDS / POLL_SECONDS)
REQUEST_SECONDS = 120
MAX_STREAM_EVENTS = 4 * MAX_TOKENS + 16  # a token per event at most, a role event, a usage event, [DONE]
STOP_SECONDS = 60

COMPLETION_PROMPT = "def parse_args(argv):\n    parser = "
CHAT_MESSAGE = "Write a function that reverses a list."


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Server:
    """`mtpc serve ...` in its own process group, its output in `log`; `url` once /health answers."""

    def __init__(self, args: list[str], log: Path):
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.log = log
        command = [sys.executable, "-m", "mtpc.cli", "serve", *args, "--host", HOST, "--port", str(self.port),
                   "--", *ENGINE]
        with open(log, "wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                            env={**os.environ, **ENV}, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        for _ in range(MAX_POLLS):
            if self.process.poll() is not None:
                pytest.fail(f"the server exited with {self.process.returncode}:\n{self.output()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                break
            time.sleep(POLL_SECONDS)
        pytest.fail(f"no answer from {self.url}/health in {START_SECONDS} s:\n{self.output()[-4000:]}")

    def stop(self) -> None:
        """SIGTERM (vLLM shuts its engine down), then SIGKILL to the whole group if anything lingers."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # the engine core process, if it outlived the server
        self.process.wait(timeout=STOP_SECONDS)


@contextlib.contextmanager
def serving(args: list[str], log: Path):
    server = Server(args, log)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=REQUEST_SECONDS) as response:
        return json.loads(response.read())


def post_streamed(url: str, body: dict) -> list[dict]:
    """The server-sent events of a streamed request, `[DONE]` left out; at most `MAX_STREAM_EVENTS`."""
    request = urllib.request.Request(url, json.dumps({**body, "stream": True}).encode(),
                                     {"Content-Type": "application/json"})
    events = []
    deadline = time.monotonic() + REQUEST_SECONDS
    with urllib.request.urlopen(request, timeout=REQUEST_SECONDS) as response:
        for _ in range(4 * MAX_STREAM_EVENTS):  # events and the blank lines between them
            line = response.readline()
            if not line or time.monotonic() > deadline:
                break
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return events
            events.append(json.loads(line[len("data: "):]))
        pytest.fail(f"the stream ended without [DONE] after {len(events)} events")


def ask(server: Server) -> dict:
    """Every request of the test against one server: {name: (text, token ids or None, prompt ids)}."""
    with urllib.request.urlopen(f"{server.url}/v1/models", timeout=REQUEST_SECONDS) as response:
        name = json.loads(response.read())["data"][0]["id"]
    common = {"model": name, "max_tokens": MAX_TOKENS, "temperature": 0}
    completion = {**common, "prompt": COMPLETION_PROMPT}
    chat = {**common, "messages": [{"role": "user", "content": CHAT_MESSAGE}]}
    answers = {}
    done = post(f"{server.url}/v1/completions", {**completion, "return_token_ids": True})
    choice = done["choices"][0]
    answers["completion"] = (choice["text"], choice["token_ids"], choice["prompt_token_ids"])
    events = post_streamed(f"{server.url}/v1/completions", completion)
    answers["completion, streamed"] = ("".join(e["choices"][0]["text"] for e in events if e["choices"]), None, None)
    done = post(f"{server.url}/v1/chat/completions", {**chat, "return_token_ids": True})
    choice = done["choices"][0]
    answers["chat"] = (choice["message"]["content"], choice["token_ids"], done["prompt_token_ids"])
    events = post_streamed(f"{server.url}/v1/chat/completions", chat)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    answers["chat, streamed"] = (text, None, None)
    return answers


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    """The same requests to a plain server, then to one with the ff8 head (one engine at a time)."""
    logs = tmp_path_factory.mktemp("servers")
    with serving(["--model", str(BYTE_LM)], logs / "plain.log") as plain:
        plain_answers = ask(plain)
        plain_output = plain.output()
    with serving(["--model", str(BYTE_LM), "--head", str(HEAD)], logs / "head.log") as headed:
        head_answers = ask(headed)
        head_output = headed.output()
    return {"plain": plain_answers, "head": head_answers, "plain log": plain_output, "head log": head_output}


def mtpc_greedy(prompt_ids: list[int]) -> list[int]:
    """mtpc's own plain greedy decoding of the byte LM, up to and with its first EOS."""
    from mtpc import PlainDecoder
    from mtpc.lm import loading

    model, _ = loading.open_model(BYTE_LM)
    eos = model.config.eos_token_id
    out = PlainDecoder(model).generate(torch.tensor([prompt_ids]), MAX_TOKENS, eos_token_id=eos)
    new = out.sequences[0, len(prompt_ids):].tolist()
    return new[: new.index(eos) + 1] if eos in new else new


def test_the_printed_command_is_vllms_server_with_the_heads_options(answers):
    from mtpc import vllm_options

    line = next(l for l in answers["head log"].splitlines() if l.startswith("mtpc: running "))
    options = vllm_options(HEAD, model=BYTE_LM)
    assert " -m vllm.entrypoints.launchers.api_server.entry --model " in line and f"--host {HOST}" in line
    assert f"--speculative-config '{json.dumps(options['speculative_config'], sort_keys=True)}'" in line
    assert f"--additional-config '{json.dumps(options['additional_config'], sort_keys=True)}'" in line
    plain = next(l for l in answers["plain log"].splitlines() if l.startswith("mtpc: running "))
    assert "--speculative-config" not in plain and "--additional-config" not in plain


@pytest.mark.parametrize("request_name", ["completion", "chat"])
def test_greedy_text_through_the_server_equals_plain_vllm_and_mtpc(answers, request_name):
    from transformers import AutoTokenizer

    text, ids, prompt_ids = answers["head"][request_name]
    plain_text, plain_ids, plain_prompt = answers["plain"][request_name]
    assert prompt_ids == plain_prompt and text and ids
    assert ids == plain_ids and text == plain_text  # the head changed nothing
    expected = mtpc_greedy(prompt_ids)
    assert ids == expected
    assert text == AutoTokenizer.from_pretrained(str(BYTE_LM)).decode(ids, skip_special_tokens=True)
    if request_name == "completion":
        assert prompt_ids == list(COMPLETION_PROMPT.encode())  # the byte LM's tokenizer: ids are bytes


@pytest.mark.parametrize("request_name", ["completion", "chat"])
def test_streamed_text_equals_the_whole_answer(answers, request_name):
    for server in ("plain", "head"):
        assert answers[server][f"{request_name}, streamed"][0] == answers[server][request_name][0], server


def test_vllm_serves_an_exported_gguf_as_transformers_decodes_it(tmp_path, monkeypatch):
    """A tiny Llama written as a GGUF, exported by `mtpc export-hf` and served plainly: the completion's greedy
    tokens are transformers' greedy tokens on the exported folder, which holds the weights mtpc decodes the GGUF
    with (tests/test_export_hf.py). Its heads are 32 wide: vLLM's CPU attention has no kernel for the tests'
    usual tiny Llama's 8, which `mtpc serve` refuses (the next test)."""
    pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM

    from _gguf import tiny_bpe, tiny_llama, write_gguf
    from mtpc.cli import main

    monkeypatch.setenv("MTPC_CACHE_DIR", str(tmp_path / "cache"))
    tok = tiny_bpe()
    file = write_gguf(tmp_path / "tiny.gguf", tiny_llama(tok, seed=3, context=512, hidden=64, heads=2), tok)
    out = tmp_path / "tiny-hf"
    assert main(["export-hf", "--model", str(file), "--out", str(out)]) == 0
    prompt_ids = tok.encode("def collate(items):\n    return")
    with serving(["--model", str(out)], tmp_path / "tiny.log") as server:
        with urllib.request.urlopen(f"{server.url}/v1/models", timeout=REQUEST_SECONDS) as response:
            name = json.loads(response.read())["data"][0]["id"]
        answer = post(f"{server.url}/v1/completions", {"model": name, "prompt": prompt_ids, "max_tokens": 24,
                                                       "temperature": 0, "return_token_ids": True})
    ids = answer["choices"][0]["token_ids"]
    model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    expected = model.generate(torch.tensor([prompt_ids]), max_new_tokens=24, do_sample=False,
                              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)[0, len(prompt_ids):]
    assert ids == expected.tolist()[: len(ids)] and len(ids) >= 1
    assert len(ids) == 24 or ids[-1] == tok.eos_token_id


def test_a_model_vllm_cannot_run_or_a_head_that_does_not_fit_is_one_line(tmp_path, capsys):
    """Refused before any engine starts: an architecture vLLM's registry lacks, and a head built for another
    model's hidden size."""
    import shutil

    from mtpc.cli import main

    folder = tmp_path / "lm"
    shutil.copytree(BYTE_LM, folder, ignore=shutil.ignore_patterns("train_log.jsonl"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    assert main(["serve", "--model", str(folder), "--port", str(free_port())]) == 2
    captured = capsys.readouterr()
    assert "has no model for NoSuchForCausalLM" in captured.err and "mtpc: running" not in captured.out
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 128, "head_dim": 32}))
    assert main(["serve", "--model", str(folder), "--head", str(HEAD), "--port", str(free_port())]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "hidden size 192" in lines[0] and "mtpc: running" not in captured.out


def test_a_head_size_vllms_cpu_attention_lacks_is_refused_before_the_server_starts(tmp_path, monkeypatch, capsys):
    """The tests' usual tiny Llama (d = 32, 4 heads of 8) exported from its GGUF: vLLM 0.32's CPU server would
    start and then fail every request (`Unsupported CPU attention configuration: head_dim=8`); `mtpc serve` says
    so in one line, and serves the 32-wide export of the previous test's kind."""
    pytest.importorskip("gguf")
    from vllm.platforms import current_platform

    from _gguf import tiny_bpe, tiny_llama, write_gguf
    from mtpc.cli import main

    if not current_platform.is_cpu():
        pytest.skip("vLLM's GPU attention runs other head sizes")
    monkeypatch.setenv("MTPC_CACHE_DIR", str(tmp_path / "cache"))
    tok = tiny_bpe()
    for name, sizes in {"narrow": {}, "wide": {"hidden": 64, "heads": 2}}.items():
        file = write_gguf(tmp_path / f"{name}.gguf", tiny_llama(tok, context=512, **sizes), tok)
        assert main(["export-hf", "--model", str(file), "--out", str(tmp_path / name)]) == 0
    capsys.readouterr()
    assert main(["serve", "--model", str(tmp_path / "narrow"), "--port", str(free_port())]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "attention heads are 8 wide" in lines[0] and "mtpc: running" not in captured.out
    from mtpc.cli.serve import check_cpu_attention

    check_cpu_attention(tmp_path / "wide")  # the control: 32 wide passes
    check_cpu_attention(BYTE_LM)  # 48 wide: not in vLLM's own list of head sizes, but its kernels run it
