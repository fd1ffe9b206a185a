"""The ``zeros`` draw (docs/verifier.md, section 5): every float input N(0, 1) with exact
zeros at about one element in eight, at positions the same for every seed, judged for
finiteness where the first program computes every value finite. The audit re-run's
``y -> (x / x) * y``: no other draw has an input at exactly 0, and it verified for every
seed."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.verifier.scales import ZERO_EVERY, zero_mask

SEEDS = range(50)


def _pair(f, g, dtype: str) -> tuple[em.Graph, em.Graph]:
    out = []
    for name, fn in (("a", f), ("b", g)):
        p = em.Graph(name)
        x, y = p.input("x", (4, 8), dtype=dtype), p.input("y", (4, 8), dtype=dtype)
        p.output(fn(x, y), "O")
        out.append(p)
    return out[0], out[1]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_rewrite_that_divides_by_an_input_is_refused_for_every_seed(dtype):
    """``y * 2 -> (x / x) * (y * 2)``: NaN where x is 0, where the first program is finite;
    refused for all 50 seeds, and by the zeros draw."""
    a, b = _pair(lambda x, y: y * 2.0, lambda x, y: (x / x) * (y * 2.0), dtype)
    verdicts = [em.verify(a, b, seed=s) for s in SEEDS]
    assert not any(r.equivalent or r.inconclusive for r in verdicts)
    assert "exactly 0 at about one element in 8" in verdicts[0].reason


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_safe_direction_and_a_true_rewrite_verify_for_every_seed(dtype):
    """Removing the division (``(x / x) * y -> y``: the first program NaN where x is 0,
    nothing asked there) and ``y * 2 -> y + y`` verify for all 50 seeds."""
    a, b = _pair(lambda x, y: (x / x) * y, lambda x, y: y, dtype)
    c, d = _pair(lambda x, y: y * 2.0, lambda x, y: y + y, dtype)
    assert all(em.verify(a, b, seed=s).equivalent for s in SEEDS)
    assert all(em.verify(c, d, seed=s).equivalent for s in SEEDS)


def test_the_zero_positions_are_fixed_sparse_and_never_empty():
    """About one element in ``ZERO_EVERY`` is 0, the same positions whatever the seed, and
    an input of one element is 0 (element ``i`` mod its size is always among them)."""
    big = zero_mask(3, (64, 512))
    assert np.array_equal(big, zero_mask(3, (64, 512)))
    assert abs(big.mean() - 1 / ZERO_EVERY) < 0.01
    assert not np.array_equal(big, zero_mask(4, (64, 512)))  # each input its own
    assert zero_mask(0, (1,)).all() and zero_mask(5, (3,))[5 % 3]


def test_check_rules_finds_a_rule_that_introduces_a_division_float_unsafe():
    """A user rule that multiplies by ``a / a`` is sound over the reals where a is not 0,
    and not float-safe: the zeros draw gives NaN where the left side is finite."""
    text = "(ruleset user)\n(rewrite (Mul a b) (Mul (Div a a) (Mul a b)) :ruleset user)\n"
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "r.egg")
        with open(path, "w") as f:
            f.write(text)
        res = em.check_rules(path).results
    assert res and all(r.status == "sound" and r.float_safe is False for r in res)
    assert all("exactly 0" in r.float_message for r in res), [r.float_message for r in res]
