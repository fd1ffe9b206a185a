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

The tuning groups timed by ``gpu_runner.py`` (each piece's best verified plans and its eager
form, timed in one run) are sweeps too: their programs and times were committed together
(``gpu_bundle.py ingest --records``, ``TUNING``), and ``measured_sweeps`` reads each group as
the sweep ``"<gpu> <run> <case> piece <p>"``.

    python bench/sweep_programs.py --fit

fits each device's figures (``calibrate.RANK_KEYS``) to the fitting half of its schedule
sweeps (``calibrate.held_out``; not the tuning groups, which test the fit) and writes
``extract/fits/<gpu>_measured.toml``;

    python bench/sweep_programs.py --enable h200

makes that fit the figures ``GPUProfile.load("h200")`` reads (``extract/h200_measured.toml``).
"""

from __future__ import annotations

import argparse
import json
import re
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
FITS = ROOT / "extract" / "fits"  # ranking fits (``--enable`` copies one to ENABLED)
RECORDED = "bench/h200_measured_2026-11-26.toml"  # the sweep run's calibration: each price
ENABLED = ROOT / "extract"  # where GPUProfile.load reads <gpu>_measured.toml
# the tuning groups' records (every timed program with its MuGraph): file -> the run's tag
TUNING = {"bench/gpu_h200_2026-12-04_s45_tuning.json": "s45",
          "bench/gpu_h200_2026-12-04_s46_tuning.json": "s46"}


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


def measured_sweeps(path: Path = OUT, tuning: bool = False) -> dict[str, dict[str, list]]:
    """device -> sweep ("h100 down_s128") -> its correct, timed variants as ``Measured``
    programs (the MuGraphs of ``path``, the times of the committed results), and with
    ``tuning`` the tuning groups' sweeps (``tuning_sweeps``)."""
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
    if tuning:
        for device, sweeps in tuning_sweeps().items():
            out.setdefault(device, {}).update(sweeps)
    return out


def tuning_sweeps(files: dict[str, str] = TUNING) -> dict[str, dict[str, list]]:
    """device -> sweep -> ``Measured`` programs of the tuning groups' records ``files``
    (file -> the run's tag): one sweep per group, ``"<gpu> <tag> <case> piece <p>"``, its
    candidates and its eager form (the records hold only correct, timed programs)."""
    from eqsat_mirage.cost.calibrate import Measured
    from eqsat_mirage.mugraph.program import MuGraph

    out: dict[str, dict[str, list]] = {}
    for path, tag in files.items():
        records = json.loads((ROOT / path).read_text(encoding="utf-8"))
        device = out.setdefault(records["target"], {})
        for p in records["programs"]:
            label = re.fullmatch(r"(.+ piece \d+) (#\d+|eager)", p["case"])
            if label is None:
                raise ValueError(f"{path}: {p['case']!r} is not '<case> piece <p> #<i>|eager'")
            group = label.group(1)
            device.setdefault(f"{records['target']} {tag} {group}", []).append(
                Measured(p["case"], MuGraph.from_json(json.dumps(p["mugraph"])),
                         p["measured_us"]))
    return out


def fit(device: str, folder: Path = FITS) -> Path:
    """Fit ``calibrate.RANK_KEYS`` of ``device``'s datasheet profile to the fitting half of
    its sweeps (``calibrate.held_out`` keeps the other half out) and write the figures as
    ``folder/<device>_measured.toml`` (``enable`` makes it the default)."""
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


def enable(device: str, folder: Path = ENABLED) -> Path:
    """Make ``device``'s ranking fit (``FITS``) the figures ``GPUProfile.load(device)`` reads:
    copied to ``folder/<device>_measured.toml`` with ``launch_overhead_us`` (the fit prices
    CUDA-graph replays only) set to its ``graph_launch_us`` plus the measured plain-launch gap
    per kernel of the cases ``RECORDED`` holds (``calibrate.plain_gap_per_kernel``)."""
    import tomllib

    from eqsat_mirage.cost.calibrate import plain_gap_per_kernel

    text = (FITS / f"{device}_measured.toml").read_text(encoding="utf-8")
    figures = tomllib.loads(text)["calibration"]
    cases = tomllib.loads((ROOT / RECORDED).read_text(encoding="utf-8"))["cases"]
    slope = plain_gap_per_kernel([(c["kernels"], c["measured_plain_us"] - c["measured_graph_us"])
                                  for c in cases.values() if "measured_plain_us" in c])
    if slope is None or "launch_overhead_us" in figures:
        raise SystemExit(f"{device}: no plain-launch gap to add, or the fit already has one")
    line = (f"# per kernel launched from Python: the fitted replay cost plus the measured gap "
            f"per extra kernel ({slope:.3f} us, {RECORDED})\n"
            f"launch_overhead_us = {figures['graph_launch_us'] + slope:.6g}\n")
    head, sep, rest = text.partition("\n[cases.")
    out = folder / f"{device}_measured.toml"
    out.write_text(f"{head.rstrip()}\n{line}\n{sep.lstrip()}{rest}" if sep else
                   f"{text.rstrip()}\n{line}", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    """Write every committed sweep's variants, or (``--fit``) the ranking fits."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--fit", action="store_true",
                    help=f"fit each device's figures to half of its sweeps into {FITS}")
    ap.add_argument("--enable", metavar="GPU",
                    help=f"make GPU's ranking fit in {FITS} the figures its target loads")
    args = ap.parse_args(argv)
    if args.enable:
        print(f"wrote {enable(args.enable)}", flush=True)
        return 0
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
