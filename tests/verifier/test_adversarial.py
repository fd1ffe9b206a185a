"""The verifier against an attacker: programs and rules aimed at its primes, its float check
and its bound. Every pair here differs over the reals; none may come back "equivalent".
"""

# ruff: noqa: N803, N806

from __future__ import annotations

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.semantics.primes import FAMILY, draw_primes, family_size, is_prime
from eqsat_mirage.verifier.bound import degrees, per_trial_bound
from eqsat_mirage.verifier.floatcheck import float_checks

OLD_P, OLD_Q = 2147483579, 1073741789  # the fixed primes of earlier versions


def pair(build_a, build_b, shapes=(("X", (4, 8)), ("Y", (4, 8))), dtype="float32"):
    """Two graphs over the same inputs, each with output "O"."""
    out = []
    for build in (build_a, build_b):
        g = em.Graph("p")
        ins = {n: g.input(n, s, dtype) for n, s in shapes}
        g.output(build(**ins), "O")
        out.append(g)
    return out


def power(x, n: int):
    """x ** n by square-and-multiply: a program of about 2 log2(n) multiplications."""
    result, base = None, x
    while n:
        if n & 1:
            result = base if result is None else result * base
        n >>= 1
        if n:
            base = base * base
    return result


@pytest.mark.parametrize("c", [OLD_P, OLD_Q, 3 * OLD_P, 2**31 - 1, 2 * 1634069 + 1,
                               OLD_P * OLD_Q])
def test_a_constant_aimed_at_a_prime_does_not_vanish(c):
    a, b = pair(lambda X, Y: Y + float(c) * em.relu(X - 10.0), lambda X, Y: Y)
    res = em.verify(a, b, seed=0, float_check=False)
    assert not res.equivalent and not res.inconclusive, str(res)
    assert res.counterexample.domain == "Z_p x Z_q"
    assert all(c % p and c % q for p, q in res.primes)


def test_every_trial_draws_fresh_primes_of_the_family():
    a, b = pair(lambda X, Y: X * Y, lambda X, Y: Y * X)
    res = em.verify(a, b, trials=6, seed=1)
    assert res.equivalent and len(res.primes) == 6 == len(set(res.primes))
    for p, q in res.primes:
        assert is_prime(p) and is_prime(q) and p == 2 * q + 1 and 2**29 <= q < 2**30


