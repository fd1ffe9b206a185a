"""NumPy's BLAS on one thread while the verifier runs several jobs at once.

The verifier's runner (``runner.py``) evaluates field trials and float draws on a pool of
threads, one per core; each job's matmuls go to NumPy's BLAS, which by default starts a
thread per core of its own. Two pool threads times two BLAS threads on a 2-core machine
shared with other processes spin against each other: OpenBLAS's threads busy-wait, and a
(64, 256) @ (256, 256) product measured 0.3 ms on one thread and 7-23 ms with the pool
(load 6-9). ``single_threaded`` holds every OpenBLAS library the process loaded (NumPy's,
SciPy's) at one thread while a pool of more than one thread runs, and gives back the
thread count it found when the last such pool ends. Where no OpenBLAS is found (another
BLAS, another platform) it does nothing. The setting is process-wide: other threads' NumPy
products run on one thread too while such a pool runs.

A one-thread runner (a verification the memory budget lets run only one trial at a time,
the 7B-size pieces) holds BLAS at one thread too when the machine is ``busy``: other
processes' load leaves under 1.5 cores spare. Measured on the shared 2-core machine at
load 2 (bench/history/2026-11-26_real-sizes.md, "Tiny layers and stacks"): a
(128, 4096) @ (4096, 11008) float64 product 0.20-0.21 s on one thread against 0.25-0.27 s on
two, and the tiny layer with one verifier thread 23-29 s with BLAS on two threads against
11-15 s on one. On an idle machine the big products keep every core.

What changes besides speed: OpenBLAS sums a large product in another order on one thread
than on two (a float32 (2, 300, 700) @ (2, 700, 130) differs in the last bits), as it does
between machines and BLAS builds. Nothing the verifier decides rests on that order: the
field trials' float64 products are exact integers whatever the order (docs/verifier.md,
section 1), and the float checks' tolerances hold for any order of a float32 or float64
sum (section 4).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import threading
import time
from dataclasses import dataclass

import numpy as np

# the thread-count entry points of a plain OpenBLAS build and of the scipy-openblas wheels
# (NumPy's: 64-bit integers, symbols prefixed "scipy_" and suffixed "64_")
_NAMES = (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
          ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
          ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
          ("openblas_get_num_threads", "openblas_set_num_threads"))


@dataclass(frozen=True)
class Library:
    """One loaded OpenBLAS: its path and thread-count functions."""

    path: str
    get: object
    set: object

    def threads(self) -> int:
        """Its thread count now."""
        return int(self.get())

    def use(self, n: int) -> None:
        """Set its thread count to ``n`` (at least 1)."""
        self.set(max(1, int(n)))


def loaded_paths() -> list[str]:
    """The paths of the OpenBLAS shared libraries this process has loaded (from
    /proc/self/maps; empty where there is none, or no such file)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out: list[str] = []
    for line in lines:
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        name = os.path.basename(path)
        if "openblas" in name.lower() and ".so" in name and path not in out:
            out.append(path)
    return out


def libraries() -> tuple[Library, ...]:
    """Every loaded OpenBLAS with thread-count entry points (NumPy imported first)."""
    import numpy  # noqa: F401  (loads NumPy's BLAS)

    return _open(tuple(loaded_paths()))


@functools.cache
def _open(paths: tuple[str, ...]) -> tuple[Library, ...]:
    found = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get_name, set_name in _NAMES:
            get, put = getattr(lib, get_name, None), getattr(lib, set_name, None)
            if get is not None and put is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                put.restype, put.argtypes = None, [ctypes.c_int]
                found.append(Library(path, get, put))
                break
    return tuple(found)


def busy(cores: int | None = None) -> bool:
    """Whether the cores are nearly all in use: other processes leave under 1.5 cores
    spare (on 2 cores: other load of half a core or more). First the 1-minute load average,
    less this process's one running thread; where that says busy, the cores' idle time over
    ``SAMPLE_S`` (``idle_cores``) decides, since the average also counts load that has
    ended: this process's own pool that just ran, or worker processes of its own that just
    finished (``optimize_many``'s, a minute of both cores before the end-to-end check of a
    7B-size stack, which then ran its big products on one core). False on one core and
    where there is no load average."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return False
    n = cores or os.cpu_count() or 1
    if not (n > 1 and n - (load - 1.0) < 1.5):
        return False
    idle = idle_cores(SAMPLE_S)
    return idle is None or idle < 1.5


SAMPLE_S = 0.1  # how long ``busy`` watches the cores where the load average says busy


def idle_cores(seconds: float) -> float | None:
    """The cores left idle over the next ``seconds`` (from /proc/stat's idle and iowait
    time; this thread sleeps meanwhile), None where there is no /proc/stat."""
    first = _cpu_times()
    if first is None:
        return None
    time.sleep(seconds)
    second = _cpu_times()
    if second is None or second[1] <= first[1]:
        return None
    cores = os.cpu_count() or 1
    return cores * (second[0] - first[0]) / (second[1] - first[1])


def _cpu_times() -> tuple[int, int] | None:
    """(idle, total) clock ticks of all cores since boot (Linux), None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[3] + fields[4], sum(fields[:8])) if len(fields) >= 8 else None


_LOCK = threading.Lock()
_HELD: list = [0, ()]  # pools holding BLAS at one thread; (library, thread count found)


@contextlib.contextmanager
def single_threaded(active: bool = True):
    """Every loaded OpenBLAS at one thread inside the block (``active``; nested and
    concurrent blocks count: the thread counts found by the first come back when the last
    ends)."""
    if not active:
        yield
        return
    with _LOCK:
        if _HELD[0] == 0:
            _HELD[1] = tuple((lib, lib.threads()) for lib in libraries())
            for lib, _ in _HELD[1]:
                lib.use(1)
        _HELD[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _HELD[0] -= 1
            if _HELD[0] == 0:
                for lib, n in _HELD[1]:
                    lib.use(n)


_RATE: list[float] = []


def gflops() -> float:
    """This machine's float64 matmul rate in GFLOP/s on one BLAS thread, as the verifier's
    big products run on a shared machine (the best of three 512 x 512 products, about
    15 ms, measured once per process)."""
    if not _RATE:
        a = np.random.default_rng(0).standard_normal((512, 512))
        best = math.inf
        with single_threaded():
            for _ in range(3):
                t = time.perf_counter()
                a @ a
                best = min(best, time.perf_counter() - t)
        _RATE.append(2 * 512**3 / max(best, 1e-6) / 1e9)
    return _RATE[0]
