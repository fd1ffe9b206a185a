"""Timing candidates on the device: the runtime half of the search's measured tuning.

A ``Timer`` takes one candidate's launch (a callable of no arguments that runs it once on
fixed inputs) and returns the candidate's time per call in microseconds, one sample per
timed repetition; ``device`` names what it timed on (it joins the results cache's key, so a
plan tuned on one device is tuned again on another). ``CudaEventTimer`` is the real one:
warm-up launches, then the launch captured in a CUDA graph and each replay timed with CUDA
events (plain launches timed the same way where a capture fails, and said so in
``mode``). A test passes its own deterministic timer (``tests/pipeline/test_tuning.py``);
nothing here needs a GPU to be tested.

``time_candidates`` times each named launch with one timer, in the order given, and
returns a ``Timing`` per candidate (the median of its samples); ``fastest`` is the name of
the smallest median, the earlier one on a tie (the cost model's order), so the verdict
does not depend on dictionary or thread order. A group of candidates is timed holding the
device (``holding_device``: an exclusive lock on a file named after the timer's device, in
the temporary directory), so pieces searched in several worker processes (``jobs > 1``)
never time on one GPU at the same time: each measurement sees the device to itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import statistics
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..ir.errors import MirageError

WARMUP = 5  # launches before timing (Triton compiles and autotunes on the first)
REPEATS = 50  # timed replays per candidate


class Timer(Protocol):
    """Times one launch: ``timer(name, launch)`` -> per-call microseconds, one a sample."""

    device: str

    def __call__(self, name: str, launch: Callable[[], object]) -> Sequence[float]:
        """The samples of ``launch`` (named ``name`` in reports)."""


@dataclass(frozen=True)
class Timing:
    """One candidate as measured: its name, the median and every sample (microseconds)."""

    name: str
    median_us: float
    samples: tuple[float, ...]
    mode: str = "graph"  # "graph": CUDA-graph replays; "plain": launches from Python


def device_available() -> bool:
    """Whether a CUDA device is there to time on (torch imported here, not before)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def device_identity() -> str:
    """The device and the versions a measurement depends on: the GPU's name, torch, triton
    and the CUDA driver (a results-cache key part)."""
    import torch
    import triton

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return identity(name, torch.__version__, triton.__version__,
                    getattr(torch.version, "cuda", None) or "none")


def identity(name: str, torch_version, triton_version, cuda) -> str:
    """``device_identity``'s text for a device and versions named elsewhere (a GPU
    runner's results, say)."""
    return f"{name}|torch {torch_version}|triton {triton_version}|cuda {cuda}"


class CudaEventTimer:
    """The device's own timer: ``warmup`` launches, then ``repeats`` replays of the launch
    captured in a CUDA graph, each timed by a pair of CUDA events (plain launches where the
    capture fails; ``mode`` records which)."""

    def __init__(self, warmup: int = WARMUP, repeats: int = REPEATS) -> None:
        self.warmup, self.repeats = warmup, repeats
        self.device = device_identity()
        self.modes: dict[str, str] = {}

    def __call__(self, name: str, launch: Callable[[], object]) -> list[float]:
        """The samples of ``launch`` in microseconds."""
        import torch

        for _ in range(self.warmup):
            launch()
        torch.cuda.synchronize()
        step, mode = launch, "plain"
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                launch()
            step, mode = graph.replay, "graph"
        except RuntimeError:  # a launch that cannot be captured is timed as it is
            torch.cuda.synchronize()
        self.modes[name] = mode
        step()
        samples = []
        for _ in range(self.repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1000.0)  # ms -> us
        return samples


def device_lock_path(device: str) -> str:
    """The lock file of ``device`` (a timer's ``device`` string): one per device and user,
    in the temporary directory."""
    digest = hashlib.sha256(device.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"eqsat_mirage_timing_{os.getuid()}_{digest}.lock")


