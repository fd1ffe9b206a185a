"""Seconds per benchmark case: ``em.verify(program, rewritten)`` and a whole uncached search.

    OPENBLAS_NUM_THREADS=1 python bench/search_speed.py [gqa:1 qknorm:8 ...]

With no arguments every (benchmark, batch) case of ``bench/programs.py`` runs.
Each line gives the verification's verdict, bound and seconds, then the whole
``em.optimize(program, cache=None)`` seconds with its verify and fusion phases,
the chosen program's cost-model time and its bound, as a Markdown table row.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import eqsat_mirage as em  # noqa: E402
from bench.programs import cases, program, rewritten  # noqa: E402

HEADER = ("| benchmark | b | verify s | verdict | bound | search s | search verify s | "
          "fusion s | cost us | search bound |\n|---|---|---:|---|---:|---:|---:|---:|---:|---:|")


def row(name: str, batch: int) -> str:
    """One table row for the case (name, batch)."""
    a, r = program(name, batch), rewritten(name, batch)
    t = time.perf_counter()
    v = em.verify(a, r, seed=0)
    tv = time.perf_counter() - t
    verdict = "equivalent" if v.equivalent else (
        "inconclusive" if v.inconclusive else f"rejected ({v.counterexample.domain})")
    t = time.perf_counter()
    res = em.optimize(a, cache=None)
    to = time.perf_counter() - t
    ph = res.stats["phase_seconds"]
    return (f"| {name} | {batch} | {tv:.2f} | {verdict} | {v.false_positive_bound:.3g} | "
            f"{to:.2f} | {ph['verify']:.2f} | {ph['fusion']:.2f} | {res.cost_us:.2f} | "
            f"{res.verified.false_positive_bound:.3g} |")


def main(argv: list[str]) -> None:
    """Print the table for the cases named ``name:batch`` (all when none)."""
    selected = [(c.split(":")[0], int(c.split(":")[1])) for c in argv] or list(cases())
    print(HEADER, flush=True)
    for name, batch in selected:
        print(row(name, batch), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
