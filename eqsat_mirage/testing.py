"""Hypothesis strategies for property tests of eqsat-mirage (and of code built on it).

``programs`` draws random well-shaped programs over every op, ``inputs_for`` float inputs
for one, ``equivalent_pairs`` a program with a rewriting of it by known identities, and
``mutants``/``mutate`` a single-node change that alters the semantics, e.g.
``@given(equivalent_pairs()) def test(pair): assert em.verify(*pair).equivalent``.
Programs stay tame for float64 checks on standard-normal inputs (see ``programs``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from functools import reduce
from typing import Any

import numpy as np
from hypothesis import assume, note
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.extra import numpy as hnp

from .frontend.graph import Graph
from .ir.check import check, check_lax, exp_depth
from .ir.errors import DTypeError, MirageError, ShapeError
from .ir.node import (
    BIT_OPS,
    COMPARE,
    DTYPES,
    GATHERS,
    LOGIC,
    REDUCE,
    UNARY,
    Node,
    Op,
    broadcast_shapes,
    make,
    numel,
)
from .ir.ops import SPECS
from .semantics.field import FieldCtx, FieldZeroDivisionError, evaluate_field
from .semantics.floating import evaluate
from .semantics.primes import field_primes

__all__ = ["REWRITES", "equivalent_pairs", "inputs_for", "mutants", "mutate", "programs",
           "rebuild"]

_CONSTS = (0.5, 1.5, 2.0, 3.0, -1.0, 0.25)
_MAX_MAG, _EXP_MAG = 1e8, 10.0
_PRIMES = field_primes()  # now, not in a strategy: galois's prime tests use global `random`


def _const(value: float) -> Node:
    return Node(Op.CONST, (), float(value), (), "float32")


def _mk(op: Op, srcs: tuple[Node, ...], arg: Any = None) -> Node | None:
    with suppress(ShapeError, DTypeError):  # DTypeError: a bool mask where a value goes
        return make(op, srcs, arg)
    return None


def _swap_last(x: Node) -> Node:
    return make(Op.TRANSPOSE, (x,), (*range(len(x.shape) - 2), len(x.shape) - 1, len(x.shape) - 2))


class _Builder:
    """Grows a pool of nodes; ``info[id]`` is (exps on a path, |value| bound, lower bound)."""

    def __init__(self, draw, graph: Graph, lax: bool, consts: bool, max_inputs: int, dims):
        self.draw, self.graph, self.lax, self.consts = draw, graph, lax, consts
        self.max_inputs, self.dims, self.max_numel = max_inputs, dims, max(216, max(dims) ** 3)
        self.pool, self.info = [], {}

    def add(self, node: Node | None, e: int, mag: float, lo: float) -> Node | None:
        if node is None or mag > (_MAX_MAG if self.lax else 1e300) \
                or numel(node.shape) > self.max_numel:
            return None
        self.info[id(node)] = (e, mag, max(lo, -mag))
        self.pool += [node] if node.op is not Op.CONST else []
        return node

    def new_input(self, shape: tuple[int, ...]) -> Node:
        name, dtype = f"X{len(self.graph.inputs)}", self.draw(st.sampled_from(DTYPES))
        return self.add(self.graph.input(name, shape, dtype).node, 0, 3.0, -3.0)

    def const(self, positive: bool = False) -> Node:
        v = self.draw(st.sampled_from([c for c in _CONSTS if c > 0 or not positive]))
        return self.add(_const(v), 0, abs(v), v)

    def pick(self, pred: Callable[[Node], bool] = lambda n: True, prefer=()) -> Node | None:
        """A pool node satisfying ``pred``, biased to recent ones and to ops in ``prefer``."""
        cands = [n for n in self.pool if pred(n)]
        if prefer and any(n.op in prefer for n in cands) and self.draw(st.booleans()):
            cands = [n for n in cands if n.op in prefer]
        i, j = (self.draw(st.integers(0, len(cands) - 1)) if cands else 0 for _ in "ij")
        return cands[-1 - min(i, j)] if cands else None

    def unary(self, op: Op, a: Node | None, arg: Any = None) -> Node | None:
        if a is None:
            return None
        (e, m, lo), node = self.info[id(a)], _mk(op, (a,), arg)
        k = numel(a.shape) // numel(node.shape) if op is Op.SUM and node else 1
        bounds = SPECS[op].bounds  # the op's value range, given its operand's
        mag, low = (m * k, lo * k) if op is Op.SUM else bounds(m, lo) if bounds else (m, lo)
        return self.add(node, e + (op is Op.EXP), mag, low)

    def binary(self, op: Op, a: Node | None, b: Node | None, arg: Any = None) -> Node | None:
        if a is None or b is None:
            return None
        (ea, ma, la), (eb, mb, lb) = self.info[id(a)], self.info[id(b)]
        pos, k = la >= 0 and lb >= 0, a.shape[-1] if op is Op.MATMUL else 1
        mag, lo = {Op.ADD: (ma + mb, la + lb), Op.SUB: (ma + mb, la - mb),
                   Op.MUL: (ma * mb, la * lb if pos else 0.0 if a is b else -ma * mb),
                   Op.DIV: (ma / lb if lb > 0 else math.inf, la / mb if pos else -math.inf),
                   Op.MATMUL: (k * ma * mb, k * la * lb if pos else -math.inf),
                   Op.CONCAT: (max(ma, mb), min(la, lb))}[op]
        return self.add(_mk(op, (a, b), arg), max(ea, eb), mag, lo)

    def positive(self, a: Node | None) -> Node | None:
        if a is None or self.info[id(a)][2] > 0:
            return a
        return self.binary(Op.ADD, self.binary(Op.MUL, a, a), self.const(positive=True))

    def partner(self, a: Node) -> Node | None:
        """A constant, or a pool node that broadcasts with ``a`` (``a`` itself always does)."""
        if self.consts and self.draw(st.integers(0, 3)) == 0:
            return self.const()
        return self.pick(lambda n: (s := broadcast_shapes(a.shape, n.shape)) is not None
                         and numel(s) <= self.max_numel)

    def step(self, op: Op) -> Node | None:
        draw, swap = self.draw, self.draw(st.booleans())
        if op is Op.CAST:
            return self.unary(op, self.pick(), draw(st.sampled_from(DTYPES)))
        if op in UNARY:
            exp_ok = lambda n: self.info[id(n)][0] == 0 and self.info[id(n)][1] <= _EXP_MAG \
                if self.lax else self.info[id(n)][1] <= 700
            a = self.pick(exp_ok, (Op.ADD, Op.SUB)) if op is Op.EXP else self.pick()
            return self.unary(op, self.positive(a) if SPECS[op].positive else a)
        if op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV):
            a = self.pick(prefer=(Op.EXP,) if op is Op.MUL else ())
            if op is Op.DIV and self.info[id(a)][2] > 0 and a.shape and swap:
                b = self.unary(Op.SUM, a, ((len(a.shape) - 1,), True))  # softmax-style
            else:
                b = self.positive(self.partner(a)) if op is Op.DIV else self.partner(a)
            return self.binary(op, *((a, b) if op is Op.DIV or not swap else (b, a)))
        prefer = {Op.MATMUL: (Op.MATMUL, Op.MUL, Op.DIV), Op.SUM: (Op.CONCAT,)}.get(op, ())
        a = self.pick(lambda n: len(n.shape) >= (2 if op is Op.TRANSPOSE else 1), prefer)
        if a is None:
            return None
        r = len(a.shape)
        if op is Op.MATMUL:
            b = self.pick(lambda n: n.shape != () and _mk(op, (a, n)) is not None)
            if len(self.graph.inputs) < self.max_inputs and (b is None or draw(st.booleans())):
                batch = draw(st.sampled_from([(), (1,), a.shape[:-2][-1:]]))
                tail = draw(st.sampled_from([(), (draw(st.sampled_from(self.dims)),)]))
                b = self.new_input(batch + a.shape[-1:] + tail if tail else a.shape[-1:])
            if b is None:
                b = a if r == 1 else self.unary(Op.TRANSPOSE, a, _swap_last(a).arg)
            return self.binary(op, *((b, a) if swap and b and _mk(op, (b, a)) else (a, b)))
        if op in REDUCE:
            axes = tuple(sorted(draw(st.sets(st.integers(0, r - 1), min_size=1))))
            return self.unary(op, a, (axes, draw(st.booleans())))
        if op is Op.TRANSPOSE:
            perm = draw(st.permutations(range(r)).filter(lambda p: p != sorted(p)))
            return self.unary(op, a, tuple(perm))
        if op is Op.RESHAPE:
            return self.unary(op, a, draw(st.sampled_from(_reshapes(a.shape))))
        if op is Op.SLICE:
            ax = draw(st.integers(0, r - 1))
            lo = draw(st.integers(0, a.shape[ax] - 1))
            return self.unary(op, a, (ax, lo, draw(st.integers(lo + 1, a.shape[ax]))))
        ax = draw(st.integers(0, r - 1))  # CONCAT
        b = self.pick(lambda n: len(n.shape) == r and all(
            i == ax or x == y for i, (x, y) in enumerate(zip(n.shape, a.shape))))
        return self.binary(op, *((b, a) if swap else (a, b)), arg=ax)


def _reshapes(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    out = {(numel(shape),)} | {shape[:i] + (1,) + shape[i:] for i in range(len(shape) + 1)}
    out |= {shape[:i] + (shape[i] * shape[i + 1],) + shape[i + 2:] for i in range(len(shape) - 1)}
    out |= {shape[:i] + (f, d // f) + shape[i + 1:] for i, d in enumerate(shape)
            for f in range(2, d) if d % f == 0}
    return sorted(out - {shape})


@st.composite
def programs(draw, max_ops: int = 8, max_inputs: int = 3, max_dim: int = 6,
             ops: Iterable[Op] | None = None, lax: bool = True) -> Graph:
    """Strategy of random well-shaped ``Graph``s (passing ``em.check``) with 1-2 outputs.

    Up to ``max_ops`` ops drawn from ``ops`` (default: all but the masks, where/mask/causal,
    not/and/or and the comparisons (bool results), the gathers (integer index inputs) and the
    bit ops (uint8 inputs), which the generator does not build yet;
    ``Op.CONST`` allows constant operands), up to
    ``max_inputs`` inputs of rank 1-3, dims in ``1..max_dim``, any dtype.
    Shapes exercise broadcasting (size-1 dims, rank differences), batched matmul with
    broadcast batch dims, reductions with and without keepdims, concat, transpose, reshape.
    With ``lax=True`` exp never takes a value that went through exp, and values stay tame:
    magnitudes and lower bounds are tracked, exp only takes small values, and divisors and
    sqrt/rsqrt arguments are positive (``x * x + c``, c > 0, is built when none fits, even
    if ``ops`` lacks MUL/ADD). ``lax=False`` allows exp of exp, and values may overflow.
    """
    masks = {Op.WHERE, Op.MASK, Op.CAUSAL} | LOGIC | COMPARE  # a comparison: a bool mask
    allowed = set(Op) - masks - GATHERS - set(BIT_OPS) if ops is None else set(ops)
    if allowed & masks:
        raise ValueError(f"programs(): {sorted(op.name for op in allowed & masks)} are not "
                         "generated yet (masks need bool tensors)")
    if allowed & set(BIT_OPS):
        raise ValueError("programs(): BITAND and SHR are not generated yet (they need uint8 "
                         "inputs; tests/ir/test_int4_weights.py builds them by hand)")
    if allowed & GATHERS:
        raise ValueError(f"programs(): {sorted(op.name for op in allowed & GATHERS)} are not "
                         "generated yet (they need integer index inputs; tests/semantics/"
                         "test_gather.py and test_take_along_axis.py build gathers by hand)")
    # MATMUL first: hypothesis draws the first choice most often
    step_ops = sorted(allowed - {Op.INPUT, Op.CONST}, key=lambda o: (o is not Op.MATMUL, o.value))
    if not step_ops:
        raise ValueError("programs(): ops must include at least one op besides INPUT/CONST")
    dims = draw(st.lists(st.integers(1, max_dim), min_size=1, max_size=3)) + [1]
    g = Graph("prog")
    b = _Builder(draw, g, lax, Op.CONST in allowed, max_inputs, dims)
    for _ in range(draw(st.integers(1, max_inputs))):
        b.new_input(tuple(draw(st.lists(st.sampled_from(dims), min_size=1, max_size=3))))
    for _ in range(draw(st.integers(1, max_ops))):
        b.step(draw(st.sampled_from(step_ops)))
    computed = [n for n in b.pool if n.op is not Op.INPUT] or b.pool
    outs = [computed[-1]]
    if len(computed) > 1 and draw(st.booleans()):
        outs.append(computed[draw(st.integers(0, len(computed) - 2))])
    g.outputs = {f"O{i}": node for i, node in enumerate(outs)}
    check(g)
    if lax:
        check_lax(g)
    return g


def inputs_for(graph: Graph, bound: float = 3.0) -> st.SearchStrategy[dict[str, np.ndarray]]:
    """Strategy of float64 input dicts for ``graph``: finite values in ``[-bound, bound]``."""
    elems = st.floats(-bound, bound, allow_nan=False, allow_infinity=False)
    return st.fixed_dictionaries({name: hnp.arrays(np.float64, node.shape, elements=elems)
                                  for name, node in graph.inputs.items()})


def rebuild(graph: Graph, fn: Callable[[Node, Node], Node], name: str | None = None) -> Graph:
    """Rebuild ``graph`` bottom-up: node ``old`` becomes ``fn(old, old with new operands)``.

    Memoized; keeps the input nodes and the input and output names."""
    memo: dict[int, Node] = {}
    for old in graph.nodes():
        srcs = tuple(memo[id(s)] for s in old.srcs)
        same = all(x is y for x, y in zip(srcs, old.srcs))
        memo[id(old)] = fn(old, old if same else make(old.op, srcs, old.arg))
    out = Graph(name or graph.name)
    out.inputs, out.outputs = dict(graph.inputs), {k: memo[id(v)] for k, v in graph.outputs.items()}
    return out


REWRITES = ("commute", "distribute", "matmul_assoc", "row_scale", "matmul_transpose",
            "split_sum", "sum_concat", "mean_as_sum", "exp_split", "sub_div", "transpose")
"""Names of the identities ``equivalent_pairs`` applies (each one both ways where it can)."""


def _identities(n: Node) -> Iterator[tuple[str, Node]]:
    """``(name, node equal to n in value and shape)`` for each identity that applies at n."""
    op, srcs, mm = n.op, n.srcs, Op.MATMUL
    if op in (Op.ADD, Op.MUL):
        yield "commute", make(op, srcs[::-1])
    for a, s in (srcs, srcs[::-1]) if op is Op.MUL else ():  # a * (b +- c) = a*b +- a*c
        if s.op in (Op.ADD, Op.SUB):
            yield "distribute", make(s.op, tuple(make(Op.MUL, (a, t)) for t in s.srcs))
    a, c = srcs if op is mm else (n, n)
    if op is mm and a.op is mm and min(len(x.shape) for x in (*a.srcs, c)) >= 2:  # no 1-D
        yield "matmul_assoc", make(mm, (a.srcs[0], make(mm, (a.srcs[1], c))))
    if op is mm and c.op is mm and min(len(x.shape) for x in (a, *c.srcs)) >= 2:
        yield "matmul_assoc", make(mm, (make(mm, (a, c.srcs[0])), c.srcs[1]))
    if op is mm and min(len(a.shape), len(c.shape)) >= 2:
        yield "matmul_transpose", _swap_last(make(mm, (_swap_last(c), _swap_last(a))))
        # (x / s) @ W = (x @ W) / s for a scalar or row scale s (last dim 1); also for *
        for x, s in {Op.DIV: [a.srcs], Op.MUL: [a.srcs, a.srcs[::-1]]}.get(a.op, []):
            if len(x.shape) >= 2 and a.shape == x.shape and (not s.shape or s.shape[-1] == 1):
                yield "row_scale", make(a.op, (make(mm, (x, c)), s))
    if op is Op.SUM and n.arg[0]:
        (x,), (axes, keep), d = srcs, n.arg, srcs[0].shape[n.arg[0][0]]
        if len(axes) > 1:  # a sum over several axes as nested sums
            yield "split_sum", make(Op.SUM, (make(Op.SUM, (x,), (axes[1:], True)),), n.arg)
        f, ax = next((f for f in range(2, d) if d % f == 0), 0), axes[0]
        if len(axes) == 1 and f:  # one axis of size f*g: reshape to (f, g), sum g, then f
            y = make(Op.RESHAPE, (x,), x.shape[:ax] + (f, d // f) + x.shape[ax + 1:])
            yield "split_sum", make(Op.SUM, (make(Op.SUM, (y,), ((ax + 1,), False)),),
                                    ((ax,), keep))
        if x.op is Op.CONCAT and x.arg in axes:  # a sum of a concat = the parts' sums added
            yield "sum_concat", reduce(lambda u, v: make(Op.ADD, (u, v)),
                                       [make(Op.SUM, (t,), n.arg) for t in x.srcs])
    if op is Op.MEAN:  # sum * (1/k) for k a power of two (1/k exact in the field), else sum / k
        k, s = numel(srcs[0].shape) // numel(n.shape), make(Op.SUM, srcs, n.arg)
        yield "mean_as_sum", make(Op.MUL, (s, _const(1 / k))) if k & (k - 1) == 0 else \
            make(Op.DIV, (s, _const(k)))
    # exp(a) * exp(b) = exp(a + b), this way only: exp(a +- b) -> exp(a) */ exp(b) is equal
    # over the reals and unsafe in floating point (inf / inf where exp(a - b) is finite),
    # which the verifier's float-safety checks refuse
    if op is Op.MUL and all(t.op is Op.EXP for t in srcs):
        yield "exp_split", make(Op.EXP, (make(Op.ADD, tuple(t.srcs[0] for t in srcs)),))
    if op in (Op.SUB, Op.DIV):  # a - b = a + (-b); a / b = a * (1 / b)
        yield "sub_div", make(Op.ADD, (srcs[0], make(Op.NEG, srcs[1:]))) if op is Op.SUB \
            else make(Op.MUL, (srcs[0], make(Op.DIV, (_const(1.0), srcs[1]))))
    rev = tuple(range(len(n.shape)))[::-1]
    if op is Op.TRANSPOSE and srcs[0].op is Op.TRANSPOSE:  # fuse two transposes
        x, perm = srcs[0].srcs[0], tuple(srcs[0].arg[i] for i in n.arg)
        yield "transpose", x if perm == tuple(range(len(perm))) else make(op, (x,), perm)
    elif len(rev) >= 2:  # x = transpose(transpose(x, p), p^-1)
        yield "transpose", make(Op.TRANSPOSE, (make(Op.TRANSPOSE, (n,), rev),), rev)


@st.composite
def equivalent_pairs(draw, max_ops: int = 8, max_inputs: int = 3, max_dim: int = 6,
                     ops: Iterable[Op] | None = None, rewrites: Iterable[str] | None = None
                     ) -> tuple[Graph, Graph]:
    """Strategy of ``(g, g2)``: a Lax ``programs(...)`` draw and a rewriting of it.

    ``g2`` is ``g`` rebuilt bottom-up with identities (all of ``REWRITES``, or the names in
    ``rewrites``: commutativity, ``a*(b+c) = a*b + a*c``, matmul associativity,
    ``(x/s) @ W = (x@W) / s``, ``A@B = (B.T @ A.T).T``, split and concat-split sums,
    ``mean = sum / n``, ``exp(a+b) = exp(a)*exp(b)``, double transposes, ...) applied at
    randomly chosen nodes (at least one), with the same input and output names. The
    rewrites applied are recorded with ``hypothesis.note``.
    """
    g = draw(programs(max_ops, max_inputs, max_dim, ops, lax=True))
    names = set(REWRITES if rewrites is None else rewrites)
    applied: list[str] = []

    def rewrite(old: Node, node: Node) -> Node:
        cands = [(k, new) for k, new in _identities(node) if k in names]
        assert all(new.shape == node.shape for _, new in cands), cands
        if not cands or not draw(st.integers(0, 2)):  # rewrite 2 of 3 sites
            return node
        rname, new = draw(st.sampled_from(cands))
        applied.append(f"{rname} at {node.describe()}{list(node.shape)}")
        return new

    g2 = rebuild(g, rewrite, name=g.name + "_rewritten")
    assume(applied)
    note(f"rewrites applied: {applied}")
    check(g2)
    check_lax(g2)
    return g, g2


_SWAPS = {op: s.mutants for op, s in SPECS.items() if s.mutants}  # same-shape op swaps


def _mutations(graph: Graph) -> list[tuple[Node, Node]]:
    """Every single-node change of ``graph`` as (old node, same-shape replacement)."""
    nodes = graph.nodes()
    above: dict[int, set[int]] = {id(n): {id(n)} for n in nodes}  # ids of n and its users
    for n in reversed(nodes):
        for s in n.srcs:
            above[id(s)] |= above[id(n)]
    out: list[tuple[Node, Node | None]] = []
    for n in nodes:
        out += [(n, _mk(op, n.srcs, n.arg)) for op in _SWAPS.get(n.op, ())]
        # drop it: exp -> identity, not m -> m, a & b -> a (an and <-> or swap: its mutants)
        out += [(n, n.srcs[0])] if n.op in (UNARY - {Op.CAST}) | LOGIC else []
        if n.op is not Op.CONST:  # negate a value, or a mask
            out.append((n, make(Op.NOT if n.dtype == "bool" else Op.NEG, (n,))))
        if n.op is Op.CONST:
            out += [(n, _const(n.arg + 1.0)), (n, _const(-2.0 * n.arg))]
        if n.op in (Op.SUB, Op.DIV, Op.MATMUL, Op.CONCAT):
            out.append((n, _mk(n.op, n.srcs[::-1], n.arg)))
        if n.op in REDUCE:
            out += [(n, _mk(n.op, n.srcs, ((ax,), keep))) for ax in range(len(n.srcs[0].shape))
                    for keep in (False, True) if ((ax,), keep) != n.arg]
        if n.op is Op.TRANSPOSE:
            out.append((n, _mk(n.op, n.srcs, tuple(range(len(n.arg))))))
        for i, s in enumerate(n.srcs):
            out += [(n, _mk(n.op, n.srcs[:i] + (m,) + n.srcs[i + 1:], n.arg)) for m in nodes
                    if m.shape == s.shape and m is not s and id(n) not in above[id(m)]]
    return [(old, new) for old, new in out if new is not None and new.shape == old.shape]


def mutate(graph: Graph, data_or_rng: Any = None, rtol: float = 1e-6) -> Graph | None:
    """A single-node mutation of ``graph`` that changes what it computes, or None if none.

    Candidates: swap an op (ADD->SUB/MUL, MUL->ADD/DIV, SQRT<->RSQRT, SUM<->MEAN, ...), drop
    a unary op (exp -> identity), negate a value, change a constant or a reduction's axes,
    undo a transpose, swap the operands of SUB/DIV/MATMUL/CONCAT, replace an operand by
    another same-shape node, in an order drawn from ``data_or_rng`` (a ``st.data()`` object,
    ``random.Random``, NumPy ``Generator`` or seed). Returns the first that is well formed
    (Lax if ``graph`` is), finite on a standard-normal input (a bool mask input: fair random
    bits, so that an and swapped for an or shows), evaluable over the field and off by more
    than ``rtol`` times an output's scale there: a sound verifier rejects it."""
    rng = data_or_rng.draw(st.randoms(use_true_random=False)) \
        if hasattr(data_or_rng, "draw") else data_or_rng
    if not isinstance(rng, random.Random):
        rng = random.Random(int(rng.integers(2**63)) if hasattr(rng, "integers") else rng)
    lax = max(exp_depth(graph).values(), default=0) <= 1
    nprng = np.random.default_rng(rng.getrandbits(64))
    inputs = {k: nprng.random(v.shape) < 0.5 if v.dtype == "bool" else
              nprng.standard_normal(v.shape) for k, v in graph.inputs.items()}
    ref = evaluate(graph, inputs)
    cands = _mutations(graph)
    rng.shuffle(cands)
    for old, new in cands:
        try:
            mutant = rebuild(graph, lambda o, n, old=old, new=new: new if o is old else n,
                             name=graph.name + "_mutant")
            check(mutant)
            if lax:
                check_lax(mutant)
        except MirageError:
            continue
        outs = [(ref[k], v) for k, v in evaluate(mutant, inputs).items()]
        if not all(np.all(np.isfinite(y)) for _, y in outs) or not any(
                np.max(np.abs(x - y)) > rtol * max(np.max(np.abs(x)), np.max(np.abs(y)))
                for x, y in outs):
            continue
        ctx = FieldCtx(*_PRIMES, nprng)
        ctx.inputs = ctx.random_inputs(mutant)
        try:
            evaluate_field(mutant, ctx)  # skip a denominator that vanishes identically
        except FieldZeroDivisionError:
            continue
        if currently_in_test_context():
            note(f"mutant: {old.describe()} -> {new.describe()}")
        return mutant
    return None


def mutants(graph: Graph) -> st.SearchStrategy[Graph]:
    """Strategy of semantics-changing single-node mutants of ``graph`` (see ``mutate``)."""
    return st.randoms(use_true_random=False).map(lambda r: mutate(graph, r)).filter(
        lambda m: m is not None)
