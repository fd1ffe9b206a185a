"""The 7B layer's projections under every candidate schedule, exported for timing on a GPU.

    python bench/matmul_sweep.py export matmul_sweep [--limit 40]
    # on the GPU machine (docs/gpu.md), as for bench/schedule_sweep.py:
    python3 matmul_sweep/gpu_runner.py matmul_sweep --out $OUT/mm.json --ours-only --sets 1
    python bench/schedule_sweep.py report matmul_sweep mm.json --target h100

Issue 32's first GPU run found the MLP's down projection (``x @ W.T``, x 128 x 11008,
W 4096 x 11008, float16) 3.2x slower than the cost model said (170 us against 52): its loop
cut the contraction into 64 chunks of 172, a tile Triton pads to 256. This sweep lowers the
projections of a LLaMA-7B-size layer (down at sequence 128 and 1, q at 128) under the
default strategy's schedules plus loop ranges that cut 11008 into chunks of 64, 128 and 256
(``LOOP_RANGES``), with FlashDecoding-style splits, so the timings say what each choice
costs. Variants are measurements, never returned to a user.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import eqsat_mirage as em  # noqa: E402
from bench.gpu_bench import roofline  # noqa: E402
from bench.schedule_sweep import lowered, variant_entry, write_manifest  # noqa: E402
from eqsat_mirage.codegen.source import triton_source  # noqa: E402
from eqsat_mirage.cost.profile import GPUProfile  # noqa: E402
from eqsat_mirage.fusion.planner import DEFAULT_STRATEGY  # noqa: E402
from eqsat_mirage.mugraph.program import from_graph  # noqa: E402

LOOP_RANGES = (4, 16, 32, 43, 64, 86, 128, 172)  # 11008 = 43 * 256; 4096 = 2^12
CASES = {"down_s128": (128, 11008, 4096), "down_s1": (1, 11008, 4096),
         "q_s128": (128, 4096, 4096)}


def projection(name: str, seq: int, k: int, n: int) -> em.Graph:
    """``x @ W.T``: x (1, seq, k), W (n, k), float16 (a linear layer as Dynamo gives it)."""
    g = em.Graph(name)
    x = g.input("x", (1, seq, k), dtype="float16")
    w = g.input("w", (n, k), dtype="float16")
    g.output(x @ w.T, "y")
    return g


def export(folder: Path, target: str, limit: int) -> dict:
    """Write every variant's module, each case's reference module and ``manifest.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    prof = GPUProfile.load(target)
    strategy = replace(DEFAULT_STRATEGY, loop_ranges=LOOP_RANGES, allow_split_reduction=True,
                       max_candidates=256)
    entries = []
    for name, (seq, k, n) in CASES.items():
        graph = projection(name, seq, k, n)
        ref = f"{name}_ref.py"
        (folder / ref).write_text(triton_source(from_graph(graph), header=f"# {name}"),
                                  encoding="utf-8")
        roof = roofline(graph, prof)
        inputs = {"x": {"shape": [1, seq, k], "dtype": "float16", "scale": 1.0},
                  "w": {"shape": [n, k], "dtype": "float16", "scale": 0.02}}
        found = sorted((v for v in lowered(graph, name, prof, strategy) if v[2] < float("inf")),
                       key=lambda v: v[2])
        step = max(1, len(found) // limit)  # cheapest first, then a spread of the rest
        keep = found[:limit // 2] + found[limit // 2::step][:limit - limit // 2]
        print(f"{name}: {len(found)} schedules, {len(keep)} exported", flush=True)
        entries += [variant_entry(folder, f"{name}_v{i:02d}", f"{name} #{i}", ref, v, roof,
                                  inputs) for i, v in enumerate(keep)]
    return write_manifest(folder, target, entries)


def main(argv: list[str] | None = None) -> int:
    """``export`` (see the module docstring; ``schedule_sweep.py report`` reads the results)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export")
    ex.add_argument("folder", type=Path)
    ex.add_argument("--target", default="h100")
    ex.add_argument("--limit", type=int, default=40)
    args = ap.parse_args(argv)
    manifest = export(args.folder, args.target, args.limit)
    print(f"wrote {len(manifest['cases'])} variants to {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
