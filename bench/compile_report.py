"""Every chosen kernel of every benchmark case compiled for sm_90a (no GPU needed).

    python bench/compile_report.py [--target h100] [--write bench/RESULTS.md]

For each case of bench/programs.py the chosen program (``em.optimize``, through
the results cache) is generated and each kernel compiled by Triton for the
target (``codegen.compiled.compile_report``): blocks, registers, spill stores
and stack frame per thread (ptxas -v), shared memory, warps and stages.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import eqsat_mirage as em  # noqa: E402
from bench.programs import cases, program  # noqa: E402
from bench.results_md import replace_section  # noqa: E402
from eqsat_mirage.codegen.compiled import compile_report  # noqa: E402
from eqsat_mirage.cost.profile import GPUProfile  # noqa: E402

SECTION = "## Compiled for sm_90a (issue 17)"


def table(target: str) -> tuple[str, list[str]]:
    """The Markdown table and the problems found (spills, shared memory over the limit)."""
    limit = GPUProfile.load(target).smem_per_block_KiB * 1024
    rows = ["| case | kernel | blocks | registers | spill stores B | stack B | shared KiB | "
            "warps | stages |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    problems = []
    for name, batch in cases():
        res = em.optimize(program(name, batch), target=target)
        kernels = compile_report(res.triton_source(), target)
        if not kernels:
            rows.append(f"| {name} b={batch} | (no Triton kernel: "
                        f"{res.stats.get('note', 'torch ops only')}) | | | | | | | |")
        for k in kernels:
            rows.append(f"| {name} b={batch} | {k.kernel} | {math.prod(k.grid)} | "
                        f"{k.registers} | {k.spill_bytes} | {k.stack_bytes} | "
                        f"{k.shared_bytes / 1024:.1f} | {k.num_warps} | {k.num_stages} |")
            if k.spill_bytes or k.shared_bytes > limit:
                problems.append(f"{name} b={batch} {k.kernel}: {k.spill_bytes} B spilled, "
                                f"{k.shared_bytes / 1024:.1f} KiB shared")
        print(rows[-1], flush=True)
    return "\n".join(rows), problems


def sm_filling(name: str, batch: int, target: str) -> str:
    """The chosen schedule of a skinny-matmul case against the cheapest split-K (K cut over
    2 to 16 grid blocks, a reduce kernel after) and wider grids, all priced by the model."""
    from eqsat_mirage.cost.gpucost import mugraph_cost
    from eqsat_mirage.fusion.lower import lower
    from eqsat_mirage.fusion.schedule import Schedule

    res = em.optimize(program(name, batch), target=target)
    (k,) = [k for k in res.program.kernels if k.kind == "custom"]
    best: dict[bool, tuple] = {}
    for cols in (32, 48, 64, 96, 128, 192, 256):
        for parts in (1, 2, 4, 8, 16):
            for f in (4, 16, 64):
                split = parts > 1
                grid = (("c", cols),) + ((("b", parts),) if split else ())
                try:
                    mg = lower(k.source, Schedule(grid, "b", f, "b" if split else None))
                    cost = mugraph_cost(mg, target)
                except (em.MirageError, ValueError):
                    continue
                blocks = "+".join(str(kc.blocks) for kc in cost.kernels)
                if cost.feasible and (split not in best or cost.total_us < best[split][0]):
                    best[split] = (cost.total_us, blocks)
    whole, parts = best.get(False), best.get(True)
    return (f"- {name} b={batch}: chosen {math.prod(k.grid)} blocks, {res.cost_us:.2f} us; "
            f"cheapest unsplit grid {whole[0]:.2f} us ({whole[1]} blocks); cheapest split-K "
            f"{parts[0]:.2f} us ({parts[1]} blocks: parts, then the reduce)")


def main(argv: list[str] | None = None) -> None:
    """Print the table; ``--write`` puts it in its RESULTS.md section."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="h100")
    ap.add_argument("--write", type=Path)
    args = ap.parse_args(argv)
    text, problems = table(args.target)
    import triton

    body = "\n".join([
        SECTION, "",
        f"Command: `python bench/compile_report.py --write bench/RESULTS.md`. Machine: "
        f"{platform.machine()} Linux, no GPU; triton {triton.__version__} compiling for "
        f"sm_90a (GPUTarget cuda 90) with the ptxas in its wheel. Spill stores and stack "
        "frame are ptxas -v's, per thread; shared memory is Triton's (all stages).", "",
        text, "",
        "Spilling or over the shared-memory limit: " + ("; ".join(problems) or "none"), "",
        "SM-filling schedules for the skinny matmuls (132 SMs; the model's prices, with its "
        "bytes-in-flight term): split-K pays a second launch and a round trip of the "
        "partials, and the model prefers it only when that is cheaper.", "",
        *(sm_filling(n, b, args.target) for n, b in (("rmsnorm", 1), ("gatedmlp", 1))), ""])
    print(body)
    if args.write:
        replace_section(args.write, SECTION, body)


if __name__ == "__main__":
    main()
