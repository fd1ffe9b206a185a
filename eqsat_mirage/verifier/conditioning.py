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

import numpy as np

from ..semantics.floating import evaluate, neighbour


def ill_conditioned(draws, kind: str, s: float, rtol: float) -> bool:
    """Whether on the draw (``kind``, ``s``) of ``draws`` (a ``draws.Draws``) the
    first program's float64 output moves somewhere by more than the native tolerance
    (``rtol`` times the output's scale plus the value, as ``floatcheck`` measures it, the
    scale at least the largest input magnitude) when every float input moves one unit in
    its dtype's last place, up or down at random (a generator of its own, seeded from the
    draws'). Attention logits in the thousands, where float16's spacing is as large as
    the gap between a row's two largest, make a token's output hinge on the last bit.
    Memoized in ``draws.memo``."""
    key = ("ill-conditioned", kind, s)
    if key in draws.memo:
        return draws.memo[key]
    g = np.random.default_rng([draws.base, 3, len(kind), int(s * 1000)])
    moved = {n: x if draws.a.inputs[n].dtype == "bool" else neighbour(
        x, draws.a.inputs[n].dtype, g.random(np.shape(x)) < 0.5)
        for n, x in draws.rounded(kind, s).items()}
    there = evaluate(draws.a, moved)
    ref, xa = draws.out_a(None, kind, s, True), draws.out_a("native", kind, s, True)
    floor = draws.largest(kind, s)
    bad = False
    with np.errstate(invalid="ignore", over="ignore"):
        for name, x in xa.items():
            fin = np.isfinite(x) & np.isfinite(ref[name]) & np.isfinite(there[name])
            scale = max(float(np.max(np.abs(np.where(fin, x, 0)), initial=0.0)), floor) or 1.0
            bad |= bool(np.any(fin & (np.abs(there[name] - ref[name])
                                      > rtol * (scale + np.abs(x)))))
    draws.memo[key] = bad
    return bad
