"""MTP heads: the head contract, FF-equivalent initialisation for every structure, near-identity HMM
initialisation, exact save/load."""

import json

import pytest
import torch

import circuitc
from circuitc import builders
from mtpc import MTPHead, load_head, save_head
from mtpc.errors import InputError
from mtpc.sampling import GREEDY, Sampling

D, V_LM = 16, 12


def structures(n, r, v):
    return {
        "ff": builders.ff_graph(n, v),
        "cp": builders.cp_graph(n, r, v),
        "hmm": builders.hmm_graph(n, r, v),
        "btree": builders.btree_graph(n, r, v),
        "random_tree": builders.random_tree_graph(n, r, v, repetitions=2, seed=3),
    }


def all_states(n, v):
    return torch.cartesian_prod(*[torch.arange(v)] * n).view(-1, n)  # [v^n, n]


def test_head_contract_views_and_shapes():
    head = MTPHead(builders.btree_graph(4, 3, 5), D, sum_init_std=0.3)
    h = torch.randn(2, 3, D)
    theta = head(h)
    assert theta.shape == (2, 3, head.circ.num_params)
    inputs = head.input_logits(h)  # [2, 3, Q, v]
    assert inputs.shape == (2, 3, head.circ.num_leaves, 5)
    sums = head.sum_logits(h)
    assert sums.shape == (2, 3, head.circ.num_params - head.circ.num_input_params)
    torch.testing.assert_close(theta, torch.cat([inputs.flatten(-2), sums], -1))
    torch.testing.assert_close(head.input_logits(h, slice(2, 5)), inputs[..., 2:5, :])
    torch.testing.assert_close(head.input_logits(h, torch.tensor([4, 0])), inputs[..., [4, 0], :])
    theta.sum().backward()  # the loss trains the head through theta
    assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name", ["ff", "cp", "hmm", "btree", "random_tree"])
def test_init_from_lm_head_is_exactly_the_ff_distribution(name):
    """Every unit of position i = the LM head restricted to the circuit's states (state s = token s):
    the circuit's joint is the product of per-position softmaxes, whatever the sum weights."""
    n, v = 3, 5  # the circuit drafts token ids 0..4 of a 12-token LM
    torch.manual_seed(0)
    lm_head = torch.randn(V_LM, D, dtype=torch.float64)
    for options in ({}, {"sum_init_std": 0.7}, {"identity_init": 3.0}):
        head = MTPHead(structures(n, 3, v)[name], D, init_from=lm_head, dtype=torch.float64, **options)
        h = torch.randn(4, D, dtype=torch.float64)
        x = all_states(n, v)  # [125, 3]
        theta = head(h)  # [4, P]
        for b in range(4):
            log_q = head.circ.log_prob(x, theta[b])  # [125]
            per_position = torch.log_softmax(lm_head[:v] @ h[b], -1)  # [v]
            expected = per_position[x].sum(-1)
            torch.testing.assert_close(log_q, expected, rtol=0, atol=1e-12)


def test_init_from_one_embedding_per_position():
    n, v = 3, 4
    tables = [torch.randn(V_LM, D, dtype=torch.float64) for _ in range(n)]
    head = MTPHead(builders.hmm_graph(n, 2, v), D, init_from=tables, dtype=torch.float64, sum_init_std=0.5)
    h = torch.randn(D, dtype=torch.float64)
    x = all_states(n, v)
    expected = sum(torch.log_softmax(tables[i][:v] @ h, -1)[x[:, i]] for i in range(n))
    torch.testing.assert_close(head.circ.log_prob(x, head(h)), expected, rtol=0, atol=1e-12)
    stacked = MTPHead(builders.hmm_graph(n, 2, v), D, init_from=torch.stack(tables), dtype=torch.float64)
    torch.testing.assert_close(stacked.input_logits(h), head.input_logits(h))


def test_init_without_lm_head_is_not_degenerate():
    head = MTPHead(builders.cp_graph(3, 4, 6), D)
    units = head.input_logits(torch.randn(D))  # [Q, v]
    assert units.std() > 0.1 and not torch.allclose(units[0], units[3])  # distinct leaves, random init


