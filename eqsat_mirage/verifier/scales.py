"""The scales of the float checks' draws (docs/verifier.md, section 5): which binary
exponents the inputs are drawn at, one for all of them (``exponent``), one for each
(``apart``) and where the first program's outputs underflow (``trough``); and the scale of
realistic attention logits (``logit_scale``).

Only the ``exponent`` draws' exponents come from the seed (the ``apart`` draws' come from a
generator of their own, the same for every seed); the trough's comes from the
program (a seed's mantissas move it by one at most, where the share of normal outputs sits
at a half), so that whether an underflowing intermediate is found does not hang on the
seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..ir.node import Op
from ..semantics.floating import FLOAT_SEMANTICS, float_ctx
from ..semantics.interp import Outputs, run
from .floatsafe import is_graph

# The binary exponents of each dtype's normal numbers (float16 from 2^-14 to 2^15, ...).
EXP_RANGE = {"float16": (-14, 15), "bfloat16": (-126, 127), "float32": (-126, 127)}
EXPONENT_DRAWS = 2  # N(0, 1) times 2^k, k uniform in the inputs' exponent range
# the least binary exponent of the exponent draws' and the trough's scale, in every dtype: float16's
# least subnormal. A scale below it makes every input smaller than any float16 tensor
# holds, activations and weights alike: a float32 candidate's loss there (a fused RMSNorm +
# Linear's X @ W near 2^-140, Mistral's ``rsqrt(..) * (x * w)``) is one no model meets, and
# refusing it cost the fused kernel (36.5 -> 40.4 us predicted)
LEAST_SCALE = -24
# the ``apart`` draws: each float input at its own binary exponent, uniform from LEAST_SCALE
# to GREATEST_SCALE (float16's largest exponent, 15, less 3: |z| < 8 stays finite), every
# magnitude a float16 tensor holds, whatever the dtype (a float32 fused RMSNorm + Linear's
# X @ W overflows only with X and W near 2^64: no model's); from APART_SEED, not the seed
APART_DRAWS = 2
GREATEST_SCALE = 12
APART_SEED = 0xA9A7
# the ``zeros`` draw: N(0, 1) with each float input exactly 0 at about one element in
# ZERO_EVERY (at least one), at positions from ZEROS_SEED, not the seed: a candidate that
# divides by an input (``y -> (x / x) * y``) is NaN there where the first program is not
ZERO_EVERY = 8
ZEROS_SEED = 0x2E05
LOGIT_STD = 9.0  # realistic attention logits: exp arguments with this standard deviation


def exp_range(dtype: str) -> tuple[int, int]:
    """The binary exponents of ``dtype``'s normal numbers (float32's for a dtype without)."""
    return EXP_RANGE.get(dtype, EXP_RANGE["float32"])


def exponent_power(base: int, j: int, dtypes: list[str]) -> int:
    """The exponent k of exponent draw ``j`` (``base``: the seed's): uniform from
    ``LEAST_SCALE`` (or the inputs' least normal) up to 2^3 below the narrowest input's
    largest (|z| < 8 stays finite). A first draw below ``LEAST_SCALE`` is drawn again
    from the same generator, so that every k the old range gave above it stays."""
    g = np.random.default_rng([base, 1, j])
    lo = max(exp_range(d)[0] for d in dtypes)
    hi = min(exp_range(d)[1] for d in dtypes) - 2
    k = int(g.integers(lo, hi))
    return k if k >= LEAST_SCALE else int(g.integers(max(lo, LEAST_SCALE), hi))


def apart_powers(j: int, dtypes: list[str]) -> list[int]:
    """The binary exponent of each input (of ``dtypes``, in order) in ``apart`` draw ``j``:
    uniform from ``LEAST_SCALE`` (or the dtype's least normal) to ``GREATEST_SCALE`` (or 2^3
    below its largest), each input's own, the same for every seed."""
    g = np.random.default_rng([APART_SEED, j])
    return [int(g.integers(max(exp_range(d)[0], LEAST_SCALE),
                           min(exp_range(d)[1] - 2, GREATEST_SCALE + 1))) for d in dtypes]


def zero_mask(i: int, shape: tuple[int, ...]) -> np.ndarray:
    """Where input ``i`` (in order) is 0 in the ``zeros`` draw: one element in about
    ``ZERO_EVERY``, element ``i`` (mod its size) always among them, the same for every
    seed."""
    size = int(np.prod(shape, dtype=np.int64))
    g = np.random.default_rng([ZEROS_SEED, i])
    mask = g.integers(0, ZERO_EVERY, size, dtype=np.uint8) == 0
    if size:
        mask[i % size] = True
    return mask.reshape(shape)


def trough(counts: Callable[[int], tuple[int, int, int, float]], lo: int) -> int | None:
    """The trough's binary exponent k: the largest k from ``lo`` up to 0 at which the first
    program's outputs underflow, ``counts(k)`` giving its float outputs' (elements, finite,
    normal, median binary exponent above their dtype's smallest normal) on the draw at k.
    At k its outputs underflow where at least half are finite and fewer than half of those
    normal, and are normal where at least half of the finite ones are. ``lo`` where they
    are normal even there (a normalization's output keeps its scale); None where they are
    not normal at 0 already, or where the k found has most outputs non-finite (the first
    program fails before its outputs underflow: nothing to compare there). The medians at
    0 and ``lo`` place a first guess (outputs of one degree in the inputs' scale move one
    exponent per exponent times it: the boundary in two more evaluations, four in all); a
    bisection finishes where the guess is off (at most 2 + ceil(log2(-lo)) + 2)."""
    memo: dict[int, tuple[int, int, int, float]] = {}

    def at(k: int) -> tuple[int, int, int, float]:
        if k not in memo:
            memo[k] = counts(k)
        return memo[k]

    def normal(k: int) -> bool:
        _, finite, big, _ = at(k)
        return finite > 0 and 2 * big >= finite

    if not normal(0):
        return None
    if normal(lo):  # unless the first program is mostly non-finite there
        total, finite, _, _ = at(lo)
        return lo if 2 * finite >= total else None
    low, high = lo, 0  # not normal(low), normal(high)
    (*_, top), (*_, bottom) = at(0), at(lo)
    if np.isfinite(top) and np.isfinite(bottom) and top > bottom:
        # the median moves (top - bottom) / -lo a step: the first normal k, predicted
        guess = min(max(math.ceil(-top * -lo / (top - bottom)), lo + 1), 0)
        if normal(guess):
            high = guess
            if guess - 1 > lo and normal(guess - 1):
                high = guess - 1
            else:
                low = guess - 1
        else:
            low = guess
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if normal(mid) else (mid, high)
    total, finite, _, _ = at(low)
    return low if finite > 0 and 2 * finite >= total else None


def output_counts(out: dict, tiny: dict[str, float]) -> tuple[int, int, int, float]:
    """``trough``'s counts of the outputs ``out`` named in ``tiny`` (each with its dtype's
    smallest normal): elements, finite and normal ones, and the median of the finite
    ones' binary exponents above that smallest normal (-inf where none is finite)."""
    total = finite = big = 0
    above = []
    for n, least in tiny.items():
        x = np.asarray(out[n], dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            fin = np.isfinite(x)
            e = np.log2(np.abs(x[fin]) / least)
        big += int(np.count_nonzero(e >= 0))
        total, finite = total + x.size, finite + int(np.count_nonzero(fin))
        above.append(e.ravel())
    return total, finite, big, float(np.median(np.concatenate(above))) if finite else -np.inf


def logit_scale(a, inputs: Callable[[str, float], dict]) -> float:
    """The input scale c at which the first program ``a``'s exp arguments on N(0, c^2)
    inputs (``inputs("signed", c)``) have standard deviation ``LOGIT_STD`` (estimated
    from scales 1 and 2 in float64, as a power law); 1 without an exp."""
    if not is_graph(a):
        return 1.0
    exps = [n.srcs[0] for n in a.nodes() if n.op is Op.EXP]
    if not exps:
        return 1.0
    # only what the exp arguments are computed from runs (a layer's attention scores,
    # not its MLP: an eighth of a 7B layer's products), each value dropped once read
    args = Outputs({f"arg{i}": n for i, n in enumerate(exps)})

    def spread(s: float) -> float:
        with np.errstate(all="ignore"):
            got = run(args, FLOAT_SEMANTICS, float_ctx(a, inputs("signed", s), None, False))
        best = 0.0
        with np.errstate(all="ignore"):
            for v in got.values():
                v = np.asarray(v)
                v = v[np.isfinite(v)]
                best = max(best, float(np.std(v)) if v.size else 0.0)
        return best

    s1 = spread(1.0)
    if not s1 > 0.0:
        return 1.0
    s2 = spread(2.0)
    degree = min(max(math.log2(s2 / s1), 0.5), 4.0) if s2 > 0 else 1.0
    return float((LOGIT_STD / s1) ** (1.0 / degree))
