"""What each pass of one search did, as typed records; ``res.stats`` is written from them.

Each pass of ``optimize`` returns its record (saturation, extraction, planning, compile
check, verification); ``SearchRecord`` gathers them and is ``res.passes``. Decisions
(is this result cut short by the time limit, so not cached?) read these fields, never
the human messages. ``write(stats)`` puts each record's figures into ``res.stats`` under
the keys the stats dict has always had, so ``res.stats`` stays a plain-data view.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SaturationRecord:
    """The saturate pass: seconds, each phase's figures, tensor e-nodes at the end."""

    seconds: float
    phases: list[dict]
    enodes: int

    def write(self, stats: dict) -> None:
        """Its ``res.stats`` entries."""
        stats["saturate_seconds"] = self.seconds
        stats["phases"] = self.phases
        stats["enodes"] = self.enodes


@dataclass
class ExtractionRecord:
    """The extract pass: its figures (``egraph.extract``'s stats) and candidates found."""

    figures: dict
    candidates: int = 0

    @property
    def seconds(self) -> float:
        """Seconds extraction took."""
        return float(self.figures.get("extract_seconds", 0.0))

    def write(self, stats: dict) -> None:
        """Its ``res.stats`` entries."""
        stats.update(self.figures)


@dataclass
class PlanningRecord:
    """Fusion planning: seconds, the candidates it failed on (with why), how many
    candidates the time limit left unplanned or planned in part (``skipped``), and the
    kernel levels ("block", "thread") whose saturation phase did not finish (``unsettled``:
    planned as if their rules allowed everything)."""

    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    skipped: int = 0
    unsettled: list[str] = field(default_factory=list)

    def write(self, stats: dict) -> None:
        """Its ``res.stats`` entries (``fusion_skipped`` and ``fusion_errors`` only when
        there are some)."""
        if self.skipped:
            stats["fusion_skipped"] = self.skipped
        stats["fusion_seconds"] = self.seconds
        if self.errors:
            stats["fusion_errors"] = list(self.errors)
        if self.unsettled:
            stats["unsettled_levels"] = list(self.unsettled)


@dataclass
class CompileRecord:
    """The compile check (``build.Builder``): what it built, refused and re-planned."""

    target: str
    builds: list[str]
    refused: list[str]
    replans: int
    compiles: int
    seconds: float
    skipped: int

    def as_stats(self) -> dict:
        """``res.stats["compiled"]``."""
        return {"target": self.target, "builds": list(self.builds),
                "refused": list(self.refused), "replans": self.replans,
                "compiles": self.compiles, "seconds": self.seconds, "skipped": self.skipped}


@dataclass
class VerificationRecord:
    """The verify pass: seconds, candidates verified, and whether the time limit ended it
    before a candidate verified (``timed_out``; ``note`` says so in words)."""

    seconds: float = 0.0
    tried: int = 0
    timed_out: bool = False
    note: str | None = None
    rejected: list[str] = field(default_factory=list)  # why each refused candidate was

    def time_out(self, note: str, overwrite: bool = True) -> None:
        """Record that the time limit ended verification; ``note`` says so in words (in
        place of an earlier note only when ``overwrite``)."""
        self.timed_out = True
        if overwrite or self.note is None:
            self.note = note


@dataclass
class TuningRecord:
    """The tuning pass (``tuning.tune``): the device, each timed candidate's median in
    microseconds (the eager form as "eager"), the one chosen, seconds, the candidates that
    did not run (with why) and how each was timed ("graph" replays or "plain" launches)."""

    device: str
    times_us: dict[str, float]
    chosen: str
    seconds: float
    errors: list[str] = field(default_factory=list)
    modes: dict[str, str] = field(default_factory=dict)

    def as_stats(self) -> dict:
        """``res.stats["tuned"]``."""
        return {"device": self.device, "times_us": dict(self.times_us), "chosen": self.chosen,
                "seconds": self.seconds, "errors": list(self.errors), "modes": dict(self.modes)}


@dataclass
class SearchRecord:
    """Every pass of one search (``res.passes``). A pass that did not run is None;
    ``search_timed_out``: nothing was extracted in time."""

    saturation: SaturationRecord | None = None
    extraction: ExtractionRecord | None = None
    planning: PlanningRecord | None = None
    compile: CompileRecord | None = None
    verification: VerificationRecord | None = None
    tuning: TuningRecord | None = None  # None: not tuned (no device: the model decided)
    search_timed_out: bool = False
    deadline_passed: bool = False

    @property
    def time_limited(self) -> bool:
        """Whether the time limit cut some pass short (such a result is not cached: it
        depends on the machine's load)."""
        return bool(self.deadline_passed or self.search_timed_out
                    or (self.planning is not None and self.planning.skipped)
                    or (self.compile is not None and self.compile.skipped)
                    or (self.verification is not None and self.verification.timed_out))

    def phase_seconds(self) -> dict:
        """Seconds per phase (``res.stats["phase_seconds"]``)."""
        out = {"saturate": self.saturation.seconds if self.saturation else 0.0,
               "extract": self.extraction.seconds if self.extraction else 0.0,
               "fusion": self.planning.seconds if self.planning else 0.0,
               "verify": self.verification.seconds if self.verification else 0.0}
        if self.tuning is not None:
            out["tune"] = self.tuning.seconds
        return out
