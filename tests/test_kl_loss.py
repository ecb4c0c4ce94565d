"""The distillation (KL) loss against brute-force enumeration, fused vs naive, and its effect."""

import itertools

import pytest
import torch

from circuitc import builders
from circuitc import compile as compile_circuit
from mtpc.heads.head import MTPHead
from mtpc.heads.kl_loss import kl_loss, lm_teacher, logits_teacher, window_elements
from mtpc.heads.nll_loss import mtp_loss, valid_counts, window_validity

GRAPHS = {"btree": builders.btree_graph(3, 2, 4), "hmm": builders.hmm_graph(3, 2, 4), "ff": builders.ff_graph(3, 4),
          "cp": builders.cp_graph(4, 3, 4)}
V_LM = 6  # the toy LM's vocabulary: 4 "bytes" + 2 specials


def make_head(graph, d=5, seed=0, dtype=torch.float64, parameterisation="full"):
    torch.manual_seed(seed)
    head = MTPHead(compile_circuit(graph), d, sum_init_std=0.7, dtype=dtype, parameterisation=parameterisation)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return head


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 5, (2, 9), generator=g)  # id 4 is a special token: summed out
    doc_ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1], [2, 2, 2, 2, 2, 2, 2, -1, -1]])
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 1, 1], [1, 1, 0, 1, 1, 0, 1, 0, 0]], dtype=torch.bool)
    logits = 2 * torch.randn(2, 9, V_LM, generator=g, dtype=torch.float64)
    return tokens, doc_ids, mask, logits


