"""Accuracy in bits, after Herbie (Panchekha et al., PLDI 2015): how many of a value's
low-order bits are wrong against a ground truth, and how many a candidate loses against
the input program's own error (docs/verifier.md, section 5).

A value ``x`` of dtype ``d`` against the truth ``r`` has ``log2(1 + |x - r| / ulp_d(r))``
bits of error (Herbie counts the floating-point values between the two; the distance in
units of the last place of ``r`` is that count up to a factor below 2 across a binade): 0
when ``x`` is the truth, about 0.6 when it is the truth correctly rounded, the dtype's
whole width when it is not finite. Herbie averages the bits over its sample points, and so
does ``bits_lost``: the candidate's average over an output's valid elements minus the
input program's. A rewrite that cancels what the input program kept apart (``x @ W - y @ W``
for ``(x - y) @ W`` on nearly equal x and y) loses about as many bits as the inputs have
in common; reordering a sum or rounding once more loses about one.
"""

from __future__ import annotations

import numpy as np

MAX_BITS_LOST = 2.0  # a candidate's average error may exceed the input program's by this
# each dtype's explicit significand bits, least binary exponent of its normals, width
_FORMAT = {"float16": (10, -14, 16), "bfloat16": (7, -126, 16), "float32": (23, -126, 32),
           "float64": (52, -1022, 64)}


def bits_of_error(x: np.ndarray, r: np.ndarray, dtype: str) -> np.ndarray:
    """Per element, the bits of error of ``x`` (values of ``dtype``) against the truth ``r``
    (finite): ``log2(1 + |x - r| / ulp(r))``, the ulp that of ``dtype`` at ``r`` (its
    subnormals' spacing below its normals); the dtype's width where ``x`` is not finite."""
    mant, emin, width = _FORMAT.get(str(dtype), _FORMAT["float32"])
    x, r = np.asarray(x, dtype=np.float64), np.asarray(r, dtype=np.float64)
    with np.errstate(all="ignore"):
        exp = np.maximum(np.floor(np.log2(np.abs(r))), emin)
        ulp = np.exp2(exp - mant)
        bits = np.log2(1.0 + np.abs(x - r) / ulp)
    return np.where(np.isfinite(x), np.minimum(bits, width), float(width))


def bits_lost(xa: np.ndarray, xb: np.ndarray, r: np.ndarray, valid: np.ndarray,
              dtype: str) -> tuple[float, tuple[int, ...] | None]:
    """How many bits of accuracy ``xb`` loses against ``xa`` on average over ``valid``
    elements (both judged against ``r`` in ``dtype``), and the element where it loses
    most (None where no element is valid)."""
    shape = np.broadcast_shapes(np.shape(xa), np.shape(xb), np.shape(r), np.shape(valid))
    valid = np.broadcast_to(valid, shape)
    if not np.any(valid):
        return 0.0, None
    r = np.broadcast_to(r, shape)
    ea = np.broadcast_to(bits_of_error(xa, r, dtype), shape)
    eb = np.broadcast_to(bits_of_error(xb, r, dtype), shape)
    lost = float(np.mean(eb[valid]) - np.mean(ea[valid]))
    worst = np.where(valid, eb - ea, -np.inf)
    return lost, tuple(int(i) for i in np.unravel_index(int(np.argmax(worst)), shape))
