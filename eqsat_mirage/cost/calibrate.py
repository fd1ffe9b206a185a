"""Calibration: the cost model's figures fitted to times measured on a real GPU.

A sample is one program as the model prices it (a ``MuGraphCost``: launch, memory and
compute time of every kernel) and its measured times: ``graph_us`` replayed from a CUDA
graph (what ``bench/gpu_runner.py`` reports for every contestant) and, optionally,
``plain_us`` launched from Python. The model of a measured replay is::

    graph_us = kernels x G + a x (memory time of the memory-bound kernels)
                           + c x (compute time of the compute-bound kernels)

fitted by non-negative least squares over all samples (``fit``). ``G`` is the replay
cost per kernel (``graph_launch_us``); ``a`` and ``c`` scale the profile's bandwidths and
throughputs (every bandwidth divided by ``a`` and the DRAM latency multiplied by it, every
throughput divided by ``c``, so predicted memory and compute times scale by exactly ``a``
and ``c``). Plain launches add
``launch_overhead_us - G`` per kernel: the slope of ``plain_us - graph_us`` over the kernel
count (``plain_gap_per_kernel``; the intercept, host work per call, moves no choice).

``write_measured(path, ...)`` writes the fitted figures as the ``[calibration]`` table of
``extract/<gpu>_measured.toml`` (each with its fit as the comment above it, and every
sample's measured and predicted time); ``GPUProfile.load("<gpu>")`` reads that file when it
is there, so the next search prices kernels with the measured figures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..ir.errors import MirageError
from .gpucost import MuGraphCost
from .profile import GPUProfile, figure_error

MEMORY_KEYS = ("dram_achievable_fraction", "sm_dram_bandwidth_GBps", "block_dram_bandwidth_GBps",
               "block_l2_bandwidth_GBps", "l2_bandwidth_GBps")
LATENCY_KEYS = ("dram_latency_ns",)  # scaled up with the memory time, not down
COMPUTE_KEYS = ("tensor_achievable_fraction", "fp32_cuda_TFLOPs", "sfu_TOPs")


@dataclass(frozen=True)
class Sample:
    """One measured program: the model's breakdown and the times measured on the GPU."""

    case: str
    cost: MuGraphCost
    graph_us: float
    plain_us: float | None = None


@dataclass(frozen=True)
class Fit:
    """The fitted parameters, the figures they give, and how well they explain the samples."""

    graph_launch_us: float
    memory_scale: float
    compute_scale: float
    launch_overhead_us: float | None
    figures: dict[str, float]
    residual: float  # root-mean-square relative error of the fitted times
    samples: tuple[Sample, ...]

    def predict(self, s: Sample) -> float:
        """The fitted model's time for sample ``s`` (CUDA-graph replay)."""
        scales = (self.memory_scale, self.compute_scale)
        return float(_row(s.cost, scales) @ np.array([self.graph_launch_us, *scales]))


def _row(cost: MuGraphCost, scales: tuple[float, float] = (1.0, 1.0)) -> np.ndarray:
    """(launches, memory time of memory-bound kernels, compute time of compute-bound ones),
    each kernel's bound judged with its times scaled by ``scales`` (memory, compute)."""
    a, c = scales
    launches = sum(k.launch_us > 0 for k in cost.kernels)
    mem = sum(k.memory_us for k in cost.kernels if a * k.memory_us >= c * k.compute_us)
    comp = sum(k.compute_us for k in cost.kernels if c * k.compute_us > a * k.memory_us)
    return np.array([launches, mem, comp], dtype=float)


