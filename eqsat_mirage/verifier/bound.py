"""The false-positive bound of the finite-field test, from a static degree and height analysis.

See docs/verifier.md for the derivation. For every node we bound, per output
element, the degrees of the numerator and denominator of the rational function
it computes (inputs, exp results and opaque-function results count as variables
of degree 1), the bit sizes of their integer coefficients (so the chance that a
random prime divides every coefficient of a difference can be charged), the
same for the largest exp argument upstream (the functions the Z_q part
samples), and the axes along which the denominator is one and the same
function. A sum along such an axis keeps its terms' common denominator (a
softmax row divided by its row sum, a row scaled by its RMS): that is what
keeps the bound tight for attention and normalisation layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

from ..ir.node import BINARY, OPAQUE, Op
from ..ir.ops import SPECS
from ..semantics.primes import family_size


@dataclass(frozen=True)
class Degree:
    """Degree and height facts of one node, maximised over its elements.

    ``num``/``den``: degrees of numerator and denominator; ``nbits``/``dbits``:
    log2 of their coefficients' L1 norms; ``arg``/``abits``: the largest
    ``num + den`` and ``nbits + dbits`` of an exp argument upstream; ``inv``:
    axes of the node's shape along which the denominator is one and the same
    function (none known by default; irrelevant when ``den`` is 0).
    """

    num: int = 0
    den: int = 0
    arg: int = 0
    nbits: float = 0.0
    dbits: float = 0.0
    abits: float = 0.0
    inv: frozenset = frozenset()
    keep: int = 0  # a masked value (-inf where masked): the mask's degree, paid by its exp

    def common(self, axis: int) -> bool:
        """Whether the denominator is one function along ``axis``."""
        return self.den == 0 or axis in self.inv


FRESH = Degree(1, 0)  # an input, an exp or opaque result: one variable


def unit_axes(shape) -> frozenset:
    """The axes of size 1: along them any denominator is one function."""
    return frozenset(i for i, s in enumerate(shape) if s == 1)


def _aligned(d: Degree, shape, out_shape) -> frozenset | None:
    """``d.inv`` in the coordinates of the broadcast result ``out_shape`` (None: no
    denominator, so no constraint)."""
    if d.den == 0:
        return None
    off = len(out_shape) - len(shape)
    return frozenset(i for i in range(len(out_shape))
                     if i < off or (shape[i - off] == 1 and out_shape[i] != 1)
                     or (i - off) in d.inv)


def _meet(shape, *invs) -> frozenset:
    known = [s for s in invs if s is not None]
    if not known:
        return frozenset()
    return frozenset.intersection(*known) | unit_axes(shape)


def _sum(d: Degree, k: int, shared: bool) -> tuple[int, int, float, float]:
    """num, den, nbits, dbits of a sum of k terms of ``d`` (``shared``: one denominator)."""
    lk = math.log2(k) if k > 1 else 0.0
    if shared or d.den == 0:
        return d.num, d.den, d.nbits + lk, d.dbits
    return (d.num + (k - 1) * d.den, k * d.den,
            d.nbits + (k - 1) * d.dbits + lk, k * d.dbits)


def const_bits(value: float) -> tuple[float, float]:
    """log2 of |numerator| and of the denominator of a float constant (a dyadic rational)."""
    frac = Fraction(value)
    n = abs(frac.numerator)
    return (math.log2(n) if n > 1 else 0.0), math.log2(frac.denominator)


def _binary(node, a: Degree, b: Degree) -> Degree:
    op, shape = node.op, node.shape
    sa, sb = node.srcs[0].shape, node.srcs[1].shape
    inv = _meet(shape, _aligned(a, sa, shape), _aligned(b, sb, shape))
    if op in (Op.ADD, Op.SUB):
        num = max(a.num + b.den, b.num + a.den)
        nbits = max(a.nbits + b.dbits, b.nbits + a.dbits) + 1
        den, dbits = a.den + b.den, a.dbits + b.dbits
    elif op is Op.MUL:
        num, den = a.num + b.num, a.den + b.den
        nbits, dbits = a.nbits + b.nbits, a.dbits + b.dbits
    else:  # DIV: b's numerator joins the denominator, varying where b varies
        num, den = a.num + b.den, a.den + b.num
        nbits, dbits = a.nbits + b.dbits, a.dbits + b.nbits
        if b.num > 0:
            off = len(shape) - len(sb)
            varies = {i for i in range(len(shape)) if i >= off and sb[i - off] != 1}
            if a.den == 0:  # only b's numerator is in the denominator
                inv = frozenset(range(len(shape)))
            inv = (inv - varies) | unit_axes(shape)
    return Degree(num, den, arg=max(a.arg, b.arg), nbits=nbits, dbits=dbits,
                  abits=max(a.abits, b.abits), inv=inv if den else frozenset(),
                  keep=max(a.keep, b.keep))


def _matmul(node, a: Degree, b: Degree) -> Degree:
    sa, sb = node.srcs[0].shape, node.srcs[1].shape
    k = sa[-1]
    prod = Degree(a.num + b.num, a.den + b.den, nbits=a.nbits + b.nbits,
                  dbits=a.dbits + b.dbits)
    if len(sa) < 2 or len(sb) < 2:  # vector operands: no invariance tracked
        num, den, nbits, dbits = _sum(prod, k, False)
        return Degree(num, den, max(a.arg, b.arg), nbits, dbits, max(a.abits, b.abits),
                      unit_axes(node.shape))
    shared = a.common(len(sa) - 1) and b.common(len(sb) - 2)
    num, den, nbits, dbits = _sum(prod, k, shared)
    out = node.shape
    inv = frozenset()
    if den:
        ia = _aligned(a, sa[:-1] + (1,), out[:-1] + (1,))  # batch and row axes of a
        ib = _aligned(b, sb[:-2] + (1, sb[-1]), out[:-2] + (1, out[-1]))
        keep = set(range(len(out) - 2))
        if ia is not None:
            keep &= ia
        if ib is not None:
            keep &= ib
        rows = a.den == 0 or a.common(len(sa) - 2)
        cols = b.den == 0 or b.common(len(sb) - 1)
        inv = frozenset(keep | ({len(out) - 2} if rows else set())
                        | ({len(out) - 1} if cols else set())) | unit_axes(out)
    return Degree(num, den, max(a.arg, b.arg), nbits, dbits, max(a.abits, b.abits), inv)


def _reduce(node, a: Degree) -> Degree:
    axes, keep = node.arg
    src = node.srcs[0].shape
    k = math.prod(src[ax] for ax in axes)
    shared = all(a.common(ax) for ax in axes)
    num, den, nbits, dbits = _sum(a, k, shared)
    if node.op is Op.MEAN and k > 1:  # times the constant 1/k
        dbits += math.log2(k)
    inv = frozenset()
    if den:
        old = a.inv
        if keep:
            inv = frozenset(old) | frozenset(axes)
        else:
            kept = [i for i in range(len(src)) if i not in axes]
            inv = frozenset(j for j, i in enumerate(kept) if i in old)
        inv |= unit_axes(node.shape)
    return Degree(num, den, a.arg, nbits, dbits, a.abits, inv)


def _reshape(node, a: Degree) -> Degree:
    if a.den == 0:
        return a
    src, out = node.srcs[0].shape, node.shape
    big_src = [i for i, s in enumerate(src) if s != 1]
    big_out = [i for i, s in enumerate(out) if s != 1]
    inv = unit_axes(out)
    if [src[i] for i in big_src] == [out[i] for i in big_out]:  # only unit dims moved
        inv |= frozenset(o for i, o in zip(big_src, big_out) if i in a.inv)
    return replace(a, inv=inv)


def node_degree(node, ds: list[Degree]) -> Degree:
    """Degree facts of ``node`` from those of its operands."""
    op = node.op
    if op is Op.INPUT:
        return FRESH
    if op is Op.CONST:
        nbits, dbits = const_bits(node.arg)
        return Degree(nbits=nbits, dbits=dbits)
    if op in (Op.NEG, Op.CAST):  # a cast is the identity on exact values
        return ds[0]
    if op is Op.SLICE:  # a range of the operand: a denominator common along an axis stays so
        a = ds[0]
        return a if a.den == 0 else replace(a, inv=a.inv | unit_axes(node.shape))
    if op is Op.TRANSPOSE:
        a = ds[0]
        if a.den == 0:
            return a
        return replace(a, inv=frozenset(j for j, i in enumerate(node.arg) if i in a.inv))
    if op is Op.RESHAPE:
        return _reshape(node, ds[0])
    if op is Op.CONCAT:
        den = max(d.den for d in ds)
        inv = frozenset()
        if den:
            parts = [d.inv if d.den else frozenset(range(len(node.shape))) for d in ds]
            inv = (frozenset.intersection(*parts) - {node.arg % len(node.shape)}) \
                | unit_axes(node.shape)
        return Degree(max(d.num for d in ds), den, max(d.arg for d in ds),
                      max(d.nbits for d in ds), max(d.dbits for d in ds),
                      max(d.abits for d in ds), inv)
    if op is Op.EXP:  # a fresh variable (times the mask of a masked argument: keep * exp)
        a = ds[0]
        return Degree(1 + a.keep, 0, max(a.arg, a.num + a.den),
                      abits=max(a.abits, a.nbits + a.dbits))
    if op is Op.CAUSAL:  # 0 or 1 everywhere: a constant
        return Degree()
    if op is Op.MASK:  # the value where kept; the mask's degree waits for the exp
        c, x = ds
        return replace(x, keep=max(x.keep, c.num, 1 if c.num else 0))
    if op is Op.WHERE:  # c * a + (1 - c) * b
        c, a, b = ds
        return Degree(c.num + max(a.num + b.den, b.num + a.den), a.den + b.den,
                      max(c.arg, a.arg, b.arg),
                      max(a.nbits + b.dbits, b.nbits + a.dbits) + c.nbits + 1,
                      a.dbits + b.dbits, max(c.abits, a.abits, b.abits))
    if op is Op.MAX:  # a random function of the row: one fresh variable per row
        return Degree(1, 0, ds[0].arg, abits=ds[0].abits)
    if op in OPAQUE:  # a fresh variable (rsqrt: the inverse of sqrt's variable)
        a = ds[0]
        if SPECS[op].reciprocal_of is not None:
            return Degree(0, 1, a.arg, abits=a.abits, inv=unit_axes(node.shape))
        return Degree(1, 0, a.arg, abits=a.abits)
    if op in BINARY:
        return _binary(node, ds[0], ds[1])
    if op is Op.MATMUL:
        return _matmul(node, ds[0], ds[1])
    if op in (Op.SUM, Op.MEAN):
        return _reduce(node, ds[0])
    raise NotImplementedError(f"no degree rule for {op}")


def accumulated(d: Degree, iterations: int) -> Degree:
    """A forloop accumulator: the sum of ``iterations`` loop values of degree ``d``.

    The iterations read different tiles, so their denominators are taken as
    distinct (the worst case) unless there is none.
    """
    num, den, nbits, dbits = _sum(d, iterations, False)
    return Degree(num, den, d.arg, nbits, dbits, d.abits)


def degrees(program) -> dict[str, Degree]:
    """Degree facts of each output of ``program``."""
    if hasattr(program, "degrees"):  # MuGraphs: folded through their tiled computation
        return program.degrees()
    env: dict[int, Degree] = {}
    for node in program.nodes():
        env[id(node)] = node_degree(node, [env[id(s)] for s in node.srcs])
    return {name: env[id(n)] for name, n in program.outputs.items()}


@dataclass(frozen=True)
class PerTrial:
    """The probability that one trial misses a difference, and where it comes from."""

    value: float
    output: str = ""
    dp: int = 0  # degree of the outputs' difference (numerator)
    dq: int = 0  # degree of a difference of two exp arguments
    kp: int = 0  # family primes that can divide every coefficient of the former
    kq: int = 0  # ... of the latter
    family: int = 1

    def explain(self) -> str:
        """One line: the degrees and divisibility terms behind ``value``."""
        return (f"output {self.output!r}: difference of degree {self.dp}, exp arguments of "
                f"degree {self.dq}, at most {self.kp}+{self.kq} of {self.family} primes "
                "dividing their coefficients")


def per_trial_bound(a, b, prime_bits: int = 30) -> PerTrial:
    """Probability that one trial with fresh primes misses a difference between a and b.

    ``1 - (1 - dq/q_min - kq/F) * (1 - dp/p_min - kp/F)``, maximised over outputs:
    dp bounds the degree of the numerator of the outputs' difference (exp and
    opaque results counted as variables), dq that of a difference of two exp
    arguments; kp and kq bound how many of the F primes of the family can divide
    every integer coefficient of those numerators (a prime above 2**bits divides
    an integer of n bits at most n / bits times).
    """
    q_min, p_min = 1 << (prime_bits - 1), (1 << prime_bits) + 1
    fam = family_size(prime_bits)
    da, db = degrees(a), degrees(b)
    worst = PerTrial(0.0, family=fam)
    for name in da:
        x, y = da[name], db[name]
        dp = max(x.num + y.den, y.num + x.den, 1)
        kp = max(1, math.ceil((max(x.nbits + y.dbits, y.nbits + x.dbits) + 1) / prime_bits))
        dq = 2 * max(x.arg, y.arg)
        kq = math.ceil((x.abits + y.abits + 1) / (prime_bits - 1)) if dq else 0
        miss_p = min(1.0, dp / p_min + kp / fam)
        miss_q = min(1.0, dq / q_min + kq / fam) if dq else 0.0
        value = min(1.0, 1.0 - (1.0 - miss_q) * (1.0 - miss_p))
        if value > worst.value or not worst.output:
            worst = PerTrial(value, name, dp, dq, kp, kq, fam)
    return worst
