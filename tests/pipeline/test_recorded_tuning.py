"""Tuning by times measured before (``runtime.timing.RecordedTimer``): plans are looked up by
their ``plan_key``, the fastest measured wins, eager included, nothing is launched, and a
plan nobody measured leaves the model's pick standing."""

from __future__ import annotations

import json

import pytest

import eqsat_mirage as em
from bench.gpu_tuning import KeepingSearch
from eqsat_mirage.mugraph.program import MuGraph, from_graph
from eqsat_mirage.runtime.timing import RecordedTimer, plan_key
from tests.pipeline.test_tuning import LIMIT, FakeTimer, attention


def key(mg: MuGraph) -> str:
    return plan_key(json.loads(mg.to_json()))


@pytest.fixture(scope="module")
def plans() -> list[MuGraph]:
    """The verified plans a tuning search of the small attention times, in the model's order
    (what the GPU bundle's tuning groups hold)."""
    search = KeepingSearch(attention(), "h100", LIMIT)
    search.run()
    assert len(search.kept) >= 2
    return [plan.mugraph for _, plan in search.kept]


def test_the_fastest_measured_plan_is_chosen_and_nothing_is_launched(plans):
    times = {key(mg): 10.0 + i for i, mg in enumerate(plans)}
    times[key(plans[-1])] = 1.0  # the model's last verified plan measured fastest
    times[key(from_graph(attention()))] = 50.0  # the eager form
    timer = RecordedTimer("NVIDIA H200|torch 2.11|triton 3.6|cuda 13.0", times)
    res = em.optimize(attention(), cache=False, timer=timer, time_limit_s=LIMIT)
    tuned = res.stats["tuned"]
    assert key(res.program) == key(plans[-1]) and tuned["times_us"][tuned["chosen"]] == 1.0
    assert set(tuned["modes"].values()) == {"recorded"} and tuned["errors"] == []
    assert res.verified.equivalent and tuned["device"].startswith("NVIDIA H200")


def test_eager_measured_fastest_is_kept(plans):
    times = {key(mg): 10.0 for mg in plans}
    times[key(from_graph(attention()))] = 2.0
    res = em.optimize(attention(), cache=False, time_limit_s=LIMIT,
                      timer=RecordedTimer("gpu", times))
    assert res.stats["tuned"]["chosen"] == "eager" and res.stats["custom_kernels"] == 0


def test_plans_nobody_measured_leave_the_models_pick(plans):
    res = em.optimize(attention(), cache=False, time_limit_s=LIMIT,
                      timer=RecordedTimer("gpu", {"0" * 64: 1.0}))
    model = em.optimize(attention(), cache=False, time_limit_s=LIMIT, tune="model")
    assert key(res.program) == key(model.program) == key(plans[0])
    assert res.stats["tuned"]["times_us"] == {}
    assert all("not measured on gpu" in e for e in res.stats["tuned"]["errors"])


def test_a_plans_key_ignores_its_name(plans):
    renamed = MuGraph.from_json(plans[0].to_json())
    renamed.name = "another_name"
    assert key(renamed) == key(plans[0]) and key(plans[0]) != key(plans[1])


def test_a_measured_file_round_trips_and_bad_files_are_refused(tmp_path):
    timer = RecordedTimer("NVIDIA H200|torch 2.11", {"ab" * 32: 12.5})
    path = tmp_path / "m.json"
    path.write_text(timer.to_json())
    assert RecordedTimer.load(path) == timer
    for text in ("[1, 2]", '{"device": "x", "times_us": {"k": -1}}', "{", "[" * 100000,
                 '{"device": "x", "times_us": {"k": 1' + "0" * 400 + "}}",
                 '{"device": 3, "times_us": {}}'):
        path.write_text(text)
        with pytest.raises(em.MirageError, match="not a file of measured times"):
            RecordedTimer.load(path)
    with pytest.raises(em.MirageError, match="not a file of measured times"):
        RecordedTimer.load(tmp_path / "missing.json")


def test_worker_processes_tune_with_the_timer_they_are_sent(plans):
    """``optimize_many`` sends its timer to each worker process, so the pieces of a whole
    program searched in worker processes are tuned as inline ones are."""
    times = {key(mg): 10.0 for mg in plans}
    times[key(plans[-1])] = 1.0
    timer = RecordedTimer("gpu", times)
    other = attention()
    other.name = "other"  # a second program, so two workers start
    first, second = em.optimize_many([attention(), other], jobs=2, cache=False, timer=timer,
                                     time_limit_s=LIMIT)
    assert key(first.program) == key(plans[-1]) and first.stats["tuned"]["device"] == "gpu"
    assert second.stats["tuned"]["device"] == "gpu"  # its plans' sources name "other"
    class Local(FakeTimer):  # a class local to a function: not picklable
        pass

    with pytest.raises(em.MirageError, match="cannot be sent to worker processes"):
        em.optimize_many([attention(), other], jobs=2, cache=False, timer=Local({}),
                         time_limit_s=LIMIT)


def test_two_measured_files_are_cached_apart(tmp_path, plans):
    """The results cache keys a plan tuned by recorded times by their digest, not the
    device's name alone: a second file's times are not served the first file's plan."""
    cache = str(tmp_path / "c.sqlite")
    fast_last = {key(mg): 10.0 for mg in plans} | {key(plans[-1]): 1.0}
    fast_first = {key(mg): 10.0 for mg in plans} | {key(plans[0]): 1.0}
    a = em.optimize(attention(), cache=cache, time_limit_s=LIMIT,
                    timer=RecordedTimer("gpu", fast_last))
    b = em.optimize(attention(), cache=cache, time_limit_s=LIMIT,
                    timer=RecordedTimer("gpu", fast_first))
    assert b.stats["cache"] == "miss" and key(a.program) != key(b.program)


def test_a_piece_stands_on_its_measurement_only_against_a_measured_eager_form():
    """``whole.changed``: a piece the model prices above its input stays optimized only
    when its plan was measured faster than its eager form; with no eager time (its key not
    in the file) the model's rule decides."""
    from types import SimpleNamespace

    from eqsat_mirage.pipeline.whole import changed

    def piece(times: dict) -> SimpleNamespace:
        return SimpleNamespace(verified=SimpleNamespace(equivalent=True), cost_us=10.0,
                               baseline_cost_us=5.0, stats={
                                   "level": "mugraph", "regions": ["r"],
                                   "tuned": {"chosen": "#1", "times_us": times}})

    assert changed(piece({"#1": 1.0, "eager": 2.0}))
    assert not changed(piece({"#1": 1.0}))
    assert not changed(piece({"#1": 3.0, "eager": 2.0}))
