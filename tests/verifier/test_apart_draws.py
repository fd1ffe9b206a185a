"""The ``apart`` draws (docs/verifier.md, section 5): each float input at its own binary
exponent, from a generator of their own (the same for every seed), judged for finiteness
where the first program computes every value finite (``floating.evaluate_finite``)."""

from __future__ import annotations

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.semantics.floating import evaluate_finite, rounded_inputs
from eqsat_mirage.verifier.floatcheck import float_checks
from eqsat_mirage.verifier.scales import (
    APART_DRAWS,
    GREATEST_SCALE,
    LEAST_SCALE,
    apart_powers,
    exp_range,
)

K, N = 256, 8


def _linear(kind: str) -> em.Graph:
    """A decode linear with an int8 weight and a scale per output: the scale before the
    product (the input), after it in float16, or after it in a float32 accumulator."""
    g = em.Graph(f"lin_{kind.replace(' ', '_')}")
    x = g.input("x", (2, K), dtype="float16")
    w = g.input("Wq", (K, N), dtype="int8").astype("float16")
    s = g.input("s", (1, N), dtype="float16")
    if kind == "after in float16":  # x @ Wq overflows float16 where x is near 2^8
        g.output((x @ w) * s, "y")
    elif kind == "after in float32":
        g.output(((x.astype("float32") @ w.astype("float32")) * s.astype("float32"))
                 .astype("float16"), "y")
    else:
        g.output(x @ (w * s), "y")
    return g


def test_the_exponents_are_each_inputs_own_and_the_same_for_every_seed():
    """Within [LEAST_SCALE, GREATEST_SCALE] (inside each dtype's range), the same on every
    call (no seed), one per input, and not all equal across the draws."""
    dtypes = ["float16", "float32", "bfloat16", "float16"]
    got = [apart_powers(j, dtypes) for j in range(APART_DRAWS)]
    assert got == [apart_powers(j, dtypes) for j in range(APART_DRAWS)]
    for powers in got:
        assert len(powers) == len(dtypes)
        for k, d in zip(powers, dtypes):
            assert max(LEAST_SCALE, exp_range(d)[0]) <= k <= min(GREATEST_SCALE,
                                                                exp_range(d)[1] - 3)
    assert len({k for powers in got for k in powers}) > 2


def test_the_scale_after_an_int8_product_in_float16_is_refused_for_every_seed():
    """``x @ (Wq * s)`` -> ``(x @ Wq) * s`` in float16: with x at its own exponent and s
    small, ``x @ Wq`` overflows where the input program is finite, whatever the seed; in
    a float32 accumulator it verifies, whatever the seed."""
    a = _linear("before")
    bad, good = _linear("after in float16"), _linear("after in float32")
    for seed in range(50):
        r = em.verify(a, bad, seed=seed)
        assert not r.equivalent, seed
        assert r.counterexample.check[:2] == ("native", "apart"), (seed, r.counterexample)
        assert "non-finite" in str(r.counterexample)
    for seed in range(0, 50, 7):
        assert em.verify(a, good, seed=seed).equivalent, seed


def test_every_value_finite_watches_intermediates_not_only_outputs():
    """``relu(x * c)``: at x * c = -inf the output is 0 (finite) by way of an overflow,
    and ``evaluate_finite`` says so; where nothing overflows it says finite, one value
    everywhere included."""
    g = em.Graph("relu_big")
    x = g.input("x", (4, 8), dtype="float16")
    g.output(em.relu(x * 4096.0), "y")
    over = rounded_inputs(g, {"x": np.full((4, 8), -100.0)})
    out, finite = evaluate_finite(g, over, dtype="native", rounded=True)
    assert np.all(out["y"] == 0.0) and not finite
    for value in (np.full((4, 8), 3.0), np.broadcast_to(np.float64(-2.0), (4, 8))):
        out, finite = evaluate_finite(g, rounded_inputs(g, {"x": value}), dtype="native",
                                      rounded=True)
        assert finite and np.all(np.isfinite(out["y"]))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_draw_where_the_first_program_overflows_constrains_nothing(seed):
    """Where the first program's value hangs on an overflow (``relu(x * c)`` at -inf:
    0), a candidate that is NaN there (``relu(x * c) + 0 * (x * c)``) is not refused by an
    ``apart`` draw; where the first program stays finite, it is."""
    k = apart_powers(0, ["float16"])[0]

    def prog(name, c, nan_there):
        g = em.Graph(name)
        x = g.input("x", (16, 64), dtype="float16")
        y = x * c
        g.output(em.relu(y) + y * 0.0 if nan_there else em.relu(y), "y")
        return g

    check = ("native", "apart", 0.0)
    for c in (2.0 ** (20 - k), 2.0 ** -k):
        a, b = prog("a", c, False), prog("b", c, True)
        cex, _ = float_checks(a, b, np.random.default_rng(seed), 1e-3, True, only=check)
        assert cex is None, (c, cex)  # too large: an overflow on the way; small: no NaN
    # a candidate that overflows where the first program does not: refused
    a = prog("a", 2.0 ** -k, False)
    g = em.Graph("b")
    x = g.input("x", (16, 64), dtype="float16")
    g.output(em.relu(x * 2.0 ** (20 - k)) * 2.0 ** -20, "y")
    cex, _ = float_checks(a, g, np.random.default_rng(seed), 1e-3, True, only=check)
    assert cex is not None and "non-finite" in cex.detail, cex
