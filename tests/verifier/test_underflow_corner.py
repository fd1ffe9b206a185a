"""The underflow corner (issue 51, "a verdict never depends on the seed";
``verifier/corners.py``: ``LOW``, ``draws.Draws.low_power``).

An RMSNorm's scale moved after its matmul, ``rms_norm(X) @ W -> (X @ W) * rms(X)``, stores
``X @ W`` in the inputs' dtype; where ``eps`` dominates the mean square, ``X @ W`` is about
1000 times smaller than the output and flushes to float16's (bfloat16's, float32's)
subnormals while the output does not. Only the exponent draws whose random scale fell
there found it (7 of seeds 0-49 in float16, 5 in float32, 3 in bfloat16); the underflow
corner, one binade below the smallest scale at which the first program's outputs are
normal, finds it for every seed. The forms that keep the product in float32 until the
scale is applied (the fused kernel the rmsnorm benchmark chooses) verify for every seed.
"""

# ruff: noqa: N803, N806

from __future__ import annotations

import numpy as np
import pytest
from mugraph_examples import rmsnorm_linear, rmsnorm_linear_graph

import eqsat_mirage as em
from eqsat_mirage.verifier.corners import LOW, low_bottom
from eqsat_mirage.verifier.draws import EXP_RANGE, NATIVE_MAX, NATIVE_TINY, Draws
from eqsat_mirage.verifier.floatcheck import float_checks

SEEDS = range(50)
DTYPES = ("float16", "float32", "bfloat16")
EPS = 1e-6
CORNER = ("native", LOW, 0.0)


def rms_pair(dt: str, form: str) -> tuple[em.Graph, em.Graph]:
    """``rms_norm(X) @ W`` (X 4x64, W 64x8) and the scale moved after the matmul, with
    ``X @ W`` in ``dt`` ("moved") or in float32, cast to ``dt`` at the end ("wide")."""
    out = []
    for side in ("lhs", form):
        g = em.Graph(f"rms-{side}-{dt}")
        X, W = g.input("X", (4, 64), dt), g.input("W", (64, 8), dt)
        if side == "lhs":
            y = em.rms_norm(X, eps=EPS) @ W
        elif side == "moved":
            y = (X @ W) * em.rsqrt((X * X).mean(axis=-1, keepdims=True) + EPS)
        else:
            Xf, Wf = X.astype("float32"), W.astype("float32")
            y = ((Xf @ Wf) * em.rsqrt((Xf * Xf).mean(axis=-1, keepdims=True) + EPS)).astype(dt)
        g.output(y, "O")
        out.append(g)
    return out[0], out[1]


def corner(a, b, seed: int):
    """The underflow corner's check alone (``float_checks``' ``only``), as ``em.verify``
    draws it for ``seed``."""
    cex, _ = float_checks(a, b, np.random.default_rng([seed, 0xF1047]), 1e-7, True,
                          only=CORNER)
    return cex


@pytest.mark.parametrize("dt", DTYPES)
def test_the_scale_moved_after_the_matmul_is_refused_for_every_seed(dt):
    a, b = rms_pair(dt, "moved")
    for seed in SEEDS:
        res = em.verify(a, b, seed=seed)
        assert not res.equivalent and not res.inconclusive, (seed, str(res))
        assert res.counterexample.domain == "native dtype", (seed, str(res))


@pytest.mark.parametrize("dt", DTYPES)
def test_the_corner_refuses_it_alone(dt):
    """Not a lucky exponent draw: the corner's check by itself refuses it (seeds 0-4), at
    the same scale for each."""
    a, b = rms_pair(dt, "moved")
    where = set()
    for seed in range(5):
        cex = corner(a, b, seed)
        assert cex is not None and cex.domain == "native dtype", seed
        assert cex.check == CORNER
        where.add(cex.detail.split("; inputs ")[1].split(";")[0])
    assert len(where) == 1, where
    assert "underflow corner" in where.pop()


@pytest.mark.parametrize("dt", ("float16", "bfloat16"))
def test_the_product_kept_in_float32_verifies_for_every_seed(dt):
    """``X @ W`` accumulated and scaled in float32, as one kernel computes it, rounded once
    at the end: no value narrower than the input program's, nothing flushed."""
    a, b = rms_pair(dt, "wide")
    for seed in SEEDS:
        res = em.verify(a, b, seed=seed)
        assert res.equivalent, (seed, str(res))


def test_the_fused_kernel_verifies_where_its_graph_form_does_not():
    """The kernel form of the rmsnorm benchmark (``tests/mugraph_examples.rmsnorm_linear``:
    the normalisation after the matmul, both accumulated in float32 in one kernel) verifies
    against ``rms_norm(X) @ W`` for every seed, the corner's check passing; the same
    algebra as a Graph, ``X @ W`` stored in float16, is refused by the corner."""
    g, mg = rmsnorm_linear()
    a = rmsnorm_linear_graph(moved=False)
    for seed in SEEDS:
        res = em.verify(a, mg, seed=seed)
        assert res.equivalent, (seed, str(res))
    for seed in range(3):
        assert corner(a, mg, seed) is None
        cex = corner(a, g, seed)
        assert cex is not None and cex.check == CORNER


def low_power(a, seed: int = 0) -> int | None:
    """The corner's scale for ``a``, as the native checks find it (``Draws.low_power``)."""
    draws = Draws(a, np.random.default_rng([seed, 0xF1047]), None,
                  min(NATIVE_MAX[n.dtype] for n in a.nodes()))
    draws.tiny = max(NATIVE_TINY[n.dtype] for n in a.nodes())
    return draws.low_power()


def test_the_corner_scale():
    """One binade below the smallest scale at which the first program's output is normal:
    for ``rms_norm(X) @ W`` (X 4x64) the output is ``X * 1000 @ W`` where ``eps`` dominates,
    2^(2k + 13) or so at scale 2^k, normal in float16 from 2^-14 and in float32 from about
    2^-70; the search is bounded below by the inputs' own subnormals, and the corner's check
    names the scale."""
    for dt in DTYPES:
        a, b = rms_pair(dt, "moved")
        assert low_bottom(a, EXP_RANGE) == {"float16": -24, "float32": -149,
                                            "bfloat16": -133}[dt]
        k = low_power(a)
        assert k == -15 if dt == "float16" else k in (-71, -70), (dt, k)
        assert corner(a, b, 0).detail.split("; inputs ")[1].endswith(f"s = {k}; ground "
                                                                     "truth in longdouble "
                                                                     "(64-bit significand)")


def test_no_corner_where_the_output_is_not_normal_at_scale_1():
    """Where the first program's outputs are not finite and normal on the signed draw
    (attention's exps overflow float16 there) there is no corner, and its check passes."""
    g = em.Graph("att")
    Q, K = g.input("Q", (2, 64), "float16"), g.input("K", (64, 8), "float16")
    s = em.exp(Q @ K * 8.0)
    g.output(s / s.sum(axis=-1, keepdims=True), "O")
    assert low_power(g) is None
    assert corner(g, g, 0) is None