def plain_gap_per_kernel(gaps: list[tuple[int, float]]) -> float | None:
    """What one more kernel adds to a call launched from Python over its CUDA-graph replay:
    the slope of ``plain - graph`` over the kernel count, fitted with an intercept (the
    launcher's host work per call, the same for every plan, so it moves no choice: on the
    H200, 20-37 us per call and 3-10 us per kernel). None without two kernel counts."""
    if len({k for k, _ in gaps}) < 2:
        return None
    k = np.array([float(k) for k, _ in gaps])
    a = np.stack([np.ones_like(k), k], axis=1)
    (_, slope), *_ = np.linalg.lstsq(a, np.array([g for _, g in gaps]), rcond=None)
    return max(0.0, float(slope))


def fit(samples: list[Sample], profile: GPUProfile | str | Path = "h100") -> Fit:
    """Fit ``graph_launch_us`` and the memory and compute scales to ``samples`` (see the
    module docstring); the figures are ``profile``'s, rescaled. At least three samples with
    finite, positive times are needed, or a ``MirageError`` says what is missing."""
    from scipy.optimize import nnls

    prof = GPUProfile.load(profile).for_launch("plain")
    good = [s for s in samples if np.isfinite(s.graph_us) and s.graph_us > 0
            and np.isfinite(s.cost.total_us)]
    if len(good) < 3:
        raise MirageError(f"calibration needs at least 3 measured programs with finite times, "
                          f"got {len(good)} of {len(samples)}")
    y = np.array([s.graph_us for s in good])
    w = 1.0 / y  # relative error: a 3 us kernel counts as much as a 300 us one
    scales = (1.0, 1.0)
    for _ in range(8):  # a kernel's bound may change with the scales: refit until it does not
        a = np.stack([_row(s.cost, scales) for s in good])
        coef, _ = nnls(a * w[:, None], y * w)
        g, mem, comp = (float(x) for x in coef)
        new = (mem if mem > 0 else 1.0, comp if comp > 0 else 1.0)
        if new == scales:
            break
        scales = new
    if mem <= 0 or (comp <= 0 and a[:, 2].any()):
        raise MirageError("calibration: the measured times do not determine the memory and "
                          "compute scales (need memory-bound and compute-bound programs)")
    comp = comp if comp > 0 else 1.0  # no compute-bound sample: leave throughputs alone
    if g <= 0:
        raise MirageError("calibration: the fit gives no launch cost per kernel (the measured "
                          "times do not grow with the number of kernels); measure programs "
                          "with different kernel counts")
    figures = {"graph_launch_us": g}
    figures.update({k: getattr(prof, k) / mem for k in MEMORY_KEYS})
    figures.update({k: getattr(prof, k) * mem for k in LATENCY_KEYS})
    figures.update({k: getattr(prof, k) / comp for k in COMPUTE_KEYS})
    for frac, peaks in (("dram_achievable_fraction", ("dram_bandwidth_GBps",)),
                        ("tensor_achievable_fraction", ("fp16_tensor_TFLOPs",
                                                        "bf16_tensor_TFLOPs"))):
        if figures[frac] > 1.0:  # a fraction stays <= 1: the rest goes into the peak
            figures.update({k: getattr(prof, k) * figures[frac] for k in peaks})
            figures[frac] = 1.0
    slope = plain_gap_per_kernel([(int(_row(s.cost)[0]), s.plain_us - s.graph_us)
                                  for s in good if s.plain_us is not None
                                  and np.isfinite(s.plain_us)])
    launch = g + slope if slope is not None else None
    if launch is not None:
        figures["launch_overhead_us"] = max(launch, g)
    bad = [f"{k} = {v!r} is not {why}" for k, v in figures.items() if (why := figure_error(k, v))]
    if bad:  # the figures must make a loadable profile before anything is written
        raise MirageError(f"calibration: the fitted figures are not a valid profile: {bad[0]}")
    fitted = a @ coef
    residual = float(np.sqrt(np.mean(((fitted - y) / y) ** 2)))
    return Fit(g, mem, comp, launch, figures, residual, tuple(good))


