"""Careless input to the builder, the rule loader and optimize gets a project error naming it."""

from __future__ import annotations

import numpy as np
import pytest

import eqsat_mirage as em


@pytest.mark.parametrize("shape", [(2.5, 3), ("3", 3), (3, None), (True, 2)])
def test_a_shape_that_is_not_ints_is_refused_not_rounded(shape):
    g = em.Graph("g")
    with pytest.raises(em.ShapeError, match="is not a sequence of ints"):
        g.input("x", shape)


def test_numpy_integers_are_dims():
    g = em.Graph("g")
    assert g.input("x", (np.int64(2), 3)).shape == (2, 3)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 10**400])
def test_a_constant_that_is_not_finite_is_refused(value):
    g = em.Graph("g")
    x = g.input("x", (4, 4))
    with pytest.raises(em.GraphError, match="is not a finite number") as info:
        _ = x * value
    assert "test_graph_errors.py" in str(info.value)


@pytest.mark.parametrize("eps", [float("nan"), -1e-6, float("inf"), "1e-6", None])
def test_rms_norm_refuses_a_bad_eps(eps):
    g = em.Graph("g")
    x = g.input("x", (4, 8))
    with pytest.raises(em.GraphError, match="eps must be a finite number >= 0"):
        em.rms_norm(x, eps=eps)


def _tiny() -> em.Graph:
    g = em.Graph("tiny")
    x, w = g.input("X", (16, 32)), g.input("W", (32, 64))
    g.output(x @ w, "O")
    return g


@pytest.mark.parametrize("kw", [{"node_limit": -1}, {"time_limit_s": 0}, {"iter_limit": 2.5},
                                {"k": "4"}, {"trials": True}, {"time_limit_s": float("inf")}])
def test_optimize_refuses_limits_that_are_not_positive(kw):
    with pytest.raises(em.MirageError, match=f"optimize: {next(iter(kw))} must be"):
        em.optimize(_tiny(), cache=False, **kw)


def test_a_rule_file_given_as_one_string_is_one_file(tmp_path):
    path = tmp_path / "mine.egg"
    path.write_text("(ruleset user)\n; add commutes\n(rewrite (Add a b) (Add b a) :ruleset user)\n")
    res = em.optimize(_tiny(), rules=str(path), cache=False, level="kernel", trials=1)
    assert res.verified.equivalent
    with pytest.raises(em.RuleError, match="missing.egg: no such rule file"):
        em.optimize(_tiny(), rules=str(tmp_path / "missing.egg"), cache=False)


def test_a_rule_file_that_is_not_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "bad.egg"
    path.write_bytes(b"(ruleset user)\n; caf\xe9\n")
    with pytest.raises(em.RuleError, match=r"bad.egg:2: not UTF-8 text"):
        em.optimize(_tiny(), rules=["rules", str(path)], cache=False)
