"""Every candidate schedule of a benchmark, exported for timing on a GPU.

    python bench/schedule_sweep.py export sweep_bundle [--bench rmsnorm] [--limit 24]
    # on the GPU machine (docs/gpu.md):
    python3 sweep_bundle/gpu_runner.py sweep_bundle --out $OUT/sweep.json --ours-only
    python bench/schedule_sweep.py report sweep_bundle sweep.json [--write bench/RESULTS.md]

The search prices schedules with the cost model and keeps the cheapest; this sweep lowers
the hand-rewritten form of each selected benchmark (``programs.rewritten``: the algebra the
optimizer finds) as ONE fragment under every schedule the default strategy proposes
(grids, loops, FlashDecoding-style splits), writes each as a Triton module beside the
input program's one-torch-call-per-op module, and a manifest the standalone runner reads.
On the GPU every variant is checked against float64 and timed as CUDA-graph replays, so
``report`` can say how well the model's ranking matches the measured one (rank
correlation, the measured time of the model's pick against the fastest variant's) and
what the fastest schedule costs beside torch. Variants are not verified by the field
test: they are measurements, never returned to a user.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_bench import roofline  # noqa: E402
from bench.programs import program, rewritten  # noqa: E402
from eqsat_mirage.codegen.source import triton_source  # noqa: E402
from eqsat_mirage.cost.gpucost import mugraph_cost  # noqa: E402
from eqsat_mirage.cost.profile import GPUProfile  # noqa: E402
from eqsat_mirage.fusion.lower import lower  # noqa: E402
from eqsat_mirage.fusion.planner import DEFAULT_STRATEGY  # noqa: E402
from eqsat_mirage.fusion.schedule import ScheduleError  # noqa: E402
from eqsat_mirage.fusion.strategy import candidate_schedules  # noqa: E402
from eqsat_mirage.ir.errors import MirageError  # noqa: E402
from eqsat_mirage.mugraph.program import from_graph  # noqa: E402

RUNNER = Path(__file__).resolve().parent / "gpu_runner.py"
DEFAULT_CASES = (("rmsnorm", 1), ("gatedmlp", 1), ("lora", 1), ("ntrans", 1), ("gqa", 1),
                 ("rmsnorm", 8))


def variants(name: str, batch: int, target: str, limit: int
             ) -> list[tuple[str, object, float, str]]:
    """(schedule text, MuGraph, predicted us, Triton source) for up to ``limit`` schedules
    of the benchmark's rewritten form as one fragment, cheapest predicted first."""
    out = []
    for frag in (rewritten(name, batch), program(name, batch)):
        if not out:  # the rewritten form, else the input program as one fragment
            out = lowered(frag, f"{name}_b{batch}", target)
    out.sort(key=lambda v: v[2])
    return out[:limit]


def lowered(frag, name: str, target, strategy=None) -> list:
    """(schedule text, MuGraph, predicted us, Triton source) of ``frag`` lowered as one
    fragment under every schedule of ``strategy`` (the default one with splits, as under the
    built-in rules: egraph/kernels.py where SplitOver fires) that the lowering, the cost
    model and the Triton backend accept."""
    out = []
    strategy = strategy or replace(DEFAULT_STRATEGY, allow_split_reduction=True)
    try:
        schedules = candidate_schedules(frag, strategy)
    except ScheduleError:
        return out
    for sched in schedules:
        try:
            mg = lower(frag, sched, name=name)
            cost = mugraph_cost(mg, target).total_us
            source = triton_source(mg)
        except (ScheduleError, MirageError):
            continue  # a schedule the lowering, the cost model or the Triton backend refuses
        out.append((str(sched), mg, cost, source))
    return out


def variant_entry(folder: Path, vid: str, label: str, ref: str, variant: tuple, roof: tuple,
                  inputs: dict) -> dict:
    """Write one variant's module (``vid``.py) into ``folder``; its manifest entry (``roof``:
    ``roofline``'s bytes, flops and memory-bound flag; ``inputs``: name -> shape, dtype and
    scale)."""
    sched, mg, cost, source = variant
    moved, flops, mem_bound = roof
    (folder / f"{vid}.py").write_text(source, encoding="utf-8")
    return {"id": vid, "case": label, "ours": f"{vid}.py", "ref": ref, "schedule": sched,
            "predicted_us": cost, "kernels": len(mg.kernels), "min_bytes": moved,
            "flops": flops, "memory_bound": mem_bound, "sdpa": None,
            "mugraph": json.loads(mg.to_json()), "inputs": inputs}


