"""NumPy's BLAS on one thread while the verifier's pool of several threads runs
(``verifier/blas.py``): set inside, given back after; a one-thread runner holds it only
when other processes keep the cores busy."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.ir.limits import Deadline
from eqsat_mirage.verifier import blas
from eqsat_mirage.verifier.runner import runner


@pytest.fixture
def libs():
    found = blas.libraries()
    if not found:
        pytest.skip("no OpenBLAS loaded in this process (another BLAS or platform)")
    before = [lib.threads() for lib in found]
    for lib in found:
        lib.use(2)
    yield found
    for lib, n in zip(found, before):
        lib.use(n)


def _threads() -> list[int]:
    return [lib.threads() for lib in blas.libraries()]


def test_numpys_openblas_is_found():
    import numpy as np

    info = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    if "openblas" not in str(info.get("name", "")).lower():
        pytest.skip(f"NumPy's BLAS is {info.get('name')!r}")
    assert any("openblas" in lib.path.lower() for lib in blas.libraries())


def test_a_pool_of_two_runs_blas_on_one_thread_and_gives_it_back(libs):
    with runner(Deadline(None), 2) as pool:
        seen = list(pool.in_order([_threads, _threads, _threads]))
    assert seen == [[1] * len(libs)] * 3
    assert _threads() == [2] * len(libs)


def test_a_one_thread_runner_leaves_blas_alone_on_an_idle_machine(libs, monkeypatch):
    monkeypatch.setattr(blas.os, "getloadavg", lambda: (1.2, 1.0, 1.0))  # this process alone
    with runner(Deadline(None), 1) as pool:
        assert list(pool.in_order([_threads])) == [[2] * len(libs)]


def test_a_one_thread_runner_holds_blas_at_one_thread_on_a_busy_machine(libs, monkeypatch):
    monkeypatch.setattr(blas.os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    monkeypatch.setattr(blas.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(blas, "idle_cores", lambda seconds: 0.3)
    with runner(Deadline(None), 1) as pool:
        assert list(pool.in_order([_threads])) == [[1] * len(libs)]
    assert _threads() == [2] * len(libs)


def test_busy_reads_the_load_less_this_process(monkeypatch):
    monkeypatch.setattr(blas, "idle_cores", lambda seconds: None)  # no /proc/stat
    monkeypatch.setattr(blas.os, "getloadavg", lambda: (1.4, 0.0, 0.0))
    assert not blas.busy(2)
    monkeypatch.setattr(blas.os, "getloadavg", lambda: (1.6, 0.0, 0.0))
    assert blas.busy(2) and not blas.busy(1)  # one core: BLAS has one thread anyway
    assert not blas.busy(16)  # one other busy core leaves a big machine's BLAS its cores
    monkeypatch.setattr(blas.os, "getloadavg", lambda: (16.0, 0.0, 0.0))
    assert blas.busy(16)


def test_busy_asks_the_idle_time_where_the_load_average_says_busy(monkeypatch):
    """The load average still counts load that has ended (worker processes that just
    finished): where it says busy, the cores' idle time now decides; where it says idle,
    nothing is measured."""
    asked = []

    def idle(seconds):
        asked.append(seconds)
        return spare

    monkeypatch.setattr(blas, "idle_cores", idle)
    monkeypatch.setattr(blas.os, "getloadavg", lambda: (2.0, 2.0, 2.0))
    spare = 1.9  # the workers are gone: both cores idle
    assert not blas.busy(2) and asked == [blas.SAMPLE_S]
    spare = 0.6  # another process on one core and a half
    assert blas.busy(2)
    monkeypatch.setattr(blas.os, "getloadavg", lambda: (1.0, 0.0, 0.0))
    assert not blas.busy(2) and len(asked) == 2


def test_idle_cores_reads_the_machine():
    """Between 0 and the core count on Linux (this thread sleeps while it measures)."""
    got = blas.idle_cores(0.05)
    if got is None:
        pytest.skip("no /proc/stat here")
    assert 0.0 <= got <= (blas.os.cpu_count() or 1) + 1e-9


def test_nested_and_overlapping_holds_give_back_the_first_count(libs):
    with blas.single_threaded():
        with blas.single_threaded():
            assert _threads() == [1] * len(libs)
        assert _threads() == [1] * len(libs)  # the outer hold still runs
    assert _threads() == [2] * len(libs)
    with blas.single_threaded(active=False):
        assert _threads() == [2] * len(libs)


def test_the_count_comes_back_when_a_job_raises(libs):
    with pytest.raises(ZeroDivisionError):
        with runner(Deadline(None), 2) as pool:
            list(pool.in_order([lambda: 1 / 0]))
    assert _threads() == [2] * len(libs)


def test_verification_in_the_pool_gives_the_same_verdict(libs):
    """A verification whose pool holds BLAS at one thread decides as before (the field
    trials are exact; the float checks' tolerances hold for any summation order)."""
    def prog(name, split):
        g = em.Graph(name)
        x, w = g.input("x", (64, 256), "float32"), g.input("w", (256, 128), "float32")
        g.output((x @ w) * 0.5 if split else (x * 0.5) @ w, "y")
        return g

    a, b = prog("a", False), prog("b", True)
    r = em.verify(a, b, trials=2, seed=0)
    assert r.equivalent and r.float_checked and _threads() == [2] * len(libs)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 256))
    with blas.single_threaded():
        one = x @ x.T
    assert np.allclose(one, x @ x.T, rtol=1e-12, atol=1e-12)