def brute_force_kl(head, hidden, logits, tokens, doc_ids, mask, gamma, divergence="kl", first_given=False):
    """Eq. 5 with KL (or total variation) terms, every conditional by enumerating the circuit's joint
    over all v^n windows. `first_given`: the head reads `tokens[t + 1]`'s embedding, position 1 unscored."""
    circ, n, v = head.circ, head.num_variables, head.num_states
    B, T = tokens.shape
    grid = torch.tensor(list(itertools.product(range(v), repeat=n)))  # [v^n, n]
    sums, counts = [0.0] * n, [0] * n
    for b in range(B):
        for t in range(T):
            valid = [t + j < T and doc_ids[b, t + j] == doc_ids[b, t] and doc_ids[b, t] >= 0
                     and bool(mask[b, t + j]) and int(tokens[b, t + j]) < v for j in range(1, n + 1)]
            if not any(valid):
                continue
            h = hidden[b, t]
            if first_given and t + 1 < T:
                h = h + head.first_embedding[min(int(tokens[b, t + 1]), v - 1)]
            joint = circ.log_prob(grid, head(h).detach()).exp()  # [v^n]
            for j in range(n):
                if not valid[j]:
                    continue
                match = torch.ones(len(grid), dtype=torch.bool)
                for i in range(j):
                    if valid[i]:
                        match &= grid[:, i] == int(tokens[b, t + 1 + i])
                q = torch.stack([joint[match & (grid[:, j] == s)].sum() for s in range(v)])
                q = q / q.sum()
                p = logits[b, t + j, :v].softmax(-1)
                if divergence == "kl":
                    sums[j] += float((p * (p.log() - q.log())).sum())
                else:
                    sums[j] += float((p - q).abs().sum() / 2)
                counts[j] += 1
    return sum(gamma ** j * sums[j] / max(1, counts[j]) for j in range(int(first_given), n)), counts


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("fused", [True, False])
def test_kl_equals_brute_force_enumeration(name, fused):
    head = make_head(GRAPHS[name])
    tokens, doc_ids, mask, logits = batch()
    hidden = torch.randn(2, 9, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out = kl_loss(head, hidden, logits_teacher(logits), tokens, doc_ids, mask, gamma=0.8, fused=fused,
                  chunk_elements=64)
    expect, counts = brute_force_kl(head, hidden, logits, tokens, doc_ids, mask, 0.8)
    assert out.counts.tolist() == counts
    assert out.loss.item() == pytest.approx(expect, rel=1e-9, abs=1e-12)
    assert (out.term_sums >= 0).all() and out.loss.item() > 0


@pytest.mark.parametrize("name", ["btree", "cp"])
@pytest.mark.parametrize("fused", [True, False])
def test_total_variation_equals_brute_force_and_its_gradient_matches_the_reference(name, fused):
    head = make_head(GRAPHS[name])
    tokens, doc_ids, mask, logits = batch(seed=2)
    hidden = torch.randn(2, 9, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    out = kl_loss(head, hidden, logits_teacher(logits), tokens, doc_ids, mask, gamma=0.8, fused=fused,
                  chunk_elements=64, divergence="tv")
    expect, _ = brute_force_kl(head, hidden, logits, tokens, doc_ids, mask, 0.8, divergence="tv")
    assert out.loss.item() == pytest.approx(expect, rel=1e-9, abs=1e-12)
    assert ((out.term_sums >= 0) & (out.term_sums <= out.counts)).all()  # each term is in [0, 1]
    grads = torch.autograd.grad(out.loss, list(head.parameters()))
    reference = kl_loss(head, hidden, logits_teacher(logits), tokens, doc_ids, mask, gamma=0.8, fused=False,
                        divergence="tv")
    for got, want in zip(grads, torch.autograd.grad(reference.loss, list(head.parameters()))):
        assert torch.allclose(got, want, rtol=1e-7, atol=1e-10)
    assert any(g.abs().sum() > 0 for g in grads)
    with pytest.raises(ValueError, match="divergence must be one of"):
        kl_loss(head, hidden, logits_teacher(logits), tokens, doc_ids, mask, divergence="js")


@pytest.mark.parametrize("fused", [True, False])
def test_kl_of_a_head_reading_the_first_token_equals_brute_force(fused):
    head = make_head(GRAPHS["btree"]).read_first_token()
    with torch.no_grad():
        head.first_embedding.normal_(0, 1, generator=torch.Generator().manual_seed(4))
    tokens, doc_ids, mask, logits = batch(seed=5)
    hidden = torch.randn(2, 9, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    read = head.with_first_token(hidden, torch.cat([tokens[:, 1:], tokens[:, -1:]], 1))
    out = kl_loss(head, read, logits_teacher(logits), tokens, doc_ids, mask, gamma=0.8, fused=fused,
                  chunk_elements=64, first_given=True)
    expect, counts = brute_force_kl(head, hidden, logits, tokens, doc_ids, mask, 0.8, first_given=True)
    assert out.counts.tolist() == counts and out.loss.item() == pytest.approx(expect, rel=1e-9, abs=1e-12)
    assert torch.autograd.grad(out.loss, head.first_embedding)[0].abs().sum() > 0


def test_kl_is_zero_when_the_head_is_the_teacher():
    """An FF head whose leaves are exactly the teacher's per-position distributions (hidden = one-hot
    positions picks them out): every KL term is 0."""
    n, v = 3, 4
    tokens, doc_ids, mask, _ = batch()
    B, T = tokens.shape
    table = torch.randn(B * T + n, v, dtype=torch.float64)  # the teacher's byte logits at every flat position
    hidden = torch.eye(B * T, dtype=torch.float64).view(B, T, B * T)  # one-hot flat positions
    head = MTPHead(compile_circuit(builders.ff_graph(n, v)), B * T, dtype=torch.float64)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        for j in range(n):  # leaf j of window t = teacher at flat position t + j
            head.weight[j * v:(j + 1) * v, : B * T - j] = table[j:B * T].t()
    logits = torch.cat([table[:B * T], torch.zeros(B * T, V_LM - v, dtype=torch.float64)], 1).view(B, T, V_LM)
    out = kl_loss(head, hidden, logits_teacher(logits), tokens, doc_ids, mask)
    assert out.counts.sum() > 0
    assert out.loss.item() == pytest.approx(0.0, abs=1e-12)


def test_global_normalizer_makes_micro_batches_add_up():
    head = make_head(GRAPHS["btree"])
    tokens, doc_ids, mask, logits = batch()
    hidden = torch.randn(2, 9, 5, dtype=torch.float64)
    whole = kl_loss(head, hidden, logits_teacher(logits), tokens, doc_ids, mask)
    total = valid_counts(doc_ids, mask, tokens, 3, 4)
    parts = sum(kl_loss(head, hidden[i:i + 1], logits_teacher(logits[i:i + 1]), tokens[i:i + 1], doc_ids[i:i + 1],
                        mask[i:i + 1], normalizer=total).loss for i in range(2))
    assert parts.item() == pytest.approx(whole.loss.item(), rel=1e-12)


@pytest.mark.parametrize("parameterisation", ["full", "shared"])
@pytest.mark.parametrize("chunk_elements", [1, 300, 1 << 22])
def test_fused_and_naive_give_the_same_loss_and_gradients(parameterisation, chunk_elements):
    head = make_head(builders.btree_graph(4, 3, 4), d=6, dtype=torch.float32, parameterisation=parameterisation)
    tokens, doc_ids, mask, logits = batch(seed=3)
    hidden = torch.randn(2, 9, 6, requires_grad=True)
    results = []
    for fused in (True, False):
        head.zero_grad()
        hidden.grad = None
        out = kl_loss(head, hidden, logits_teacher(logits.float()), tokens, doc_ids, mask, fused=fused,
                      chunk_elements=chunk_elements)
        out.loss.backward()
        results.append([out.loss.detach(), hidden.grad.clone()] + [p.grad.clone() for p in head.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert all(g.abs().sum() > 0 for g in results[0][1:])


def test_kl_gradient_matches_finite_differences():
    head = make_head(GRAPHS["hmm"], seed=2)
    tokens, doc_ids, mask, logits = batch(seed=5)
    hidden = torch.randn(2, 9, 5, dtype=torch.float64, requires_grad=True)

    def f(h):
        return kl_loss(head, h, logits_teacher(logits), tokens, doc_ids, mask, chunk_elements=50).loss

    assert torch.autograd.gradcheck(f, (hidden,), eps=1e-6, atol=1e-6, fast_mode=True)


def test_chunking_bounds_the_block_size():
    """Every block's leaf logits fit the budget: the fused path never builds [N, Q, v] at once."""
    seen = []

    class Recording(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            for k in ("circ", "num_leaves", "num_states", "num_variables"):
                setattr(self, k, getattr(inner, k))

        def input_logits(self, h, leaves=slice(None)):
            seen.append(h.shape[0])
            return self.inner.input_logits(h, leaves=leaves)

        def sum_logits(self, h):
            return self.inner.sum_logits(h)

    head = make_head(builders.btree_graph(4, 3, 4), d=6)
    tokens, doc_ids, mask, logits = batch()
    hidden = torch.randn(2, 9, 6, dtype=torch.float64)
    budget = 4 * window_elements(head)  # four windows per block
    a = kl_loss(Recording(head), hidden, logits_teacher(logits), tokens, doc_ids, mask, chunk_elements=budget)
    b = kl_loss(head, hidden, logits_teacher(logits), tokens, doc_ids, mask, fused=False)
    windows = int(window_validity(tokens, doc_ids, mask, 4, 4).any(-1).sum())
    assert max(seen) == 4 and sum(seen) == windows
    assert a.loss.item() == pytest.approx(b.loss.item(), rel=1e-10)


def test_no_window_gives_a_zero_loss_with_gradients():
    head = make_head(GRAPHS["ff"])
    tokens, doc_ids, _, logits = batch()
    hidden = torch.randn(2, 9, 5, dtype=torch.float64)
    out = kl_loss(head, hidden, logits_teacher(logits), tokens, doc_ids, torch.zeros_like(tokens, dtype=torch.bool))
    out.loss.backward()
    assert out.loss.item() == 0.0 and head.weight.grad is not None


def test_nll_and_kl_agree_on_what_they_count():
    head = make_head(GRAPHS["cp"])
    tokens, doc_ids, mask, logits = batch()
    hidden = torch.randn(2, 9, 5, dtype=torch.float64)
    nll = mtp_loss(head, hidden, tokens, doc_ids, mask)
    kl = kl_loss(head, hidden, logits_teacher(logits), tokens, doc_ids, mask)
    assert nll.counts.tolist() == kl.counts.tolist()


def test_bf16_autocast_with_an_lm_head_teacher_stays_close():
    """Under autocast the draft hidden states arrive in bf16; the teacher still runs in float32."""
    head = make_head(builders.btree_graph(4, 3, 4), d=6, dtype=torch.float32)
    tokens, doc_ids, mask, _ = batch(seed=3)
    hidden = torch.randn(2, 9, 6)
    lm_head = torch.nn.Linear(6, V_LM, bias=False)
    exact = kl_loss(head, hidden, lm_teacher(lm_head, hidden), tokens, doc_ids, mask).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low_h = hidden.bfloat16()
        low = kl_loss(head, low_h, lm_teacher(lm_head, low_h), tokens, doc_ids, mask).loss
    assert low.dtype == torch.float32 and low.item() == pytest.approx(exact.item(), rel=3e-2)
