"""The field's hand-written fast path held to ``galois``, a library made for finite fields.

The verifier's exact arithmetic (``semantics/modular.py``: digit-split float64 BLAS products,
modular reductions and inverses; ``semantics/primes.py``: the prime family and its
primality test) is the package's own; galois is used here only, never by the package.
The primes are the verifier's: ``draw_primes`` on a trial's generator ``(base, t, redraw)``
as ``verifier.verify`` seeds it, at the largest size (``prime_bits=30``: p near 2**31) and
a small one, each checked mod p and mod q (both parts of a field value).
"""

from __future__ import annotations

from functools import cache

import galois
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import eqsat_mirage as em
from eqsat_mirage.semantics.field import FieldCtx, evaluate_field
from eqsat_mirage.semantics.modular import (
    EXACT_K,
    PINNED,
    FieldZeroDivisionError,
    const_mod,
    invmod,
    matmul_mod,
    powmod,
)
from eqsat_mirage.semantics.primes import FAMILY, draw_primes, is_prime


def trial_rng(base: int, t: int, redraw: int = 0) -> np.random.Generator:
    """A field trial's generator, seeded as ``verifier.verify`` seeds it."""
    return np.random.default_rng([base, t, redraw])


# The pairs three trials at the default size and one at 12 bits draw (then the moduli used).
PAIRS = [draw_primes(trial_rng(base, t), bits) for base, t, bits in
         ((0, 0, 30), (12345, 1, 30), (2**40 + 7, 3, 30), (99, 2, 12))]
MODULI = sorted({m for pair in PAIRS for m in pair})
# Contractions: w = 23 - bitlen(k - 1) bits a digit, so 31-bit residues take 2 digits at k = 2,
# 3 at k = 300 and 4 or 5 at k = 2**15 (``EXACT_K``, the longest done in one BLAS call).
CONTRACTIONS = [1, 2, 7, 64, 300, 1025, 4096, EXACT_K]
LAYOUTS = ["2d", "vector", "batched", "replicated", "replicated_input"]
SETTINGS = settings(deadline=None, max_examples=30, database=None)


@cache
def gf(m: int):
    """galois's prime field of order ``m`` (built once: a class costs about a second)."""
    return galois.GF(m)


