"""``em.optimize_many``: input order, the shared cache, errors, progress, Ray."""

from __future__ import annotations

import importlib.util
import sys
import time

import pytest

import eqsat_mirage as em
from eqsat_mirage.pipeline.cache import ResultCache
from eqsat_mirage.pipeline.many import OptimizeManyError

KW = {"level": "kernel", "trials": 1}


def tiny(name: str, n: int) -> em.Graph:
    """A small LoRA-shaped program: X@W + (X@A)@B."""
    g = em.Graph(name)
    x, w = g.input("X", (16, n)), g.input("W", (n, 128))
    a, b = g.input("A", (n, 4)), g.input("B", (4, 128))
    g.output(x @ w + (x @ a) @ b, "O")
    return g


def empty() -> em.Graph:
    g = em.Graph("empty")
    g.input("X", (2, 2))
    return g


def programs() -> list[em.Graph]:
    return [tiny("p32", 32), tiny("p64", 64), tiny("p96", 96)]


def check_results(progs, results) -> None:
    assert len(results) == len(progs)
    for g, res in zip(progs, results):
        assert isinstance(res, em.OptimizeResult), res
        assert res.source is g and res.verified.equivalent
        assert em.verify(g, res.program, trials=1).equivalent


def test_exported():
    assert em.optimize_many is not None and "optimize_many" in em.__all__


def test_inline_in_input_order_with_progress():
    lines: list[str] = []
    progs = programs()
    results = em.optimize_many(progs, jobs=1, progress=lines.append, **KW)
    check_results(progs, results)
    assert [r.stats["cache"] for r in results] == ["miss"] * 3
    assert lines[0].startswith("[1/3] p32: ") and "searched in" in lines[0], lines
    assert [line.split()[1] for line in lines] == ["p32:", "p64:", "p96:"]
    again = em.optimize_many(programs(), jobs=1, progress=lines.append, **KW)
    assert [r.stats["cache"] for r in again] == ["hit"] * 3
    assert lines[-1].startswith("[3/3] p96: ") and lines[-1].endswith("(cache hit)"), lines
    assert [r.cost_us for r in again] == [r.cost_us for r in results]


def test_processes_share_the_cache_and_duplicates_run_once():
    progs = [*programs(), tiny("p32", 32)]  # the last is the first again
    lines: list[str] = []
    results = em.optimize_many(progs, jobs=2, progress=lines.append, **KW)
    check_results(progs, results)
    assert results[3] is not results[0] and results[3].cost_us == results[0].cost_us
    assert any(line.endswith("(same as #0)") for line in lines), lines
    assert {e.name for e in ResultCache().entries()} == {"p32", "p64", "p96"}  # workers wrote
    t = time.perf_counter()
    again = em.optimize_many(programs(), jobs=2, **KW)
    assert time.perf_counter() - t < 1.0  # all hits: no worker is started
    assert [r.stats["cache"] for r in again] == ["hit"] * 3
    assert [str(r.program) for r in again] == [str(r.program) for r in results[:3]]


def test_processes_without_cache():
    progs = programs()[:2]
    results = em.optimize_many(progs, jobs=2, cache=False, **KW)
    check_results(progs, results)
    assert [r.stats["cache"] for r in results] == ["off", "off"]
    assert ResultCache().entries() == []


@pytest.mark.parametrize("jobs", [1, 2])
def test_every_search_ends_by_end_at(jobs):
    """``end_at`` (a whole program's deadline, shared by its pieces): each program's time
    limit is what is left of it when its search starts, where that is less than its own
    (600 s here), in the workers too."""
    progs = programs()[:2]
    start = time.time()
    results = em.optimize_many(progs, jobs=jobs, cache=False, end_at=start + 120.0,
                               time_limit_s=600, **KW)
    check_results(progs, results)
    for r in results:
        assert 0.05 <= r.stats["time_limit_s"] <= 120.0
    first = em.optimize_many(progs[:1], jobs=1, cache=False, end_at=None, time_limit_s=600,
                             **KW)
    assert first[0].stats["time_limit_s"] == 600


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failing_program_is_named(jobs):
    progs = [tiny("ok", 32), empty()]
    with pytest.raises(OptimizeManyError, match=r"program 1 \('empty'\) failed: GraphError"):
        em.optimize_many(progs, jobs=jobs, cache=False, **KW)


@pytest.mark.parametrize("cache", [True, False])
def test_errors_return_leaves_the_exception_in_its_slot(cache):
    lines: list[str] = []
    progs = [empty(), tiny("ok", 32)]
    results = em.optimize_many(progs, jobs=2, errors="return", cache=cache,
                               progress=lines.append, **KW)
    assert isinstance(results[0], em.GraphError) and "no outputs" in str(results[0])
    assert any("program 0 ('empty')" in note for note in results[0].__notes__)
    assert isinstance(results[1], em.OptimizeResult) and results[1].verified.equivalent
    assert any(line.startswith("[") and "empty: failed: GraphError" in line for line in lines)