def test_a_worker_holds_blas_at_one_thread_only_while_another_worker_searches(libs,
                                                                               monkeypatch):
    """One of optimize_many's workers, verifying one job at a time (a 7B MLP piece), holds
    BLAS at one thread for the jobs that start while another worker searches, and gives
    it every core for those that start once the others are done (the load average lags
    by a minute; the shared count does not)."""
    import multiprocessing

    from eqsat_mirage.ir import limits

    active = multiprocessing.get_context("spawn").Value("q", 0)
    monkeypatch.setattr(limits, "_ACTIVE", active)
    seen = []

    def job():
        seen.append(_threads())
        return len(seen)

    with limits.working():
        assert active.value == 1 and limits.others_working() is False
        with runner(Deadline(None), threads=1) as pool:
            active.value += 1  # another worker starts searching
            first = list(pool.in_order([job]))
            active.value -= 1  # and is done
            second = list(pool.in_order([job]))
    assert active.value == 0 and first == [1] and second == [2]
    assert seen[0] == [1] * len(libs) and seen[1] == [2] * len(libs)
    monkeypatch.setattr(limits, "_ACTIVE", None)
    assert limits.others_working() is None  # alone: the load average decides


def test_a_pool_starts_jobs_in_the_order_asked_and_gives_results_in_theirs():
    """``Runner.in_order(jobs, start)``: a pool starts the jobs in ``start``'s order (one
    thread: one after another) and yields their results in the jobs' order; one by one,
    without a pool, they run in the jobs' order; a ``Future`` in a job's place is read,
    not started; a ``start`` that is not an order of the jobs is refused."""
    from concurrent.futures import Future

    from eqsat_mirage.verifier.runner import Runner

    for threads, want in ((1, [2, 0, 3]), (0, [0, 2, 3])):
        started: list[int] = []
        ready: Future = Future()

        def job(i: int, log: list = started, ready: Future = ready) -> int:
            log.append(i)
            if i == 0:
                ready.set_result(10)
            return i * 10

        jobs = [functools.partial(job, 0), ready, functools.partial(job, 2),
                functools.partial(job, 3)]
        with ThreadPoolExecutor(max(threads, 1)) as pool:
            run = Runner(pool if threads else None, Deadline(None))
            assert list(run.in_order(jobs, [2, 0, 3, 1])) == [0, 10, 20, 30]
            assert started == want
            with pytest.raises(ValueError, match="is not an order"):
                list(run.in_order(jobs, [0, 0, 1, 2]))


def _two_outputs(name: str, scale: float, off: float) -> em.Graph:
    """y: a softmax numerator times ``scale``; z: x, plus ``off`` times x less its row's
    largest (0 where every input is one value: the constant draws see no difference)."""
    g = em.Graph(name)
    x = g.input("x", (8, 8), dtype="float16")
    g.output(em.exp(x - x.max(axis=1, keepdims=True)) * scale, "y")
    g.output(x + (x - x.max(axis=1, keepdims=True)) * off if off else x, "z")
    return g


@pytest.mark.parametrize("threads", [1, 2])
def test_the_float_checks_run_the_strict_check_after_the_static_checks(monkeypatch, threads):
    """``float_checks``: the static checks and constant draws start first, the strict
    float64 check runs in the static checks' job (read in its own place, never started on
    its own: no thread waits for the static checks); a candidate off by 1e-3 is caught
    there (float64), and one that also overflows a native draw still gets that strict
    counterexample, first in the checks' order, on one thread or on a pool."""
    from concurrent.futures import Future

    from eqsat_mirage.verifier import floatcheck
    from eqsat_mirage.verifier.runner import Runner

    seen = {}
    real = Runner.in_order

    def spy(self, jobs, start=None):
        seen["jobs"], seen["start"] = jobs, start
        return real(self, jobs, start)

    monkeypatch.setattr(Runner, "in_order", spy)
    a = _two_outputs("a", 1.0, 0.0)
    with ThreadPoolExecutor(threads) as pool:
        run = Runner(pool if threads > 1 else None, Deadline(None))
        assert floatcheck.float_checks(a, _two_outputs("b", 1.0, 0.0), np.random.default_rng(0),
                                       1e-7, True, pool=run) == (None, True)
        jobs, start = seen["jobs"], seen["start"]
        first = jobs[start[0]]  # the static checks, then the strict check, in one job
        assert start[0] == 0 and first.func is floatcheck._then
        assert first.args[0].args[1:] == ("static", "", 0.0)
        assert first.args[1].args[1:] == (None, "signed", 1.0)
        strict = [i for i, j in enumerate(jobs) if isinstance(j, Future)]
        assert strict == [jobs.index(first.args[2])]  # read in its own place
        assert all(j.args[1] == "native" and j.args[2] in ("constant", "peak")
                   for j in jobs[1:strict[0]])
        cex, _ = floatcheck.float_checks(a, _two_outputs("e", 1.0, 0.25),
                                         np.random.default_rng(0), 1e-7, True, pool=run)
        assert cex is not None and cex.domain == "float64" and cex.output == "z", cex
        for b in (_two_outputs("c", 1.001, 0.0), _two_outputs("d", 1.001, 0.25)):
            cex, _ = floatcheck.float_checks(a, b, np.random.default_rng(0), 1e-7, True,
                                             pool=run)
            assert cex is not None and cex.domain == "float64" and cex.output == "y", cex
