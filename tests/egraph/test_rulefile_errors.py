"""Malformed rule files get a RuleError naming file and line, never an internal exception;
a hypothesis fuzzer throws random bytes and token sequences at the loader."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat_mirage as em
from eqsat_mirage.egraph.rulefiles import load_rules

BAD = {
    "when a bare symbol": ("(rewrite (Add a b) (Add b a) :when (a) :ruleset mine)",
                           r"a :when fact must be a comparison .* got a"),
    "division by a literal zero": (
        "(rewrite (Mul a (Const c)) (Div a (Const (/ c 0.0))) :ruleset mine)",
        r"division by zero in \(/ c 0.0\)"),
    "integer division by zero": ("(rewrite (Sum ax a) (Sum (/ ax 0) a) :ruleset mine)",
                                 r"division by zero"),
    "i64 literal too large": ("(rewrite (Sum 100000000000000000000000 a) a :ruleset mine)",
                              r"integer literal 100000000000000000000000 is out of the i64"),
    "f64 literal too large": ("(rewrite (Mul a (Const 1e400)) a :ruleset mine)",
                              r"float literal 1e400 is not a finite f64"),
    "i64 compared with f64": (
        "(rewrite (Add a b) (Add b a) :when ((= (ndim a) 1.5)) :ruleset mine)",
        r"mixes sorts f64 and i64"),
    "f64 where the schema wants i64": ("(rewrite (Sum 1.5 a) a :ruleset mine)",
                                       r"Sum takes i64 here, got f64 1.5"),
    "i64 where the schema wants f64": ("(rewrite (Mul a (Const 2)) a :ruleset mine)",
                                       r"Const takes f64 here, got i64 2"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_rules_name_file_and_line(tmp_path, name):
    body, match = BAD[name]
    path = tmp_path / "mine.egg"
    path.write_text(f"(ruleset mine)\n; a comment\n{body}\n")
    for load in (lambda: load_rules(["rules", str(path)]), lambda: em.check_rules(str(path))):
        with pytest.raises(em.RuleError, match=match) as info:
            load()
        assert f"{path}:3:" in str(info.value)


def test_a_user_ruleset_may_not_merge_into_a_loaded_builtin_one(tmp_path):
    path = tmp_path / "mine.egg"
    path.write_text("(ruleset assoc)\n(rewrite (Add a b) (Add b a) :ruleset assoc)\n")
    with pytest.raises(em.RuleError, match=r"mine.egg:1: ruleset 'assoc' is declared by the "
                                           r"built-in algebra.egg"):
        load_rules(["rules", str(path)])
    for internal in ("shapes", "reach"):
        path.write_text(f"(ruleset {internal})\n(rewrite (Add a b) (Add b a) "
                        f":ruleset {internal})\n")
        with pytest.raises(em.RuleError, match="internal ruleset"):
            load_rules([str(path)])


def test_a_right_side_that_divides_by_zero_is_unsound(tmp_path):
    path = tmp_path / "div.egg"
    path.write_text("(ruleset mine)\n"
                    "(rewrite (Mul a (Const c)) (Div a (Const (/ 1.0 (- c c)))) :ruleset mine)\n")
    report = em.check_rules(str(path))
    assert [r.status for r in report.results] == ["unsound"]
    assert "division by zero" in report.results[0].message


TOKENS = ["(", ")", "(", ")", "rewrite", "birewrite", "rule", "ruleset", "mine", ":when",
          ":ruleset", "Add", "Mul", "Const", "Sum", "MatMul", "Exp", "Div", "Reshape", "a", "b",
          "c", "ax", "=", "!=", ">=", "ndim", "dim", "is-op", "+", "/", "0", "1", "-3", "2.5",
          "0.0", "1e400", "nan", "inf", "99999999999999999999999", '"s"', ";", "\n", "vec-of"]


BUILTIN = load_rules(["rules"])


def _load_only_project_errors(tmp_path, data: bytes) -> None:
    """Loading the built-in rules and ``data`` either keeps every built-in ruleset and rule,
    in order, or raises a project error that names the fuzzed file and a line in it."""
    path = tmp_path / "fuzz.egg"
    path.write_bytes(data)
    try:
        rulesets, rules = load_rules(["rules", str(path)])
    except em.MirageError as exc:
        m = re.search(re.escape(str(path)) + r":(\d+)", str(exc))
        assert m, f"error names no line of {path}: {exc}"
        lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").count(b"\n") + 1
        assert 1 <= int(m.group(1)) <= lines, exc  # read as text: \r, \n and \r\n end lines
        return
    assert rulesets[:len(BUILTIN[0])] == BUILTIN[0]
    assert rules[:len(BUILTIN[1])] == BUILTIN[1]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200))
def test_random_bytes_give_only_project_errors(tmp_path, data):
    _load_only_project_errors(tmp_path, data)


@settings(max_examples=250, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=st.lists(st.sampled_from(TOKENS), max_size=40))
def test_random_token_sequences_give_only_project_errors(tmp_path, tokens):
    _load_only_project_errors(tmp_path, " ".join(tokens).encode())


RULE_BODIES = st.sampled_from(["(Add a b)", "(Mul a (Const 2.0))", "(Sum 0 a)", "(Exp a)",
                               "(Div a (Const c))", "(MatMul a b)", "(Neg a)"])


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lhs=RULE_BODIES, rhs=RULE_BODIES,
       when=st.sampled_from(["", ":when ((= (ndim a) 2))", ":when ((>= (dim a 0) 4))"]))
def test_well_formed_odd_rules_are_checked_without_crashing(tmp_path, lhs, rhs, when):
    path = tmp_path / "odd.egg"
    path.write_text(f"(ruleset mine)\n(rewrite {lhs} {rhs} {when} :ruleset mine)\n")
    try:
        report = em.check_rules(str(path), time_limit_s=20.0)
    except em.MirageError:
        return
    assert all(r.status in ("sound", "unsound", "not instantiated", "cannot check")
               for r in report.results)
