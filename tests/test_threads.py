"""Small calls run single-threaded whatever the caller's torch thread setting (circuitc.threads),
large ones keep the caller's threads, and the caller's setting is always restored."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import circuitc
from circuitc.builders import btree_graph
from circuitc.runtime.draft import DraftProgram
from circuitc.threads import SMALL_WORK, single_threaded


class ThreadsSeen(TorchDispatchMode):
    """Records torch's intra-op thread count at every tensor op."""

    def __init__(self):
        super().__init__()
        self.seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(torch.get_num_threads())
        return func(*args, **(kwargs or {}))


@pytest.fixture
def two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def threads_during(fn) -> set[int]:
    with ThreadsSeen() as mode:
        fn()
    assert torch.get_num_threads() == 2  # restored
    return mode.seen


@pytest.fixture(scope="module")
def btree():
    graph = btree_graph(8, 8, 16)
    return graph, circuitc.compile(graph)


def test_batch_one_programs_run_single_threaded(btree, two_threads):
    graph, circ = btree
    theta = torch.randn(circ.num_params)
    x = torch.randint(16, (1, 8))
    keep = torch.rand(1, 8) < 0.5
    programs = {
        "log_prob": lambda: circ.log_prob(x, theta),
        "log_marginal": lambda: circ.log_marginal(x, keep, theta),
        "prefix": lambda: circ.prefix_log_marginals(x, theta),
        "conditional": lambda: circ.conditional_log_distribution(x, keep, theta, 2),
        "sample": lambda: circ.sample(theta, 1),
        "map": lambda: circ.map(theta, evidence=x, keep=keep),
    }
    program = DraftProgram(graph, circ.param_layout)
    programs["draft_greedy"] = lambda: program.greedy(theta)
    programs["draft_sample"] = lambda: program.sample(theta)
    for name, fn in programs.items():
        assert threads_during(fn) == {1}, name


def test_large_calls_keep_the_callers_threads(btree, two_threads):
    _, circ = btree
    theta = torch.randn(circ.num_params)
    batch = int(SMALL_WORK // circ._row_flops) + 1  # just above the threshold
    x = torch.randint(16, (batch, 8))
    assert threads_during(lambda: circ.log_prob(x, theta)) == {2}
    assert threads_during(lambda: circ.sample(theta, batch)) == {2}  # draws count as rows


def test_setting_restored_after_an_error(btree, two_threads):
    _, circ = btree
    with pytest.raises(ValueError):
        circ.log_prob(torch.zeros(1, 3, dtype=torch.long), torch.randn(circ.num_params))
    assert torch.get_num_threads() == 2


def test_single_threaded_scope(two_threads):
    with single_threaded(0):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with single_threaded(SMALL_WORK):
        assert torch.get_num_threads() == 2


@pytest.mark.parametrize("threads", [1, 2])
def test_programs_trace_whole_under_torch_compile(threads):
    """The thread scope must vanish under tracing: `torch.compile(fullgraph=True)` of a program in a
    fresh compile fails if the scope queries `get_num_threads` before `is_compiling()` (the eager
    backend traces with dynamo as inductor does, in a fraction of the time)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        circ = circuitc.compile(btree_graph(4, 2, 8))
        theta = torch.randn(circ.num_params)
        x = torch.randint(8, (1, 4))
        torch._dynamo.reset()
        traced = torch.compile(circ.log_prob, backend="eager", fullgraph=True)
        torch.testing.assert_close(traced(x, theta), circ.log_prob(x, theta))

        def scoped(t):
            with single_threaded(0):
                return t * 2

        torch.testing.assert_close(torch.compile(scoped, backend="eager", fullgraph=True)(theta), theta * 2)
    finally:
        torch.set_num_threads(before)
