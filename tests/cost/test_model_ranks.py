"""Does the cost model rank the schedules the GPU measured? Every committed sweep re-priced.

A sweep is the schedules of one case timed in one run on one device: the H200 schedule
sweep (``bench/gpu_h200_2026-11-26_sweep.json``: rmsnorm b=1 and b=8, gatedmlp b=1, gqa b=1)
and the H100 matmul sweep (``bench/gpu_h100_2026-11-27_matmul_sweep.json``: the 7B layer's
down projection at s=128 and s=1, its q projection at s=128). Their programs are in
``tests/cost/data/sweep_programs.json`` (``bench/sweep_programs.py`` re-exports them; the
bundles were not committed). Sweeps of fewer than three timed programs (lora, ntrans) and
the benchmark bundles and 7B layers (one program per case and run, whose MuGraphs were not
committed) are left out.

For each device the sweeps are split in two fixed halves (``calibrate.held_out``); the
ranking fit (``bench/sweep_programs.py --fit``, ``extract/fits/<gpu>_measured.toml``) saw
only the fitting half. Run with ``pytest -s`` for the table: per sweep, its half, the
Spearman rank correlation of predicted against measured times and the median of
|predicted / measured - 1|, with the datasheet figures and with the fit.

The issue's thresholds (issue 50, "A model that ranks"): rank correlation at least 0.8
within each held-out sweep, median error at most 25%. They are NOT met yet (held out:
H100 q_s128 0.73 / 16%; H200 rmsnorm b=1 0.77 / 17%, gatedmlp b=1 0.60 / 76%; before the
L2 bandwidth and what one block pulls through L2 were fitted and the DRAM latency an
iteration waits over its stages - 1 loads in flight, rows not 16-byte aligned and a cost
per contiguous run were modelled (``block_l2_bandwidth_GBps``, ``iteration_latency_us``,
``unaligned_load_exponent``, ``run_overhead_bytes``): 0.29 / 38%, 0.77 / 21%, 0.60 / 81%;
before ``block_dram_bandwidth_GBps``: 0.29 / 38%, 0.55 / 25%, 0.23 / 73%. The H200 fit's
sweeps (rmsnorm b=8, gqa) stream far slower per block than gatedmlp b=1 does, which it
prices at about 1.8x its times). This test asserts what
holds: the committed programs are the measured ones (their datasheet prices equal the
prices recorded when they were measured), the figures each sweep reaches (a regression
floor: a model change that ranks worse fails here), and that the fit predicts the fitting
half's times better than the datasheet does (what its least squares minimizes). The table
also shows the profile each target loads today.

The H200 fit is enabled (``extract/h200_measured.toml``, ``bench/sweep_programs.py --enable
h200``): the tuning groups measured later (44 groups of each piece's best plans and its eager
form, sessions 45 and 46, none seen by the fit) are the held-out test of what matters for a
choice, the measured time of the plan the model picks over the fastest's
(``test_the_default_h200_figures_pick_among_the_tuned_plans``: geomean 1.065 with the fit,
1.159 with the datasheet, 1.177 with the calibration it replaced, now
``bench/h200_measured_2026-11-26.toml``). Within those groups the mean rank correlation is
0.63 and the median error 32%, short of the issue's 0.8 and 25%. The H100 fit is not
enabled (three sweeps of one op; 31 tests pin the datasheet's picks). Raise the floors as the model
improves.
"""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from eqsat_mirage.cost.calibrate import held_out, rank_sweep
from eqsat_mirage.cost.gpucost import mugraph_cost
from eqsat_mirage.cost.profile import GPUProfile

ROOT = Path(__file__).resolve().parents[2]
FITS = ROOT / "extract" / "fits"
RECORDED = {"h100": ROOT / "bench" / "h100_measured_2026-11-27.toml",
            "h200": ROOT / "bench" / "h200_measured_2026-11-26.toml"}
# (rank correlation at least, median error at most) per sweep with the fit, as reached on
# 2026-12-03 (with block_l2_bandwidth_GBps, iteration_latency_us, unaligned_load_exponent,
# run_overhead_bytes and the L2 bandwidth fitted) less a margin of 0.05: regression floors
FLOORS = {"h100 down_s128": (0.87, 0.19), "h100 down_s1": (0.71, 0.26),
          "h100 q_s128": (0.68, 0.21),
          "h200 rmsnorm b=1": (0.72, 0.22), "h200 gatedmlp b=1": (0.55, 0.81),
          "h200 gqa b=1": (0.73, 0.21), "h200 rmsnorm b=8": (0.80, 0.18)}


@pytest.fixture(scope="module")
def sweeps():
    from bench.sweep_programs import measured_sweeps

    return {dev: {k: v for k, v in s.items() if len(v) >= 3}
            for dev, s in measured_sweeps(tuning=False).items()}


@pytest.fixture(scope="module")
def groups():
    from bench.sweep_programs import tuning_sweeps

    return {k: v for k, v in tuning_sweeps()["h200"].items() if len(v) >= 3}


def with_figures(device: str, path: Path) -> GPUProfile:
    """``device``'s datasheet profile with the ``[calibration]`` figures of ``path``."""
    figures = tomllib.loads(path.read_text())["calibration"]
    return replace(GPUProfile.load(device, measured=False), **figures)


def fitted(device: str) -> GPUProfile:
    """``device``'s datasheet profile with the ranking fit's figures."""
    return with_figures(device, FITS / f"{device}_measured.toml")


