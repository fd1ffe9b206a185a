"""The torch support table of the front end: one handler per torch function, method and module.

Each handler takes the (already converted) arguments of one torch.fx node, with
``em.Tensor``s in place of torch tensors and Python values as they are, and
returns an ``em.Tensor`` (or a Python value, for shape arithmetic such as
``x.shape[-1] ** -0.5``). A handler raises ``UnsupportedOpError`` for arguments
it has no form for (``pow`` with exponent 3, ``softmax`` with a ``dtype``, ...);
a ``TypeError`` from binding the arguments means the same. ``FUNCTIONS``,
``METHODS`` and ``MODULES`` are the one support table that both ``from_torch``
and the ``torch.compile`` backend use.
"""

from __future__ import annotations

import math
import operator
from numbers import Real
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from ..ir.errors import DTypeError, UnsupportedOpError
from ..ir.node import canonical_dtype
from .graph import Tensor, concat, exp, relu, rms_norm, rsqrt, silu, softmax, sqrt, where

SUPPORTED = ("matmul/bmm/mm/@, linear and nn.Linear, +, -, *, / (tensors or Python numbers), "
             "exp, sum, mean, amax, pow (2, 1, 0.5, -0.5, -1), sqrt, rsqrt, silu and nn.SiLU, relu "
             "and nn.ReLU, softmax and nn.Softmax, scaled_dot_product_attention (causal or a bool "
             "mask), where and masked_fill (bool masks, finite fills), rms_norm and nn.RMSNorm, "
             "cat, transpose, "
             "permute, .T, .mT, t, neg, reshape, view, flatten, unsqueeze, squeeze, contiguous, "
             "dropout in eval mode")


