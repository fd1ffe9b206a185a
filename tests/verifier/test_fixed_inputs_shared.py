"""The float checks keep what is computed from the fixed (int8, fp8, index) inputs alone for
every draw and both programs, key the peak bisections by the float inputs only, and compute
elementwise ops on such a weight on its table of 256 values (``draws.SHARE_FIXED``,
``floating.Coded``): the same peaks, outputs, verdicts and counterexamples as computing
everything again."""

from __future__ import annotations

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.semantics import floating
from eqsat_mirage.semantics.floating import wrap_int
from eqsat_mirage.verifier.draws import Draws, table_codes
from eqsat_mirage.verifier.floatcheck import float_checks

K, N = 1024, 8  # a weight whose table (256 x N) is small beside it: the coded path runs


def _w8(kind: str = "reference") -> em.Graph:
    g = em.Graph(f"w8_{kind.replace(' ', '_')}")
    x = g.input("x", (2, K), dtype="float16")
    wq = g.input("Wq", (K, N), dtype="int8")
    s = g.input("s", (N,), dtype="float16")
    z = g.input("z", (N,), dtype="float16")
    w = (wq.astype("uint8") if kind == "wrapped" else wq).astype("float16")
    w = w + z if kind == "zero point sign" else w - z
    if kind == "rewritten":  # the scale after the product, in a float32 accumulator (in
        # float16 ``x @ w`` overflows where s is small: the ``apart`` draws refuse it)
        g.output(((x.astype("float32") @ w.astype("float32")) * s.astype("float32"))
                 .astype("float16"), "y")
    else:
        g.output(x @ (w * s), "y")
    return g


def _f8(kind: str = "reference") -> em.Graph:
    g = em.Graph(f"f8_{kind.replace(' ', '_')}")
    x = g.input("x", (2, K), dtype="float16")
    wq = g.input("Wq", (N, K), dtype="float8_e4m3fn")
    s = g.input("s", (N, 1), dtype="float32")
    scale = s * s if kind == "scale squared" else s
    g.output(x @ (wq.astype("float32") * scale).astype("float16").T, "y")
    return g


def _cex(c):
    return None if c is None else (c.domain, c.output, c.index, c.value_a, c.value_b, c.check,
                                   c.detail)


@pytest.fixture
def coded_runs(calls_kept):
    """How many elementwise ops ran on a table (``floating._coded``)."""
    return calls_kept(floating, '_coded')


@pytest.mark.parametrize("build,kinds", [
    (_w8, (("reference", None), ("rewritten", None), ("zero point sign", "refused"),
           ("wrapped", "refused"))),
    (_f8, (("reference", None), ("scale squared", "refused")))])
def test_shared_fixed_values_give_the_same_peaks_and_verdicts(build, kinds, coded_runs,
                                                              sharing):
    ref = build()
    for kind, found in kinds:
        got = {}
        for share in (True, False):
            def check(kind=kind):
                out = float_checks(ref, build(kind), np.random.default_rng([3, 0xF1047]),
                                   1e-7, True)
                return _cex(out[0]), out[1]
            coded_runs.clear()
            got[share] = sharing(share, check)
            if not share or found is None:  # the table path ran (all checks), or not
                assert any(coded_runs) == share, (kind, share)
        assert got[True] == got[False], (kind, got)
        assert (got[True][0] is None) == (found is None), (kind, got)
    # the bisections: every input's peak the same either way
    peaks = {share: sharing(share, lambda: [
        Draws(ref, np.random.default_rng(5), None, 65504.0).peak(i)
        for i in range(len(ref.inputs))]) for share in (True, False)}
    assert peaks[True] == peaks[False]


def test_verify_verdicts_unchanged_by_sharing(sharing):
    ref = _w8()
    for kind, want in (("reference", True), ("rewritten", True), ("zero point sign", False)):
        for seed in (0, 1):
            r = {share: sharing(share, lambda kind=kind, seed=seed: em.verify(
                ref, _w8(kind), seed=seed, float_first=True)) for share in (True, False)}
            assert r[True].equivalent == r[False].equivalent == want, (kind, seed)
            assert _cex(r[True].counterexample) == _cex(r[False].counterexample)


def test_table_codes_and_wrap_int_are_exact():
    x = np.array([[-0.0, 0.0, 1.5], [np.nan, -0.0, 1.5]])
    codes, table = table_codes(x)
    back = table[codes]
    assert np.array_equal(back.view(np.uint64), x.view(np.uint64))  # -0.0 and NaN kept
    assert table_codes(np.arange(300.0)) is None  # more than 256 values
    v = np.array([-128.0, -1.0, 0.0, 127.0])
    assert wrap_int(v, "uint8").tolist() == [128.0, 255.0, 0.0, 127.0]
    assert wrap_int(v, "int8").tolist() == v.tolist()
    assert wrap_int(np.array([300.0, np.nan]), "uint8")[0] == 44.0
