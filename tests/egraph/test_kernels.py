"""Extraction over kernel nodes (egraph/kernels.py): each extracted form planned under the
schedules the block rules put in the e-graph, so a user rule file changes the plan."""

from __future__ import annotations

from dataclasses import replace

import pytest
from saturation import saturated

import eqsat_mirage as em
from bench.programs import gqa_rewritten, program
from eqsat_mirage.egraph.kernels import read_kernels
from eqsat_mirage.egraph.rulefiles import builtin_rules_dir
from eqsat_mirage.fusion.forms import Form, KernelPlanner
from eqsat_mirage.fusion.planner import DEFAULT_STRATEGY
from eqsat_mirage.fusion.strategy import Strategy

ONLY_16 = ("; loops of 16 steps only: both bounds of the loop ranges at 16\n"
           "(set (min-loop-range) 16)\n(set (max-loop-range) 16)\n")


def _schedules(res):
    return [r.schedule for r in res.plan.regions if r.schedule is not None]


def test_the_strategy_comes_from_the_egraph(tmp_path):
    g = program("gqa", 1)
    choices = read_kernels(saturated(g).serialize())
    s = choices.strategy(DEFAULT_STRATEGY)
    assert s.loop_ranges == (4, 16, 64) and (s.min_blocks, s.max_blocks) == (32, 4096)
    assert s.allow_split_reduction and s.max_candidates == DEFAULT_STRATEGY.max_candidates
    # the split switch is the e-graph's alone: a base strategy without splits gets them
    # from the SplitOver Kern nodes; facts narrow the block range
    assert not DEFAULT_STRATEGY.allow_split_reduction
    assert choices.strategy(Strategy()).allow_split_reduction
    mine = tmp_path / "blocks.egg"
    mine.write_text("; grids of 64 to 1024 blocks\n(block-range 64 1024)\n")
    narrowed = read_kernels(saturated(g, ("rules", str(mine))).serialize())
    assert narrowed.strategy(DEFAULT_STRATEGY).min_blocks == 64
    assert narrowed.strategy(DEFAULT_STRATEGY).max_blocks == 1024


def test_a_form_without_kern_nodes_gets_grid_only_schedules():
    g = program("gatedmlp", 1)
    rules = [str(builtin_rules_dir() / f) for f in ("algebra.egg", "tiling.egg", "thread.egg")]
    kernels = KernelPlanner(saturated(g, rules).serialize(), "h100", DEFAULT_STRATEGY)
    p = kernels.plan(Form("input", g, None), None, None)
    assert kernels.strategy.loop_ranges == () and not kernels.strategy.allow_split_reduction
    assert all(r.schedule.loop is None and r.schedule.split is None
               for r in p.regions if r.schedule is not None)
    default = KernelPlanner(saturated(g).serialize(), "h100", DEFAULT_STRATEGY)
    assert default.plan(Form("input", g, None), None, None).cost_us < p.cost_us


def test_a_user_file_restricting_loop_ranges_to_16_changes_the_plan(tmp_path):
    mine = tmp_path / "only16.egg"
    mine.write_text(ONLY_16)
    g = program("lora", 1)
    default = em.optimize(g, cache=False, trials=1)
    only = em.optimize(g, rules=["rules", str(mine)], cache=False, trials=1)
    assert default.verified.equivalent and only.verified.equivalent
    looped = [s for s in _schedules(default) if s.loop is not None]
    assert looped and any(s.forloop != 16 for s in looped), [str(s) for s in looped]
    mine_looped = [s for s in _schedules(only) if s.loop is not None]
    assert mine_looped and all(s.forloop == 16 for s in mine_looped), \
        [str(s) for s in _schedules(only)]
    assert [str(s) for s in _schedules(only)] != [str(s) for s in _schedules(default)]


