"""Comparisons of computed tensors under ``torch.compile(backend=em.backend(...))`` (issue
52): a small module whose activation is ``torch.where(h > 0, h, 0.1 * h)`` and whose
scores are masked by ``scores < t`` is optimized as a whole (no op left eager) and equals
eager torch."""

from __future__ import annotations

import os

import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")

RUNS = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


class ThresholdedBlock(torch.nn.Module):
    """A linear layer, a leaky ReLU by hand and a softmax over scores masked below -1."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        h = self.proj(x)
        h = torch.where(h > 0, h, 0.1 * h)
        s = h @ x.transpose(-2, -1)
        return torch.softmax(s.masked_fill(s < -1.0, float("-inf")), dim=-1) @ x


@pytest.mark.skipif(not RUNS, reason="needs a GPU or TRITON_INTERPRET=1")
def test_a_module_with_comparisons_is_optimized_whole_through_the_backend():
    torch.manual_seed(0)
    m = ThresholdedBlock().eval()
    x = torch.randn(8, 16)
    be = em.backend(time_limit_s=300, warn=False, warmup=0, cache=False)
    with torch.no_grad():
        want = m(x)
        got = torch.compile(m, backend=be)(x)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    s = be.summary()
    assert s["compute_ops"] > 0 and s["optimized_compute_ops"] == s["compute_ops"], s["eager"]
    assert not s["eager"], s["eager"]
    (entry,) = [r for r in be.report if r.graph is not None]
    assert any(n.op is em.Op.GT for n in entry.graph.nodes())
    assert any(n.op is em.Op.LT for n in entry.graph.nodes())
