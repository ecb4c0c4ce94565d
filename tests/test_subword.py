"""Subword LMs: `mtpc train` on a tokenizer-level model with the head that suits it (tied), refused with
the fix otherwise; `mtpc generate` with that head equal to plain greedy; the KL teacher is the model's
own output logits (Gemma 2's soft-capping); sampling with a tied head is exact (chi-square against
enumeration, a wrong rule caught); `--trust-remote-code` on every command that loads a model."""

import json

import pytest
import torch

from _tiny import family_lm, planted_remote_model, save_subword_llama, write_source_corpus
from circuitc import builders
from mtpc import MTPHead, SpeculativeDecoder
from mtpc.cli import main
from mtpc.sampling import Sampling
from test_decode import PROMPT, VOCAB, AcceptAlways, batched_samples, chi_square_pvalue, exact_joint, speculative_samples, tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread")

SUBWORD_VOCAB = 1000


def save_subword_lm(path, corpus: str) -> str:
    """A random Llama with a 1000-token vocabulary and a byte-level BPE tokenizer trained here on
    `corpus` (nothing downloaded), both saved as a model folder without mtpc_tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<pad>"]
    trainer = trainers.BpeTrainer(vocab_size=SUBWORD_VOCAB, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator([corpus], trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    return save_subword_llama(path, tok, SUBWORD_VOCAB, context=256)


@pytest.fixture
def subword(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_source_corpus(data, parts=4, length=400, overlap=100)
    corpus = "".join(p.read_text() for p in sorted(data.iterdir()))
    return save_subword_lm(tmp_path / "lm", corpus), str(data)


def train_args(model, data, out, *extra):
    return ["train", "--model", model, "--circuit", "examples/cp.pc", "-D", "n=3", "-D", "r=2", "-D",
            f"v={SUBWORD_VOCAB}", "--data", data, "--steps", "2", "--seq-len", "32", "--batch-size", "2",
            "--val-every", "2", "--val-sequences", "1", "--out", str(out), "--no-progress", *extra]


def test_a_subword_lm_with_a_head_that_does_not_suit_it_is_refused_with_the_fix(subword, tmp_path, capsys):
    model, data = subword
    assert main(train_args(model, data, tmp_path / "out", "--parameterisation", "shared")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mtpc: error: ")
    assert "1,000-token vocabulary" in err[0] and "--parameterisation tied" in err[0]
    assert not (tmp_path / "out").exists()


def test_cli_trains_a_tied_head_on_a_subword_lm_and_generates_exactly(subword, tmp_path, capsys):
    from mtpc.heads import load_head
    from mtpc.lm.tokenizer import SubwordTokenizer

    model, data = subword
    out = tmp_path / "head"
    assert main(train_args(model, data, out, "--parameterisation", "tied", "--adapter-rank", "4",
                           "--loss", "nll+kl")) == 0
    printed = capsys.readouterr().out.splitlines()
    first, saved = printed[0], printed[-1]
    assert first.startswith("mtpc train: a tied head for the 1,000-token vocabulary") and "own output layer" in first
    assert saved.startswith(f"saved {out}: 2 steps") and "nan" not in saved  # it once said "nan over 0 windows"
    assert load_head(out).parameterisation == "tied"
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 2 and 0 < log[-1]["loss"] < float("inf")  # subword windows were scored
    assert main(["generate", "def load(", "--model", model, "--head", str(out), "--max-new-tokens", "16",
                 "--compare", "--no-stream"]) == 0
    captured = capsys.readouterr()
    assert "greedy outputs identical: yes" in captured.err
    tok = SubwordTokenizer.load(model, SUBWORD_VOCAB)
    assert captured.out.strip() and tok.decode(tok.encode("def load(")) == "def load("
    assert main(["generate", "def load(", "--model", model, "--head", str(out), "--max-new-tokens", "16"]) == 0
    assert capsys.readouterr().out == captured.out  # streamed text = the text written at the end


def test_subword_documents_are_the_tokenizers_ids(subword):
    from mtpc.lm import loading
    from mtpc.training.data import completion_document, text_document

    model, _ = subword
    tok = loading.model_tokenizer(loading.model_info(model, allow_non_byte_vocab=True))
    assert tok.kind == "subword"
    doc = text_document("x", "def f(x):\n    return x\n".encode(), tok)
    assert doc.tokens.tolist() == [tok.bos_id, *tok.encode("def f(x):\n    return x\n"), tok.eos_id]
    done = completion_document("c", {"prompt": "def f(", "completion": "x): pass"}, tok)
    prompt = len(tok.encode("def f("))
    assert done.mask.tolist() == [False] * (1 + prompt) + [True] * (len(done) - 1 - prompt)


# --------------------------------------------------------------------------- the KL teacher

def test_the_kl_teacher_is_the_models_own_soft_capped_logits():
    """Gemma 2 soft-caps its final logits: the teacher the KL loss reads equals softmax of the model's
    own forward logits (float64), not of the bare LM head."""
    from mtpc.training.trainer_setup import DraftModel

    lm = family_lm("gemma2", 40, final_logit_softcapping=2.0)
    with torch.no_grad():
        lm.get_output_embeddings().weight.mul_(30)  # logits of a few units: the cap at 2 changes them a lot
    head = MTPHead(builders.cp_graph(3, 2, 40), 32, init_from=lm.get_output_embeddings(), parameterisation="tied",
                   dtype=torch.float64)
    module = DraftModel(lm, head, gamma=0.9, chunk_elements=10_000, amp=None, loss="kl")
    tokens = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(18)
    with torch.no_grad():
        h = module.hidden(tokens)
        teacher = module.teacher(tokens, h)(positions)  # [18, V]
        own = lm(tokens).logits.flatten(0, 1)  # [18, V]
        bare = lm.get_output_embeddings()(h).flatten(0, 1)
    torch.testing.assert_close(teacher.softmax(-1), own.softmax(-1), rtol=0, atol=1e-6)
    assert (bare.softmax(-1) - own.softmax(-1)).abs().max() > 1e-2  # the cap is not a no-op here


# --------------------------------------------------------------------------- exact sampling with a tied head

@pytest.mark.slow
def test_sampling_with_a_tied_head_is_exact_and_a_wrong_rule_is_caught():
    """A tied head (the verifier's own output layer behind random adapters and sums) on a 5-token LM:
    3 sampled tokens follow the exact joint (enumeration); keeping every drafted token fails.
    Measured: p = 0.41 for the right rule, 3e-14 for the wrong one."""
    lm = tiny_lm(VOCAB, scale=4.0, seed=11)
    torch.manual_seed(12)
    head = MTPHead(builders.btree_graph(3, 2, VOCAB), 32, init_from=lm.get_output_embeddings(),
                   parameterisation="tied", adapter_rank=2, sum_init_std=0.5, dtype=torch.float64)
    with torch.no_grad():
        for p in head.parameters():  # adapters and sums random: drafts that often disagree with the verifier
            p.normal_(0, 1.0)
    joint = exact_joint(lm, PROMPT, Sampling(1.0))
    right = speculative_samples(SpeculativeDecoder(lm, head), PROMPT, 400, seed=4)
    assert chi_square_pvalue(right, joint) > 1e-3
    wrong = batched_samples(SpeculativeDecoder(lm, head, acceptance=AcceptAlways()), PROMPT, 400, seed=4)
    assert chi_square_pvalue(wrong, joint) < 1e-6


# --------------------------------------------------------------------------- remote code on request

@pytest.mark.parametrize("command", ["train", "generate", "bench", "distill-data"])
def test_every_command_refuses_remote_code_without_the_flag(command, tmp_path, capsys):
    model, marker = planted_remote_model(tmp_path)
    head = tmp_path / "head"
    MTPHead(builders.ff_graph(2, 256), 32).save_pretrained(head)
    data = tmp_path / "data"
    data.mkdir()
    write_source_corpus(data, parts=2, length=300, overlap=0)
    argv = {"train": ["--circuit", "examples/ff.pc", "-D", "n=2", "--steps", "1", "--seq-len", "32", "--data", str(data),
                      "--out", str(tmp_path / "o")],
            "generate": ["hi", "--head", str(head)],
            "bench": ["--heads", str(head), "--corpus", str(data), "--num-prompts", "1", "--repeats", "1"],
            "distill-data": ["--data", str(data), "--out", str(tmp_path / "d.jsonl"), "--num-prompts", "1",
                             "--prompt-len", "8", "--max-new-tokens", "8"]}[command]
    capsys.readouterr()  # the folders' writing progress
    assert main([command, "--model", model, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mtpc: error: ") and "--trust-remote-code" in err[0]
    assert not marker.exists()
    # with the flag, the command gets as far as importing the planted code (which defines no model)
    main([command, "--model", model, "--trust-remote-code", *argv])
    assert marker.exists()
