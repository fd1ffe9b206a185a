"""The ground truth of the float-safety checks (docs/verifier.md, section 5): the input
program evaluated in more precision than float64.

The native-dtype draws judge both programs against a reference: the input program's own
error there (how far its value in its own dtypes is from the truth) and the candidate's
(which may be at most that plus the input's dtype tolerance). Herbie computes that
truth in higher precision; here it is the input program run node by node in NumPy's
``longdouble`` where that is wider than float64 (x86-64 Linux: the 80-bit extended
format, a 64-bit significand, 11 bits more than float64), every op rounded to it,
matmuls and sums accumulated in it.

The work is bounded: ``work(program)`` counts element operations (a matmul's
batch x M x N x K, an opaque function's elements ``OPAQUE_COST`` times, since the wide
``exp`` runs about 7x slower than a multiply), and a program above ``TRUTH_WORK`` is
judged against float64 instead (as is a MuGraph input program, the erf function, which
has no wide implementation, and a machine whose ``longdouble`` is float64). ``truth``
says which precision it used.

Why float64 nearly always suffices for float16/bfloat16/float32 programs: the truth is
the same program in a wider format, so to first order its error is the input program's
own error scaled by 2^-(53 - 24) = 2^-29 (float32's significand is 24 bits); at a valid
point (the input within 10% of the truth) float64 is then within 2^-29 * 0.1 of it,
four orders below float32's tolerance 1e-4. Where that first-order argument fails
(a cancellation that float64 loses entirely while float32 agrees with it by accident:
``(x + 2^60) - 2^60``, 0 in both float32 and float64), the wide truth tells the
rewrite ``-> x`` apart; tests/verifier/test_ground_truth.py shows both.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..ir.node import Op
from ..ir.ops import SPECS
from ..semantics.floating import FLOAT_SEMANTICS, FloatCtx, LazyInputs, uniform
from ..semantics.interp import run
from .floatsafe import is_graph

WIDE = np.longdouble if np.finfo(np.longdouble).nmant > np.finfo(np.float64).nmant else None
WIDE_NAME = (f"longdouble ({np.finfo(np.longdouble).nmant + 1}-bit significand)"
             if WIDE is not None else "float64")
TRUTH_WORK = 2**23  # element operations: about 0.1-1 s of longdouble NumPy per draw
OPAQUE_COST = 8  # an opaque function (exp, tanh, ...) counts as this many operations
_FLOAT64_ONLY = {Op.ERF}  # scipy's erf has no long-double form


def work(program) -> int:
    """The element operations of one evaluation of a Graph (matmul: batch x M x N x K;
    an opaque function ``OPAQUE_COST`` per element; movement free)."""
    total = 0
    for n in program.nodes():
        size = math.prod(n.shape)
        if n.op is Op.MATMUL:
            total += size * n.srcs[0].shape[-1]
        elif n.op in (Op.INPUT, Op.CONST, Op.TRANSPOSE, Op.RESHAPE, Op.SLICE):
            continue
        elif SPECS[n.op].opaque:
            total += OPAQUE_COST * size
        else:
            total += max(size, *(math.prod(s.shape) for s in n.srcs)) if n.srcs else size
    return total


INPUT_EFFORT = 64  # element operations a verification spends per input element


def effort(program) -> int:
    """How much verifying a Graph costs, in element operations: one evaluation's ``work``
    and ``INPUT_EFFORT`` per input element (every draw and trial draws, rounds, converts
    and reads each one: a 7B layer's decode step has few products but 176M weights)."""
    return work(program) + INPUT_EFFORT * sum(math.prod(n.shape)
                                               for n in program.inputs.values())


def precision(program) -> str:
    """The precision ``truth`` computes ``program``'s ground truth in."""
    if WIDE is None or not is_graph(program) or work(program) > TRUTH_WORK or any(
            n.op in _FLOAT64_ONLY for n in program.nodes()):
        return "float64"
    return WIDE_NAME


class _WideCtx(FloatCtx):
    """Every node's value in ``WIDE``; a broadcast of one value stays one."""

    def fix(self, node, value: Any) -> np.ndarray:
        if np.ndim(value) and uniform(value):
            return np.broadcast_to(np.asarray(np.asarray(value).reshape(-1)[0], dtype=WIDE),
                                   np.shape(value))
        return np.asarray(value, dtype=WIDE)


def _one(x) -> Any:
    return np.asarray(x).reshape(-1)[0]


def _reduce(fn, how: str):
    def apply(ctx, n, x):
        axes, keep = n.arg
        if np.ndim(x) and uniform(x):
            count = math.prod(np.shape(x)[a] for a in axes)
            one = _one(x) * WIDE(count) if how == "sum" else _one(x)
            return np.broadcast_to(np.asarray(one, dtype=WIDE), n.shape) if n.shape else one
        return ctx.fix(n, fn(x, axis=axes, keepdims=keep))
    return apply


def _matmul(ctx, n, a, b):
    if np.ndim(a) and np.ndim(b) and uniform(a) and uniform(b):
        one = WIDE(_one(a)) * WIDE(_one(b)) * WIDE(np.shape(a)[-1])
        return np.broadcast_to(np.asarray(one, dtype=WIDE), n.shape)
    return ctx.fix(n, np.matmul(np.asarray(a, dtype=WIDE), np.asarray(b, dtype=WIDE)))


_TABLE = {**FLOAT_SEMANTICS, Op.MATMUL: _matmul, Op.SUM: _reduce(np.sum, "sum"),
          Op.MEAN: _reduce(np.mean, "mean"), Op.MAX: _reduce(np.max, "max")}


def truth(program, inputs: dict, float64: dict) -> tuple[dict[str, np.ndarray], str]:
    """The ground truth of ``program``'s outputs on ``inputs`` (values of the inputs'
    dtypes) as float64 arrays, and the precision it was computed in: ``WIDE`` within
    the work bound, else ``float64`` (the outputs ``float64``, already computed)."""
    how = precision(program)
    if how == "float64":
        return float64, how
    # made where they are read (``LazyInputs``: a float64 draw), else as given
    ctx = _WideCtx(inputs if isinstance(inputs, LazyInputs) else
                   {k: np.asarray(v) for k, v in inputs.items()}, None)
    with np.errstate(all="ignore"):
        out = run(program, _TABLE, ctx)
        return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}, how
