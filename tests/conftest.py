"""Fixtures shared by several test modules, and the settings of the suite's parallel workers."""

import os

import pytest
import torch

# each worker imports torch and transformers and collects the whole suite (seconds of CPU, hundreds of MB):
# a many-core machine gets 4, not one per core
MAX_WORKERS = 4


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: `-n auto` in pyproject.toml's addopts
def pytest_xdist_auto_num_workers(config):
    """One worker per core this process may use, at most MAX_WORKERS."""
    return min(MAX_WORKERS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def pytest_configure(config):
    """In a pytest-xdist worker torch runs single-threaded, as do the processes its tests start: the
    workers already use every core, and more threads than cores only slow each other down. Tests of
    thread behaviour set the count they need themselves."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"


def pytest_runtest_setup(item):
    """Tests marked `cuda` skip on a machine without a GPU (CI, the CPU boxes)."""
    if item.get_closest_marker("cuda") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.fixture(scope="module")
def one_thread():
    """Batch-1 programs and decoding are many tiny ops: one thread is fastest and immune to other
    processes' load. Modules opt in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
