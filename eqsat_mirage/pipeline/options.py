"""A search's options as one checked value, and its time budget.

``SearchOptions`` holds every keyword of ``em.optimize`` that can change its result
(everything but the program, ``progress`` and ``cache``), with the defaults stated once.
It is frozen and checked when built: a bad value raises a ``MirageError`` naming the
option. ``key_data()`` is the plain data the results cache hashes.

``Budget`` is one search's deadline and the shares of it each pass may use (rule checks
30%, saturation 50%, extraction 70%, the compile check 70%, planning 85%, verification
100% of ``time_limit_s``).

``VerifyPlan`` is how optimize verifies a candidate: trials, seed, bound, deadline, and
the input program's outputs, computed once and shared by every candidate's check.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ..cost.profile import LAUNCH_MODES
from ..ir.errors import MirageError
from ..ir.limits import AUTO, Deadline, program_work, resolve_time_limit
from ..verifier import blas

LEVELS = ("mugraph", "kernel")
DEFAULT_SPLITS = (4, 16, 64)  # Mirage's loop ranges: the j of user rules' (split n i j) facts
COUNTED = ("node_limit", "iter_limit", "k", "trials")  # positive integers
BASE_TIME_LIMIT_S = 60.0  # time_limit_s="auto": the limit of a program of toy size


def check_limits(**limits) -> None:
    """Every limit a positive number (ints where counted); a MirageError naming the first bad."""
    for name, value in limits.items():
        counted = name != "time_limit_s"
        if not counted and value == AUTO:
            continue
        ok = isinstance(value, int | float) and not isinstance(value, bool) and (
            isinstance(value, int) or not counted) and 0 < value < float("inf")
        if not ok:
            kind = ("a positive integer" if counted else
                    f"a positive finite number of seconds or {AUTO!r}")
            raise MirageError(f"optimize: {name} must be {kind}, got {value!r}")


def check_splits(split_factors) -> None:
    """``split_factors``: a sequence of integers >= 2 (a MirageError naming the bad one)."""
    if isinstance(split_factors, str) or not hasattr(split_factors, "__iter__"):
        raise MirageError(f"optimize: split_factors must be a sequence of integers >= 2, got "
                          f"{split_factors!r}")
    for f in split_factors:
        if not isinstance(f, int) or isinstance(f, bool) or f < 2:
            raise MirageError(f"optimize: split_factors must hold integers >= 2, got {f!r} in "
                              f"{tuple(split_factors)!r}")


def compile_check_default(target) -> bool:
    """Whether optimize builds the chosen kernels for ``target`` when not told: on for a
    built-in target with Triton's NVIDIA compiler, unless ``$EQSAT_MIRAGE_COMPILE_CHECK``
    is "0"."""
    from ..codegen.tune import can_tune

    return os.environ.get("EQSAT_MIRAGE_COMPILE_CHECK", "1") != "0" and can_tune(str(target))


def _flag(name: str, value, none_ok: bool = False) -> None:
    if not (isinstance(value, bool) or (none_ok and value is None)):
        kind = "True, False or None" if none_ok else "True or False"
        raise MirageError(f"optimize: {name} must be {kind}, got {value!r}")


@dataclass(frozen=True)
class SearchOptions:
    """Every option of one search (``em.optimize``'s keywords but ``progress`` and
    ``cache``; its docstring tells each), checked when built."""

    target: str | Path | object = "h100"
    rules: object = ("rules",)
    guards: bool = True
    time_limit_s: float | str = AUTO
    node_limit: int = 200_000
    iter_limit: int = 12
    k: int = 4
    trials: int = 3
    seed: int | None = 0
    split_factors: object = DEFAULT_SPLITS
    level: str = "mugraph"
    strategy: object = None
    max_bound: float = 1e-9
    allow_unchecked_rules: bool = False
    compile_check: bool | None = None
    launch: str = "plain"
    allow_float_unsafe_rules: bool = False

    def limit_for(self, graph) -> float:
        """``time_limit_s`` in seconds for a search of ``graph``: as given, or for "auto"
        ``BASE_TIME_LIMIT_S`` plus the program's work (``limits.auto_time_limit``). The
        cache key keeps "auto" itself, so a machine's measured speed never changes it."""
        return resolve_time_limit(self.time_limit_s, lambda: program_work(graph),
                                  BASE_TIME_LIMIT_S, blas.gflops)

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise MirageError(f"optimize: level must be one of {', '.join(LEVELS)}, got "
                              f"{self.level!r}")
        check_limits(time_limit_s=self.time_limit_s,
                     **{name: getattr(self, name) for name in COUNTED})
        check_splits(self.split_factors)
        _flag("guards", self.guards)
        _flag("allow_unchecked_rules", self.allow_unchecked_rules)
        _flag("allow_float_unsafe_rules", self.allow_float_unsafe_rules)
        _flag("compile_check", self.compile_check, none_ok=True)
        if self.seed is not None and (not isinstance(self.seed, int)
                                      or isinstance(self.seed, bool)):
            raise MirageError(f"optimize: seed must be an integer or None, got {self.seed!r}")
        if (not isinstance(self.max_bound, int | float) or isinstance(self.max_bound, bool)
                or not 0 < self.max_bound <= 1):
            raise MirageError(f"optimize: max_bound must be a number in (0, 1], got "
                              f"{self.max_bound!r}")
        if self.launch not in LAUNCH_MODES:
            raise MirageError(f"optimize: launch must be one of {', '.join(LAUNCH_MODES)}, "
                              f"got {self.launch!r}")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in ``em.optimize``'s order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def replace(self, **changes) -> SearchOptions:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    def resolved(self) -> SearchOptions:
        """These options with ``compile_check`` decided for the target when None."""
        if self.compile_check is not None:
            return self
        return self.replace(compile_check=compile_check_default(self.target))

    def key_data(self) -> dict:
        """The options as the results cache keys them: name -> value (``make_key`` takes
        each by its ``repr``; the target and rules by their files' contents)."""
        return {name: getattr(self, name) for name in self.names()}


