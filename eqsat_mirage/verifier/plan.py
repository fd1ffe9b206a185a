"""What one ``em.verify`` call runs, as one value (``verify`` builds it, ``_decide`` reads it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrialPlan:
    """What one ``verify`` call runs (its arguments, ``run`` trials from seed ``base``)."""

    run: int
    seed: int | None
    base: int
    max_trials: int
    max_bound: float
    prime_bits: int
    avoid: frozenset | set
    max_redraws: int
    rtol: float
    float_check: bool
    native_check: bool
    float_first: bool
    threads: int | None = None  # trials at once (None: runner.THREADS): what fits the budget
    float_threads: int | None = None  # float checks at once, likewise
    # per phase ("trials", "floats"): (threads, bytes held) from the most threads down, for a
    # budget that worker processes share (``limits.reserved``)
    fits: dict | None = None
