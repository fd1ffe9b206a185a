"""Bool masks combined under ``torch.compile(backend=em.backend(...))`` (issue 52): a small
module whose scores are ``masked_fill(~((s > 0) & mask), -inf)`` and whose activation is a
``where`` on ``(h > 0) | (x < 0)`` is optimized as a whole (no op left eager) and equals
eager torch."""

from __future__ import annotations

import os

import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")

RUNS = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


class CombinedMasks(torch.nn.Module):
    """Scores kept where they are positive and a mask argument holds (the diagonal, |x|^2,
    is positive, so every row keeps one), and a leaky activation gated by an or."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(d, d, bias=False)

    def forward(self, x, mask):
        s = x @ x.transpose(-2, -1)
        s = s.masked_fill(~((s > 0) & mask), float("-inf"))
        h = self.proj(x)
        h = torch.where((h > 0) | (x < 0), h, 0.1 * h)
        return torch.softmax(s, dim=-1) @ h


@pytest.mark.skipif(not RUNS, reason="needs a GPU or TRITON_INTERPRET=1")
def test_a_module_combining_masks_is_optimized_whole_through_the_backend():
    torch.manual_seed(0)
    m = CombinedMasks().eval()
    x = torch.randn(8, 16)
    mask = torch.rand(8, 8) < 0.5
    mask.fill_diagonal_(True)
    torch._dynamo.reset()
    be = em.backend(time_limit_s=300, warn=False, warmup=0, cache=False)
    with torch.no_grad():
        want = m(x, mask)
        got = torch.compile(m, backend=be)(x, mask)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    s = be.summary()
    assert s["compute_ops"] > 0 and s["optimized_compute_ops"] == s["compute_ops"], s["eager"]
    assert not s["eager"], s["eager"]
    (entry,) = [r for r in be.report if r.graph is not None]
    ops = {n.op for n in entry.graph.nodes()}
    assert {em.Op.AND, em.Op.OR, em.Op.GT, em.Op.LT} <= ops


def _started_true(q, k, x):
    """transformers' masking_utils: ``and_masks`` starts from ``q_idx.new_ones((),
    dtype=torch.bool)`` and ands each mask function's result into it."""
    m = q.new_ones((), dtype=torch.bool)
    mask = m & (k[None, :] <= q[:, None])
    return torch.where(mask, x, -1e4).softmax(-1) * 2.0


def _true_returned(q, k, x):
    m = q.new_ones((), dtype=torch.bool)
    return _started_true(q, k, x), m


def test_a_constant_true_mask_folds_into_the_and_that_reads_it():
    """Issue 52: ``new_ones((), dtype=torch.bool)`` was eager (no form); it is a constant
    True now, folded where it is combined (True & m is m), so the mask building joins the
    partition; read by anything else (returned here) it stays eager, a tensor, and the
    partition still runs optimized."""
    q, k, x = torch.arange(8), torch.arange(8), torch.randn(8, 8)
    for fn, eager in ((_started_true, []), (_true_returned, ["Tensor.new_ones"])):
        torch._dynamo.reset()
        be = em.backend(time_limit_s=120, warmup=0, warn=False)
        with torch.no_grad():
            got = torch.compile(fn, backend=be)(q, k, x)
        torch._dynamo.reset()
        want = fn(q, k, x)
        if isinstance(got, tuple):
            assert bool(got[1]) is True and got[1].dtype == torch.bool
            got, want = got[0], want[0]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        s = be.summary()
        assert s["optimized_compute_ops"] == s["compute_ops"] > 0, s
        ops = [e.split(" at ")[0] for e in s["eager"] if not e.startswith("operator.getitem")]
        assert ops == eager, s["eager"]
