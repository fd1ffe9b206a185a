"""GPU hardware profiles: the figures of one GPU, each with its source, and calibration.

A profile is a TOML file in extract/ (``h100.toml``, ``a100.toml``, ``h200.toml``) or
anywhere (``target="path/to/gpu.toml"``). ``[figures]`` gives every key of
``GPUProfile.keys()``, each with a comment above it naming its source (datasheet, measured,
or an assumption until calibrated); ``GPUProfile.sources`` keeps those comments.
``[calibration]`` (empty by default) overrides figures key by key with measured values and
the same units. ``cost.Hardware`` reads the same files (a subset of the keys).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path

from ..ir.errors import MirageError

THREADS_PER_BLOCK = 128  # num_warps=4, emitted in every launch (codegen/kernel.py)
NUM_WARPS = THREADS_PER_BLOCK // 32
NUM_STAGES = 2  # default software-pipelining depth (tiles.stages_for: 4 for loops of small
                # tiles); gpucost counts an fmap input tile once per stage
REGS_PER_THREAD = 128  # assumption: a tensor-core Triton kernel uses ~128 registers per thread
LAUNCH_MODES = ("plain", "graph")
MEASURED_SUFFIX = "_measured"  # extract/<gpu>_measured.toml: calibration fitted on that GPU
_FRACTIONS = ("dram_achievable_fraction", "tensor_achievable_fraction",
              "replicated_read_dram_fraction")
# figures that may be 0 (an effect the datasheet does not know: off until fitted)
NON_NEGATIVE = ("loop_iteration_us", "padded_load_exponent", "short_run_exponent",
                "iteration_latency_us", "unaligned_load_exponent", "run_overhead_bytes")


def profiles_dir() -> Path:
    """The folder holding the built-in hardware profiles."""
    try:
        path = Path(str(resources.files("eqsat_mirage.extract")))
        if (path / "h100.toml").exists():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parents[2] / "extract"


def builtin_profiles() -> list[Path]:
    """The built-in profiles' files, by name (a ``*_measured.toml`` beside one is its
    calibration, not a target of its own)."""
    return sorted(p for p in profiles_dir().glob("*.toml")
                  if not p.stem.endswith(MEASURED_SUFFIX))


def profile_path(target: str | Path) -> Path:
    """The TOML file of a target: a .toml path, or a built-in profile's name."""
    path = Path(target)
    if path.suffix != ".toml":
        path = profiles_dir() / f"{target}.toml"
    if not path.is_file():
        known = ", ".join(p.stem for p in builtin_profiles())
        raise MirageError(f"unknown target {str(target)!r}: no profile {path} "
                          f"(built-in targets: {known})")
    return path


