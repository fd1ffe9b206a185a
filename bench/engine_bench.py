"""Kernel-level search on the six benchmarks, guards on and off, in one run.

Usage: python bench/engine_bench.py [--batches 1 8] [--write bench/RESULTS.md]

For each benchmark and batch size: saturation seconds, tensor e-nodes, the
cost-model time of the input (one kernel per op) and of the chosen program,
and whether the chosen program verified, once with abstract-expression guards
and once without. With --write the table replaces the "Kernel-level search"
section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import eqsat_mirage as em  # noqa: E402
from bench.programs import BENCHMARKS, program  # noqa: E402
from bench.results_md import replace_section  # noqa: E402

SECTION = "## Kernel-level search (issue 3): guards on vs off"


def run(batches, time_limit_s: float) -> list[dict]:
    """Optimize every benchmark with guards on and off; one row per (name, batch, guards)."""
    rows = []
    for name in BENCHMARKS:
        for batch in batches:
            for guards in (True, False):
                g = program(name, batch)
                t = time.perf_counter()
                res = em.optimize(g, guards=guards, time_limit_s=time_limit_s, cache=False,
                                  level="kernel")
                total = time.perf_counter() - t
                sat = [p for p in res.stats["phases"] if p["name"] != "guards"]
                guard_s = sum(p["seconds"] for p in res.stats["phases"] if p["name"] == "guards")
                rows.append({
                    "name": name, "batch": batch, "guards": "on" if guards else "off",
                    "guard_s": guard_s, "sat_s": sum(p["seconds"] for p in sat),
                    "iters": sum(p["iterations"] for p in sat),
                    "stop": ",".join(p["stop"] for p in sat), "enodes": res.stats["enodes"],
                    "base": res.baseline_cost_us, "cost": res.cost_us,
                    "verified": bool(res.verified and res.verified.equivalent), "total": total})
                print(_fmt(rows[-1]), flush=True)
    return rows


HEADER = ("| benchmark | b | guards | guard setup s | saturate s | iterations (stop) | e-nodes "
          "| baseline us | chosen us | verified | total s |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")


def _fmt(r: dict) -> str:
    return (f"| {r['name']} | {r['batch']} | {r['guards']} | {r['guard_s']:.2f} | {r['sat_s']:.2f} "
            f"| {r['iters']} ({r['stop']}) | {r['enodes']} | {r['base']:.1f} | {r['cost']:.1f} "
            f"| {'yes' if r['verified'] else 'NO'} | {r['total']:.1f} |")


def write(rows: list[dict], path: Path, argv: list[str]) -> None:
    """Replace (or append) this script's section of RESULTS.md."""
    body = "\n".join([
        SECTION, "",
        f"Command: `python bench/engine_bench.py {' '.join(argv)}`  ",
        f"Machine: {platform.processor() or platform.machine()}, {platform.system()}, "
        f"Python {platform.python_version()}, no GPU (cost-model figures for target h100).", "",
        "Costs are the kernel-level FLOP/byte model (one kernel per op; extract/h100.toml); "
        "e-nodes count tensor terms after the last phase; guard setup is the one-off "
        "saturation of the target's abstract expression.", "",
        HEADER, *(_fmt(r) for r in rows), ""])
    replace_section(path, SECTION, body)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args(argv)
    print(HEADER)
    rows = run(args.batches, args.time_limit)
    if args.write:
        write(rows, args.write, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
