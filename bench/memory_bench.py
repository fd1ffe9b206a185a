"""Verification memory: the budget estimate against the measured peak (issue 32).

Two steps, each in its own process so that the peak resident set is one step's:

    python bench/memory_bench.py plans gqa 8 DIR      # em.optimize; every MuGraph it
                                                      # verifies is saved as DIR/*.json
    python bench/memory_bench.py verify gqa 8 FILE    # verify one saved MuGraph against the
                                                      # program as optimize does; one JSON line:
                                                      # estimate, measured peak, seconds

``plans`` prints one JSON line too: the chosen cost, kernels, verification seconds, peak
memory and the plans the memory budget refused. Run ``verify`` with
``EQSAT_MIRAGE_MEMORY_BUDGET`` raised to measure a plan today's estimate refuses.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import eqsat_mirage as em  # noqa: E402
from bench.programs import program  # noqa: E402
from eqsat_mirage.ir.limits import memory_budget  # noqa: E402
from eqsat_mirage.pipeline import search as opt_mod  # noqa: E402


def peak_bytes() -> int:
    """This process's peak resident set: VmHWM (ru_maxrss carries a forked parent's size
    across exec on Linux, so a child of a large process would report the parent's)."""
    try:
        with open("/proc/self/status") as f:
            hwm = [ln for ln in f if ln.startswith("VmHWM:")]
        if hwm:
            return int(hwm[0].split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class TreeMemory:
    """The largest total resident set of this process and its descendants (the worker
    processes of ``jobs > 1``), sampled every ``every`` seconds on a thread, from /proc
    (0 where there is none): ``with TreeMemory() as m: ...``, then ``m.peak``."""

    def __init__(self, every: float = 0.2) -> None:
        self.every, self.peak = every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            parents, rss = {}, {}
            for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
                if not entry.name.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry.name}/status") as f:
                        fields = dict(line.split(":", 1) for line in f if ":" in line)
                except OSError:
                    continue
                pid = int(entry.name)
                parents[pid] = int(fields.get("PPid", "0").strip() or 0)
                rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0] or 0) * 1024
            tree, grew = {me}, True
            while grew:
                more = {p for p, pp in parents.items() if pp in tree} - tree
                grew = bool(more)
                tree |= more
            self.peak = max(self.peak, sum(rss.get(p, 0) for p in tree))
            self._stop.wait(self.every)


def plans(name: str, batch: int, out: str) -> dict:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    real, saved = opt_mod.verify, []

    def keep(a, b, **kw):
        if hasattr(b, "to_json"):
            path = folder / f"{name}_b{batch}_{len(saved)}.json"
            path.write_text(b.to_json())
            saved.append(str(path))
        return real(a, b, **kw)

    opt_mod.verify = keep
    lines: list[str] = []
    g = program(name, batch)
    t = time.perf_counter()
    res = em.optimize(g, target="h100", cache=False, time_limit_s=600, progress=lines.append)
    seconds = time.perf_counter() - t
    return {"case": f"{name} b={batch}", "cost_us": round(res.cost_us, 4),
            "kernels": len(res.program.kernels) if hasattr(res.program, "kernels") else None,
            "verified": bool(res.verified), "seconds": round(seconds, 1),
            "verify_seconds": round(res.stats.get("verify_seconds", 0.0), 1),
            "peak_GB": round(peak_bytes() / 1e9, 2), "saved": saved,
            "refused": [m for m in lines if "memory budget" in m]}


def verify(name: str, batch: int, path: str) -> dict:
    from eqsat_mirage.verifier.runner import THREADS, footprint
    try:
        from eqsat_mirage.verifier.memory import verify_parts
    except ImportError:
        verify_parts = None

    g = program(name, batch)
    mg = em.MuGraph.from_json(Path(path).read_text())
    base = peak_bytes()
    if verify_parts is None:  # the estimate before issue 32
        estimate = sum(n for _, n in footprint(g) + footprint(mg)) * 16 * THREADS
    else:
        estimate = sum(n for _, n in verify_parts(g, mg, THREADS, 3))
    t = time.perf_counter()
    res = em.verify(g, mg, trials=3, seed=0, memo={}, float_first=True)
    peak = peak_bytes()
    return {"case": f"{name} b={batch}", "plan": Path(path).name, "equivalent": bool(res),
            "trials": res.trials, "seconds": round(time.perf_counter() - t, 1),
            "estimate_GB": round(estimate / 1e9, 2), "peak_GB": round(peak / 1e9, 2),
            "before_GB": round(base / 1e9, 2), "budget_GB": round(memory_budget() / 1e9, 2),
            "ratio": round(estimate / peak, 2)}


if __name__ == "__main__":
    cmd, name, batch, arg = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    print(json.dumps((plans if cmd == "plans" else verify)(name, batch, arg)))
