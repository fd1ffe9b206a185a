"""Calibration: figures fitted to measured times, written to <gpu>_measured.toml, read back."""

from __future__ import annotations

import math
import shutil

import pytest

import eqsat_mirage as em
from eqsat_mirage.cost.calibrate import Sample, fit, write_measured
from eqsat_mirage.cost.gpucost import mugraph_cost
from eqsat_mirage.cost.profile import GPUProfile, profiles_dir
from eqsat_mirage.fusion.lower import lower
from eqsat_mirage.fusion.schedule import Schedule
from eqsat_mirage.mugraph.program import from_graph

TRUE = {"graph_launch_us": 1.5, "memory": 1.25, "compute": 1.6, "gap_us": 2.0}


def _programs():
    """Memory-bound and compute-bound MuGraphs of several sizes: predefined ops and fused
    kernels."""
    out = []
    for n in (512, 2048, 8192):
        g = em.Graph(f"mm{n}")
        a = g.input("A", (n, 1024), "float16")
        b = g.input("B", (1024, 1024), "float16")
        g.output(em.silu(a @ b) * 2.0, "Y")
        out.append((f"mm{n}", from_graph(g)))
    for rows in (16, 256):
        g = em.Graph(f"rmslin{rows}")
        x = g.input("X", (rows, 4096), "float16")
        w = g.input("W", (4096, 4096), "float16")
        g.output(em.rms_norm(x) @ w, "Y")
        out.append((f"rmslin{rows}", from_graph(g)))
    g = em.Graph("tiled")
    a = g.input("A", (4096, 4096), "float16")
    b = g.input("B", (4096, 4096), "float16")
    g.output(a @ b, "C")
    out.append(("tiled", lower(g, Schedule(grid=(("a", 32), ("c", 32)), loop="b", forloop=64))))
    return out


def _measured(prof):
    """What a GPU following the fitted model's form exactly (TRUE) would measure."""
    samples = []
    for name, mg in _programs():
        cost = mugraph_cost(mg, prof)
        n = sum(k.launch_us > 0 for k in cost.kernels)  # reshapes are free views
        graph = n * TRUE["graph_launch_us"] + sum(
            max(TRUE["memory"] * k.memory_us, TRUE["compute"] * k.compute_us)
            for k in cost.kernels)
        samples.append(Sample(name, cost, graph, graph + n * TRUE["gap_us"]))
    return samples


def test_the_fit_recovers_the_launch_cost_and_the_scales():
    prof = GPUProfile.load("h100")
    samples = _measured(prof)
    assert {s.cost.kernels[0].memory_us >= s.cost.kernels[0].compute_us for s in samples} == {
        True, False}  # both kinds of kernel are in the sample
    result = fit(samples, prof)
    assert result.graph_launch_us == pytest.approx(TRUE["graph_launch_us"], rel=1e-6)
    assert result.memory_scale == pytest.approx(TRUE["memory"], rel=1e-6)
    assert result.compute_scale == pytest.approx(TRUE["compute"], rel=1e-6)
    assert result.launch_overhead_us == pytest.approx(3.5, rel=1e-6)
    assert result.residual < 1e-6
    f = result.figures
    assert f["dram_achievable_fraction"] == pytest.approx(prof.dram_achievable_fraction / 1.25)
    assert f["sm_dram_bandwidth_GBps"] == pytest.approx(prof.sm_dram_bandwidth_GBps / 1.25)
    assert f["tensor_achievable_fraction"] == pytest.approx(prof.tensor_achievable_fraction / 1.6)
    assert f["dram_latency_ns"] == pytest.approx(prof.dram_latency_ns * 1.25)


