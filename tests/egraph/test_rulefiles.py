"""Rule files: the built-in rules load; malformed files are refused with "file:line"."""

from __future__ import annotations

import re

import pytest

import eqsat_mirage as em
from eqsat_mirage.egraph.op_rules import op_rules
from eqsat_mirage.egraph.rulefiles import (
    Schema,
    builtin_rules_dir,
    load_rules,
    parse_rules,
    parse_sexprs,
    rule_paths,
)


def write(tmp_path, text: str, name: str = "user.egg") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def rule_forms(path) -> list[tuple[int, str, str]]:
    """(line, head, the line above) of every top-level rewrite/birewrite, read line by line,
    an ``(op-rules FAMILY)`` line read as the lines it stands for (on its line)."""
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"\((rewrite|birewrite)\s", line)
        if m:
            out.append((i + 1, m.group(1), lines[i - 1] if i else ""))
        m = re.match(r"\(op-rules ([a-z-]+)\)", line)
        if m:
            made = op_rules(m.group(1), Schema.load().constructors).splitlines()
            out += [(i + 1, "rewrite", made[k - 1]) for k, g in enumerate(made)
                    if g.startswith("(rewrite")]
    return out


# ---------------------------------------------------------------- built-in rules

def test_builtin_rules_load():
    rulesets, rules = load_rules(["rules"])
    forms = [f for p in rule_paths(["rules"]) for f in rule_forms(p)]
    # a birewrite is two directed rules
    assert len(rules) == sum(2 if head == "birewrite" else 1 for _, head, _ in forms)
    assert len(rules) >= 31
    assert {"assoc", "distrib", "lora", "scalar", "expo", "reduce", "comm"} <= set(rulesets)
    assert all(r.ruleset in rulesets for r in rules)
    assert all(r.path.endswith(".egg") and r.line > 0 for r in rules)


def test_every_builtin_rule_has_a_one_line_description():
    for path in rule_paths(["rules"]):
        for line, _, above in rule_forms(path):
            assert above.startswith(";") and above.lstrip("; ").strip(), \
                f"{path.name}:{line} has no description comment"
    _, rules = load_rules(["rules"])
    for r in rules:
        assert r.name and "\n" not in r.name, r.where
        assert not re.fullmatch(r".*\.egg:\d+", r.name), f"{r.where}: no description"
        assert r.where == f"{r.path.rsplit('/', 1)[-1]}:{r.line}"


def test_builtin_rules_print_back_as_egglog():
    _, rules = load_rules(["rules"])
    for r in rules:
        text = r.egglog()
        assert text.startswith("(rewrite ") and text.endswith(f":ruleset {r.ruleset})")
        assert text.count("(") == text.count(")")


def test_schema_constructors():
    ctors = Schema.load().constructors
    assert ctors["MatMul"] == ("T", "T")
    assert ctors["Sum"] == ("i64", "T")
    assert ctors["Concat"] == ("i64", "T", "T")
    assert ctors["Reshape"] == ("IVec", "T")
    assert {"Input", "Const", "Exp", "Swap", "Mean", "Neg"} <= set(ctors)


def test_comment_becomes_description_only_when_directly_above(tmp_path):
    path = write(tmp_path, "(ruleset user)\n"
                           "; described\n"
                           "(rewrite (Neg (Neg a)) a :ruleset user)\n"
                           "; not attached: a blank line follows\n"
                           "\n"
                           "(rewrite (Relu (Relu a)) (Relu a) :ruleset user)\n")
    rulesets, rules = load_rules([path])
    assert rulesets == ["user"]
    assert [r.name for r in rules] == ["described", "user.egg:6"]
    assert [r.line for r in rules] == [3, 6]


def test_birewrite_gives_two_directed_rules(tmp_path):
    path = write(tmp_path, "(ruleset user)\n; swap twice\n"
                           "(birewrite (Add a b) (Add b a) :ruleset user)\n")
    _, rules = load_rules([path])
    assert [r.name for r in rules] == ["swap twice", "swap twice (reversed)"]
    assert rules[0].lhs == rules[1].rhs


def test_when_facts_bind_variables(tmp_path):
    # n is bound by a :when fact, so the right side may use it
    path = write(tmp_path, "(ruleset user)\n; mean is sum over n\n"
                           "(rewrite (Mean ax x) (Div (Sum ax x) (Const (to-f64 n))) "
                           ":when ((= n (dim x ax))) :ruleset user)\n")
    _, rules = load_rules([path])
    assert len(rules) == 1 and rules[0].when


# ---------------------------------------------------------------- malformed files

