"""Float semantics: one table, used by ``em.evaluate`` (float64 or native dtypes)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.node import Node, Op
from .interp import check_inputs, run


def round_to(x: np.ndarray, dtype: str | None) -> np.ndarray:
    """Round ``x`` to ``dtype`` (float16, bfloat16, float32), or leave it (None)."""
    if dtype is None:
        return x
    if dtype == "float16":
        return np.asarray(x, dtype=np.float16).astype(np.float32)
    if dtype == "bfloat16":
        u = np.asarray(x, dtype=np.float32).view(np.uint32)
        u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
        return u.view(np.float32)
    return np.asarray(x, dtype=np.float32)


@dataclass
class FloatCtx:
    """Per-run state of the float interpreter."""

    inputs: Mapping[str, np.ndarray]
    mode: str | None  # None: float64 throughout; "native": each node's dtype; else a dtype

    def fix(self, node: Node, value: Any) -> np.ndarray:
        """Apply the precision policy to a node's result."""
        if self.mode is None:
            return np.asarray(value, dtype=np.float64)
        return round_to(value, node.dtype if self.mode == "native" else self.mode)


def _sum(ctx, n, x):
    return ctx.fix(n, np.sum(x, axis=n.arg[0], keepdims=n.arg[1]))


def _mean(ctx, n, x):
    return ctx.fix(n, np.mean(x, axis=n.arg[0], keepdims=n.arg[1]))


def _matmul(ctx, n, a, b):
    acc = np.float64 if ctx.mode is None else np.float32  # fp32 accumulation, as on GPUs
    return ctx.fix(n, np.matmul(a.astype(acc, copy=False), b.astype(acc, copy=False)))


FLOAT_SEMANTICS = {
    Op.INPUT: lambda ctx, n: ctx.fix(n, ctx.inputs[n.arg]),
    Op.CONST: lambda ctx, n: np.float64(n.arg),
    Op.NEG: lambda ctx, n, x: ctx.fix(n, -x),
    Op.EXP: lambda ctx, n, x: ctx.fix(n, np.exp(x)),
    Op.SQRT: lambda ctx, n, x: ctx.fix(n, np.sqrt(x)),
    Op.RSQRT: lambda ctx, n, x: ctx.fix(n, 1.0 / np.sqrt(x)),
    Op.SILU: lambda ctx, n, x: ctx.fix(n, x / (1.0 + np.exp(-x))),
    Op.RELU: lambda ctx, n, x: ctx.fix(n, np.maximum(x, 0.0)),
    Op.ADD: lambda ctx, n, a, b: ctx.fix(n, a + b),
    Op.SUB: lambda ctx, n, a, b: ctx.fix(n, a - b),
    Op.MUL: lambda ctx, n, a, b: ctx.fix(n, a * b),
    Op.DIV: lambda ctx, n, a, b: ctx.fix(n, a / b),
    Op.MATMUL: _matmul,
    Op.SUM: _sum,
    Op.MEAN: _mean,
    Op.TRANSPOSE: lambda ctx, n, x: np.transpose(x, n.arg),
    Op.RESHAPE: lambda ctx, n, x: np.reshape(x, n.arg),
    Op.CONCAT: lambda ctx, n, *xs: np.concatenate(xs, axis=n.arg),
}


def evaluate(program, inputs: Mapping[str, Any], dtype: str | None = None) -> dict[str, np.ndarray]:
    """Run ``program`` on ``inputs`` (a dict name -> array) and return its outputs.

    ``dtype=None`` computes in float64 (the reference). ``dtype="native"``
    rounds every node to its own dtype (fp32 accumulation in matmuls, as a GPU
    does); any dtype name rounds every node to that dtype.
    """
    from ..ir.check import check
    from ..ir.node import canonical_dtype

    if hasattr(program, "evaluate"):  # MuGraph and other program kinds evaluate themselves
        return program.evaluate(inputs, dtype=dtype)
    check(program)
    mode = None if dtype is None else ("native" if dtype == "native" else canonical_dtype(dtype))
    arrays = check_inputs(program, inputs)
    with np.errstate(all="ignore"):
        out = run(program, FLOAT_SEMANTICS, FloatCtx(arrays, mode))
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}
