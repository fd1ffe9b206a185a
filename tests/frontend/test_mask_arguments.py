"""A bool mask passed to a traced function stays the function's input (issue 52): nanoGPT's
``scores.masked_fill(mask, -inf)`` with a ``mask`` argument is computed as ``mask(not mask,
scores)`` inside the program, so ``em.from_torch``'s inputs are the function's arguments and
``res.compile()`` is called by their names (a ``not_mask`` input was added before)."""

from __future__ import annotations

import inspect
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat_mirage as em
from eqsat_mirage.ir.node import Op

torch = pytest.importorskip("torch")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RUNS = DEVICE == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
TOL = {"float32": 2e-3, "float16": 2e-2}


def masked_fill(q, k, v, mask):
    """nanoGPT: -inf where ``mask`` holds."""
    s = (q @ k.transpose(-2, -1)) * (1.0 / q.size(-1) ** 0.5)
    return torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v


def masked_fill_inverted(q, k, v, mask):
    """-inf where ``mask`` does not hold (``mask``: the kept scores)."""
    s = (q @ k.transpose(-2, -1)) * (1.0 / q.size(-1) ** 0.5)
    return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v


def where_kept(q, k, v, mask):
    """``where(mask, s, -inf)``: the scores where ``mask`` holds."""
    s = (q @ k.transpose(-2, -1)) * (1.0 / q.size(-1) ** 0.5)
    return torch.softmax(torch.where(mask, s, float("-inf")), dim=-1) @ v


def masked_fill_eq_zero(q, k, v, mask):
    """``masked_fill(mask == 0, -inf)`` of a bool argument: -inf where it does not hold."""
    s = (q @ k.transpose(-2, -1)) * (1.0 / q.size(-1) ** 0.5)
    return torch.softmax(s.masked_fill(mask == 0, float("-inf")), dim=-1) @ v


FORMS = {f: kept for f, kept in ((masked_fill, False), (masked_fill_inverted, True),
                                 (where_kept, True), (masked_fill_eq_zero, True))}


@st.composite
def cases(draw):
    fn = draw(st.sampled_from(sorted(FORMS, key=lambda f: f.__name__)))
    dtype = draw(st.sampled_from(["float32", "float16"]))
    b, t, d = draw(st.sampled_from([1, 2])), draw(st.sampled_from([4, 8])), \
        draw(st.sampled_from([8, 16]))
    batched = draw(st.booleans())  # a (b, t, t) mask or one (t, t) for every batch
    seed = draw(st.integers(0, 2**16))
    return fn, dtype, (b, t, d), batched, seed


def _inputs(dtype: str, b: int, t: int, d: int, batched: bool, kept: bool, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, t, d, generator=gen) for _ in range(3))
    keep = torch.rand((b, t, t) if batched else (t, t), generator=gen) < 0.6
    keep[..., 0] = True  # every row keeps a score (a row of -inf only is NaN, as in torch)
    mask = keep if kept else ~keep
    dt = getattr(torch, dtype)
    return {"q": q.to(dt), "k": k.to(dt), "v": v.to(dt), "mask": mask}


@pytest.mark.skipif(not RUNS, reason="needs a GPU or TRITON_INTERPRET=1")
@settings(max_examples=6, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_masked_attention_keeps_the_functions_inputs(case):
    fn, dtype, (b, t, d), batched, seed = case
    args = _inputs(dtype, b, t, d, batched, FORMS[fn], seed)
    g = em.from_torch(fn, *args.values())
    assert list(g.inputs) == list(inspect.signature(fn).parameters) == list(args)
    assert g.inputs["mask"].dtype == "bool"
    assert any(n.op is Op.MASK for n in g.nodes())
    res = em.optimize(g, cache=False, trials=1, time_limit_s=300)
    assert res.verified.equivalent
    compiled = res.compile()
    on = {name: x.to(DEVICE) for name, x in args.items()}
    out = compiled(**on)
    got = (out["out"] if isinstance(out, dict) else out).float().cpu()
    want = fn(**{n: x.float() if x.is_floating_point() else x for n, x in args.items()})
    torch.testing.assert_close(got, want, rtol=TOL[dtype], atol=TOL[dtype])


def test_each_form_traces_to_the_mask_op_with_at_most_one_not():
    """Which masks the forms compute: -inf where ``mask`` holds is ``mask(not mask, s)``;
    -inf where it does not is ``mask(mask, s)``, with no not."""
    for fn, kept in FORMS.items():
        args = _inputs("float32", 1, 4, 8, False, kept, 0)
        g = em.from_torch(fn, *args.values())
        (sel,) = [n for n in g.nodes() if n.op is Op.MASK]
        cond = sel.srcs[0]
        if kept:
            assert cond is g.inputs["mask"], fn.__name__
        else:
            assert cond.op is Op.NOT and cond.srcs[0] is g.inputs["mask"], fn.__name__
        assert list(g.inputs) == ["q", "k", "v", "mask"]


def test_mask_comparisons_with_other_numbers_are_refused():
    def fn(s, m):
        return s.masked_fill(m == 2, float("-inf"))

    with pytest.raises(em.UnsupportedOpError, match=r"eq of \(bool, int\)"):
        em.from_torch(fn, torch.randn(4, 4), torch.rand(4, 4) < 0.5)