def test_draw_primes_avoids_the_given_integers_and_stays_in_the_family():
    rng = np.random.default_rng(0)
    small = {p for p in range(2**8 + 1, 2**9) if is_prime(p) and is_prime((p - 1) // 2)}
    assert len(small) == FAMILY[8] == family_size(8)
    banned = sorted(small)[:-1]
    for _ in range(20):
        assert draw_primes(rng, 8, set(banned)) == (max(small), (max(small) - 1) // 2)
    with pytest.raises(ValueError, match="avoids"):
        draw_primes(rng, 8, set(small))


@pytest.mark.parametrize("bits", [12, 16, 20])
def test_family_sizes_are_exact(bits):
    count = sum(1 for q in range(2 ** (bits - 1) + 1, 2**bits, 2)
                if is_prime(q) and is_prime(2 * q + 1))
    assert FAMILY[bits] == count


@pytest.mark.parametrize("n", [OLD_P, OLD_Q, 2**31 - 1, 65537])
def test_fermat_powers_are_never_equivalent(n):
    a, b = pair(lambda X, Y: power(X, n) + Y, lambda X, Y: X + Y)
    for float_check in (False, True):
        res = em.verify(a, b, seed=0, float_check=float_check)
        assert not res.equivalent, str(res)
    assert degrees(a)["O"].num >= n  # the degree is what makes the bound honest


@pytest.mark.parametrize("n", [OLD_Q, 2**30 - 35, 1000003])
def test_exp_to_the_order_of_omega_is_not_one(n):
    a, b = pair(lambda X, Y: power(em.exp(X), n) * Y, lambda X, Y: Y)
    res = em.verify(a, b, seed=0, float_check=False)
    assert not res.equivalent, str(res)


def test_a_small_prime_dividing_a_mean_count_is_never_drawn():
    n = 263  # 263 = 2 * 131 + 1: a member of the 8-bit family
    a, b = pair(lambda X: X.mean(axis=0), lambda X: X.sum(axis=0) * 0.0,
                shapes=(("X", (n, 3)),))
    res = em.verify(a, b, seed=0, prime_bits=8, float_check=False, max_trials=64)
    assert not res.equivalent
    assert all(p != n for p, _ in res.primes)


@pytest.mark.parametrize("offset", [10.0, 25.0, 300.0])
def test_the_float_check_looks_past_thresholds(offset):
    a, b = pair(lambda X, Y: Y + em.relu(X - offset), lambda X, Y: Y)
    cex, _ = float_checks(a, b, np.random.default_rng(0), 1e-7, native=False)
    assert cex is not None and cex.domain == "float64"


def attention(L=64, scaled_after=False):
    g = em.Graph("attn")
    Q = g.input("Q", (2, 16, 64), "float16")
    K = g.input("K", (2, 64, L), "float16")
    V = g.input("V", (2, L, 64), "float16")
    A = em.exp(Q @ K)
    S = A.sum(axis=2, keepdims=True)
    g.output((A @ V) / S if scaled_after else (A / S) @ V, "O")
    return g


def test_an_fp16_rewrite_that_overflows_is_rejected():
    a, b = attention(), attention(scaled_after=True)
    assert em.verify(a, b, seed=0, native_check=False).equivalent  # float64 alone is fooled
    res = em.verify(a, b, seed=0)
    assert not res.equivalent and res.counterexample.domain == "native dtype", str(res)
    assert "non-finite where the first program is finite" in res.reason
    # scores near 9: the input program stays finite in float16, the rewrite does not
    rng = np.random.default_rng(0)
    inputs = {"Q": np.full((2, 16, 64), 0.375), "K": np.full((2, 64, 64), 0.375),
              "V": np.abs(rng.standard_normal((2, 64, 64))) + 1.0}
    assert np.isfinite(em.evaluate(a, inputs, dtype="native")["O"]).all()
    assert not np.isfinite(em.evaluate(b, inputs, dtype="native")["O"]).all()


def decoder_block(T=8, H=32, heads=2, F=64):
    """A LLaMA-style block: rms_norm, attention (exp/sum softmax), residual, gated MLP."""
    g = em.Graph("decoder")
    x = g.input("x", (T, H), "float32")
    w = {n: g.input(n, s, "float32") for n, s in (
        ("wq", (H, H)), ("wk", (H, H)), ("wv", (H, H)), ("wo", (H, H)),
        ("w1", (H, F)), ("w3", (H, F)), ("w2", (F, H)), ("g1", (H,)), ("g2", (H,)))}
    d = H // heads
    h = em.rms_norm(x, w["g1"])
    q = (h @ w["wq"]).reshape((T, heads, d)).transpose((1, 0, 2))
    k = (h @ w["wk"]).reshape((T, heads, d)).transpose((1, 2, 0))
    v = (h @ w["wv"]).reshape((T, heads, d)).transpose((1, 0, 2))
    p = em.exp((q @ k) * (1.0 / d**0.5))
    o = (p / p.sum(axis=2, keepdims=True)) @ v
    x = x + o.transpose((1, 0, 2)).reshape((T, H)) @ w["wo"]
    h = em.rms_norm(x, w["g2"])
    g.output(x + (em.silu(h @ w["w1"]) * (h @ w["w3"])) @ w["w2"], "y")
    return g


def test_a_decoder_block_gets_a_meaningful_bound():
    g = decoder_block()
    eps = per_trial_bound(g, g)
    assert eps.value < 1e-3, eps.explain()  # was 1.0: every sum charged k denominators
    res = em.verify(g, decoder_block(), seed=0)
    assert res.equivalent and res.false_positive_bound <= 1e-9, str(res)


def test_a_weak_bound_is_inconclusive_never_equivalent():
    a, b = pair(lambda X, Y: power(X, 2**20) + Y, lambda X, Y: power(X, 2**20) + Y)
    res = em.verify(a, b, seed=0, max_bound=1e-30, max_trials=4)
    assert not res.equivalent and res.inconclusive and "max_bound" in res.reason
    assert res.false_positive_bound > 1e-30
    assert not em.verify(a, b, seed=0, prime_bits=8).equivalent  # 8-bit primes: too weak