def write_manifest(folder: Path, target: str, entries: list[dict]) -> dict:
    """A sweep's ``manifest.json`` and a copy of the runner in ``folder``; the manifest."""
    manifest = {"made": {"target": target, "sweep": True}, "cases": entries, "families": []}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    shutil.copy(RUNNER, folder / "gpu_runner.py")
    return manifest


def export(folder: Path, cases, target: str, limit: int) -> dict:
    """Write every variant's module, each case's reference module and ``manifest.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    prof = GPUProfile.load(target)
    entries = []
    for name, batch in cases:
        graph = program(name, batch)
        ref = f"{name}_b{batch}_ref.py"
        (folder / ref).write_text(triton_source(from_graph(graph), header=f"# {name} b={batch}:"
                                                " the input program"), encoding="utf-8")
        roof = roofline(graph, prof)
        inputs = {n: {"shape": list(node.shape), "dtype": node.dtype, "scale": 0.1}
                  for n, node in graph.inputs.items()}
        found = variants(name, batch, target, limit)
        print(f"{name} b={batch}: {len(found)} schedules", flush=True)
        entries += [variant_entry(folder, f"{name}_b{batch}_v{i:02d}", f"{name} b={batch} #{i}",
                                  ref, v, roof, inputs) for i, v in enumerate(found)]
    return write_manifest(folder, target, entries)


def _ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    for r, i in enumerate(order):
        ranks[i] = float(r)
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation of two equally long lists (no tie correction)."""
    n = len(xs)
    if n < 2:
        return float("nan")
    rx, ry = _ranks(xs), _ranks(ys)
    d2 = sum((a - b) ** 2 for a, b in zip(rx, ry))
    return 1.0 - 6.0 * d2 / (n * (n * n - 1))


def report(manifest: dict, results: dict, target: str | None = None) -> str:
    """A markdown table per benchmark: the model's pick, the fastest variant, the spread
    and the rank correlation of predicted against measured times (predicted as exported,
    or re-priced with ``target``'s profile as it is now, its measured calibration included)."""
    from eqsat_mirage.mugraph.program import MuGraph

    by_id = {c["case"]: c for c in manifest["cases"]}
    if target is not None:
        prof = GPUProfile.load(target).for_launch("graph")  # the runner times replays
        for c in by_id.values():
            c["predicted_us"] = mugraph_cost(MuGraph.from_json(json.dumps(c["mugraph"])),
                                             prof).total_us
    groups: dict[str, list[tuple[dict, dict]]] = {}
    for r in results["cases"]:
        c = by_id[r["case"]]
        groups.setdefault(c["ref"], []).append((c, r))
    lines = ["| benchmark | variants timed (ok) | model's pick: predicted / measured us | "
             "fastest measured us (its predicted us, schedule) | slowest measured us | "
             "rank correlation |", "|---|---|---|---|---|---|"]
    for ref, rows in groups.items():
        timed = [(c, r) for c, r in rows if r.get("ok") and "ours_us" in r]
        if not timed:
            lines.append(f"| {ref} | 0 ({len(rows)} failed) | | | | |")
            continue
        pick = min(timed, key=lambda cr: cr[0]["predicted_us"])
        best = min(timed, key=lambda cr: cr[1]["ours_us"])
        worst = max(timed, key=lambda cr: cr[1]["ours_us"])
        rho = spearman([c["predicted_us"] for c, _ in timed], [r["ours_us"] for _, r in timed])
        lines.append(f"| {ref.removesuffix('_ref.py')} | {len(rows)} ({len(timed)}) | "
                     f"{pick[0]['predicted_us']:.1f} / {pick[1]['ours_us']:.1f} | "
                     f"{best[1]['ours_us']:.1f} ({best[0]['predicted_us']:.1f}, "
                     f"`{best[0]['schedule']}`) | {worst[1]['ours_us']:.1f} | {rho:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``export`` or ``report`` (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export")
    ex.add_argument("folder", type=Path)
    ex.add_argument("--bench", action="append")
    ex.add_argument("--batch", type=int, default=1)
    ex.add_argument("--target", default="h100")
    ex.add_argument("--limit", type=int, default=24)
    rep = sub.add_parser("report")
    rep.add_argument("folder", type=Path)
    rep.add_argument("results", type=Path)
    rep.add_argument("--target", help="re-price every variant with this profile as it is now")
    args = ap.parse_args(argv)
    if args.cmd == "export":
        cases = [(b, args.batch) for b in args.bench] if args.bench else DEFAULT_CASES
        manifest = export(args.folder, cases, args.target, args.limit)
        print(f"wrote {len(manifest['cases'])} variants to {args.folder}")
        return 0
    manifest = json.loads((args.folder / "manifest.json").read_text())
    print(report(manifest, json.loads(args.results.read_text()), args.target), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