def _without_split_rules(tmp_path):
    """The built-in rules with block.egg less every line naming SplitOver (its split rules:
    the only place a split is written), loaded instead of the built-in block file."""
    block = (builtin_rules_dir() / "block.egg").read_text().splitlines()
    mine = tmp_path / "nosplit.egg"
    kept = [line for line in block if "SplitOver" not in line]
    gone = [line for line in block if line.startswith("(rewrite") and line not in kept]
    assert len(gone) == 8  # split, and split with a loop, for Sum, Mean, Max and MatMul
    mine.write_text("\n".join(kept) + "\n")
    return [str(builtin_rules_dir() / f) for f in ("algebra.egg", "tiling.egg", "thread.egg")] \
        + [str(mine)]


def test_removing_the_builtin_split_rules_changes_the_plan(tmp_path):
    # split-K / FlashDecoding's split is written once, as block.egg's SplitOver rules: with
    # them removed no schedule splits (the split-parts facts stay), and gqa's plan is dearer
    # (gqa b=1 with the division after `@ V`, the form em.optimize picks: 10.13 us split in
    # 4 over the keys, 10.69 us without)
    g = gqa_rewritten(1)
    nosplit = KernelPlanner(saturated(g, _without_split_rules(tmp_path)).serialize(),
                            "h100", DEFAULT_STRATEGY)
    default = KernelPlanner(saturated(g).serialize(), "h100", DEFAULT_STRATEGY)
    assert default.strategy.allow_split_reduction and not nosplit.strategy.allow_split_reduction
    mine, theirs = (k.plan(Form("input", g, None), None, None) for k in (nosplit, default))
    split = [r.schedule for r in theirs.regions if r.schedule is not None and r.schedule.split]
    assert split, [str(r.schedule) for r in theirs.regions]
    assert all(r.schedule.split is None for r in mine.regions if r.schedule is not None)
    assert mine.cost_us > theirs.cost_us


@pytest.mark.slow  # two searches of gqa
def test_a_rules_selection_without_the_split_rules_forbids_splits(tmp_path):
    g = program("gqa", 1)
    default = em.optimize(g, cache=False, trials=1)
    nosplit = em.optimize(g, rules=_without_split_rules(tmp_path), cache=False, trials=1)
    assert default.verified.equivalent and nosplit.verified.equivalent
    assert any(s.split is not None for s in _schedules(default))
    assert _schedules(nosplit) and all(s.split is None for s in _schedules(nosplit))
    assert nosplit.cost_us > default.cost_us


def _safe_attention(b: int = 1) -> em.Graph:
    """GQA's shapes with a safe softmax, the division already after ``@ V`` (the form
    em.optimize plans): exp(S - max(S)) summed and multiplied by V over the keys."""
    g = em.Graph("safe_rewritten")
    q = g.input("Q", (2 * b, 256, 64), dtype="float16")
    k = g.input("K", (2 * b, 64, 4096), dtype="float16")
    v = g.input("V", (2 * b, 4096, 64), dtype="float16")
    s = q @ k
    a = em.exp(s - em.max(s, axis=2, keepdims=True))
    g.output((a @ v) / a.sum(axis=2, keepdims=True), "O")
    return g


def _without_online_rule(tmp_path):
    """The built-in rules with block.egg less its one Online rule (the online softmax)."""
    block = (builtin_rules_dir() / "block.egg").read_text().splitlines()
    kept = [line for line in block if not (line.startswith("(rewrite") and "Online" in line)]
    assert len(block) - len(kept) == 1
    mine = tmp_path / "noonline.egg"
    mine.write_text("\n".join(kept) + "\n")
    return [str(builtin_rules_dir() / f) for f in ("algebra.egg", "tiling.egg", "thread.egg")] \
        + [str(mine)]


def test_the_online_rule_marks_the_exp_of_a_max_shifted_value():
    safe = read_kernels(saturated(_safe_attention()).serialize())
    assert len(safe.online) == 1  # exp(S - max(S)): its e-class
    assert not read_kernels(saturated(program("gqa", 1)).serialize()).online  # exp(S) only


