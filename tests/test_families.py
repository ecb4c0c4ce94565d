"""Every decoder family: the whole-model path (lora_layers=0) and the split loop's adapters reproduce
the model's own forward, greedy speculative decoding equals plain greedy, one training step runs,
and (slow) `mtpc train` / `generate` / `bench` run end to end on byte-level models of three families."""

import json

import pytest
import torch

from _tiny import (FAMILY_CONFIGS, family_lm, planted_remote_model, random_lora, save_family_lm,
                   write_source_corpus)
from circuitc import builders
from mtpc import MTPHead, SpeculativeDecoder
from mtpc.cli import main
from mtpc.lm.backbone import SplitBackbone
from mtpc.decoding import PlainDecoder
from mtpc.lm.families import FAMILIES, WholeModelPath
from mtpc.training.trainer import DraftModel

FAMILY_TYPES = list(FAMILY_CONFIGS)
V = 40

pytestmark = pytest.mark.usefixtures("one_thread")




def chunked(backbone, ids, chunks, crop_to=None):
    """Feed `ids` in pieces (cropping back `crop_to` tokens after the first piece and refeeding them)."""
    state, logits, hidden, start = backbone.new_state(), [], [], 0
    for size in chunks:
        out = backbone(ids[:, start:start + size], state)
        logits.append(out.logits)
        hidden.append(out.hidden)
        start += size
    return torch.cat(logits, 1), torch.cat(hidden, 1), state


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_whole_model_path_equals_the_models_forward(model_type):
    model = family_lm(model_type, V)
    backbone = SplitBackbone(model, family=WholeModelPath())  # families with an adapter default to the loop
    assert backbone.whole_model
    ids = torch.randint(0, V, (1, 13), generator=torch.Generator().manual_seed(0))
    expected = model(ids, output_hidden_states=True)
    logits, hidden, state = chunked(backbone, ids, [6, 4, 3])
    torch.testing.assert_close(logits, expected.logits, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(hidden, expected.hidden_states[-1], rtol=1e-6, atol=1e-6)
    backbone.crop(state, 8)  # a rejection: the cache forgets the last 5 tokens, positions follow
    again = backbone(ids[:, 8:], state)
    torch.testing.assert_close(again.logits, expected.logits[:, 8:], rtol=1e-6, atol=1e-6)
    assert backbone.hidden_size == 32 and backbone.vocab_size == V


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_split_loop_with_lora_equals_the_models_own_forward(model_type):
    """The verifier is the base model and the draft path the adapted model, layer loop against the
    family's forward, to 1e-6 in float64 (chunks, a crop and a refeed included)."""
    model = family_lm(model_type, V)
    ids = torch.randint(0, V, (1, 12), generator=torch.Generator().manual_seed(1))
    base_logits = model(ids).logits
    for k in (1, 3):
        peft_model = random_lora(model, k)
        adapted = peft_model(input_ids=ids).logits
        assert (adapted - base_logits).abs().max() > 1e-3  # the adapters really change the model
        backbone = SplitBackbone(peft_model, lora_layers=k)
        logits, hidden, state = chunked(backbone, ids, [5, 4, 3])
        torch.testing.assert_close(logits, base_logits, rtol=1e-6, atol=1e-6)
        draft_logits = backbone.family.logits(backbone.config, backbone.parts, hidden)
        torch.testing.assert_close(draft_logits, adapted, rtol=1e-6, atol=1e-6)
        backbone.crop(state, 7)
        torch.testing.assert_close(backbone(ids[:, 7:], state).logits, base_logits[:, 7:], rtol=1e-6, atol=1e-6)
        model = peft_model.unload()  # the next k starts from the bare model again


def greedy_head(model_type, vocab, seed):
    torch.manual_seed(seed)
    head = MTPHead(builders.cp_graph(3, 2, vocab), 32, sum_init_std=0.5, dtype=torch.float64)
    with torch.no_grad():
        head.weight.mul_(8)
    return head


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_greedy_speculative_equals_plain_greedy(model_type):
    model = family_lm(model_type, V)
    with torch.no_grad():  # a decided verifier: no float near-ties between greedy choices
        model.get_output_embeddings().weight.mul_(4)
    decoder = SpeculativeDecoder(model, greedy_head(model_type, V, seed=2))
    gen = torch.Generator().manual_seed(3)
    for budget in (1, 9):
        ids = torch.randint(0, V, (1, 4), generator=gen)
        plain = PlainDecoder(model).generate(ids, budget).sequences
        theirs = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=budget, do_sample=False,
                                pad_token_id=V - 1)
        assert torch.equal(plain, theirs)
        assert torch.equal(decoder.generate(ids, budget).sequences, plain)


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_one_training_step(model_type):
    """The trainer's draft hidden states are the decoder's, and one NLL+KL step moves the head."""
    model = family_lm(model_type, V, dtype=torch.float32)
    model.requires_grad_(False)
    head = MTPHead(builders.cp_graph(3, 2, V), 32, init_from=model.get_output_embeddings().weight, sum_init_std=0.1)
    draft = DraftModel(model, head, gamma=0.9, chunk_elements=1 << 16, amp=None, loss="nll+kl")
    tokens = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(4))
    hidden = draft.hidden(tokens)
    torch.testing.assert_close(hidden[:, -1:], SplitBackbone(model)(tokens, SplitBackbone(model).new_state(),
                                                                      keep=1).hidden)
    loss, _, counts = draft(tokens, torch.zeros_like(tokens), torch.ones_like(tokens, dtype=torch.bool),
                            normalizer=None)
    loss.backward()
    assert torch.isfinite(loss) and counts.sum() > 0
    assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0
    before = head.weight.detach().clone()
    torch.optim.AdamW(head.parameters(), lr=1e-2).step()
    assert not torch.equal(head.weight, before)


