"""The fusion planner against brute force (``bench/brute_force.py``, issue 33's yardstick;
the program sets and the command line are ``bench/brute_force_bench.py``), and
``em.optimize`` against the same brute force.

The brute force prices every acyclic partition of a small program's ops into kernels with
the planner's own schedules and cost model, so it is a lower bound on the planner's plan of
the same program: a plan cheaper than it is a bug in one of the two.
"""

from __future__ import annotations

import math

import pytest

import eqsat_mirage as em
from bench.brute_force import (
    MAX_OPS,
    BruteForceError,
    Pricer,
    Space,
    brute_force,
    partitions,
    summarize,
)
from bench.brute_force_bench import (
    optimize_report,
    optimize_row,
    optimize_summary,
    random_programs,
    run,
)
from bench.programs import program
from eqsat_mirage.codegen.tune import can_tune
from eqsat_mirage.fusion.planner import plan

BELL = [1, 1, 2, 5, 15, 52, 203]


@pytest.fixture(scope="module")
def pricer() -> Pricer:
    """One pricer for the module: region prices are memoized across programs."""
    return Pricer()


def chain(n: int) -> em.Graph:
    """x -> exp -> neg -> ... : ``n`` unary ops in a row."""
    g = em.Graph("chain")
    x = g.input("x", (64, 64), dtype="float16")
    y = x
    for i in range(n):
        y = em.exp(y) if i % 2 == 0 else -y
    g.output(y, "O")
    return g


@pytest.mark.parametrize("n", range(len(BELL)))
def test_partitions_are_every_set_partition_once(n):
    labels = list(partitions(n))
    assert len(labels) == BELL[n]
    blocks = {frozenset(frozenset(i for i, b in enumerate(lab) if b == k) for k in set(lab))
              for lab in labels}
    assert len(blocks) == BELL[n]  # all distinct as set partitions
    for lab in labels:  # restricted growth: block k first appears after blocks 0..k-1
        assert all(lab[i] <= max(lab[:i], default=-1) + 1 for i in range(n))


def test_acyclic_refuses_a_kernel_split_around_another():
    space = Space(chain(3))  # op 0 -> op 1 -> op 2
    assert space.acyclic((0, 0, 0)) and space.acyclic((0, 1, 2)) and space.acyclic((0, 0, 1))
    assert not space.acyclic((0, 1, 0))  # ops 0 and 2 in one kernel, op 1 between them


def test_too_many_ops_is_refused(pricer):
    with pytest.raises(BruteForceError, match=f"more than {MAX_OPS}"):
        brute_force(chain(MAX_OPS + 1), pricer)


def test_brute_force_covers_every_op_once_and_bounds_the_planner(pricer):
    g = chain(4)
    res = brute_force(g, pricer)
    assert res.complete and res.partitions == BELL[4]
    assert sorted(i for r in res.regions for i in r) == list(range(4))
    p = plan(g, pricer.prof, pricer.strategy)
    assert res.cost_us <= sum(r.cost_us for r in p.regions) * (1 + 1e-9)
    one_per_op = sum(pricer.price(Space(g).fragment(frozenset({i}))).cost_us for i in range(4))
    assert res.cost_us <= one_per_op
    assert math.isfinite(res.cost_us)


# The set both slow tests below run on: five benchmark inputs of at most 6 ops and 48 random
# programs (bench/RESULTS.md, "Planner against brute force").
SET = [("gqa", 1), ("gqa", 8), ("rmsnorm", 1), ("lora", 1), ("gatedmlp", 1)]


@pytest.fixture(scope="module")
def brute_set(pricer):
    """The programs, their comparisons with the brute force and those skipped (computed once
    for the module)."""
    progs = [(f"{name} b={b}", program(name, b)) for name, b in SET]
    progs += [(f"random d<=6 #{i}", g) for i, g in enumerate(random_programs(24, 6))]
    progs += [(f"random d<=64 #{i}", g) for i, g in enumerate(random_programs(24, 64))]
    comps, skipped = run(progs, pricer)
    return progs, comps, skipped