def test_bad_arguments():
    with pytest.raises(em.MirageError, match="executor must be one of process, ray"):
        em.optimize_many([], executor="dask")
    with pytest.raises(em.MirageError, match="errors must be"):
        em.optimize_many([], errors="ignore")
    with pytest.raises(em.MirageError, match="jobs must be at least 1"):
        em.optimize_many([], jobs=0)
    with pytest.raises(em.MirageError, match="bogus"):
        em.optimize_many([tiny("p", 32)], bogus=1)
    assert em.optimize_many([]) == []


def test_ray_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(em.MirageError, match=r"pip install 'eqsat-mirage\[ray\]'"):
        em.optimize_many([tiny("p", 32)], executor="ray", cache=False, **KW)


@pytest.fixture
def ray_local():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_ray_executor(ray_local):
    progs = programs()
    lines: list[str] = []
    results = em.optimize_many(progs, jobs=2, executor="ray", progress=lines.append, **KW)
    check_results(progs, results)
    assert len(lines) == 3 and all("searched in" in line for line in lines), lines
    assert {e.name for e in ResultCache().entries()} == {"p32", "p64", "p96"}  # parent stored
    again = em.optimize_many(programs(), jobs=2, executor="ray", **KW)
    assert [r.stats["cache"] for r in again] == ["hit"] * 3
    progs = [tiny("ok", 32), empty()]
    res = em.optimize_many(progs, jobs=2, executor="ray", cache=False, errors="return", **KW)
    assert isinstance(res[1], em.GraphError) and isinstance(res[0], em.OptimizeResult)


def test_the_largest_programs_go_to_the_workers_first(monkeypatch):
    """The process pool takes its programs largest first (``truth.work``), so the longest
    search does not start last; results still come back in input order."""
    from eqsat_mirage.pipeline import many

    seen = []

    def record(firsts, payload, jobs, land):
        seen.extend(firsts)
        for i in firsts:
            land(i, em.optimize(progs[i], cache=None, **KW))

    monkeypatch.setattr(many, "_process_map", record)
    progs = [tiny("p32", 32), tiny("p96", 96), tiny("p64", 64)]
    results = em.optimize_many(progs, jobs=2, cache=None, **KW)
    assert seen == [1, 2, 0]
    check_results(progs, results)


def test_spawn_safe_needs_a_guarded_main_script(monkeypatch, tmp_path):
    """A spawned worker imports the main script again: jobs='auto' uses workers only where
    that script's top level is guarded, or where there is no script (a REPL, -c)."""
    import types

    from eqsat_mirage.pipeline.many import spawn_safe

    guarded, bare = tmp_path / "guarded.py", tmp_path / "bare.py"
    guarded.write_text("import x\n\nif __name__ == '__main__':\n    main()\n")
    bare.write_text("import torch\ntorch.compile(f, backend=be)(x)\n")
    for path, want in ((guarded, True), (bare, False), (None, True),
                       (tmp_path / "gone.py", False)):
        main = types.ModuleType("__main__")
        if path is not None:
            main.__file__ = str(path)
        monkeypatch.setitem(sys.modules, "__main__", main)
        assert spawn_safe() is want, path


def test_spawn_safe_is_false_at_a_guarded_scripts_unguarded_top_level(monkeypatch, tmp_path):
    """A script with a guarded ``main()`` that also optimizes at its top level would run
    that again in every spawned worker (and a worker importing it again cannot start
    processes): called from the top level outside the guard, or from ``__mp_main__``,
    spawn_safe is False; from inside the guard, or a function called there, True."""
    import types

    from eqsat_mirage.pipeline import many

    script = tmp_path / "script.py"
    script.write_text("outside = check()\n\n\ndef main():\n    return check()\n\n\n"
                      "if __name__ == '__main__':\n    inside = check()\n"
                      "    called = main()\n")
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    code = compile(script.read_text(), str(script), "exec")
    scope = {"__name__": "__main__", "check": many.spawn_safe}
    exec(code, scope)
    assert (scope["outside"], scope["inside"], scope["called"]) == (False, True, True)
    again = {"__name__": "__mp_main__", "check": many.spawn_safe}  # a worker importing it
    exec(code, again)
    assert again["outside"] is False and "inside" not in again
    del main.__file__  # a notebook's cell: top-level code of no script file
    cell = {"__name__": "__main__", "check": many.spawn_safe}
    exec(compile("outside = check()\n", "<ipython-input-1>", "exec"), cell)
    assert cell["outside"] is True
