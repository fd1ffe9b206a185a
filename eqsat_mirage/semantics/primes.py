"""The primes of the finite-field test: a large family, a fresh pair drawn for every trial.

A pair is (p, q) with q prime in [2**(bits-1), 2**bits) and p = 2q + 1 prime
(so q | p - 1 and omega of order q exists). ``draw_primes`` draws q uniformly
among the odd numbers of that range until both are prime and neither divides
any integer of ``avoid`` (the constants' numerators and the mean counts of the
programs compared), so no constant of a program or rule can vanish in a trial.
``FAMILY`` counts the pairs for each ``bits``; the bound charges the chance that
a random member divides every coefficient of a difference (docs/verifier.md).
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import cache

import numpy as np

from ..ir.errors import MirageError
from ..ir.node import Op

# Pairs (p, q) per prime_bits: primes q in [2**(bits-1), 2**bits) with 2q + 1 prime, counted
# exactly by a segmented sieve of Eratosthenes (2026-11-23; tests/semantics re-counts bits <= 20).
FAMILY = {8: 7, 9: 8, 10: 13, 11: 23, 12: 41, 13: 67, 14: 111, 15: 193, 16: 360, 17: 630,
          18: 1091, 19: 1938, 20: 3558, 21: 6448, 22: 11876, 23: 21649, 24: 40151,
          25: 73658, 26: 135711, 27: 251786, 28: 468678, 29: 875247, 30: 1634069}

_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)


def is_prime(n: int) -> bool:
    """Miller-Rabin with the first twelve prime bases: exact for every n below 3.3e24."""
    if n < 2:
        return False
    for b in _BASES:
        if n % b == 0:
            return n == b
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for b in _BASES:
        x = pow(b, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def family_size(bits: int) -> int:
    """How many (p, q) pairs ``draw_primes`` chooses from at ``bits``."""
    if bits not in FAMILY:
        raise MirageError(f"prime_bits must be in [8, 30], got {bits}")
    return FAMILY[bits]


def draw_primes(rng: np.random.Generator, bits: int = 30,
                avoid: frozenset[int] | set[int] = frozenset()) -> tuple[int, int]:
    """A random pair (p, q) of the family, p and q dividing no integer of ``avoid``."""
    family_size(bits)
    lo, hi = 1 << (bits - 1), 1 << bits
    for _ in range(1_000_000):
        q = int(rng.integers(lo, hi)) | 1
        if q >= hi or not is_prime(q) or not is_prime(2 * q + 1):
            continue
        p = 2 * q + 1
        if any(n % p == 0 or n % q == 0 for n in avoid):
            continue
        return p, q
    raise MirageError(f"no prime pair of {bits} bits avoids the program's constants")


@cache
def field_primes(bits: int = 30) -> tuple[int, int]:
    """A fixed pair for tests and examples: q the largest prime below 2**bits with
    p = k*q + 1 prime for k in (2, 4, 6) and p < 2**31 (the verifier draws its own)."""
    family_size(bits)
    q = (1 << bits) - 1
    while True:
        if is_prime(q):
            for k in (2, 4, 6):
                p = k * q + 1
                if p < (1 << 31) and is_prime(p):
                    return p, q
        q -= 2


def _nodes(program) -> list:
    if hasattr(program, "kernels"):  # a MuGraph: every op of every kernel and block graph
        out = []
        for k in program.kernels:
            if k.kind == "predefined":
                out.append(k.node)
                out.extend(k.node.srcs)
            else:
                out.extend(k.loop.nodes())
                out.extend(k.post.nodes())
        return out
    return program.nodes()


def program_constants(program) -> set[int]:
    """The integers a trial's primes must not divide: constants' numerators, mean counts."""
    found: set[int] = set()
    for n in _nodes(program):
        if n.op is Op.CONST:
            if not math.isfinite(n.arg):
                raise MirageError(f"{n.describe()}: the constant {n.arg!r} has no image in a "
                                  "finite field (only finite constants can be verified)")
            num = abs(Fraction(n.arg).numerator)
            if num > 1:
                found.add(num)
        elif n.op is Op.MEAN:
            count = 1
            for ax in n.arg[0]:
                count *= n.srcs[0].shape[ax]
            if count > 1:
                found.add(count)
    return found
