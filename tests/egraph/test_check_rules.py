"""``em.check_rules``: every built-in rule is sound; unsound and malformed user rules are caught.

Unsound rules must come back "unsound" with a counterexample (or the
ill-shaped instance); rules that cannot be instantiated or checked must never
come back "sound".
"""

from __future__ import annotations

import re

import pytest

import eqsat_mirage as em


def rule_file(tmp_path, body: str, name: str = "user.egg") -> str:
    """A rule file with ``(ruleset user)`` on line 1 and ``body`` from line 2."""
    path = tmp_path / name
    path.write_text("(ruleset user)\n" + body.strip("\n") + "\n")
    return str(path)


def test_exported():
    for name in ("check_rules", "assert_sound", "RuleCheck", "RuleCheckReport"):
        assert name in em.__all__ and hasattr(em, name)


# every built-in rule sound: tests/egraph/test_check_rules_seeds.py (it shares the seed-0
# check with the seed-independence test there)


def test_builtin_check_is_deterministic():
    """The same report twice: the algebra rules and the block rules, whose facts' values are
    drawn again for the same shapes (``_REDRAWS``)."""
    files = ["rules/algebra.egg", "rules/block.egg"]
    a = em.check_rules(files, instances=1, seed=5)
    b = em.check_rules(list(files), instances=1, seed=5)
    assert [(r.where, r.status, r.message) for r in a.results] == [
        (r.where, r.status, r.message) for r in b.results]


def test_exp_of_sum_is_not_a_sum_of_exps(tmp_path):
    path = rule_file(tmp_path, """
; exp of a sum is a sum of exps
(rewrite (Exp (Add a b)) (Add (Exp a) (Exp b)) :ruleset user)
""", "bad.egg")
    report = em.check_rules(path)
    (res,) = report.results
    assert res.status == "unsound" and res.where == "bad.egg:3"
    assert res.rule == "exp of a sum is a sum of exps"
    assert isinstance(res.counterexample, em.Counterexample)
    assert res.counterexample.output == "out" and "Z_p x Z_q" in res.message
    assert report.unsound == [res] and not report.ok
    with pytest.raises(em.RuleError, match=r"bad\.egg:3: unsound rule 'exp of a sum") as exc:
        em.assert_sound(path)
    assert "output 'out'" in str(exc.value) and isinstance(exc.value, ValueError)


UNSOUND = {
    "matmul commutes": "(rewrite (MatMul a b) (MatMul b a) :ruleset user)",
    "sum over the wrong axis": "(rewrite (Sum 0 x) (Sum 1 x) :when ((= (ndim x) 2)) "
                               ":ruleset user)",
    "sum over a swapped tensor": "(rewrite (Sum 0 (Swap 0 1 x)) (Sum 0 x) :ruleset user)",
    "division commutes": "(rewrite (Div a b) (Div b a) :ruleset user)",
    "subtraction commutes": "(rewrite (Sub a b) (Sub b a) :ruleset user)",
    "a factor comes out of any sum": "(birewrite (Sum ax (Mul x s)) (Mul (Sum ax x) s) "
                                     ":ruleset user)",
    "LoRA without equal row counts": "(rewrite (Add (MatMul w x) (MatMul b y)) (MatMul "
        "(Concat 1 w b) (Concat 0 x y)) :when ((= (ndim w) 2) (= (ndim b) 2) (= (ndim x) 2) "
        "(= (ndim y) 2) (= (dim x 1) (dim y 1))) :ruleset user)",
    "mean as a sum times an inexact 1/n": "(rewrite (Mean ax x) (Mul (Sum ax x) "
        "(Const (/ 1.0 (to-f64 n)))) :when ((= n (dim x ax))) :ruleset user)",
    "concat order does not matter": "(rewrite (Concat ax a b) (Concat ax b a) :ruleset user)",
    "split with a wrong reshape": "(rewrite (Sum 1 x) (Reshape (vec-of d0 1) (Sum 1 (Sum 2 "
        "(Reshape (vec-of d0 j i) (Swap 0 1 x))))) :when ((= (ndim x) 2) (= d0 (dim x 0)) "
        "(= n (dim x 1)) (split n i j)) :ruleset user)",
}


@pytest.mark.parametrize("name", sorted(UNSOUND))
def test_unsound_rules_are_caught(tmp_path, name):
    path = rule_file(tmp_path, f"; {name}\n{UNSOUND[name]}")
    report = em.check_rules(path)
    assert report.unsound, str(report)
    for res in report.unsound:
        assert res.where == "user.egg:3" and res.message
        assert res.counterexample is not None or re.search(
            r"ill-shaped|different shapes", res.message), res.message
    with pytest.raises(em.RuleError, match=r"user\.egg:3: unsound"):
        em.assert_sound([path])