def test_identity_init_makes_hmm_transitions_near_identity():
    r = 4
    head = MTPHead(builders.hmm_graph(4, r, 5), D, identity_init=4.0)
    offset = head.circ.num_input_params
    squares = [s for s in head.circ.param_layout if s.kind == "sum" and s.shape == (r, r)]
    assert len(squares) == 2  # the chain's transitions: regions x[1:4] and x[2:4] (x[3] is an input)
    for slot in squares:
        sums = head.sum_logits(torch.zeros(D))  # sum projections start at zero: the bias alone
        block = sums[slot.offset - offset: slot.offset - offset + r * r].view(r, r)
        probs = block.softmax(-1)
        torch.testing.assert_close(probs.diagonal(), torch.full((r,), torch.e ** 4 / (torch.e ** 4 + r - 1)))
    root = next(s for s in head.circ.param_layout if s.kind == "sum" and s.shape[0] == 1)
    assert torch.all(head.bias[root.offset: root.offset + r] == 0)  # the root mixture stays uniform


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_save_load_round_trip_is_exact(tmp_path, dtype):
    graph = builders.btree_graph(4, 3, 7)
    head = MTPHead(graph, D, dtype=dtype, sum_init_std=0.2, identity_init=1.5)
    save_head(head, tmp_path / "head")
    config = json.loads((tmp_path / "head" / "head.json").read_text())
    assert config["graph"] == graph.to_json() and config["options"]["identity_init"] == 1.5
    loaded = load_head(tmp_path / "head")
    assert loaded.weight.dtype == dtype
    assert torch.equal(loaded.weight, head.weight) and torch.equal(loaded.bias, head.bias)
    h = torch.randn(3, D, dtype=dtype)
    assert torch.equal(loaded(h), head(h))
    assert loaded.config() == head.config()


def test_errors():
    graph = builders.cp_graph(3, 2, 5)
    with pytest.raises(ValueError, match=r"init_from\[0\] has shape \(12, 8\); expected \[V, 16\]"):
        MTPHead(graph, D, init_from=torch.randn(V_LM, 8))
    with pytest.raises(ValueError, match="has 4 rows but the circuit has 5 states"):
        MTPHead(graph, D, init_from=torch.randn(4, D))
    with pytest.raises(ValueError, match="2 embeddings; the circuit has 3 window positions"):
        MTPHead(graph, D, init_from=[torch.randn(V_LM, D)] * 2)
    with pytest.raises(ValueError, match="unknown head parameterisation"):
        MTPHead(graph, D, parameterisation="nope")


def test_head_from_a_pc_file_keeps_its_graph(tmp_path):
    source = tmp_path / "small.pc"
    source.write_text("vars x[3] states 5 units 2\nx[0:3] = prod([x[i] for i in 0..3])\nroot x[0:3]\n")
    head = MTPHead(str(source), D, sum_init_std=0.1)
    assert head.num_variables == 3 and head.num_states == 5 and head.num_leaves == 6
    loaded = load_head(save_head(head, tmp_path / "head"))
    assert torch.equal(loaded.weight, head.weight) and loaded.graph.to_json() == head.graph.to_json()


def test_save_needs_the_graph_and_load_needs_a_head_dir(tmp_path):
    compiled = circuitc.compile(builders.cp_graph(3, 2, 5))
    head = MTPHead(compiled, D)
    if getattr(compiled, "graph", None) is None:
        with pytest.raises(ValueError, match="cannot be saved"):
            save_head(head, tmp_path / "x")
    with pytest.raises(InputError, match="no such head folder"):
        load_head(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="written by save_head or mtpc train"):
        load_head(tmp_path / "empty")


# --------------------------------------------------------------------------- parameterisations

PARAMETERISED = [("full", {}), ("shared", {"adapter_rank": 3}), ("shared", {"adapter_rank": 0}),
                 ("factorised", {"adapter_rank": 2, "factor_rank": 5}), ("factorised", {"factor_rank": 2})]