def test_the_committed_programs_are_the_measured_ones(sweeps):
    for device, by_sweep in sweeps.items():
        recorded = tomllib.loads(RECORDED[device].read_text())["cases"]
        prof = GPUProfile.load(device, measured=False).for_launch("graph")
        checked = 0
        for programs in by_sweep.values():
            for p in programs:
                if p.case in recorded:
                    want = recorded[p.case]["predicted_us"]
                    assert mugraph_cost(p.mugraph, prof).total_us == pytest.approx(want,
                                                                                 abs=2e-3)
                    checked += 1
        assert checked >= 72, device  # every timed variant of the sweeps kept


def test_the_model_ranks_the_measured_schedules(sweeps):
    rows, reached = [], {}
    for device in sorted(sweeps):
        out = held_out(list(sweeps[device]))
        sheet, fit = GPUProfile.load(device, measured=False), fitted(device)
        now = GPUProfile.load(device)  # the default today (a measured calibration if any)
        gain = []
        for name, programs in sorted(sweeps[device].items()):
            before, after = rank_sweep(name, programs, sheet), rank_sweep(name, programs, fit)
            today = rank_sweep(name, programs, now)
            half = "held out" if name in out else "fitted"
            rows.append(f"| {name} | {half} | {after.programs} | {before.rank_correlation:.2f}"
                        f" / {today.rank_correlation:.2f} / {after.rank_correlation:.2f} | "
                        f"{before.median_error:.0%} / {today.median_error:.0%} / "
                        f"{after.median_error:.0%} |")
            reached[name] = after
            if name not in out:
                gain.append(before.median_error - after.median_error)
        assert out and len(out) < len(sweeps[device])  # both halves hold a sweep
        # the fit (least squares on the relative error) predicts what it saw better
        assert sum(gain) / len(gain) > 0.2, device
    print("\n| sweep | half | programs | rank correlation: datasheet / default / fit | "
          "median abs(predicted/measured - 1): datasheet / default / fit |\n"
          "|---|---|---:|---|---|\n" + "\n".join(rows))
    assert set(reached) == set(FLOORS)
    for name, (rho, err) in FLOORS.items():
        assert reached[name].rank_correlation >= rho, (name, reached[name])
        assert reached[name].median_error <= err, (name, reached[name])


def recorded(device: str) -> GPUProfile:
    """``device``'s datasheet profile with the calibration its sweeps were run with (the
    H200's default until 2026-12-04)."""
    return with_figures(device, RECORDED[device])


def picked(programs, prof: GPUProfile) -> float:
    """The measured time of the program ``prof`` prices cheapest, over the fastest's."""
    priced = [mugraph_cost(p.mugraph, prof.for_launch("graph")).total_us for p in programs]
    times = [p.graph_us for p in programs]
    return times[priced.index(min(priced))] / min(times)


# What the default H200 figures reach over the tuning groups (geomean of the pick's measured
# time over the fastest's; picks within 5% of the fastest; mean rank correlation), as reached
# on 2026-12-04 (1.065, 32 of 44, 0.63) less a margin: regression floors
GROUP_FLOORS = {"regret": 1.08, "within_5pct": 30, "rank_correlation": 0.58}


def test_the_default_h200_figures_pick_among_the_tuned_plans(groups):
    """The tuning groups (each piece's best verified plans and its eager form, timed in one
    run on an H200: 44 groups, 352 programs, sessions 45 and 46) were measured after the
    ranking fit was made, so every group is held out from it. They are 26 pieces: 18 were
    timed in both runs (101 programs twice), so the geomean weighs those twice; each run
    alone: session 46, 1.054 against the datasheet's 1.149; session 45, 1.082 against 1.175.
    The fit, enabled as the H200's default (``extract/h200_measured.toml``), picks within
    each group a plan measured closer to the fastest than the datasheet figures and the
    calibration it replaced do."""
    import numpy as np

    profiles = {"datasheet": GPUProfile.load("h200", measured=False),
                "replaced": recorded("h200"), "default": GPUProfile.load("h200")}
    fit = fitted("h200")  # enabled: the default holds every figure of the ranking fit
    assert all(getattr(profiles["default"], k) == getattr(fit, k)
               for k in tomllib.loads((FITS / "h200_measured.toml").read_text())["calibration"])
    rows, summary = [], {}
    for label, prof in profiles.items():
        regrets = [picked(programs, prof) for programs in groups.values()]
        ranks = [rank_sweep(name, programs, prof) for name, programs in groups.items()]
        summary[label] = {"regret": float(np.exp(np.mean(np.log(regrets)))),
                          "within_5pct": sum(r <= 1.05 for r in regrets),
                          "rank_correlation": float(np.nanmean([r.rank_correlation
                                                                for r in ranks])),
                          "median_error": float(np.median([r.median_error for r in ranks]))}
        rows.append(f"| {label} | {summary[label]['regret']:.3f} | "
                    f"{summary[label]['within_5pct']} of {len(groups)} | "
                    f"{summary[label]['rank_correlation']:.2f} | "
                    f"{summary[label]['median_error']:.0%} |")
    print("\n| H200 figures | pick / fastest (geomean) | picks within 5% | mean rank "
          "correlation | median abs(predicted/measured - 1) |\n|---|---|---|---|---|\n"
          + "\n".join(rows))
    assert len(groups) == 44 and sum(len(v) for v in groups.values()) == 352
    now = summary["default"]
    assert now["regret"] <= GROUP_FLOORS["regret"]
    assert now["within_5pct"] >= GROUP_FLOORS["within_5pct"]
    assert now["rank_correlation"] >= GROUP_FLOORS["rank_correlation"]
    for other in ("datasheet", "replaced"):
        assert now["regret"] < summary[other]["regret"] - 0.05, other
