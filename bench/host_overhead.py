"""Host overhead per call of the generated launcher, with the kernel launches stubbed.

    python bench/host_overhead.py [--calls 2000] [gqa:1 rmsnorm:8 ...]

For each benchmark case the chosen program's module is generated and loaded,
every ``@triton.jit`` kernel in it is replaced by a stub whose launch does
nothing, and ``run(**inputs)`` is called on CPU tensors of the right shapes:
what is left is the Python work of one call (binding and checking the
inputs, allocating the outputs, computing grids and passing the arguments),
except that a case with a pre-defined kernel is skipped (its torch call would
run for real on the CPU and swamp the figure). Prints a Markdown table: median
and 10th-percentile microseconds per call, launches per call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # lets run() accept CPU tensors

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import eqsat_mirage as em  # noqa: E402
from bench.programs import cases, program  # noqa: E402


class _Stub:
    """A kernel whose ``kernel[grid](...)`` launch counts and does nothing."""

    def __init__(self) -> None:
        self.launches = 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches += 1
        return launch


def measure(name: str, batch: int, calls: int) -> dict:
    """Median and 10th-percentile microseconds of one stubbed call (positional inputs), over
batches of 100 calls."""
    import torch

    res = em.optimize(program(name, batch))
    torch_ops = sum(k.kind == "predefined" for k in res.program.kernels)
    if torch_ops:  # a pre-defined kernel's torch call would run for real on the CPU
        return {"case": f"{name} b={batch}", "torch_ops": torch_ops}
    module = res.compile().module
    stubs = []
    for attr in dir(module):
        if attr.endswith("_kernel") and hasattr(getattr(module, attr), "run"):
            stubs.append(_Stub())
            setattr(module, attr, stubs[-1])
    inputs = {n: torch.zeros(shape, dtype=dtype) for n, (shape, dtype) in module.INPUTS.items()}
    for _ in range(50):
        module.run(**inputs)
    times, run, args = [], module.run, tuple(inputs.values())
    for _ in range(max(1, calls // 100)):  # batches of 100 calls: the timer's cost is shared
        t = time.perf_counter()
        for _ in range(100):
            run(*args)
        times.append((time.perf_counter() - t) * 1e4)
    times.sort()
    launches = sum(s.launches for s in stubs) // (50 + 100 * max(1, calls // 100))
    return {"case": f"{name} b={batch}", "median": statistics.median(times),
            "p10": times[len(times) // 10], "launches": launches, "torch_ops": 0}


def main(argv: list[str] | None = None) -> None:
    """Print the table for the selected cases (all twelve by default)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*")
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    chosen = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases] or list(cases())
    print("| case | us per call (median) | 10th pct | Triton launches | torch ops |\n"
          "|---|---:|---:|---:|---:|")
    for name, batch in chosen:
        r = measure(name, batch, args.calls)
        if "median" not in r:
            print(f"| {r['case']} | not measured: {r['torch_ops']} torch op(s) would run on "
                  "the CPU | | | |", flush=True)
            continue
        print(f"| {r['case']} | {r['median']:.1f} | {r['p10']:.1f} | {r['launches']} | "
              f"{r['torch_ops']} |", flush=True)


if __name__ == "__main__":
    main()