def test_ill_shaped_right_side_names_the_shapes(tmp_path):
    path = rule_file(tmp_path, "; matmul commutes\n(rewrite (MatMul a b) (MatMul b a) "
                               ":when ((= (ndim a) 2) (= (ndim b) 2) (!= (dim a 0) (dim b 1))) "
                               ":ruleset user)")
    (res,) = em.check_rules(path).results
    assert res.status == "unsound" and "ill-shaped" in res.message
    assert re.search(r"a: \(\d", res.message) and "contraction dims differ" in res.message


@pytest.mark.parametrize("body", [
    "(rewrite (Sub a b) (Add a (Neg b)) :ruleset user)",
    "(birewrite (Div (Mul a b) c) (Mul a (Div b c)) :ruleset user)",
    "(rewrite (Swap i j (Swap i j x)) x :ruleset user)",
    "(rewrite (Sum ax (Concat ax a b)) (Add (Sum ax a) (Sum ax b)) :when ((= (ndim a) 2)) "
    ":ruleset user)",
    "(rewrite (Reshape s (Reshape t x)) (Reshape s x) :ruleset user)",
    "(rewrite (Div x (Const c)) (Mul x (Div (Const 1.0) (Const c))) :ruleset user)",
])
def test_sound_user_rules(tmp_path, body):
    report = em.check_rules(rule_file(tmp_path, "; a sound rule\n" + body))
    assert report.ok, str(report)
    assert all(r.instances >= 1 for r in report.results)
    em.assert_sound(rule_file(tmp_path, "; a sound rule\n" + body, "again.egg"))


def test_uncheckable_rules_are_never_sound(tmp_path):
    path = rule_file(tmp_path, """
; exp of exp is outside the Lax fragment
(rewrite (Exp (Exp (Add a b))) (Exp (Mul (Exp a) (Exp b))) :ruleset user)
; a condition no instance meets
(rewrite (Add a b) (Add b a) :when ((!= (ndim a) (ndim a))) :ruleset user)
""")
    report = em.check_rules(path)
    assert [r.status for r in report.results] == ["cannot check", "not instantiated"]
    assert "Lax" in report.results[0].message and not report.ok and not report.unsound
    assert "no instance" in report.results[1].message
    em.assert_sound(path)  # nothing unsound
    with pytest.raises(em.RuleError, match=r"user\.egg:3: cannot check.*\n.*user\.egg:5: not "):
        em.assert_sound(path, strict=True)


@pytest.mark.parametrize("body, line, message", [
    ("; x\n(rewrite (Exp a) (Exq a) :ruleset user)", 3, "unknown constructor 'Exq'"),
    ("; x\n(rewrite (Add a b c) (Add a b) :ruleset user)", 3, "Add takes 2 arguments"),
    ("; x\n\n(rewrite (Add a b) (Add b a) :ruleset user", 4, "unclosed"),
    ("; x\n(rewrite (Add a b) (Add b a) :ruleset user))", 3, "unbalanced"),
    ("; x\n(rewrite (Add a b) (Add b a) :ruleset other)", 3, "'other' is not declared"),
    ("; x\n(rewrite (Add a b) (Add b c) :ruleset user)", 3, "unbound variables"),
    ('; x\n(rewrite (Exp "float32") (Exp "float16") :ruleset user)', 3,
     'Exp argument 1 is a T, got the string literal "float32"'),
    ("; x\n(rewrite (Cast (Exp a) a) a :ruleset user)", 3, "Cast argument 1 is a String"),
])
def test_malformed_files_name_file_and_line(tmp_path, body, line, message):
    path = rule_file(tmp_path, body, "broken.egg")
    for fn in (em.check_rules, em.assert_sound):
        with pytest.raises(em.RuleError, match=rf"broken\.egg:{line}: .*{re.escape(message)}"):
            fn(path)


def test_folders_and_paths(tmp_path):
    rule_file(tmp_path, "; addition commutes\n(rewrite (Add a b) (Add b a) :ruleset user)")
    report = em.check_rules([tmp_path])
    assert [(r.where, r.status) for r in report.results] == [("user.egg:3", "sound")]
    assert em.assert_sound(tmp_path / "user.egg").ok


def test_missing_file(tmp_path):
    with pytest.raises(em.RuleError, match="no such rule file"):
        em.check_rules(str(tmp_path / "nope.egg"))


