"""``em.verify``: random testing over Z_p x Z_q plus a float64 check.

Both programs must be Lax (``check.check_lax``); otherwise a ``LaxError`` is
raised and no verdict is given. Each trial draws fresh uniform inputs, a fresh
omega of order q and fresh random functions for the opaque ops, evaluates both
programs and compares every output by name. A float64 run on random normal
inputs then filters candidates that are algebraically equal but computed
differently (it never turns a field mismatch into a pass).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.check import check, check_lax
from ..ir.errors import GraphError, MirageError
from ..ir.node import fmt_shape
from ..semantics.field import (
    FieldCtx,
    FieldZeroDivisionError,
    SharedValues,
    evaluate_field,
    field_primes,
)
from ..semantics.floating import evaluate
from .bound import per_trial_bound


@dataclass
class Counterexample:
    """Where two programs disagree: output name, element index and both values."""

    domain: str  # "Z_p x Z_q" or "float64"
    output: str
    index: tuple[int, ...]
    value_a: Any
    value_b: Any
    trial: int
    inputs: dict[str, np.ndarray] = field(repr=False, default_factory=dict)
    detail: str = ""

    def __str__(self) -> str:
        return (f"{self.domain} trial {self.trial}: output {self.output!r}{list(self.index)} "
                f"is {self.value_a} in the first program and {self.value_b} in the second"
                + (f" ({self.detail})" if self.detail else ""))


@dataclass
class VerifyResult:
    """The verdict of ``em.verify``.

    ``equivalent`` is True only when every field trial and the float check
    agreed; ``false_positive_bound`` is then the probability, over the random
    choices, that non-equivalent programs would have passed (see
    docs/verifier.md). ``__bool__`` is ``equivalent``.
    """

    equivalent: bool
    false_positive_bound: float
    counterexample: Counterexample | None = None
    trials: int = 0
    p: int = 0
    q: int = 0
    per_trial_bound: float = 1.0
    seconds: float = 0.0
    float_checked: bool = False
    reason: str = ""

    def __bool__(self) -> bool:
        return self.equivalent

    def __str__(self) -> str:
        if self.equivalent:
            return (f"equivalent (false-positive bound {self.false_positive_bound:.3g} after "
                    f"{self.trials} trials over Z_{self.p} x Z_{self.q}"
                    f"{', float64 check passed' if self.float_checked else ''}; "
                    f"{self.seconds:.2f} s)")
        return f"NOT equivalent: {self.reason or self.counterexample} ({self.seconds:.2f} s)"


def _match_interfaces(a, b) -> None:
    for kind, xa, xb in (("inputs", a.inputs, b.inputs), ("outputs", a.outputs, b.outputs)):
        if set(xa) != set(xb):
            raise GraphError(f"cannot compare {a.name!r} and {b.name!r}: {kind} differ "
                             f"({sorted(xa)} vs {sorted(xb)})")
        for name in xa:
            if xa[name].shape != xb[name].shape:
                raise GraphError(f"cannot compare {a.name!r} and {b.name!r}: {kind[:-1]} "
                                 f"{name!r} has shape {fmt_shape(xa[name].shape)} vs "
                                 f"{fmt_shape(xb[name].shape)}")


def _first_mismatch(x: np.ndarray, y: np.ndarray) -> tuple[int, ...] | None:
    diff = np.argwhere(np.broadcast_to(x != y, np.broadcast_shapes(np.shape(x), np.shape(y))))
    return tuple(int(i) for i in diff[0]) if len(diff) else None


def _runs_itself(program) -> bool:
    """MuGraphs validate and execute themselves (their tiling is what gets verified)."""
    return hasattr(program, "evaluate_field")


def _field_trial(a, b, ctx: FieldCtx, trial: int) -> Counterexample | None:
    ctx.inputs = ctx.random_inputs(a)
    graphs = [x for x in (a, b) if not _runs_itself(x)]
    shared = SharedValues(*graphs) if len(graphs) == 2 else None  # common subterms: once
    out_a, out_b = (x.evaluate_field(ctx) if _runs_itself(x) else evaluate_field(x, ctx, shared)
                    for x in (a, b))
    for name in a.outputs:
        (pa, qa), (pb, qb) = out_a[name], out_b[name]
        for part, x, y in (("p", pa, pb), ("q", qa, qb)):
            if x is None or y is None:
                continue
            idx = _first_mismatch(x, y)
            if idx is not None:
                return Counterexample(
                    "Z_p x Z_q", name, idx, int(np.broadcast_to(x, a.outputs[name].shape)[idx]),
                    int(np.broadcast_to(y, a.outputs[name].shape)[idx]), trial,
                    {k: v[0] for k, v in ctx.inputs.items()},
                    f"{part}-part differs, p={ctx.p}, q={ctx.q}, omega={ctx.omega}")
    return None


def _float_check(a, b, rng: np.random.Generator, rtol: float) -> Counterexample | None:
    inputs = {name: rng.standard_normal(node.shape) for name, node in a.inputs.items()}
    out_a, out_b = evaluate(a, inputs), evaluate(b, inputs)
    for name in a.outputs:
        x, y = out_a[name], out_b[name]
        finite = np.isfinite(x) & np.isfinite(y)
        scale = float(np.max(np.abs(np.where(finite, x, 0)), initial=0.0)) or 1.0
        close = np.where(finite, np.abs(x - y) <= rtol * (scale + np.abs(x)),
                         (x == y) | (np.isnan(x) & np.isnan(y)))
        if not np.all(close):
            idx = tuple(int(i) for i in np.argwhere(~close)[0])
            return Counterexample("float64", name, idx, float(x[idx]), float(y[idx]), 0, inputs,
                                  f"relative tolerance {rtol:g}")
    return None


def verify(a, b, trials: int = 4, seed: int | None = None, prime_bits: int = 30,
           float_check: bool = True, rtol: float = 1e-7, max_redraws: int = 3) -> VerifyResult:
    """Decide whether programs ``a`` and ``b`` compute the same outputs.

    Outputs and inputs are matched by name. ``trials`` independent finite-field
    tests run with primes q < 2**prime_bits and p = k*q + 1; the returned
    ``false_positive_bound`` is ``per_trial_bound ** trials``. Raises
    ``LaxError`` for a program outside the Lax fragment and ``GraphError``
    when the two programs' inputs or outputs do not match.
    """
    start = time.perf_counter()
    if trials < 1:
        raise MirageError(f"verify: trials must be >= 1, got {trials}")
    for prog, what in ((a, "first program"), (b, "second program")):
        if _runs_itself(prog):
            prog.check_lax(what)  # validates, then checks exp depth through its tiles
            continue
        check(prog)
        check_lax(prog, what)
    _match_interfaces(a, b)
    p, q = field_primes(prime_bits)
    rng = np.random.default_rng(seed)
    eps = per_trial_bound(a, b, p, q)
    result = VerifyResult(False, 1.0, None, 0, p, q, eps)
    for t in range(trials):
        for _ in range(max_redraws + 1):
            try:
                cex = _field_trial(a, b, FieldCtx(p, q, rng), t)
                break
            except FieldZeroDivisionError:
                continue
        else:
            result.reason = (f"inconclusive: a denominator vanished in {max_redraws + 1} draws of "
                             f"trial {t}; cannot decide")
            result.seconds = time.perf_counter() - start
            return result
        result.trials = t + 1
        if cex is not None:
            result.counterexample, result.reason = cex, str(cex)
            result.seconds = time.perf_counter() - start
            return result
    if float_check:
        cex = _float_check(a, b, rng, rtol)
        result.float_checked = True
        if cex is not None:
            result.counterexample = cex
            result.reason = f"{cex} (field trials passed: algebraically equal but numerically not)"
            result.seconds = time.perf_counter() - start
            return result
    result.equivalent = True
    result.false_positive_bound = eps ** trials
    result.seconds = time.perf_counter() - start
    return result
