"""The end-to-end check on draws where rounding alone decides the output (issue 31).

A float16 softmax of logits in the hundreds hinges on the last bit of its inputs: two
roundings of the same float16 computation differ past the tolerance. On such a draw the
end-to-end check asks only for finiteness (and says so); on a well-conditioned draw a
candidate that loses precision is still refused.
"""

import numpy as np

import eqsat_mirage as em
from eqsat_mirage.verifier.endtoend import float_check
from eqsat_mirage.verifier.floatcheck import float_checks


def _sharp_softmax(name: str, split: bool) -> em.Graph:
    """100 softmax(300 x) over 64 columns: the gap between a row's two largest logits is
    often about float16's spacing there. ``split``: the scale applied as 3 then 100, a
    different rounding of the same float16 computation."""
    g = em.Graph(name)
    x = g.input("x", (16, 64), dtype="float16")
    s = (x * 3.0) * 100.0 if split else x * 300.0
    g.output(em.softmax(s, axis=-1) * 100.0, "out")
    return g


def _sum(name: str, lossy: bool) -> em.Graph:
    g = em.Graph(name)
    x, y = (g.input(n, (32, 32), dtype="float16") for n in ("x", "y"))
    g.output(((x + 2048.0) - 2048.0 if lossy else x) + y, "out")  # 2048: float16 steps of 2
    return g


def _ill_conditioned(a, b, seed: int = 0) -> tuple:
    """The end-to-end check's float checks of ``b`` against ``a``: the counterexample and
    the normal native draws checked for finiteness only."""
    skipped: list[str] = []
    cex, native = float_checks(a, b, np.random.default_rng([seed, 0xE2E]), 1e-7, True,
                               constant_finite=True, conditioned=True, skipped=skipped)
    assert native
    return cex, skipped


def test_end_to_end_check_names_the_draws_it_checked_for_finiteness_only():
    a, b = _sharp_softmax("a", False), _sharp_softmax("b", True)
    found = [_ill_conditioned(a, b, seed) for seed in range(4)]
    assert all(cex is None for cex, _ in found)
    seed = next(i for i, (_, skipped) in enumerate(found) if skipped)
    assert any("N(0, s^2), s = 1" in d for d in found[seed][1])
    ran = float_check(a, b, seed=seed)
    assert ran.passed and ran.native, ran.message
    assert "finiteness only on" in ran.message and "N(0, s^2), s = 1" in ran.message
    # without the conditioning the same draw finds a difference past the tolerance
    cex, _ = float_checks(a, b, np.random.default_rng([seed, 0xE2E]), 1e-7, True,
                          constant_finite=True)
    assert cex is not None and cex.domain == "native dtype" and "tolerance" in cex.detail


def test_end_to_end_check_still_refuses_lost_precision():
    ran = float_check(_sum("a", False), _sum("b", True), seed=0)
    cex = ran.counterexample
    assert cex is not None and cex.domain == "native dtype", ran.message
    assert "finiteness only" not in ran.message
    assert _ill_conditioned(_sum("a", False), _sum("b", True))[1] == []  # x + y is not


def _w8(name: str, lossy: bool) -> em.Graph:
    g = em.Graph(name)
    x = g.input("x", (8, 32), dtype="float16")
    w = g.input("Wq", (32, 16), dtype="int8").astype("float16") * \
        g.input("s", (16,), dtype="float16")
    g.output(((x + 2048.0) - 2048.0 if lossy else x) @ w, "out")
    return g


def test_the_conditioning_holds_integer_inputs():
    """An int8 weight is stored data, not a rounded computation: the conditioning test
    moves the float inputs only (it raised for an int8 input: no unit in the last place),
    and lost precision is still refused."""
    cex, skipped = _ill_conditioned(_w8("a", False), _w8("b", True))
    assert cex is not None and cex.domain == "native dtype", cex
