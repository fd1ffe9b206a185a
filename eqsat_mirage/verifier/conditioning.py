"""Whether rounding alone decides a program's output on a native-dtype draw.

The end-to-end check of a stitched program (``endtoend.py``) compares it with the input
program on native-dtype draws; on a draw where moving every input by one unit in its
dtype's last place moves the input program's exact output past the dtype's tolerance,
any implementation in those dtypes (eager torch's fused attention, a Triton kernel)
rounds its intermediates by as much, and two correct programs differ past the tolerance.
``ill_conditioned`` tells such draws (asked only where a draw found a difference); the
check then asks only for finiteness there.
"""

from __future__ import annotations

import math

import numpy as np

from ..semantics.floating import LazyInputs, evaluate, neighbour

ROUNDED = ("float16", "bfloat16", "float32")  # the input dtypes moved by one last place


def ill_conditioned(draws, kind: str, s: float, rtol: float) -> bool:
    """Whether on the draw (``kind``, ``s``) of ``draws`` (a ``draws.Draws``) the
    first program's float64 output moves somewhere by more than the native tolerance
    (``rtol`` times the output's scale plus the value, as ``floatcheck`` measures it, the
    scale at least the largest input magnitude) when every float16/bfloat16/float32
    input moves one unit in its dtype's last place (bool, integer and fp8 inputs held),
    up or down at random (a generator of its own, seeded from the draws'; each moved input
    made as the evaluation reads it). Attention logits
    in the thousands, where float16's spacing is as large as the gap between a row's two
    largest, make a token's output hinge on the last bit.
    Memoized in ``draws.memo``."""
    key = ("ill-conditioned", kind, s)
    if key in draws.memo:
        return draws.memo[key]
    rounded = draws.rounded(kind, s)
    names, start, at = list(draws.a.inputs), {}, 0
    for n, node in draws.a.inputs.items():  # where each input's directions start in the
        start[n] = at  # generator's stream (one 64-bit output a direction, inputs in order)
        at += math.prod(node.shape) if node.dtype in ROUNDED else 0

    def moved(name: str) -> np.ndarray:  # made as the evaluation reads it (no second set)
        x = rounded[name]
        if draws.a.inputs[name].dtype not in ROUNDED:  # masks, integers, fp8 weights: stored
            return x  # values, not roundings of a computation: held
        g = np.random.default_rng([draws.base, 3, len(kind), int(s * 1000)])
        g.bit_generator.advance(start[name])
        return neighbour(x, draws.a.inputs[name].dtype, g.random(np.shape(x)) < 0.5)

    ref, xa = draws.out_a(None, kind, s, True), draws.out_a("native", kind, s, True)
    floor = draws.largest(kind, s)
    # the exact output moved (float64), and the program's own native evaluation moved: where
    # one last-place step of the inputs moves its native output past the tolerance, its
    # rounding, not the program, decides the output there (a float32 layer on inputs across
    # the exponent range: its own error changed tenfold with the BLAS's summation order)
    bad = _moves(evaluate(draws.a, LazyInputs(names, moved)), ref, xa, floor, rtol) or \
        _moves(evaluate(draws.a, LazyInputs(names, moved), dtype="native", rounded=True),
               xa, xa, floor, rtol)
    draws.memo[key] = bad
    return bad


def _moves(there: dict, ref: dict, xa: dict, floor: float, rtol: float) -> bool:
    """Whether ``there`` differs from ``ref`` somewhere past ``rtol`` times the output's
    scale (at least ``floor``) plus the value, where all three are finite."""
    with np.errstate(invalid="ignore", over="ignore"):
        for name, x in xa.items():
            fin = np.isfinite(x) & np.isfinite(ref[name]) & np.isfinite(there[name])
            scale = max(float(np.max(np.abs(np.where(fin, x, 0)), initial=0.0)), floor) or 1.0
            if np.any(fin & (np.abs(there[name] - ref[name]) > rtol * (scale + np.abs(x)))):
                return True
    return False
