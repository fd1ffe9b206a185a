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

from ..ir.node import BINARY, BIT_OPS, COMPARE, OPAQUE, Op, toposort
from ..ir.ops import SPECS
from ..semantics.primes import family_size


@dataclass(frozen=True)
class Degree:
    """Degree and height facts of one node, maximised over its elements.

    ``num``/``den``: degrees of numerator and denominator; ``nbits``/``dbits``:
    log2 of their coefficients' L1 norms; ``arg``/``abits``: the largest
    ``num + den`` and ``nbits + dbits`` of an exp argument upstream; ``inv``:
    axes of the node's shape along which the denominator is one and the same
    function (none known by default; irrelevant when ``den`` is 0); ``groups``:
    ``(axis, count)`` pairs, at most ``count`` distinct denominators along an axis not in
    ``inv`` (a merge of a varying axis with an invariant one: attention heads joined
    with their head dim); an axis not named has as many as its size.
    """

    num: int = 0
    den: int = 0
    arg: int = 0
    nbits: float = 0.0
    dbits: float = 0.0
    abits: float = 0.0
    inv: frozenset = frozenset()
    keep: int = 0  # a masked value (-inf where masked): the mask's degree, paid by its exp
    groups: tuple = ()

    def common(self, axis: int) -> bool:
        """Whether the denominator is one function along ``axis``."""
        return self.den == 0 or axis in self.inv

    def distinct(self, axis: int, size: int) -> int:
        """How many distinct denominators there are along ``axis`` (of length ``size``)."""
        if self.common(axis):
            return 1
        return min(size, dict(self.groups).get(axis, size))


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


def _sum(d: Degree, k: int, distinct: int) -> tuple[int, int, float, float]:
    """num, den, nbits, dbits of a sum of k terms of ``d`` whose denominators are at most
    ``distinct`` different functions (1: one common denominator): over the product of
    the distinct ones, the common denominator."""
    lk = math.log2(k) if k > 1 else 0.0
    g = max(1, min(k, distinct))
    if g == 1 or d.den == 0:
        return d.num, d.den, d.nbits + lk, d.dbits
    return (d.num + (g - 1) * d.den, g * d.den,
            d.nbits + (g - 1) * d.dbits + lk, g * d.dbits)


def _grouped(inv, shape, groups: dict[int, int]) -> tuple:
    """``groups`` as a Degree's field: the bounds below their axis's size, off ``inv``."""
    return tuple(sorted((ax, g) for ax, g in groups.items()
                        if 1 < g < shape[ax] and ax not in inv))


def const_bits(value: float) -> tuple[float, float]:
    """log2 of |numerator| and of the denominator of a float constant (a dyadic rational)."""
    frac = Fraction(value)
    n = abs(frac.numerator)
    return (math.log2(n) if n > 1 else 0.0), math.log2(frac.denominator)


def _binary(node, a: Degree, b: Degree, op: Op | None = None) -> Degree:
    """Degree facts of binary ``node`` (computed as ``op``: its own op by default)."""
    op, shape = op or node.op, node.shape
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
    groups: tuple = ()
    if den:  # per axis: the product's distinct denominators, at most the operands' product
        ga, gb = _counts(a, sa, shape), _counts(b, sb, shape)
        if op is Op.DIV and b.num > 0:  # b's numerator: one function only where b is 1 wide
            off = len(shape) - len(sb)
            gb = {i: 1 if i < off or sb[i - off] == 1 else shape[i] for i in range(len(shape))}
        groups = _grouped(inv, shape, {i: ga[i] * gb[i] for i in range(len(shape))})
    return Degree(num, den, arg=max(a.arg, b.arg), nbits=nbits, dbits=dbits,
                  abits=max(a.abits, b.abits), inv=inv if den else frozenset(),
                  keep=max(a.keep, b.keep), groups=groups)


def _counts(d: Degree, shape, out_shape) -> dict[int, int]:
    """Distinct denominators of operand ``d`` (of ``shape``) along each axis of the
    broadcast result ``out_shape`` (1 where it has none, or is broadcast)."""
    off = len(out_shape) - len(shape)
    return {i: 1 if d.den == 0 or i < off or shape[i - off] == 1
            else d.distinct(i - off, shape[i - off]) for i in range(len(out_shape))}