def test_the_measured_file_is_what_the_cost_model_reads(tmp_path):
    shutil.copy(profiles_dir() / "h100.toml", tmp_path / "h100.toml")
    prof = GPUProfile.load(tmp_path / "h100.toml")
    samples = _measured(prof)
    path = write_measured(tmp_path / "h100_measured.toml", fit(samples, prof), "test GPU")
    assert path.name == "h100_measured.toml" and "[calibration]" in path.read_text()
    tuned = GPUProfile.load(tmp_path / "h100.toml")
    assert "graph_launch_us" in tuned.calibrated
    assert tuned.sources["graph_launch_us"].startswith("measured (h100_measured.toml)")
    assert tuned.launch_overhead_us == pytest.approx(3.5)
    graph = tuned.for_launch("graph")
    for s, (_, mg) in zip(samples, _programs()):  # the new figures price what was measured
        assert mugraph_cost(mg, graph).total_us == pytest.approx(s.graph_us, rel=1e-6)
        assert mugraph_cost(mg, tuned).total_us == pytest.approx(s.plain_us, rel=1e-6)
    assert GPUProfile.load("h100").graph_launch_us == 1.2  # the built-in file is untouched


def test_the_results_cache_key_changes_with_the_measured_file(tmp_path):
    from eqsat_mirage.pipeline.cache import target_digest

    shutil.copy(profiles_dir() / "h100.toml", tmp_path / "h100.toml")
    before = target_digest(tmp_path / "h100.toml")
    prof = GPUProfile.load(tmp_path / "h100.toml")
    write_measured(tmp_path / "h100_measured.toml", fit(_measured(prof), prof), "test GPU")
    assert target_digest(tmp_path / "h100.toml") != before


def test_bad_measurements_get_a_clear_error(tmp_path):
    prof = GPUProfile.load("h100")
    samples = _measured(prof)
    with pytest.raises(em.MirageError, match="at least 3"):
        fit(samples[:2], prof)
    flat = [Sample(s.case, s.cost, 5.0) for s in samples]  # no cost per launch in the times
    with pytest.raises(em.MirageError, match="calibration: the"):
        fit(flat, prof)
    shutil.copy(profiles_dir() / "h100.toml", tmp_path / "h100.toml")
    (tmp_path / "h100_measured.toml").write_text("[calibration]\nwarp_speed = 9\n")
    with pytest.raises(em.MirageError, match="warp_speed"):
        GPUProfile.load(tmp_path / "h100.toml")


def test_launch_modes_price_every_launch():
    prof = GPUProfile.load("h100")
    mg = _programs()[0][1]
    plain, graph = mugraph_cost(mg, prof), mugraph_cost(mg, prof.for_launch("graph"))
    n = len(mg.kernels)
    assert plain.total_us - graph.total_us == pytest.approx(n * (3.0 - 1.2))
    assert prof.for_launch("graph").for_launch("plain") == prof
    with pytest.raises(em.MirageError, match="launch must be one of"):
        prof.for_launch("stream")


def test_the_gpu_bundle_ingest_fits_and_writes_the_measured_file(tmp_path):
    """bench/gpu_bundle.py ingest --calibration: the manifest's MuGraph JSON re-priced, the
    runner's CUDA-graph and plain times fitted, the file written where load() finds it."""
    import json

    from bench.gpu_bundle import calibration

    shutil.copy(profiles_dir() / "h100.toml", tmp_path / "h100.toml")
    prof = GPUProfile.load(tmp_path / "h100.toml")
    samples = _measured(prof)
    manifest = {"cases": [{"case": s.case, "mugraph": json.loads(mg.to_json())}
                          for s, (_, mg) in zip(samples, _programs())]}
    results = {"cases": [{"case": s.case, "ok": True, "ours_us": s.graph_us,
                          "ours_plain_us": s.plain_us} for s in samples]}
    results["cases"].append({"case": "broken", "ok": False, "ours_us": float("nan")})
    manifest["cases"].append({"case": "broken", "mugraph": None})
    fitted = calibration(manifest, results, prof, "test GPU", tmp_path / "h100_measured.toml")
    assert len(fitted.samples) == len(samples) and fitted.residual < 1e-6
    assert GPUProfile.load(tmp_path / "h100.toml").graph_launch_us == pytest.approx(1.5)


