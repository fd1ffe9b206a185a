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
    m = ThresholdedBlock(8).eval()  # bit degree 6: about 1,300 field trials, at this size
    x = torch.randn(4, 8)  # 14 s here (at (8, 16): 42 s)
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


def clamped(h, w):
    """T5's float16 overflow guard (a clamp by a 0-dim tensor computed from ``isinf``), then
    clamps by numbers, ``clamp(min=)`` and ``clamp_max``."""
    y = h @ w
    v = torch.where(torch.isinf(y).any(), torch.finfo(y.dtype).max - 1000,
                    torch.finfo(y.dtype).max)
    y = torch.clamp(y, min=-v, max=v)
    return torch.clamp(y * 2.0, -1.5, 3.0) + y.clamp(min=0.1) + y.clamp_max(2.0)


@pytest.mark.skipif(not RUNS, reason="needs a GPU or TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_clamps_are_optimized_and_equal_eager(dtype):
    """``torch.clamp`` and its methods convert to comparisons and ``where`` (NaN stays NaN,
    the upper bound wins over a larger lower one): only ``isinf`` and ``any`` stay eager."""
    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    h, w = torch.randn(8, 16, dtype=dt), torch.randn(16, 32, dtype=dt)
    torch._dynamo.reset()
    be = em.backend(warmup=0, time_limit_s=120, warn=False, cache=False)
    with torch.no_grad():
        got = torch.compile(clamped, backend=be)(h, w)
        want = clamped(h, w)
    tol = 2e-2 if dtype == "float16" else 1e-5
    assert float((got - want).float().abs().max() / want.float().abs().max()) <= tol
    eager = be.summary()["eager"]
    assert not any("clamp" in e for e in eager), eager
    assert all("isinf" in e or "any" in e or "below min_ops" in e for e in eager), eager


def test_clamp_keeps_nan_and_lets_the_upper_bound_win():
    x = torch.tensor([[float("nan"), -3.0, 0.5, 9.0]])

    def f(t):
        return torch.clamp(t, min=1.0, max=0.25) + t.clamp(-1.0, 1.0)

    g = em.from_torch(f, x)
    out = em.evaluate(g, {"t": x.numpy()})["out"]
    want = (torch.clamp(x, min=1.0, max=0.25) + x.clamp(-1.0, 1.0)).numpy()
    assert out.shape == want.shape
    assert (out[0, 0] != out[0, 0]) and (want[0, 0] != want[0, 0])  # NaN in both
    assert (out[0, 1:] == want[0, 1:]).all(), (out, want)
