"""Issue 51: every public entry that takes ``time_limit_s`` refuses a value outside
``(0, MAX_SECONDS]`` (huge, infinite, NaN, zero, negative, not a number) with a MirageError
naming the option and the accepted range, never an ``OverflowError`` from a thread's wait
or a bare ``TimeoutError``."""

from __future__ import annotations

import pytest

import eqsat_mirage as em
from eqsat_mirage.ir.limits import MAX_SECONDS, Deadline

BAD = [1e10, 2**63, 10**400, float("nan"), float("inf"), 0, -1.0, "soon", True]


def tiny() -> em.Graph:
    g = em.Graph("tiny")
    x = g.input("x", (4, 8))
    g.output(em.exp(x) + x, "y")
    return g


def rules(tmp_path) -> str:
    path = tmp_path / "add.egg"
    path.write_text("(ruleset user)\n(rewrite (Add a b) (Add b a) :ruleset user)\n")
    return str(path)


RANGE = r"time_limit_s must be a number of seconds in \(0, 1e\+09\]"


@pytest.mark.parametrize("value", BAD, ids=repr)
def test_optimize_names_the_option_and_its_range(value):
    with pytest.raises(em.MirageError, match=f"optimize: {RANGE} or 'auto'"):
        em.optimize(tiny(), cache=False, time_limit_s=value)


@pytest.mark.parametrize("value", BAD, ids=repr)
def test_verify_names_the_option_and_its_range(value):
    with pytest.raises(em.MirageError, match=f"verify: {RANGE} or None"):
        em.verify(tiny(), tiny(), seed=0, time_limit_s=value)


@pytest.mark.parametrize("value", BAD, ids=repr)
def test_check_rules_names_the_option_and_its_range(value, tmp_path):
    with pytest.raises(em.MirageError, match=f"check_rules: {RANGE} or None"):
        em.check_rules(rules(tmp_path), time_limit_s=value)
    with pytest.raises(em.MirageError, match=f"check_rules: {RANGE}"):
        em.assert_sound(rules(tmp_path), time_limit_s=value)


def test_the_largest_limit_and_no_limit_still_work(tmp_path):
    assert em.verify(tiny(), tiny(), seed=0, time_limit_s=MAX_SECONDS).equivalent
    assert em.verify(tiny(), tiny(), seed=0, time_limit_s=None).equivalent
    assert em.check_rules(rules(tmp_path), time_limit_s=MAX_SECONDS).ok
    with pytest.raises(em.MirageError, match="time_limit_s"):
        Deadline(float("nan"))
    assert Deadline(0.0).expired()  # a deadline already past stays an internal value