DEFAULTS = SearchOptions()


@dataclass(frozen=True)
class Budget:
    """One search's deadline and the share of it each pass may use (fractions of
    ``time_limit_s`` from the start of the search)."""

    deadline: Deadline
    RULE_CHECKS: ClassVar[float] = 0.3
    SATURATION: ClassVar[float] = 0.5
    EXTRACTION: ClassVar[float] = 0.7
    COMPILE_CHECK: ClassVar[float] = 0.7
    PLANNING: ClassVar[float] = 0.85

    @classmethod
    def start(cls, time_limit_s: float, t0: float | None = None) -> Budget:
        """The budget of a search of ``time_limit_s`` seconds starting at ``t0`` (now)."""
        return cls(Deadline(time_limit_s, t0))

    @property
    def seconds(self) -> float:
        """The whole time limit."""
        return self.deadline.seconds

    def spent(self) -> float:
        """The fraction of the time limit used so far."""
        import time

        return (time.perf_counter() - self.deadline.start) / self.deadline.seconds

    def rule_checks(self) -> Deadline:
        """Until when user rules are checked for soundness."""
        return self.deadline.part(self.RULE_CHECKS)

    def saturation(self) -> Deadline:
        """The end of saturation."""
        return self.deadline.part(self.SATURATION)

    def share(self, fraction: float) -> Deadline:
        """The deadline at ``fraction`` of the time limit (one saturation phase's end)."""
        return self.deadline.part(fraction)

    def extraction(self) -> Deadline:
        """The end of extraction."""
        return self.deadline.part(self.EXTRACTION)

    def compile_check(self) -> Deadline:
        """Past this, a plan is verified without being built for the target."""
        return self.deadline.part(self.COMPILE_CHECK)

    def planning(self) -> Deadline:
        """Fusion planning starts no new plan after this."""
        return self.deadline.part(self.PLANNING)

    def verification(self) -> Deadline:
        """Verification stops here: the end of the search."""
        return self.deadline

    def expired(self) -> bool:
        """Whether the whole time limit has passed."""
        return self.deadline.expired()


@dataclass
class VerifyPlan:
    """How optimize verifies a candidate: at least ``trials`` trials, ``seed``, a bound of
    at most ``max_bound``, until ``deadline``; ``memo`` keeps the input's outputs."""

    trials: int
    seed: int | None
    max_bound: float
    deadline: Deadline
    memo: dict = field(default_factory=dict)

    @classmethod
    def of(cls, options: SearchOptions, budget: Budget) -> VerifyPlan:
        """The plan of a search with ``options`` under ``budget``."""
        return cls(options.trials, options.seed, options.max_bound, budget.verification())


def progress_fn(progress) -> Callable[[str], None] | None:
    """``optimize``'s ``progress``: None or False (quiet), True (one line per step to
    stderr) or a callable taking each line (a ``MirageError`` for anything else)."""
    if progress is None or progress is False:
        return None
    if progress is True:
        return _to_stderr
    if callable(progress):
        return progress
    raise MirageError(f"optimize: progress must be True, False, None or a callable taking a "
                      f"str, got {progress!r}")


def _to_stderr(text: str) -> None:
    print(f"eqsat-mirage: {text}", file=sys.stderr, flush=True)