def test_removing_the_builtin_online_rule_changes_the_plan(tmp_path):
    # the online softmax is written once, as block.egg's Online rule: with it a loop (or a
    # split) over the keys carries the running maximum and rescales the sums (10.09 us, one
    # split kernel pair); without it the max must finish before any exp reads it
    g = _safe_attention()
    none = KernelPlanner(saturated(g, _without_online_rule(tmp_path)).serialize(),
                         "h100", DEFAULT_STRATEGY)
    default = KernelPlanner(saturated(g).serialize(), "h100", DEFAULT_STRATEGY)
    assert not none.choices.online and default.choices.online
    mine, theirs = (k.plan(Form("input", g, None), None, None) for k in (none, default))
    running = [r for r in theirs.regions if r.schedule is not None
               and (r.schedule.loop or r.schedule.split) and len(r.ops) == len(g.nodes()) - 3]
    assert running, theirs.report()
    assert mine.cost_us > theirs.cost_us * 1.2, (mine.cost_us, theirs.cost_us)
    # the report says the e-graph left the running-maximum schedules out
    assert any("no Online node" in w for r in mine.regions for w in r.why_not), mine.report()


def _wide_chain() -> em.Graph:
    """A 64-deep matmul writing a wide output through a chain of eight elementwise ops: the
    chain's tiles take shared memory unless they stay in registers (thread graphs)."""
    g = em.Graph("wide_chain")
    x = g.input("X", (512, 64), dtype="float16")
    w = g.input("W", (64, 16384), dtype="float16")
    h = x @ w
    y = em.silu(em.exp(-h) * h + h)
    g.output(em.sqrt(em.relu(y) + 1.0), "O")
    return g


def test_thread_graphs_come_from_the_reg_rules_and_are_priced_in_the_search():
    # rules/thread.egg's Reg nodes are the only source of thread graphs: with them the
    # chain's interior tiles stay in registers, in the price the search compares as in the
    # built kernel; without the file there are none, and the schedule the default plan
    # picks (its tiles too large for shared memory without them) is not chosen
    g = _wide_chain()
    rules = [str(builtin_rules_dir() / f) for f in ("algebra.egg", "tiling.egg", "block.egg")]
    none = KernelPlanner(saturated(g, rules).serialize(), "h100", DEFAULT_STRATEGY)
    default = KernelPlanner(saturated(g).serialize(), "h100", DEFAULT_STRATEGY)
    assert not none.choices.registers and len(default.choices.registers) >= 7
    mine, theirs = (k.plan(Form("input", g, None), None, None) for k in (none, default))
    for p in (mine, theirs):  # the region prices are the built kernels' (threads included)
        assert p.cost_us == pytest.approx(sum(r.cost_us for r in p.regions), rel=1e-9)
    custom = [k for k in theirs.mugraph.kernels if k.kind == "custom"]
    assert custom and any(k.threads for k in custom)
    assert not any(k.threads for k in mine.mugraph.kernels if k.kind == "custom")
    fused = [r.schedule for r in theirs.regions if r.schedule is not None]
    plain = [r.schedule for r in mine.regions if r.schedule is not None]
    assert fused and plain and fused != plain, (fused, plain)
    assert mine.cost_us >= theirs.cost_us


def test_compile_check_refusals_are_facts_the_next_plan_reads():
    # a refusal is data the kernel planner keeps (no hidden state): every later plan of any
    # form prices the refused kernel as infeasible and picks another schedule
    from eqsat_mirage.cost.tiles import tile_key

    g = gqa_rewritten(1)
    kernels = KernelPlanner(saturated(g).serialize(), "h100", DEFAULT_STRATEGY)
    first = kernels.plan(Form("input", g, None), None, None)
    keys = {tile_key(k) for k in first.mugraph.kernels if k.kind == "custom"}
    assert keys
    kernels.refuse({key: "kernel spilled (a test's refusal)" for key in keys})
    again = kernels.plan(Form("input", g, None), None, None)
    assert not keys & {tile_key(k) for k in again.mugraph.kernels if k.kind == "custom"}
    assert again.cost_us >= first.cost_us
    fresh = KernelPlanner(saturated(g).serialize(), "h100", DEFAULT_STRATEGY)
    assert fresh.plan(Form("input", g, None), None, None).cost_us == first.cost_us


