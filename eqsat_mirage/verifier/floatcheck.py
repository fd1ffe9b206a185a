"""The float checks of ``em.verify``: both programs on float64 draws at several scales and
in their own dtypes (``NATIVE_DRAWS``), compared where the first program is finite.

``float_checks`` runs them (cheapest and most often rejecting first) and returns the first
``Counterexample``; ``endtoend`` runs the same checks on a stitched program. A
counterexample from the field trials has the same type.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.limits import Deadline
from ..ir.node import Op
from ..semantics.floating import LazyInputs, evaluate, uniform
from .accuracy import MAX_BITS_LOST, bits_lost, bits_of_error
from .bound import has_comparison
from .conditioning import ill_conditioned
from .corners import TIE, chosen, offset_draws, pair_draws, tie_draws, tie_pairs
from .corners import pairs as input_pairs
from .draws import (
    HEADROOM,
    NATIVE_MAX,
    NATIVE_TINY,
    SPREADS,
    STATIC,
    Draws,
)
from .floatsafe import is_graph
from .runner import Runner
from .scales import APART_DRAWS, EXPONENT_DRAWS
from .truth import precision, truth

FLOAT64_SCALES = (1.0, 30.0, 1000.0)  # N(0, s^2) inputs: past the thresholds of relu & co
# native dtypes, activation-sized inputs: N(0, 1); |N(0, s^2)| (sums of those concentrate
# instead of cancelling); and every input equal to s, for s from 0.3 to 1.2 in steps of
# 2^(1/3) (0.6 and 0.95 left out) (attention scores 64 s^2 from 5.8 to 92: exps just below
# float16's limit, e^11.1, are among them, where a sum of them over many keys overflows)
# (constants first: they are where a rewrite that overflows is caught)
NATIVE_DRAWS = tuple(("constant", round(0.3 * 2.0 ** (k / 3), 4)) for k in (0, 1, 2, 4, 6)) + (
    ("signed", 1.0), ("folded", 0.25), ("folded", 0.5))
NATIVE_RTOL = {"float16": 2e-2, "bfloat16": 6e-2, "float32": 1e-4}


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
    check: tuple = ()  # the check of ``check_list`` that found it: (dtype, kind, s)

    def __str__(self) -> str:
        if self.domain == STATIC:
            return f"{self.domain}: {self.detail}"
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
    as close to ``ref`` (the ground truth, ``truth.py``) as ``out_a`` is on that output,
    give or take the tolerance (more accurate is fine, overflowing where ``out_a`` does not
    is not). ``out_a``'s own error counts per output, its largest over the compared
    elements (a norm, as accuracy is measured in numerical analysis), not per element: an
    element where the first program's rounding errors happen to cancel is no place where
    it is more accurate (Phi-3's RMSNorm and fused QKV projection in float16: the first
    program 6e-8 from the truth at one element, 1.44e-6 at others; the same program with
    its product and matmul in float32 registers 1.43e-6 there, 6.2e-6 at most against the
    first's 9.6e-6, refused under a per-element rule). With
    ``ref`` the other rules measure closeness that way too (the float64 checks, when the
    truth is wider than float64); without it, ``out_b`` against ``out_a``. The tolerance is
    ``rtol * (scale + |a|)``, ``scale`` the largest finite ``|a|`` of the output, at least
    ``floor`` (the largest input magnitude: rounding errors scale with the operands, and a
    sum that cancels can be far smaller; and the dtype's smallest normal, below which it
    holds values to a fixed spacing). Values of ``out_a`` within rounding of ``limit``
    (the dtype's largest) count as overflowed.
    """
    for name, x in out_a.items():
        x, y, r = _one_each(x, out_b[name], None if ref is None else ref[name])
        fin_a, fin_b = np.isfinite(x), np.isfinite(y)
        if rule in ("a-finite", "finite-only"):
            fin_a &= np.abs(x) < limit * (1.0 - 2.0 * rtol)
        scale = max(float(np.max(np.abs(np.where(fin_a, x, 0)), initial=0.0)), floor) or 1.0
        with np.errstate(invalid="ignore", over="ignore"):
            tol = rtol * (scale + np.abs(x))
            if r is not None:  # against the truth, allowing the first program's own error
                known = np.isfinite(r)  # (its largest on this output: a norm)
                own = np.abs(x - r)
                worst = float(np.max(np.where(fin_a & known, own, 0.0), initial=0.0))
                tol = np.where(known, tol + 2.0 * np.maximum(own, worst), tol)
                close = fin_b & (np.abs(y - np.where(np.isfinite(r), r, x)) <= tol)
            else:
                close = fin_b & (np.abs(x - y) <= tol)
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
            held = inputs.held() if isinstance(inputs, LazyInputs) else inputs
            return Counterexample(domain, name, idx, float(x[idx]), float(y[idx]), trial,
                                  held, f"{what}; inputs {drawn}")
    return None


