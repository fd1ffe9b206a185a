"""Comparison bits multiply: the bit degree of an output (how many comparison bits are
multiplied together in one of its elements) sets the per-trial catch 2**-k of a
difference through them (verifier/bound.py, docs/verifier.md)."""

# ruff: noqa: N806

from __future__ import annotations

import pytest

import eqsat_mirage as em
from eqsat_mirage.verifier.bound import COMPARE_CATCH, bit_degrees, per_trial_bound
from eqsat_mirage.verifier.verify import DEFAULT_MAX_TRIALS, MAX_BIT_TRIALS, trial_cap


def gate(n: int, nested: bool = False) -> em.Graph:
    """where(X > 0 & Y > 0 & ..., X, 0) over the first ``n`` of four (1,) inputs (``nested``:
    one where per comparison instead of their logical and)."""
    g = em.Graph(f"gate{n}")
    xs = [g.input(c, (1,), "float32") for c in "XYZW"]
    masks = [x > 0.0 for x in xs[:n]]
    zero = 0.0 * xs[0]
    if nested:
        v = xs[0]
        for m in masks:
            v = em.where(m, v, zero)
    else:
        m = masks[0]
        for other in masks[1:]:
            m = em.logical_and(m, other)
        v = em.where(m, xs[0], zero)
    g.output(v, "O")
    return g


def clamp(nested: bool = False) -> em.Graph:
    """A clamp to [-1, 2] as two wheres (``nested``: then a clamp of twice that)."""
    g = em.Graph("clamp")
    X = g.input("X", (4, 8), "float32")
    zero = 0.0 * X
    y = em.where(X < -1.0, zero - 1.0, em.where(X > 2.0, zero + 2.0, X))
    if nested:
        y2 = y * 2.0
        y = em.where(y2 < -1.5, zero - 1.5, em.where(y2 > 3.0, zero + 3.0, y2))
    g.output(y, "O")
    return g


def test_bit_degrees_of_a_few_graphs():
    assert bit_degrees(clamp()) == {"O": 2}
    assert bit_degrees(clamp(nested=True)) == {"O": 4}  # 4 comparisons (the sum rule says 8)
    assert bit_degrees(gate(4)) == {"O": 4} and bit_degrees(gate(4, nested=True)) == {"O": 4}
    g = em.Graph("twice")  # a comparison of a value that depends on a comparison
    X, Y = g.input("X", (4, 8), "float32"), g.input("Y", (4, 8), "float32")
    g.output(em.where(em.where(X > 0.0, X, Y) > 1.0, X, Y), "O")
    assert bit_degrees(g) == {"O": 2}
    g = em.Graph("root")  # a function of a sum of 4 bits' values: a polynomial of degree 4 in
    xs = [g.input(c, (1,), "float32") for c in "XYZW"]  # them (a crafted difference can
    t = [em.where(x > 0.0, x, 0.0 * x) for x in xs]  # hide where all 4 hold)
    g.output(em.sqrt(t[0] + t[1] + t[2] + t[3]), "O")
    g.output(xs[0] / (t[0] + t[1] + 1.0), "D")  # a divisor's bits: 2
    g.output(em.sqrt(t[0] + t[1]) / (t[0] + t[1] + 1.0), "E")  # 2 + 2, but only 2 bits
    assert bit_degrees(g) == {"O": 4, "D": 2, "E": 2}
    g = em.Graph("rows")  # a row summed: its bits combine, the sum rule counts
    X = g.input("X", (4, 8), "float32")
    s = em.where(X > 0.0, X, 0.0 * X).sum(-1)
    g.output(em.where(s > 1.0, s, 0.0 * s) * s, "O")
    assert bit_degrees(g) == {"O": 1 + 1 + 1 + 1}  # (1 + 1) + 1 for the where, + 1 for * s
    g = em.Graph("plain")
    X, M = g.input("X", (4, 8), "float32"), g.input("M", (4, 8), "bool")
    g.output(em.where(M, em.exp(X), X * X), "O")  # a bool input is no bit: 0
    assert bit_degrees(g) == {"O": 0}


def test_the_per_trial_bound_catches_2_to_the_minus_k():
    eps = per_trial_bound(gate(4), gate(3))
    assert eps.bits == 4 and eps.value >= 1.0 - COMPARE_CATCH ** 4
    assert "4 comparison bits multiplied" in eps.explain()
    assert per_trial_bound(clamp(), clamp()).bits == 2
    assert trial_cap(per_trial_bound(clamp(), clamp()), 1e-9) == 73  # 72 at 3/4 alone
    assert trial_cap(per_trial_bound(gate(1), gate(1)), 1e-9) == DEFAULT_MAX_TRIALS


@pytest.mark.parametrize("nested", [False, True], ids=["and", "nested_where"])
def test_four_comparisons_against_three_are_never_equivalent(nested):
    # the difference lies where all four hold: a trial sees it with probability 1/16 (times
    # the float checks' luck at shape (1,)); 1/2 a trial once let 4 of 20 seeds through
    for seed in range(20):
        res = em.verify(gate(4, nested), gate(3, nested), seed=seed)
        assert not res.equivalent, (seed, res)
        if res.inconclusive:  # no trial met it: the bound says it is not small enough
            assert res.false_positive_bound > 1e-9
        else:
            assert res.counterexample is not None


def test_a_true_rewrite_of_bit_degree_2_is_equivalent():
    a = clamp()
    g = em.Graph("clamp_shifted")  # the same two bits: each comparison of the same difference
    X = g.input("X", (4, 8), "float32")
    g.output(em.where(X + 3.0 < 2.0, X * 0.0 - 1.0, em.where(X - 2.0 > 0.0, X * 0.0 + 2.0, X)),
             "O")
    res = em.verify(a, g, seed=0)
    assert res.equivalent and res.false_positive_bound <= 1e-9
    assert 72 <= res.trials <= MAX_BIT_TRIALS


def test_a_mugraph_carries_bit_degrees_from_kernel_to_kernel():
    for g, k in ((clamp(), 2), (clamp(nested=True), 4), (gate(4), 4)):
        assert em.MuGraph.from_graph(g).bit_degrees() == {"O": k}
        assert bit_degrees(em.MuGraph.from_graph(g)) == {"O": k}
