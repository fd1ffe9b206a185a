"""Per-op rules generated from the ops' specs: egraph/op_rules.py and ``(op-rules FAMILY)``."""

from __future__ import annotations

import re

import pytest

import eqsat_mirage as em
from eqsat_mirage.egraph.op_rules import FAMILIES, op_rules, rules_of, written_out
from eqsat_mirage.egraph.rulefiles import (
    Schema,
    builtin_rules_dir,
    guards_text,
    load_rules,
    parse_rule_file,
    schema_text,
)
from eqsat_mirage.ir.ops import ELEMENTWISE, LEAF, SPECS, Op

CTORS = Schema.load().constructors
WITH_CTOR = [s for s in SPECS.values() if s.egglog]


def _operands(s) -> int:
    return sum(1 for t in CTORS[s.egglog] if t == "T")


def _rules(family: str, s) -> list[str]:
    return [line for line in rules_of(family, s, CTORS) if not line.startswith(";")]


def test_every_op_but_an_input_gets_its_shape_rules():
    for s in WITH_CTOR:
        rules = _rules("shape", s)
        if s.op is Op.INPUT:  # its shape facts are set when the program is encoded
            assert rules == []
            continue
        assert rules and all(re.match(rf"\(rule \(\(= e \({s.egglog}\b", r) for r in rules), s
        assert any("(set (ndim e)" in r for r in rules), s.name  # its rank, and its dims:
        assert s.op is Op.CONST or any("(set (dim e" in r for r in rules), s.name


def test_every_op_but_the_leaves_is_an_op():
    for s in WITH_CTOR:
        assert len(_rules("is-op", s)) == (0 if s.op in LEAF else 1), s.name


def test_every_op_with_a_guard_gets_its_abstract_expression():
    for s in WITH_CTOR:
        assert len(_rules("absval", s)) == (s.guard is not None), s.name
    assert all(s.guard is not None for s in WITH_CTOR if s.op is not Op.INPUT)


def test_every_operand_of_every_op_may_come_from_device_memory():
    for s in WITH_CTOR:
        rules = _rules("dev", s)
        assert len(rules) == _operands(s), s.name
        assert [r.count("(Dev ") for r in rules] == [1] * len(rules)


def test_every_elementwise_op_and_no_other_may_stay_in_registers():
    assert {s.op for s in WITH_CTOR if _rules("reg", s)} == set(ELEMENTWISE)


def test_the_generated_text_of_one_op():
    where = SPECS[Op.WHERE]
    assert rules_of("shape", where, CTORS) == [
        "(rule ((= e (Where c a b)) (= rc (ndim c)) (= ra (ndim a)) (= rb (ndim b))) "
        "((set (ndim e) (max rc (max ra rb)))) :ruleset shapes)",
        "(rule ((= e (Where c a b)) (= r (ndim e)) (= rc (ndim c)) (= d (dim c i))) "
        "((set (dim e (+ i (- r rc))) d)) :ruleset shapes)",
        "(rule ((= e (Where c a b)) (= r (ndim e)) (= ra (ndim a)) (= d (dim a i))) "
        "((set (dim e (+ i (- r ra))) d)) :ruleset shapes)",
        "(rule ((= e (Where c a b)) (= r (ndim e)) (= rb (ndim b)) (= d (dim b i))) "
        "((set (dim e (+ i (- r rb))) d)) :ruleset shapes)"]
    assert rules_of("is-op", where, CTORS) == [
        "(rule ((= e (Where c a b))) ((is-op e)) :ruleset shapes)"]
    assert rules_of("absval", where, CTORS) == [
        "(rule ((= e (Where c a b)) (= vc (absval c)) (= va (absval a)) (= vb (absval b))) "
        '((set (absval e) (AFn "where" (AAdd vc (AAdd va vb))))) :ruleset absrules)']
    assert rules_of("dev", where, CTORS) == [
        "; where may read its condition from device memory",
        "(rewrite (Where c a b) (Where (Dev c) a b) :when ((is-op c)) :ruleset tiling)",
        "; where may read its first value from device memory",
        "(rewrite (Where c a b) (Where c (Dev a) b) :when ((is-op a)) :ruleset tiling)",
        "; where may read its second value from device memory",
        "(rewrite (Where c a b) (Where c a (Dev b)) :when ((is-op b)) :ruleset tiling)"]
    assert rules_of("reg", where, CTORS) == []
    assert rules_of("reg", SPECS[Op.CAST], CTORS) == [
        "; cast may stay in registers for its one elementwise user (a thread graph)",
        "(rewrite (Cast t x) (Reg (Cast t x)) :ruleset thread)"]


