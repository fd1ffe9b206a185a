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
from ..ir.node import Op, canonical_dtype
from .functions import (
    bitwise_and,
    cos,
    erf,
    exp,
    gelu,
    layer_norm,
    relu,
    right_shift,
    rms_norm,
    rsqrt,
    sigmoid,
    silu,
    sin,
    softmax,
    sqrt,
    tanh,
)
from .gather import embedding, index_select, take_along_axis
from .graph import Tensor
from .torch_masks import MASK_FUNCTIONS, MASK_METHODS, BoolMask, combine, is_mask, select
from .torch_movement import (
    MOVEMENT_ATEN,
    MOVEMENT_FUNCTIONS,
    MOVEMENT_METHODS,
    MOVEMENT_MODULES,
    refuse,
    repeated_heads,
    tensor_arg,
)

# each dtype's lowest finite value: the fill of a bool attn_mask's masked scores in SDPA
LOWEST = {"float32": float(torch.finfo(torch.float32).min),
          "float16": float(torch.finfo(torch.float16).min),
          "bfloat16": float(torch.finfo(torch.bfloat16).min)}

SUPPORTED = (
    "matmul/bmm/mm/@, linear and nn.Linear, addmm, +, -, *, / (tensors or Python numbers), "
    "exp, tanh, erf, cos, sin, sum, mean, amax, pow (integers -1..4, 0.5, -0.5), sqrt, rsqrt, "
    "silu and nn.SiLU, relu and nn.ReLU, sigmoid and nn.Sigmoid, gelu and nn.GELU (erf or "
    "tanh), softmax and "
    "nn.Softmax (dtype= too), scaled_dot_product_attention (causal, a bool mask or an "
    "additive float mask, GQA and MQA: enable_gqa or key heads broadcast), "
    "where and masked_fill (bool masks, finite or -inf fills; ~ and logical_not of "
    "constants such as mask buffers are folded), ~, logical_not, &, |, logical_and, "
    "logical_or, bitwise_and and bitwise_or of bool masks, comparisons of float tensors "
    "and numbers (gt, ge, lt, le, eq, ne, greater, ..., x.bool()), rms_norm and nn.RMSNorm, "
    "layer_norm and nn.LayerNorm, casts (.to(dtype), .float(), .half(), .type(dtype), "
    ".type_as), indexing x[...] with ints, slices (any positive step), None, ... and one "
    "list or constant integer tensor of indices (x[..., [-2], :]), select, narrow, chunk, "
    "split, expand, cat, stack, repeat_interleave (an int count), flip, transpose, "
    "permute, .T, .mT, t, neg, reshape, view, flatten, unsqueeze, squeeze, contiguous, "
    "dropout in eval mode, embedding and nn.Embedding, index_select, gather (int64/int32 "
    "indices; gather's of the input's shape but along dim)")


def _as(x: Tensor, dtype: Any, what: str) -> Tensor:
    """``x`` cast to ``dtype`` (None: unchanged), as torch's ``dtype=`` arguments do."""
    if dtype is None:
        return x
    try:
        name = canonical_dtype(dtype)
    except DTypeError:
        raise UnsupportedOpError(f"{what} with dtype={dtype} (supported: float16, bfloat16, "
                                 "float32)") from None
    if name == "bool":  # x != 0, as x.bool() (a bool mask: itself)
        return MASK_METHODS["bool"](x)
    return x.astype(name)


def _to(x: Any, *args: Any, **kwargs: Any) -> Tensor:
    """``x.to(dtype)``, ``x.to(other)``, ``x.to(device, dtype)``: only the dtype matters
    (a partition runs on its inputs' device)."""
    x = tensor_arg(x, "to")
    dtype = kwargs.get("dtype")
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, Tensor):
            dtype = a.dtype
        elif not isinstance(a, (torch.device, str)):
            raise UnsupportedOpError(f"to({a!r})")
    return _as(x, dtype, "to")


def _cast_to(dtype: Any):
    def h(x: Any, *args: Any, **kwargs: Any) -> Tensor:
        return _as(tensor_arg(x, "cast"), dtype, "cast")
    return h


