"""The false-positive bound of the finite-field test, from a static degree analysis.

See docs/verifier.md for the derivation. For every node we bound, per output
element, the degrees of the numerator and denominator of the rational
function it computes (inputs, exp results and opaque-function results count as
variables of degree 1) and the largest degree of any exp argument (the
polynomials the Z_q part of the test samples).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.node import OPAQUE, Op


@dataclass(frozen=True)
class Degree:
    """Degree facts of one node, maximised over its elements."""

    num: int = 0
    den: int = 0
    arg: int = 0  # max num+den degree of an exp argument upstream

    def _plus(self, o: Degree, num: int, den: int) -> Degree:
        return Degree(num, den, max(self.arg, o.arg))


def _reduced(d: Degree, k: int) -> Degree:
    """A sum of k terms of degree d (distinct denominators, worst case)."""
    return Degree(d.num + (k - 1) * d.den, k * d.den, d.arg)


def node_degree(node, ds: list[Degree]) -> Degree:
    """Degree facts of ``node`` from those of its operands."""
    op = node.op
    if op is Op.INPUT:
        return Degree(1, 0, 0)
    if op is Op.CONST:
        return Degree()
    if op in (Op.NEG, Op.TRANSPOSE, Op.RESHAPE):
        return ds[0]
    if op is Op.CONCAT:
        return Degree(max(d.num for d in ds), max(d.den for d in ds), max(d.arg for d in ds))
    if op is Op.EXP:
        return Degree(1, 0, max(ds[0].arg, ds[0].num + ds[0].den))
    if op in OPAQUE:  # a fresh variable (rsqrt: the inverse of sqrt's)
        return Degree(0, 1, ds[0].arg) if op is Op.RSQRT else Degree(1, 0, ds[0].arg)
    a = ds[0]
    b = ds[1] if len(ds) > 1 else Degree()
    if op in (Op.ADD, Op.SUB):
        return a._plus(b, max(a.num + b.den, b.num + a.den), a.den + b.den)
    if op is Op.MUL:
        return a._plus(b, a.num + b.num, a.den + b.den)
    if op is Op.DIV:
        return a._plus(b, a.num + b.den, a.den + b.num)
    if op is Op.MATMUL:
        k = node.srcs[0].shape[-1]
        prod = a._plus(b, a.num + b.num, a.den + b.den)
        return _reduced(prod, k)
    if op in (Op.SUM, Op.MEAN):
        k = 1
        for ax in node.arg[0]:
            k *= node.srcs[0].shape[ax]
        return _reduced(a, k)
    raise NotImplementedError(f"no degree rule for {op}")


def degrees(program) -> dict[str, Degree]:
    """Degree facts of each output of ``program``."""
    if hasattr(program, "degrees"):  # MuGraphs: folded through their tiled computation
        return program.degrees()
    env: dict[int, Degree] = {}
    for node in program.nodes():
        env[id(node)] = node_degree(node, [env[id(s)] for s in node.srcs])
    return {name: env[id(n)] for name, n in program.outputs.items()}


def per_trial_bound(a, b, p: int, q: int) -> float:
    """Probability that one trial misses a difference between a and b (<= 1).

    ``1 - (1 - dq/q) * (1 - dp/p)``, maximised over outputs: dp bounds the
    degree of the numerator of the outputs' difference (exp and opaque results
    counted as variables), dq that of a difference of two exp arguments.
    """
    da, db = degrees(a), degrees(b)
    worst = 0.0
    for name in da:
        x, y = da[name], db[name]
        dp = max(x.num + y.den, y.num + x.den, 1)
        dq = 2 * max(x.arg, y.arg)
        worst = max(worst, 1.0 - (1.0 - min(1.0, dq / q)) * (1.0 - min(1.0, dp / p)))
    return min(1.0, worst)