def _matmul(node, a: Degree, b: Degree) -> Degree:
    sa, sb = node.srcs[0].shape, node.srcs[1].shape
    k = sa[-1]
    prod = Degree(a.num + b.num, a.den + b.den, nbits=a.nbits + b.nbits,
                  dbits=a.dbits + b.dbits)
    if len(sa) < 2 or len(sb) < 2:  # vector operands: no invariance tracked
        num, den, nbits, dbits = _sum(prod, k, k)
        return Degree(num, den, max(a.arg, b.arg), nbits, dbits, max(a.abits, b.abits),
                      unit_axes(node.shape))
    # a term's denominator is a's along the row times b's along the column
    distinct = a.distinct(len(sa) - 1, k) * b.distinct(len(sb) - 2, k)
    num, den, nbits, dbits = _sum(prod, k, distinct)
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
    varying = [ax for ax in axes if not a.common(ax)]
    # along one axis the count is per line; over several varying axes, every term's own
    distinct = (1 if not varying else a.distinct(varying[0], src[varying[0]])
                if len(varying) == 1 else k)
    num, den, nbits, dbits = _sum(a, k, distinct)
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


def _runs(src, out) -> list[tuple[list[int], list[int]]] | None:
    """The reshape ``src -> out`` as runs of source axes and output axes of equal product
    (unit axes left out), or None when the sizes do not line up in order."""
    big_src = [i for i, s in enumerate(src) if s != 1]
    big_out = [i for i, s in enumerate(out) if s != 1]
    runs, i, j = [], 0, 0
    while i < len(big_src) and j < len(big_out):
        rs, ro = [big_src[i]], [big_out[j]]
        ps, po = src[big_src[i]], out[big_out[j]]
        i, j = i + 1, j + 1
        while ps != po:
            if ps < po and i < len(big_src):
                rs.append(big_src[i])
                ps, i = ps * src[big_src[i]], i + 1
            elif po < ps and j < len(big_out):
                ro.append(big_out[j])
                po, j = po * out[big_out[j]], j + 1
            else:
                return None
        runs.append((rs, ro))
    return runs if i == len(big_src) and j == len(big_out) else None


