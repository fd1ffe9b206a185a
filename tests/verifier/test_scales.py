"""The scales of the exponent-range draws (``verifier/scales.py``): the trough's search finds
what a plain bisection finds, in fewer evaluations where the outputs have one degree; the
exponent draws keep every exponent the old range gave above ``LEAST_SCALE``."""

import numpy as np

from eqsat_mirage.verifier.scales import (
    EXP_RANGE,
    LEAST_SCALE,
    exponent_power,
    trough,
)


def bisection(normal, lo: int) -> int | None:
    """The plain search: the largest k in [lo, 0] that is not normal (lo if all are)."""
    if not normal(0):
        return None
    if normal(lo):
        return lo
    low, high = lo, 0
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if normal(mid) else (mid, high)
    return low


def test_the_trough_is_the_bisections_whatever_the_guess():
    rng = np.random.default_rng(0)
    calls = []
    for _ in range(2000):
        lo = int(rng.choice([-14, -24]))
        first = int(rng.integers(lo - 3, 3))  # the least k at which the outputs are normal
        degree, skew = float(rng.uniform(0.3, 4.0)), float(rng.normal(0.0, 3.0))
        bent = bool(rng.integers(2))  # a median that is not linear in k
        n = [0]

        def counts(k: int, first=first, degree=degree, skew=skew, bent=bent, n=n):
            n[0] += 1
            median = (k - first + 0.5) * degree + (skew * (k / 8.0) ** 2 if bent else 0.0)
            return 100, 100, 60 if k >= first else 40, median

        assert trough(counts, lo) == bisection(lambda k, first=first: k >= first, lo)
        if not bent and lo < first <= 0:
            calls.append(n[0])
    assert max(calls) <= 4  # one degree: 0, lo, the guess and one beside it


def test_a_trough_where_the_first_program_fails_is_none():
    def counts(k: int):  # non-finite below -10, normal from -9
        return (100, 0, 0, -np.inf) if k <= -10 else (100, 100, 100 if k >= -9 else 0, 1.0)

    assert trough(counts, -14) is None

    def floor(k: int):  # normal everywhere it is finite, but 99% non-finite at the floor
        return (100, 100, 100, 3.0) if k > -5 else (100, 1, 1, 1.0)

    assert trough(floor, -24) is None


def test_exponent_draws_keep_the_old_exponents_above_the_least_scale():
    for base in range(200):
        for j in range(2):
            for dts in (["float32"], ["bfloat16", "float32"], ["float16"]):
                g = np.random.default_rng([base, 1, j])
                old = int(g.integers(max(EXP_RANGE[d][0] for d in dts),
                                     min(EXP_RANGE[d][1] for d in dts) - 2))
                k = exponent_power(base, j, dts)
                assert k >= LEAST_SCALE and (k == old or old < LEAST_SCALE)
