"""``limits.programs_fixed``: inside it ``program_peak`` walks each (program, field, lazy)
once and a MuGraph is validated and staged once (``tiled.validated_plans``), in the
verifier's pool threads too; outside it, every call works them out again (a program may
have changed); the kept results equal those worked out afresh, and a verification and an
end-to-end check decide the same with it."""

from __future__ import annotations

import contextlib

import numpy as np

import eqsat_mirage as em
from eqsat_mirage.ir.limits import fixed_fact
from eqsat_mirage.ir.limits import programs_fixed as peaks_kept
from eqsat_mirage.verifier import memory
from eqsat_mirage.verifier.memory import float_parts, program_peak, verify_parts


def _graph(name: str = "g", n: int = 8) -> em.Graph:
    g = em.Graph(name)
    x = g.input("x", (n, 16), dtype="float32")
    w = g.input("w", (16, 32), dtype="float32")
    g.output(em.exp(x @ w).sum(axis=1, keepdims=True), "out")
    return g


def _counted(monkeypatch) -> list:
    """The programs ``graph_peak`` walked (each call appends its Graph's name and args)."""
    walked = []
    real = memory.graph_peak

    def counted(g, field, lazy=False):
        walked.append((g.name, field, lazy))
        return real(g, field, lazy)
    monkeypatch.setattr(memory, "graph_peak", counted)
    return walked


def test_each_peak_is_walked_once_inside_and_every_time_outside(monkeypatch):
    a, b = _graph("a"), _graph("b")
    fresh = {(p.name, f, z): program_peak(p, f, z)
             for p in (a, b) for f in (True, False) for z in (False, True)}
    walked = _counted(monkeypatch)
    with peaks_kept():
        for _ in range(3):
            for n in (1, 2, 4):
                verify_parts(a, b, n, 3)
                float_parts(a, b, n)
        kept = {(p.name, f, z): program_peak(p, f, z)
                for p in (a, b) for f in (True, False) for z in (False, True)}
    assert kept == fresh
    assert sorted(walked) == sorted(set(walked))  # none twice
    walked.clear()
    verify_parts(a, b, 2, 3)
    once = list(walked)
    verify_parts(a, b, 2, 3)
    assert walked == once + once  # outside: walked again on every call


def test_the_key_is_the_program_itself_and_its_field_and_lazy(monkeypatch):
    a, a2 = _graph("a", 8), _graph("a", 64)  # the same name, other sizes
    with peaks_kept():
        assert program_peak(a, True) != program_peak(a2, True)
        assert program_peak(a, True) != program_peak(a, False)
        assert program_peak(a, False) != program_peak(a, False, lazy=True)
        assert program_peak(a2, True) == memory.graph_peak(a2, True)


def test_a_program_changed_after_the_block_is_walked_again():
    g = em.Graph("g")
    x = g.input("x", (8, 16), dtype="float32")
    g.output(x.sum(axis=1, keepdims=True), "out")
    with peaks_kept():
        before = program_peak(g, False)
    g.output(em.exp(x) * 2.0, "more")  # a larger program now
    with peaks_kept():
        after = program_peak(g, False)
    assert after == memory.graph_peak(g, False) and after != before


def test_nested_blocks_share_and_the_outer_one_drops_them(monkeypatch):
    g = _graph("g")
    walked = _counted(monkeypatch)
    with peaks_kept():
        program_peak(g, True)
        with peaks_kept():
            program_peak(g, True)
        program_peak(g, True)
    assert len(walked) == 1
    program_peak(g, True)  # nothing kept after the outer block
    assert len(walked) == 2


def test_verify_and_the_end_to_end_check_decide_the_same_with_the_peaks_kept(monkeypatch):
    import eqsat_mirage.verifier.endtoend as endtoend
    import eqsat_mirage.verifier.verify as verify

    a, b = _graph("a"), _graph("b")
    good = em.verify(a, b, trials=2, seed=3)
    checked = endtoend.float_check(a, b, seed=0)
    for mod in (verify, endtoend):  # the same calls with nothing kept
        monkeypatch.setattr(mod, "programs_fixed", contextlib.nullcontext)
    again = em.verify(a, b, trials=2, seed=3)
    assert good.equivalent and again.equivalent
    assert (good.false_positive_bound, good.trials) == (again.false_positive_bound, again.trials)
    assert repr(endtoend.float_check(a, b, seed=0).counterexample) == repr(checked.counterexample)


def test_fixed_facts_are_bounded_and_keyed_by_the_object_and_name():
    made = []

    def make(v):
        def m():
            made.append(v)
            return v
        return m
    one, two = object(), object()
    with peaks_kept():
        assert fixed_fact(one, "x", make(1)) == 1 and fixed_fact(one, "x", make(9)) == 1
        assert fixed_fact(one, "y", make(2)) == 2 and fixed_fact(two, "x", make(3)) == 3
        for i in range(5000):  # past limits.KEPT: the oldest go first
            fixed_fact(object(), i, make(i))
        assert fixed_fact(one, "x", make(4)) == 4  # dropped, made again
    assert fixed_fact(one, "x", make(5)) == 5 and fixed_fact(one, "x", make(6)) == 6
    assert made[:3] == [1, 2, 3] and made[-3:] == [4, 5, 6]


def test_a_mugraph_is_staged_once_per_verification_in_the_pool_threads_too(monkeypatch):
    from eqsat_mirage.fusion.lower import lower
    from eqsat_mirage.fusion.schedule import Schedule
    from eqsat_mirage.mugraph import tiled
    from eqsat_mirage.verifier import verify as verify_mod

    g = em.Graph("mm")
    x = g.input("x", (8, 16), dtype="float32")
    w = g.input("w", (16, 32), dtype="float32")
    g.output(em.exp(x @ w), "out")
    mg = lower(g, Schedule(grid={}))
    staged = []
    real = tiled.plans

    def counted(m):
        staged.append(m)
        return real(m)
    monkeypatch.setattr(tiled, "plans", counted)
    monkeypatch.setattr(verify_mod, "THREADS", 2)  # the trials and checks on a pool
    got = em.verify(g, mg, trials=2, seed=1)
    assert got.equivalent and got.float_checked
    assert staged.count(mg) == 1  # the peaks, the trials and every float check: once
    staged.clear()
    em.evaluate(mg, {"x": np.ones((8, 16)), "w": np.ones((16, 32))})
    em.evaluate(mg, {"x": np.ones((8, 16)), "w": np.ones((16, 32))})
    assert staged.count(mg) == 2  # outside a verification: every run
