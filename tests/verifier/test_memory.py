"""The verifier's memory estimate (``verifier/memory.py``) against what verification holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.ir.limits import MEMORY_ENV
from eqsat_mirage.semantics.interp import last_reads
from eqsat_mirage.verifier.memory import BASE, graph_peak, verify_parts

ROOT = Path(__file__).resolve().parents[2]

MEASURE = """
import json, resource, sys
sys.path.insert(0, {root!r})
import eqsat_mirage as em
# a process that verifies is a search's: its modules loaded (the estimate's BASE counts
# them; ``import eqsat_mirage`` alone now loads none of the stages)
import eqsat_mirage.pipeline.search
from bench.programs import program, rewritten
from eqsat_mirage.verifier import runner
from eqsat_mirage.verifier.memory import verify_parts
# one trial at a time: two threads at once reach their peaks together only when the machine
# is idle (on a loaded one the measured peak fell to 1/1.51 of the two-trial estimate)
runner.THREADS = 1
a, b = program({name!r}, {batch}), rewritten({name!r}, {batch})
estimate = sum(n for _, n in verify_parts(a, b, 1, 3))
em.verify(a, b, trials=3, seed=0, memo={{}}, float_check=False)
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec from the forked parent, so a
# child of a large test process would report the parent's size
hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")]
peak = int(hwm[0].split()[1]) * 1024 if hwm else \
    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps([estimate, peak]))
"""


def attention(n: int = 64) -> em.Graph:
    g = em.Graph("att")
    q, k, v = g.input("q", (2, n, 16)), g.input("k", (2, 16, n)), g.input("v", (2, n, 16))
    a = em.exp(q @ k)
    g.output((a / a.sum(axis=-1, keepdims=True)) @ v, "o")
    return g


def test_values_are_dropped_after_their_last_reader():
    g = attention()
    nodes = g.nodes()
    done = last_reads(nodes, g.outputs.values())
    dropped = [key for keys in done.values() for key in keys]
    assert len(dropped) == len(set(dropped))
    assert id(g.outputs["o"]) not in dropped
    assert {id(n) for n in nodes if n is not g.outputs["o"]} == set(dropped)
    # evaluation is unchanged by dropping
    ins = {n: np.random.default_rng(0).standard_normal(x.shape) for n, x in g.inputs.items()}
    out = em.evaluate(g, ins)["o"]
    s = np.exp(ins["q"] @ ins["k"])
    np.testing.assert_allclose(out, (s / s.sum(-1, keepdims=True)) @ ins["v"])


def test_the_estimate_counts_only_the_parts_the_field_uses():
    inputs, out, peak, at = graph_peak(attention(256), field=True)
    scores = 2 * 256 * 256 * 8  # q@k: its Z_q part only (it feeds an exp)
    assert inputs > 0 and out == 2 * 256 * 16 * 8
    assert scores <= peak < 8 * scores
    assert "att" in at


@pytest.mark.slow
def test_the_estimate_is_within_one_and_a_half_times_the_measured_peak():
    code = MEASURE.format(root=str(ROOT), name="gqa", batch=2)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    estimate, peak = json.loads(run.stdout.splitlines()[-1])
    assert peak / 1.5 <= estimate <= 1.5 * peak, (estimate, peak)


def test_trials_run_one_at_a_time_when_two_at_once_do_not_fit(monkeypatch):
    from eqsat_mirage.verifier import memory, runner

    g = attention(128)
    one = sum(n for _, n in verify_parts(g, g, 1, 4))
    two = sum(n for _, n in verify_parts(g, g, 2, 4))
    assert one < two
    monkeypatch.setattr(runner, "THREADS", 2)
    monkeypatch.setattr("eqsat_mirage.verifier.verify.THREADS", 2)
    seen = []
    real = memory.threads_that_fit

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]
    monkeypatch.setattr("eqsat_mirage.verifier.verify.threads_that_fit", spy)
    monkeypatch.setenv(MEMORY_ENV, str((one + two) // 2))
    assert em.verify(g, g, trials=4, seed=0, memo={}, float_check=False).equivalent
    assert seen == [1]
    monkeypatch.setenv(MEMORY_ENV, str(one - BASE // 2))
    with pytest.raises(em.BudgetError, match="at its peak, over the memory budget"):
        em.verify(g, g, trials=4, seed=0, memo={}, float_check=False)


def test_a_transposed_input_is_counted_once_as_the_walk_reads_it():
    """``x @ w.T`` (torch's linear) in float64, inputs made as they are read: the transpose
    is a view of the weight, held to the matmul, so the estimate is the traced peak (within
    a few KB), not the weight twice."""
    import tracemalloc

    from eqsat_mirage.semantics.floating import LazyInputs

    g = em.Graph("linear")
    x, w = g.input("x", (64, 256)), g.input("w", (1024, 256))
    g.output(x @ w.T, "y")
    rng = np.random.default_rng(0)
    values = {n: rng.standard_normal(v.shape) for n, v in g.inputs.items()}
    _, _, estimate, _ = graph_peak(g, field=False, lazy=True)
    tracemalloc.start()
    try:
        em.evaluate(g, LazyInputs(values, lambda n: values[n].copy()))
        traced = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    weight = 1024 * 256 * 8
    assert estimate >= traced - 2**16 and estimate < traced + weight // 2, (estimate, traced)


def test_an_output_that_is_a_view_holds_its_whole_operand():
    """A slice of a product, as an output: NumPy keeps the whole product alive, so the walk
    holds all of it to the end and counts it as the output's bytes."""
    import tracemalloc

    g = em.Graph("sliced")
    x, w = g.input("x", (256, 256)), g.input("w", (256, 256))
    g.output((x @ w)[:, 0:8], "y")
    _, out, estimate, _ = graph_peak(g, field=False)
    assert out == 256 * 256 * 8
    rng = np.random.default_rng(0)
    values = {n: rng.standard_normal(v.shape) for n, v in g.inputs.items()}
    tracemalloc.start()
    try:
        got = em.evaluate(g, values)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert got["y"].shape == (256, 8) and held >= out  # the product, alive through the slice
    assert estimate >= out