@pytest.mark.slow  # one search of safe attention
def test_optimize_reads_online_and_reg_nodes_through_the_extracted_forms():
    # em.optimize plans the extracted forms with their e-classes (not the fallback of a form
    # not read from the e-graph): the safe softmax runs online and the chains are fused
    res = em.optimize(_safe_attention(), trials=1, cache=False, time_limit_s=600)
    assert res.verified.equivalent and res.cost_us < 11.0, res.plan.report()
    custom = [k for k in res.program.kernels if k.kind == "custom"]
    assert any(k.running_inputs() for k in custom), res.plan.report()
    assert any(k.threads for k in custom), res.plan.report()
    assert "unsettled_levels" not in res.stats


def test_an_unsettled_level_permits_what_its_rules_did_not_mark_yet():
    # a thread phase cut short (here: not run at all, as if its time ran out) must not
    # leave every value out of registers: the planner treats the level as unsettled
    g = _wide_chain()
    rules = [str(builtin_rules_dir() / f) for f in ("algebra.egg", "tiling.egg", "block.egg")]
    data = saturated(g, rules).serialize()
    closed = KernelPlanner(data, "h100", DEFAULT_STRATEGY)
    open_ = KernelPlanner(data, "h100", DEFAULT_STRATEGY, unsettled=frozenset({"thread"}))
    p_closed, p_open = (k.plan(Form("input", g, None), None, None) for k in (closed, open_))
    assert not any(k.threads for k in p_closed.mugraph.kernels if k.kind == "custom")
    assert any(k.threads for k in p_open.mugraph.kernels if k.kind == "custom")
    # an unsettled block level: every loop range of the facts, splits as the facts allow
    none = read_kernels(saturated(g, [rules[0], rules[1]]).serialize())
    assert replace(none, unsettled=frozenset({"block"})).strategy(DEFAULT_STRATEGY).loop_ranges \
        == DEFAULT_STRATEGY.loop_ranges


def test_a_replan_after_refusals_equals_a_fresh_plan_and_prices_less(monkeypatch):
    """After the compile check refuses a plan's kernels, the re-plan reuses every fragment's
    best schedule that is not refused (checked again) and prices the rest: the plan a fresh
    planner with the same refusals finds, for a fraction of its schedules."""
    from eqsat_mirage.cost.tiles import tile_key
    from eqsat_mirage.fusion.planner import Planner
    from eqsat_mirage.fusion.plans import plan_key

    g = program("rmsnorm", 1)
    data, form = saturated(g).serialize(), Form("input", g, None)
    kernels = KernelPlanner(data, "h100", DEFAULT_STRATEGY)
    first = kernels.plan(form, kernels.shared, None)
    refused = {tile_key(k): "refused by this test" for k in first.mugraph.kernels
               if k.kind == "custom"}
    assert refused
    kernels.refuse(refused)
    calls: list[int] = []
    real = Planner._cost
    monkeypatch.setattr(Planner, "_cost", lambda self, *a: calls.append(1) or real(self, *a))
    again = kernels.replan(form, None)
    priced_again = len(calls)
    fresh = KernelPlanner(data, "h100", DEFAULT_STRATEGY)
    fresh.refuse(refused)
    calls.clear()
    want = fresh.plan(form, None, None)
    assert plan_key(again.mugraph) == plan_key(want.mugraph) != plan_key(first.mugraph)
    assert again.cost_us == want.cost_us
    assert priced_again < len(calls) / 2, (priced_again, len(calls))
