"""How the verifier runs its jobs: ``Runner`` (in order, on threads, under a deadline)
and what it would hold in memory (``footprint``, checked against the memory budget)."""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from ..ir.errors import TimeLimitError
from ..ir.limits import Deadline, matmul_scratch, others_working
from ..ir.node import fmt_shape
from .blas import busy, single_threaded

THREADS = max(1, min(4, os.cpu_count() or 1))  # field trials / float evaluations at once


@contextlib.contextmanager
def runner(deadline: Deadline, threads: int | None = None):
    """A ``Runner`` on a pool of ``threads`` threads (``THREADS`` if None; NumPy and BLAS
    release the GIL) under ``deadline``; at the deadline the pool is left to finish its
    running jobs on its own. While a pool of several threads runs, NumPy's BLAS runs on
    one thread (``blas.single_threaded``: the pool already uses the cores); in a one-thread
    runner too when other processes keep the cores busy (``blas.busy``)."""
    count = THREADS if threads is None else max(1, threads)
    if count == 1 and others_working() is not None:  # one of optimize_many's workers:
        yield Runner(None, deadline, others_working)  # BLAS on one thread per job while
        return  # another worker searches, on every core once it is done (a 7B MLP piece)
    if count == 1:
        with single_threaded(active=busy()):
            yield Runner(None, deadline)
        return
    threads = ThreadPoolExecutor(count, thread_name_prefix="em-verify")
    try:
        with single_threaded():
            yield Runner(threads, deadline)
    finally:
        threads.shutdown(wait=not deadline.expired(), cancel_futures=True)


class Runner:
    """Runs jobs on ``pool`` (None: one by one, here) and stops them at ``deadline``."""

    def __init__(self, pool: ThreadPoolExecutor | None, deadline: Deadline,
                 single: Callable[[], bool] | None = None) -> None:
        self.pool, self.deadline, self.single = pool, deadline, single

    def in_order(self, jobs: list, start: list[int] | None = None):
        """Each job's result in order, up to ``THREADS`` at once; jobs not yet started are
        cancelled when the caller stops early; ``TimeLimitError`` at the deadline. One by
        one with ``single``: BLAS on one thread for the jobs it says so when they start.
        ``start``: the order in which a pool starts them (the job positions, the longest
        first, so that no thread is left alone with a long one at the end); the results
        still come in ``jobs``' order, and one by one they run in it (the first to find
        something stops the rest). A ``Future`` in place of a job is another job's doing
        (``floatcheck._then``): its result is read there, nothing is started for it."""
        order = list(range(len(jobs))) if start is None else list(start)
        if sorted(order) != list(range(len(jobs))):
            raise ValueError(f"in_order: start {order} is not an order of {len(jobs)} jobs")
        if self.pool is None:
            for job in jobs:
                self.check()
                if isinstance(job, Future):
                    yield job.result()
                    continue
                with single_threaded(active=bool(self.single and self.single())):
                    out = job()
                yield out
            return
        # each job in a copy of this context: what it set (``limits.programs_fixed``) holds
        submitted = {i: jobs[i] if isinstance(jobs[i], Future) else
                     self.pool.submit(contextvars.copy_context().run, jobs[i]) for i in order}
        futures = [submitted[i] for i in range(len(jobs))]
        try:
            for fut in futures:
                try:
                    yield fut.result(timeout=self.deadline.remaining()
                                     if self.deadline.seconds is not None else None)
                except FutureTimeout:
                    self.check()
                    raise
        finally:
            for fut in futures:
                fut.cancel()

    def check(self) -> None:
        """``TimeLimitError`` once the deadline has passed."""
        if self.deadline.expired():
            raise TimeLimitError(f"verification stopped at its time limit "
                                 f"({self.deadline.seconds:g} s)")


def footprint(program) -> list[tuple[str, int]]:
    """(description, element count) of every value an interpreter holds for ``program``:
    each node of a Graph; each device tensor and block value (over all blocks at once,
    as the tiled interpreter holds them) of a MuGraph."""
    if hasattr(program, "footprint"):
        return program.footprint()
    nodes = program.nodes()
    out = [(f"node {n.op.name.lower()} {fmt_shape(n.shape)}" + (f" {n.arg!r}" if
            n.op.name == "INPUT" else ""), math.prod(n.shape)) for n in nodes]
    return out + [(f"matmul {fmt_shape(n.shape)}: exact digit products", matmul_scratch(n))
                  for n in nodes if n.op.name == "MATMUL"]
