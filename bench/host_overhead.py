"""Host overhead per call of the generated launcher, with the kernel launches stubbed.

    python bench/host_overhead.py [--calls 2000] [--rounds 5] [gqa:1 rmsnorm:8 ...]

For each benchmark case the chosen program's module is generated and loaded,
every ``@triton.jit`` kernel in it is replaced by a stub whose launch does
nothing, and ``run(*inputs)`` is called on CPU tensors of the right shapes:
what is left is the Python work of one call (binding and checking the
inputs, allocating the outputs, computing grids and passing the arguments),
except that a case with a pre-defined kernel is skipped (its torch call would
run for real on the CPU and swamp the figure). Each of ``--rounds`` rounds
times ``--calls`` calls of every case in turn, in batches of 100; each case's
round with the lowest median is reported (the others were slowed by something
else on the machine). Prints a Markdown table: median and 10th-percentile
microseconds per call, the median with ``compile(reuse_outputs=True)`` (outputs
allocated once per input signature), launches per call.
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


def _stubbed(res, reuse: bool):
    """The chosen program's module, every Triton kernel replaced by a ``_Stub``."""
    module = res.compile(reuse_outputs=reuse).module
    stubs = []
    for attr in dir(module):
        if attr.endswith("_kernel") and hasattr(getattr(module, attr), "run"):
            stubs.append(_Stub())
            setattr(module, attr, stubs[-1])
    return module, stubs


class _Timed:
    """One stubbed module and its inputs; ``round`` times one round of calls."""

    def __init__(self, module, stubs: list[_Stub]) -> None:
        import torch

        self.module, self.stubs = module, stubs
        inputs = {n: torch.zeros(shape, dtype=dtype)
                  for n, (shape, dtype) in module.INPUTS.items()}
        for _ in range(50):
            module.run(**inputs)
        self.args, self.made, self.best = tuple(inputs.values()), 50, None

    def round(self, calls: int) -> None:
        """Time ``calls`` calls in batches of 100 (the timer's cost is shared); keep the
        (median, 10th percentile) of the round with the lowest median."""
        run, args, times = self.module.run, self.args, []
        for _ in range(max(1, calls // 100)):
            t = time.perf_counter()
            for _ in range(100):
                run(*args)
            times.append((time.perf_counter() - t) * 1e4)
        self.made += 100 * len(times)
        times.sort()
        got = (statistics.median(times), times[len(times) // 10])
        self.best = got if self.best is None or got[0] < self.best[0] else self.best

    def launches(self) -> int:
        """Triton launches per call."""
        return sum(s.launches for s in self.stubs) // self.made


def prepare(name: str, batch: int) -> dict:
    """The case's chosen program, stubbed twice (without and with ``reuse_outputs``); only
    ``torch_ops`` when a pre-defined kernel would run for real on the CPU."""
    res = em.optimize(program(name, batch))
    torch_ops = sum(k.kind == "predefined" for k in res.program.kernels)
    out = {"case": f"{name} b={batch}", "torch_ops": torch_ops}
    if not torch_ops:
        out["plain"], out["reuse"] = _Timed(*_stubbed(res, False)), _Timed(*_stubbed(res, True))
    return out


def measure(chosen: list[tuple[str, int]], calls: int, rounds: int) -> list[dict]:
    """Each case's best-round median and 10th-percentile microseconds of one stubbed call
    (positional inputs), and the median with reused outputs. The rounds go over all the
    cases in turn, so that a busy moment on the machine spoils one round, not a case."""
    cases_ = [prepare(name, batch) for name, batch in chosen]
    for _ in range(max(1, rounds)):
        for c in cases_:
            if "plain" in c:
                c["plain"].round(calls)
                c["reuse"].round(calls)
    rows = []
    for c in cases_:
        row = {"case": c["case"], "torch_ops": c["torch_ops"]}
        if "plain" in c:
            (row["median"], row["p10"]), row["reuse"] = c["plain"].best, c["reuse"].best[0]
            row["launches"] = c["plain"].launches()
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    """Print the table for the selected cases (all twelve by default)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5,
                    help="measurement rounds (over all cases in turn); the lowest median of "
                         "each case is reported")
    args = ap.parse_args(argv)
    chosen = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases] or list(cases())
    rows = measure(chosen, args.calls, args.rounds)
    print("| case | us per call (median) | 10th pct | reuse_outputs=True (median) | "
          "Triton launches | torch ops |\n|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if "median" not in r:
            print(f"| {r['case']} | not measured: {r['torch_ops']} torch op(s) would run on "
                  "the CPU | | | | |")
            continue
        print(f"| {r['case']} | {r['median']:.1f} | {r['p10']:.1f} | {r['reuse']:.1f} | "
              f"{r['launches']} | {r['torch_ops']} |")


if __name__ == "__main__":
    main()
