"""``optimize_many``: optimize many programs in parallel, through one results cache.

    results = em.optimize_many([g1, g2, g3, g4], jobs=4, level="kernel")

Results come back in input order. The parent first computes every program's
cache key (``cache.make_key``): cached programs are answered at once,
duplicates (equal keys) are searched once, and only the rest goes to workers.

- ``executor="process"`` (default): ``jobs`` local worker processes
  (``concurrent.futures.ProcessPoolExecutor`` with the "spawn" context: egglog
  and threads do not survive ``fork``). Each worker opens the SQLite cache
  itself and stores what it finds there under the key its parent computed
  (SQLite serializes the writers). The largest programs (``truth.effort``) go first, so
  the longest search does not start last, and the workers share one memory budget
  (``limits.reserved``: a verification waits while the others hold too much of it).
  ``jobs=1``, or a single program left to search, runs inline. As with every
  spawn pool, a script that calls this must guard its top level with
  ``if __name__ == "__main__":``.
- ``executor="ray"``: the same fan-out as Ray remote tasks (``ray.init()`` when
  Ray is not initialized yet, with ``address=`` when given, else a local
  instance with ``jobs`` CPUs; it is left running for the next call). Workers
  may run on other machines, so they run uncached and the parent stores their
  results in its own cache. Ray is an optional extra:
  ``pip install 'eqsat-mirage[ray]'``.

Programs and results cross process boundaries (between this process and the
workers it started, never through a file) as ``dumps`` bytes, pickles whose IR
nodes are rebuilt on loading (their hashes depend on the process). A failing program
raises ``OptimizeManyError`` naming its index and name (``errors="raise"``,
remaining work is cancelled), or leaves the exception in its slot
(``errors="return"``). ``progress`` gets one line per finished program:
``[3/8] gqa: 9.32 us (cache hit)``.
"""

from __future__ import annotations

import ast
import copyreg
import inspect
import io
import multiprocessing
import os
import pickle
import re
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

from ..ir.errors import MirageError
from ..ir.limits import share_memory, working
from ..ir.node import Node
from ..verifier.truth import effort
from .cache import (
    ResultCache,
    lookup,
    make_key,
    open_cache,
    store_result,
)
from .options import SearchOptions
from .search import Search, cached_search, resolve_tuning, reverifier

EXECUTORS = ("process", "ray")


def _reduce_node(node: Node):
    return Node, (node.op, node.srcs, node.arg, node.shape, node.dtype, node.loc)


class _Pickler(pickle.Pickler):
    dispatch_table = {**copyreg.dispatch_table, Node: _reduce_node}


