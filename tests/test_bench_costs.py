"""Regression guard: what ``em.optimize`` chooses for each benchmark never costs more.

The cost model is deterministic, so each of the twelve cases of ``bench.programs.cases()``
searched for the h100 datasheet profile must come back at most at its recorded cost. A
rise means a change lost a plan (a rule, the planner, the verifier or its memory budget
refusing a plan it used to check). Lower is fine: record the new figure here.
"""

from __future__ import annotations

import pytest

import eqsat_mirage as em
from bench.programs import cases, program

# (benchmark, batch) -> chosen cost_us on target="h100" (bench/RESULTS.md)
RECORDED = {
    ("gqa", 1): 10.13, ("gqa", 8): 19.16,
    ("qknorm", 1): 10.13, ("qknorm", 8): 21.59,
    ("rmsnorm", 1): 19.73, ("rmsnorm", 8): 20.01,
    ("lora", 1): 3.82, ("lora", 8): 3.82,
    ("gatedmlp", 1): 25.44, ("gatedmlp", 8): 25.44,
    ("ntrans", 1): 3.87, ("ntrans", 8): 3.87,
}
ROUNDING = 0.005  # the recorded figures are rounded to 0.01 us


def test_every_case_is_recorded():
    assert set(RECORDED) == set(cases())


@pytest.mark.slow
@pytest.mark.parametrize("name,batch", sorted(RECORDED))
def test_the_chosen_cost_never_rises(name, batch):
    # generous limit: the search is deterministic given time, and the guard is about the
    # cost model's choice, never about this machine's speed
    res = em.optimize(program(name, batch), target="h100", cache=False, time_limit_s=3600)
    assert res.verified, res.verified
    assert res.cost_us <= (RECORDED[name, batch] + ROUNDING) * (1 + 1e-6), (
        f"{name} b={batch}: {res.cost_us:.4f} us, recorded {RECORDED[name, batch]} us "
        f"({len(res.program.kernels)} kernels; plans {res.stats.get('plans')})")