@contextlib.contextmanager
def holding_device(device: str) -> Iterator[None]:
    """Hold ``device`` for timing: an exclusive ``flock`` on its lock file, waited for and
    released on exit (where ``fcntl`` is missing, as on Windows, nothing is held)."""
    try:
        import fcntl
    except ImportError:  # no advisory locks here: measurements may overlap
        yield
        return
    with open(device_lock_path(device), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def time_candidates(launches: Mapping[str, Callable[[], object]], timer: Timer
                    ) -> list[Timing]:
    """Each launch timed by ``timer``, in the order given, holding the timer's device
    (``holding_device``): a ``Timing`` each."""
    out = []
    with holding_device(timer.device):
        for name, launch in launches.items():
            samples = tuple(float(s) for s in timer(name, launch))
            if not samples:
                raise ValueError(f"timer {type(timer).__name__} returned no samples for "
                                 f"{name!r}")
            mode = getattr(timer, "modes", {}).get(name, "graph")
            out.append(Timing(name, statistics.median(samples), samples, mode))
    return out


def fastest(timings: Sequence[Timing]) -> str:
    """The name of the smallest median; on a tie, the earlier in ``timings``."""
    best = min(range(len(timings)), key=lambda i: (timings[i].median_us, i))
    return timings[best].name


def plan_key(plan: Mapping) -> str:
    """The key a measured time is kept under: a digest of a MuGraph's plain data (its
    ``to_json``, read back) without its top-level name. The kernels' ``source`` fields
    still name the program the plan was searched for, so a plan matches where the same
    program (a piece of a whole program included) is searched again, as the GPU bundle's
    round trip does (docs/gpu.md, section 5)."""
    data = {k: v for k, v in plan.items() if k != "name"}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class RecordedTimer:
    """Times measured on a device before, looked up instead of launched: ``device`` is the
    device and versions they were measured on (``device_identity`` there), ``times_us``
    maps a plan's ``plan_key`` to its measured median. The search tunes with it as with
    the device's own timer (the fastest measured plan wins; a plan not measured is left
    out, and when none is, the model decides), so plans measured on a GPU machine without
    the search's dependencies choose a program here. ``load`` reads the JSON file that
    ``bench/gpu_bundle.py ingest --measured`` writes; nothing in it is executed."""

    device: str
    times_us: Mapping[str, float] = field(hash=False)

    @property
    def key(self) -> str:
        """What the results cache keys a plan tuned with these times by: the device and a
        digest of the times, so plans chosen by two files, or by the device itself, are
        cached apart (``SearchOptions.tuned_on``)."""
        text = json.dumps(dict(self.times_us), sort_keys=True)
        return f"{self.device}|recorded {hashlib.sha256(text.encode()).hexdigest()[:16]}"

    def __call__(self, name: str, launch: Callable[[], object]) -> Sequence[float]:
        """Never launched: the tuning pass reads ``recorded`` instead."""
        raise MirageError("a RecordedTimer times nothing: the tuning pass reads recorded()")

    def recorded(self, key: str) -> float | None:
        """The measured median of the plan whose ``plan_key`` is ``key``, or None."""
        return self.times_us.get(key)

    def to_json(self) -> str:
        """The file ``load`` reads."""
        return json.dumps({"device": self.device, "times_us": dict(self.times_us)},
                          indent=1, sort_keys=True)

    @classmethod
    def load(cls, path) -> RecordedTimer:
        """The timer of a file ``to_json`` wrote; a MirageError naming the file when it is
        not such a file (plain JSON: a device string and key -> positive microseconds)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            device, times = data["device"], data["times_us"]
            ok = isinstance(device, str) and isinstance(times, dict) and all(
                isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
                for k, v in times.items())
            times = {k: float(v) for k, v in times.items()} if ok else {}
        except (OSError, ValueError, KeyError, TypeError, RecursionError,
                OverflowError) as exc:
            raise MirageError(f"{path}: not a file of measured times ({exc})") from None
        if not ok or not all(0 < v < math.inf for v in times.values()):
            raise MirageError(f"{path}: not a file of measured times (a device string and "
                             "plan key -> positive microseconds)")
        return cls(device, times)