def perturbed(head, seed=0):
    """Every parameter randomised (adapters, factors, sums), so views are compared off the init."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)
    return head


@pytest.mark.parametrize("parameterisation, ranks", PARAMETERISED)
def test_every_parameterisation_keeps_the_head_contract(parameterisation, ranks):
    head = perturbed(MTPHead(builders.btree_graph(4, 3, 5), D, parameterisation=parameterisation,
                             dtype=torch.float64, **ranks))
    assert type(head).parameterisation == parameterisation and isinstance(head, MTPHead)
    h = torch.randn(2, 3, D, dtype=torch.float64)
    theta = head(h)  # [2, 3, P]
    inputs = head.input_logits(h)  # [2, 3, Q, v]
    assert inputs.shape == (2, 3, head.num_leaves, 5)
    torch.testing.assert_close(theta, torch.cat([inputs.flatten(-2), head.sum_logits(h)], -1))
    torch.testing.assert_close(head(h[0, 0]), theta[0, 0])  # the batch-1 fast path
    torch.testing.assert_close(head.input_logits(h, slice(2, 5)), inputs[..., 2:5, :])
    torch.testing.assert_close(head.input_logits(h, torch.tensor([4, 0, 7])), inputs[..., [4, 0, 7], :])
    theta.square().sum().backward()
    assert all(p.numel() == 0 or p.grad.abs().sum() > 0 for p in head.parameters())  # rank 0: no adapter


@pytest.mark.parametrize("parameterisation, ranks", PARAMETERISED[1:])
@pytest.mark.parametrize("name", ["cp", "hmm", "btree"])
def test_adapter_heads_start_exactly_as_the_ff_product(parameterisation, ranks, name):
    """Zero adapter `B`: every leaf of a position is that position's unembedding, so the circuit is the
    product of per-position softmaxes; with full rank k the factorised unembedding is the LM head's."""
    n, v = 3, 5
    torch.manual_seed(1)
    lm_head = torch.randn(V_LM, D, dtype=torch.float64)
    head = MTPHead(structures(n, 3, v)[name], D, init_from=lm_head, parameterisation=parameterisation,
                   sum_init_std=0.7, identity_init=1.0, dtype=torch.float64, **ranks)
    h = torch.randn(4, D, dtype=torch.float64)
    x = all_states(n, v)
    leaves = head.input_logits(h)  # [4, Q, v]
    var = head.circ.leaf_variable
    for i in range(n):  # identical units per position
        assert torch.equal(leaves[:, var == i], leaves[:, var == i][:, :1].expand_as(leaves[:, var == i]))
    theta = head(h)
    for b in range(4):
        per_position = torch.stack([leaves[b, var == i][0].log_softmax(-1) for i in range(n)])  # [n, v]
        expected = per_position.gather(1, x.t()).sum(0)
        torch.testing.assert_close(head.circ.log_prob(x, theta[b]), expected, rtol=0, atol=1e-12)
        if ranks.get("factor_rank", v) >= v:  # exact factorisation (rank <= v): the LM head itself
            lm = torch.log_softmax(lm_head[:v] @ h[b], -1)[x].sum(-1)
            torch.testing.assert_close(head.circ.log_prob(x, theta[b]), lm, rtol=0, atol=1e-10)


@pytest.mark.parametrize("parameterisation, ranks", PARAMETERISED[1:])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adapter_heads_round_trip_exactly(tmp_path, parameterisation, ranks, dtype):
    graph = builders.hmm_graph(4, 3, 7)
    head = perturbed(MTPHead(graph, D, parameterisation=parameterisation, dtype=dtype, **ranks))
    save_head(head, tmp_path / "head")
    config = json.loads((tmp_path / "head" / "head.json").read_text())
    assert config["parameterisation"] == parameterisation and config["dtype"] == str(dtype)[6:]
    loaded = load_head(tmp_path / "head")
    assert type(loaded) is type(head) and loaded.dtype == dtype and loaded.config() == head.config()
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    h = torch.randn(3, D, dtype=dtype)
    assert torch.equal(loaded(h), head(h))


def test_adapter_heads_are_smaller_and_bf16_runs():
    graph = builders.cp_graph(8, 8, 256)
    full = MTPHead(graph, 64)
    shared = MTPHead(graph, 64, parameterisation="shared", adapter_rank=4)
    factorised = MTPHead(graph, 64, parameterisation="factorised", adapter_rank=4, factor_rank=16)
    assert factorised.num_weights() < shared.num_weights() < full.num_weights() / 4
    h = torch.randn(64)
    for head in (full, shared, factorised):
        low = head.to(torch.bfloat16)
        assert low(h.bfloat16()).dtype == torch.bfloat16 and low.dtype == torch.bfloat16


