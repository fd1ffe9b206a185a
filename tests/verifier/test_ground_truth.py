"""The float checks' ground truth (verifier/truth.py, docs/verifier.md section 5): the input
program in a precision wider than float64 within a work bound, float64 above it; a case
float64 misjudges, and the measured margin by which float64 suffices on the catalogue."""

import math

import numpy as np
import pytest
from test_catalogue import IDENTITIES  # pytest puts this folder on sys.path

import eqsat_mirage as em
from eqsat_mirage.ir.node import QUANT_DTYPES
from eqsat_mirage.semantics.floating import draw_ints, rounded_inputs
from eqsat_mirage.semantics.gather import draw_indices, index_bounds
from eqsat_mirage.verifier import truth as gt

wide = pytest.mark.skipif(gt.WIDE is None, reason="numpy longdouble is float64 on this machine")


def cancel(cancelled: bool, c: float = 2.0**55) -> em.Graph:
    """``(x + c) - c + y`` (float32 and float64 both lose x: 0 for |x| < 4), or ``x + y``."""
    g = em.Graph("cancel" if cancelled else "exact")
    x, y = g.input("x", (2, 4), "float32"), g.input("y", (2, 4), "float32")
    g.output(((x + c) - c if cancelled else x) + y, "out")
    return g


@wide
def test_float64_as_truth_misjudges_an_exact_rewrite(monkeypatch):
    a, b = cancel(True), cancel(False)
    x = {"x": np.full((2, 4), 0.3), "y": np.zeros((2, 4))}
    r64 = em.evaluate(a, x)["out"]
    rw, how = gt.truth(a, rounded_inputs(a, x), {"out": r64})
    assert how == gt.WIDE_NAME
    assert np.all(r64 == 0.0)  # float64 loses x entirely: it would call 0 the truth
    assert np.all(np.abs(rw["out"] - 0.3) < 2.0**-8)  # the wide truth keeps it
    # with the wide truth the exact rewrite verifies (it is more accurate, never less) ...
    assert em.verify(a, b, seed=0).equivalent
    # ... with float64 as the truth it is refused: the input program's 0 looks exact
    monkeypatch.setattr(gt, "TRUTH_WORK", 0)
    res = em.verify(a, b, seed=0)
    assert not res.equivalent and res.counterexample.domain == "native dtype", res
    cex = res.counterexample  # every input = s: the first program's x + y is y, the exact 2 s
    assert "ground truth in float64" in res.reason and cex.value_b == 2.0 * cex.value_a


@wide
def test_float64_suffices_on_the_catalogue_by_a_wide_margin():
    """|float64 - wide truth| against float32's tolerance times the output's magnitude, on
    both sides of every identity, at N(0, 1) 2^k draws across the exponent range: the
    first-order argument (float64 is 2^29 times more precise than float32) holds with a
    margin of 2^30 or more (measured: 2^-37.3, safe-softmax-fp16)."""
    rng = np.random.default_rng(0)
    worst, checked = 0.0, 0
    for case in IDENTITIES:
        for side in ("lhs", "rhs"):
            g = case.build(side)
            if gt.precision(g) == "float64":
                continue
            rows = index_bounds(g)  # an index input (a gather's): valid integer indices
            for k in (0, 6, -6, 20, -20):
                raw = {n: draw_indices(rng, v.shape, rows[n]) if n in rows
                       else draw_ints(rng, v.shape, v.dtype) if v.dtype in QUANT_DTYPES
                       else (rng.random(v.shape) < 0.75).astype(float) if v.dtype == "bool"
                       else rng.standard_normal(v.shape) * 2.0**k for n, v in g.inputs.items()}
                x = rounded_inputs(g, raw)
                r64 = em.evaluate(g, x)
                rw, _ = gt.truth(g, x, r64)
                for o, a in r64.items():
                    ok = np.isfinite(a) & np.isfinite(rw[o])
                    if ok.any():
                        scale = float(np.max(np.abs(rw[o][ok]))) or 1.0
                        worst = max(worst, float(np.max(np.abs(a[ok] - rw[o][ok])))
                                    / (1e-4 * scale))
                        checked += 1
    assert checked > 200
    assert worst < 2.0**-30, math.log2(worst)


def test_the_work_bound_falls_back_to_float64():
    small, big = cancel(True), em.Graph("big")
    p, q = big.input("P", (512, 512), "float32"), big.input("Q", (512, 512), "float32")
    big.output(p @ q, "O")
    assert gt.work(big) == 512**3 > gt.TRUTH_WORK
    assert gt.precision(big) == "float64"
    assert gt.precision(small) == (gt.WIDE_NAME if gt.WIDE is not None else "float64")
    out = {"O": np.zeros((512, 512))}
    assert gt.truth(big, {}, out) == (out, "float64")  # not evaluated again


@wide
def test_wide_truth_keeps_constant_draws_cheap_and_exact():
    g = em.Graph("sums")
    x = g.input("x", (64, 1024), "float32")
    w = g.input("w", (1024, 8), "float32")
    g.output(em.exp(x.sum(axis=1, keepdims=True) * 1e-3) + (x @ w).mean(axis=0), "o")
    assert gt.precision(g) == gt.WIDE_NAME
    inputs = {n: np.broadcast_to(np.float32(0.5), v.shape) for n, v in g.inputs.items()}
    r64 = em.evaluate(g, inputs)
    rw, _ = gt.truth(g, inputs, r64)
    assert np.allclose(rw["o"], np.exp(0.512) + 256.0, rtol=1e-15)
    assert np.allclose(rw["o"], r64["o"], rtol=1e-12)
