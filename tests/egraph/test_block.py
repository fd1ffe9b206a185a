"""The block level as e-graph terms: rules/block.egg, the "block" phase, egraph/kernels.py."""

from __future__ import annotations

import pytest
from saturation import saturated

import eqsat_mirage as em
from bench.brute_force_bench import random_programs
from bench.programs import BENCHMARKS, program
from eqsat_mirage.cost.per_op import Hardware
from eqsat_mirage.egraph.encode import build_node
from eqsat_mirage.egraph.kernels import read_kernels
from eqsat_mirage.egraph.rulefiles import (
    Schema,
    builtin_rules_dir,
    load_rule_files,
    parse_rule_file,
)
from eqsat_mirage.egraph.view import view
from eqsat_mirage.frontend.graph import Graph
from eqsat_mirage.fusion.indexing import index_fragment
from eqsat_mirage.fusion.strategy import (
    Strategy,
    candidate_schedules,
    kern_choice,
    reduction_index,
)
from eqsat_mirage.ir.errors import RuleError
from eqsat_mirage.ir.node import Node, Op

BLOCK = builtin_rules_dir() / "block.egg"
REDUCTIONS = ("Sum", "Mean", "Max", "MatMul")


def test_block_rules_load_with_one_comment_each_and_their_facts():
    rulesets, rules, facts = parse_rule_file(BLOCK.read_text(), str(BLOCK))
    assert rulesets == ["block"]
    # loop, split, split and loop; for Sum, Mean, Max and MatMul; a matmul's loop in
    # chunks of a loop-tile; and the online softmax (six Shifted rules, one Online)
    assert len(rules) == 20
    assert [r.rhs.head() for r in rules[13:]] == ["Shifted"] * 6 + ["Online"]
    assert all(r.name and not r.name.startswith("block.egg:") for r in rules)
    assert {(f.relation, f.args) for f in facts if not f.bound} == {
        ("loop-range", (4,)), ("loop-range", (16,)), ("loop-range", (64,)),
        ("block-range", (32, 4096)), ("loop-tile", (64,)), ("loop-tile", (256,))} | {
        ("split-parts", (p,)) for p in (4, 8, 16, 64)}


def test_block_rules_keep_the_value():
    report = em.check_rules(str(BLOCK))
    assert report.ok, str(report)
    assert len(report.results) == 20


def test_a_kernel_choice_on_another_value_is_unsound(tmp_path):
    bad = tmp_path / "bad.egg"
    bad.write_text("(ruleset myblock)\n; a sum's kernel choice that computes its max instead\n"
                   "(rewrite (Sum ax x) (Kern (Sched (LoopOver (Sum ax x) f) (NoSplit)) "
                   "(Max ax x)) :when ((loop-range f)) :ruleset myblock)\n")
    report = em.check_rules(str(bad))
    assert [r.status for r in report.results] == ["unsound"], str(report)


def test_a_fact_with_a_bad_argument_names_its_line(tmp_path):
    bad = tmp_path / "bad.egg"
    bad.write_text("(ruleset myblock)\n(loop-range x)\n")
    with pytest.raises(RuleError, match=r"bad.egg:2: a fact takes positive integer literals"):
        load_rule_files(["rules", str(bad)])


def _fragment(ev, key: str) -> tuple[Graph, Node]:
    """The reduction e-node ``key`` alone as a one-op program (its operands are inputs)."""
    en = ev.nodes[key]
    g = Graph(f"kern_{key}")
    args = []
    for k, c in enumerate(en.children):
        if isinstance(c, str) and c in ev.classes:
            rep = ev.reps[c]
            g.inputs[f"x{k}"] = Node(Op.INPUT, (), f"x{k}", rep.shape, rep.dtype)
            args.append(g.inputs[f"x{k}"])
        else:
            args.append(c)
    out = build_node(en.ctor, args, g.inputs)
    g.outputs["out"] = out
    return g, out


def _round_trip(graph) -> tuple[int, int]:
    """Every Kern term of ``graph``'s saturated e-graph names a schedule that
    ``candidate_schedules`` lists for its reduction: (Kern pairs checked, classes)."""
    sat = saturated(graph)
    data = sat.serialize()
    kernels = read_kernels(data)
    ev = view(data, Schema.load().constructors, graph.inputs, Hardware.load("h100"))
    # the facts' ranges and those the loop-tile rule derives from a contraction's size
    strategy = Strategy(loop_ranges=tuple(sorted({*kernels.loop_facts, *kernels.loop_ranges})),
                        allow_split_reduction=True, max_candidates=10**6)
    checked = 0
    for cls, pairs in kernels.by_class.items():
        listed: set[tuple[int, int]] = set()
        for key in ev.classes.get(cls, []):
            if ev.nodes[key].ctor not in REDUCTIONS:
                continue
            frag, out = _fragment(ev, key)
            ix = index_fragment(frag)
            idx = reduction_index(ix, out)
            assert idx is not None, (key, ev.nodes[key].ctor)
            listed |= {kern_choice(s, idx) for s in candidate_schedules(ix, strategy)}
        missing = pairs - listed
        assert not missing, (f"{graph.name}: Kern (loop range, split parts) {sorted(missing)} of "
                             f"class {cls} ({ev.reps[cls].describe()}) names no listed schedule")
        checked += len(pairs)
    return checked, len(kernels.by_class)


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_kern_term_of_a_benchmark_is_a_listed_schedule(name):
    checked, classes = _round_trip(program(name, 1))
    assert checked > 0 and classes > 0


def test_every_kern_term_of_random_programs_is_a_listed_schedule():
    total = 0
    for g in random_programs(12, 64):
        total += _round_trip(g)[0]
    assert total > 0


def test_the_block_phase_runs_after_tiling_and_counts_its_kern_nodes():
    g = program("gqa", 1)
    sat = saturated(g)
    names = [s.name for s in sat.stats]
    assert names[-4:] == ["algebraic", "tiling", "block", "thread"]
    tiling, block = sat.stats[-3], sat.stats[-2]
    kern = read_kernels(sat.serialize()).kern_nodes
    online = sum(n["op"] == "Online" for n in sat.serialize()["nodes"].values())
    # Kern and Online nodes are T e-nodes (node_limit); gqa's exp reads no max
    assert block.enodes == tiling.enodes + kern + online and online == 0
    assert kern > 0 and block.stop == "saturated"


def test_a_loop_range_bound_in_a_user_file_removes_kern_nodes(tmp_path):
    mine = tmp_path / "only16.egg"
    mine.write_text("; loops of 16 steps only\n(set (min-loop-range) 16)\n"
                    "(set (max-loop-range) 16)\n")
    g = program("gqa", 1)
    default = read_kernels(saturated(g).serialize())
    only = read_kernels(saturated(g, ("rules", str(mine))).serialize())
    assert set(default.loop_ranges) == {4, 16, 64}
    assert only.loop_ranges == (16,) and only.loop_facts == (16,)
    assert only.kern_nodes < default.kern_nodes


def test_without_block_rules_there_are_no_kern_nodes():
    rules = [str(builtin_rules_dir() / f) for f in ("algebra.egg", "tiling.egg")]
    kernels = read_kernels(saturated(program("gqa", 1), rules).serialize())
    assert kernels.kern_nodes == 0 and not kernels.splits and kernels.loop_ranges == ()
