"""``em.verify``: random testing over Z_p x Z_q with fresh primes per trial, plus float checks.

Both programs must be Lax (``check.check_lax``); otherwise a ``LaxError`` is
raised and no verdict is given. Each trial draws its own primes (q prime in
[2**(bits-1), 2**bits), p = 2q + 1 prime, neither dividing a constant of
either program), fresh uniform inputs, a fresh omega of order q and fresh
random functions for the opaque ops, evaluates both programs and compares
every output by name. Trials continue until the false-positive bound is at
most ``max_bound`` (or ``max_trials`` is reached: "inconclusive"). Float checks
then filter candidates that are algebraically equal but numerically different:
float64 at several input scales, and each program in its own dtypes
(``dtype="native"``), where the candidate must be finite and close wherever
the first program is finite. They never turn a field mismatch into a pass.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..ir.check import check, check_lax
from ..ir.errors import GraphError, MirageError, TimeLimitError
from ..ir.limits import Deadline, check_seconds, fair_threads, programs_fixed, reserved
from ..ir.node import fmt_shape
from ..semantics.field import FieldCtx, FieldZeroDivisionError, SharedValues, evaluate_field
from ..semantics.primes import draw_primes, program_constants
from .bound import PerTrial, per_trial_bound
from .floatcheck import Counterexample, float_checks
from .memory import keeps_inputs, threads_that_fit, trial_inputs, verify_parts
from .plan import TrialPlan
from .runner import THREADS, Runner, runner


@dataclass
class VerifyResult:
    """The verdict of ``em.verify``.

    ``equivalent`` is True only when every field trial and the float checks
    agreed and ``false_positive_bound`` (the probability, over the random
    choices, that non-equivalent programs would have passed; see
    docs/verifier.md) is at most ``max_bound``. ``inconclusive`` is True when
    no difference was found but the bound could not be brought that low.
    ``primes`` lists each trial's (p, q). ``__bool__`` is ``equivalent``.
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
    inconclusive: bool = False
    max_bound: float = 1e-9
    primes: list[tuple[int, int]] = field(default_factory=list)
    native_checked: bool = False

    def __bool__(self) -> bool:
        return self.equivalent

    def __str__(self) -> str:
        if self.equivalent:
            checks = ", ".join(c for c, done in (("float64", self.float_checked),
                                                 ("native dtype", self.native_checked)) if done)
            return (f"equivalent (false-positive bound {self.false_positive_bound:.3g} after "
                    f"{self.trials} trials, fresh primes p ~ 2^{self.p.bit_length()} each"
                    f"{f', {checks} checks passed' if checks else ''}; {self.seconds:.2f} s)")
        if self.inconclusive:
            return f"inconclusive: {self.reason} ({self.seconds:.2f} s)"
        return f"NOT equivalent: {self.reason or self.counterexample} ({self.seconds:.2f} s)"


def match_interfaces(a, b) -> None:
    """A ``GraphError`` unless ``a`` and ``b`` agree on inputs (names, dtypes, shapes), outputs."""
    for name, node in a.inputs.items():
        if name in b.inputs and node.dtype != b.inputs[name].dtype:
            raise GraphError(f"cannot compare {a.name!r} and {b.name!r}: input {name!r} is "
                             f"{node.dtype} vs {b.inputs[name].dtype}")
    for kind, xa, xb in (("inputs", a.inputs, b.inputs), ("outputs", a.outputs, b.outputs)):
        if set(xa) != set(xb):
            raise GraphError(f"cannot compare {a.name!r} and {b.name!r}: {kind} differ "
                             f"({sorted(xa)} vs {sorted(xb)})")
        for name in xa:
            if xa[name].shape != xb[name].shape:
                raise GraphError(f"cannot compare {a.name!r} and {b.name!r}: {kind[:-1]} "
                                 f"{name!r} has shape {fmt_shape(xa[name].shape)} vs "
                                 f"{fmt_shape(xb[name].shape)}")


