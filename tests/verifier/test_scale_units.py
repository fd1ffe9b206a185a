"""Dequantization scales are drawn in the dequantized weight's unit (issue 53): a float
input that multiplies int8 or fp8 codes is drawn divided by the codes' largest magnitude,
so the weight ``w_q.astype(f) * s`` has a float draw's magnitude. Before, the weights were
drawn 128 times larger and a float16 program's sums overflowed at every plain draw; the
input program came back finite only by accident (``x * rsqrt(inf)`` is 0) and a candidate
that rounds differently was refused there, for every seed."""

import pytest

import eqsat_mirage as em
from eqsat_mirage.verifier.draws import Draws
from eqsat_mirage.verifier.fixed import scale_units

np = pytest.importorskip("numpy")


def cubed_norm(times: float, name: str, codes: str = "int8"):
    """``y = x @ (q * s)``, then ``y**3`` in float16 (``(y * times) * (y * y) / times`` in
    the candidate: it overflows where ``y**3 * times`` does), RMS-normalized in float32."""
    g = em.Graph(name)
    x = g.input("x", (4, 64), dtype="float16")
    q = g.input("q", (64, 64), dtype=codes)
    s = g.input("s", (64,), dtype="float16")
    y = x @ (q.astype("float16") * s)
    e = (y * times) * (y * y) / times if times != 1 else y * (y * y)
    z = e.astype("float32")
    g.output((z * em.rsqrt((z * z).mean(axis=-1, keepdims=True) + 1e-6)).astype("float16"),
             "z")
    return g


def test_scale_units_find_the_scale_of_int8_and_fp8_codes():
    for codes, unit in (("int8", 1 / 128), ("float8_e4m3fn", 1 / 448)):
        g = cubed_norm(1, "a", codes)
        d = Draws(g, np.random.default_rng(0), None)
        assert d.units == {"s": pytest.approx(unit)}, codes
        assert float(np.max(np.abs(d.normal["s"]))) < 5 * unit  # its normal draw, scaled
    g = em.Graph("float_weight")
    x, w = g.input("x", (4, 8)), g.input("w", (8, 8))
    g.output(x @ (w * x.sum(axis=0, keepdims=True).T), "y")
    assert scale_units(g, {}) == {}


def test_positions_and_scales_read_otherwise_keep_their_draws():
    """Positions are no codes (``pos * inv_freq``: the angles keep their draw's range), and
    a scale that is also read otherwise (an addend here) keeps its draw."""
    g = em.Graph("rope_angles")
    pos = g.input("pos", (16, 1), dtype="int64")
    inv = g.input("inv_freq", (1, 8))
    g.output(em.cos(pos.astype("float32") * inv), "c")
    assert Draws(g, np.random.default_rng(0), None).units == {}
    g = em.Graph("scale_reused")
    x = g.input("x", (4, 8), dtype="float16")
    q = g.input("q", (8, 8), dtype="int8")
    s = g.input("s", (8,), dtype="float16")
    g.output(x @ (q.astype("float16") * s) + s, "y")
    assert Draws(g, np.random.default_rng(0), None).units == {}


@pytest.mark.parametrize("seed", range(4))
def test_a_rounding_change_is_judged_where_the_input_program_works(seed):
    """The candidate overflows 2**(1/3) times earlier in y than the input program: at the
    weights' real magnitude neither overflows and it verifies; 4096 times worse
    (overflowing at |y| > 2.5) it is refused, for every seed."""
    a = cubed_norm(1, "a")
    assert em.verify(a, cubed_norm(2.0, "b"), seed=seed).equivalent
    res = em.verify(a, cubed_norm(4096.0, "c"), seed=seed)
    assert not res.equivalent and res.counterexample.domain == "native dtype", str(res)