# The planner on that set: greedy merging (the planner before the region search) reached
# 51 of 53 (gqa b=8's input program 59.43 us in 3 kernels against 35.85 us in 2, 1.66x);
# the region search (fusion/regions.py: exact DP for programs of at most 6 ops) all 53.
# This is a floor against regression, and the bar is asserted too: equal cost on
# at least 95% of the programs, never above 1.05x.
TODAY_EQUAL = 53
BAR_EQUAL, BAR_RATIO = 0.95, 1.05


@pytest.mark.slow
def test_planner_against_brute_force(brute_set):
    _, comps, skipped = brute_set
    s = summarize(comps, skipped)
    print(f"\nplanner against brute force: {s}")
    for c in s.losers:
        print(f"  {c.label}: planner {c.planner_us:.2f} us {c.planner_regions}, brute force "
              f"{c.brute.cost_us:.2f} us {c.brute.regions} ({c.ratio:.3f}x)")
    assert not skipped and not s.incomplete
    assert s.complete >= 50
    assert not s.violations, f"brute force dearer than the planner on {s.violations}"
    assert s.equal >= TODAY_EQUAL, f"regression: {s.equal} equal, today {TODAY_EQUAL}"
    assert s.equal >= BAR_EQUAL * s.complete and s.worst_ratio <= BAR_RATIO, str(s)


# em.optimize's returned cost against the brute force over each program as written (the
# issue's "Must show"), on the 48 random programs and the two benchmark inputs whose search
# is short (gqa b=1, lora; gqa b=8, rmsnorm and gatedmlp take 20 to 105 s each on the
# shared 2-core machine: their figures are in bench/history/, their em.optimize costs are
# tests/test_bench_costs.py's). em.optimize may find a cheaper algebraic form: at most the
# brute force's cost is the pass. Before the program as written was planned among the forms
# (pipeline/optimize.py, boundaries.written_form), 46 of these 50 (random d<=6 #3 and d<=64
# #3: a max over two axes planned only as two nested maxes, 3.69 / 3.65 us against a library
# kernel's 3.00; d<=64 #4 and #5 1.000003x and 1.000002x); now all 50, 3 strictly cheaper
# (gqa b=1 10.13 us against 15.30). The compile check, on by default in em.optimize where
# Triton's NVIDIA compiler is installed, is on here for the four former losers (d<=64 #4's
# first plan is refused by the Triton backend and re-planned) and off for the rest: in the
# suite (TRITON_INTERPRET=1) each build runs in a child Python, and all 50 with the check
# took 686 s on the loaded 2-core machine; the figures in bench/history/ have it on for all.
# A time limit that does not depend on the machine's load.
OPTIMIZE_SET = ("random ", "gqa b=1", "lora b=1")
CHECKED = ("random d<=6 #3", "random d<=64 #3", "random d<=64 #4", "random d<=64 #5")
TODAY_AT_MOST = 50


@pytest.mark.slow
def test_optimize_against_brute_force(brute_set):
    progs, comps, _ = brute_set
    graphs = dict(progs)
    rows = [optimize_row(c.label, graphs[c.label], c.brute.cost_us, cache=False,
                         compile_check=c.label in CHECKED and can_tune("h100"),
                         time_limit_s=3600)
            for c in comps if c.label.startswith(OPTIMIZE_SET) and c.brute.complete]
    print(f"\n{optimize_report(rows)}")
    assert len(rows) >= 50
    assert all(r.verified and not r.time_limited for r in rows), \
        [r.label for r in rows if not r.verified or r.time_limited]
    at_most = sum(r.at_most for r in rows)
    worst = max(r.ratio for r in rows)
    assert at_most >= TODAY_AT_MOST, f"regression: {at_most} at most, today {TODAY_AT_MOST}"
    assert at_most >= BAR_EQUAL * len(rows) and worst <= BAR_RATIO, optimize_summary(rows)
