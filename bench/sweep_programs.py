"""The committed schedule sweeps' programs, re-exported for re-pricing on CPU.

    python bench/sweep_programs.py [--out tests/cost/data/sweep_programs.json]

The sweeps' bundles (``schedule_sweep.py export``, ``matmul_sweep.py export``) were not
committed; their results (``bench/gpu_h200_2026-11-26_sweep.json``,
``bench/gpu_h100_2026-11-27_matmul_sweep.json``) name each variant ``CASE #i``, ``i`` its
place in the export's order (cheapest predicted first with the datasheet profile of the
sweep's target, then, for the matmul sweep, a spread). This script repeats both exports
without writing modules (the same candidates, the same datasheet prices, the same order)
and writes each variant's MuGraph under its label, with the price it had, so that
``tests/cost/test_model_ranks.py`` can re-price every measured schedule with the model as
it is now (the H100 variants' prices equal those its calibration file recorded; the H200
ones are matched by them, see ``schedule_sweep``).

    python bench/sweep_programs.py --fit

fits each device's figures (``calibrate.RANK_KEYS``) to the fitting half of its sweeps
(``calibrate.held_out``) and writes ``extract/fits/<gpu>_measured.toml``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.matmul_sweep import CASES, LOOP_RANGES, projection  # noqa: E402
from bench.programs import program, rewritten  # noqa: E402
from bench.schedule_sweep import DEFAULT_CASES, lowered  # noqa: E402
from eqsat_mirage.cost.gpucost import mugraph_cost  # noqa: E402
from eqsat_mirage.cost.profile import GPUProfile  # noqa: E402
from eqsat_mirage.fusion.planner import DEFAULT_STRATEGY  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "cost" / "data" / "sweep_programs.json"
SWEEPS = {"bench/gpu_h200_2026-11-26_sweep.json": "h200",
          "bench/gpu_h100_2026-11-27_matmul_sweep.json": "h100"}
LIMIT = 24
FITS = ROOT / "extract" / "fits"  # ranking fits, not read by GPUProfile.load (not enabled)
RECORDED = "extract/h200_measured.toml"  # the H200 calibration: each variant's price


def schedule_sweep(prof: GPUProfile) -> dict[str, dict]:
    """``schedule_sweep.py export`` (default cases, limit 24): label -> entry.

    The export ordered the variants by the model of its day, which has changed since (a
    re-export lists them in another order), so each label is matched by the price the
    run's calibration recorded for it (``RECORDED``, the datasheet model as it is now,
    CUDA-graph launches): the candidate with that price, equal prices taken in candidate
    order (the export's sort was stable, so labels of equal price follow candidate order)."""
    import tomllib

    recorded = tomllib.loads((ROOT / RECORDED).read_text(encoding="utf-8"))["cases"]
    graph = prof.for_launch("graph")
    out = {}
    for name, batch in DEFAULT_CASES:
        found = []
        for frag in (rewritten(name, batch), program(name, batch)):
            if not found:
                found = lowered(frag, f"{name}_b{batch}", prof)
        priced = [(sched, mg, cost, mugraph_cost(mg, graph).total_us)
                  for sched, mg, cost, _ in found]
        used: set[int] = set()
        for i in range(LIMIT):
            label = f"{name} b={batch} #{i}"
            if label not in recorded:
                continue
            want = recorded[label]["predicted_us"]
            j = next((j for j, v in enumerate(priced)
                      if j not in used and abs(v[3] - want) < 2e-3), None)
            if j is None:
                print(f"{label}: no candidate priced {want} us", flush=True)
                continue
            used.add(j)
            sched, mg, cost, _ = priced[j]
            out[label] = {"schedule": sched, "exported_us": cost,
                          "mugraph": json.loads(mg.to_json())}
    return out


def matmul_sweep(prof: GPUProfile) -> dict[str, dict]:
    """``matmul_sweep.py export --limit 24``: label -> entry."""
    out = {}
    strategy = replace(DEFAULT_STRATEGY, loop_ranges=LOOP_RANGES, allow_split_reduction=True,
                       max_candidates=256)
    for name, (seq, k, n) in CASES.items():
        graph = projection(name, seq, k, n)
        found = sorted((v for v in lowered(graph, name, prof, strategy) if v[2] < float("inf")),
                       key=lambda v: v[2])
        step = max(1, len(found) // LIMIT)
        keep = found[:LIMIT // 2] + found[LIMIT // 2::step][:LIMIT - LIMIT // 2]
        for i, (sched, mg, cost, _) in enumerate(keep):
            out[f"{name} #{i}"] = {"schedule": sched, "exported_us": cost,
                                   "mugraph": json.loads(mg.to_json())}
    return out


def measured_sweeps(path: Path = OUT) -> dict[str, dict[str, list]]:
    """device -> sweep ("h100 down_s128") -> its correct, timed variants as ``Measured``
    programs (the MuGraphs of ``path``, the times of the committed results)."""
    from eqsat_mirage.cost.calibrate import Measured
    from eqsat_mirage.mugraph.program import MuGraph

    out: dict[str, dict[str, list]] = {}
    for results, sweep in json.loads(path.read_text(encoding="utf-8")).items():
        timed = {c["case"]: c for c in json.loads((ROOT / results).read_text())["cases"]}
        device = out.setdefault(sweep["target"], {})
        for label, v in sweep["variants"].items():
            r = timed.get(label, {})
            if r.get("ok") and "ours_us" in r:
                device.setdefault(f"{sweep['target']} {label.split(' #')[0]}", []).append(
                    Measured(label, MuGraph.from_json(json.dumps(v["mugraph"])), r["ours_us"]))
    return out


def fit(device: str, folder: Path = FITS) -> Path:
    """Fit ``calibrate.RANK_KEYS`` of ``device``'s datasheet profile to the fitting half of
    its sweeps (``calibrate.held_out`` keeps the other half out) and write the figures as
    ``folder/<device>_measured.toml`` (copy it to extract/ to make it the default)."""
    from eqsat_mirage.cost.calibrate import RANK_KEYS, fit_figures, held_out, write_fitted

    sweeps = {k: v for k, v in measured_sweeps()[device].items() if len(v) >= 3}
    out = held_out(list(sweeps))
    train = [p for name, ps in sweeps.items() if name not in out for p in ps]
    result = fit_figures(train, device, keys=RANK_KEYS)
    folder.mkdir(parents=True, exist_ok=True)
    device_name = json.loads((ROOT / next(r for r, t in SWEEPS.items() if t == device))
                             .read_text())["device"]
    return write_fitted(folder / f"{device}_measured.toml", result, device_name,
                        f"(the fitting half of its schedule sweeps: "
                        f"{', '.join(sorted(set(sweeps) - out))}; held out: "
                        f"{', '.join(sorted(out))})")


def main(argv: list[str] | None = None) -> int:
    """Write every committed sweep's variants, or (``--fit``) the ranking fits."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--fit", action="store_true",
                    help=f"fit each device's figures to half of its sweeps into {FITS}")
    args = ap.parse_args(argv)
    if args.fit:
        for device in sorted(set(SWEEPS.values())):
            print(f"wrote {fit(device)}", flush=True)
        return 0
    data = {}
    for results, target in SWEEPS.items():
        prof = GPUProfile.load(target, measured=False)
        made = schedule_sweep(prof) if target == "h200" else matmul_sweep(prof)
        data[results] = {"target": target, "variants": made}
        print(f"{results}: {len(made)} variants", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
