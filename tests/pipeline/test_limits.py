"""Every step of a search is bounded: time (one deadline for the whole optimize) and memory."""

from __future__ import annotations

import time

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.egraph import saturate
from eqsat_mirage.egraph.extract import extract
from eqsat_mirage.egraph.rulefiles import load_rules
from eqsat_mirage.egraph.saturate import Limits, Saturator
from eqsat_mirage.ir.limits import MEMORY_ENV, Deadline, check_memory, memory_budget

AC_RULES = """(ruleset boom)
(rewrite (Add a b) (Add b a) :ruleset boom)
(rewrite (Mul a b) (Mul b a) :ruleset boom)
(birewrite (Add a (Add b c)) (Add (Add a b) c) :ruleset boom)
(birewrite (Mul a (Mul b c)) (Mul (Mul a b) c) :ruleset boom)
(birewrite (Mul a (Add b c)) (Add (Mul a b) (Mul a c)) :ruleset boom)
"""


def sum_of_products(n: int = 8) -> em.Graph:
    """x0*x1 + x2*x3 + ...: every regrouping under AC is a new term."""
    g = em.Graph("sumprod")
    xs = [g.input(f"x{i}", (8, 8), dtype="float32") for i in range(n)]
    y = xs[0] * xs[1]
    for i in range(2, n, 2):
        y = y + xs[i] * xs[i + 1]
    g.output(y * (xs[0] + xs[3]), "y")
    return g


def small() -> em.Graph:
    g = em.Graph("small")
    x = g.input("x", (4, 8), dtype="float32")
    w = g.input("w", (8, 8), dtype="float32")
    g.output(em.exp(x @ w).sum(axis=1), "y")
    return g


def test_deadline_parts_and_no_limit():
    d = Deadline(10.0)
    assert 9.0 < d.remaining() <= 10.0 and not d.expired()
    assert d.part(0.5).end == pytest.approx(d.start + 5.0)
    assert d.part(2.0).end == d.end  # a part never ends later than the whole
    assert Deadline(None).remaining() == float("inf") and not Deadline(None).expired()
    assert Deadline(0.0).expired()


def test_memory_budget_from_the_environment(monkeypatch):
    monkeypatch.setenv(MEMORY_ENV, "500M")
    assert memory_budget() == 500 * 2**20
    monkeypatch.setenv(MEMORY_ENV, "1024")
    assert memory_budget() == 1024
    for bad in ("lots", "-1G", "inf", "0"):
        monkeypatch.setenv(MEMORY_ENV, bad)
        with pytest.raises(em.MirageError, match=MEMORY_ENV):
            memory_budget()
    monkeypatch.delenv(MEMORY_ENV)
    assert 0 < memory_budget() <= 8 * 2**30


def test_check_memory_names_the_largest_value():
    assert check_memory([("a", 10), ("b", 20)], 8, "x", budget=1000) == 240
    with pytest.raises(em.BudgetError, match=r"largest value is b with 2000 elements"):
        check_memory([("a", 10), ("b", 2000)], 8, "verifying 'p'", budget=1000)


def test_a_huge_matmul_is_refused_before_anything_is_allocated():
    g = em.Graph("big")
    x = g.input("x", (30000, 30000))
    w = g.input("w", (30000, 30000))
    g.output(x @ w, "y")
    t = time.perf_counter()
    for run in (lambda: em.verify(g, g), lambda: em.optimize(g, cache=False)):
        with pytest.raises(em.BudgetError, match=r"over the memory budget.*the largest part "
                                                 r"is .*matmul \(30000, 30000\)"):
            run()
    assert time.perf_counter() - t < 5.0  # refused up front, not after a search