def test_a_total_variation_training_step():
    """`loss="tv"`: the trainer's loss is the total variation against the model's own conditionals (each
    window position's term in [0, 1]), and one step moves the head."""
    from mtpc.heads.kl_loss import kl_loss

    model = family_lm("llama", V, dtype=torch.float32)
    model.requires_grad_(False)
    head = MTPHead(builders.cp_graph(3, 2, V), 32, init_from=model.get_output_embeddings().weight, sum_init_std=0.1)
    draft = DraftModel(model, head, gamma=0.9, chunk_elements=1 << 16, amp=None, loss="tv")
    tokens = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(4))
    docs, mask = torch.zeros_like(tokens), torch.ones_like(tokens, dtype=torch.bool)
    loss, sums, counts = draft(tokens, docs, mask, normalizer=None)
    hidden = draft.hidden(tokens)
    direct = kl_loss(head, hidden, draft.teacher(tokens, hidden), tokens, docs, mask, gamma=0.9, divergence="tv")
    torch.testing.assert_close(loss, direct.loss)
    assert ((sums >= 0) & (sums <= counts)).all() and counts.sum() > 0
    loss.backward()
    before = head.weight.detach().clone()
    torch.optim.AdamW(head.parameters(), lr=1e-2).step()
    assert not torch.equal(head.weight, before)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["gpt2", "gemma2", "gpt_neox"])
def test_cli_train_generate_bench_end_to_end(model_type, tmp_path, capsys):
    model = save_family_lm(tmp_path / "lm", model_type)
    data = tmp_path / "data"
    data.mkdir()
    write_source_corpus(data, parts=4, length=400, overlap=100)
    for k, head in ((0, tmp_path / "head"), (1, tmp_path / "head_lora")):
        assert main(["train", "--model", model, "--circuit", "examples/cp.pc", "-D", "n=3", "-D", "r=2",
                     "--data", str(data), "--steps", "2", "--seq-len", "32", "--batch-size", "2",
                     "--lora-layers", str(k), "--val-every", "2", "--val-sequences", "1", "--out", str(head),
                     "--no-progress"]) == 0
        assert (head / "head.safetensors").is_file() and (k == 0 or (head / "lora" / "adapter_config.json").is_file())
    capsys.readouterr()
    texts = []
    for head in ("head", "head_lora", None):
        assert main(["generate", "def ", "--model", model, "--max-new-tokens", "12", "--no-stream",
                     *(["--head", str(tmp_path / head)] if head else [])]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] == texts[2]  # greedy: speculative (both paths) == plain
    bench, prompts = tmp_path / "bench", tmp_path / "prompts.txt"
    prompts.write_text("def load(path):\nimport torch\n")
    assert main(["bench", "--model", model, "--heads", str(tmp_path / "head"), str(tmp_path / "head_lora"),
                 "--prompts", str(prompts), "--num-prompts", "2", "--max-new-tokens", "8",
                 "--repeats", "1", "--out", str(bench), "--device", "cpu", "--no-progress", "--threads", "1"]) == 0
    report = json.loads((bench / "bench.json").read_text())
    assert report["greedy_identical"] is True and len(report["heads"]) == 2


def test_model_info_accepts_every_decoder_family_and_refuses_others(tmp_path):
    from mtpc.lm import loading
    from mtpc.errors import InputError

    gpt2 = loading.model_info(save_family_lm(tmp_path / "gpt2", "gpt2"))
    assert (gpt2.model_type, gpt2.hidden_size, gpt2.byte_level) == ("gpt2", 32, True)  # n_embd read as hidden_size
    t5 = tmp_path / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 32, "vocab_size": 300,
                                                "is_encoder_decoder": True}))
    with pytest.raises(InputError, match="'t5' is not a decoder-only causal LM"):
        loading.model_info(t5)


def test_remote_code_never_runs_without_the_flag(tmp_path, capsys):
    """A folder whose config names its own modelling code is refused (library and CLI) before any of
    that code is imported; the planted module would write a file the moment it ran."""
    from mtpc.lm import loading
    from mtpc.errors import InputError

    folder, ran = planted_remote_model(tmp_path)
    with pytest.raises(InputError, match="custom modelling code.*--trust-remote-code"):
        loading.open_model(folder)
    assert main(["train", "--model", folder, "--circuit", "examples/ff.pc", "-D", "n=2", "--steps", "1",
                 "--out", str(tmp_path / "out")]) == 2
    assert "--trust-remote-code" in capsys.readouterr().err
    assert not ran.exists()
    with pytest.raises(Exception):  # with the flag the planted code is imported (and here fails to define a model)
        loading.open_model(folder, trust_remote_code=True)
    assert ran.exists()