def _reshape(node, a: Degree) -> Degree:
    """A reshape keeps the denominator facts run by run: an axis split keeps its count on
    every part; axes merged where all but one are invariant keep that one's count (for a
    fixed position elsewhere, the merged positions meet only its denominators)."""
    if a.den == 0:
        return a
    src, out = node.srcs[0].shape, node.shape
    inv, groups = set(unit_axes(out)), {}
    for rs, ro in _runs(src, out) or []:
        varying = [i for i in rs if i not in a.inv]
        if not varying:
            inv.update(ro)
        elif len(rs) == 1 or (len(ro) == 1 and len(varying) == 1):
            for o in ro:
                groups[o] = a.distinct(varying[0], src[varying[0]])
    inv = frozenset(inv)
    return replace(a, inv=inv, groups=_grouped(inv, out, groups))


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
    if op in (Op.GATHER, Op.TAKE_ALONG_AXIS):  # elements of the table (the indices are
        # plain integers): its degree; a denominator common along an axis is no longer known
        # to be (rows mix)
        a = ds[0]
        return a if a.den == 0 else replace(a, inv=unit_axes(node.shape), groups=())
    if op is Op.TRANSPOSE:
        a = ds[0]
        if a.den == 0:
            return a
        where = {i: j for j, i in enumerate(node.arg)}
        return replace(a, inv=frozenset(j for j, i in enumerate(node.arg) if i in a.inv),
                       groups=tuple(sorted((where[ax], g) for ax, g in a.groups)))
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
    if op is Op.NOT:  # 1 - c: c's degree, one more unit coefficient
        c = ds[0]
        return replace(c, nbits=math.log2(2.0 ** c.nbits + 1.0))
    if op in (Op.AND, Op.OR):  # a * b (a product's degree: deg a + deg b), a + b - a * b
        prod = _binary(node, *ds, op=Op.MUL)
        if op is Op.AND:
            return prod
        add = _binary(node, *ds, op=Op.ADD)  # the same denominator; the larger numerator
        return replace(add, num=max(add.num, prod.num),
                       nbits=math.log2(2.0 ** add.nbits + 2.0 ** prod.nbits))
    if op is Op.MASK:  # the value where kept; the mask's degree waits for the exp
        c, x = ds
        return replace(x, keep=max(x.keep, c.num, 1 if c.num else 0))
    if op is Op.WHERE:  # c * a + (1 - c) * b
        c, a, b = ds
        return Degree(c.num + max(a.num + b.den, b.num + a.den), a.den + b.den,
                      max(c.arg, a.arg, b.arg),
                      max(a.nbits + b.dbits, b.nbits + a.dbits) + c.nbits + 1,
                      a.dbits + b.dbits, max(c.abits, a.abits, b.abits))
    if op is Op.MAX:  # a random function of the row: one fresh variable per row, but the
        # max of one element (or of a masked row that keeps one) is that element's p part
        a, src = ds[0], node.srcs[0].shape
        if a.keep or all(src[ax] == 1 for ax in node.arg[0]):
            return Degree(max(1, a.num), a.den, a.arg, a.nbits, a.dbits, a.abits)
        return Degree(1, 0, a.arg, abits=a.abits)
    if op in COMPARE:  # a fresh variable (a bit: ``per_trial_bound``), keyed on a - b
        a, b = ds
        diff = max(a.num + b.den, b.num + a.den) + a.den + b.den
        return Degree(1, 0, max(a.arg, b.arg, diff), abits=max(a.abits, b.abits))
    if op in BIT_OPS:  # x & 15 (any other mask or shift too): a fresh variable keyed on x;
        a = ds[0]  # x >> 4 is (x - lo(x)) / 16: x's degree, one more term, over 16
        if op is Op.SHR and node.arg == 4:
            return Degree(max(a.num, 1), a.den, a.arg, a.nbits + 1.0, a.dbits + 4.0, a.abits)
        return Degree(1, 0, a.arg, abits=a.abits)
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


def accumulated(d: Degree, iterations: int, shared: bool = False) -> Degree:
    """A forloop accumulator: the sum of ``iterations`` loop values of degree ``d``.

    The iterations read different tiles, so their denominators are taken as distinct (the
    worst case) unless there is none, or ``shared``: the caller has shown the loop value's
    denominator is one function in every iteration. The sum's denominator is the product of
    the iterations' (one of them, when shared), so an axis of the tile along which every
    iteration's denominator is one function keeps that; the per-axis counts (``groups``)
    carry over only when shared (a product of several could take more values).
    """
    num, den, nbits, dbits = _sum(d, iterations, 1 if shared else iterations)
    counts = den and (shared or iterations <= 1)
    return Degree(num, den, d.arg, nbits, dbits, d.abits, inv=d.inv if den else frozenset(),
                  groups=d.groups if counts else ())


def degrees(program) -> dict[str, Degree]:
    """Degree facts of each output of ``program``."""
    if hasattr(program, "degrees"):  # MuGraphs: folded through their tiled computation
        return program.degrees()
    env: dict[int, Degree] = {}
    for node in program.nodes():
        env[id(node)] = node_degree(node, [env[id(s)] for s in node.srcs])
    return {name: env[id(n)] for name, n in program.outputs.items()}


# A comparison's value is a keyed random bit of a - b (semantics/field.py), not a uniform
# residue. Fix every other value of a trial: the difference of two programs at an output
# element is then a multilinear polynomial in those bits (0 or 1: powers collapse) of degree
# at most k, the output's bit degree (``bit_degrees``), and a nonzero multilinear polynomial
# of degree k in fair bits is nonzero with probability at least 2**-k. One trial catches
# such a difference with probability COMPARE_CATCH ** k at least: 1/2 per bit multiplied
# in, not 1/2 in all (four comparisons and-ed together: 1/16; docs/verifier.md).
COMPARE_CATCH = 0.5