def dumps(obj) -> bytes:
    """Pickle ``obj`` for a worker process; IR nodes are rebuilt on loading."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def loads(data: bytes):
    """Unpickle what ``dumps`` wrote (bytes from this process's own workers only)."""
    return pickle.loads(data)  # noqa: S301 - in-memory IPC with our own workers, never disk


class OptimizeManyError(MirageError):
    """One program of ``optimize_many`` failed; ``index``, ``name`` and ``error`` say which."""

    def __init__(self, index: int, name: str, error: BaseException) -> None:
        super().__init__(f"optimize_many: program {index} ({name!r}) failed: "
                         f"{type(error).__name__}: {error}")
        self.index, self.name, self.error = index, name, error

    def __reduce__(self):
        return type(self), (self.index, self.name, self.error)


def _run(payload: bytes) -> bytes:
    """Worker: optimize one program; ``payload`` is ``dumps((graph, options, cache, key,
    end_at, timer))`` (``cache`` a path or False, ``key`` the parent's cache key, ``end_at``:
    a ``time.time()`` past which it does not search, or None; ``timer``: the parent's, or
    None for this process's default); the result, dumped."""
    graph, options, cache, key, end_at, timer = loads(payload)
    options = _until(options, end_at)
    with working():  # the other workers' verifications see this one busy (``runner``)
        if cache is False:
            return dumps(Search(graph, options, timer=timer).run())
        return dumps(cached_search(graph, ResultCache(cache), None, options, key=key,
                                   timer=timer))


def _inline(graph, options: SearchOptions, store, key: str, timer=None):
    """One program searched in this process (through ``store`` unless it is None); the
    result, or the exception it raised (``optimize_many`` hands it on)."""
    try:
        return (Search(graph, options, timer=timer).run() if store is None else
                cached_search(graph, store, None, options, key=key, timer=timer))
    except Exception as exc:  # noqa: BLE001 - handed to finish (raise or return)
        return exc


def _sendable(timer, jobs: int, executor: str) -> None:
    """A MirageError when ``timer`` must go to worker processes and cannot be pickled (a
    timer holding a lock or an open file, say), instead of a traceback from the pool."""
    if timer is None or (jobs == 1 and executor != "ray"):
        return
    try:
        dumps(timer)
    except Exception as exc:  # noqa: BLE001 - whatever pickling raises, named here
        raise MirageError(f"optimize_many: the timer {type(timer).__name__} cannot be sent "
                          f"to worker processes ({type(exc).__name__}: {exc}); use jobs=1 "
                          "or a timer of plain data") from None


def _until(options: SearchOptions, end_at: float | None) -> SearchOptions:
    """``options`` with a time limit that ends by ``end_at`` (a ``time.time()``; None:
    as they are): what is left of it where that is less (at least 0.05 s)."""
    if end_at is None:
        return options
    left = max(0.05, end_at - time.time())
    limit = options.time_limit_s
    return options.replace(time_limit_s=min(limit, left) if isinstance(limit, int | float)
                           else left)


def _options(kwargs: dict) -> dict:
    """The search options among ``optimize_many``'s keywords (``cache`` is its own); a
    MirageError naming any other."""
    opts = {k: v for k, v in kwargs.items() if k != "cache"}
    unknown = sorted(set(opts) - set(SearchOptions.names()))
    if unknown:
        raise MirageError(f"optimize_many: unknown keyword(s) {', '.join(map(repr, unknown))} "
                          f"(it takes {', '.join(SearchOptions.names())} and cache)")
    return opts


def _how(res, dup_of: int | None) -> str:
    if dup_of is not None:
        return f"same as #{dup_of}"
    if res.stats.get("cache") == "hit":
        return "cache hit"
    return f"searched in {res.stats.get('seconds', 0.0):.1f} s"


def optimize_many(programs: Iterable, jobs: int | None = None, executor: str = "process",
                  errors: str = "raise", progress: Callable[[str], None] | None = None,
                  address: str | None = None, end_at: float | None = None,
                  timer=None, **optimize_kwargs) -> list:
    """Optimize every program of ``programs``; the ``OptimizeResult``s in input order.

    ``jobs`` is the number of parallel workers (default: the CPU count);
    ``executor`` is "process" or "ray" (``address`` is passed to ``ray.init``);
    ``errors`` is "raise" (an ``OptimizeManyError`` naming the program) or
    "return" (the exception in that program's slot); ``progress`` gets one
    line per finished program. Every other keyword goes to ``em.optimize``
    (``cache=`` included: the same cache serves every worker); ``time_limit_s="auto"``
    (the default) gives each program its own automatic limit. ``end_at``: a wall-clock
    time (``time.time()``) by which every search ends: a program a worker starts late gets
    what is left of it, where that is less than its time limit (a whole program's pieces
    share its deadline so, ``whole._search_pieces``). ``timer``: what tunes every search
    (``em.optimize``'s ``timer``, sent to the workers; None: each process's default).
    """
    programs = list(programs)
    if executor not in EXECUTORS:
        raise MirageError(f"optimize_many: executor must be one of {', '.join(EXECUTORS)}, "
                          f"got {executor!r}")
    if errors not in ("raise", "return"):
        raise MirageError(f"optimize_many: errors must be 'raise' or 'return', got {errors!r}")
    jobs = (os.cpu_count() or 1) if jobs is None else int(jobs)
    if jobs < 1:
        raise MirageError(f"optimize_many: jobs must be at least 1, got {jobs}")
    # checked once, here; tune decided here too, so the parent's keys name the device
    options, _ = resolve_tuning(SearchOptions(**_options(optimize_kwargs)).resolved(), timer)
    _sendable(timer, jobs, executor)
    store = open_cache(optimize_kwargs.get("cache", True))
    n = len(programs)
    results: list = [None] * n
    done = [0]

    def name_of(i: int) -> str:
        return str(getattr(programs[i], "name", f"#{i}"))

    def finish(i: int, res, dup_of: int | None = None) -> None:
        done[0] += 1
        if isinstance(res, BaseException):
            if errors == "raise":
                raise OptimizeManyError(i, name_of(i), res) from res
            res.add_note(f"optimize_many: while optimizing program {i} ({name_of(i)!r})")
            line = f"failed: {type(res).__name__}: {res}"
        else:
            line = f"{res.cost_us:.2f} us ({_how(res, dup_of)})"
        results[i] = res
        if progress:
            progress(f"[{done[0]}/{n}] {name_of(i)}: {line}")

    # 1. the cache answers what it can; equal keys are searched once
    todo: dict[str, list[int]] = {}
    for i, g in enumerate(programs):
        key = f"#{i}"
        if store is not None:
            try:
                key = make_key(g, options)
                hit = lookup(store, g, key, reverify=reverifier(g, options))
            except Exception as exc:  # noqa: BLE001 - reported as this program's failure
                finish(i, exc)
                continue
            if hit is not None:
                finish(i, hit)
                continue
        todo.setdefault(key, []).append(i)
    firsts = [idx[0] for idx in todo.values()]
    dups = {idx[0]: idx[1:] for idx in todo.values()}
    keys = {idx[0]: key for key, idx in todo.items()}
    worker_cache = False if store is None or executor == "ray" else str(store.path)

    def payload(i: int) -> bytes:
        return dumps((programs[i], options, worker_cache, keys[i], end_at, timer))

    def land(i: int, res) -> None:
        if isinstance(res, BaseException):
            for j in (i, *dups[i]):
                finish(j, res)
            return
        res.source = programs[i]  # the caller's own object, not a worker's copy
        if executor == "ray" and store is not None:  # Ray workers run uncached
            store_result(store, keys[i], res)
        finish(i, res)
        blob = dumps(res) if dups[i] else b""
        for j in dups[i]:
            copy = loads(blob)
            copy.source = programs[j]
            finish(j, copy, dup_of=i)

    # 2. search the rest: inline, in local processes or as Ray tasks
    if executor == "ray":
        _ray_map(firsts, payload, jobs, address, land)
    elif jobs == 1 or len(firsts) <= 1:
        for i in firsts:
            land(i, _inline(programs[i], _until(options, end_at), store, keys[i], timer))
    else:
        _process_map(sorted(firsts, key=lambda i: -_work(programs[i])), payload, jobs, land)
    return results


def spawn_safe() -> bool:
    """Whether spawned workers may start here: a spawned process imports the main script
    again, so one whose top level is not guarded by ``if __name__ == "__main__":`` would
    run again in every worker. True where there is no main script (a REPL, a notebook,
    ``python -c``) or where its source has that guard, unless the call comes from the
    main script's top level outside that guard (``em.optimize`` at module level beside a
    guarded ``main()``: every worker would run it again), or from a script being imported
    again by a spawned process (``__mp_main__``: it cannot start processes)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    script = os.path.realpath(path) if path else None
    frame = inspect.currentframe()
    while frame is not None:  # the main script's top level, where it is on the stack
        name = frame.f_globals.get("__name__")
        if frame.f_code.co_name == "<module>" and name == "__mp_main__":
            return False
        if frame.f_code.co_name == "<module>" and name == "__main__" and script and \
                os.path.realpath(frame.f_code.co_filename) == script and not any(
                    lo <= frame.f_lineno <= hi for lo, hi in _guards(script)):
            return False
        frame = frame.f_back
    if not path:
        return True
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return False
    return re.search(r"""__name__\s*==\s*['"]__main__['"]""", text) is not None


def _guards(path: str) -> list[tuple[int, int]]:
    """The line ranges of the top-level ``if __name__ == "__main__":`` blocks of the
    script at ``path`` (none where it cannot be read or parsed)."""
    try:
        tree = ast.parse(Path(path).read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return []
    out = []
    for n in tree.body:
        test = n.test if isinstance(n, ast.If) else None
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(
                test.ops[0], ast.Eq):
            sides = [test.left, test.comparators[0]]
            if any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides) and any(
                    isinstance(x, ast.Constant) and x.value == "__main__" for x in sides):
                out.append((n.lineno, n.end_lineno or n.lineno))
    return out


def _work(program) -> int:
    """A program's size as the pool orders it (what verifying it costs, ``truth.effort``;
    0 for what is not a Graph)."""
    try:
        return effort(program)
    except Exception:  # noqa: BLE001 - an ordering hint only: a bad program fails in its worker
        return 0


def _process_map(firsts, payload, jobs, land) -> None:
    """Run ``_run(payload(i))`` for each ``i`` of ``firsts`` in a spawn process pool, in
    the order given (``optimize_many``: the largest programs first, so the longest search
    does not start last); the workers share one memory budget (``limits.share_memory``)."""
    ctx = multiprocessing.get_context("spawn")
    held, active = ctx.Value("q", 0), ctx.Value("q", 0)
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(firsts)), mp_context=ctx,
                               initializer=share_memory, initargs=(held, active))
    try:
        futures = {pool.submit(_run, payload(i)): i for i in firsts}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(finished, key=futures.__getitem__):
                try:
                    res = loads(fut.result())
                except Exception as exc:  # noqa: BLE001 - handed to land (raise or return)
                    res = exc
                land(futures[fut], res)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _ray_map(firsts, payload, jobs, address, land) -> None:
    """Run ``_run(payload(i))`` for each ``i`` of ``firsts`` as Ray tasks, ``jobs`` at a time."""
    try:
        import ray
    except ImportError:
        raise MirageError("optimize_many(executor='ray') needs Ray, an optional extra: "
                          "pip install 'eqsat-mirage[ray]'") from None
    if not ray.is_initialized():
        init = {"address": address} if address else {"num_cpus": jobs}
        ray.init(**init, include_dashboard=False, log_to_driver=False)
    remote = ray.remote(num_cpus=1, max_retries=0)(_run)
    queue, running = list(firsts), {}
    try:
        while queue or running:
            while queue and len(running) < jobs:
                i = queue.pop(0)
                running[remote.remote(payload(i))] = i
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                i = running.pop(ref)
                try:
                    res = loads(ray.get(ref))
                except Exception as exc:  # noqa: BLE001 - RayTaskError wraps the real one
                    res = getattr(exc, "cause", None) or exc
                land(i, res)
    finally:
        for ref in running:
            ray.cancel(ref, force=True)