def test_the_budget_counts_a_mugraph_over_all_its_blocks(monkeypatch):
    res = em.optimize(small(), cache=False)
    from eqsat_mirage.verifier.memory import verify_parts

    need = sum(n for _, n in verify_parts(small(), res.program, 1, 4))
    monkeypatch.setenv(MEMORY_ENV, str(need // 2))  # not even one trial at a time fits
    with pytest.raises(em.BudgetError, match="over the memory budget"):
        em.verify(small(), res.program)


def test_shape_facts_that_never_reach_a_fixpoint_are_stopped(monkeypatch):
    # a shape rule that invents a new axis for every axis it sees: facts grow without end
    grow = "(rule ((= d (dim e i))) ((set (dim e (+ i 1)) d)) :ruleset shapes)\n"
    text = saturate.schema_text()
    monkeypatch.setattr(saturate, "schema_text", lambda: text + grow)
    rulesets, rules = load_rules(["rules"])
    t = time.perf_counter()
    with pytest.raises(em.TimeLimitError, match="shape facts"):
        Saturator(small(), rulesets, rules, guards=False, deadline=Deadline(1.0))
    assert time.perf_counter() - t < 6.0
    monkeypatch.setattr(saturate, "FACT_LIMIT", 3000)  # and the size bound, without a deadline
    with pytest.raises(em.MirageError, match="grow without end"):
        Saturator(small(), rulesets, rules, guards=False)


def test_matches_per_iteration_shrink_with_the_room_left():
    rulesets, rules = load_rules(["rules"])
    sat = Saturator(small(), rulesets, rules, guards=False)
    lim = Limits(node_limit=100 + Limits().match_limit * len(rules))  # room for every rule
    assert sat._match_limit(lim, 100) == lim.match_limit
    few = Limits(node_limit=1000)
    assert 1 <= sat._match_limit(few, 100) <= 900 // len(rules) + 1
    assert sat._match_limit(few, 5000) == 1


def test_explosive_user_rules_stop_at_the_node_and_time_limits(tmp_path):
    path = tmp_path / "boom.egg"
    path.write_text(AC_RULES)
    g = sum_of_products()
    t = time.perf_counter()
    # 8 s: the rule loading and guard setup before the phases must fit on a loaded machine
    res = em.optimize(g, rules=["rules", str(path)], guards=False, node_limit=1000,
                      time_limit_s=8.0, cache=False, allow_unchecked_rules=True)
    wall = time.perf_counter() - t
    assert "phases" in res.stats, res.stats.get("note")
    user = [p for p in res.stats["phases"] if p["name"] == "user"][0]
    assert user["stop"] in ("node limit", "iteration limit", "time limit", "saturated")
    assert res.stats["enodes"] < 20_000  # one iteration cannot blow far past the node limit
    assert wall < 3 * 8.0  # generous on a loaded machine; bench/limits_bench.py measures it
    # verified, or (the 8 s spent on a loaded machine) inconclusive for lack of time and
    # said so; what is returned equals the input program either way
    assert res.verified is not None and (res.verified.equivalent or (
        res.deadline_passed and res.verified.inconclusive
        and "time limit" in res.verified.reason)), res.verified
    x = {n: np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
         for n in g.inputs}
    np.testing.assert_allclose(em.evaluate(res.program, x)["y"], em.evaluate(g, x)["y"],
                               rtol=1e-4, atol=1e-4)


def test_extraction_stops_at_its_deadline():
    rulesets, rules = load_rules(["rules"])
    g = small()
    sat = Saturator(g, rulesets, rules, guards=False)
    data = sat.serialize()
    from eqsat_mirage.cost.per_op import Hardware

    hw = Hardware.load("h100")
    with pytest.raises(em.TimeLimitError, match="extraction"):
        extract(data, sat.root_classes(data), g, sat.ctors, hw, deadline=Deadline(0.0))
    cands, stats = extract(data, sat.root_classes(data), g, sat.ctors, hw,
                           deadline=Deadline(30.0))
    assert cands and "extract_stop" not in stats


def test_verify_past_its_time_limit_is_inconclusive_never_equivalent():
    g = small()
    res = em.verify(g, g, time_limit_s=Deadline(0.0))
    assert not res.equivalent and res.inconclusive and "time limit" in res.reason
    assert em.verify(g, g, time_limit_s=60.0).equivalent


def test_optimize_out_of_time_returns_the_input_and_says_so():
    g = sum_of_products(12)
    t = time.perf_counter()
    res = em.optimize(g, time_limit_s=0.3, cache=False)
    assert time.perf_counter() - t < 5.0
    assert res.cost_us <= res.baseline_cost_us
    if res.verified is None:  # cut short before anything verified: the input, and it says so
        assert "time limit" in res.stats.get("note", "")
        assert res.cost_us == res.baseline_cost_us
    else:  # whatever came back in time (maybe after a search cut short) is verified
        assert res.verified.equivalent


def test_check_rules_stops_at_its_time_limit(tmp_path):
    path = tmp_path / "ok.egg"
    path.write_text(AC_RULES)
    report = em.check_rules(str(path), time_limit_s=Deadline(0.0))
    assert report.results and all(r.status != "sound" for r in report.results)
    assert all("time limit" in r.message for r in report.results)
    with pytest.raises(em.RuleError, match="time limit"):
        em.assert_sound(str(path), strict=True, time_limit_s=Deadline(0.0))
    assert em.check_rules(str(path), time_limit_s=120.0).ok


@pytest.mark.parametrize("factors", [(0,), (1.5,), (1,), "4", 4, (True,)])
def test_bad_split_factors_are_refused(factors):
    with pytest.raises(em.MirageError, match="split_factors"):
        em.optimize(small(), split_factors=factors, cache=False)


def test_a_result_cut_short_by_the_time_limit_is_not_cached(tmp_path):
    from bench.programs import program

    g = program("gqa", 8)  # its verification alone takes longer than the limit
    cache = tmp_path / "results.sqlite"
    first = em.optimize(g, time_limit_s=1.0, cache=cache)
    assert "time limit" in first.stats["note"] and first.stats["cache"] == "miss"
    assert first.verified is None and first.cost_us == first.baseline_cost_us
    again = em.optimize(g, time_limit_s=1.0, cache=cache)
    assert again.stats["cache"] == "miss"  # searched again, not served a stale time-out


def test_workers_that_share_the_budget_wait_for_each_other(monkeypatch):
    """``reserved``: alone, nothing to do; sharing one budget (optimize_many's workers), a
    verification takes the most threads whose memory fits what the others leave, waits
    while not even one fits, goes on once they let go, and past its deadline stops with a
    TimeLimitError."""
    import multiprocessing
    import threading

    from eqsat_mirage.ir import limits
    from eqsat_mirage.ir.errors import TimeLimitError

    monkeypatch.setenv(MEMORY_ENV, "1000")
    with limits.reserved(10**9):  # alone: the caller checked its bytes already
        pass
    held = multiprocessing.get_context("spawn").Value("q", 0)
    monkeypatch.setattr(limits, "_SHARED", held)
    with limits.reserved(600):
        assert held.value == 600
        with pytest.raises(TimeLimitError, match="the other workers held"):
            with limits.reserved(600, Deadline(0.2)):
                pass
        with limits.reserved(400):  # fits beside it
            assert held.value == 1000
        with limits.reserved([700, 450, 300]) as chosen:  # the most that fits: fewer threads
            assert chosen == 2 and held.value == 900
    assert held.value == 0
    order = []
    gate = threading.Event()

    def other():
        with limits.reserved(700):
            gate.set()
            time.sleep(0.3)
            order.append("other done")

    t = threading.Thread(target=other)
    t.start()
    gate.wait()
    with limits.reserved(700, Deadline(30)):
        order.append("waited")
    t.join()
    assert order == ["other done", "waited"] and held.value == 0


def test_a_worker_takes_no_more_threads_than_its_share_of_the_cores(monkeypatch):
    """``limits.fair_threads``: alone (or alone among the workers now) no cap; while k
    workers search, the cores divided among them, one at least. A verification phase of
    such a worker runs on at most that many threads, whatever more would fit the budget
    (``verify``'s phases: the threads asked of ``runner``)."""
    import multiprocessing

    from eqsat_mirage.ir import limits
    from eqsat_mirage.verifier import verify as verify_mod

    assert limits.fair_threads() is None  # no workers: this process works alone
    active = multiprocessing.get_context("spawn").Value("q", 1)
    monkeypatch.setattr(limits, "_ACTIVE", active)
    assert limits.fair_threads() is None  # the only worker searching now
    monkeypatch.setattr(limits.os, "cpu_count", lambda: 8)
    for workers, share in ((2, 4), (3, 2), (8, 1), (12, 1)):
        active.value = workers
        assert limits.fair_threads() == share
    asked = []
    real = verify_mod.runner

    def spy(deadline, threads=None):
        asked.append(threads)
        return real(deadline, 1)

    monkeypatch.setattr(verify_mod, "runner", spy)
    monkeypatch.setattr(verify_mod, "THREADS", 4)
    g = em.Graph("g")
    x = g.input("x", (8, 8))
    g.output(em.exp(x) * 2.0, "y")
    for workers, most in ((1, 4), (2, 1)):
        monkeypatch.setattr(limits.os, "cpu_count", lambda: 2)
        active.value = workers
        asked.clear()
        assert em.verify(g, g, trials=4, seed=0).equivalent
        assert asked and max(asked) == most, asked