def write_measured(path: str | Path, result: Fit, device: str, when: str = "") -> Path:
    """Write ``result`` as a measured-calibration file (``extract/<gpu>_measured.toml``)."""
    path = Path(path)
    n = len(result.samples)
    how = (f"fitted by eqsat_mirage.cost.calibrate on {n} programs measured on {device}"
           f"{' ' + when if when else ''}; rms relative error of the fit {result.residual:.1%}")
    lines = [f"# {how}", f'device = "{device}"', "", "[calibration]"]
    notes = {"graph_launch_us": "per kernel replayed from a CUDA graph",
             "launch_overhead_us": "per kernel launched from Python: graph replay plus the "
                                   "measured gap per extra kernel"}
    for key, value in result.figures.items():
        why = notes.get(key) or (
            f"x 1/{result.memory_scale:.3f}: measured memory time over predicted"
            if key in (*MEMORY_KEYS, "dram_bandwidth_GBps") else
            f"x {result.memory_scale:.3f}: measured memory time over predicted"
            if key in LATENCY_KEYS else
            f"x 1/{result.compute_scale:.3f}: measured compute time over predicted")
        lines += [f"# {why}", f"{key} = {value:.6g}"]
    lines.append("")
    for s in result.samples:
        lines += [f'[cases."{s.case}"]', f"kernels = {len(s.cost.kernels)}",
                  f"predicted_us = {s.cost.total_us:.3f}", f"measured_graph_us = {s.graph_us:.3f}"]
        if s.plain_us is not None:
            lines.append(f"measured_plain_us = {s.plain_us:.3f}")
        lines += [f"fitted_us = {result.predict(s):.3f}", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


# -- the figures themselves, fitted by re-pricing every program ------------------------------

# The figures a schedule's price turns on (launch, per-SM bandwidth and latency: Little's
# law for few blocks, the achievable fractions of the chip's peaks), fitted together.
FIGURE_KEYS = ("graph_launch_us", "sm_dram_bandwidth_GBps", "dram_latency_ns",
               "dram_achievable_fraction", "tensor_achievable_fraction")
_FRACTIONS = ("dram_achievable_fraction", "tensor_achievable_fraction")


@dataclass(frozen=True)
class Measured:
    """One measured program with its MuGraph, so that a fit can re-price it."""

    case: str
    mugraph: object  # a MuGraph (kept untyped here: cost/ sits below mugraph/ in imports)
    graph_us: float
    plain_us: float | None = None


@dataclass(frozen=True)
class FigureFit:
    """Figures fitted by re-pricing every program; each case's measured, datasheet-priced and
    fitted time; the rms relative error before and after."""

    figures: dict[str, float]
    residual: float
    residual_before: float
    cases: tuple[tuple[str, int, float, float, float, float | None], ...]  # case, kernels,
    # measured graph us, predicted before, fitted, measured plain us


def _priced(programs: list[Measured], prof: GPUProfile) -> np.ndarray:
    from .gpucost import mugraph_cost

    return np.array([mugraph_cost(p.mugraph, prof).total_us for p in programs])


def _with(prof: GPUProfile, keys: tuple[str, ...], logs: np.ndarray) -> GPUProfile:
    from dataclasses import replace

    values = {k: float(np.exp(np.clip(v, -40.0, 40.0))) for k, v in zip(keys, logs)}  # > 0
    values.update({k: min(values[k], 1.0) for k in _FRACTIONS if k in values})
    if "graph_launch_us" in values:  # priced as replays: every launch costs the replay's
        values["launch_overhead_us"] = values["graph_launch_us"]
    return replace(prof, **values)


# Start points of the fit, as factors of the datasheet figure: a per-SM bandwidth cap and a
# latency term bind only past some value, and the gradient is zero until they do.
_START_FACTORS = {"sm_dram_bandwidth_GBps": (1.0, 0.5, 0.25),
                  "block_dram_bandwidth_GBps": (1.0, 0.25),
                  "block_l2_bandwidth_GBps": (1.0, 0.4), "dram_latency_ns": (1.0, 2.0)}


def _starts(keys: tuple[str, ...]) -> list[np.ndarray]:
    from itertools import product

    grids = [_START_FACTORS.get(k, (1.0,)) for k in keys]
    return [np.log(np.array(f)) for f in product(*grids)]


def fit_figures(programs: list[Measured], profile: GPUProfile | str | Path = "h100",
                keys: tuple[str, ...] = FIGURE_KEYS, max_evals: int = 80) -> FigureFit:
    """Fit ``keys`` of ``profile`` (its datasheet figures: a measured calibration beside it
    is not read) to measured CUDA-graph replay times by nonlinear least
    squares on the relative error, every program re-priced by ``gpucost`` at each step (the
    figures move each kernel's bound and its latency term, which scales alone cannot). A
    program the model calls infeasible is left out (it ran, so the model is wrong there:
    the caller reports it). ``launch_overhead_us`` (plain launches) is the fitted replay
    cost plus the measured plain-launch gap per kernel (``plain_gap_per_kernel``)."""
    from scipy.optimize import least_squares

    prof = GPUProfile.load(profile, measured=False).for_launch("graph")
    before = _priced(programs, prof)
    good = [p for p, t in zip(programs, before) if np.isfinite(t) and p.graph_us > 0]
    if len(good) < len(keys) + 2:
        raise MirageError(f"a fit of {len(keys)} figures needs at least {len(keys) + 2} "
                          f"measured programs the model can price, got {len(good)}")
    y = np.array([p.graph_us for p in good])
    x0 = np.log([getattr(prof, k) or RANK_STARTS.get(k, 1.0) for k in keys])
    found = None
    for shift in _starts(keys):  # caps (min of two rates) leave the objective flat where a
        found = min(found, least_squares(  # cap does not bind: start on either side of it
            lambda x: (_priced(good, _with(prof, keys, x)) - y) / y, x0 + shift,
            diff_step=0.05, max_nfev=max_evals), key=lambda r: np.inf if r is None else r.cost)
    fitted_prof = _with(prof, keys, found.x)
    fitted, start = _priced(good, fitted_prof), _priced(good, prof)
    figures = {k: getattr(fitted_prof, k) for k in keys}
    slope = plain_gap_per_kernel([(len(p.mugraph.kernels), p.plain_us - p.graph_us)
                                  for p in good if p.plain_us is not None
                                  and np.isfinite(p.plain_us)])
    if slope is not None and "graph_launch_us" in figures:
        figures["launch_overhead_us"] = figures["graph_launch_us"] + slope
    bad = [f"{k} = {v!r} is not {why}" for k, v in figures.items() if (why := figure_error(k, v))]
    if bad:
        raise MirageError(f"calibration: the fitted figures are not a valid profile: {bad[0]}")
    rms = lambda t: float(np.sqrt(np.mean(((t - y) / y) ** 2)))  # noqa: E731
    cases = tuple((p.case, len(p.mugraph.kernels), p.graph_us, float(b), float(f), p.plain_us)
                  for p, b, f in zip(good, start, fitted))
    return FigureFit(figures, rms(fitted), rms(start), cases)


def write_fitted(path: str | Path, result: FigureFit, device: str, when: str = "") -> Path:
    """Write ``result`` as a measured-calibration file (``extract/<gpu>_measured.toml``),
    each figure with how it was found, and every case's measured and fitted times."""
    path = Path(path)
    how = (f"fitted by eqsat_mirage.cost.calibrate.fit_figures on {len(result.cases)} programs "
           f"measured on {device}{' ' + when if when else ''} (CUDA-graph replays); rms "
           f"relative error {result.residual_before:.1%} before the fit, {result.residual:.1%} "
           f"after")
    lines = [f"# {how}", f'device = "{device}"', "", "[calibration]"]
    for key, value in result.figures.items():
        why = ("per kernel launched from Python: the fitted replay cost plus the "
               "measured gap per extra kernel" if key == "launch_overhead_us"
               else "fitted (nonlinear least squares, every program re-priced)")
        lines += [f"# {why}", f"{key} = {value:.6g}"]
    lines.append("")
    for case, kernels, graph_us, before, fitted, plain_us in result.cases:
        lines += [f"[cases.{json.dumps(case)}]", f"kernels = {kernels}",
                  f"predicted_us = {before:.3f}", f"measured_graph_us = {graph_us:.3f}"]
        if plain_us is not None:
            lines.append(f"measured_plain_us = {plain_us:.3f}")
        lines += [f"fitted_us = {fitted:.3f}", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


# -- ranking: how well the model orders the schedules of one measured sweep ----------------

# The figures a ranking fit moves: FIGURE_KEYS, what one block streams at most from DRAM and
# through L2 (equal to the per-SM figure, so off, in the datasheet profiles; the H100 q_s128
# sweep's many-block schedules re-read x from L2), the L2 hit bandwidth (re-read tiles), and
# three effects the sweeps showed, each 0 (off) in the datasheet profiles, so a fit starts
# them from RANK_STARTS: the DRAM latency a loop iteration waits beyond what its stages - 1
# iterations in flight hide (the H100's F=172 loops: 63 us at 4 stages, 136-143 us at 2),
# rows not 16-byte aligned (172- and 86-wide fp16 chunks, 2.2-2.5x slower on the H100), and
# a cost per contiguous run (the H200's 16-wide rmsnorm tiles, 2x slower than 64-wide ones).
# ``loop_iteration_us``, ``padded_load_exponent`` and ``short_run_exponent`` stay figures
# (off) but are not fitted: the three above explain the same sweeps with a physical cause
# (a padded 688-wide chunk, 16-byte aligned, ran as fast as a 256-wide one).
RANK_KEYS = (*FIGURE_KEYS, "block_dram_bandwidth_GBps", "block_l2_bandwidth_GBps",
             "l2_bandwidth_GBps", "iteration_latency_us", "unaligned_load_exponent",
             "run_overhead_bytes")
RANK_STARTS = {"loop_iteration_us": 0.3, "padded_load_exponent": 1.0, "short_run_exponent": 0.5,
               "iteration_latency_us": 0.5, "unaligned_load_exponent": 0.5,
               "run_overhead_bytes": 128.0}


@dataclass(frozen=True)
class SweepRank:
    """One sweep (the schedules of one case timed in one run on one device) re-priced:
    its size, the Spearman rank correlation of predicted against measured times, and the
    median of |predicted / measured - 1|."""

    sweep: str
    programs: int
    rank_correlation: float
    median_error: float


def spearman(xs, ys) -> float:
    """Spearman's rank correlation of two equally long sequences (ties take their mean
    rank); nan for fewer than two values or a constant sequence."""
    from scipy.stats import rankdata

    if len(xs) < 2:
        return float("nan")
    rx, ry = rankdata(xs), rankdata(ys)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def held_out(sweeps: list[str]) -> set[str]:
    """The held-out half of ``sweeps`` (a fixed split, the same on every machine): sorted
    by the CRC-32 of their names, every second one from the second on."""
    import zlib

    order = sorted(sweeps, key=lambda s: (zlib.crc32(s.encode()), s))
    return set(order[1::2])


def rank_sweep(name: str, programs: list[Measured], prof: GPUProfile) -> SweepRank:
    """Re-price ``programs`` (one sweep) with ``prof`` as CUDA-graph replays."""
    priced = _priced(programs, prof.for_launch("graph"))
    measured = np.array([p.graph_us for p in programs])
    ok = np.isfinite(priced)
    err = np.abs(priced[ok] / measured[ok] - 1.0)
    return SweepRank(name, int(ok.sum()), spearman(priced[ok], measured[ok]),
                     float(np.median(err)) if err.size else float("nan"))
