"""Comparisons of computed tensors through ``em.from_torch`` and the builder API (issue 52):
``torch.where(s > 0, s, 0.1 * s)`` (a leaky ReLU by hand), ``(x > y).float() * x`` and
``masked_fill(scores < t, -inf)`` before a softmax trace to comparison ops, optimize,
verify and equal torch eager in float32 and float16; every spelling of a comparison
(functions, long names, operators, methods, a number either side, a buffer) traces."""

# Tensors are named like the inputs they stand for (S, X, Y), as in the math.
# ruff: noqa: N806

from __future__ import annotations

import operator
import os

import pytest

import eqsat_mirage as em
from eqsat_mirage.ir.node import Op
from eqsat_mirage.ir.ops import COMPARE

torch = pytest.importorskip("torch")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RUNS = DEVICE == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
TOL = {"float32": 2e-3, "float16": 2e-2}


def leaky(s):
    return torch.where(s > 0, s, 0.1 * s)


def gated(x, y):
    return (x > y).float() * x


def thresholded(q, k):
    s = q @ k.transpose(-2, -1)
    return torch.softmax(s.masked_fill(s < -1.0, float("-inf")), dim=-1)


CASES = {leaky: ((4, 32),), gated: ((8, 16), (8, 16)), thresholded: ((2, 8, 16), (2, 8, 16))}
OPS = {leaky: Op.GT, gated: Op.GT, thresholded: Op.LT}


def _args(fn, dtype: str, seed: int = 0) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen).to(getattr(torch, dtype)) for shape in CASES[fn]]


def _builder(fn, dtype: str) -> em.Graph:
    """The same program in the builder API."""
    g = em.Graph(fn.__name__)
    names = ("s",) if fn is leaky else ("x", "y") if fn is gated else ("q", "k")
    ins = [g.input(n, shape, dtype) for n, shape in zip(names, CASES[fn])]
    if fn is leaky:
        (S,) = ins
        out = em.where(S > 0, S, 0.1 * S)
    elif fn is gated:
        X, Y = ins
        out = (X > Y).astype("float32") * X
    else:
        Qm, K = ins
        S = Qm @ K.transpose(0, 2, 1)
        out = em.softmax(em.where(S >= -1.0, S, float("-inf")))
    g.output(out, "out")
    return g


def _check(res, fn, args, dtype):
    assert res.verified.equivalent, res.verified
    out = res.compile()(*[a.to(DEVICE) for a in args])
    got = (out["out"] if isinstance(out, dict) else out).float().cpu()
    want = fn(*[a.float() for a in args])
    torch.testing.assert_close(got, want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.skipif(not RUNS, reason="needs a GPU or TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("fn", list(CASES), ids=lambda f: f.__name__)
def test_from_torch_optimizes_verifies_and_equals_eager(fn, dtype):
    args = _args(fn, dtype)
    g = em.from_torch(fn, *args)
    assert any(n.op is OPS[fn] for n in g.nodes())
    res = em.optimize(g, cache=False, trials=1, time_limit_s=300)
    assert isinstance(res.program, em.MuGraph)  # fused kernels, not the input program
    _check(res, fn, args, dtype)


@pytest.mark.skipif(not RUNS, reason="needs a GPU or TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("fn", list(CASES), ids=lambda f: f.__name__)
def test_builder_api_optimizes_verifies_and_equals_eager(fn, dtype):
    g = _builder(fn, dtype)
    assert any(n.op in COMPARE for n in g.nodes())
    res = em.optimize(g, cache=False, trials=1, time_limit_s=300)
    _check(res, fn, _args(fn, dtype), dtype)


SPELLINGS = {
    Op.GT: [lambda s: torch.gt(s, 0), lambda s: torch.greater(s, 0.0), lambda s: s > 0,
            lambda s: s.gt(0), lambda s: 0 < s, lambda s: operator.gt(s, 0.0)],
    Op.GE: [lambda s: torch.ge(s, 0), lambda s: torch.greater_equal(s, 0), lambda s: s >= 0,
            lambda s: s.ge(0.0)],
    Op.LT: [lambda s: torch.lt(s, 0), lambda s: torch.less(s, 0), lambda s: s < 0],
    Op.LE: [lambda s: torch.le(s, 0), lambda s: torch.less_equal(s, 0), lambda s: s <= 0],
    Op.EQ: [lambda s: torch.eq(s, 0), lambda s: torch.eq(s, s * 2.0), lambda s: s == 0],
    Op.NE: [lambda s: torch.ne(s, 0), lambda s: torch.not_equal(s, 0), lambda s: s != 0,
            lambda s: s.bool()],
}


def _selecting(cmp):
    def fn(s):
        return torch.where(cmp(s), s, -s)
    return fn


@pytest.mark.parametrize("op", list(SPELLINGS), ids=lambda o: o.name)
def test_every_spelling_traces_to_its_op(op):
    s = torch.tensor([[-1.0, 0.0, 2.0, 0.0]])
    for cmp in SPELLINGS[op]:
        fn = _selecting(cmp)
        g = em.from_torch(fn, s)
        ops = [n.op for n in g.nodes() if n.op in COMPARE]
        assert ops in ([op], [{Op.GT: Op.LT}.get(op, op)]), ops
        got = em.evaluate(g, {"s": s.double().numpy()})
        want = fn(s).double().numpy()
        assert (next(iter(got.values())) == want).all()


def test_a_comparison_with_a_buffer():
    class Clip(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("floor", torch.full((16,), -0.5))

        def forward(self, x):
            h = x @ x.transpose(0, 1)
            return torch.where(h[:, :16] > self.floor, h[:, :16], self.floor)

    m = Clip().eval()
    x = torch.randn(16, 8)
    g = em.from_torch(m, x)
    assert any(n.op is Op.GT for n in g.nodes())
    assert em.verify(g, g, seed=0).equivalent


def test_a_mask_compared_with_other_numbers_is_refused():
    def fn(s, m):
        return s.masked_fill(m > 2, float("-inf"))

    with pytest.raises(em.UnsupportedOpError, match=r"gt of \(bool, int\)"):
        em.from_torch(fn, torch.randn(4, 4), torch.rand(4, 4) < 0.5)
