"""The tuning pass: the best verified candidates and the eager form, timed on the device.

Where a timer is there (``tune="auto"`` with a CUDA device, or a timer given to
``em.optimize``), a search verifies up to ``tune_candidates`` plans, cheapest first by the
cost model, instead of stopping at the first. ``tune`` then compiles each verified plan
and the program's eager form (one kernel per op: torch's own kernels, what the search
returns when nothing beats it), runs each once with its first launch checked against the
input program run by torch (a candidate whose build or check fails is dropped, with why),
and times the rest with the timer (``runtime.timing``: CUDA-graph replays, the median) on
one set of inputs drawn for the program. The fastest wins; so a tuned piece is never
slower than its eager form on that device. ``TuningRecord`` (``res.passes.tuning``, and
``res.stats["tuned"]``) keeps every candidate's measured time.

With a ``RecordedTimer`` (times measured on a GPU machine before, keyed by plan) nothing is
launched: ``recorded_tuning`` looks each plan up and the fastest measured wins, which is how
a plan is chosen by measurement where the search and the GPU are on different machines
(``bench/gpu_bundle.py export --measured``, docs/gpu.md).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence

from ..codegen.source import compile_mugraph
from ..ir.errors import MirageError, unexpected
from ..runtime.timing import (
    CudaEventTimer,
    RecordedTimer,
    Timer,
    Timing,
    device_available,
    fastest,
    plan_key,
    time_candidates,
)
from ..semantics.torch_reference import checked_against
from .records import TuningRecord

EAGER = "eager"  # the name the eager form is timed under


def no_gpu_driver() -> bool:
    """Whether this is a Linux machine without a GPU driver loaded (no
    ``/proc/driver/nvidia``, no ``/dev/kfd``) and torch is not imported yet: then no CUDA
    device can be there, and asking torch (importing it: 6-19 s on a loaded 2-core
    machine, inside the first search's time limit) is skipped."""
    return (sys.platform.startswith("linux") and "torch" not in sys.modules
            and not os.path.exists("/proc/driver/nvidia") and not os.path.exists("/dev/kfd"))


def default_timer() -> Timer | None:
    """The device's timer when a CUDA device is there, else None (the model decides)."""
    if no_gpu_driver():
        return None
    return CudaEventTimer() if device_available() else None


def tuning_inputs(graph, seed: int = 0) -> dict:
    """One set of inputs for ``graph`` on the timing device (CUDA when there is one):
    standard normal values scaled by 1/2 in each input's dtype, random booleans for masks."""
    import torch

    device = "cuda" if device_available() else "cpu"
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, node in graph.inputs.items():
        shape = tuple(int(d) for d in node.shape)
        if node.dtype == "bool":
            value = torch.rand(shape, generator=gen) < 0.5
        else:
            value = (torch.randn(shape, generator=gen) * 0.5).to(getattr(torch, node.dtype))
        out[name] = value.to(device)
    return out


def tune(graph, candidates: Sequence[tuple[str, object]], eager, timer: Timer,
         progress=None) -> TuningRecord:
    """Time each of ``candidates`` ((name, verified MuGraph), cheapest by the model first)
    and ``eager`` (the program one kernel per op) with ``timer``; the record names the
    fastest (``chosen``: a candidate's name or ``EAGER``)."""
    if isinstance(timer, RecordedTimer):
        return recorded_tuning(candidates, eager, timer, progress)
    t0 = time.perf_counter()
    inputs = tuning_inputs(graph)
    launches, errors = {}, []
    for name, mg in [*candidates, (EAGER, eager)]:
        try:
            run = checked_against(compile_mugraph(mg), graph, list(graph.inputs), mugraph=mg)
            run(**inputs)  # the first launch, checked against torch
        except Exception as exc:  # this candidate does not run here: dropped, with why
            if unexpected(exc):
                raise
            why = str(exc) if isinstance(exc, MirageError) else f"{type(exc).__name__}: {exc}"
            errors.append(f"{name}: {why}"[:500])
            if progress:
                progress(f"tuning: {name} dropped ({why[:200]})")
            continue
        launches[name] = (lambda run=run: run(**inputs))
    if not launches:
        return TuningRecord(timer.device, {}, EAGER, time.perf_counter() - t0, errors)
    timings = time_candidates(launches, timer)
    chosen = fastest(timings)
    times = {t.name: t.median_us for t in timings}
    if progress:
        progress("tuning on " + timer.device.split("|")[0] + ": " + ", ".join(
            f"{n} {us:.2f} us" for n, us in times.items()) + f"; {chosen} chosen")
    return TuningRecord(timer.device, times, chosen, time.perf_counter() - t0, errors,
                        {t.name: t.mode for t in timings})


def recorded_tuning(candidates: Sequence[tuple[str, object]], eager, timer: RecordedTimer,
                    progress=None) -> TuningRecord:
    """``tune`` with times measured before (a ``RecordedTimer``): each candidate and the
    eager form looked up by its ``plan_key``; the fastest of those measured wins (the
    earlier on a tie), and one not measured is left out with why. When none was measured
    the model's pick (the first candidate) stands, and the record says so."""
    t0 = time.perf_counter()
    timings, errors = [], []
    for name, mg in [*candidates, (EAGER, eager)]:
        us = timer.recorded(plan_key(json.loads(mg.to_json())))
        if us is None:
            errors.append(f"{name}: not measured on {timer.device.split('|')[0]}")
        else:
            timings.append(Timing(name, us, (us,), "recorded"))
    times = {t.name: t.median_us for t in timings}
    chosen = fastest(timings) if timings else (candidates[0][0] if candidates else EAGER)
    if progress:
        progress("tuning by times measured on " + timer.device.split("|")[0] + ": " + (
            ", ".join(f"{n} {us:.2f} us" for n, us in times.items()) or "none of the plans")
            + f"; {chosen} chosen")
    return TuningRecord(timer.device, times, chosen, time.perf_counter() - t0, errors,
                        {t.name: t.mode for t in timings})
