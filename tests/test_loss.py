"""The windowed MTP loss against brute force, masking/document boundaries, fused vs naive."""

import pytest
import torch

from circuitc import builders
from mtpc.heads.head import MTPHead
from mtpc.heads.nll_loss import mtp_loss, teacher_forced_accepted, valid_counts


def compiled(graph):
    from circuitc import compile as compile_circuit

    return compile_circuit(graph)


def make_head(graph, d=5, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    head = MTPHead(compiled(graph), d, sum_init_std=0.7, dtype=dtype)
    with torch.no_grad():
        head.bias.normal_(0, 0.5)
    return head


def brute_force_loss(head, hidden, tokens, doc_ids, mask, gamma, first_given=False):
    """Eq. 5 term by term from `log_marginal` with explicit keep masks (no shared helpers). `first_given`:
    the head reads the window's first token (its embedding added to `hidden`) and position 1 is not scored."""
    circ, n, v = head.circ, head.num_variables, head.num_states
    B, T = tokens.shape
    sums, counts = [0.0] * n, [0] * n
    for b in range(B):
        for t in range(T):
            valid = []
            for j in range(1, n + 1):
                s = t + j
                valid.append(s < T and doc_ids[b, s] == doc_ids[b, t] and doc_ids[b, t] >= 0
                             and bool(mask[b, s]) and int(tokens[b, s]) < v)
            if not any(valid):
                continue
            x = torch.tensor([[int(tokens[b, t + j]) if valid[j - 1] else 0 for j in range(1, n + 1)]])
            h = hidden[b, t]
            if first_given and t + 1 < T:
                h = h + head.first_embedding[min(int(tokens[b, t + 1]), v - 1)]
            theta = head(h)
            for j in range(n):
                if not valid[j]:
                    continue
                keep_now = torch.tensor(valid[: j + 1] + [False] * (n - j - 1))
                keep_before = torch.tensor(valid[:j] + [False] * (n - j))
                before = circ.log_marginal(x, keep_before, theta)[0].detach() if keep_before.any() else 0.0
                sums[j] += float(circ.log_marginal(x, keep_now, theta)[0].detach() - before)
                counts[j] += 1
    return -sum(gamma ** j * sums[j] / max(1, counts[j]) for j in range(int(first_given), n)), counts


def batch(seed=0, B=2, T=9, states=6):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, states, (B, T), generator=g)  # ids >= v are "special": summed out
    doc_ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1], [2, 2, 2, 2, 2, 2, 2, -1, -1]])[:B, :T]
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 1, 1], [1, 1, 0, 1, 1, 0, 1, 0, 0]], dtype=torch.bool)[:B, :T]
    return tokens, doc_ids, mask


