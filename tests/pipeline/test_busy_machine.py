"""A search's result does not depend on how fast the machine runs (issue 51): every pass
stops on work done and the wall-clock limit is only a cap. A busy machine is simulated by a
clock that runs ``SLOWDOWN`` times faster than real time (every ``time.perf_counter`` the
package reads), so each search looks that many times slower to every deadline, share and
clock-relative bound; with the defaults, the result must equal the one on the real clock."""

from __future__ import annotations

import time

import pytest

import eqsat_mirage as em
from bench.programs import program
from eqsat_mirage.fusion.plans import plan_key

# A busy machine: 40 times slower by default. The LoRA test picks its own factor from a
# search on the real clock, so the slowed search looks about 150 s long (past the old 60 s
# default limit, under the 600 s cap) however fast this machine and the search are.
SLOWDOWN = 40.0
LOOKS_SECONDS = 150.0


def _install(factor: float):
    """Make ``time.perf_counter`` and ``time.monotonic`` run ``factor`` times fast."""
    real, start = time.perf_counter, time.perf_counter()
    real_mono, start_mono = time.monotonic, time.monotonic()
    time.perf_counter = lambda: start + factor * (real() - start)
    time.monotonic = lambda: start_mono + factor * (real_mono() - start_mono)
    return real


@pytest.fixture
def slow_clock(monkeypatch):
    """A function that installs a clock ``factor`` times fast (default ``SLOWDOWN``); the
    real clocks come back at teardown. Returns the real ``time.perf_counter``."""
    monkeypatch.setattr(time, "perf_counter", time.perf_counter)  # restored at teardown
    monkeypatch.setattr(time, "monotonic", time.monotonic)
    real_pc, real_mono = time.perf_counter, time.monotonic

    def slow_down(factor: float = SLOWDOWN):
        time.perf_counter, time.monotonic = real_pc, real_mono
        return _install(factor)

    return slow_down


def _search(graph):
    res = em.optimize(graph, target="h100", cache=False, progress=False)
    return res, plan_key(res.program), res.cost_us


def test_same_plan_on_a_slow_clock(slow_clock):
    """LoRA (b=1) with the defaults: the same plan, cost and verdict on a clock fast enough
    that the search looks about 150 s long as on the real one, and the slow search did not
    reach its cap."""
    graph = program("lora", 1)
    quick, quick_key, quick_cost = _search(graph)
    factor = LOOKS_SECONDS / max(quick.stats["seconds"], 1e-3)
    slow_clock(factor)
    slow, slow_key, slow_cost = _search(graph)
    assert slow.stats["seconds"] > 60.0, "the slowed search should look longer than the old limit"
    assert not slow.stats.get("time_limited")
    assert slow.passes.deadline_passed is False and slow.passes.search_timed_out is False
    assert slow.verified is not None and slow.verified.equivalent
    assert (slow_key, slow_cost) == (quick_key, quick_cost)
    assert slow_cost < slow.baseline_cost_us


def _compile_summary(module, x):
    import torch

    torch._dynamo.reset()
    be = em.backend(warmup=0, warn=False)
    out = torch.compile(module, backend=be)(x)
    summary = be.summary()
    return out, summary["ops"], summary["optimized_ops"], [
        g.get("predicted_us") for g in summary["graphs"]]


def test_backend_same_partitions_on_a_slow_clock(slow_clock):
    """The torch.compile backend with its defaults: a gated MLP block gets every op
    optimized, and the same predicted times, on a clock 40x fast as on the real one."""
    import torch
    from torch_models import GatedMLP

    torch.manual_seed(0)
    module, x = GatedMLP(d=16, h=32).eval(), torch.randn(4, 16)
    with torch.no_grad():
        quick = _compile_summary(module, x)
        slow_clock()
        slow = _compile_summary(module, x)
        expected = module(x)
    assert slow[1] == slow[2] > 0  # every op optimized
    assert slow[1:] == quick[1:]
    torch.testing.assert_close(slow[0], expected, rtol=2e-3, atol=2e-3)