def values(rng: np.random.Generator, m: int, shape, kind: str) -> np.ndarray:
    """Residues mod ``m``: uniform, all ``m - 1`` (the largest products), or near 0 and m."""
    if kind == "uniform":
        return rng.integers(0, m, shape, dtype=np.int64)
    if kind == "top":
        return np.full(shape, m - 1, dtype=np.int64)
    edge = np.array([0, 1, 2, m // 2, m // 2 + 1, m - 2, m - 1], dtype=np.int64)
    return rng.choice(edge, shape)


def galois_matmul(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """``a @ b`` over GF(m) by galois (batches one 2-D product at a time)."""
    field = gf(m)
    if a.ndim <= 2 and b.ndim <= 2:
        return np.asarray(field(a) @ field(b), dtype=np.int64)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = np.broadcast_to(a, batch + a.shape[-2:])
    b = np.broadcast_to(b, batch + b.shape[-2:])
    return np.stack([np.asarray(field(np.ascontiguousarray(x)) @ field(np.ascontiguousarray(y)),
                                dtype=np.int64) for x, y in zip(a, b)])


def operands(rng, m: int, layout: str, rows: int, k: int, cols: int, kind: str):
    """Two operands laid out as the interpreters build them, and a trial's cache (or None)."""
    a, b = values(rng, m, (rows, k), kind), values(rng, m, (k, cols), kind)
    if layout == "vector":
        return a[0], b, None
    if layout == "batched":  # rows of every batch element against one weight
        return values(rng, m, (3, rows, k), kind), b, None
    if layout.startswith("replicated"):  # a tile replicated over the grid, a weight's tiles
        whole = values(rng, m, (3, k, cols), kind)
        tile = np.broadcast_to(a[None], (3, rows, k))
        cache = {PINNED: {id(whole)}} if layout == "replicated_input" else None
        return tile, whole, cache
    return a, b, None


@SETTINGS
@given(pair=st.sampled_from(PAIRS), which=st.sampled_from([0, 1]),
       layout=st.sampled_from(LAYOUTS), k=st.sampled_from(CONTRACTIONS),
       rows=st.integers(1, 3), cols=st.integers(1, 3),
       kind=st.sampled_from(["uniform", "top", "edges"]), seed=st.integers(0, 2**32 - 1))
def test_exact_product_equals_galois(pair, which, layout, k, rows, cols, kind, seed):
    """``matmul_mod`` (the field's products, both parts) equals galois's GF(m) matmul."""
    m = pair[which]
    a, b, cache = operands(np.random.default_rng(seed), m, layout, rows, k, cols, kind)
    got = np.asarray(matmul_mod(a, b, m, cache), dtype=np.int64)
    want = galois_matmul(a, b, m)
    assert got.shape == want.shape
    assert np.array_equal(got, want)


@pytest.mark.parametrize("m", [max(MODULI), min(MODULI)])
def test_a_contraction_past_one_blas_call_equals_galois(m):
    """Longer than ``EXACT_K``: chunked, each chunk digit-split; the largest residues."""
    rng = np.random.default_rng(m)
    a = values(rng, m, (2, EXACT_K + 37), "edges")
    b = values(rng, m, (EXACT_K + 37, 2), "uniform")
    assert np.array_equal(matmul_mod(a, b, m), galois_matmul(a, b, m))


def field_outputs(build, shape, pair, seed):
    """``evaluate_field`` of the program ``build(X)`` (outputs' names to tensors) on one
    trial's draws, and that trial's input X (its p part, and its q part)."""
    g = em.Graph("galois")
    x = g.input("X", shape, dtype="float32")
    for name, t in build(x).items():
        g.output(t, name)
    ctx = FieldCtx(*pair, trial_rng(seed, 0))
    ctx.inputs = ctx.random_inputs(g)
    return evaluate_field(g, ctx), ctx.inputs["X"]


@SETTINGS
@given(pair=st.sampled_from(PAIRS), shape=st.sampled_from([(5,), (3, 4), (2, 3, 7), (1, 4097)]),
       axis=st.integers(0, 2), keep=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_reductions_equal_galois(pair, shape, axis, keep, seed):
    """Field sums and means (a sum times the count's inverse) along an axis equal galois's,
    mod p and, where the q part is carried (below an exp), mod q."""
    axis %= len(shape)
    out, x = field_outputs(lambda t: {"S": t.sum(axis=axis, keepdims=keep),
                                      "M": t.mean(axis=axis, keepdims=keep),
                                      "E": em.exp(t.sum(axis=axis, keepdims=keep))},
                           shape, pair, seed)
    for part, m in enumerate(pair):
        field = gf(m)
        s = np.sum(field(x[part]), axis=axis, keepdims=keep)
        mean = s / field(shape[axis] % m)
        if out["S"][part] is not None:
            assert np.array_equal(out["S"][part], np.asarray(s, dtype=np.int64))
        if out["M"][part] is not None:
            assert np.array_equal(out["M"][part], np.asarray(mean, dtype=np.int64))
    assert out["S"][0] is not None and out["M"][0] is not None


@SETTINGS
@given(pair=st.sampled_from(PAIRS), which=st.sampled_from([0, 1]),
       kind=st.sampled_from(["uniform", "edges"]), seed=st.integers(0, 2**32 - 1))
def test_inverses_and_powers_equal_galois(pair, which, kind, seed):
    """``invmod`` (Fermat) equals galois's reciprocal; a zero is refused as galois refuses
    it; ``powmod`` equals galois's power; division in a program is a times b's inverse."""
    m = pair[which]
    field = gf(m)
    x = values(np.random.default_rng(seed), m, (4, 9), kind)
    nonzero = np.where(x == 0, 1, x)
    assert np.array_equal(invmod(nonzero, m), np.asarray(np.reciprocal(field(nonzero)),
                                                         dtype=np.int64))
    if np.any(x == 0):
        with pytest.raises(FieldZeroDivisionError):
            invmod(x, m)
        with pytest.raises(ZeroDivisionError):
            np.reciprocal(field(x))
    for e in (0, 1, 2, 3, m - 2, m - 1, seed % m):
        assert np.array_equal(powmod(x, e, m), np.asarray(field(x) ** e, dtype=np.int64))
    for c in (0.5, 1.5, -0.25, 3.0, 2.0**-20, 1e-6):  # a constant's image: a dyadic rational
        num, den = c.as_integer_ratio()
        assert const_mod(c, m) == int(field(num % m) / field(den % m))


@SETTINGS
@given(pair=st.sampled_from(PAIRS), seed=st.integers(0, 2**32 - 1))
def test_division_in_a_program_equals_galois(pair, seed):
    """``X / (X * X + 1)`` in the field, both parts (when carried), against galois."""
    out, x = field_outputs(lambda t: {"D": t / (t * t + 1.0)}, (3, 5), pair, seed)
    field = gf(pair[0])
    v = field(x[0])
    denominator = v * v + field(1)
    if np.any(np.asarray(denominator) == 0):
        return  # the verifier redraws such a trial
    assert np.array_equal(out["D"][0], np.asarray(v / denominator, dtype=np.int64))


# --- the prime family ---------------------------------------------------------------------


def test_drawn_pairs_are_galois_primes_with_omega_of_order_q():
    """256 trials' pairs at the verifier's default size (several bases, a redraw) and 64 at
    each of the sizes 8, 11, ..., 29: p, q prime by galois, p = 2q + 1 (so q | p - 1, q in
    the size's range), and each trial's omega has multiplicative order exactly q."""
    draws = [(30, base, t, r) for base in (0, 1, 2**31 + 3, 2**62 - 1) for t in range(32)
             for r in (0, 1)]
    draws += [(bits, 5, t, 0) for bits in range(8, 30, 3) for t in range(64)]
    for bits, base, t, r in draws:
        rng = trial_rng(base, t, r)
        p, q = draw_primes(rng, bits)
        assert galois.is_prime(p) and galois.is_prime(q), (bits, p, q)
        assert p == 2 * q + 1 and (p - 1) % q == 0 and 2 ** (bits - 1) <= q < 2 ** bits
        omega = FieldCtx(p, q, rng).omega
        # q prime, omega != 1 and omega**q == 1: the order divides q and is not 1
        assert omega not in (0, 1) and pow(omega, q, p) == 1
    for p, q in PAIRS:  # galois computes the order itself, for the pairs its fields are built
        omega = FieldCtx(p, q, trial_rng(p, 0)).omega
        assert gf(p)(omega).multiplicative_order() == q


@pytest.mark.parametrize("bits", [8, 9, 10, 11, 12, 13, 14, 15, 16])
def test_the_whole_family_at_small_sizes_is_galois(bits):
    """Every member of the family at ``bits`` (every q in range with q and 2q + 1 prime, by
    galois) is counted by ``FAMILY``, and the package's primality test agrees with galois's
    on every integer up to 2**(bits + 1) + 1 (the p of the range's largest q)."""
    lo, hi = 1 << (bits - 1), 1 << bits
    members = [q for q in range(lo | 1, hi, 2) if galois.is_prime(q) and galois.is_prime(2 * q + 1)]
    assert len(members) == FAMILY[bits]
    for n in range(lo, 2 * hi + 2):
        assert is_prime(n) == galois.is_prime(n), n
    drawn = {draw_primes(trial_rng(bits, t), bits)[1] for t in range(100)}
    assert drawn <= set(members)


def test_a_sample_of_the_largest_family_is_galois():
    """The verifier's family at 30 bits has 1,634,069 members: a deterministic sample of 512
    of them (q and 2q + 1 prime by the package's test, from evenly spaced starts) are prime
    by galois, and 2,000 odd integers of the range are judged alike by both tests."""
    lo, hi = 1 << 29, 1 << 30
    found = 0
    for start in range(lo + 1, hi, (hi - lo) // 512):
        q = start | 1
        while not (is_prime(q) and is_prime(2 * q + 1)):
            q += 2
        assert galois.is_prime(q) and galois.is_prime(2 * q + 1), q
        found += 1
    assert found >= 512
    for n in range(hi - 4001, hi, 2):
        assert is_prime(n) == galois.is_prime(n) and is_prime(2 * n + 1) == galois.is_prime(
            2 * n + 1), n
