"""Every torch.compile test starts and ends with Dynamo's caches reset (a graph compiled by
one test is never served to the next)."""

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
