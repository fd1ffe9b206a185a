"""The end-to-end check on draws where rounding alone decides the output (issue 31).

A float16 softmax of logits in the hundreds hinges on the last bit of its inputs: on
such a draw the end-to-end check asks only for finiteness (and says so); on a
well-conditioned draw a candidate that loses precision is still refused.
"""

import numpy as np

import eqsat_mirage as em
from eqsat_mirage.verifier.endtoend import float_check
from eqsat_mirage.verifier.floatcheck import float_checks


def _sharp_softmax(name: str, wide: bool) -> em.Graph:
    """softmax(100 x) over 64 columns: the gap between a row's two largest logits is about
    as large as float16's spacing there. ``wide``: computed in float32, as a fused kernel
    (or eager torch) computes it, rounded once."""
    g = em.Graph(name)
    x = g.input("x", (16, 64), dtype="float16")
    p = em.softmax(x.astype("float32") * 100.0, axis=-1).astype("float16") if wide \
        else em.softmax(x * 100.0, axis=-1)
    g.output(p, "out")
    return g


def _sum(name: str, lossy: bool) -> em.Graph:
    g = em.Graph(name)
    x, y = (g.input(n, (32, 32), dtype="float16") for n in ("x", "y"))
    g.output(((x + 2048.0) - 2048.0 if lossy else x) + y, "out")  # 2048: float16 steps of 2
    return g


def _ill_conditioned(a, seed: int = 0) -> list[str]:
    """The normal native draws on which rounding alone decides ``a``'s output (``a``
    checked against itself, as the end-to-end check draws them)."""
    skipped: list[str] = []
    cex, native = float_checks(a, a, np.random.default_rng([seed, 0xE2E]), 1e-7, True,
                               constant_finite=True, conditioned=True, skipped=skipped)
    assert cex is None and native
    return skipped


def test_a_sharp_softmax_is_ill_conditioned_and_a_sum_is_not():
    assert any("N(0, s^2), s = 1" in d for seed in range(4)
               for d in _ill_conditioned(_sharp_softmax("a", False), seed))
    assert _ill_conditioned(_sum("s", False)) == []


def test_end_to_end_check_names_the_draws_it_checked_for_finiteness_only():
    a, b = _sharp_softmax("a", False), _sharp_softmax("b", True)
    seed = next(s for s in range(4) if _ill_conditioned(a, s))
    ran = float_check(a, b, seed=seed)
    assert ran.passed and ran.native, ran.message
    assert "finiteness only on" in ran.message and "N(0, s^2), s = 1" in ran.message


def test_end_to_end_check_still_refuses_lost_precision():
    ran = float_check(_sum("a", False), _sum("b", True), seed=0)
    cex = ran.counterexample
    assert cex is not None and cex.domain == "native dtype", ran.message
    assert "finiteness only" not in ran.message
