"""float8 values (fp8 weights, issue 53): the exact values of the 256 codes of
``float8_e4m3fn`` and ``float8_e5m2``, rounding to them, the verifier's draws of them and
``em.evaluate``'s check of an fp8 input.

The float backends hold an fp8 tensor's values as float32/float64 numbers (every finite
fp8 value is exact there, and in float16 and bfloat16 too), so a cast from fp8 to a float
dtype is the identity on them. The table is decoded from the bits here (no torch):

- e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; S.1111.111 is NaN
  (two codes), so the largest finite value is 448 (S.1111.110);
- e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-like: exponent 31 is inf
  (mantissa 0) or NaN (three codes each sign); the largest finite value is 57344.

Both have subnormals (exponent 0: mantissa times 2^(1 - bias - mantissa bits)) and -0.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from ..ir.node import FP8_DTYPES, FP8_MAX

_LAYOUT = {"float8_e4m3fn": (4, 3, 7), "float8_e5m2": (5, 2, 15)}  # exponent, mantissa, bias


@cache
def fp8_values(dtype: str) -> np.ndarray:
    """The value of each of ``dtype``'s 256 codes (index = the byte), float64, read-only:
    NaN at its NaN codes, +-inf at e5m2's infinities."""
    ebits, mbits, bias = _LAYOUT[dtype]
    code = np.arange(256)
    sign = np.where(code >> 7, -1.0, 1.0)
    exp = (code >> mbits) & ((1 << ebits) - 1)
    man = code & ((1 << mbits) - 1)
    mag = np.where(exp == 0, man * 2.0 ** (1 - bias - mbits),
                   (1 + man / 2.0 ** mbits) * 2.0 ** (exp - bias))
    top = exp == (1 << ebits) - 1
    if dtype == "float8_e4m3fn":  # no infinities: only S.1111.111 is NaN
        mag = np.where(top & (man == (1 << mbits) - 1), np.nan, mag)
    else:
        mag = np.where(top, np.where(man == 0, np.inf, np.nan), mag)
    out = sign * mag
    out.flags.writeable = False
    return out


@cache
def finite_codes(dtype: str) -> np.ndarray:
    """The codes (bytes) of ``dtype``'s finite values: 254 for e4m3fn, 248 for e5m2 (both
    zeros among them)."""
    out = np.flatnonzero(np.isfinite(fp8_values(dtype)))
    out.flags.writeable = False
    return out


def round_fp8(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` rounded to the nearest value of ``dtype`` (ties to the even code, as a
    conversion rounds), in ``x``'s float dtype (float32 stays float32, else float64): past
    the largest finite value e4m3fn saturates to +-448 (torch's conversion) and e5m2 goes
    to +-inf from 61440 (half a unit above 57344); NaN stays. An array of values of
    ``dtype`` (the verifier's draws, read again at every evaluation) is returned as it is,
    after one pass that checks it (``is_fp8``). Else each value is rounded to a multiple of
    its binade's spacing (of the smallest subnormal below the normal range): the quotient
    by a power of two is exact and ``np.round`` rounds it half to even, and an even
    quotient is an even code."""
    x = np.asarray(x)
    x = x if x.dtype == np.float32 else np.asarray(x, dtype=np.float64)
    if is_fp8(x, dtype).all():
        return x
    _, mbits, bias = _LAYOUT[dtype]
    with np.errstate(invalid="ignore", over="ignore"):
        exp = np.frexp(x)[1]  # |x| in [2^(exp-1), 2^exp)
        spacing = np.ldexp(x.dtype.type(1), np.maximum(exp - 1 - mbits, 1 - bias - mbits))
        out = np.round(x / spacing) * spacing
        top = x.dtype.type(FP8_MAX[dtype])
        if dtype == "float8_e4m3fn":  # saturates (inf too)
            return np.where(np.isnan(x), x, np.clip(out, -top, top))
        return np.where(np.abs(x) >= top + 2.0 ** 12, np.copysign(np.inf, x), out).astype(
            x.dtype)


def is_fp8(x: np.ndarray, dtype: str) -> np.ndarray:
    """Where ``x`` holds a finite value of ``dtype`` (elementwise), from the float32 bits:
    at most ``dtype``'s mantissa bits set, at most its largest value, and below its
    smallest normal a multiple of its smallest subnormal (NaN and inf fail each test)."""
    x = np.asarray(x)
    x32 = x if x.dtype == np.float32 else np.asarray(x, dtype=np.float32)
    _, mbits, bias = _LAYOUT[dtype]
    with np.errstate(invalid="ignore", over="ignore"):
        low = np.uint32((1 << (23 - mbits)) - 1)  # float32's mantissa bits below dtype's
        a = np.abs(x32)
        ok = ((x32.view(np.uint32) & low) == 0) & (a <= np.float32(FP8_MAX[dtype]))
        tiny = a < np.float32(2.0 ** (1 - bias))  # below the smallest normal: subnormals
        if tiny.any():
            k = x32 * np.float32(2.0 ** (bias - 1 + mbits))  # in units of the smallest
            ok &= ~tiny | (k == np.round(k))
        if x32 is not x:  # a float64 value that float32 does not hold is no fp8 value
            ok &= x32 == x
    return ok


def draw_fp8(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Values of ``dtype`` of ``shape``, as float32 (exact): each element the value of a
    uniformly drawn finite code, with both extremes (+-448 for e4m3fn, +-57344 for e5m2)
    and 0 at random positions and, where the tensor has room (254 or 248 elements), every
    finite code once (each subnormal, each binade, -0); never a NaN or inf code."""
    codes = finite_codes(dtype)
    vals = fp8_values(dtype)
    finite = vals[codes].astype(np.float32)
    out = finite[rng.integers(0, len(codes), size=shape)]
    flat = out.reshape(-1)
    top = FP8_MAX[dtype]
    first = [c for c in codes if vals[c] in (top, -top) or c == 0]  # the extremes, +0
    rest = [c for c in rng.permutation(codes) if c not in first]
    head = vals[np.array(first + rest)][:flat.size].astype(np.float32)
    flat[rng.choice(flat.size, size=head.size, replace=False)] = head
    return out


__all__ = ["FP8_DTYPES", "draw_fp8", "finite_codes", "fp8_values", "is_fp8", "round_fp8"]