MALFORMED = {
    "unknown constructor": (
        "(ruleset user)\n; bad\n(rewrite (Exp a)\n  (Foo a) :ruleset user)\n",
        4, r"unknown constructor 'Foo'"),
    "wrong arity": (
        "(ruleset user)\n; bad\n(rewrite (Exp a b) (Exp a) :ruleset user)\n",
        3, r"Exp takes 1 arguments, got 2"),
    "wrong arity on the right": (
        "(ruleset user)\n; bad\n(rewrite (Exp a) (MatMul a) :ruleset user)\n",
        3, r"MatMul takes 2 arguments, got 1"),
    "unclosed paren": (
        "(ruleset user)\n; bad\n(rewrite (Exp a) (Exp a) :ruleset user\n",
        3, r"unclosed '\('"),
    "extra close paren": (
        "(ruleset user)\n; bad\n(rewrite (Exp a) (Exp a) :ruleset user))\n",
        3, r"unbalanced '\)'"),
    "unknown option": (
        "(ruleset user)\n; bad\n(rewrite (Exp a) (Exp a) :cost 3 :ruleset user)\n",
        3, r"unknown option :cost"),
    "option without value": (
        "(ruleset user)\n; bad\n(rewrite (Exp a) (Exp a) :ruleset)\n",
        3, r"option :ruleset has no value"),
    "undeclared ruleset": (
        "(ruleset user)\n; bad\n(rewrite (Exp a) (Exp a) :ruleset mine)\n",
        3, r"ruleset 'mine' is not declared"),
    "unbound right-side variable": (
        "(ruleset user)\n; bad\n(rewrite (Exp a) (Add a b) :ruleset user)\n",
        3, r"unbound variables \['b'\]"),
    "variable left side": (
        "(ruleset user)\n; bad\n(rewrite a (Neg (Neg a)) :ruleset user)\n",
        3, r"left side must be a constructor pattern"),
    "primitive left side": (
        "(ruleset user)\n; bad\n(rewrite (+ a b) (Add a b) :ruleset user)\n",
        3, r"left side must be a constructor pattern"),
    "not a rule": (
        "(ruleset user)\n(datatype X (Y))\n",
        2, r"expected \(rewrite \.\.\.\)"),
    "stray atom": (
        "(ruleset user)\nhello\n",
        2, r"stray atom 'hello'"),
    "ruleset with two names": (
        "(ruleset a b)\n",
        1, r"takes one name"),
    "rewrite without right side": (
        "(ruleset user)\n; bad\n(rewrite (Exp a))\n",
        3, r"needs a left and a right side"),
    "birewrite with a variable right side": (
        "(ruleset user)\n; bad\n(birewrite (Neg (Neg a)) a :ruleset user)\n",
        3, r"birewrite needs a constructor on both sides"),
    "birewrite losing a variable": (
        "(ruleset user)\n; bad\n(birewrite (Mul a (Const c)) (Neg a) :ruleset user)\n",
        3, r"must bind every variable"),
    "when not a list": (
        "(ruleset user)\n; bad\n(rewrite (Exp a) (Exp a) :when x :ruleset user)\n",
        3, r":when takes a list"),
    "unknown function in a condition": (
        "(ruleset user)\n; bad\n(rewrite (Exp a) (Exp a) :when ((size a)) :ruleset user)\n",
        3, r"unknown constructor 'size'"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_rule_file(tmp_path, case):
    text, line, pattern = MALFORMED[case]
    path = write(tmp_path, text, "bad.egg")
    with pytest.raises(em.RuleError, match=pattern) as info:
        load_rules([path])
    msg = str(info.value)
    assert f"bad.egg:{line}:" in msg, msg
    assert isinstance(info.value, ValueError)


def test_malformed_user_file_refused_by_optimize(tmp_path):
    path = write(tmp_path, "(ruleset user)\n; bad\n(rewrite (Exp a) (Foo a) :ruleset user)\n",
                 "bad.egg")
    g = em.Graph("g")
    g.output(em.exp(g.input("X", (2, 2))), "O")
    with pytest.raises(em.RuleError, match=r"bad\.egg:3:"):
        em.optimize(g, rules=["rules", path])


def test_parse_sexprs_reports_the_opening_line():
    with pytest.raises(em.RuleError, match=r"f\.egg:2: unclosed"):
        parse_sexprs("(a b)\n(c\n (d e)\n", "f.egg")
    forms = parse_sexprs("; one\n(a (b c)\n  d)\n(e)\n", "f.egg")
    assert [(f.line, c) for f, c in forms] == [(2, "one"), (4, "")]


def test_parse_rules_without_a_file():
    rulesets, rules = parse_rules("(ruleset r)\n; n\n(rewrite (Neg (Neg a)) a :ruleset r)\n",
                                  "<string>")
    assert rulesets == ["r"] and rules[0].where == "<string>:3"


# ---------------------------------------------------------------- rule_paths

def test_rule_paths_builtin():
    paths = rule_paths(["rules"])
    assert paths and all(p.parent == builtin_rules_dir() for p in paths)
    names = {p.name for p in paths}
    assert "algebra.egg" in names
    assert not names & {"schema.egg", "guards.egg"}  # not rule files


def test_rule_paths_folder_and_file(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    for name in ("b.egg", "a.egg", "schema.egg", "notes.txt"):
        (d / name).write_text("(ruleset user)\n")
    single = write(tmp_path, "(ruleset user)\n", "single.egg")
    paths = rule_paths([str(d), single])
    assert [p.name for p in paths] == ["a.egg", "b.egg", "single.egg"]
    rulesets, rules = load_rules([str(d), single])
    assert rulesets == ["user"] and rules == []


def test_rule_paths_missing(tmp_path):
    missing = tmp_path / "nope.egg"
    with pytest.raises(em.RuleError, match="nope.egg: no such rule file or folder"):
        rule_paths(["rules", str(missing)])
    with pytest.raises(em.RuleError, match="no such rule file"):
        load_rules([str(missing)])
