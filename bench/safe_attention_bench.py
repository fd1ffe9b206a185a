"""Safe attention against the unsafe form (and causal attention against one kernel per op):
kernels, cost, bound and search time.

    OPENBLAS_NUM_THREADS=1 python bench/safe_attention_bench.py [gqa:1 qknorm:8 ...]

For each case, ``em.optimize`` (no cache) of the safe form (``bench/programs.py``:
``gqa_safe``, ``qknorm_safe``: softmax with its row max subtracted) and of Mirage's
unsafe form, on the same shapes. Prints a Markdown table: the safe plan's kernels and
running maxima, whether a score-sized tensor goes to device memory, both costs and their
ratio, the safe plan's bound and its search seconds.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import eqsat_mirage as em  # noqa: E402
from bench.programs import program  # noqa: E402

HEADER = ("| benchmark | b | kernels (running maxima) | scores in device memory | safe us | "
          "unsafe us | safe / unsafe | bound | search s |\n"
          "|---|---|---|---|---:|---:|---:|---:|---:|")


def row(name: str, batch: int) -> str:
    """One table row for the safe form of ``name`` at ``batch``."""
    safe = program(f"{name}_safe", batch)
    t = time.perf_counter()
    res = em.optimize(safe, cache=None)
    seconds = time.perf_counter() - t
    unsafe = em.optimize(program(name, batch), cache=None)
    q, k = safe.inputs["Q"].shape, safe.inputs["K"].shape
    scores = (q[0], q[1], k[2])
    stored = any(s.shape == scores for s in res.program.tensors.values())
    kernels = ", ".join(f"{k.name}" + (f" ({len(k.maxima)})" if getattr(k, "maxima", None)
                                       else "") for k in res.program.kernels)
    bound = res.verified.false_positive_bound if res.verified else float("nan")
    return (f"| {name}_safe | {batch} | {kernels} | {'yes' if stored else 'no'} | "
            f"{res.cost_us:.2f} | {unsafe.cost_us:.2f} | {res.cost_us / unsafe.cost_us:.2f} | "
            f"{bound:.2g} | {seconds:.1f} |")


def causal_row(batch: int) -> str:
    """The causal prefill benchmark against one kernel per op (no unsafe form to compare)."""
    g = program("causal", batch)
    t = time.perf_counter()
    res = em.optimize(g, cache=None)
    seconds = time.perf_counter() - t
    q = g.inputs["Q"].shape
    stored = any(s.shape == (q[0], q[1], q[1]) for s in res.program.tensors.values())
    kernels = ", ".join(f"{k.name}" + (f" ({len(k.maxima)})" if getattr(k, "maxima", None)
                                       else "") for k in res.program.kernels)
    bound = res.verified.false_positive_bound if res.verified else float("nan")
    return (f"| causal | {batch} | {kernels} | {'yes' if stored else 'no'} | "
            f"{res.cost_us:.2f} | {res.baseline_cost_us:.2f} (one per op) | "
            f"{res.cost_us / res.baseline_cost_us:.2f} | {bound:.2g} | {seconds:.1f} |")


def main(argv: list[str]) -> None:
    """Print the table for ``name:batch`` cases (default: gqa and qknorm at 1 and 8)."""
    cases = [(c.split(":")[0], int(c.split(":")[1])) for c in argv] or [
        (n, b) for n in ("gqa", "qknorm", "causal") for b in (1, 8)]
    print(HEADER, flush=True)
    for name, batch in cases:
        print(causal_row(batch) if name == "causal" else row(name, batch), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
