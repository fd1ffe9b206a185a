"""The NumPy-like functions of the builder API: ``em.exp``, ``em.softmax``, ``em.rms_norm``, ...

Elementwise functions, ``matmul``, ``concat``, ``where`` and the composite layers (softmax,
RMS and layer normalization, GELU), each built from the ops of ``graph.py``'s ``apply``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any

from ..ir.errors import GraphError, ShapeError
from ..ir.node import Op, user_location
from ..ir.ops import SPECS
from .graph import (  # noqa: F401 (re-exported)
    Graph,
    Tensor,
    apply,
    bitwise_and,
    logical_and,
    logical_or,
    right_shift,
)


def exp(x: Tensor) -> Tensor:
    """Elementwise e**x."""
    return apply(Op.EXP, x)


def sqrt(x: Tensor) -> Tensor:
    """Elementwise square root."""
    return apply(Op.SQRT, x)


def rsqrt(x: Tensor) -> Tensor:
    """Elementwise 1/sqrt(x)."""
    return apply(Op.RSQRT, x)


def silu(x: Tensor) -> Tensor:
    """Elementwise x * sigmoid(x)."""
    return apply(Op.SILU, x)


def sigmoid(x: Tensor) -> Tensor:
    """Elementwise 1 / (1 + e**-x) (an opaque function to the verifier)."""
    return apply(Op.SIGMOID, x)


def relu(x: Tensor) -> Tensor:
    """Elementwise max(x, 0)."""
    return apply(Op.RELU, x)


def tanh(x: Tensor) -> Tensor:
    """Elementwise hyperbolic tangent (an opaque function to the verifier)."""
    return apply(Op.TANH, x)


def cos(x: Tensor) -> Tensor:
    """Elementwise cosine (an opaque function to the verifier)."""
    return apply(Op.COS, x)


def sin(x: Tensor) -> Tensor:
    """Elementwise sine (an opaque function to the verifier)."""
    return apply(Op.SIN, x)


def erf(x: Tensor) -> Tensor:
    """Elementwise error function (an opaque function to the verifier)."""
    return apply(Op.ERF, x)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU: ``x/2 * (1 + erf(x/sqrt(2)))``, or with ``approximate="tanh"``
    ``x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x**3)))`` (GPT-2's gelu_new)."""
    if approximate == "none":
        return x * 0.5 * (1.0 + erf(x * (1.0 / math.sqrt(2.0))))
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
        return x * 0.5 * (1.0 + tanh(inner))
    raise GraphError(f"gelu (at {user_location()}): approximate must be 'none' or 'tanh', "
                     f"got {approximate!r}")


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` with NumPy batching rules."""
    return apply(Op.MATMUL, a, b)


def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Concatenate tensors along ``axis``."""
    tensors = list(tensors)
    if not tensors or not all(isinstance(t, Tensor) for t in tensors):
        raise GraphError(f"concat (at {user_location()}): expected a non-empty list of Tensors")
    ndim = tensors[0].ndim
    if not isinstance(axis, Integral) or isinstance(axis, bool) or not -ndim <= axis < ndim:
        raise ShapeError(f"concat (at {user_location()}): axis {axis!r} out of range (or not "
                         f"an int) for {ndim}-d tensors")
    return apply(Op.CONCAT, *tensors, arg=int(axis) % ndim)


def transpose(x: Tensor, *axes: Any) -> Tensor:
    """Function form of ``Tensor.transpose``."""
    return x.transpose(*axes)


def amax(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """The largest element of ``x`` over ``axis`` (``em.max``; None: all axes)."""
    if not isinstance(x, Tensor):
        raise GraphError(f"max (at {user_location()}): expected a Tensor, got "
                         f"{type(x).__name__}")
    return x.max(axis=axis, keepdims=keepdims)


def where(cond: Tensor, a: Any, b: Any) -> Tensor:
    """``a`` where the bool mask ``cond`` holds, else ``b`` (tensors or numbers, broadcast).

    ``b = float("-inf")`` masks a softmax's input (``em.where(mask, S, -inf)``; the exp of
    a masked element is 0); any other value must be finite.
    """
    if not isinstance(cond, Tensor) or cond.dtype != "bool":
        raise GraphError(f"where (at {user_location()}): the condition must be a bool mask "
                         f"Tensor (an input of dtype 'bool' or a causal mask), got "
                         f"{getattr(cond, 'dtype', type(cond).__name__)}")
    if isinstance(a, Real) and math.isinf(float(a)):
        raise GraphError(f"where (at {user_location()}): put the -inf fill in the third "
                         "argument (where(mask, x, -inf))")
    if isinstance(b, Real) and not isinstance(b, bool) and float(b) == -math.inf:
        return apply(Op.MASK, cond, a)
    return apply(Op.WHERE, cond, a, b)


def logical_not(mask: Tensor) -> Tensor:
    """The complement of the bool ``mask`` (``~mask``): True where it does not hold.
    ``em.where(em.logical_not(m), x, float("-inf"))`` is -inf where ``m`` holds."""
    if not isinstance(mask, Tensor) or mask.dtype != "bool":
        raise GraphError(f"logical_not (at {user_location()}): expected a bool mask Tensor, "
                         f"got {getattr(mask, 'dtype', type(mask).__name__)}")
    return apply(Op.NOT, mask)


def _comparison(op: Op, name: str):
    def compare(a: Any, b: Any) -> Tensor:
        if not any(isinstance(x, Tensor) for x in (a, b)):
            raise GraphError(f"{name} (at {user_location()}): needs a Tensor operand")
        return apply(op, a, b)
    compare.__name__ = compare.__qualname__ = name
    compare.__doc__ = (f"``a {SPECS[op].symbol} b`` elementwise (float tensors or numbers, "
                       "broadcast): a bool mask, for ``em.where`` and ``masked_fill``.")
    return compare


gt, ge, lt, le = (_comparison(op, op.name.lower()) for op in (Op.GT, Op.GE, Op.LT, Op.LE))
eq, ne = _comparison(Op.EQ, "eq"), _comparison(Op.NE, "ne")


def causal_mask(graph: Graph, rows: int, cols: int | None = None, offset: int = 0) -> Tensor:
    """``graph.causal_mask(rows, cols, offset)``: True where ``col <= row + offset``."""
    if not isinstance(graph, Graph):
        raise GraphError(f"causal_mask (at {user_location()}): the first argument is the Graph "
                         f"the mask belongs to, got {type(graph).__name__}")
    return graph.causal_mask(rows, cols, offset)


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """Numerically safe softmax over ``axis``: ``exp(x - max) / sum(exp(x - max))``.

    Subtracting the row's largest element keeps every exp in (0, 1], so no dtype
    overflows; the value is the same as ``exp(x) / sum(exp(x))`` in exact arithmetic.
    """
    if not isinstance(x, Tensor):
        raise GraphError(f"softmax (at {user_location()}): expected a Tensor, got "
                         f"{type(x).__name__}")
    e = exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6,
             axis: int = -1) -> Tensor:
    """RMS normalization over ``axis``: ``x * rsqrt(mean(x*x) + eps) [* weight]``."""
    if isinstance(eps, bool) or not isinstance(eps, Real) or not 0.0 <= float(eps) < math.inf:
        raise GraphError(f"rms_norm: eps must be a finite number >= 0, got {eps!r} (at "
                         f"{user_location()})")
    y = x * rsqrt((x * x).mean(axis=axis, keepdims=True) + eps)
    return y * weight if weight is not None else y


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5, axis: Any = -1) -> Tensor:
    """Layer normalization over ``axis``: ``(x - mean) * rsqrt(var + eps) [* weight] [+ bias]``
    with the biased variance, as torch computes it."""
    if isinstance(eps, bool) or not isinstance(eps, Real) or not 0.0 <= float(eps) < math.inf:
        raise GraphError(f"layer_norm: eps must be a finite number >= 0, got {eps!r} (at "
                         f"{user_location()})")
    c = x - x.mean(axis=axis, keepdims=True)
    y = c * rsqrt((c * c).mean(axis=axis, keepdims=True) + eps)
    y = y * weight if weight is not None else y
    return y + bias if bias is not None else y