def test_a_rule_wrong_only_above_its_threshold_is_caught(tmp_path):
    path = rule_file(tmp_path, """
; a mean is a sum over at most six elements (wrong above six)
(rewrite (Mean ax x) (Div (Sum ax x) (Const (to-f64 (min n 6))))
         :when ((= n (dim x ax))) :ruleset user)
""")
    (res,) = em.check_rules(path).results
    assert res.status == "unsound" and "n=" in res.message, str(res)


@pytest.mark.parametrize("c", ["2147483579.0", "1073741789.0", "4294967158.0"])
def test_a_rule_dropping_a_term_scaled_by_an_old_prime_is_caught(tmp_path, c):
    path = rule_file(tmp_path, f"""
; drop a term that vanished modulo the old fixed prime
(rewrite (Add y (Mul (Const {c}) (Relu x))) y :ruleset user)
""")
    (res,) = em.check_rules(path).results
    assert res.status == "unsound", str(res)


def test_optimize_refuses_a_rule_it_cannot_check_unless_told(tmp_path):
    path = rule_file(tmp_path, """
; only for rank-7 tensors, which the checker never draws
(rewrite (Neg (Neg x)) x :when ((= (ndim x) 7)) :ruleset user)
""")
    g = em.Graph("n")
    x = g.input("X", (4, 4), "float32")
    neg = -x
    g.output(-neg, "O")
    with pytest.raises(em.RuleError, match="allow_unchecked_rules"):
        em.optimize(g, rules=["rules", path], level="kernel", cache=False)
    res = em.optimize(g, rules=["rules", path], level="kernel", cache=False,
                      allow_unchecked_rules=True)
    assert res.verified.equivalent


def test_a_cast_to_a_string_literal_dtype_is_checked(tmp_path):
    # once an AttributeError: the String literal reached the checker as a plain str
    path = rule_file(tmp_path, '; x\n(rewrite (Cast "float32" (Cast "float32" a)) '
                               '(Cast "float32" a) :ruleset user)')
    report = em.check_rules(path)
    assert [(r.where, r.status) for r in report.results] == [("user.egg:3", "sound")]


def test_float_unsafe_rules_are_sound_but_flagged(tmp_path):
    """Sound over the reals, unsafe in floating point: narrowing a square to the input's
    float16, and dropping a softmax's max; optimize refuses them unless allowed."""
    path = rule_file(tmp_path, '; narrow\n(rewrite (Mul (Cast t a) (Cast t a)) '
                               '(Cast t (Mul a a)) :ruleset user)\n'
                               '; nomax\n(rewrite (Div (Exp (Sub a (Max i a))) '
                               '(Sum i (Exp (Sub a (Max i a))))) '
                               '(Div (Exp a) (Sum i (Exp a))) :ruleset user)')
    report = em.check_rules([path], seed=0)
    assert [(r.rule, r.status, r.float_safe) for r in report.results] == [
        ("narrow", "sound", False), ("nomax", "sound", False)], str(report)
    assert report.ok and len(report.float_unsafe) == 2
    assert "sound, float-unsafe" in str(report) and "float16" in str(report)
    with pytest.raises(em.RuleError, match="allow_float_unsafe_rules"):
        em.assert_sound([path], allow_float_unsafe=False)
    assert em.assert_sound([path]).ok


@pytest.mark.parametrize("body, status", [
    # d bound only in :when, read by a Const of the right side
    ("(rewrite (Mul x (Const c)) (Mul (Mul x (Const d)) (Const 0.5)) :when ((= d (* c 2.0))) "
     ":ruleset user)", "sound"),
    # the left side computes its Const from d, bound only in :when (a bare KeyError before)
    ("(rewrite (Mul x (Const (* d 2.0))) (Mul (Mul x (Const d)) (Const 2.0)) "
     ":when ((= d 1.5)) :ruleset user)", "sound"),
    ("(rewrite (Mul x (Const (* d 2.0))) (Mul (Mul x (Const d)) (Const 3.0)) "
     ":when ((= d 1.5)) :ruleset user)", "unsound"),
    # d's fact reads e, bound nowhere: never instantiated, never a crash
    ("(rewrite (Mul x (Const (* d 2.0))) (Mul x (Const 1.0)) :when ((= d e)) :ruleset user)",
     "not instantiated"),
])
def test_a_const_computed_from_a_variable_bound_in_when(tmp_path, body, status):
    """Issue 51: a Const computed from a variable only a :when fact binds is checked."""
    (res,) = em.check_rules(rule_file(tmp_path, "; a rule\n" + body)).results
    assert res.status == status, str(res)
    if status == "not instantiated":
        assert "unbound variables" in res.message