def _tensor(x: Any, what: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise UnsupportedOpError(f"{what} of a {type(x).__name__} (expected a tensor)")
    return x


def _no(flag: Any, what: str) -> None:
    if flag not in (None, False):
        raise UnsupportedOpError(f"{what} is not supported")


def _dims(x: Tensor, dims: Any) -> tuple[int, ...]:
    if len(dims) == 1 and not isinstance(dims[0], int):
        dims = tuple(dims[0])
    return tuple(int(d) for d in dims)


def _perm_swap(ndim: int, a: int, b: int) -> tuple[int, ...]:
    perm = list(range(ndim))
    a, b = a % ndim, b % ndim
    perm[a], perm[b] = perm[b], perm[a]
    return tuple(perm)


def _same_dtype(x: Tensor, dtype: Any, what: str) -> None:
    if dtype is None:
        return
    try:
        same = canonical_dtype(dtype) == x.dtype
    except DTypeError:
        same = False
    if not same:
        raise UnsupportedOpError(f"{what} with dtype={dtype} (casts are not supported)")


# -- arithmetic: Python numbers fold in Python, tensors build graph nodes --------------------
def _add(a: Any, b: Any, *, alpha: Any = 1, out: Any = None) -> Any:
    _no(out, "out=")
    return a + (b if alpha == 1 else b * alpha)


def _sub(a: Any, b: Any, *, alpha: Any = 1, out: Any = None) -> Any:
    _no(out, "out=")
    return a - (b if alpha == 1 else b * alpha)


def _mul(a: Any, b: Any, *, out: Any = None) -> Any:
    _no(out, "out=")
    return a * b


def _div(a: Any, b: Any, *, rounding_mode: Any = None, out: Any = None) -> Any:
    _no(out, "out=")
    _no(rounding_mode, f"division with rounding_mode={rounding_mode!r}")
    return a / b


def _neg(x: Any, *, out: Any = None) -> Any:
    _no(out, "out=")
    return -x


def _pow(x: Any, exponent: Any, *, out: Any = None) -> Any:
    _no(out, "out=")
    if not isinstance(x, Tensor):
        if isinstance(x, Real) and isinstance(exponent, Real):
            return x ** exponent
        raise UnsupportedOpError("pow with a tensor exponent")
    if isinstance(exponent, Real) and not isinstance(exponent, bool):
        if exponent == -1:
            return 1.0 / x
        if exponent in (2, 1, 0.5, -0.5):
            return x ** exponent
    raise UnsupportedOpError(f"pow with exponent {exponent!r} (supported: 2, 1, 0.5, -0.5, -1)")


def _matmul(a: Any, b: Any, *, out: Any = None) -> Tensor:
    _no(out, "out=")
    return _tensor(a, "matmul") @ _tensor(b, "matmul")


def _fixed_matmul(ndim: int, name: str):
    def h(a: Any, b: Any, *, out: Any = None) -> Tensor:
        _no(out, "out=")
        for t in (a, b):
            if _tensor(t, name).ndim != ndim:
                raise UnsupportedOpError(f"{name} of a {t.ndim}-d tensor (expected {ndim}-d)")
        return a @ b
    return h


def _linear(x: Any, weight: Any, bias: Any = None) -> Tensor:
    w = _tensor(weight, "linear weight")
    if w.ndim != 2:
        raise UnsupportedOpError(f"linear with a {w.ndim}-d weight (expected 2-d)")
    y = _tensor(x, "linear") @ w.transpose(1, 0)
    return y if bias is None else y + bias


# -- unary --------------------------------------------------------------------------------
def _unary(fn, name: str):
    def h(x: Any, *, out: Any = None) -> Tensor:
        _no(out, "out=")
        return fn(_tensor(x, name))
    return h


def _activation(fn, name: str):
    def h(x: Any, inplace: bool = False) -> Tensor:
        _no(inplace, f"{name}(inplace=True)")
        return fn(_tensor(x, name))
    return h


def _softmax(x: Any, dim: Any = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    x = _tensor(x, "softmax")
    if dim is None:
        raise UnsupportedOpError("softmax without an explicit dim")
    _same_dtype(x, dtype, "softmax")
    return softmax(x, axis=dim)  # max-subtracted, as torch computes it


def _sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
          is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Tensor:
    """F.scaled_dot_product_attention as ``softmax(q @ k^T * scale) @ v`` (max-subtracted)."""
    q, k, v = (_tensor(t, "scaled_dot_product_attention") for t in (query, key, value))
    _no(float(dropout_p) != 0.0, f"scaled_dot_product_attention with dropout_p={dropout_p}")
    if attn_mask is not None and (not isinstance(attn_mask, Tensor) or attn_mask.dtype != "bool"):
        raise UnsupportedOpError("scaled_dot_product_attention with a float attn_mask (a bool "
                                 "mask is supported)")
    _no(attn_mask is not None and is_causal, "scaled_dot_product_attention with both "
        "attn_mask and is_causal")
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise UnsupportedOpError(f"scaled_dot_product_attention of {q.ndim}-d, {k.ndim}-d and "
                                 f"{v.ndim}-d tensors (expected equal ranks >= 2)")
    if q.shape[:-2] != k.shape[:-2] and not enable_gqa:
        raise UnsupportedOpError(f"scaled_dot_product_attention: query batch dims "
                                 f"{q.shape[:-2]} differ from key's {k.shape[:-2]}")
    if q.shape[:-2] != k.shape[:-2]:
        raise UnsupportedOpError("scaled_dot_product_attention with enable_gqa and fewer key "
                                 "heads is not supported yet")
    s = q @ k.transpose(tuple(range(k.ndim - 2)) + (k.ndim - 1, k.ndim - 2))
    factor = float(scale) if scale is not None else q.shape[-1] ** -0.5
    s = s * factor
    if is_causal:  # torch's is_causal: the top-left diagonal
        s = where(q.graph.causal_mask(q.shape[-2], k.shape[-2]), s, float("-inf"))
    elif attn_mask is not None:
        s = where(attn_mask, s, float("-inf"))
    return softmax(s, axis=-1) @ v


def _where(condition: Any, input: Any, other: Any, *, out: Any = None) -> Tensor:  # noqa: A002
    _no(out, "out=")
    cond = _tensor(condition, "where")
    if cond.dtype != "bool":
        raise UnsupportedOpError(f"where with a {cond.dtype} condition (a bool mask is needed)")
    if isinstance(input, (int, float)) and float(input) == float("-inf"):
        raise UnsupportedOpError("where(mask, -inf, x): write where(~mask, x, -inf) as "
                                 "where(keep, x, -inf) with the kept positions' mask")
    return where(cond, input, other)


def _masked_fill(x: Any, mask: Any, value: Any) -> Tensor:
    x, m = _tensor(x, "masked_fill"), _tensor(mask, "masked_fill mask")
    if m.dtype != "bool":
        raise UnsupportedOpError(f"masked_fill with a {m.dtype} mask (a bool mask is needed)")
    if isinstance(value, Tensor) or not math.isfinite(float(value)):
        raise UnsupportedOpError("masked_fill with a tensor or infinite value (a finite fill "
                                 "is supported: HF's finfo.min; -inf masks are "
                                 "where(keep, x, -inf))")
    return where(m, float(value), x)


def _rms_norm(x: Any, normalized_shape: Any, weight: Any = None, eps: Any = None) -> Tensor:
    x = _tensor(x, "rms_norm")
    k = 1 if isinstance(normalized_shape, int) else len(tuple(normalized_shape))
    if eps is None:
        eps = torch.finfo(getattr(torch, x.dtype)).eps
    return rms_norm(x, weight, float(eps), axis=tuple(range(x.ndim - k, x.ndim)))


# -- reductions -----------------------------------------------------------------------------
def _reduce(kind: str):
    def h(x: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None,
          out: Any = None) -> Tensor:
        x = _tensor(x, kind)
        _no(out, "out=")
        _same_dtype(x, dtype, kind)
        if dim is not None and not isinstance(dim, int) and len(tuple(dim)) == 0:
            dim = None  # torch reduces over every axis for dim=[]
        return getattr(x, kind)(axis=dim, keepdims=bool(keepdim))
    return h


# -- movement -------------------------------------------------------------------------------
def _cat(tensors: Any, dim: int = 0, *, out: Any = None) -> Tensor:
    _no(out, "out=")
    return concat([_tensor(t, "cat") for t in tensors], axis=dim)


def _transpose(x: Any, dim0: int, dim1: int) -> Tensor:
    x = _tensor(x, "transpose")
    return x.transpose(_perm_swap(x.ndim, dim0, dim1))


def _permute(x: Any, *dims: Any, **kw: Any) -> Tensor:
    x = _tensor(x, "permute")
    return x.transpose(_dims(x, dims or (kw.pop("dims"),)))


def _t(x: Any) -> Tensor:
    x = _tensor(x, "t")
    return x.transpose(1, 0) if x.ndim == 2 else x


def _reshape(x: Any, *shape: Any, **kw: Any) -> Tensor:
    x = _tensor(x, "reshape")
    shape = shape or (kw.pop("shape"),)
    if len(shape) == 1 and not isinstance(shape[0], int):
        if not isinstance(shape[0], (tuple, list, torch.Size)):
            raise UnsupportedOpError(f"view/reshape to {shape[0]!r} (a dtype view or a "
                                     "non-shape argument)")
    return x.reshape(_dims(x, shape))


def _flatten(x: Any, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    x = _tensor(x, "flatten")
    if x.ndim == 0:
        return x.reshape((1,))
    s, e = start_dim % x.ndim, end_dim % x.ndim
    mid = 1
    for d in x.shape[s:e + 1]:
        mid *= d
    return x.reshape(x.shape[:s] + (mid,) + x.shape[e + 1:])


def _unsqueeze(x: Any, dim: int) -> Tensor:
    x = _tensor(x, "unsqueeze")
    d = dim % (x.ndim + 1)
    return x.reshape(x.shape[:d] + (1,) + x.shape[d:])


def _squeeze(x: Any, dim: Any = None) -> Tensor:
    x = _tensor(x, "squeeze")
    dims = range(x.ndim) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    drop = {d % x.ndim for d in dims if x.shape[d % x.ndim] == 1}
    return x.reshape(tuple(s for i, s in enumerate(x.shape) if i not in drop))


def _dropout(x: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    if training and p > 0:
        raise UnsupportedOpError(f"dropout(p={p}) in training mode (call .eval())")
    return _tensor(x, "dropout")


def _identity(x: Any, *args: Any, **kwargs: Any) -> Tensor:
    return _tensor(x, "contiguous")


# -- Python-level glue: shapes, attributes, indexing ----------------------------------------
def _getattr(obj: Any, name: str) -> Any:
    if not isinstance(obj, Tensor):
        return getattr(obj, name)
    if name == "T":
        return obj.transpose(tuple(range(obj.ndim))[::-1])  # torch: reverse every axis
    if name == "mT":
        return obj.transpose(_perm_swap(obj.ndim, -1, -2))
    if name == "shape":
        return torch.Size(obj.shape)
    if name == "ndim":
        return obj.ndim
    if name == "dtype":
        return getattr(torch, obj.dtype)
    raise UnsupportedOpError(f"tensor attribute .{name}")


def _getitem(obj: Any, index: Any) -> Any:
    if isinstance(obj, Tensor):
        raise UnsupportedOpError("tensor indexing x[...]")
    return obj[index]


def _size(x: Any, dim: Any = None) -> Any:
    shape = torch.Size(_tensor(x, "size").shape)
    return shape if dim is None else shape[dim]


def _dim(x: Any) -> int:
    return _tensor(x, "dim").ndim


FUNCTIONS = {
    torch.matmul: _matmul, operator.matmul: _matmul, torch.bmm: _fixed_matmul(3, "bmm"),
    torch.mm: _fixed_matmul(2, "mm"), F.linear: _linear,
    operator.add: _add, torch.add: _add, operator.sub: _sub, torch.sub: _sub,
    torch.subtract: _sub, operator.mul: _mul, torch.mul: _mul, torch.multiply: _mul,
    operator.truediv: _div, torch.div: _div, torch.divide: _div, torch.true_divide: _div,
    operator.neg: _neg, torch.neg: _neg, torch.negative: _neg,
    operator.pow: _pow, torch.pow: _pow,
    torch.exp: _unary(exp, "exp"), torch.sqrt: _unary(sqrt, "sqrt"),
    torch.rsqrt: _unary(rsqrt, "rsqrt"), torch.relu: _unary(relu, "relu"),
    F.silu: _activation(silu, "silu"), F.relu: _activation(relu, "relu"),
    F.scaled_dot_product_attention: _sdpa,
    torch.softmax: _softmax, F.softmax: _softmax, F.rms_norm: _rms_norm, F.dropout: _dropout,
    torch.sum: _reduce("sum"), torch.mean: _reduce("mean"), torch.amax: _reduce("max"),
    torch.cat: _cat, torch.concat: _cat, torch.concatenate: _cat, torch.where: _where,
    torch.transpose: _transpose, torch.swapaxes: _transpose, torch.permute: _permute,
    torch.t: _t, torch.reshape: _reshape, torch.flatten: _flatten,
    torch.unsqueeze: _unsqueeze, torch.squeeze: _squeeze,
    getattr: _getattr, operator.getitem: _getitem,
}

METHODS = {
    "matmul": _matmul, "__matmul__": _matmul, "bmm": FUNCTIONS[torch.bmm],
    "mm": FUNCTIONS[torch.mm], "add": _add, "sub": _sub, "subtract": _sub, "mul": _mul,
    "multiply": _mul, "div": _div, "divide": _div, "true_divide": _div, "neg": _neg,
    "negative": _neg, "pow": _pow, "exp": FUNCTIONS[torch.exp], "sqrt": FUNCTIONS[torch.sqrt],
    "rsqrt": FUNCTIONS[torch.rsqrt], "relu": FUNCTIONS[torch.relu], "softmax": _softmax,
    "masked_fill": _masked_fill,
    "sum": FUNCTIONS[torch.sum], "mean": FUNCTIONS[torch.mean], "amax": FUNCTIONS[torch.amax],
    "transpose": _transpose,
    "swapaxes": _transpose, "permute": _permute, "t": _t, "reshape": _reshape,
    "view": _reshape, "flatten": _flatten, "unsqueeze": _unsqueeze, "squeeze": _squeeze,
    "contiguous": _identity, "size": _size, "dim": _dim,
}


# -- aten ops (graphs from AOTAutograd or export), keyed by overload packet ----------------
def _addmm(bias: Any, m1: Any, m2: Any, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    y = _matmul(m1, m2)
    return (bias if beta == 1 else bias * beta) + (y if alpha == 1 else y * alpha)


def _aten_softmax(x: Any, dim: int, half_to_float: bool = False) -> Tensor:
    _no(half_to_float, "_softmax(half_to_float=True)")
    return _softmax(x, dim)


_A = torch.ops.aten
ATEN = {
    _A.mm: FUNCTIONS[torch.mm], _A.bmm: FUNCTIONS[torch.bmm], _A.matmul: _matmul,
    _A.addmm: _addmm, _A.linear: _linear,
    _A.add: lambda x, y, alpha=1: _add(x, y, alpha=alpha),
    _A.sub: lambda x, y, alpha=1: _sub(x, y, alpha=alpha),
    _A.rsub: lambda x, y, alpha=1: _sub(y, x, alpha=alpha),
    _A.mul: _mul, _A.div: _div, _A.neg: _neg, _A.pow: _pow,
    _A.exp: FUNCTIONS[torch.exp], _A.sqrt: FUNCTIONS[torch.sqrt],
    _A.rsqrt: FUNCTIONS[torch.rsqrt], _A.relu: FUNCTIONS[torch.relu],
    _A.silu: _unary(silu, "silu"), _A._softmax: _aten_softmax,
    _A.sum: FUNCTIONS[torch.sum], _A.mean: FUNCTIONS[torch.mean], _A.amax: FUNCTIONS[torch.amax],
    _A.cat: _cat, _A.permute: _permute, _A.transpose: _transpose, _A.t: _t,
    _A.view: _reshape, _A._unsafe_view: _reshape, _A.reshape: _reshape,
    _A.unsqueeze: _unsqueeze, _A.squeeze: _squeeze,
    _A.clone: _identity, _A.alias: _identity, _A.detach: _identity,
}


def function_handler(target: Any) -> Any:
    """The handler of a ``call_function`` target (a torch function or an aten op), or None."""
    try:
        handler = FUNCTIONS.get(target)
    except TypeError:  # an unhashable callable
        return None
    if handler is None and isinstance(target, torch._ops.OpOverload):
        handler = ATEN.get(target.overloadpacket)
    return handler


# -- modules: handler(converter, module, path, *args, **kwargs) -----------------------------
def _linear_module(cv: Any, mod: nn.Linear, path: str, x: Any) -> Tensor:
    bias = cv.param(f"{path}.bias") if mod.bias is not None else None
    return _linear(x, cv.param(f"{path}.weight"), bias)


def _rms_norm_module(cv: Any, mod: Any, path: str, x: Any) -> Tensor:
    weight = cv.param(f"{path}.weight") if mod.weight is not None else None
    return _rms_norm(x, mod.normalized_shape, weight, mod.eps)


def _dropout_module(cv: Any, mod: nn.Dropout, path: str, x: Any) -> Tensor:
    return _dropout(x, mod.p, mod.training, mod.inplace)


MODULES = {
    nn.Linear: _linear_module,
    nn.SiLU: lambda cv, mod, path, x: _activation(silu, "nn.SiLU")(x, mod.inplace),
    nn.ReLU: lambda cv, mod, path, x: _activation(relu, "nn.ReLU")(x, mod.inplace),
    nn.Softmax: lambda cv, mod, path, x: _softmax(x, mod.dim),
    nn.Identity: lambda cv, mod, path, x, *a, **k: _tensor(x, "nn.Identity"),
    nn.Dropout: _dropout_module,
    nn.RMSNorm: _rms_norm_module,
}