def output_dtypes_differ(a, b) -> str:
    """Why ``a`` and ``b`` (interfaces matched) are not equivalent by their outputs' dtypes
    alone: the first output whose dtype differs, named with both; "" when all agree. A
    program is what it returns, dtype included: a float32 output where the input program's
    is float16 is another program, however close its values."""
    for name, node in a.outputs.items():
        if str(node.dtype) != str(b.outputs[name].dtype):
            return (f"output {name!r} is {node.dtype} in {a.name!r} but "
                    f"{b.outputs[name].dtype} in {b.name!r}")
    return ""


def _first_mismatch(x: np.ndarray, y: np.ndarray) -> tuple[int, ...] | None:
    diff = np.argwhere(np.broadcast_to(x != y, np.broadcast_shapes(np.shape(x), np.shape(y))))
    return tuple(int(i) for i in diff[0]) if len(diff) else None


def _runs_itself(program) -> bool:
    """MuGraphs validate and execute themselves (their tiling is what gets verified)."""
    return hasattr(program, "evaluate_field")


def _field_outputs(x, ctx: FieldCtx, shared: SharedValues | None = None) -> dict:
    return x.evaluate_field(ctx) if _runs_itself(x) else evaluate_field(x, ctx, shared)


def _field_mismatch(a, out_a: dict, out_b: dict, ctx: FieldCtx, trial: int
                    ) -> Counterexample | None:
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


@dataclass
class _Trial:
    """What one field trial found: its primes, a counterexample, or every draw hit a zero."""

    p: int = 0
    q: int = 0
    cex: Counterexample | None = None
    vanished: bool = False


def _field_trial(a, b, t: int, base: int, bits: int, avoid: set[int], max_redraws: int,
                 memo: dict | None) -> _Trial:
    """Trial ``t`` with its own generator ``(base, t, redraw)``: primes, omega, random
    functions and inputs; a redraw when a denominator vanishes. With a ``memo`` (same
    ``a``, same ``base``) ``a``'s values of a draw are computed once across calls; the
    draw's inputs are kept with them when small (``memory.keeps_inputs``), else drawn
    again from the same generator (the same values) for each call."""
    keep = memo is not None and keeps_inputs(trial_inputs(a))
    for r in range(max_redraws + 1):
        rng = np.random.default_rng([base, t, r])
        p, q = draw_primes(rng, bits, avoid)
        key = ("field", t, r, p, q)
        shared = None  # common subterms of two Graphs, computed once (without a memo)
        try:
            hit = None if memo is None else memo.get(key)
            if hit is None:
                ctx = FieldCtx(p, q, rng)
                ctx.inputs = ctx.random_inputs(a)
                graphs = [x for x in (a, b) if not _runs_itself(x)]
                if len(graphs) == 2 and memo is None:
                    shared = SharedValues(*graphs)
                out_a = _field_outputs(a, ctx, shared)
                if memo is not None:  # the ctx, or what draws its inputs again
                    memo[key] = (ctx if keep else list(ctx.q_order), out_a)
            else:
                ctx, out_a = hit
                if not isinstance(ctx, FieldCtx):  # the same generator state as above
                    order, ctx = ctx, FieldCtx(p, q, rng)
                    ctx.replay(a, order)
            out_b = _field_outputs(b, ctx, shared)
        except FieldZeroDivisionError:
            continue
        finally:
            if memo is not None and isinstance(memo.get(key, (None,))[0], FieldCtx):
                memo[key][0].limb_cache = memo[key][0].input_cache()  # not kept between calls
        return _Trial(p, q, _field_mismatch(a, out_a, out_b, ctx, t))
    return _Trial(vanished=True)