# Ops whose bit degree is the largest of their operands': a sum of terms, a view, a cast,
# a random function of one argument (f(c u + (1 - c) v) = c f(u) + (1 - c) f(v)), a
# reduction (a sum of terms, or max: a random function of the row).
_BIT_MAX = frozenset({Op.ADD, Op.SUB, Op.NEG, Op.CAST, Op.NOT, Op.SUM, Op.MEAN, Op.MAX,
                      Op.EXP, Op.TRANSPOSE, Op.RESHAPE, Op.SLICE, Op.CONCAT, Op.GATHER,
                      Op.TAKE_ALONG_AXIS}
                     | OPAQUE | frozenset(BIT_OPS))


def bit_degree(node, ks: list[int]) -> int:
    """The bit degree of ``node`` from its operands' ``ks``: how many comparison bits at
    most are multiplied together in one of its elements (0: none reaches it).

    A comparison is one bit more than its operands (a random bit of a value that depends on
    bits keeps that dependence); a product (mul, div, matmul, logical and, or) adds its
    operands' degrees; ``where(c, x, y)`` and ``mask(c, x)`` add c's to the larger of the
    values'; sums, views, casts, reductions and functions of one argument keep the largest.
    Inputs (bool ones too: uniform residues, counted by Schwartz-Zippel), constants and
    causal masks (deterministic) are 0. An op with no rule adds its operands' degrees (an
    over-estimate costs trials; an under-estimate would be unsound).
    """
    op = node.op
    if not ks or op in (Op.INPUT, Op.CONST, Op.CAUSAL):
        return 0
    if op in COMPARE:
        return 1 + max(ks)
    if op is Op.WHERE:
        return ks[0] + max(ks[1], ks[2])
    if op in _BIT_MAX:
        return max(ks)
    return sum(ks)  # mul, div, matmul, and, or, mask (c's plus the value's), any other


# Ops that move or combine elements: past them, an element may meet several elements of
# one comparison (a row's bits summed, a transposed mask beside the mask), so the set of
# comparisons upstream no longer counts its bits.
_MIXING = frozenset({Op.SUM, Op.MEAN, Op.MAX, Op.MATMUL, Op.TRANSPOSE, Op.RESHAPE, Op.SLICE,
                     Op.CONCAT, Op.GATHER, Op.TAKE_ALONG_AXIS})


@dataclass(frozen=True)
class BitFact:
    """The bit facts of one node: ``degree`` (``bit_degree``'s sum rule) and ``bits``, the
    comparisons upstream while elementwise ops (broadcasting included) are all that lie
    between: one bit of each per element, so the degree is at most how many there are
    (clamp of a clamp: 4 bits, where the sum rule counts the first clamp's twice: 8); None
    once elements have moved or combined."""

    degree: int = 0
    bits: frozenset | None = frozenset()

    @property
    def k(self) -> int:
        """The bit degree: ``degree``, or fewer where ``bits`` counts fewer."""
        return self.degree if self.bits is None else min(self.degree, len(self.bits))


# Functions of one argument: of an argument with several bits, a value of each of their
# combinations (sqrt(where(c1, x, 0) + where(c2, y, 0)) is a polynomial of degree 2 in c1, c2)
_FUNCTIONS = OPAQUE | frozenset(BIT_OPS) | {Op.EXP}


def bit_fact(node, facts: list[BitFact]) -> BitFact:
    """``node``'s ``BitFact`` from its operands'. Where the bits are counted, a function of
    one argument, a comparison and a divisor take the count of their argument's bits, not
    its degree (a function of a value with m bits is a polynomial of degree m in them);
    elsewhere, ``bit_degree``'s rule."""
    degree = bit_degree(node, [f.k for f in facts])
    if any(f.bits is None for f in facts) or (node.op in _MIXING and any(f.bits for f in facts)):
        return BitFact(degree, None)
    bits = frozenset().union(*(f.bits for f in facts))
    if node.op in COMPARE:
        return BitFact(len(bits) + 1, bits | {id(node)})
    if node.op in _FUNCTIONS:
        degree = len(bits)
    elif node.op is Op.DIV:
        degree = facts[0].k + len(facts[1].bits)
    return BitFact(degree, bits)