def test_load_refuses_weights_of_another_parameterisation(tmp_path):
    graph = builders.cp_graph(3, 2, 5)
    save_head(MTPHead(graph, D, parameterisation="shared"), tmp_path / "a")
    config = json.loads((tmp_path / "a" / "head.json").read_text())
    config["parameterisation"] = "factorised"
    (tmp_path / "a" / "head.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="a 'factorised' head has"):
        load_head(tmp_path / "a")
    with pytest.raises(ValueError, match="adapter_rank must be >= 0"):
        MTPHead(graph, D, parameterisation="shared", adapter_rank=-1)


@pytest.mark.parametrize("parameterisation, ranks", PARAMETERISED[1:4:2])
def test_the_chunked_loss_trains_adapter_heads_like_the_naive_loss(parameterisation, ranks):
    """`mtp_loss` reads non-full heads through `input_logits(h, leaves)` / `sum_logits` in chunks:
    the same loss and gradients as materialising every leaf at once."""
    from mtpc.heads.nll_loss import mtp_loss

    head = perturbed(MTPHead(builders.hmm_graph(3, 2, 6), D, parameterisation=parameterisation,
                             dtype=torch.float64, **ranks))
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 9, D, dtype=torch.float64, generator=g)
    tokens = torch.randint(0, 7, (2, 9), generator=g)  # id 6 is not a state: summed out
    doc_ids, mask = torch.zeros(2, 9, dtype=torch.long), torch.ones(2, 9, dtype=torch.bool)
    results = []
    for fused, chunk in ((False, 1 << 22), (True, 40)):  # 40 logits per chunk: many leaf/token blocks
        head.zero_grad()
        out = mtp_loss(head, hidden, tokens, doc_ids, mask, fused=fused, chunk_elements=chunk)
        out.loss.backward()
        results.append((out.loss.detach(), [p.grad.clone() for p in head.parameters()]))
    torch.testing.assert_close(results[0][0], results[1][0])
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("parameterisation, ranks", [("full", {}), ("shared", {"adapter_rank": 3})])
def test_a_head_that_reads_the_first_token_starts_as_it_was_and_round_trips(tmp_path, parameterisation, ranks):
    from mtpc.decoding.drafts.drafting import Drafter

    torch.manual_seed(0)
    head = MTPHead(builders.btree_graph(3, 2, 5), D, parameterisation=parameterisation, sum_init_std=0.5,
                   dtype=torch.float64, **ranks)
    h, first = torch.randn(4, D, dtype=torch.float64), torch.tensor([0, 4, 7, 2])  # 7: a special token past v
    before = head(h)
    assert not head.reads_first_token and torch.equal(head.with_first_token(h, first), h)
    assert head.read_first_token() is head and head.read_first_token().reads_first_token  # idempotent
    assert head.first_embedding.shape == (5, D) and torch.equal(head(head.with_first_token(h, first)), before)
    with torch.no_grad():
        head.first_embedding.normal_()
    read = head.with_first_token(h, first)
    assert torch.equal(read[2], h[2] + head.first_embedding[4])  # the special token reads the last state's row
    drafter = Drafter(head, (3,), None, 3, 9)
    assert torch.equal(drafter.theta(h, first), head(read)) and not torch.allclose(head(read), before)
    # its windows are those of the same head without the embedding, drafted from the embedded input
    plain = MTPHead(builders.btree_graph(3, 2, 5), D, parameterisation=parameterisation, dtype=torch.float64, **ranks)
    plain.load_state_dict({k: t for k, t in head.state_dict().items() if k != "first_embedding"})
    uniforms = torch.rand(4, 3, dtype=torch.float64)
    for draws in (None, uniforms):
        sampling = GREEDY if draws is None else Sampling(1.0)
        ours = drafter.circuit_window(h, first, sampling, draws)
        theirs = Drafter(plain, (3,), None, 3, 9).circuit_window(read, first, sampling, draws)
        assert torch.equal(ours.tokens, theirs.tokens)
    save_head(head, tmp_path / "head")
    assert json.loads((tmp_path / "head" / "head.json").read_text())["options"]["first_token"] is True
    loaded = load_head(tmp_path / "head")
    assert loaded.reads_first_token and torch.equal(loaded.first_embedding, head.first_embedding)
    assert torch.equal(loaded(loaded.with_first_token(h, first)), head(read)) and "first_token=True" in repr(loaded)


def test_a_head_that_reads_the_first_token_through_an_mlp_starts_as_it_was_and_round_trips(tmp_path):
    from mtpc.decoding.drafts.drafting import Drafter

    torch.manual_seed(1)
    head = MTPHead(builders.btree_graph(3, 2, 5), D, parameterisation="shared", adapter_rank=3, sum_init_std=0.5,
                   dtype=torch.float64).read_first_token()
    with torch.no_grad():
        head.first_embedding.normal_()
    h, first = torch.randn(4, D, dtype=torch.float64), torch.tensor([0, 4, 7, 2])
    before = head(head.with_first_token(h, first))
    assert head.read_first_token(6) is head and head.first_mlp_in.shape == (6, D) and head.first_mlp_out.shape == (D, 6)
    assert torch.equal(head(head.with_first_token(h, first)), before)  # a zero output layer: as it was
    with pytest.raises(ValueError, match="an MLP of width 6, not 4"):
        head.read_first_token(4)
    with pytest.raises(ValueError, match="non-negative integer"):
        head.read_first_token(-1)
    with torch.no_grad():
        head.first_mlp_out.normal_()
    read = head.with_first_token(h, first)
    summed = h + head.first_embedding[first.clamp_max(4)]
    mixed = summed + torch.nn.functional.silu(summed @ head.first_mlp_in.T) @ head.first_mlp_out.T
    torch.testing.assert_close(read, mixed)
    assert torch.equal(Drafter(head, (3,), None, 3, 9).theta(h, first), head(read))
    save_head(head, tmp_path / "head")
    assert json.loads((tmp_path / "head" / "head.json").read_text())["options"]["first_token_mlp"] == 6
    loaded = load_head(tmp_path / "head")
    assert torch.equal(loaded(loaded.with_first_token(h, first)), head(read)) and "first_token_mlp=6" in repr(loaded)
