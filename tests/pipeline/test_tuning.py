"""Measured tuning with an injected, deterministic timer (no GPU needed): the measured
winner is taken, the eager form is kept when it is faster, and the results cache keys a
tuned plan by the device it was timed on."""

from __future__ import annotations

import pytest

import eqsat_mirage as em
from eqsat_mirage.runtime.timing import Timing, fastest, time_candidates
from tests.attention_graphs import attention as shared_attention

LIMIT = 600  # the search's cap: far more than it needs, so a busy machine changes nothing


class FakeTimer:
    """Times by name from a table (every launch still runs once: the candidate is real)."""

    def __init__(self, times: dict[str, float], device: str = "fake-gpu",
                 default: float = 5.0) -> None:
        self.times, self.default, self.device = times, default, device
        self.seen: list[str] = []

    def __call__(self, name, launch):
        launch()
        self.seen.append(name)
        t = self.times.get(name, self.default)
        return [t * 1.01, t, t * 0.99]


def attention() -> em.Graph:
    """The shared unsafe attention (exp(s) / sum(exp(s))) in float32, small: several plans
    verify, so there is something to time."""
    return shared_attention(False, "float32", b=2, m=16, d=16, n=64)


def test_the_measured_winner_is_taken_not_the_models():
    first = FakeTimer({})
    base = em.optimize(attention(), cache=False, timer=first, time_limit_s=LIMIT)
    timed = [p for p in base.stats["plans"] if p.get("measured_us") is not None]
    assert len(timed) >= 2, base.stats["plans"]  # more than one verified plan was timed
    # every timed plan verified, and the eager form timed beside them
    assert all(p["verified"] for p in timed) and "eager" in base.stats["tuned"]["times_us"]
    slower_by_model = timed[-1]["how"]
    timer = FakeTimer({slower_by_model: 1.0, "eager": 9.0})
    res = em.optimize(attention(), cache=False, timer=timer, time_limit_s=LIMIT)
    assert res.stats["tuned"]["chosen"] == slower_by_model
    assert res.stats["tuned"]["times_us"][slower_by_model] == pytest.approx(1.0)
    chosen = next(p for p in res.stats["plans"] if p["how"] == slower_by_model)
    assert res.cost_us == pytest.approx(chosen["cost_us"], rel=1e-6)
    assert res.verified.equivalent and res.passes.tuning.device == "fake-gpu"
    assert "tune" in res.stats["phase_seconds"]


def test_the_eager_form_is_kept_when_it_is_faster():
    timer = FakeTimer({"eager": 1.0})
    res = em.optimize(attention(), cache=False, timer=timer, time_limit_s=LIMIT)
    assert timer.seen[-1] == "eager" and res.stats["tuned"]["chosen"] == "eager"
    assert res.stats["custom_kernels"] == 0 and res.stats["regions"] == []
    assert res.cost_us == res.baseline_cost_us
    assert res.verified is not None and res.verified.equivalent  # the input, checked


def test_the_model_decides_without_a_timer_or_when_told():
    timer = FakeTimer({"eager": 1.0})
    res = em.optimize(attention(), cache=False, timer=timer, tune="model",
                      time_limit_s=LIMIT)
    assert timer.seen == [] and "tuned" not in res.stats and res.passes.tuning is None
    plain = em.optimize(attention(), cache=False, time_limit_s=LIMIT)  # no CUDA here
    assert "tuned" not in plain.stats and str(plain.program) == str(res.program)


def test_tune_device_without_a_device_is_refused():
    with pytest.raises(em.MirageError, match="tune='device' needs a CUDA device"):
        em.optimize(attention(), cache=False, tune="device")
    with pytest.raises(em.MirageError, match="tune must be one of"):
        em.optimize(attention(), cache=False, tune="fastest")


def test_the_cache_keys_a_tuned_plan_by_its_device(tmp_path):
    path = tmp_path / "cache.sqlite"
    a = em.optimize(attention(), cache=str(path), timer=FakeTimer({}, device="gpu-a"),
                    time_limit_s=LIMIT)
    assert a.stats["cache"] == "miss"
    again = em.optimize(attention(), cache=str(path), timer=FakeTimer({}, device="gpu-a"),
                        time_limit_s=LIMIT)
    assert again.stats["cache"] == "hit" and again.stats["tuned"]["device"] == "gpu-a"
    other = FakeTimer({}, device="gpu-b")
    b = em.optimize(attention(), cache=str(path), timer=other, time_limit_s=LIMIT)
    assert b.stats["cache"] == "miss" and other.seen  # tuned again on the other device
    model = em.optimize(attention(), cache=str(path), tune="model", time_limit_s=LIMIT)
    assert model.stats["cache"] == "miss" and "tuned" not in model.stats


def test_medians_and_ties_are_deterministic():
    timer = FakeTimer({"a": 2.0, "b": 1.0, "c": 1.0})
    timings = time_candidates({n: (lambda: None) for n in ("a", "b", "c")}, timer)
    assert [t.median_us for t in timings] == [2.0, 1.0, 1.0]
    assert fastest(timings) == "b"  # a tie goes to the earlier (the model's order)
    assert fastest([Timing("x", 3.0, (3.0,)), Timing("y", 3.0, (3.0,))]) == "x"
