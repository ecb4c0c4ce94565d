"""The tied head: the LM's own output layer behind hidden-space adapters, referenced and never saved;
exact greedy decoding; the fused loss equals the plain one; `mtpc train --parameterisation tied`."""

import pytest
import torch
from safetensors.torch import load_file

from _tiny import family_lm, save_family_lm, write_source_corpus
from circuitc import builders
from mtpc import MTPHead, SpeculativeDecoder
from mtpc.cli import main
from mtpc.decoding import PlainDecoder
from mtpc.heads import load_head
from mtpc.heads.nll_loss import mtp_loss

V = 40
pytestmark = pytest.mark.usefixtures("one_thread")


def tied_head(model, seed=0, scale=0.5, structure="cp"):
    torch.manual_seed(seed)
    graph = builders.cp_graph(3, 2, V) if structure == "cp" else builders.btree_graph(4, 2, V)
    head = MTPHead(graph, 32, init_from=model.get_output_embeddings(), parameterisation="tied", adapter_rank=3,
                   sum_init_std=0.5, dtype=torch.float64)
    with torch.no_grad():
        head.adapter_up.normal_(0, scale)
    return head


def test_references_the_output_layer_and_saves_only_the_adapters(tmp_path):
    model = family_lm("gpt_neox", V)
    head = tied_head(model)
    weight = model.get_output_embeddings().weight
    assert all(p.data_ptr() != weight.data_ptr() for p in head.parameters())
    Q, a, S, d = head.num_leaves, 3, head.num_sum_params, 32
    assert head.num_weights() == (Q * a + S) * (d + 1) + Q * a * d  # adapters and sums only, no [V, d] table
    h = torch.randn(5, 32, dtype=torch.float64)
    theta = head(h)
    with torch.no_grad():
        weight.mul_(2)  # referenced, not copied: the head sees the change
    assert not torch.allclose(head(h), theta)
    head.save_pretrained(tmp_path / "head")
    assert all(weight.shape != t.shape for t in load_file(tmp_path / "head" / "head.safetensors").values())
    loaded = load_head(tmp_path / "head")
    with pytest.raises(ValueError, match="tie_to"):
        loaded(h)
    torch.testing.assert_close(loaded.tie_to(model.get_output_embeddings())(h), head(h), rtol=0, atol=0)
    # at initialisation (adapters' U zero) every leaf is the LM's own next-token distribution
    fresh = MTPHead(builders.cp_graph(3, 2, V), 32, init_from=model.get_output_embeddings(), parameterisation="tied",
                    dtype=torch.float64)
    torch.testing.assert_close(fresh.input_logits(h), model.get_output_embeddings()(h)[:, None].expand(-1, 6, -1))


@pytest.mark.parametrize("model_type", ["qwen3", "gpt2"])
def test_greedy_speculative_with_a_tied_head_equals_plain_greedy(model_type):
    model = family_lm(model_type, V)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4)
    decoder = SpeculativeDecoder(model, tied_head(model, seed=1))
    gen = torch.Generator().manual_seed(2)
    for budget in (1, 11):
        ids = torch.randint(0, V, (1, 5), generator=gen)
        assert torch.equal(decoder.generate(ids, budget).sequences, PlainDecoder(model).generate(ids, budget).sequences)


def test_fused_loss_equals_the_plain_loss_with_gradients():
    model = family_lm("llama", V)
    head = tied_head(model, structure="btree")
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 12, 32, dtype=torch.float64, generator=gen)
    tokens = torch.randint(0, V, (2, 12), generator=gen)
    doc_ids, mask = torch.zeros_like(tokens), torch.ones_like(tokens, dtype=torch.bool)
    losses, grads = [], []
    for fused in (True, False):
        head.zero_grad()
        out = mtp_loss(head, hidden, tokens, doc_ids, mask, fused=fused, chunk_elements=V * 8)  # blocks of 8 leaves
        out.loss.backward()
        losses.append(out.loss.detach())
        grads.append(head.adapter_up.grad.clone())
    torch.testing.assert_close(losses[0], losses[1])
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.slow
def test_cli_trains_a_tied_head_and_generates_with_it(tmp_path, capsys):
    model = save_family_lm(tmp_path / "lm", "qwen3")
    data = tmp_path / "data"
    data.mkdir()
    write_source_corpus(data, parts=4, length=400, overlap=100)
    out = tmp_path / "head"
    assert main(["train", "--model", model, "--circuit", "examples/cp.pc", "-D", "n=3", "-D", "r=2", "--data",
                 str(data), "--steps", "2", "--seq-len", "32", "--batch-size", "2", "--parameterisation", "tied",
                 "--adapter-rank", "4", "--loss", "nll+kl", "--val-every", "2", "--val-sequences", "1", "--out",
                 str(out), "--no-progress"]) == 0
    assert load_head(out).parameterisation == "tied"
    capsys.readouterr()
    texts = []
    for head in (["--head", str(out)], []):
        assert main(["generate", "def ", "--model", model, "--max-new-tokens", "12", "--no-stream", *head]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1]
