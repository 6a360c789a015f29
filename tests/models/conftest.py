"""Model tests run tiny models: one intra-op thread each (on a busy 2-core box more cost 3x)."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