def _type(x: Any, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Tensor:
    if not isinstance(dtype, torch.dtype):
        raise UnsupportedOpError(f"type({dtype!r}) (a torch.dtype is supported)")
    return _as(tensor_arg(x, "type"), dtype, "type")


def _type_as(x: Any, other: Any) -> Tensor:
    return _as(tensor_arg(x, "type_as"), tensor_arg(other, "type_as").dtype, "type_as")


# -- arithmetic: Python numbers fold in Python, tensors build graph nodes --------------------
def _add(a: Any, b: Any, *, alpha: Any = 1, out: Any = None) -> Any:
    refuse(out, "out=")
    return a + (b if alpha == 1 else b * alpha)


def _sub(a: Any, b: Any, *, alpha: Any = 1, out: Any = None) -> Any:
    refuse(out, "out=")
    return a - (b if alpha == 1 else b * alpha)


def _mul(a: Any, b: Any, *, out: Any = None) -> Any:
    refuse(out, "out=")
    return a * b


def _div(a: Any, b: Any, *, rounding_mode: Any = None, out: Any = None) -> Any:
    refuse(out, "out=")
    refuse(rounding_mode, f"division with rounding_mode={rounding_mode!r}")
    return a / b


def _neg(x: Any, *, out: Any = None) -> Any:
    refuse(out, "out=")
    return -x


def _pow(x: Any, exponent: Any, *, out: Any = None) -> Any:
    refuse(out, "out=")
    if not isinstance(x, Tensor):
        if isinstance(x, Real) and isinstance(exponent, Real):
            return x ** exponent
        raise UnsupportedOpError("pow with a tensor exponent")
    if isinstance(exponent, Real) and not isinstance(exponent, bool):
        if exponent == -1:
            return 1.0 / x
        if exponent in (2, 1, 0.5, -0.5):
            return x ** exponent
        if exponent in (3, 4):  # integer powers are products
            y = x * x * x
            return y * x if exponent == 4 else y
    raise UnsupportedOpError(f"pow with exponent {exponent!r} (supported: -1, 0.5, -0.5, 1, 2, "
                             "3, 4)")


def _matmul(a: Any, b: Any, *, out: Any = None) -> Tensor:
    refuse(out, "out=")
    a, b = tensor_arg(a, "matmul"), tensor_arg(b, "matmul")
    return _grouped_matmul(a, b) or a @ b


def _grouped_matmul(a: Tensor, b: Tensor) -> Tensor | None:
    """``a @ b`` where ``b`` is keys or values repeated per query head (``repeat_kv``, or
    its transpose of the last two axes), as eager attention writes it: each group of
    query heads' rows become one key head's rows, so the product reads each key head once
    ((..., h, 1, k) -> (..., h / r, r, k), the result reshaped back); else None. Only for
    one row per head (a decode step): with more, the scores reshaped between the two
    products planned dearer than the copies (h100 model, s = L = 64: 9.38 -> 10.06 us)."""
    node, flip = b.node, False
    if node.op is Op.TRANSPOSE and len(node.shape) >= 4 and tuple(node.arg) == tuple(
            range(len(node.shape) - 2)) + (len(node.shape) - 1, len(node.shape) - 2):
        node, flip = node.srcs[0], True
    rep = repeated_heads(Tensor(node, b.graph))
    if rep is None or a.ndim != b.ndim or a.ndim < 4 or a.shape[:-3] != b.shape[:-3] or \
            a.shape[-3] != b.shape[-3] or a.shape[-2] != 1 or a.shape[-1] != b.shape[-2]:
        return None
    x, r = rep
    x = x.reshape(x.shape[:-3] + x.shape[-2:])  # (..., kv, L, d)
    if flip:
        x = x.T
    lead, kv = a.shape[:-3], a.shape[-3] // r
    out = a.reshape(lead + (kv, r * a.shape[-2], a.shape[-1])) @ x
    return out.reshape(lead + (a.shape[-3], a.shape[-2], out.shape[-1]))


def _fixed_matmul(ndim: int, name: str):
    def h(a: Any, b: Any, *, out: Any = None) -> Tensor:
        refuse(out, "out=")
        for t in (a, b):
            if tensor_arg(t, name).ndim != ndim:
                raise UnsupportedOpError(f"{name} of a {t.ndim}-d tensor (expected {ndim}-d)")
        return a @ b
    return h


def _linear(x: Any, weight: Any, bias: Any = None) -> Tensor:
    w = tensor_arg(weight, "linear weight")
    if w.ndim != 2:
        raise UnsupportedOpError(f"linear with a {w.ndim}-d weight (expected 2-d)")
    y = tensor_arg(x, "linear") @ w.transpose(1, 0)
    return y if bias is None else y + bias


# -- unary --------------------------------------------------------------------------------
def _unary(fn, name: str):
    def h(x: Any, *, out: Any = None) -> Tensor:
        refuse(out, "out=")
        return fn(tensor_arg(x, name))
    return h


def _activation(fn, name: str):
    def h(x: Any, inplace: bool = False) -> Tensor:
        refuse(inplace, f"{name}(inplace=True)")
        return fn(tensor_arg(x, name))
    return h


def torch_softmax(x: Tensor, axis: int) -> Tensor:
    """softmax as torch's kernels compute it (CPU and GPU): max-subtracted, and for a
    float16 or bfloat16 ``x`` in float32, rounded once to ``x``'s dtype (``em.softmax`` in
    the narrow dtype rounds each of its five ops: up to 9 float16 and 56 bfloat16 units in
    the last place from eager torch, against at most 1 this way)."""
    if x.dtype in ("float16", "bfloat16"):
        return softmax(x.astype("float32"), axis=axis).astype(x.dtype)
    return softmax(x, axis=axis)


def _softmax(x: Any, dim: Any = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    x = tensor_arg(x, "softmax")
    if dim is None:
        raise UnsupportedOpError("softmax without an explicit dim")
    return torch_softmax(_as(x, dtype, "softmax"), dim)


def _sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
          is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Tensor:
    """F.scaled_dot_product_attention as ``softmax(q @ k^T * scale) @ v`` (max-subtracted;
    the softmax as ``torch_softmax``). Batch dims broadcast as in torch (Falcon's one key
    head for all query heads); with ``enable_gqa`` each group of query heads shares a key
    head (the heads split into (key heads, group), the key's group axis of size 1)."""
    q, k, v = (tensor_arg(t, "scaled_dot_product_attention") for t in (query, key, value))
    refuse(float(dropout_p) != 0.0, f"scaled_dot_product_attention with dropout_p={dropout_p}")
    if attn_mask is not None and not isinstance(attn_mask, (Tensor, BoolMask)):
        raise UnsupportedOpError(f"scaled_dot_product_attention with a "
                                 f"{type(attn_mask).__name__} attn_mask (a bool or float "
                                 "tensor is supported)")
    refuse(attn_mask is not None and is_causal, "scaled_dot_product_attention with both "
        "attn_mask and is_causal")
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise UnsupportedOpError(f"scaled_dot_product_attention of {q.ndim}-d, {k.ndim}-d and "
                                 f"{v.ndim}-d tensors (expected equal ranks >= 2)")
    if not enable_gqa:  # batch dims broadcast (Falcon's one key head for every query head)
        try:
            torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        except RuntimeError:
            raise UnsupportedOpError(f"scaled_dot_product_attention: the batch dims of query "
                                     f"{q.shape}, key {k.shape} and value {v.shape} do not "
                                     "broadcast") from None
    shape = q.shape
    if enable_gqa and q.shape[:-2] != k.shape[:-2]:
        # GQA: each group of query heads shares one key head
        hq, hkv = q.shape[-3] if q.ndim >= 3 else 1, k.shape[-3] if k.ndim >= 3 else 1
        if q.ndim < 3 or q.shape[:-3] != k.shape[:-3] or hq % hkv:
            raise UnsupportedOpError(f"scaled_dot_product_attention with enable_gqa: query "
                                     f"{q.shape} and key {k.shape} (query heads must be a "
                                     "multiple of key heads)")
        q, k, v, attn_mask = _grouped(q, k.reshape(k.shape[:-3] + (hkv, 1) + k.shape[-2:]),
                                      v.reshape(v.shape[:-3] + (hkv, 1) + v.shape[-2:]),
                                      attn_mask, hq // hkv, is_causal)
    elif q.ndim >= 4 and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        # keys repeated per query head (repeat_kv before SDPA): read each key head once
        rk, rv = repeated_heads(k), repeated_heads(v)
        if rk and rv and rk[1] == rv[1] and rk[0].ndim == rv[0].ndim == q.ndim + 1:
            q, k, v, attn_mask = _grouped(q, rk[0], rv[0], attn_mask, rk[1], is_causal)
    s = q @ k.T
    factor = float(scale) if scale is not None else q.shape[-1] ** -0.5
    s = s * factor
    kept = None
    if is_causal:  # torch's is_causal: the top-left diagonal (it keeps column 0 of every row)
        s = select(q.graph.causal_mask(q.shape[-2], k.shape[-2]), s, float("-inf"), "sdpa")
    elif is_mask(attn_mask):
        # a row the mask keeps nowhere is 0 in torch's eager SDPA (softmax of -inf would be
        # NaN): masked scores get the dtype's lowest finite value (exp of it minus the row's
        # max is 0 wherever the row keeps something) and the output is multiplied by
        # whether the row keeps anything (1 or 0)
        s = select(attn_mask, s, LOWEST[s.dtype], "scaled_dot_product_attention")
        kept = select(attn_mask, 1.0, 0.0, "scaled_dot_product_attention").max(
            axis=-1, keepdims=True)
    elif attn_mask is not None:  # torch adds a float mask to the scores (BERT's padding mask)
        s = s + attn_mask.astype(s.dtype)
    out = torch_softmax(s, -1) @ v  # in float32 for float16/bfloat16 scores, as torch
    if kept is not None:
        out = out * kept.astype(out.dtype)
    want = shape[:-1] + (out.shape[-1],)
    return out.reshape(want) if out.shape != want else out


def _grouped(q: Tensor, k: Tensor, v: Tensor, mask: Any, r: int, causal: bool) -> tuple:
    """SDPA's operands with each group of ``r`` query heads sharing one key head; k and v
    are (..., h / r, 1, L, d). Where every row of a group sees the same mask (no mask, or
    one broadcast along the rows, as in a decode step, and no ``is_causal``) the group's
    rows are one head's rows: q (..., h, s, d) -> (..., h / r, r * s, d) and k, v
    (..., h / r, L, d), plain attention. Otherwise q -> (..., h / r, r, s, d), and the mask
    (broadcast to (..., h, s, L) as torch broadcasts it) is split the same way, so that its
    batch axis stays the batch axis."""
    lead, kv = q.shape[:-3], q.shape[-3] // r
    shape = None if mask is None else tuple(mask.shape)
    if not causal and (shape is None or len(shape) < 2 or shape[-2] == 1):
        heads = 1 if shape is None or len(shape) < 3 else shape[-3]
        if heads == 1 or q.shape[-2] == 1:  # a per-head mask folds only for one row
            q = q.reshape(lead + (kv, r * q.shape[-2], q.shape[-1]))
            k, v = (t.reshape(t.shape[:-3] + t.shape[-2:]) for t in (k, v))
            if heads != 1:  # (..., h, 1, L) -> (..., h / r, r, L)
                mask = _reshaped(mask, shape[:-3] + (kv, r, shape[-1]))
            return q, k, v, mask
    q = q.reshape(lead + (kv, r) + q.shape[-2:])
    if shape is None or len(shape) < 3:
        return q, k, v, mask
    split = (kv, r) if shape[-3] != 1 else (1, 1)
    return q, k, v, _reshaped(mask, shape[:-3] + split + shape[-2:])


def _reshaped(mask: Any, shape: tuple[int, ...]) -> Any:
    """An SDPA mask (a graph tensor or a ``BoolMask``) reshaped to ``shape`` (the same
    elements in the same order, its leading axes as they were)."""
    if not isinstance(mask, BoolMask):
        return mask.reshape(shape)
    base = mask.base  # mask.shape less some leading 1s; the leading axes keep their sizes
    if base.ndim >= 3:  # it holds the head axis: split it as the mask's
        base = base.reshape(shape[len(mask.shape) - base.ndim:])
    return BoolMask(base, shape, mask.negated)


def _rms_norm(x: Any, normalized_shape: Any, weight: Any = None, eps: Any = None) -> Tensor:
    x = tensor_arg(x, "rms_norm")
    k = 1 if isinstance(normalized_shape, int) else len(tuple(normalized_shape))
    if eps is None:
        eps = torch.finfo(getattr(torch, x.dtype)).eps
    return rms_norm(x, weight, float(eps), axis=tuple(range(x.ndim - k, x.ndim)))


def _layer_norm(x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None,
                eps: float = 1e-5) -> Tensor:
    x = tensor_arg(x, "layer_norm")
    k = 1 if isinstance(normalized_shape, int) else len(tuple(normalized_shape))
    return layer_norm(x, weight, bias, float(eps), axis=tuple(range(x.ndim - k, x.ndim)))


def _gelu(x: Any, approximate: str = "none") -> Tensor:
    return gelu(tensor_arg(x, "gelu"), approximate)


def _python_math(fn):
    """``math.sqrt(x.size(-1))``, ``x.shape[-1] // 2``: arithmetic on sizes, folded in Python."""
    def h(*args: Any) -> Any:
        if not all(isinstance(a, Real) for a in args):
            raise UnsupportedOpError(f"{getattr(fn, '__name__', fn)} of a tensor (it takes "
                                     "Python numbers such as sizes)")
        return fn(*args)
    return h


# -- reductions -----------------------------------------------------------------------------
def _reduce(kind: str):
    def h(x: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None,
          out: Any = None) -> Tensor:
        x = tensor_arg(x, kind)
        refuse(out, "out=")
        x = _as(x, dtype, kind)
        if dim is not None and not isinstance(dim, int) and len(tuple(dim)) == 0:
            dim = None  # torch reduces over every axis for dim=[]
        return getattr(x, kind)(axis=dim, keepdims=bool(keepdim))
    return h


# -- bit ops on int8/uint8 tensors (packed int4 weights: w_p & 0xF, w_p >> 4) ------------------
def _bits(fn: Any, name: str):
    """The handler of bit op ``fn`` (``&``: of two bool masks, their logical and)."""
    def h(x: Any, other: Any, *, out: Any = None) -> Tensor:
        refuse(out, "out=")
        if fn is bitwise_and and (is_mask(x) or is_mask(other)):  # padding & causal
            return combine(Op.AND, x, other, name)
        if not isinstance(x, Tensor):
            raise UnsupportedOpError(f"{name} of {type(x).__name__} and a tensor: the tensor "
                                     "comes first, an integer constant second (w & 0xF)")
        if isinstance(other, Tensor):
            raise UnsupportedOpError(f"{name} of two tensors: the second operand must be an "
                                     "integer constant (w & 0xF, w >> 4)")
        return fn(x, other)
    return h


BIT_FUNCTIONS = {
    operator.and_: _bits(bitwise_and, "&"), torch.bitwise_and: _bits(bitwise_and, "bitwise_and"),
    operator.rshift: _bits(right_shift, ">>"),
    torch.bitwise_right_shift: _bits(right_shift, "bitwise_right_shift")}
BIT_METHODS = {"__and__": BIT_FUNCTIONS[operator.and_],
               "bitwise_and": BIT_FUNCTIONS[torch.bitwise_and],
               "__rshift__": BIT_FUNCTIONS[operator.rshift],
               "bitwise_right_shift": BIT_FUNCTIONS[torch.bitwise_right_shift]}


FUNCTIONS = {
    torch.matmul: _matmul, operator.matmul: _matmul, torch.bmm: _fixed_matmul(3, "bmm"),
    torch.mm: _fixed_matmul(2, "mm"), F.linear: _linear,
    operator.add: _add, torch.add: _add, operator.sub: _sub, torch.sub: _sub,
    torch.subtract: _sub, operator.mul: _mul, torch.mul: _mul, torch.multiply: _mul,
    operator.truediv: _div, torch.div: _div, torch.divide: _div, torch.true_divide: _div,
    operator.neg: _neg, torch.neg: _neg, torch.negative: _neg,
    operator.pow: _pow, torch.pow: _pow,
    torch.exp: _unary(exp, "exp"), torch.sqrt: _unary(sqrt, "sqrt"),
    torch.tanh: _unary(tanh, "tanh"), F.tanh: _unary(tanh, "tanh"), torch.erf: _unary(erf, "erf"),
    torch.cos: _unary(cos, "cos"), torch.sin: _unary(sin, "sin"),
    F.gelu: _gelu, F.layer_norm: _layer_norm, torch.addmm: lambda *a, **k: _addmm(*a, **k),
    torch.rms_norm: _rms_norm, torch.layer_norm: _layer_norm,  # what F.* call (Dynamo inlines)
    **{f: _python_math(f) for f in (math.sqrt, math.exp, math.log, math.pow, math.floor,
                                    math.ceil, operator.floordiv, operator.mod)},
    torch.rsqrt: _unary(rsqrt, "rsqrt"), torch.relu: _unary(relu, "relu"),
    F.silu: _activation(silu, "silu"), F.relu: _activation(relu, "relu"),
    torch.sigmoid: _unary(sigmoid, "sigmoid"), F.sigmoid: _unary(sigmoid, "sigmoid"),
    F.scaled_dot_product_attention: _sdpa,
    torch.softmax: _softmax, F.softmax: _softmax, F.rms_norm: _rms_norm,
    torch.sum: _reduce("sum"), torch.mean: _reduce("mean"), torch.amax: _reduce("max"),
    **MASK_FUNCTIONS, **MOVEMENT_FUNCTIONS, **BIT_FUNCTIONS,
}

METHODS = {
    "matmul": _matmul, "__matmul__": _matmul, "bmm": FUNCTIONS[torch.bmm],
    "mm": FUNCTIONS[torch.mm], "add": _add, "sub": _sub, "subtract": _sub, "mul": _mul,
    "multiply": _mul, "div": _div, "divide": _div, "true_divide": _div, "neg": _neg,
    "negative": _neg, "pow": _pow, "exp": FUNCTIONS[torch.exp], "sqrt": FUNCTIONS[torch.sqrt],
    "rsqrt": FUNCTIONS[torch.rsqrt], "relu": FUNCTIONS[torch.relu], "softmax": _softmax,
    "sum": FUNCTIONS[torch.sum], "mean": FUNCTIONS[torch.mean], "amax": FUNCTIONS[torch.amax],
    "tanh": FUNCTIONS[torch.tanh], "erf": FUNCTIONS[torch.erf], "to": _to,
    "cos": FUNCTIONS[torch.cos], "sin": FUNCTIONS[torch.sin],
    "sigmoid": FUNCTIONS[torch.sigmoid],
    "float": _cast_to("float32"), "half": _cast_to("float16"), "bfloat16": _cast_to("bfloat16"),
    "type_as": _type_as, "type": _type, **MASK_METHODS, **MOVEMENT_METHODS, **BIT_METHODS,
}


# -- gathers: embedding lookups, index_select and gather (take_along_axis) ------------------
def _embedding(idx: Any, weight: Any, padding_idx: Any = None, max_norm: Any = None,
               norm_type: float = 2.0, scale_grad_by_freq: bool = False,
               sparse: bool = False) -> Tensor:
    """``F.embedding(idx, weight)``: rows of ``weight`` (padding_idx only changes the
    gradient; max_norm renormalizes the table in place: refused)."""
    refuse(max_norm, "embedding(max_norm=...) (it renormalizes the table in place)")
    return embedding(tensor_arg(weight, "embedding"), tensor_arg(idx, "embedding"))


def _index_select(x: Any, dim: int, index: Any, *, out: Any = None) -> Tensor:
    refuse(out, "out=")
    return index_select(tensor_arg(x, "index_select"), dim, tensor_arg(index, "index_select"))


def _aten_embedding(weight: Any, idx: Any, padding_idx: int = -1,
                    scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    return _embedding(idx, weight)


def _gather(x: Any, dim: int, index: Any, *, sparse_grad: bool = False,
            out: Any = None) -> Tensor:
    """``torch.gather(x, dim, index)`` (and ``x.gather``, ``aten.gather``): NumPy's
    ``take_along_axis`` (an index of x's shape but along ``dim``; sparse_grad refused)."""
    refuse(sparse_grad, "gather(sparse_grad=True)")
    refuse(out, "out=")
    return take_along_axis(tensor_arg(x, "gather"), tensor_arg(index, "gather"), dim)


GATHER_FUNCTIONS = {F.embedding: _embedding, torch.embedding: _aten_embedding,
                    torch.index_select: _index_select, torch.gather: _gather}
FUNCTIONS.update(GATHER_FUNCTIONS)
METHODS["index_select"] = _index_select
METHODS["gather"] = _gather


# -- aten ops (graphs from AOTAutograd or export), keyed by overload packet ----------------
def _addmm(bias: Any, m1: Any, m2: Any, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    y = _matmul(m1, m2)
    return (bias if beta == 1 else bias * beta) + (y if alpha == 1 else y * alpha)


def _aten_softmax(x: Any, dim: int, half_to_float: bool = False) -> Tensor:
    refuse(half_to_float, "_softmax(half_to_float=True)")
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
    _A.sigmoid: FUNCTIONS[torch.sigmoid],
    _A.sum: FUNCTIONS[torch.sum], _A.mean: FUNCTIONS[torch.mean], _A.amax: FUNCTIONS[torch.amax],
    **MOVEMENT_ATEN,
    _A.embedding: _aten_embedding, _A.index_select: _index_select, _A.gather: _gather,
    _A.bitwise_and: BIT_FUNCTIONS[torch.bitwise_and],
    _A.__and__: BIT_FUNCTIONS[torch.bitwise_and],
    _A.bitwise_right_shift: BIT_FUNCTIONS[torch.bitwise_right_shift],
    _A.__rshift__: BIT_FUNCTIONS[torch.bitwise_right_shift],
    _A.logical_and: FUNCTIONS[torch.logical_and], _A.logical_or: FUNCTIONS[torch.logical_or],
    _A.bitwise_or: FUNCTIONS[torch.bitwise_or], _A.__or__: FUNCTIONS[torch.bitwise_or],
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


def _layer_norm_module(cv: Any, mod: nn.LayerNorm, path: str, x: Any) -> Tensor:
    weight = cv.param(f"{path}.weight") if mod.weight is not None else None
    bias = cv.param(f"{path}.bias") if mod.bias is not None else None
    return _layer_norm(x, mod.normalized_shape, weight, bias, mod.eps)


MODULES = {
    nn.Linear: _linear_module,
    nn.SiLU: lambda cv, mod, path, x: _activation(silu, "nn.SiLU")(x, mod.inplace),
    nn.ReLU: lambda cv, mod, path, x: _activation(relu, "nn.ReLU")(x, mod.inplace),
    nn.Softmax: lambda cv, mod, path, x: _softmax(x, mod.dim),
    nn.Identity: lambda cv, mod, path, x, *a, **k: tensor_arg(x, "nn.Identity"),
    nn.RMSNorm: _rms_norm_module,
    nn.LayerNorm: _layer_norm_module,
    nn.GELU: lambda cv, mod, path, x: _gelu(x, mod.approximate),
    nn.Tanh: lambda cv, mod, path, x: _unary(tanh, "nn.Tanh")(x),
    **MOVEMENT_MODULES,
    nn.Sigmoid: lambda cv, mod, path, x: _unary(sigmoid, "nn.Sigmoid")(x),
    nn.Embedding: lambda cv, mod, path, idx: _embedding(
        idx, cv.param(f"{path}.weight"), max_norm=mod.max_norm),
}
