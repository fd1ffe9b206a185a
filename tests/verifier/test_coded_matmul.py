"""A quantized weight's dequantization kept as a table and codes until read whole
(``semantics.coded``: ``CodedValue``), and the matmul of one value by it summed from each
code's count (``floating._coded_matmul``): the same outputs as the weight computed element
by element, inf and NaN included, and the same verdicts, bounds and refusals from
``em.verify`` as without the fixed inputs' sharing (``draws.SHARE_FIXED``)."""

from __future__ import annotations

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.semantics import coded as coded_mod
from eqsat_mirage.semantics import floating
from eqsat_mirage.semantics.floating import KeptValues, evaluate, evaluate_kept, rounded_inputs
from eqsat_mirage.verifier.fixed import table_codes

K, N = 1024, 8  # the table (256 x N) small beside the weight: the coded path runs


def _w8(kind: str = "reference", dtype: str = "int8") -> em.Graph:
    """A decode linear ``x @ (q * s[:, None]).T`` (weight [N, K], a scale per row)."""
    g = em.Graph(f"lin_{dtype}_{kind.replace(' ', '_')}")
    x = g.input("x", (1, K), dtype="float16")
    wq = g.input("Wq", (N, K), dtype=dtype)
    s = g.input("s", (N, 1), dtype="float32" if dtype.startswith("float8") else "float16")
    w = wq.astype(s.dtype)
    if kind == "scale squared":
        w = w * s * s
    elif kind == "rewritten":  # the scale after the product, in float32 as a kernel's
        # accumulator holds it (in float16 ``x @ w`` overflows where x is 2^7 and s small:
        # the ``apart`` draws refuse that form)
        g.output(((x.astype("float32") @ w.astype("float32").T) * s.astype("float32").T)
                 .astype("float16"), "y")
        return g
    elif kind == "scaled up":  # equal over the reals, overflows float16 where x is large
        g.output(((x * 4096.0) @ (w * s).astype("float16").T) * (1.0 / 4096.0), "y")
        return g
    else:
        w = w * s
    g.output(x @ w.astype("float16").T, "y")
    return g


@pytest.fixture
def summed(calls_kept):
    """Whether each matmul by one value was summed from the codes (``_coded_matmul``)."""
    return calls_kept(floating, '_coded_matmul')


@pytest.mark.parametrize("dtype", ["int8", "float8_e4m3fn"])
@pytest.mark.parametrize("mode", ["native", None])
def test_coded_matmul_is_the_elementwise_result(dtype, mode, summed):
    g = _w8(dtype=dtype)
    rng = np.random.default_rng(7)
    from eqsat_mirage.semantics.floating import draw_ints
    from eqsat_mirage.semantics.fp8 import draw_fp8

    wq = draw_ints(rng, (N, K), dtype) if dtype == "int8" else draw_fp8(rng, (N, K), dtype)
    codes, table = table_codes(wq)
    # x and s one value each: 1, 0, a power of two, one that overflows the weight (inf
    # elements of both signs: NaN sums), NaN, and an x that is inf itself
    for xv, sv in ((1.0, 1.0), (0.0, 2.0), (-4.0, 0.25), (1.0, 2.0**12), (0.0, 2.0**12),
                   (np.inf, 1.0), (-np.inf, 0.0), (np.nan, 1.0), (1.0, np.nan), (3.0, -0.5)):
        raw = {"x": np.broadcast_to(np.float64(xv), (1, K)), "Wq": wq,
               "s": np.broadcast_to(np.float64(sv), (N, 1))}
        inputs = rounded_inputs(g, raw) if mode == "native" else dict(raw)
        inputs["Wq"] = wq
        known = coded_mod.Coded()
        known.add(wq, codes, table)
        summed.clear()
        got = evaluate_kept(g, inputs, lambda n: None, KeptValues(0), mode,
                            mode == "native", coded=known)
        assert any(summed) or np.isnan(xv) or np.isnan(sv), (xv, sv)  # (NaN: not computed)
        want = evaluate(g, inputs if mode == "native" else raw, dtype=mode,
                        rounded=mode == "native")
        assert np.array_equal(got["y"], want["y"], equal_nan=True), (xv, sv, got, want)


