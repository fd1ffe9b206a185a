"""Wall time of ``em.optimize`` against ``time_limit_s``, with each pass's start and end.

    python bench/deadline_overrun.py gqa:1,qknorm:8,rmsnorm:1 5,10,20

One JSON line per (program, limit): the wall seconds of the call, its ratio to the limit,
whether it is within the promise (1.1 x limit + 2 s, docs/limits.md), and every pass of the
search as [name, start, end] in seconds since the call (``Search``'s methods and the
compile check's ``Builder.clean``, wrapped here). A pass whose end is past its share
(saturation 50%, extraction 70%, planning 85%, verification 100% of the limit) overran it.
torch is imported and a first search run before the measured ones, as in the
``torch.compile`` backend, so that one-time imports are not counted.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import eqsat_mirage as em  # noqa: E402
from bench.programs import program  # noqa: E402
from eqsat_mirage.pipeline import build, search  # noqa: E402

PASSES = ("check", "rules", "saturate", "extract", "forms", "plan", "verify", "check_input",
          "finish")


def instrument(ends: list, t0: list) -> None:
    """Wrap the passes so that each call appends (name, start, end) to ``ends``."""
    def wrap(owner, name: str, label: str) -> None:
        f = getattr(owner, name)

        @functools.wraps(f)
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                ends.append((label, round(t - t0[0], 2), round(time.perf_counter() - t0[0], 2)))
        setattr(owner, name, timed)

    for name in PASSES:
        wrap(search.Search, name, name)
    wrap(build.Builder, "clean", "build")


def main(cases: str, limits: str) -> None:
    """Each program of ``cases`` ("name:batch,...") at each limit of ``limits`` ("5,10")."""
    import torch  # noqa: F401 - as in the backend: torch already imported

    ends: list = []
    t0 = [0.0]
    instrument(ends, t0)
    em.optimize(program("lora", 1), time_limit_s=5, cache=False)  # imports, rules compiled
    for case in cases.split(","):
        name, batch = case.split(":")
        for limit in (float(x) for x in limits.split(",")):
            graph = program(name, int(batch))
            ends.clear()
            t0[0] = start = time.perf_counter()
            res = em.optimize(graph, time_limit_s=limit, cache=False)
            wall = time.perf_counter() - start
            print(json.dumps({"program": case, "limit": limit, "wall": round(wall, 2),
                              "ratio": round(wall / limit, 2),
                              "within": wall <= 1.1 * limit + 2.0,
                              "time_limited": res.stats.get("time_limited"),
                              "verified": bool(res.verified and res.verified.equivalent),
                              "passes": list(ends)}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