def test_the_builtin_files_say_where_each_family_goes():
    files = {"shape": "schema.egg", "is-op": "schema.egg", "absval": "guards.egg",
             "dev": "tiling.egg", "reg": "thread.egg"}
    assert set(files) == set(FAMILIES)
    for family, name in files.items():
        assert f"(op-rules {family})" in (builtin_rules_dir() / name).read_text()
    for text in (schema_text(), guards_text()):  # egglog reads them written out
        assert "(op-rules" not in text
    assert op_rules("shape", CTORS) in schema_text() and op_rules("is-op", CTORS) in schema_text()
    assert op_rules("absval", CTORS) in guards_text()


def test_generated_rules_carry_their_comment_and_the_op_rules_line():
    path = builtin_rules_dir() / "tiling.egg"
    text = path.read_text()
    line = text[:text.index("\n(op-rules dev)")].count("\n") + 2
    rulesets, rules, _ = parse_rule_file(text, str(path))
    assert rulesets == ["tiling"] and {r.line for r in rules} == {line}
    assert rules[0].name == "neg may read its operand from device memory"


def test_a_user_file_may_generate_the_rewrite_families(tmp_path):
    mine = tmp_path / "mine.egg"
    mine.write_text("(ruleset tiling)\n; every operand\n(op-rules dev)\n"
                    "; and a rule of mine using the generated relation\n"
                    "(rewrite (Neg (Neg x)) x :when ((is-op x) (= (ndim x) 2)) :ruleset tiling)\n")
    rulesets, rules = load_rules([str(builtin_rules_dir() / "algebra.egg"), str(mine)])
    assert "tiling" in rulesets
    assert len([r for r in rules if r.ruleset == "tiling"]) == len(op_rules("dev", CTORS)
                                                                    .splitlines()) // 2 + 1


@pytest.mark.parametrize("body,message", [
    ("(op-rules shape)", r"mine\.egg:2: a rule file's \(op-rules FAMILY\) takes one of dev, reg"),
    ("(op-rules nope)", r"mine\.egg:2: a rule file's \(op-rules FAMILY\) takes one of dev, reg"),
    ("(op-rules)", r"mine\.egg:2: a rule file's \(op-rules FAMILY\)"),
    ("(op-rules reg)", r"ruleset 'thread' is not declared in this file"),
])
def test_a_wrong_op_rules_line_is_a_rule_error(tmp_path, body, message):
    mine = tmp_path / "mine.egg"
    mine.write_text(f"(ruleset mine)\n{body}\n")
    with pytest.raises(em.RuleError, match=message):
        load_rules([str(mine)])


def test_an_egglog_file_writes_out_only_the_egglog_families():
    text = "(ruleset shapes)\n(op-rules is-op)\n; after\n"
    assert written_out(text, CTORS, "s.egg") == \
        "(ruleset shapes)\n" + op_rules("is-op", CTORS) + "; after\n"
    for family in ("dev", "nope"):
        with pytest.raises(em.RuleError, match=r"s\.egg:2: an egglog file's \(op-rules FAMILY\) "
                                               "takes one of shape, is-op, absval"):
            written_out(f"(ruleset shapes)\n(op-rules {family})\n", CTORS, "s.egg")
