"""Rounding to float16 and back, bit for bit as a float16 conversion rounds (nearest even,
subnormals, overflow to inf, signed zeros, NaN).

The native-dtype evaluations round every float16 node, so this is the float checks' hot
path. NumPy's float32 -> float16 cast is slow where values overflow or are subnormal
(1.4 and 2.5 ms for 32,768 such values against 0.09 ms for normal ones, NumPy 2.4 on this
project's CPU); torch's conversion (F16C or NEON) takes 0.01 ms for any of them. Where
torch is installed, float32 arrays of ``TORCH_FROM`` elements or more are rounded by it
(imported on first use), in chunks under its parallel grain so that it starts no threads
of its own beside the verifier's; otherwise NumPy's cast, or the bit arithmetic below for
arrays that are mostly float16 subnormals. Every path gives the same bits
(tests/semantics/test_native_dtype.py).
"""

from __future__ import annotations

import importlib.util
import sys
import threading

import numpy as np


# Round to nearest even at float16's precision by one addition: x + c - c, c = 1.5 * 2**(e + k)
# with e the exponent of x clamped to float16's [-14, 15] (below -14: float16's subnormal
# step 2**-24), k = 13 in float32 and 42 in float64 (c's last bit is 2**(e - 10)); |x| >= 65520
# (and inf, nan) become inf/nan. Exact, as NumPy's conversion, which is several times slower
# where values overflow or are subnormal.
def _half_consts(ut, mant: int, ebits: int, k: int, big: int) -> tuple:
    bias = (1 << (ebits - 1)) - 1
    return (ut, ut(((1 << ebits) - 1) << mant), ut((bias - 14) << mant), ut((bias + 15) << mant),
            ut((k << mant) | (1 << (mant - 1))), ut(1 << (mant + ebits)),
            ut((1 << (mant + ebits)) - 1), ut(big))


_HALF = {np.dtype(np.float32): _half_consts(np.uint32, 23, 8, 13, 0x477FEFFF),
         np.dtype(np.float64): _half_consts(np.uint64, 52, 11, 42, 0x40EFFDFFFFFFFFFF)}


_NUMPY_CASTS = int(np.__version__.split(".")[0]) >= 2  # NumPy 2's float16 casts are fast
_TINY_HALF = 2.0 ** -14  # float16's smallest normal
_MAX_HALF = 65504.0  # float16's largest
_SAMPLE = 4096  # elements ``_subnormal_heavy`` looks at