GRAPHS = {"btree": builders.btree_graph(3, 2, 4), "hmm": builders.hmm_graph(3, 2, 4), "ff": builders.ff_graph(3, 4),
          "cp": builders.cp_graph(4, 3, 4)}


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("fused", [True, False])
def test_loss_equals_brute_force_composite_likelihood(name, fused):
    head = make_head(GRAPHS[name])
    tokens, doc_ids, mask = batch()
    hidden = torch.randn(2, 9, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out = mtp_loss(head, hidden, tokens, doc_ids, mask, gamma=0.8, fused=fused, chunk_elements=8)
    expect, counts = brute_force_loss(head, hidden, tokens, doc_ids, mask, 0.8)
    assert out.counts.tolist() == counts
    assert out.loss.item() == pytest.approx(expect, rel=1e-9, abs=1e-9)


def test_invalid_targets_are_summed_out_not_conditioned_on():
    """A window whose first target is masked scores the second one by its marginal."""
    head = make_head(GRAPHS["btree"])
    tokens = torch.tensor([[1, 2, 3, 0]])
    doc_ids = torch.zeros(1, 4, dtype=torch.long)
    mask = torch.tensor([[False, False, True, False]])  # only x_2 is a target, at window positions t=0 (j=2), t=1 (j=1)
    hidden = torch.randn(1, 4, 5, dtype=torch.float64)
    out = mtp_loss(head, hidden, tokens, doc_ids, mask, gamma=0.5)
    assert out.counts.tolist() == [1, 1, 0]
    x = torch.tensor([[0, 3, 0]])
    at0 = head.circ.log_marginal(x, torch.tensor([False, True, False]), head(hidden[0, 0]))[0]
    x1 = torch.tensor([[3, 0, 0]])
    at1 = head.circ.log_marginal(x1, torch.tensor([True, False, False]), head(hidden[0, 1]))[0]
    assert out.loss.item() == pytest.approx(-(at1 + 0.5 * at0).item(), rel=1e-10)


def test_other_documents_do_not_influence_a_window():
    head = make_head(GRAPHS["hmm"])
    tokens, doc_ids, mask = batch()
    hidden = torch.randn(2, 9, 5, dtype=torch.float64)
    a = mtp_loss(head, hidden, tokens, doc_ids, mask)
    changed = tokens.clone()
    changed[0, 4:] = (changed[0, 4:] + 1) % 4  # document 1's bytes
    hidden2 = hidden.clone()
    hidden2[0, 4:] += 1.0  # and its hidden states
    b = mtp_loss(head, hidden2, changed, doc_ids, mask)
    # document 0 (row 0, t < 4) contributes the same; only terms of document 1 change
    rows = doc_ids[0] == 0
    a0 = mtp_loss(head, hidden[:1, :4], tokens[:1, :4], doc_ids[:1, :4], mask[:1, :4], normalizer=a.counts)
    b0 = mtp_loss(head, hidden2[:1, :4], changed[:1, :4], doc_ids[:1, :4], mask[:1, :4], normalizer=b.counts)
    assert rows.sum() == 4 and a0.loss.item() == pytest.approx(b0.loss.item(), rel=1e-12)
    assert a.loss.item() != pytest.approx(b.loss.item(), rel=1e-6)


def test_global_normalizer_makes_micro_batches_add_up():
    head = make_head(GRAPHS["btree"])
    tokens, doc_ids, mask = batch()
    hidden = torch.randn(2, 9, 5, dtype=torch.float64)
    whole = mtp_loss(head, hidden, tokens, doc_ids, mask)
    total = valid_counts(doc_ids, mask, tokens, 3, 4)
    assert total.tolist() == whole.counts.tolist()
    parts = sum(mtp_loss(head, hidden[i:i + 1], tokens[i:i + 1], doc_ids[i:i + 1], mask[i:i + 1],
                         normalizer=total).loss for i in range(2))
    assert parts.item() == pytest.approx(whole.loss.item(), rel=1e-12)


@pytest.mark.parametrize("chunk_elements", [3 * 4, 2 * 18 * 4, 1 << 22])
def test_fused_and_naive_give_the_same_loss_and_gradients(chunk_elements):
    torch.manual_seed(0)
    head = make_head(builders.btree_graph(4, 3, 4), d=6, dtype=torch.float32)
    tokens, doc_ids, mask = batch(seed=3)
    hidden = torch.randn(2, 9, 6, requires_grad=True)
    results = []
    for fused in (True, False):
        head.zero_grad()
        hidden.grad = None
        out = mtp_loss(head, hidden, tokens, doc_ids, mask, fused=fused, chunk_elements=chunk_elements)
        out.loss.backward()
        results.append((out.loss.detach(), head.weight.grad.clone(), head.bias.grad.clone(), hidden.grad.clone()))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert results[0][1].abs().sum() > 0


def greedy_draft_by_enumeration(circ, theta, n, v, first=None):
    """Sequential argmax of exact conditionals, by enumerating marginals (after a given first token)."""
    draft = [] if first is None else [first]
    for j in range(len(draft), n):
        best, arg = None, None
        for s in range(v):
            x = torch.tensor([draft + [s] + [0] * (n - j - 1)])
            keep = torch.tensor([True] * (j + 1) + [False] * (n - j - 1))
            lp = circ.log_marginal(x, keep, theta)[0].item()
            if best is None or lp > best:
                best, arg = lp, s
        draft.append(arg)
    return draft


def test_teacher_forced_accepted_length_matches_a_greedy_draft():
    head = make_head(GRAPHS["hmm"], seed=4)
    torch.manual_seed(5)
    hidden = torch.randn(40, 5, dtype=torch.float64)
    drafts = [greedy_draft_by_enumeration(head.circ, head(h), 3, 4) for h in hidden]
    # actual bytes agree with the draft on a random-length prefix, then differ
    x, expect = [], []
    for i, d in enumerate(drafts):
        k = i % 4
        row = list(d[:k]) + [(d[k] + 1) % 4 if k < 3 else 0 for _ in range(3 - k)]
        x.append(row[:3])
        expect.append(k)
    got = teacher_forced_accepted(head, hidden, torch.tensor(x))
    assert got.tolist() == expect


@pytest.mark.parametrize("fused", [True, False])
def test_a_head_reading_the_first_token_is_scored_after_it(fused):
    """With `first_given` the head's input carries `x_0` (`tokens[t + 1]`), position 1 is not scored, and
    the embedding is trained through the other positions."""
    head = make_head(GRAPHS["btree"]).read_first_token()
    with torch.no_grad():
        head.first_embedding.normal_(0, 1, generator=torch.Generator().manual_seed(2))
    tokens, doc_ids, mask = batch()
    hidden = torch.randn(2, 9, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    read = head.with_first_token(hidden, torch.cat([tokens[:, 1:], tokens[:, -1:]], 1))
    out = mtp_loss(head, read, tokens, doc_ids, mask, gamma=0.8, fused=fused, chunk_elements=8, first_given=True)
    expect, counts = brute_force_loss(head, hidden, tokens, doc_ids, mask, 0.8, first_given=True)
    assert out.counts.tolist() == counts and out.loss.item() == pytest.approx(expect, rel=1e-9, abs=1e-9)
    scored = mtp_loss(head, read, tokens, doc_ids, mask, gamma=0.8, fused=fused, chunk_elements=8)
    assert scored.loss.item() > out.loss.item()  # the left-out term is a positive NLL
    assert torch.autograd.grad(out.loss, head.first_embedding)[0].abs().sum() > 0


def test_teacher_forced_accepted_after_a_given_first_token_matches_a_greedy_draft():
    head = make_head(GRAPHS["btree"], seed=6)
    torch.manual_seed(7)
    hidden = torch.randn(40, 5, dtype=torch.float64)
    x, expect = [], []
    for i, h in enumerate(hidden):
        first = i % 4
        draft = greedy_draft_by_enumeration(head.circ, head(h), 3, 4, first=first)
        k = 1 + i % 3  # the draft after x_0 agrees with the actual bytes on k - 1 positions
        x.append(draft[:k] + [(draft[j] + 1) % 4 for j in range(k, 3)])
        expect.append(k)
    assert teacher_forced_accepted(head, hidden, torch.tensor(x), first_given=True).tolist() == expect


class WrappedHead(torch.nn.Module):
    """A head without the flat-weight fast path: exercises the generic checkpointed route."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.circ, self.num_leaves, self.num_states = inner.circ, inner.num_leaves, inner.num_states
        self.num_variables = inner.num_variables

    def forward(self, h):
        return self.inner(h)

    def input_logits(self, h, leaves=slice(None)):
        return self.inner.input_logits(h, leaves=leaves)

    def sum_logits(self, h):
        return self.inner.sum_logits(h)


@pytest.mark.parametrize("chunk_elements", [3 * 4, 2 * 18 * 4])
def test_generic_checkpointed_path_matches_naive(chunk_elements):
    head = WrappedHead(make_head(builders.btree_graph(4, 3, 4), d=6, dtype=torch.float32))
    tokens, doc_ids, mask = batch(seed=3)
    hidden = torch.randn(2, 9, 6, requires_grad=True)
    results = []
    for fused in (True, False):
        head.zero_grad()
        hidden.grad = None
        out = mtp_loss(head, hidden, tokens, doc_ids, mask, fused=fused, chunk_elements=chunk_elements)
        out.loss.backward()
        results.append((out.loss.detach(), head.inner.weight.grad.clone(), hidden.grad.clone()))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fused_path_under_bf16_autocast_stays_close():
    head = make_head(builders.btree_graph(4, 3, 4), d=6, dtype=torch.float32)
    tokens, doc_ids, mask = batch(seed=3)
    hidden = torch.randn(2, 9, 6)
    exact = mtp_loss(head, hidden, tokens, doc_ids, mask).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = mtp_loss(head, hidden, tokens, doc_ids, mask).loss
    assert low.dtype == torch.float32 and low.item() == pytest.approx(exact.item(), rel=2e-2)


def test_window_mask_scores_only_the_selected_windows():
    head = make_head(GRAPHS["btree"])
    tokens, doc_ids, mask = batch()
    hidden = torch.randn(2, 9, 5, dtype=torch.float64)
    everything = mtp_loss(head, hidden, tokens, doc_ids, mask, window_mask=torch.ones(2, 9, dtype=torch.bool))
    assert everything.loss.item() == mtp_loss(head, hidden, tokens, doc_ids, mask).loss.item()
    pick = torch.zeros(2, 9, dtype=torch.bool)
    pick[0, 1] = pick[1, 3] = True
    some = mtp_loss(head, hidden, tokens, doc_ids, mask, window_mask=pick)
    only = [mtp_loss(head, hidden[b:b + 1], tokens[b:b + 1], doc_ids[b:b + 1], mask[b:b + 1],
                     window_mask=pick[b:b + 1], normalizer=some.counts).loss for b in range(2)]
    assert some.counts.tolist() == valid_counts(doc_ids, mask, tokens, 3, 4, pick).tolist()
    assert some.counts.sum() < everything.counts.sum()
    assert some.loss.item() == pytest.approx(sum(only).item(), rel=1e-12)
