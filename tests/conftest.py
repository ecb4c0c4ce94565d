"""Fixtures shared by several test modules."""

import pytest
import torch


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