def _subnormal_heavy(x: np.ndarray) -> bool:
    """Whether more than 1 in 20 of ``x``'s values (an evenly strided sample) fall in
    float16's subnormal range, where NumPy's cast takes about 20x longer per element. From
    2 samples' size on: the trough draw's float16 evaluations (8 x 4096 values, most of
    them subnormal) spent 28 of their 42 ms in that cast."""
    if x.size < 2 * _SAMPLE:
        return False
    # picked by position, never by ``reshape(-1)``: that copies a transposed or strided array
    sample = np.abs(x[np.unravel_index(np.arange(0, x.size, x.size // _SAMPLE), x.shape)])
    return int(np.count_nonzero((sample < _TINY_HALF) & (sample > 0))) * 20 > sample.size


def _cast_fast(x: np.ndarray) -> bool:
    """Whether NumPy's own float16 cast is the fast way to round ``x`` (NumPy 2, a float
    array, not mostly float16 subnormals)."""
    return _NUMPY_CASTS and x.dtype in _HALF and not _subnormal_heavy(x)


TORCH_FROM = 4096  # elements from which float32 arrays are rounded by torch, where it is
_TORCH_CHUNK = 1 << 15  # elements per conversion: torch's grain, under which it runs on the
_TORCH: list = []  # calling thread alone; torch, or None where it is not installed
_TORCH_LOCK = threading.Lock()


def _torch():
    """torch, imported on first use, or None where it is not installed."""
    if not _TORCH:
        with _TORCH_LOCK:
            if not _TORCH:
                found = sys.modules.get("torch")
                if found is None and importlib.util.find_spec("torch") is not None:
                    import torch as found
                _TORCH.append(found)
    return _TORCH[0]


def _by_torch(x: np.ndarray, out_dtype) -> np.ndarray | None:
    """``x`` (float32) rounded to float16 by torch, as ``out_dtype`` (float16, or float32
    holding float16 values); None where torch is not used for it."""
    if x.dtype != np.float32 or x.size < TORCH_FROM:
        return None
    torch = _torch()
    if torch is None:
        return None
    x = np.ascontiguousarray(x)
    if not x.flags.writeable:  # (torch.from_numpy warns on a read-only array)
        x = x.copy()
    out = np.empty(x.shape, out_dtype)
    src, dst = torch.from_numpy(x.reshape(-1)), torch.from_numpy(out.reshape(-1))
    half = out_dtype == np.float16
    for i in range(0, src.numel(), _TORCH_CHUNK):
        part = src[i:i + _TORCH_CHUNK]
        dst[i:i + _TORCH_CHUNK].copy_(part if half else part.to(torch.float16))
    return out


def round_half(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to float16 values, as float32 (bit-exact with NumPy's conversion).

    A float32 array of ``TORCH_FROM`` elements or more: torch's conversion, where torch is
    installed (``_by_torch``). Otherwise, with NumPy 2, that conversion itself (float64
    or float32 straight to float16, round to nearest even): 0.23 s for a 4096 x 11008
    matrix against 0.4 (float32) to 0.9 s (float64) for the bit arithmetic below, which
    stays for older NumPy, whose casts were slower, and for arrays with many values in
    float16's subnormal range, where the cast takes 2.6-4.9 s (the float checks' per-input
    peaks of an attention weight: 2^-15)."""
    x = np.asarray(x)
    done = _converted(x, np.float32)
    if done is not None:
        return done
    if x.dtype not in _HALF:
        x = x.astype(np.float32)
    if x.ndim == 0:
        return round_half(x.reshape(1)).reshape(())
    x = np.ascontiguousarray(x)
    ut, exp_mask, lo, hi, add, sign, mag_mask, big = _HALF[x.dtype]
    u = x.view(ut)
    c = np.bitwise_and(u, exp_mask)
    np.clip(c, lo, hi, out=c)
    c += add
    c |= u & sign
    y = x + c.view(x.dtype)
    y -= c.view(x.dtype)
    over = np.flatnonzero(np.bitwise_and(u, mag_mask, out=c) > big)
    if over.size:
        yf, xf = y.reshape(-1), x.reshape(-1)
        yf[over] = np.copysign(np.inf, xf[over])
        yf[over[np.isnan(xf[over])]] = np.nan
    out = y.astype(np.float32, copy=False)
    return np.copysign(out, x, out=out)  # -0.0 stays -0.0


def to_half(x: np.ndarray) -> np.ndarray:
    """``x`` (float32 or float64) rounded to float16, as a float16 array: ``round_to(x,
    "float16")`` in float16's own 2 bytes, in one conversion where torch's or NumPy's is
    fast."""
    x = np.asarray(x)
    done = _converted(x, np.float16)
    return done if done is not None else round_half(x).astype(np.float16)


def _converted(x: np.ndarray, out_dtype) -> np.ndarray | None:
    """``x`` rounded to float16 by one conversion, torch's (``_by_torch``) or NumPy's
    where it is fast (``_cast_fast``), as ``out_dtype`` (float16, or float32 holding
    float16 values); None where neither applies (``round_half``'s bit arithmetic)."""
    done = _by_torch(x, out_dtype)
    if done is not None or not _cast_fast(x):
        return done
    with np.errstate(over="ignore", invalid="ignore"):
        half = x.astype(np.float16)
    return half if out_dtype == np.float16 else half.astype(np.float32)


# every float16 bit pattern's float32 value: a look-up (``by_bits``: 0.08 s for 45M values)
# beats NumPy's cast where values are float16 subnormals (0.65-0.7 s there, 0.1 s elsewhere)
EVERY_HALF = np.arange(1 << 16, dtype=np.uint16).view(np.float16)  # by bit pattern
EVERY_HALF.flags.writeable = False  # (a table to look values up in, shared)
_HALVES = EVERY_HALF.astype(np.float32)
_BITS_CHUNK = 1 << 14  # elements ``by_bits`` looks up at once: their indices stay in cache


def by_bits(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``table[bits]`` for the 16-bit patterns ``bits`` of a float16 (or uint16) array
    ``x``, ``table`` holding a value for each of the 65536 patterns: ``table.take`` in
    chunks of ``_BITS_CHUNK`` (NumPy widens the indices of one ``take`` to int64 first:
    for a 45M-element weight, 360 MB written and read back; a chunk's stay in cache:
    0.07-0.14 s against 0.16-0.33 s, float16 to float64 tables, on this project's CPU)."""
    if len(table) != 1 << 16:
        raise ValueError(f"by_bits: a table of {len(table)} values, not one per 16-bit pattern")
    bits = x.view(np.uint16)
    if bits.size <= _BITS_CHUNK or not bits.flags.c_contiguous:
        return np.asarray(table.take(bits))  # (a 0-d array stays an array, not a scalar)
    out = np.empty(bits.shape, table.dtype)
    src, dst = bits.reshape(-1), out.reshape(-1)
    for i in range(0, src.size, _BITS_CHUNK):  # "clip": no bounds check (every index fits),
        table.take(src[i:i + _BITS_CHUNK], out=dst[i:i + _BITS_CHUNK], mode="clip")  # so no
    return out  # buffered copy of ``out``


def from_half(x: np.ndarray, factor: float = 1.0) -> np.ndarray:
    """A float16 array's values as float32, times ``factor`` (a power of two >= 1: exact,
    or past float16's largest, which becomes inf as a float16 product would), without
    NumPy's slow cast of subnormals: by a table of the 65536 bit patterns (``by_bits``)."""
    table = _HALVES
    if factor != 1.0:
        with np.errstate(over="ignore", invalid="ignore"):
            table = _HALVES * np.float32(factor)
            np.copysign(np.float32(np.inf), table, out=table, where=np.abs(table) > _MAX_HALF)
    return by_bits(table, x)