@dataclass(frozen=True)
class GPUProfile:
    """One GPU's figures (units in the names); ``sources`` holds each figure's comment."""

    dram_bandwidth_GBps: float  # noqa: N815 - units in the names
    fp16_tensor_TFLOPs: float  # noqa: N815
    bf16_tensor_TFLOPs: float  # noqa: N815
    fp32_cuda_TFLOPs: float  # noqa: N815
    boost_clock_MHz: float  # noqa: N815
    sfu_TOPs: float  # noqa: N815
    sms: int
    smem_per_sm_KiB: float  # noqa: N815
    smem_per_block_KiB: float  # noqa: N815
    registers_per_sm: int
    l2_MiB: float  # noqa: N815
    max_threads_per_sm: int
    max_blocks_per_sm: int
    launch_overhead_us: float
    graph_launch_us: float
    dram_achievable_fraction: float
    tensor_achievable_fraction: float
    sm_dram_bandwidth_GBps: float  # noqa: N815
    dram_latency_ns: float
    block_dram_bandwidth_GBps: float  # noqa: N815
    replicated_read_dram_fraction: float
    l2_bandwidth_GBps: float  # noqa: N815
    loop_iteration_us: float = 0.0  # per loop iteration of a block, beside its bytes (>= 0)
    padded_load_exponent: float = 0.0  # memory time x (padded / loaded tile)^this (>= 0)
    short_run_exponent: float = 0.0  # memory time x (128 B / a tile's row run)^this (>= 0)
    iteration_latency_us: float = 0.0  # a loop iteration's wait on DRAM, / (stages - 1) (>= 0)
    unaligned_load_exponent: float = 0.0  # memory time x (16 B / a row's alignment)^this (>= 0)
    run_overhead_bytes: float = 0.0  # each contiguous run costs as many more bytes (>= 0)
    block_l2_bandwidth_GBps: float = 100.0  # noqa: N815 - one block's loads through L2 at most
    name: str = "gpu"
    description: str = ""
    path: str = ""
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    calibrated: tuple[str, ...] = ()
    launch_mode: str = "plain"
    measured: str = field(default="", compare=False)  # the measured calibration applied

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The figure keys every profile's [figures] table must give."""
        return tuple(f.name for f in fields(cls) if f.type in ("float", "int"))

    @classmethod
    def load(cls, target: str | Path | GPUProfile = "h100", measured: bool = True
             ) -> GPUProfile:
        """Load a profile by name (extract/NAME.toml) or from a .toml path; calibration
        applied, and the measured calibration beside it (``NAME_measured.toml``) unless
        ``measured`` is False (a new fit starts from the datasheet)."""
        if isinstance(target, GPUProfile):
            return target
        path = profile_path(target)
        text, data = _read(path)
        figs, calib = data.get("figures"), data.get("calibration", {})
        if not isinstance(figs, dict) or not isinstance(calib, dict):
            raise MirageError(f"{path}: a hardware profile needs a [figures] table (and "
                              "optionally a [calibration] table)")
        sources, applied = _sources(text), ""
        measured_file = path.with_name(f"{path.stem}{MEASURED_SUFFIX}.toml")
        if measured and measured_file.is_file():  # fitted on a real GPU: overrides the rest
            mtext, mdata = _read(measured_file)
            fitted = mdata.get("calibration", {})
            if not isinstance(fitted, dict):
                raise MirageError(f"{measured_file}: [calibration] must be a table of figures")
            _check_keys(measured_file, fitted)
            calib = {**calib, **fitted}
            applied = str(measured_file)
            sources.update({k: f"measured ({measured_file.name}): {v}"
                            for k, v in _sources(mtext, "calibration").items() if k in fitted})
        keys = cls.keys()
        _check_keys(path, calib)
        values = {}
        for f in fields(cls):
            if f.name not in keys:
                continue
            if f.name not in figs:
                raise MirageError(f"{path}: [figures] lacks key {f.name!r}")
            table = "calibration" if f.name in calib else "figures"
            v = calib.get(f.name, figs[f.name])
            want = figure_error(f.name, v)
            if want:
                raise MirageError(f"{path}: [{table}] key {f.name!r} = {v!r} is not {want}")
            values[f.name] = int(v) if f.type == "int" else float(v)
        return cls(**values, name=str(data.get("name", path.stem)),
                   description=str(data.get("description", "")), path=str(path),
                   sources=sources, calibrated=tuple(calib), measured=applied)

    def datasheet(self) -> GPUProfile:
        """This profile without the measured calibration beside its file (``load``'s
        ``measured=False``), in the same launch mode; itself when none was applied."""
        if not self.measured:
            return self
        return GPUProfile.load(self.path, measured=False).for_launch(self.launch_mode)

    def for_launch(self, mode: str) -> GPUProfile:
        """This profile priced for launch ``mode``: "plain" (a launch from Python,
        ``launch_overhead_us``) or "graph" (replayed from a CUDA graph, ``graph_launch_us``,
        which then is the ``launch_overhead_us`` every kernel pays)."""
        if mode not in LAUNCH_MODES:
            raise MirageError(f"launch must be one of {', '.join(LAUNCH_MODES)}, got {mode!r}")
        if mode == self.launch_mode:
            return self
        base = self if self.launch_mode == "plain" else GPUProfile.load(self.path or self.name)
        if mode == "plain":
            return base
        return replace(base, launch_overhead_us=base.graph_launch_us, launch_mode=mode)

    def tensor_peak(self, dtype: str) -> float:
        """Dense tensor-core peak for ``dtype`` in FLOPs per microsecond."""
        return (self.bf16_tensor_TFLOPs if dtype == "bfloat16" else self.fp16_tensor_TFLOPs) * 1e6

    def blocks_per_sm_cap(self, threads: int = THREADS_PER_BLOCK) -> int:
        """Resident blocks per SM before shared memory: block, thread and register limits,
        for blocks of ``threads`` threads."""
        return max(1, min(self.max_blocks_per_sm, self.max_threads_per_sm // threads,
                          self.registers_per_sm // (threads * REGS_PER_THREAD)))


def figure_error(key: str, value) -> str:
    """What figure ``key`` must be when ``value`` is not that (a fraction in (0, 1], a
    positive float, a positive int), else ""."""
    kind = {f.name: f.type for f in fields(GPUProfile)}[key]
    ok = isinstance(value, int | float) and not isinstance(value, bool) and \
        (0 <= value if key in NON_NEGATIVE else 0 < value) and value < math.inf and \
        (kind == "float" or float(value).is_integer())
    if not ok or (key in _FRACTIONS and value > 1):
        return ("a fraction in (0, 1]" if key in _FRACTIONS else
                f"a non-negative {kind}" if key in NON_NEGATIVE else f"a positive {kind}")
    return ""


def _check_keys(path: Path, calibration: dict) -> None:
    """Every key of a [calibration] table read from ``path`` is a figure."""
    keys = GPUProfile.keys()
    for key in calibration:
        if key not in keys:
            raise MirageError(f"{path}: [calibration] key {key!r} is not a figure "
                              f"(figures: {', '.join(keys)})")


def _read(path: Path) -> tuple[str, dict]:
    """The text and parsed TOML of a profile file (a MirageError naming it when bad)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise MirageError(f"{path}: a hardware profile must be UTF-8 TOML text (byte "
                          f"{exc.object[exc.start]:#04x} at offset {exc.start})") from None
    except OSError as exc:
        raise MirageError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MirageError(f"{path}: malformed hardware profile: {exc}") from None


def _sources(text: str, wanted: str = "figures") -> dict[str, str]:
    """The comment lines right above each ``key = value`` of table ``wanted``."""
    out, notes, table = {}, [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            table, notes = line.strip("[] "), []
        elif line.startswith("#"):
            notes.append(line.lstrip("# "))
        elif "=" in line and table == wanted:
            out[line.split("=")[0].strip()], notes = " ".join(notes), []
        elif not line:
            notes = []
    return out
