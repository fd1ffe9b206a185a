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
    # per phase ("trials", "floats"): (threads, bytes held) from the most threads that fit
    # the memory budget down to one; the phase takes the most that fit what the other worker
    # processes sharing the budget leave (``limits.reserved``)
    fits: dict | None = None
    pairs: bool = True  # the float checks' pair draws (False: ``verify_without_pairs``)
