"""The float checks of ``em.verify``: both programs on float64 draws at several scales and
in their own dtypes (``NATIVE_DRAWS``), compared where the first program is finite.

``float_checks`` runs them (cheapest and most often rejecting first) and returns the first
``Counterexample``; ``endtoend`` runs the same checks on a stitched program. A
counterexample from the field trials has the same type.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.limits import Deadline
from ..semantics.floating import evaluate, rounded_inputs
from .runner import Runner

FLOAT64_SCALES = (1.0, 30.0, 1000.0)  # N(0, s^2) inputs: past the thresholds of relu & co
# native dtypes, activation-sized inputs: N(0, 1); |N(0, s^2)| (sums of those concentrate
# instead of cancelling); and every input equal to s, for s from 0.3 to 1.2 in steps of
# 2^(1/3) (0.6 and 0.95 left out) (attention scores 64 s^2 from 5.8 to 92: exps just below
# float16's limit, e^11.1, are among them, where a sum of them over many keys overflows)
# (constants first: they are where a rewrite that overflows is caught)
NATIVE_DRAWS = tuple(("constant", round(0.3 * 2.0 ** (k / 3), 4)) for k in (0, 1, 2, 4, 6)) + (
    ("signed", 1.0), ("folded", 0.25), ("folded", 0.5))
NATIVE_RTOL = {"float16": 2e-2, "bfloat16": 6e-2, "float32": 1e-4}
NATIVE_MAX = {"float16": 65504.0, "bfloat16": 3.3895e38, "float32": 3.4028e38}


@dataclass
class Counterexample:
    """Where two programs disagree: output name, element index and both values."""

    domain: str  # "Z_p x Z_q", "float64" or "native dtype"
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


def _compare(out_a: dict, out_b: dict, drawn: str, rtol: float, domain: str,
             inputs: dict, trial: int, rule: str, floor: float = 0.0,
             limit: float = np.inf, ref: dict | None = None) -> Counterexample | None:
    """Compare outputs elementwise; ``rule`` says where a difference counts.

    "strict": finite values must be close and non-finite ones equal; "finite": only where
    both are finite and not both below 1e-150 (float64 at large scales, where either side
    may leave float64's range); "finite-only": ``out_b`` finite wherever ``out_a`` is;
    "a-finite" (native dtype): wherever ``out_a`` is finite, ``out_b`` must be finite and
    as close to ``ref`` (the float64 value) as ``out_a`` is, give or take the tolerance
    (more accurate is fine, overflowing where ``out_a`` does not is not). The tolerance is
    ``rtol * (scale + |a|)``, ``scale`` the largest finite ``|a|`` of the output, at least
    ``floor`` (the largest input magnitude: rounding errors scale with the operands, and a
    sum that cancels can be far smaller). Values of ``out_a`` within rounding of ``limit``
    (the dtype's largest) count as overflowed.
    """
    for name, x in out_a.items():
        y = out_b[name]
        fin_a, fin_b = np.isfinite(x), np.isfinite(y)
        if rule in ("a-finite", "finite-only"):
            fin_a &= np.abs(x) < limit * (1.0 - 2.0 * rtol)
        scale = max(float(np.max(np.abs(np.where(fin_a, x, 0)), initial=0.0)), floor) or 1.0
        with np.errstate(invalid="ignore", over="ignore"):
            tol = rtol * (scale + np.abs(x))
            if rule == "a-finite":
                r = ref[name]
                tol = np.where(np.isfinite(r), tol + 2.0 * np.abs(x - r), tol)
                close = fin_b & (np.abs(y - np.where(np.isfinite(r), r, x)) <= tol)
            else:
                close = fin_a & fin_b & (np.abs(x - y) <= tol)
        if rule == "strict":
            same = (x == y) | (np.isnan(x) & np.isnan(y))
            bad = ~np.where(fin_a & fin_b, close, same)
        elif rule == "finite":  # and not both underflowing (exp of -1000 is 0 or 1e-300)
            with np.errstate(invalid="ignore"):
                tiny = (np.abs(x) < 1e-150) & (np.abs(y) < 1e-150)
            bad = fin_a & fin_b & ~close & ~tiny
        else:  # "a-finite", or "finite-only"
            bad = fin_a & ~(fin_b if rule == "finite-only" else close)
        if np.any(bad):
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            what = "non-finite where the first program is finite" if not fin_b[idx] \
                else f"relative tolerance {rtol:g}"
            return Counterexample(domain, name, idx, float(x[idx]), float(y[idx]), trial,
                                  inputs, f"{what}; inputs {drawn}")
    return None


def _dtypes(program) -> set[str]:
    """Every dtype a program computes in (a MuGraph: its device tensors')."""
    if hasattr(program, "tensors"):
        return {spec.dtype for spec in program.tensors.values()}
    return {n.dtype for n in program.nodes()}


class _Draws:
    """One standard-normal draw per input, scaled, folded (|z|) or replaced by a constant on
    demand; the first program's outputs per draw are kept in ``memo`` across calls."""

    def __init__(self, a, rng: np.random.Generator, memo: dict | None) -> None:
        self.a, self.memo = a, memo if memo is not None else {}
        # a bool mask input: random bits, mostly kept (1.0 where it holds, as it evaluates)
        self.normal = {n: (rng.random(node.shape) < 0.75).astype(np.float64)
                       if node.dtype == "bool" else rng.standard_normal(node.shape)
                       for n, node in a.inputs.items()}

    @functools.cached_property
    def top(self) -> float:
        """The largest |z| of the draw (only the native check needs it)."""
        return max((float(np.max(np.abs(z))) for z in self.normal.values()), default=0.0)

    def largest(self, kind: str, s: float) -> float:
        """The largest input magnitude of a draw."""
        return s if kind == "constant" else s * self.top

    def inputs(self, kind: str, s: float) -> dict:
        if kind == "constant":  # read-only views: no memory per input
            return {n: np.broadcast_to(np.float64(s), z.shape) for n, z in self.normal.items()}
        return {n: (np.abs(z) if kind == "folded" else z) * s for n, z in self.normal.items()}

    def rounded(self, kind: str, s: float) -> dict:
        """The draw rounded once to each input's dtype (both programs read the same)."""
        key = ("rounded", kind, s)
        if key not in self.memo:
            self.memo[key] = rounded_inputs(self.a, self.inputs(kind, s))
        return self.memo[key]

    def out_a(self, dtype: str | None, kind: str, s: float, of_rounded: bool = False) -> dict:
        """The first program's outputs on the draw (kind, s), as drawn or rounded to the
        inputs' dtypes (``of_rounded``), in float64 (``dtype=None``) or natively; memoized."""
        key = (dtype, kind, s, of_rounded)
        if key not in self.memo:
            inputs = self.rounded(kind, s) if of_rounded else self.inputs(kind, s)
            self.memo[key] = evaluate(self.a, inputs, dtype=dtype,
                                      rounded=of_rounded and dtype == "native")
        return self.memo[key]


_DRAWN = {"signed": "N(0, s^2)", "folded": "|N(0, s^2)|", "constant": "every input = s"}


def float_checks(a, b, rng: np.random.Generator, rtol: float, native: bool,
                  memo: dict | None = None, pool: Runner | None = None,
                  constant_finite: bool = False) -> tuple[Counterexample | None, bool]:
    """float64 at ``FLOAT64_SCALES`` and both programs in their own dtypes at
    ``NATIVE_DRAWS`` (see docs/verifier.md, section 4).

    The order puts the checks that reject most often and cost least first: the native
    constant draws (every input one value: evaluated on one element per tensor), float64
    at scale 1 (compared strictly), the other native draws, then float64 at the large
    scales. A native draw where the
    first program is nowhere finite constrains nothing, and the second program is not
    run on it. Returns the first counterexample and whether the native check ran.
    ``memo`` (same ``a``, same ``rng`` seed) keeps ``a``'s outputs for the next call;
    ``pool`` runs up to ``THREADS`` checks at once. ``constant_finite``: only finiteness
    counts on the constant draws (``endtoend``: a layer norm's variance is 0 there).
    """
    draws = _Draws(a, rng, memo)
    pool = pool or Runner(None, Deadline(None))
    drawn = [("native", kind, s) for kind, s in NATIVE_DRAWS] if native else []
    first, rest = ([c for c in drawn if (c[1] == "constant") == k] for k in (True, False))
    checks = first + [(None, "signed", s) for s in FLOAT64_SCALES[:1]] + rest + [
        (None, "signed", s) for s in FLOAT64_SCALES[1:]]
    if native:
        dts = _dtypes(a) | _dtypes(b)
        coarsest = max(NATIVE_RTOL.get(dt, 1e-4) for dt in dts)
        limit = min(NATIVE_MAX.get(dt, np.inf) for dt in dts)

    def check_one(i: int, dtype: str | None, kind: str, s: float) -> Counterexample | None:
        where = f"{_DRAWN[kind]}, s = {s:g}"
        if dtype is None:
            inputs = draws.inputs(kind, s)
            strict = s == FLOAT64_SCALES[0]  # inputs of moderate size: values must agree
            # differences are measured against the inputs' magnitude at least: an output
            # that is 0 in exact arithmetic (x + (-x), squared) is rounding noise in both
            return _compare(draws.out_a(None, kind, s), evaluate(b, inputs), where, rtol,
                            "float64", inputs, i, "strict" if strict else "finite",
                            draws.largest(kind, s))
        xa = draws.out_a("native", kind, s, True)
        if not any(np.any(np.isfinite(x) & (np.abs(x) < limit)) for x in xa.values()):
            return None  # "a-finite" asks nothing where the first program is not finite
        inputs = draws.rounded(kind, s)
        rule = "finite-only" if constant_finite and kind == "constant" else "a-finite"
        return _compare(xa, evaluate(b, inputs, dtype="native", rounded=True), where,
                        max(coarsest, rtol), "native dtype", inputs, i, rule,
                        draws.largest(kind, s), limit, draws.out_a(None, kind, s, True))

    jobs = [functools.partial(check_one, i, *c) for i, c in enumerate(checks)]
    for (dtype, _, _), cex in zip(checks, pool.in_order(jobs)):
        if cex is not None:
            return cex, dtype is not None
    return None, native