@pytest.mark.parametrize("dtype", ["int8", "float8_e4m3fn"])
def test_verify_the_same_with_and_without_codes(dtype, summed, sharing):
    ref = _w8(dtype=dtype)
    # the scaled-up product refused by the float checks, the squared scale in the field
    same = "rewritten" if dtype == "int8" else "reference"  # (fp8: a float32 scale)
    for kind, want in ((same, True), ("scaled up", False), ("scale squared", False)):
        got = {}
        for share in (True, False):
            summed.clear()
            got[share] = sharing(share, lambda kind=kind: em.verify(ref, _w8(kind, dtype), seed=3))
            if kind != "scale squared":
                assert any(summed) == share, (kind, share)
        fast, plain = got[True], got[False]
        assert fast.equivalent == plain.equivalent == want, (kind, fast, plain)
        assert fast.false_positive_bound == plain.false_positive_bound
        assert fast.trials == plain.trials and fast.primes == plain.primes
        if not want:
            assert fast.counterexample.domain == plain.counterexample.domain, (fast, plain)
            assert fast.counterexample.domain == ("Z_p x Z_q" if kind == "scale squared"
                                                  else "native dtype"), fast


def test_coded_matmul_rounds_once_after_scaling(summed):
    """A float32 weight whose code sums pass float32's largest while the product by a small
    value does not (x = 2^-100, s = 2^120): summed in float64 and scaled before the one
    rounding, finite as element by element (the sums rounded first gave inf)."""
    g = em.Graph("lin_f32")
    x = g.input("x", (1, K), dtype="float32")
    wq = g.input("Wq", (N, K), dtype="int8")
    s = g.input("s", (N, 1), dtype="float32")
    g.output(x @ (wq.astype("float32") * s).T, "y")
    from eqsat_mirage.semantics.floating import draw_ints

    q = draw_ints(np.random.default_rng(3), (N, K), "int8")
    codes, table = table_codes(q)
    raw = {"x": np.broadcast_to(np.float64(2.0**-100), (1, K)), "Wq": q,
           "s": np.broadcast_to(np.float64(2.0**120), (N, 1))}
    inputs = rounded_inputs(g, raw)
    inputs["Wq"] = q
    known = coded_mod.Coded()
    known.add(q, codes, table)
    got = evaluate_kept(g, inputs, lambda n: None, KeptValues(0), "native", True, coded=known)
    want = evaluate(g, inputs, dtype="native", rounded=True)
    assert any(summed)
    assert np.isfinite(want["y"]).all()
    np.testing.assert_array_equal(got["y"], want["y"])


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize(("shape", "axis"), [((300, 512), 0), ((512, 300), 1),
                                             ((4, 300, 512), 1), ((300, 4, 512), 0)])
def test_per_channel_look_up_row_by_row_is_the_element_by_element_one(shape, axis, dtype):
    """A table varying along one axis (a per-channel scale), looked up row by row
    (``coded._by_rows``), equals ``table[codes]`` element by element, for the codes and for
    their transpose (a transposed weight's view)."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 256, shape, dtype=np.uint8)
    wide = [1] * len(shape)
    wide[axis] = shape[axis]
    table = rng.standard_normal((256, *wide)).astype(dtype)
    assert codes.size >= coded_mod.BY_ROWS_FROM * shape[axis]  # the row-by-row path runs
    ref = np.take_along_axis(np.broadcast_to(table, (256,) + shape),
                             codes[None].astype(np.intp), 0)[0]
    got = coded_mod.look_up(codes, table)
    assert got.dtype == table.dtype and np.array_equal(got, ref)
    flipped = np.moveaxis(table, list(range(1, len(shape) + 1)), list(range(len(shape), 0, -1)))
    assert np.array_equal(coded_mod.look_up(codes.T, flipped), ref.T)
