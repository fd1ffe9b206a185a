"""Exact arithmetic mod a prime on int64 arrays: the field backend's building blocks.

Residues are below 2**31, so a product of two fits in int64. ``matmul_mod`` is
exact by float64 BLAS: the smaller operand is cut into signed digits small
enough that float64 products and sums stay exact (two or three digits for the
benchmarks' contraction lengths; longer than 2**15 is chunked), the other
operand is used whole, and the digit products are recombined mod m.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from typing import Any

import numpy as np

from .gemm import ancestors, batch_broadcast, one_gemm

EXACT_K = 1 << 15  # longest contraction done in one BLAS call (keeps digits >= 8 bits)


class FieldZeroDivisionError(ArithmeticError):
    """A denominator vanished in this trial; the verifier redraws the trial."""


def is_array(x: Any) -> bool:
    """True for an ndarray with at least one axis (which in-place ops can update)."""
    return isinstance(x, np.ndarray) and x.ndim > 0


def mod(r: Any, m: int) -> Any:
    """``r % m``, in place when ``r`` is a fresh array (saves a big temporary)."""
    if is_array(r):
        r %= m
        return r
    return r % m


def mulmod(a: np.ndarray, b: Any, m: int) -> np.ndarray:
    """Elementwise a*b mod m for residues below 2**31."""
    return mod(a * b, m)


def addmod(a: np.ndarray, b: Any, m: int) -> np.ndarray:
    """Elementwise a+b mod m."""
    return mod(a + b, m)


def submod(a: np.ndarray, b: Any, m: int) -> np.ndarray:
    """Elementwise a-b mod m."""
    return mod(a - b, m)


def powmod(x: np.ndarray, e: int, m: int) -> np.ndarray:
    """Elementwise x**e mod m by square-and-multiply (vectorised, in place)."""
    base = x % m
    result = np.ones_like(base)
    if not is_array(base):
        while e:
            if e & 1:
                result = (result * base) % m
            base = (base * base) % m
            e >>= 1
        return result
    while e:
        if e & 1:
            result *= base
            result %= m
        e >>= 1
        if e:
            base *= base
            base %= m
    return result


DRAW_CHUNK = 1 << 22  # residues drawn per generator when an input is larger than this


def residues(rng: np.random.Generator, m: int, shape: tuple[int, ...]) -> np.ndarray:
    """Uniform residues of ``shape`` as int64, from ``rng``: in [0, m) for an input of at
    most ``DRAW_CHUNK`` elements, as NumPy draws them; a larger one (a 7B layer's weights:
    45M) uniform in [0, 2**k), 2**k the largest power of two not above m, from the raw
    bits of generators seeded by ``rng`` (``chunked``): 2 ns a value against 15 for
    ``Generator.integers`` (2.7 G values a 7B MLP candidate's trials). A subset of the
    field is as good a sampling set for the Schwartz-Zippel bound as the field, whose size
    it uses: ``bound.per_trial_bound`` takes 2**bits for p and 2**(bits - 1) for q, the
    least of both sets (docs/verifier.md)."""
    n = math.prod(shape)
    if n <= DRAW_CHUNK:
        return rng.integers(0, m, shape, dtype=np.int64)
    mask = np.uint64((1 << min(m.bit_length() - 1, 32)) - 1)

    def fill(g: np.random.Generator, out: np.ndarray) -> None:
        words = g.bit_generator.random_raw((out.size + 1) // 2)
        half = out.size // 2  # two values a 64-bit word: its low and its high 32 bits
        low, high = out[:half].view(np.uint64), out[half:].view(np.uint64)
        np.bitwise_and(words[:half], mask, out=low)
        np.right_shift(words[:out.size - half], np.uint64(32), out=high)
        np.bitwise_and(high, mask, out=high)

    return chunked(rng, shape, np.int64, fill)


def chunked(rng: np.random.Generator, shape: tuple[int, ...], dtype,
            fill: Callable[[np.random.Generator, np.ndarray], None],
            stop: Callable[[], None] | None = None) -> np.ndarray:
    """A new array of ``shape`` and ``dtype`` filled ``DRAW_CHUNK`` elements at a time, on
    one thread per core: ``fill(generator, chunk)`` writes each flat chunk from a generator
    of its own, seeded by ``rng`` (the same values for the same state; the array owns its
    memory, so views of it lead back to it). A large input's field residues
    (``residues``) and its float checks' N(0, 1) draw (``sampling.standard_normal``).
    ``stop`` is called before each chunk and stops the draw by raising (the verifier's
    deadline, ``Runner.check``: a 7B weight's draw is 0.3-1 s, more on a busy machine)."""
    n = math.prod(shape)
    starts = range(0, n, DRAW_CHUNK)
    seeds = rng.integers(0, 2**63, size=len(starts))
    out = np.empty(shape, dtype=dtype)
    flat = out.reshape(-1)

    def one(j: int) -> None:
        if stop is not None:
            stop()
        fill(np.random.default_rng(int(seeds[j])), flat[starts[j]:min(n, starts[j] + DRAW_CHUNK)])

    with ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:
        list(pool.map(one, range(len(starts))))
    return out


def invmod(x: np.ndarray, m: int) -> np.ndarray:
    """Elementwise modular inverse (m prime); raises FieldZeroDivisionError on zero."""
    if np.any(x % m == 0):
        raise FieldZeroDivisionError("division by zero in the field")
    return powmod(x, m - 2, m)


def _signed_digits(x: np.ndarray, m: int, w: int) -> list[np.ndarray]:
    """``x`` (residues mod m) as balanced residues, cut into base-2**w signed digits.

    Returns float64 arrays d_0, d_1, ... with every |d_j| <= 2**(w-1) and
    ``x == sum(d_j * 2**(w*j)) (mod m)``; only as many digits as the values need.
    """
    r = np.array(x, dtype=np.int64)  # a copy, updated in place below
    r[r > m // 2] -= m  # |r| <= m/2
    half, mask = 1 << (w - 1), (1 << w) - 1
    digits = []
    while True:
        d = r + half
        d &= mask
        d -= half
        digits.append(d.astype(np.float64))
        r -= d
        r >>= w  # exact: r - d is a multiple of 2**w
        if not r.any():
            return digits


PINNED = "pinned"  # a cache's entry: the ids of the only arrays it keeps conversions of


def _cached(cache: dict | None, x: np.ndarray, key: tuple, make):
    """``make()``, remembered per (array, key) in a trial's ``cache`` (only for the arrays
    whose ids are in ``cache[PINNED]`` when it has that entry: a trial's inputs, which live
    as long as the trial, so the cache never keeps an intermediate value alive)."""
    if cache is None:
        return make()
    pinned = cache.get(PINNED)
    if pinned is not None and id(x) not in pinned:
        return make()
    hit = cache.get((id(x), *key))
    if hit is not None and hit[0] is x:
        return hit[1]
    out = make()
    cache[(id(x), *key)] = (x, out)  # holding x keeps its id from being reused
    return out


def matmul_mod(a: np.ndarray, b: np.ndarray, m: int, cache: dict | None = None) -> np.ndarray:
    """Exact ``(a @ b) mod m`` (NumPy matmul semantics, residues below 2**31) by float64 BLAS.

    The operand with fewer elements is cut into signed digits of w bits
    (``_signed_digits``), the other one is used whole (in [0, m)). Each product
    |digit * y| < 2**(w+30), and a sum of k of them stays at or below 2**53
    when w = 23 - ceil(log2 k), so every float64 digit-matmul is exact; the
    digit products are then combined mod m by Horner's rule in int64. Longer
    contractions (k > 2**15) are chunked. ``cache`` (a dict kept for one trial)
    reuses the conversions of operands that several matmuls share, such as a
    weight read by both programs.
    """
    k = a.shape[-1]
    if k > EXACT_K:
        out = None
        for s in range(0, k, EXACT_K):
            bs = b[s:s + EXACT_K] if b.ndim == 1 else b[..., s:s + EXACT_K, :]
            part = matmul_mod(a[..., s:s + EXACT_K], bs, m)
            out = part if out is None else (out + part) % m
        return out
    if min(a.ndim, b.ndim) >= 2 and max(a.ndim, b.ndim) >= 3:
        full = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        ca, cb = compact(a), compact(b)
        if ca is not a or cb is not b:  # broadcast batch axes: computed once, broadcast back
            out = _matmul_mod(a, b, ca, cb, m, cache)
            return out if out.shape == full else np.broadcast_to(out, full)
    return _matmul_mod(a, b, a, b, m, cache)


def compact(x: np.ndarray) -> np.ndarray:
    """``x`` with every broadcast batch axis (stride 0, before the last two) cut to length 1:
    the same values under NumPy's matmul broadcasting, without the repeated copies."""
    if not isinstance(x, np.ndarray) or x.ndim < 3:
        return x
    index = tuple(slice(0, 1) if st == 0 and n > 1 and i < x.ndim - 2 else slice(None)
                  for i, (st, n) in enumerate(zip(x.strides, x.shape)))
    return x[index] if any(s.stop == 1 for s in index) else x


def _matmul_mod(a, b, ca, cb, m: int, cache: dict | None) -> np.ndarray:
    """``matmul_mod`` of ``ca``, ``cb`` (``a``, ``b`` compacted; conversions cached by the
    original arrays)."""
    k = a.shape[-1]
    w = 23 - (k - 1).bit_length()
    split_a = ca.size <= cb.size
    (cut, ccut), (whole, cwhole) = ((a, ca), (b, cb)) if split_a else ((b, cb), (a, ca))
    digits = _cached(cache, cut, ("digits", m, w), lambda: _signed_digits(ccut, m, w))
    viewed = _input_float64(cache, cwhole)  # a view of a trial input's float64 conversion
    joined = _one_gemm(digits, cwhole if viewed is None else viewed, split_a)
    if joined is not None:  # a replicated tile against each block's tile: one GEMM
        digits, whole_f, finish = joined
        return finish(_horner(digits, whole_f, True, w, m))
    whole_f = viewed if viewed is not None else _cached(
        cache, whole, ("float64",), lambda: cwhole.astype(np.float64))
    return _horner(digits, whole_f, split_a, w, m)


def _input_float64(cache: dict | None, x: np.ndarray) -> np.ndarray | None:
    """``x`` in float64 as a view of the float64 conversion of the trial input it is a view
    of (a transposed weight, a weight's loop tiles side by side: converted once per trial,
    read in place by both programs), or None where ``x`` is not such a view."""
    if cache is None or not isinstance(x, np.ndarray) or x.dtype != np.int64:
        return None
    pinned = cache.get(PINNED, ())
    root = next((y for y in ancestors(x) if id(y) in pinned), None)
    if root is None or root is x or root.dtype != np.int64 or not root.flags.c_contiguous \
            or min(x.strides, default=0) < 0:
        return None
    whole = _cached(cache, root, ("float64",), lambda: root.astype(np.float64))
    offset = x.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    flat = whole.reshape(-1)[offset // root.itemsize:]
    return np.lib.stride_tricks.as_strided(flat, x.shape, x.strides, writeable=False)


def _one_gemm(digits: list, whole: np.ndarray, split_a: bool):
    """``(digit matrices, whole as a float64 matrix, finish)`` when the cut operand is the
    same matrix for every batch element and the whole one is not (``gemm.one_gemm``'s
    "columns side by side", the whole operand converted straight into that layout), else
    None. Every product is exact, so the values are those of the batched products."""
    cut = digits[0]
    if not split_a or not batch_broadcast(cut) or batch_broadcast(whole):
        return None
    form = one_gemm(cut, whole, np.float64)
    if form is None:
        return None
    _, whole_f, finish = form
    first = (0,) * (cut.ndim - 2)
    return [d[first] for d in digits], whole_f, finish


def _horner(digits: list, whole_f: np.ndarray, split_a: bool, w: int, m: int) -> np.ndarray:
    """sum_j digits[j] @ whole_f * 2**(w j) mod m (``whole_f @ digits[j]`` when not
    ``split_a``), each float64 product exact."""
    shift = pow(2, w, m)

    def product(j: int, out=None):
        return (np.matmul(digits[j], whole_f, out=out) if split_a
                else np.matmul(whole_f, digits[j], out=out))

    top = product(len(digits) - 1)
    if not is_array(top):  # a 0-d result (vector @ vector)
        r = int(top) % m
        for j in range(len(digits) - 2, -1, -1):
            r = (r * shift + int(product(j))) % m
        return np.int64(r)
    # Horner's rule, r = r * 2**w + next product (|r| < 2**31 * 2**23 + 2**53 < 2**63),
    # converting each exact float64 product to int64 in place to spare big temporaries.
    r = _to_int64_in_place(top)
    r %= m
    buf = None
    for j in range(len(digits) - 2, -1, -1):
        buf = _to_int64_in_place(product(j, None if buf is None else buf.view(np.float64)))
        r *= shift
        r += buf
        r %= m
    return r


CHUNK = 1 << 17  # elements per slice when a big array is updated slice by slice


def _to_int64_in_place(x: np.ndarray) -> np.ndarray:
    """The exact-integer float64 array ``x`` converted to int64 in its own memory.

    Slice by slice, so each overlapping copy goes through a small temporary
    instead of a second array of x's size.
    """
    if not (x.flags.c_contiguous and x.flags.writeable and x.dtype == np.float64):
        return x.astype(np.int64)
    flat_f = x.reshape(-1)
    flat_i = flat_f.view(np.int64)
    for s in range(0, flat_f.size, CHUNK):
        np.copyto(flat_i[s:s + CHUNK], flat_f[s:s + CHUNK], casting="unsafe")
    return x.view(np.int64)


def const_mod(value: float, m: int) -> int:
    """The exact image of a float (a dyadic rational) in Z_m."""
    frac = Fraction(value)
    return (frac.numerator % m) * pow(frac.denominator % m, m - 2, m) % m
