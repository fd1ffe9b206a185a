"""The thread level as e-graph terms: rules/thread.egg, the "thread" phase, Reg nodes."""

from __future__ import annotations

from saturation import saturated

import eqsat_mirage as em
from bench.programs import program
from eqsat_mirage.egraph.kernels import read_kernels
from eqsat_mirage.egraph.rulefiles import builtin_rules_dir, parse_rule_file
from eqsat_mirage.ir.ops import ELEMENTWISE, SPECS

THREAD = builtin_rules_dir() / "thread.egg"


def test_one_rule_per_elementwise_op_each_with_its_comment():
    rulesets, rules, facts = parse_rule_file(THREAD.read_text(), str(THREAD))
    assert rulesets == ["thread"] and not facts
    assert sorted(r.lhs.head() for r in rules) == sorted(SPECS[o].egglog for o in ELEMENTWISE)
    assert all(r.rhs.head() == "Reg" and r.name.endswith("(a thread graph)") for r in rules)


def test_thread_rules_keep_the_value():
    report = em.check_rules(str(THREAD))
    assert report.ok and len(report.results) == len(ELEMENTWISE), str(report)


def test_the_thread_phase_marks_every_elementwise_class_once():
    g = program("ntrans", 1)
    sat = saturated(g)
    assert [s.name for s in sat.stats][-2:] == ["block", "thread"]
    data = sat.serialize()
    regs = [n for n in data["nodes"].values() if n["op"] == "Reg"]
    marked = read_kernels(data).registers
    assert len(marked) == len({n["eclass"] for n in regs}) > 0
    ctors = {SPECS[o].egglog for o in ELEMENTWISE}
    elementwise = {n["eclass"] for n in data["nodes"].values() if n["op"] in ctors}
    assert marked == elementwise  # every class holding an elementwise e-node, no other
    block, thread = sat.stats[-2], sat.stats[-1]
    assert thread.enodes == block.enodes + len(regs)  # Reg nodes count against node_limit


def test_a_user_files_rulesets_run_before_the_kernel_phases(tmp_path):
    # so the terms a user rule makes get their Dev, Kern, Online and Reg nodes too
    mine = tmp_path / "mine.egg"
    mine.write_text("(ruleset mine)\n; subtraction is addition of a negation\n"
                    "(rewrite (Sub a b) (Add a (Neg b)) :ruleset mine)\n")
    g = em.Graph("sub")
    x = g.input("X", (64, 256), dtype="float32")
    y = g.input("Y", (64, 256), dtype="float32")
    g.output(em.exp(x - y), "O")
    res = em.optimize(g, rules=["rules", str(mine)], trials=1, cache=False,
                      allow_unchecked_rules=True, time_limit_s=600)
    names = [p["name"] for p in res.stats["phases"]]
    assert names[-5:] == ["algebraic", "user", "tiling", "block", "thread"], names