def _numerics(a, b, result: VerifyResult, seed, rtol: float, native: bool, memo: dict | None,
              start: float, pool: Runner, pairs: bool = True) -> bool:
    """Run the float checks into ``result``; True (and ``result`` final) if they failed."""
    frng = np.random.default_rng(None if seed is None else [seed, 0xF1047])
    cex, result.native_checked = float_checks(a, b, frng, rtol, native, memo, pool,
                                              pairs=pairs)
    result.float_checked = True
    if cex is None:
        return False
    result.counterexample = cex
    result.reason = (f"{cex} (numerically different; checked before the field trials)"
                     if not result.trials else
                     f"{cex} (field trials passed: algebraically equal but numerically not)")
    result.seconds = time.perf_counter() - start
    return True


def _trials(pool: Runner, a, b, run: int, *args):
    """Field trials 0..run-1 in order (``in_order``); stops after one that ends the verdict."""
    jobs = [functools.partial(_field_trial, a, b, t, *args) for t in range(run)]
    for trial in pool.in_order(jobs):
        yield trial
        if trial.vanished or trial.cex is not None:
            return


def _trials_needed(eps: PerTrial, trials: int, max_bound: float) -> int | None:
    """Trials for ``eps.value ** T <= max_bound`` (at least ``trials``), None if unreachable."""
    if eps.value <= 0.0:
        return trials
    if eps.value >= 1.0:
        return None
    return max(trials, math.ceil(math.log(max_bound) / math.log(eps.value)))


# The trial cap when ``verify`` is given none: 32 (30 reach the default max_bound at a per
# trial bound of 1/2), raised for programs whose comparison bits multiply (bit degree k: a
# trial catches a difference with probability 2**-k only, bound.COMPARE_CATCH) to what
# the bits need at ``max_bound`` (k = 2, a clamp: 72; k = 3: 156; k = 4: 321), up to
# MAX_BIT_TRIALS: a higher degree stays inconclusive rather than running thousands of trials.
DEFAULT_MAX_TRIALS = 32
MAX_BIT_TRIALS = 1400


def trial_cap(eps: PerTrial, max_bound: float) -> int:
    """The trials ``verify`` allows when its caller sets no ``max_trials``: the default, or,
    where ``eps.bits`` comparison bits multiply, as many as ``eps.value`` needs to reach
    ``max_bound``, at most ``MAX_BIT_TRIALS``."""
    if eps.bits <= 1:
        return DEFAULT_MAX_TRIALS
    need = _trials_needed(eps, 1, max_bound)
    return max(DEFAULT_MAX_TRIALS, min(MAX_BIT_TRIALS, need or MAX_BIT_TRIALS))


