"""Model tests run tiny models: one intra-op thread each (on a busy 2-core box more cost 3x)."""

import pytest
from support.torch_ranks import one_torch_thread


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    with one_torch_thread():
        yield