def bit_degrees(program) -> dict[str, int]:
    """The bit degree (``BitFact.k``) of each output of ``program``: of a Graph, node by
    node; of a MuGraph, folded through its kernels in order (``MuGraph.bit_degrees``)."""
    if hasattr(program, "bit_degrees"):
        return program.bit_degrees()
    env: dict[int, BitFact] = {}
    for node in program.nodes():
        env[id(node)] = bit_fact(node, [env[id(s)] for s in node.srcs])
    return {name: env[id(n)].k for name, n in program.outputs.items()}


def compared(program) -> set[str]:
    """The outputs of ``program`` that a comparison feeds (a bit degree above 0)."""
    return {name for name, k in bit_degrees(program).items() if k}


def has_comparison(program) -> bool:
    """Whether a Graph, or any kernel of a MuGraph (its block graphs), holds a comparison."""
    if not hasattr(program, "kernels"):
        return any(n.op in COMPARE for n in program.nodes())
    for k in program.kernels:
        graphs = (k.loop, k.post) if k.kind == "custom" else ()
        nodes = [n for g in graphs for n in g.nodes()] if graphs else toposort([k.node])
        if any(n.op in COMPARE for n in nodes):
            return True
    return False


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
    bits: int = 0  # bit degree of the difference (comparison bits multiplied together)

    def explain(self) -> str:
        """One line: the degrees and divisibility terms behind ``value``."""
        bits = (f", {self.bits} comparison bit{'s' if self.bits > 1 else ''} multiplied "
                f"(caught with probability {COMPARE_CATCH ** self.bits:.3g} at least)"
                if self.bits else "")
        return (f"output {self.output!r}: difference of degree {self.dp}, exp arguments of "
                f"degree {self.dq}, at most {self.kp}+{self.kq} of {self.family} primes "
                f"dividing their coefficients{bits}")


def per_trial_bound(a, b, prime_bits: int = 30) -> PerTrial:
    """Probability that one trial with fresh primes misses a difference between a and b.

    ``1 - (1 - dq/q_min - kq/F) * (1 - dp/p_min - kp/F)``, maximised over outputs
    (q_min = 2**(bits-1), p_min = 2**bits: the least sampling set an input is drawn from):
    dp bounds the degree of the numerator of the outputs' difference (exp and
    opaque results counted as variables), dq that of a difference of two exp
    arguments; kp and kq bound how many of the F primes of the family can divide
    every integer coefficient of those numerators (a prime above 2**bits divides
    an integer of n bits at most n / bits times). Where comparison bits reach an output
    (bit degree k: the larger of the two programs' there, ``bit_degrees``), a trial that
    meets a nonzero difference of the residues still has to draw bits where it is nonzero:
    probability ``COMPARE_CATCH ** k`` at least, so the miss is at least ``1 - 2**-k``.
    """
    # the sampling sets' sizes: q >= 2**(bits-1) and p = 2q + 1 > 2**bits, and an input
    # above modular.DRAW_CHUNK elements is drawn from [0, 2**k), 2**k <= the prime
    q_min, p_min = 1 << (prime_bits - 1), 1 << prime_bits
    fam = family_size(prime_bits)
    da, db = degrees(a), degrees(b)
    ka, kb = bit_degrees(a), bit_degrees(b)
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
        bits = max(ka[name], kb[name])  # the difference's degree in the comparison bits
        if bits:  # bits are 0 or 1, not uniform in Z_p: a nonzero multilinear polynomial of
            # degree k in fair bits is nonzero with probability 2**-k at least
            value = max(value, 1.0 - (1.0 - value) * COMPARE_CATCH ** bits)
        if value > worst.value or not worst.output:
            worst = PerTrial(value, name, dp, dq, kp, kq, fam, bits)
    return worst
