"""A search's options as one checked value, and its time budget.

``SearchOptions`` holds every keyword of ``em.optimize`` that can change one search's
result, ``EntryOptions`` the rest (progress, cache, partition, piece_ops, jobs); each field
states its default and its description once (``option``), and ``em.optimize``'s
signature and docstring (``optimize_signature``, ``options_doc``), the command line's
flags (``cli/parser.py``) and the cache key (``key_data()``) are made from them. Both are
frozen and checked when built: a bad value raises a ``MirageError`` naming the option.

``Budget`` is one search's deadline and the shares of it each pass may use (rule checks
30%, saturation 50%, extraction 70%, planning 85%, the compile check and verification
100% of ``time_limit_s``).

``VerifyPlan`` is how optimize verifies a candidate: trials, seed, bound, deadline, and
the input program's outputs, computed once and shared by every candidate's check.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..cost.profile import LAUNCH_MODES
from ..ir.errors import MirageError
from ..ir.limits import AUTO, MAX_SECONDS, SECONDS_RANGE, Deadline, program_work, resolve_time_limit
from ..partition.pieces import DEFAULT_PIECE_OPS
from ..verifier import blas

LEVELS = ("mugraph", "kernel")
DEFAULT_SPLITS = (4, 16, 64)  # Mirage's loop ranges: the j of user rules' (split n i j) facts
COUNTED = ("node_limit", "iter_limit", "k", "trials", "tune_candidates")  # positive integers
TUNE_MODES = ("auto", "model", "device")  # a resolved search's tune is "model" or "device:ID"
BASE_TIME_LIMIT_S = 600.0  # time_limit_s="auto": the cap of a program of toy size (searches
#   stop on work done in well under a tenth of it; the cap is there for the pathological)


def check_limits(**limits) -> None:
    """Every limit a positive number (ints where counted); a MirageError naming the first bad."""
    for name, value in limits.items():
        counted = name != "time_limit_s"
        if not counted and value == AUTO:
            continue
        ok = isinstance(value, int | float) and not isinstance(value, bool) and (
            isinstance(value, int) or not counted) and 0 < value < float("inf") and (
            counted or value <= MAX_SECONDS)
        if not ok:
            kind = "a positive integer" if counted else f"{SECONDS_RANGE} or {AUTO!r}"
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


def parse_time_limit(text: str) -> float | str:
    """A time limit as typed on the command line: seconds, or "auto" (an
    ``argparse.ArgumentTypeError`` otherwise)."""
    import argparse

    if text == AUTO:
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or 'auto', got {text!r}") from None


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


def option(default, doc: str, flag: str | None = None, **cli) -> Any:
    """A ``SearchOptions`` field: its default, its one description (``em.optimize``'s
    docstring and the command line's help are made from it) and, with ``flag``, the
    ``eqsat-mirage`` flag that sets it (``cli``: argparse keywords besides the default)."""
    return field(default=default, metadata={"doc": doc, "flag": flag, "cli": cli})


@dataclass(frozen=True)
class SearchOptions:
    """Every option of one search (``em.optimize``'s keywords but the ``EntryOptions``),
    each default and description stated once here, checked when built."""

    target: str | Path | object = option(
        "h100", "the hardware profile: a built-in name (h100, h200, a100; `eqsat-mirage "
        "targets`) or a .toml path", "--target")
    rules: object = option(
        ("rules",), "rule files and folders (\"rules\" is the built-in set); user files are "
        "checked for soundness first and an unsound rule is refused with a RuleError, and "
        "so is one the check cannot instantiate or decide (see allow_unchecked_rules)",
        "--rules", action="append", metavar="FILE")
    guards: bool = option(
        True, "abstract-expression guards on (False: every rewrite may add e-classes)",
        "--no-guards", action="store_false", help="switch off the abstract-expression guards")
    time_limit_s: float | str = option(
        AUTO, "wall-clock seconds for the whole call (within about 10%); \"auto\": 600 s for a "
        "program of toy size and more for a large one (limits.auto_time_limit, at most "
        "1800 s; the value used is res.stats[\"time_limit_s\"]). It is a cap: a search stops "
        "when its work is done (nodes, candidates, trials), so its result does not depend on "
        "the machine's load. Rule checks get up to 30% "
        "of it, saturation runs until 50%, extraction until 70%, fusion planning starts no "
        "plan after 85% (a refused candidate's re-plan excepted), the compile check and "
        "verification stop at 100%; a pass that "
        "reaches its share stops "
        "with what it has, and when no candidate verified in time the input is returned. A "
        "shape family's checks at its sizes have it again for each plan checked (at most 3)",
        "--time-limit", type=parse_time_limit, metavar="SECONDS")
    node_limit: int = option(200_000, "tensor e-nodes per saturation phase", "--node-limit",
                             type=int)
    iter_limit: int = option(12, "iterations per saturation phase", "--iter-limit", type=int)
    k: int = option(4, "candidates extracted (the k cheapest distinct forms)")
    trials: int = option(
        3, "finite-field trials per candidate, at least (more until max_bound holds)")
    seed: int | None = option(0, "the verifier's seed (None: fresh randomness)")
    split_factors: object = option(
        DEFAULT_SPLITS, "the j of the (split n i j) facts user rules may read (n = i * j)")
    level: str = option(
        "mugraph", "\"mugraph\": res.program is a MuGraph of fused custom kernels costed by "
        "gpucost; \"kernel\": a kernel-level Graph (algebra only), one kernel per op",
        "--level", choices=LEVELS)
    strategy: object = option(
        None, "the fusion.strategy.Strategy of candidate schedules (None: "
        "fusion.DEFAULT_STRATEGY); its loop ranges, block range and split switch are "
        "replaced by what the block rules allow")
    max_bound: float = option(
        1e-9, "the largest false-positive bound that counts as verified; an inconclusive "
        "candidate is never returned")
    allow_unchecked_rules: bool = option(
        False, "accept a user rule the soundness check cannot instantiate or decide")
    compile_check: bool | None = option(
        None, "build each candidate's Triton kernels for the target before verifying it "
        "(codegen.tune: sm_90a for h100/h200, sm_80 for a100; no GPU needed); a kernel that "
        "spills is rebuilt at other warp counts, one that cannot build cleanly sends its "
        "candidate back to the planner (res.stats[\"compiled\"]). None: on for a built-in "
        "target with Triton's NVIDIA compiler, unless $EQSAT_MIRAGE_COMPILE_CHECK is \"0\"")
    launch: str = option(
        "plain", "how the program will be launched, which prices every kernel launch: "
        "\"plain\" (from Python) or \"graph\" (replayed from a CUDA graph, as "
        "res.compile(cuda_graph=True) does)")
    allow_float_unsafe_rules: bool = option(
        False, "accept a user rule sound over the reals but unsafe in floating point "
        "(check_rules' \"sound, float-unsafe\": it drops a softmax's max, narrows a dtype)")
    tune: str = option(
        "auto", "\"auto\": with a CUDA device (or a timer given), the best tune_candidates "
        "verified plans and the eager form are timed on the device and the fastest wins "
        "(res.stats[\"tuned\"]); without one the cost model decides; \"model\": the "
        "model decides; \"device\": tune, and refuse to run without a device or timer",
        "--tune", choices=TUNE_MODES)
    tune_candidates: int = option(8, "verified plans timed on the device when tuning")

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
        if not isinstance(self.tune, str) or (self.tune not in TUNE_MODES
                                              and not self.tune.startswith("device:")):
            raise MirageError(f"optimize: tune must be one of {', '.join(TUNE_MODES)}, got "
                              f"{self.tune!r}")
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

    def tuned_on(self, timer) -> SearchOptions:
        """These options with ``tune`` decided: "device:<what the timer times on>" when
        tuning runs with ``timer``, else "model" (so a plan tuned on one device is a cache
        entry of its own, and a device's search never reuses a model-only one). A
        MirageError when ``tune="device"`` has no timer."""
        if self.tune == "model" or self.tune.startswith("device:"):
            return self
        if timer is None:
            if self.tune == "device":
                raise MirageError("optimize: tune='device' needs a CUDA device or a timer "
                                  "(tune='auto' lets the cost model decide without one)")
            return self.replace(tune="model")
        return self.replace(tune=f"device:{getattr(timer, 'key', timer.device)}")

    def key_data(self) -> dict:
        """The options as the results cache keys them: name -> value (``make_key`` takes
        each by its ``repr``; the target and rules by their files' contents)."""
        return {name: getattr(self, name) for name in self.names()}


DEFAULTS = SearchOptions()


@dataclass(frozen=True)
class EntryOptions:
    """``em.optimize``'s keywords that choose what feeds the search and how it reports,
    not what one search finds (so no part of the cache key), checked when built."""

    progress: object = option(
        None, "True prints a line to stderr at each step (phases, pieces, rejected "
        "candidates), a callable receives each line, None or False is quiet")
    cache: object = option(
        True, "True (the default results cache, pipeline/cache.py), a path, a ResultCache, "
        "or False/None (no cache); res.stats[\"cache\"] says \"hit\", \"miss\" or "
        "\"off\". A hit returns the stored result at once")
    partition: bool | str = option(
        "auto", "\"auto\" or True: a program that takes exp twice on a path or has more than "
        "piece_ops ops is cut into Lax pieces, each optimized and the programs stitched "
        "into one MuGraph (res.stats[\"pieces\"] reports every piece); False: searched as "
        "one piece")
    piece_ops: int = option(DEFAULT_PIECE_OPS, "the most ops of one piece")
    jobs: int | str = option(
        AUTO, "distinct pieces searched at once: \"auto\" is one per core in worker "
        "processes when the pieces are large (whole.auto_jobs), else 1")
    timer: object = option(
        None, "what times candidates when tuning (runtime.timing.Timer: timer(name, "
        "launch) -> microseconds per call, and its device; or a RecordedTimer of times "
        "measured on a GPU before, looked up by plan); None: CUDA events on the CUDA "
        "device when there is one")

    def __post_init__(self) -> None:
        for name in ("piece_ops", "jobs"):
            value = getattr(self, name)
            if name == "jobs" and value == AUTO:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise MirageError(f"optimize: {name} must be a positive integer"
                                  f"{' or auto' if name == 'jobs' else ''}, got {value!r}")
        if self.partition not in (True, False, "auto"):
            raise MirageError(f"optimize: partition must be True, False or 'auto', got "
                              f"{self.partition!r}")
        progress_fn(self.progress)  # a MirageError for a bad one

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The keyword names, in ``em.optimize``'s order."""
        return tuple(f.name for f in dataclasses.fields(cls))


def split_options(keywords: dict) -> tuple[SearchOptions, EntryOptions]:
    """``em.optimize``'s keywords as one checked ``SearchOptions`` and ``EntryOptions`` (a
    MirageError naming a keyword that is neither)."""
    search, entry = set(SearchOptions.names()), set(EntryOptions.names())
    unknown = sorted(set(keywords) - search - entry)
    if unknown:
        takes = ", ".join(SearchOptions.names() + EntryOptions.names())
        raise MirageError(f"optimize: unknown keyword(s) {', '.join(map(repr, unknown))}; "
                          f"optimize takes: {takes}")
    return (SearchOptions(**{k: v for k, v in keywords.items() if k in search}),
            EntryOptions(**{k: v for k, v in keywords.items() if k in entry}))


def optimize_signature(return_annotation) -> inspect.Signature:
    """``em.optimize``'s signature: the program, then every option of ``SearchOptions`` and
    ``EntryOptions`` as a keyword with its default (what ``help(em.optimize)`` shows)."""
    params = [inspect.Parameter("graph", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for cls in (SearchOptions, EntryOptions):
        params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                     annotation=f.type) for f in dataclasses.fields(cls)]
    return inspect.Signature(params, return_annotation=return_annotation)


def options_doc() -> str:
    """Each option's description, one paragraph a keyword (``em.optimize``'s docstring)."""
    lines = []
    for cls in (SearchOptions, EntryOptions):
        for f in dataclasses.fields(cls):
            words = textwrap.fill(f"{f.metadata['doc']}.", width=84,
                                  initial_indent="    ", subsequent_indent="    ")
            lines += [f"``{f.name}`` (default {f.default!r}):", words]
    return "\n".join(lines)


@dataclass(frozen=True)
class Budget:
    """One search's deadline and the share of it each pass may use (fractions of
    ``time_limit_s`` from the start of the search, a start that ``pause`` moves later)."""

    deadline: Deadline
    RULE_CHECKS: ClassVar[float] = 0.3
    SATURATION: ClassVar[float] = 0.5
    EXTRACTION: ClassVar[float] = 0.7
    # the compile check builds every plan it is given (at most the candidates and
    # ``build.MAX_REPLANS`` re-plans: work) until the search's own cap; at 70%, which
    # plans were built, and so which were refused, depended on how busy the machine was
    COMPILE_CHECK: ClassVar[float] = 1.0
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
        """Past this, a plan is verified without being built for the target: the search's
        own deadline (its cap), so a result does not depend on the clock below it."""
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

    def pause(self, seconds: float) -> None:
        """Every share moved ``seconds`` later: time spent on work bounded by a deadline
        of its own (``Search``'s gate), which the search's time limit does not count."""
        self.deadline.extend(seconds)


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