def _check_args(trials, max_trials, max_bound, prime_bits, seed) -> None:
    if max_trials is None:
        max_trials = DEFAULT_MAX_TRIALS
    for name, value, low in (("trials", trials, 1), ("max_trials", max_trials, 1),
                             ("prime_bits", prime_bits, 8)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise MirageError(f"verify: {name} must be an integer, got {value!r}")
        if value < low:
            raise MirageError(f"verify: {name} must be >= {low}, got {value!r}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise MirageError(f"verify: seed must be None or an integer >= 0, got {seed!r}")
    if prime_bits > 30:
        raise MirageError(f"verify: prime_bits must be in [8, 30], got {prime_bits}")
    if not isinstance(max_bound, (int, float)) or not 0.0 < max_bound < 1.0:
        raise MirageError(f"verify: max_bound must be a number in (0, 1), got {max_bound!r}")


def verify(a, b, trials: int = 4, seed: int | None = None, prime_bits: int = 30,
           float_check: bool = True, rtol: float = 1e-7, max_redraws: int = 15,
           max_bound: float = 1e-9, max_trials: int | None = None,
           native_check: bool = True, memo: dict | None = None,
           float_first: bool = False, time_limit_s: float | Deadline | None = None
           ) -> VerifyResult:
    """Decide whether programs ``a`` and ``b`` compute the same outputs.

    Outputs and inputs are matched by name. At least ``trials`` independent
    finite-field trials run, each with its own primes (q < 2**prime_bits, p = 2q + 1),
    and more until ``false_positive_bound = per_trial_bound ** trials`` is at
    most ``max_bound``; if that needs more than ``max_trials`` trials the
    verdict is "inconclusive" (``equivalent`` False, ``inconclusive`` True). Without
    ``max_trials``, 32, or more where comparison bits multiply (``trial_cap``: 72 for a
    clamp's two, at most ``MAX_BIT_TRIALS``).
    Raises ``LaxError`` for a program outside the Lax fragment and
    ``GraphError`` when the two programs' inputs or outputs do not match.

    ``memo``: a dict kept across calls that compare the same first program ``a``
    with the same ``seed`` (``em.optimize`` passes one per search): ``a``'s
    float-check outputs and its values in each field trial are computed once. The field
    trials, then the float checks, each run on as many threads (up to ``THREADS``) as fit
    the memory budget (in ``optimize_many``'s workers: what the others leave of it,
    ``limits.reserved``). ``float_first`` runs the float checks before
    the field trials (the same verdict; cheaper when numerics are what fails).
    ``time_limit_s`` (seconds or a ``Deadline``): past it the verdict is "inconclusive".
    A program whose values would not fit the memory budget (``ir/limits.py``) is refused
    with a ``BudgetError`` before anything runs.
    """
    return _verify(**locals(), pairs=True)


def verify_without_pairs(a, b, **options) -> VerifyResult:
    """``verify`` (with its ``options``) without the float checks' draws that set two
    inputs against each other (``corners``: ``peakset``, the pairs' other forms,
    ``peaktie`` and the paired ``offset`` draws; their number grows with the square of the
    inputs): a shape family's checks at sizes where another size's check judged the same
    form with them (``family.sizes``). Not ``em.verify``: alone, its verdict on a pair
    hazard depends on the seed (``exp(A - B)`` -> ``exp(A) / exp(B)`` passed for 24, 11
    and 11 of 50 seeds in float16, bfloat16 and float32; ``verify`` refuses it for all)."""
    bound = inspect.signature(verify).bind(a, b, **options)
    bound.apply_defaults()
    return _verify(**bound.arguments, pairs=False)


def _verify(a, b, trials, seed, prime_bits, float_check, rtol, max_redraws, max_bound,
            max_trials, native_check, memo, float_first, time_limit_s, pairs) -> VerifyResult:
    """``verify``, with or without the float checks' pair draws (``pairs``)."""
    start = time.perf_counter()
    if not hasattr(a, "inputs") or not hasattr(b, "inputs"):
        bad = a if not hasattr(a, "inputs") else b
        raise MirageError(f"verify: expected two programs (em.Graph or em.MuGraph), got "
                          f"{type(bad).__name__} {bad!r:.60}")
    _check_args(trials, max_trials, max_bound, prime_bits, seed)
    if not isinstance(time_limit_s, Deadline):
        check_seconds(time_limit_s, "verify")
    for prog, what in ((a, "first program"), (b, "second program")):
        if _runs_itself(prog):
            prog.check_lax(what)  # validates, then checks exp depth through its tiles
            continue
        check(prog)
        check_lax(prog, what)
    match_interfaces(a, b)
    differ = output_dtypes_differ(a, b)
    if differ:  # the counterexample is the output itself: its dtype in each program
        name = next(n for n, v in a.outputs.items() if str(v.dtype) != str(b.outputs[n].dtype))
        cex = Counterexample("output dtype", name, (), str(a.outputs[name].dtype),
                             str(b.outputs[name].dtype), 0, detail="on every input")
        return VerifyResult(False, 1.0, cex, reason=differ, max_bound=max_bound,
                            seconds=time.perf_counter() - start)
    deadline = time_limit_s if isinstance(time_limit_s, Deadline) else Deadline(time_limit_s)
    if memo is not None and (seed is None or memo.setdefault("program", a) is not a
                             or memo.setdefault("seed", seed) != seed):
        memo = None  # a different first program or seed, or draws that differ every call
    eps = per_trial_bound(a, b, prime_bits)
    if max_trials is None:
        max_trials = trial_cap(eps, max_bound)
    needed = _trials_needed(eps, trials, max_bound)
    avoid = program_constants(a) | program_constants(b)
    result = VerifyResult(False, 1.0, None, 0, 0, 0, eps.value, max_bound=max_bound)
    run = trials if needed is None or needed > max_trials else needed
    def parts(n: int, phase: str) -> list:
        return verify_parts(a, b, n, run, memo is not None, phase)

    # trials, then float checks, at once: as many as fit each phase, refused if not one
    what = f"verifying {b.name!r} against {a.name!r}"
    try:
        with programs_fixed():  # a and b only read here: their peaks and stages made once
            threads = threads_that_fit(lambda n: parts(n, "trials"), THREADS, what)
            floats = threads_that_fit(lambda n: parts(n, "floats"), THREADS, what) \
                if float_check else threads
            base = int(np.random.default_rng().integers(0, 2**63)) if seed is None else seed
            # each phase's (threads, bytes), most threads first: optimize_many's workers
            # share the budget, and a phase takes as many threads as what the others leave
            # it fits
            fits = {phase: tuple((n, sum(x for _, x in parts(n, phase)))
                                 for n in range(most, 0, -1))
                    for phase, most in (("trials", threads), ("floats", floats))}
            how = TrialPlan(run, seed, base, max_trials, max_bound, prime_bits, avoid,
                            max_redraws, rtol, float_check, native_check, float_first, fits,
                            pairs)
            return _decide(a, b, result, eps, how, memo, start, deadline)
    except TimeLimitError as exc:
        result.inconclusive, result.reason = True, f"inconclusive: {exc}"
        result.seconds = time.perf_counter() - start
        return result


def _decide(a, b, result: VerifyResult, eps: PerTrial, how: TrialPlan, memo, start, deadline
            ) -> VerifyResult:
    """The trials and float checks of ``verify`` into ``result``."""
    seed, rtol, max_bound, max_redraws = how.seed, how.rtol, how.max_bound, how.max_redraws

    def numerics() -> bool:  # the float checks, on the threads that fit them
        with phase("floats") as pool:
            return _numerics(a, b, result, seed, rtol, how.native_check, memo, start, pool,
                             how.pairs)

    @contextlib.contextmanager
    def phase(name: str):  # a runner on the most threads whose bytes fit the budget now,
        fair = fair_threads()  # no more than this worker's share of the cores
        fits = [f for f in how.fits[name] if fair is None or f[0] <= fair]  # (1 is in it)
        with reserved([n for _, n in fits], deadline) as i, runner(deadline, fits[i][0]) as pool:
            yield pool

    if how.float_check and how.float_first and numerics():
        return result
    with phase("trials") as pool:
        found = _trials(pool, a, b, how.run, how.base, how.prime_bits, how.avoid, max_redraws,
                        memo)
        for t, trial in enumerate(found):
            if trial.vanished:
                result.reason = (f"inconclusive: a denominator vanished in {max_redraws + 1} "
                                 f"draws of trial {t}; cannot decide")
                result.inconclusive = True
                result.seconds = time.perf_counter() - start
                return result
            result.trials, result.p, result.q = t + 1, trial.p, trial.q
            result.primes.append((trial.p, trial.q))
            if trial.cex is not None:
                result.counterexample, result.reason = trial.cex, str(trial.cex)
                result.seconds = time.perf_counter() - start
                return result
    result.false_positive_bound = min(1.0, eps.value ** result.trials)
    if result.false_positive_bound > max_bound:
        result.inconclusive = True
        result.reason = (f"no difference found in {result.trials} trials, but the bound "
                         f"{result.false_positive_bound:.3g} is above max_bound "
                         f"{max_bound:g} (per trial {eps.value:.3g}: {eps.explain()}; "
                         f"{how.max_trials} trials allowed)")
        result.seconds = time.perf_counter() - start
        return result
    if how.float_check and not how.float_first and numerics():
        return result
    result.equivalent = True
    result.seconds = time.perf_counter() - start
    return result
