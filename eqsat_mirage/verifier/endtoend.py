"""The end-to-end float check of a stitched whole program.

Each Lax piece of a partitioned program is verified on its own (finite-field
trials plus float checks); ``float_check`` runs the same float checks
(float64 at several scales and the native-dtype draws of docs/verifier.md,
section 4) once more on the whole program against the stitched one. It needs
no Lax fragment: programs that take exp twice are evaluated as they are. On the
native constant draws (every input one value) only finiteness counts: a layer norm
sees a variance of 0 there, and rounding noise that a deep program amplifies by
1/sqrt(eps) is not a wrong program (each piece had the full check on its own). The same
holds where a normal native draw finds a difference and rounding alone decides the whole
program's output on it (moving every input by one unit in the last place moves the
float64 output past the tolerance: N(0, 1) weights at hidden 512 give attention logits
in the thousands, where float16's spacing is as large as the gap between a row's two
largest); the message names those draws.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from ..ir.errors import MirageError, TimeLimitError
from ..ir.limits import Deadline, programs_fixed, reserved
from .floatcheck import Counterexample, float_checks
from .memory import float_parts, threads_that_fit
from .runner import THREADS, runner
from .verify import match_interfaces


@dataclass(frozen=True)
class FloatCheck:
    """What ``float_check`` found: a ``counterexample`` (None when none was found);
    ``cut_short``: the time limit stopped it (then nothing is proven); ``native``: the
    native-dtype draws ran; ``message``: what ran, in words, for reports; ``over_budget``:
    not run, the memory budget refused it (its caller's record: nothing is proven)."""

    counterexample: Counterexample | None
    cut_short: bool
    native: bool
    seconds: float
    message: str
    over_budget: bool = False

    @property
    def passed(self) -> bool:
        """Whether it ran to the end and found no difference."""
        return self.counterexample is None and not self.cut_short and not self.over_budget


def float_check(a, b, seed: int | None = 0, rtol: float = 1e-7, native: bool = True,
                time_limit_s: float | Deadline | None = None,
                peaked: Collection[str] | None = None, only: tuple | None = None) -> FloatCheck:
    """``b`` against ``a`` on random float inputs (float64, and native dtype when
    ``native``); a ``FloatCheck``, whose message names the checks ("float64 and native
    dtype, 0.42 s") or says the time limit cut them short. ``peaked``: the names of the
    inputs that get the per-input draws (``peak``, ``peakfold``; None: every input); a
    stitched program of repeated pieces passes the inputs of one occurrence of each piece
    context (``partition.contexts.peaked_inputs``; docs/verifier.md, section 5). ``only``:
    the one check a counterexample names (its ``check``), replayed on its draw."""
    start = time.perf_counter()
    match_interfaces(a, b)
    names = list(a.inputs)
    if peaked is not None and not set(peaked) <= set(names):
        raise MirageError(f"float_check: peaked names inputs {sorted(set(peaked) - set(names))} "
                          f"that {a.name!r} does not have")
    where = None if peaked is None else [i for i, n in enumerate(names) if n in set(peaked)]
    with programs_fixed():  # a and b only read here: their peaks and stages made once
        threads = threads_that_fit(lambda n: float_parts(a, b, n), THREADS,
                                   f"checking {b.name!r} against {a.name!r}")
        held = sum(n for _, n in float_parts(a, b, threads))
        deadline = time_limit_s if isinstance(time_limit_s, Deadline) else \
            Deadline(time_limit_s)
        rng = np.random.default_rng(None if seed is None else [seed, 0xE2E])
        skipped: list[str] = []  # native draws where rounding alone decides the output
        try:
            with reserved(held, deadline), runner(deadline, threads) as pool:
                cex, ran_native = float_checks(a, b, rng, rtol, native, None, pool,
                                                constant_finite=True, conditioned=True,
                                                skipped=skipped, peaked=where,
                                                pair_forms=False, only=only)
        except TimeLimitError as exc:
            return FloatCheck(None, True, False, time.perf_counter() - start,
                              f"cut short by the time limit ({exc})")
    seconds = time.perf_counter() - start
    what = "float64" + (" and native dtype" if ran_native else "")
    if ran_native and where is not None and len(where) < len(names):
        what += (f" (per-input draws on {len(where)} of {len(names)} inputs: one occurrence "
                 "of each piece context)")
    if skipped:
        what += (f" (finiteness only on {len(skipped)} ill-conditioned native draw(s): "
                 f"{'; '.join(sorted(set(skipped)))})")
    return FloatCheck(cex, False, bool(ran_native), seconds, f"{what}, {seconds:.2f} s")
