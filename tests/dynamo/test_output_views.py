"""Issue 51: a graph that returns views of its inputs (or of another output) through
``em.backend`` returns them as eager torch does: views that alias, so a caller's later
write to the input shows through them. A partition writes its outputs to fresh tensors,
so those views stay eager (``dynamo.support.returned_views``)."""

# ruff: noqa: E402 (TRITON_INTERPRET is set before anything can import triton)
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

torch = pytest.importorskip("torch")

import eqsat_mirage as em


def views(x, w):
    h = torch.relu(x @ w)
    return x.t(), x[1:3], x, h, h.t(), x @ w * 2.0


def test_returned_views_alias_as_in_eager():
    be = em.backend(time_limit_s=60.0, iter_limit=4, warmup=0, warn=False)
    compiled = torch.compile(views, backend=be)
    torch.manual_seed(0)
    x, w = torch.randn(8, 16), torch.randn(16, 8)
    got, want = compiled(x, w), views(x, w)
    assert any(r.status == "optimized" for r in be.report), be.report
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)
        assert g.stride() == e.stride()
    base = x.untyped_storage().data_ptr()
    assert [g.untyped_storage().data_ptr() == base for g in got] == [True] * 3 + [False] * 3
    assert got[4].untyped_storage().data_ptr() == got[3].untyped_storage().data_ptr()
    eager = [r for r in be.unsupported if "a view the graph returns" in str(r)]
    assert eager, be.unsupported  # the reason is said
    x.add_(1.0)  # the caller writes its input after the call: the views follow, as in eager
    assert torch.equal(got[0], x.t()) and torch.equal(got[1], x[1:3])
    got[3].mul_(0.0)
    assert not got[4].any()  # h.t() is a view of h