def _variants(limit: int = 12):
    """Schedules of one fused RMSNorm + Linear: grids, loops and splits (what a sweep
    measures)."""
    from dataclasses import replace

    from eqsat_mirage.fusion.planner import DEFAULT_STRATEGY
    from eqsat_mirage.fusion.strategy import candidate_schedules

    g = em.Graph("rmslin")
    x = g.input("X", (2, 2048), "float16")
    w = g.input("W", (2048, 2048), "float16")
    ms = em.rsqrt((x * x).mean(axis=1, keepdims=True) + 1e-6)
    g.output((x @ w) * ms, "Y")
    out = []
    # splits too, as the sweep (bench/schedule_sweep.py) and the built-in block rules allow
    for s in candidate_schedules(g, replace(DEFAULT_STRATEGY, allow_split_reduction=True)):
        out.append((str(s), lower(g, s)))
        if len(out) == limit:
            break
    return out


def test_fit_figures_recovers_the_figures_that_priced_the_programs():
    """Programs priced with known figures (per-SM bandwidth, latency, launch) are fitted
    back from the datasheet: the residual vanishes and the figures come back."""
    from dataclasses import replace

    from eqsat_mirage.cost.calibrate import Measured, fit_figures

    base = GPUProfile.load("h100", measured=False).for_launch("graph")
    truth = replace(base, sm_dram_bandwidth_GBps=30.0, dram_latency_ns=1100.0,
                    graph_launch_us=5.0, launch_overhead_us=5.0)
    programs = [Measured(name, mg, t, None) for name, mg in _variants() + _programs()
                if math.isfinite(t := mugraph_cost(mg, truth).total_us)]
    assert len({round(p.graph_us, 3) for p in programs}) > 8  # the schedules differ in price
    keys = ("graph_launch_us", "sm_dram_bandwidth_GBps", "dram_latency_ns")
    result = fit_figures(programs, "h100", keys=keys)
    assert result.residual_before > 0.2 and result.residual < 0.02
    for key in keys:
        assert result.figures[key] == pytest.approx(getattr(truth, key), rel=0.1), key
    assert {c[0] for c in result.cases} == {p.case for p in programs}


def test_fit_figures_needs_enough_programs():
    from eqsat_mirage.cost.calibrate import Measured, fit_figures

    (name, mg), = _variants(1)
    with pytest.raises(em.MirageError, match="needs at least"):
        fit_figures([Measured(name, mg, 10.0)], "h100")


def test_a_fitted_calibration_is_written_and_read_back(tmp_path):
    from dataclasses import replace

    from eqsat_mirage.cost.calibrate import Measured, fit_figures, write_fitted

    base = GPUProfile.load("h100", measured=False).for_launch("graph")
    truth = replace(base, sm_dram_bandwidth_GBps=40.0, graph_launch_us=4.0,
                    launch_overhead_us=4.0)
    programs = [Measured(name, mg, t, t + 10.0 * len(mg.kernels))
                for name, mg in _variants() + _programs()
                if math.isfinite(t := mugraph_cost(mg, truth).total_us)]
    result = fit_figures(programs, "h100", keys=("graph_launch_us", "sm_dram_bandwidth_GBps"))
    folder = tmp_path / "extract"
    shutil.copytree(profiles_dir(), folder, ignore=shutil.ignore_patterns("*_measured.toml"))
    write_fitted(folder / "h100_measured.toml", result, "a test GPU")
    prof = GPUProfile.load(folder / "h100.toml")
    assert prof.sm_dram_bandwidth_GBps == pytest.approx(result.figures["sm_dram_bandwidth_GBps"],
                                                        rel=1e-5)
    assert prof.launch_overhead_us > prof.graph_launch_us  # plain launches: replay plus gap
    assert GPUProfile.load(folder / "h100.toml", measured=False).sm_dram_bandwidth_GBps == \
        GPUProfile.load("h100", measured=False).sm_dram_bandwidth_GBps