def _one_each(*xs):
    """``xs`` (arrays or None), or where every one is one value everywhere (``uniform``: a
    peak draw's outputs), one element of each (every dimension 1): the same comparison."""
    if all(x is None or np.ndim(x) and uniform(x) for x in xs):
        return tuple(None if x is None else np.asarray(x)[(slice(0, 1),) * np.ndim(x)]
                     for x in xs)
    return xs


def _dtypes(program) -> set[str]:
    """Every dtype a program computes in (a MuGraph: its device tensors')."""
    if hasattr(program, "tensors"):
        return {spec.dtype for spec in program.tensors.values()}
    return {n.dtype for n in program.nodes()}


def _accurate(x: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Where the input program's value ``x`` is within 10% of the ground truth
    ``r``: a point where the input program is itself wrong (an
    intermediate overflowed into a finite 0) is not one where it works."""
    return np.isfinite(r) & (np.abs(x - r) <= 0.1 * np.abs(r))


def _reduction(program) -> int:
    """The longest reduction of a Graph (sum, mean, max, matmul contraction), 1 if none
    (or not a Graph): how much an intermediate may outgrow the output it is summed into
    (``(e @ V) / sum(e)`` for ``softmax @ V``)."""
    if not is_graph(program):
        return 1
    longest = 1
    for n in program.nodes():
        if n.op is Op.MATMUL:
            longest = max(longest, n.srcs[0].shape[-1])
        elif n.op in (Op.SUM, Op.MEAN, Op.MAX):
            axes = n.arg[0]
            axes = range(len(n.srcs[0].shape)) if axes is None else (
                (axes,) if isinstance(axes, int) else axes)
            longest = max(longest, math.prod(n.srcs[0].shape[x] for x in axes))
    return longest


def _headroom(longest: int) -> float:
    """The native checks' overflow headroom for a first program whose longest reduction is
    ``longest``: a point counts where it stays finite with every input times this, the
    square of ``longest`` (at least ``HEADROOM``) rounded up to a power of two."""
    return 2.0 ** math.ceil(2 * math.log2(max(HEADROOM, float(longest))))


def headroom_slack(program) -> float:
    """The native checks' headroom for first program ``program`` over the square of its
    longest reduction (1 to 2): how much sooner than that square a candidate's
    intermediate may overflow unseen. It differs between the sizes of a shape family
    (``family.sizes`` runs the pair draws at the tightest size too)."""
    longest = _reduction(program)
    return _headroom(longest) / max(HEADROOM, float(longest)) ** 2


# draws judged only where the first program computes every value finite, for finiteness
_ALL_FINITE = ("apart", "zeros")
_DRAWN = {"signed": "N(0, s^2)", "folded": "|N(0, s^2)|", "constant": "every input = s",
          "exponent": "N(0, 1) * 2^k, k across the inputs' exponent range, draw s",
          "apart": "each float input N(0, 1) * its own 2^k ({}; one draw for every seed), "
                   "judged where the first program computes every value finite",
          "zeros": "N(0, 1), each float input exactly 0 at about one element in 8 (the same "
                   "positions for every seed), judged where the first program computes "
                   "every value finite",
          "spread": "+-2^e per element, e uniform in [-s, s] (0: the dtype's whole range)",
          "peak": "input s (-1: every input) at its largest value keeping the first program "
                  "finite, the others 1",
          "peakfold": "|N(0, 1)| of input s scaled to its largest value keeping the first "
                      "program finite, the others 0.5 |N(0, 1)|",
          "logits": "N(0, s^2), s setting the exp arguments' standard deviation to 9",
          "peakset": "{} together at their largest value keeping the first program "
                     "finite, the others 1",
          "peakneg": "{} at opposite values, the largest keeping the first program finite, "
                     "the others 1",
          "peakrest": "{} at the largest value keeping the first program finite, the second "
                      "at half the first, the others a quarter of their own largest",
          "peakinv": "{} at the largest value keeping the first program finite and its "
                     "reciprocal, the others at their dtype's smallest normal",
          TIE: "{} at the largest value keeping the first program finite and half its last "
               "place, the others 1",
          "offset": "N(0, 1) plus a common offset {:g} on {}, the others N(0, 1)",
          "trough": "(1 + |N(0, 1)|) * 2^k with its sign in each float input's unit, k the largest "
                    "exponent at which fewer than half the first program's outputs are "
                    "normal, or the least scale (2^-24 or the inputs' least normal) where "
                    "they are normal there",
          "ties": "every float input k * s, k a uniform integer in [-4, 4] (one draw for "
                  "every seed): equal values and zeros, a comparison's ties"}
_PAIRS = ("peakset", "peakneg", "peakrest", "peakinv")  # a pair of inputs at its largest
_CONSTANT = ("constant", "peak", *_PAIRS, TIE)  # one value per input: cheap
_RANGE_KINDS = ("peak", *_PAIRS, "peakfold", "exponent", "spread")
_NORMAL = ("signed", "folded", "logits")  # normal draws
# the draws ``conditioned`` (the end-to-end check) asks about: the normal ones, and the
# exponent draws, where a whole layer's float32 output can hinge on its BLAS's summation
# order (a LLaMA layer's eager attention on this project's AMD machines: 1.4e-4 of the
# output's scale from rounding alone, past the 1e-4 tolerance)
_CONDITIONED = (*_NORMAL, "exponent")


def _then(first, second, result: Future) -> Counterexample | None:
    """Run ``first`` and, where it finds nothing, ``second`` after it on the same thread,
    ``second``'s result (or exception) into ``result`` (``Runner.in_order`` reads it in
    ``second``'s place; cancelled where ``first`` found something or raised): the strict
    float64 check right after the static checks whose runs it compares, neither waiting
    on another thread nor held back behind the other checks."""
    try:
        cex = first()
        if cex is None:
            try:
                result.set_result(second())
            except BaseException as exc:  # a time limit, say: raised where it is read
                result.set_exception(exc)
        return cex
    finally:
        result.cancel()  # no-op once set


def _start_rank(dtype: str | None, kind: str, s: float) -> int:
    """When a pool of threads starts a check (``Runner.in_order``'s ``start``): the static
    checks and the constant draws first (cheap, and they reject most), then the longest
    (the logits draw, which first finds its scale; the trough, which first searches for
    its exponent; the float64 draws, every input in float64), the other normal and
    exponent-range draws, and the per-input draws last (short at real sizes, where most
    have no valid point: they fill the threads' ends). Measured on a 7B layer's end-to-end
    check: the other thread ran the last float64 draw alone for 5.2 s
    (bench/history/2026-11-27_real-sizes-session23.md)."""
    if dtype == "static" or kind in _CONSTANT:
        return 0
    if kind in ("logits", "trough") or dtype is None:  # the trough: its bisection first
        return 1
    return 3 if kind == "peakfold" else 2


TIE_STEP = 0.5  # the ``ties`` draw's grid: k / 2, exact in every dtype


def check_list(a, b, native: bool, static: bool, peaked: Collection[int] | None,
                pair_forms: bool = True, pairs: bool = True
                ) -> list[tuple[str | None, str, float]]:
    """``float_checks``' checks as ``(dtype, kind, s)`` in the order their verdicts count:
    the static checks, the native constant draws, float64 at scale 1, the other native
    draws (per input, exponent range, the trough, each input at its own exponent, zeros
    at fixed positions, spread,
    per input folded, offsets, logits), float64 at the large scales. ``dtype`` is
    "static", "native" or None (float64). ``pairs=False``: no draw that sets two inputs
    against each other (``peakset``, ``pair_draws``, ``peaktie``, the paired ``offset``
    draws, the ``apart`` and ``zeros`` draws); nor with ``pair_forms=False`` (``endtoend``:
    each piece had them on its own inputs) the pairs' other forms and those two kinds."""
    n_in = len(a.inputs)
    drawn = [("native", kind, s) for kind, s in NATIVE_DRAWS] if native else []
    if native:
        each = range(n_in) if peaked is None else sorted(set(peaked) & set(range(n_in)))
        drawn += [("native", "peak", float(i)) for i in each]
        drawn += [("native", "exponent", float(j)) for j in range(EXPONENT_DRAWS)]
        drawn += [("native", "trough", 0.0)]
        if pairs and pair_forms and is_graph(a):
            drawn += [("native", "apart", float(j)) for j in range(APART_DRAWS)]
            drawn += [("native", "zeros", 0.0)]
        drawn += [("native", "spread", float(w)) for w in SPREADS]
        drawn += [("native", "peakfold", float(i)) for i in each]
        if pairs:
            drawn += [("native", "peakset", float(j)) for j in chosen(input_pairs(a), peaked)]
        if pairs and pair_forms:
            drawn += [("native", kind, float(j)) for kind, j in pair_draws(a, peaked)]
            drawn += [("native", TIE, float(j)) for j in tie_draws(a, b, peaked)]
        drawn += [("native", "offset", float(j)) for j in offset_draws(a, b, peaked, pairs)]
        if is_graph(a) and any(n.op is Op.EXP for n in a.nodes()):
            drawn += [("native", "logits", 0.0)]
    if has_comparison(a) or has_comparison(b):  # ties, where > and >= part: natively and in float64
        drawn += [(d, "ties", TIE_STEP) for d in (("native", None) if native else (None,))]
    first, rest = ([c for c in drawn if (c[1] in _CONSTANT) == k] for k in (True, False))
    return ([("static", "", 0.0)] if native and static else []) + first + [
        (None, "signed", s) for s in FLOAT64_SCALES[:1]] + rest + [
        (None, "signed", s) for s in FLOAT64_SCALES[1:]]


def _evaluate(draws: Draws, program, inputs, **how) -> dict:
    """``evaluate(program, inputs, **how)`` on a draw of ``draws``: through
    ``Draws.evaluate`` where it shares values computed from the fixed inputs alone."""
    if draws.shares(program):
        return draws.evaluate(program, inputs, **how)
    return evaluate(program, inputs, **how)


class _Judge:
    """One ``float_checks`` call: the draws of ``a``, the second program ``b`` and the
    tolerances from ``a``'s dtypes; ``checked`` runs one check of ``check_list``."""

    def __init__(self, a, b, rng: np.random.Generator, rtol: float, native: bool,
                 memo: dict | None, static: bool, constant_finite: bool, conditioned: bool,
                 skipped: list, stop=None) -> None:
        self.b, self.rtol, self.constant_finite = b, rtol, constant_finite
        self.conditioned, self.skipped = conditioned, skipped
        self.coarsest = self.tiny = self.room = None  # the native checks' (set when native)
        self.limit = np.inf
        if native:
            dts = _dtypes(a)  # the input program's dtypes, never the candidate's
            self.coarsest = max(NATIVE_RTOL.get(dt, 1e-4) for dt in dts)
            self.limit = min(NATIVE_MAX.get(dt, np.inf) for dt in dts)
            self.tiny = max(NATIVE_TINY.get(dt, 0.0) for dt in dts)
            longest = _reduction(a)  # the input program's: its draws are memoized
            self.room = self.limit / longest
        draws = self.draws = Draws(a, rng, memo, self.limit, stop)
        if not (native and static):
            draws.static_done.set()  # no static check to wait for
        if native:
            draws.headroom = _headroom(longest)

    def checked(self, i: int, dtype: str | None, kind: str, s: float) -> Counterexample | None:
        """Check ``i`` (``dtype``, ``kind``, ``s``), then release its draw."""
        try:
            return self.judged(i, dtype, kind, s)
        finally:
            self.draws.release(kind, s)

    def judged(self, i: int, dtype: str | None, kind: str, s: float) -> Counterexample | None:
        """Check ``i``; with ``conditioned``, an ill-conditioned normal draw counts for
        finiteness only (and is listed in ``skipped``)."""
        cex = self.check_one(i, dtype, kind, s)
        # a difference on a draw where rounding alone moves the first program's output
        # past the tolerance says nothing: there only finiteness counts (``conditioned``)
        if cex is not None and self.conditioned and dtype == "native" and kind in _CONDITIONED \
                and ill_conditioned(self.draws, kind, s, max(self.coarsest, self.rtol)):
            self.skipped.append(f"{_DRAWN[kind]}, s = {s:g}")
            return self.check_one(i, dtype, kind, s, finite_only=True)
        return cex

    def check_one(self, i: int, dtype: str | None, kind: str, s: float,
                  finite_only: bool = False) -> Counterexample | None:
        """Check ``i``: the static checks, a float64 draw or a native draw."""
        draws = self.draws
        if dtype == "static":
            why = draws.static(self.b)
            return Counterexample(STATIC, "", (), None, None, i, {}, why) if why else None
        where = f"{_DRAWN[kind]}, s = {s:g}"
        if kind == "logits":
            where = f"{_DRAWN[kind]} (s = {draws.logit_scale():.3g})"
        if kind in (*_PAIRS, "offset"):  # the inputs named
            names = ", ".join(sorted(draws.members(kind, s), key=list(draws.a.inputs).index))
            where = _DRAWN[kind].format(*((names,) if kind in _PAIRS else (
                draws.offset(int(s)), names)))
        if kind == "apart":  # each float input's exponent
            where = _DRAWN[kind].format(", ".join(
                f"{n} 2^{k}" for n, k in draws.powers(int(s)).items()))
        if kind == TIE:  # the pair in its order: the first large, the second small
            names = ", ".join(list(draws.a.inputs)[k] for k in tie_pairs(draws.a)[int(s)])
            return self._tie(i, s, _DRAWN[kind].format(names))
        if dtype is None:
            return self._float64(i, kind, s, where)
        if kind == "offset":
            return self._offset(i, s, where)
        if kind == "trough":
            return self._trough(i, _DRAWN[kind])
        return self._native(i, kind, s, where, finite_only)

    def _float64(self, i: int, kind: str, s: float, where: str) -> Counterexample | None:
        """Both programs in float64 on draw (``kind``, ``s``): strict at scale 1."""
        draws = self.draws
        inputs = draws.inputs(kind, s)
        strict = s == FLOAT64_SCALES[0]  # inputs of moderate size: values must agree
        # differences are measured against the inputs' magnitude at least: an output
        # that is 0 in exact arithmetic (x + (-x), squared) is rounding noise in both
        # both against the ground truth where it is wider than float64: the second
        # may be as far from it as the first is, give or take the tolerance
        if strict:  # the static checks run both programs on this draw: theirs are read
            draws.static_done.wait()
        xa = draws.out_a(None, kind, s, inputs=inputs)
        ref, how = draws.truth(kind, s, False)
        xb = draws.b_outputs if strict and draws.b_outputs is not None else _evaluate(
            draws, self.b, inputs)
        return _compare(xa, xb, where, self.rtol,
                        "float64", inputs, i, "strict" if strict else "finite",
                        draws.largest(kind, s), ref=None if how == "float64" else ref)

    def _below(self, x: np.ndarray) -> np.ndarray:
        """Where ``x`` is finite and under the dtype's largest."""
        with np.errstate(invalid="ignore"):
            return np.isfinite(x) & (np.abs(x) < self.limit)

    def _range_outputs(self, kind: str, s: float) -> dict | None:
        """The first program's native outputs on an exponent-range draw, NaN where they lack
        headroom or are far from the truth; None where no point is left."""
        draws, below = self.draws, self._below
        # valid where it has headroom and is near the truth; the headroom first: a float16
        # matmul over 11008 at 2^27 has no point there, and then nothing more is evaluated
        at_h = draws.out_a("native", kind + "@h", s, True)
        if not any(np.any(below(x)) for x in at_h.values()):
            return None
        xa = draws.out_a("native", kind, s, True)
        with np.errstate(invalid="ignore"):
            room_ok = {k: below(h) & (np.abs(v) < self.room)
                       for (k, v), h in zip(xa.items(), at_h.values())}
        if not any(np.any(m) for m in room_ok.values()):
            return None
        ref = draws.truth(kind, s)[0]
        with np.errstate(invalid="ignore"):
            return {k: np.where(room_ok[k] & _accurate(v, ref[k]), v, np.nan)
                    for k, v in xa.items()}

    def _native(self, i: int, kind: str, s: float, where: str,
                finite_only: bool) -> Counterexample | None:
        """Both programs in their own dtypes on draw (``kind``, ``s``), compared where the
        first program is finite."""
        draws = self.draws
        if kind in _ALL_FINITE and not draws.all_finite(kind, s):
            return None  # an overflow on the way: the first program's value hangs on it
        if kind in _RANGE_KINDS:
            xa = self._range_outputs(kind, s)
            if xa is None:
                return None
        else:
            xa = draws.out_a("native", kind, s, True)
        if not any(np.any(self._below(x)) for x in xa.values()):
            return None  # "a-finite" asks nothing where the first program is not finite
        inputs = draws.rounded(kind, s)
        # a peak draw (one value per input, at the largest the first program allows) asks
        # for finiteness only: its equal inputs make differences of inputs exactly 0, a
        # cancellation no real input has (lerp's H + a (N - H) against (1 - a) H + a N)
        rule = "finite-only" if kind in ("peak", *_ALL_FINITE, *_PAIRS) or \
            self.constant_finite and kind in _CONSTANT else "a-finite"
        rule = "finite-only" if finite_only else rule
        # across the exponent range the error counts relative to the output, not to the
        # inputs (a normalization's output is O(1) whatever its input's magnitude), and
        # to the dtype's smallest normal at least (an output that is all subnormal: its
        # dtype holds it only to a fixed spacing)
        floor = max(self.tiny, 0.0 if kind in _RANGE_KINDS else draws.largest(kind, s))
        ref, how = draws.truth(kind, s)
        xb = _evaluate(draws, self.b, inputs, dtype="native", rounded=True)
        return _compare(xa, xb, f"{where}; ground truth in {how}", max(self.coarsest, self.rtol),
                        "native dtype", inputs, i, rule, floor, self.limit, ref)

    def _tie(self, i: int, s: float, where: str) -> Counterexample | None:
        """Both programs in their own dtypes on ``peaktie`` draw ``s``
        (``corners.tie_draws``): the tolerance of the other native draws, relative to the
        output and the inputs' magnitude, asked where both programs are finite and the
        first below its dtype's largest and within 10% of the ground truth. Overflow is the
        peak draws' to judge, with their headroom: this draw is at the first program's edge,
        without it."""
        draws = self.draws
        xa = draws.out_a("native", TIE, s, True)
        if not any(np.any(self._below(x)) for x in xa.values()):
            return None
        inputs = draws.rounded(TIE, s)
        xb = _evaluate(draws, self.b, inputs, dtype="native", rounded=True)
        ref, how = draws.truth(TIE, s)
        with np.errstate(invalid="ignore"):
            xa = {k: np.where(np.isfinite(xb[k]) & _accurate(v, ref[k]), v, np.nan)
                  for k, v in xa.items()}
        return _compare(xa, xb, f"{where}; ground truth in {how}", max(self.coarsest, self.rtol),
                        "native dtype", inputs, i, "a-finite",
                        max(self.tiny, draws.largest(TIE, s)), self.limit, ref)

    def _offset(self, i: int, s: float, where: str) -> Counterexample | None:
        """Both programs in their own dtypes on ``offset`` draw ``s``: wherever both are
        finite (overflow is the peak draws' to judge, with their headroom) and the first
        program is below its dtype's largest, the second may lose at most
        ``MAX_BITS_LOST`` bits on average against the first program's own error
        (``accuracy.bits_lost``; Herbie's measure) on every output. Both evaluated with
        each op rounded once (``evaluate``'s "exact": accumulations exact): on an
        ill-conditioned draw (attention logits at an offset of 65536) the float32 BLAS's
        summation order alone moved the second program's average error by 4 bits from one
        CPU's kernel to another's, and the verdict with it."""
        return self._accuracy("offset", s, i, where)

    def _truth_of_b(self, inputs) -> dict:
        """The second program's own ground truth on ``inputs`` (``truth.truth``)."""
        f64 = _evaluate(self.draws, self.b, inputs) if precision(self.b) == "float64" else {}
        return truth(self.b, inputs, f64)[0]

    def _trough(self, i: int, where: str) -> Counterexample | None:
        """Both programs, each op rounded once, on the trough draw (``Draws.trough``): the
        second must be finite wherever the first program is (below its dtype's largest)
        and lose at most ``MAX_BITS_LOST`` bits on average against the first program's own
        error, the points where the two programs' ground truths part left out. The
        measure is an average, not the worst element against a tolerance:
        ``(X @ W) * rsqrt(mean(X * X) + eps)`` for ``rms_norm(X) @ W``, its product in
        float16, loses 6 to 7.5 bits there for every seed's mantissas, where the exponent
        draws' random k found it for 7 of 50 seeds."""
        k = self.draws.trough()
        if k is None:
            return None
        try:
            return self._accuracy("pow2", float(k), i, f"{where}, k = {k}", trough=True)
        finally:
            self.draws.release("pow2", float(k))

    def _accuracy(self, kind: str, s: float, i: int, where: str, trough: bool = False
                  ) -> Counterexample | None:
        """Both programs in their own dtypes, each op rounded once (``evaluate``'s
        "exact"), on draw (``kind``, ``s``): where the first program is finite, below its
        dtype's largest and the truth finite, the second loses at most ``MAX_BITS_LOST``
        bits on average (``accuracy.bits_lost``) against the first program's own error.
        With ``trough`` (float outputs only) it is also finite at every such point, and a
        refusal is judged again at the points where the second program's own ground truth
        agrees with the first's (``bits_of_error`` at most 0.5, within about 0.41 of a
        unit in the last place): both are the same real function, so where they part one
        truth is wrong (``(x + 2^55) - 2^55 + y`` at x = 2^-24: its wide truth loses x
        too, and the exact ``x + y`` looked 23 bits worse)."""
        draws = self.draws
        xa = draws.out_a("exact", kind, s, True)
        if not any(np.any(self._below(x)) for x in xa.values()):
            return None
        inputs = draws.rounded(kind, s)
        xb = _evaluate(draws, self.b, inputs, dtype="exact", rounded=True)
        ref, how = draws.truth(kind, s)
        ref_b = None
        for name, x in xa.items():
            y, r = xb[name], ref[name]
            dtype = str(self.b.outputs[name].dtype)
            if trough and dtype not in NATIVE_RTOL:
                continue  # an integer or bool output: the field and the other draws
            with np.errstate(invalid="ignore"):
                valid = self._below(x) & np.isfinite(r)
            why = _lost(x, y, r, valid, dtype, trough)
            if why is not None and trough:  # where the two truths agree
                ref_b = self._truth_of_b(inputs) if ref_b is None else ref_b
                with np.errstate(invalid="ignore"):
                    valid &= bits_of_error(ref_b[name], np.where(np.isfinite(r), r, 0.0),
                                           dtype) <= 0.5
                why = _lost(x, y, r, valid, dtype, trough)
            if why is not None:
                idx, detail = why
                held = inputs.held() if isinstance(inputs, LazyInputs) else inputs
                return Counterexample(
                    "native dtype", name, idx, float(np.broadcast_to(x, np.shape(y))[idx]),
                    float(np.broadcast_to(y, np.shape(x))[idx]), i, held,
                    f"{detail}; inputs {where}; ground truth in {how}")
        return None


def _lost(x: np.ndarray, y: np.ndarray, r: np.ndarray, valid: np.ndarray, dtype: str,
          finite: bool) -> tuple[tuple[int, ...], str] | None:
    """Where and why ``y`` fails ``_Judge._accuracy``'s rule against ``x`` (truth ``r``) at
    the ``valid`` points: non-finite at one (``finite``), or more than ``MAX_BITS_LOST``
    bits lost on average where both are finite; None where it passes."""
    if finite:
        shape = np.broadcast_shapes(np.shape(x), np.shape(y))
        bad = np.broadcast_to(valid & ~np.isfinite(y), shape)
        if np.any(bad):
            return (tuple(int(j) for j in np.argwhere(bad)[0]),
                    "non-finite where the first program is finite")
    lost, idx = bits_lost(x, y, r, valid & np.isfinite(y), dtype)
    if idx is not None and lost > MAX_BITS_LOST:
        return idx, (f"loses {lost:.1f} bits of accuracy on average against the first "
                     f"program's own error (at most {MAX_BITS_LOST:g}, Herbie's measure)")
    return None


def float_checks(a, b, rng: np.random.Generator, rtol: float, native: bool,
                  memo: dict | None = None, pool: Runner | None = None,
                  constant_finite: bool = False, static: bool = True,
                  conditioned: bool = False, skipped: list | None = None,
                  peaked: Collection[int] | None = None, pair_forms: bool = True,
                  only: tuple | None = None, pairs: bool = True
                  ) -> tuple[Counterexample | None, bool]:
    """The static float-safety checks, float64 at ``FLOAT64_SCALES`` and both programs in
    their own dtypes at ``NATIVE_DRAWS`` and the exponent-range draws (see
    docs/verifier.md, sections 4 and 5).

    The order puts the checks that reject most often and cost least first: the static
    checks, the native constant draws (every input one value: evaluated on one element
    per tensor; with them each input, and every input at once, at the largest value that
    keeps the first program finite), float64 at scale 1 (compared strictly), the other
    native draws, then float64 at the large scales; the first counterexample in this
    order is the one returned. The strict check runs right after the static checks, in
    their job (it compares their runs), and a pool of threads starts the others longest
    first (``_start_rank``). A native draw where the first program
    is nowhere finite constrains nothing, and the second program is not run on it. The
    tolerance and the largest finite value come from the first program's dtypes only.
    Returns the first counterexample and whether the native check ran.
    ``memo`` (same ``a``, same ``rng`` seed) keeps ``a``'s outputs for the next call;
    ``pool`` runs up to ``THREADS`` checks at once. ``constant_finite``: only finiteness
    counts on the constant draws (``endtoend``: a layer norm's variance is 0 there).
    ``static=False`` leaves the static checks out (the draws alone). ``conditioned``
    (``endtoend``): where a normal draw finds a difference and rounding alone decides the
    first program's output on it (``conditioning.ill_conditioned``), only finiteness
    counts there; such draws are listed in ``skipped``. ``peaked``: the positions (in
    ``a.inputs``) of the inputs that get the per-input draws (``peak``, ``peakfold``);
    None: every input (``endtoend``: one piece context each, docs/verifier.md, section 5).
    ``pair_forms=False`` leaves out the pairs' other forms (``corners.pair_draws``;
    ``endtoend``: each piece had them on its own inputs). ``only``: that one check of
    ``check_list`` (a counterexample's ``check``), replayed on the same draw (same ``rng``
    seed); none when ``check_list`` has no such check. ``pairs=False``: no draw that sets
    two inputs against each other (``verify.verify_without_pairs``).
    """
    pool = pool or Runner(None, Deadline(None))
    skipped = skipped if skipped is not None else []
    # the draws stop at the pool's deadline too (a large input's draw is long)
    judge = _Judge(a, b, rng, rtol, native, memo, static, constant_finite, conditioned, skipped,
                   pool.check)
    checks = check_list(a, b, native, static, peaked, pair_forms, pairs)
    if only is not None:
        checks = [c for c in checks if c == tuple(only)]
    jobs: list = [functools.partial(judge.checked, i, *c) for i, c in enumerate(checks)]
    if len(checks) > 1 and checks[0][0] == "static":  # the strict float64 check compares the static
        strict = checks.index((None, "signed", FLOAT64_SCALES[0]))  # checks' runs: it
        result: Future = Future()
        jobs[0], jobs[strict] = functools.partial(_then, jobs[0], jobs[strict], result), result
    start = sorted(range(len(checks)), key=lambda i: (_start_rank(*checks[i]), i))
    for check, cex in zip(checks, pool.in_order(jobs, start)):  # follows them
        if cex is not None:
            cex.check = check
            return cex, check[0] is not None
    return None, native
