"""Fused programs (`circuitc.compile(..., fuse=True)`, torch.compile) against brute-force
enumeration and against eager, `warm_up`'s measured choice, and `circuitc compile --fuse`.
Compiling takes tens of seconds here, so all but the input checks are marked slow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import circuitc
from _circuit_reference import Reference, random_graph
from circuitc.builders import btree_graph
from circuitc.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 11])
def test_fused_programs_match_brute_force(seed):
    graph = random_graph(seed)
    circ = circuitc.compile(graph, fuse=True)
    gen = torch.Generator().manual_seed(seed)
    n, v = graph.variables, graph.states
    theta = 1.5 * torch.randn(3, circ.num_params, generator=gen, dtype=torch.float64)
    refs = [Reference(graph, circ.param_layout, t.numpy()) for t in theta]
    x = torch.randint(v, (3, n), generator=gen)
    keep = torch.rand(3, n, generator=gen) < 0.5
    np.testing.assert_allclose(circ.log_prob(x, theta).exp().numpy(),
                               [ref.prob(tuple(x[b].tolist())) for b, ref in enumerate(refs)], rtol=1e-9)
    np.testing.assert_allclose(circ.log_marginal(x, keep, theta).exp().numpy(),
                               [ref.prob(tuple(x[b].tolist()), keep[b].tolist()) for b, ref in enumerate(refs)],
                               rtol=1e-9)
    prefix = circ.prefix_log_marginals(x, theta).exp().numpy()
    for b, ref in enumerate(refs):
        want = [ref.prob(tuple(x[b].tolist()), [j <= i for j in range(n)]) for i in range(n)]
        np.testing.assert_allclose(prefix[b], want, rtol=1e-9)


@pytest.mark.slow
def test_warm_up_measures_and_keeps_the_faster_program():
    circ = circuitc.compile(btree_graph(8, 4, 16), fuse=True)
    eager = circuitc.compile(btree_graph(8, 4, 16))
    theta = torch.randn(circ.num_params)
    x = torch.randint(16, (64, 8))
    keep = torch.rand(64, 8) < 0.5
    with torch.no_grad():
        report = circ.warm_up(x, theta, keep, repeats=5)
        assert set(report) == {"log_prob", "prefix_log_marginals", "log_marginal"}
        for name, r in report.items():
            assert r["compile_s"] > 0 and r["fused_ms"] > 0 and r["eager_ms"] > 0
            assert r["uses"] == ("eager" if r["eager_ms"] < r["fused_ms"] else "fused")
        torch.testing.assert_close(circ.log_prob(x, theta), eager.log_prob(x, theta))
        torch.testing.assert_close(circ.prefix_log_marginals(x, theta), eager.prefix_log_marginals(x, theta))
        torch.testing.assert_close(circ.log_marginal(x, keep, theta), eager.log_marginal(x, keep, theta))
    # gradients through the fused program (a separate graph: grad mode is part of the key)
    theta.requires_grad_()
    circ.log_prob(x, theta).sum().backward()
    want = theta.detach().clone().requires_grad_()
    eager.log_prob(x, want).sum().backward()
    torch.testing.assert_close(theta.grad, want.grad)


@pytest.mark.slow
def test_extreme_logits_stay_finite_when_fused():
    circ = circuitc.compile(btree_graph(4, 3, 5), fuse=True)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(5, (3, 4), generator=gen)
    for dtype in (torch.float32, torch.bfloat16):
        theta = (1e4 * (2 * torch.rand(circ.num_params, generator=gen) - 1)).to(dtype)
        with torch.no_grad():
            assert torch.isfinite(circ.log_prob(x, theta)).all()
            assert torch.isfinite(circ.prefix_log_marginals(x, theta)).all()


@pytest.mark.slow
def test_cli_compile_fuse_prints_the_measured_choice(capsys, tmp_path):
    threads = torch.get_num_threads()
    status = main(["compile", str(EXAMPLES / "btree.pc"), "-D", "n=4", "-D", "r=2", "-D", "v=3",
                   "-o", str(tmp_path / "p.json"), "--fuse", "--batch", "1,8"])
    out = capsys.readouterr().out
    assert status == 0
    assert torch.get_num_threads() == threads  # the caller's setting is restored
    fused = out[out.index("fused programs (torch.compile, 1 thread(s)"):]  # after the plan summary
    rows = [line.split() for line in fused.splitlines() if line.split()[:1] in (["log_prob"], ["prefix_log_marginals"])]
    assert [(r[0], r[1]) for r in rows] == [("log_prob", "1"), ("prefix_log_marginals", "1"),
                                          ("log_prob", "8"), ("prefix_log_marginals", "8")]
    for r in rows:
        eager_ms, fused_ms = float(r[3]), float(r[4])
        assert r[5] == ("eager" if eager_ms < fused_ms else "fused")


def test_warm_up_needs_a_fused_circuit():
    circ = circuitc.compile(btree_graph(4, 2, 3))
    with pytest.raises(ValueError, match="fuse=True"):
        circ.warm_up(torch.zeros(1, 4, dtype=torch.long), torch.zeros(circ.num_params))


@pytest.mark.parametrize("bad", ["0", "1,x", "-3"])
def test_cli_rejects_bad_batch_sizes(capsys, bad):
    status = main(["compile", str(EXAMPLES / "btree.pc"), "--fuse", "--batch", bad])
    err = capsys.readouterr().err
    assert status == 2 and "--batch" in err and "Traceback" not in err
