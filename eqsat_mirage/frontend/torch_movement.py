"""Movement and Python-level glue of the torch support table (``torch_ops.py``).

Handlers for ops that move or cut tensors (cat, stack, transpose, permute, reshape/view,
flatten, (un)squeeze, indexing ``x[...]``, select, narrow, split, chunk, expand,
repeat_interleave, flip), each composed of slices with step 1, concats and reshapes (no op
of its own in the IR: ``index_tensor``, ``take``), and for the
Python values around them (``x.shape``, ``x.size(-1)``, ``getattr``, ``getitem``),
plus the argument helpers every handler uses (``tensor_arg``, ``refuse``).
``MOVEMENT_FUNCTIONS``, ``MOVEMENT_METHODS``, ``MOVEMENT_ATEN`` and ``MOVEMENT_MODULES``
are this part of the support table; ``torch_ops`` merges them into the whole.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ..ir.errors import ShapeError, UnsupportedOpError
from ..ir.node import INDEX_DTYPES, Op
from .functions import concat, ne
from .functions import where as where_
from .graph import Tensor, apply


def tensor_arg(x: Any, what: str) -> Tensor:
    """``x``, which must be a converted tensor (else ``UnsupportedOpError`` naming ``what``)."""
    if not isinstance(x, Tensor):
        raise UnsupportedOpError(f"{what} of a {type(x).__name__} (expected a tensor)")
    return x


def refuse(flag: Any, what: str) -> None:
    """Raise ``UnsupportedOpError`` ("``what`` is not supported") unless ``flag`` is None or
    False: for arguments (``out=``, ``inplace=True``, ...) with no eqsat-mirage form."""
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


@dataclass(frozen=True)
class Empty:
    """A zero-size tensor (legal in torch; no element to compute): the pass-through half of a
    full rotary embedding, ``q[..., 64:]`` of a 64-wide axis. It flows into a ``torch.cat``,
    which drops it; anything else that reads it is refused (``UnsupportedOpError``)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def ndim(self) -> int:
        return len(self.shape)


# -- movement -------------------------------------------------------------------------------
def _cat(tensors: Any, dim: int = 0, *, out: Any = None) -> Tensor | Empty:
    refuse(out, "out=")
    tensors = list(tensors)
    kept = [t for t in tensors if not isinstance(t, Empty)]  # zero-size parts add nothing
    if not kept:
        return Empty(tuple(sum(t.shape[a] for t in tensors) if a == dim % tensors[0].ndim
                           else d for a, d in enumerate(tensors[0].shape)), tensors[0].dtype)
    if len(kept) == 1:
        return tensor_arg(kept[0], "cat")
    return concat([tensor_arg(t, "cat") for t in kept], axis=dim)


def _transpose(x: Any, dim0: int, dim1: int) -> Tensor:
    x = tensor_arg(x, "transpose")
    return x.transpose(_perm_swap(x.ndim, dim0, dim1))


def _permute(x: Any, *dims: Any, **kw: Any) -> Tensor:
    x = tensor_arg(x, "permute")
    return x.transpose(_dims(x, dims or (kw.pop("dims"),)))


def _t(x: Any) -> Tensor:
    x = tensor_arg(x, "t")
    return x.transpose(1, 0) if x.ndim == 2 else x


def _reshape(x: Any, *shape: Any, **kw: Any) -> Tensor:
    x = tensor_arg(x, "reshape")
    shape = shape or (kw.pop("shape"),)
    if len(shape) == 1 and not isinstance(shape[0], int):
        if not isinstance(shape[0], (tuple, list, torch.Size)):
            raise UnsupportedOpError(f"view/reshape to {shape[0]!r} (a dtype view or a "
                                     "non-shape argument)")
    return x.reshape(_dims(x, shape))


def _flatten(x: Any, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    x = tensor_arg(x, "flatten")
    if x.ndim == 0:
        return x.reshape((1,))
    s, e = start_dim % x.ndim, end_dim % x.ndim
    mid = 1
    for d in x.shape[s:e + 1]:
        mid *= d
    return x.reshape(x.shape[:s] + (mid,) + x.shape[e + 1:])


def _unsqueeze(x: Any, dim: int) -> Tensor:
    x = tensor_arg(x, "unsqueeze")
    d = dim % (x.ndim + 1)
    return x.reshape(x.shape[:d] + (1,) + x.shape[d:])


def _squeeze(x: Any, dim: Any = None) -> Tensor:
    x = tensor_arg(x, "squeeze")
    dims = range(x.ndim) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    drop = {d % x.ndim for d in dims if x.shape[d % x.ndim] == 1}
    return x.reshape(tuple(s for i, s in enumerate(x.shape) if i not in drop))


def _dropout(x: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    if training and p > 0:
        raise UnsupportedOpError(f"dropout(p={p}) in training mode (call .eval())")
    return tensor_arg(x, "dropout")


def _identity(x: Any, *args: Any, **kwargs: Any) -> Tensor:
    return tensor_arg(x, "contiguous")


def _narrow(x: Any, dim: int, start: int, length: int) -> Tensor:
    x = tensor_arg(x, "narrow")
    d = dim % x.ndim
    start = start % x.shape[d] if start < 0 else start
    return x[(slice(None),) * d + (slice(start, start + length),)]


def _pieces(x: Tensor, sizes: list[int], dim: int) -> tuple[Tensor, ...]:
    d, out, at = dim % x.ndim, [], 0
    for n in sizes:
        out.append(x[(slice(None),) * d + (slice(at, at + n),)])
        at += n
    return tuple(out)


def _split(x: Any, split_size_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
    x = tensor_arg(x, "split")
    n = x.shape[dim % x.ndim]
    if isinstance(split_size_or_sections, int):
        k = split_size_or_sections
        sizes = [min(k, n - i) for i in range(0, n, k)]
    else:
        sizes = [int(v) for v in split_size_or_sections]
    return _pieces(x, sizes, dim)


def _chunk(x: Any, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    x = tensor_arg(x, "chunk")
    n = x.shape[dim % x.ndim]
    k = -(-n // chunks)
    return _pieces(x, [min(k, n - i) for i in range(0, n, k)], dim)


MAX_EXPAND = 64  # expand(...) of a size-1 dim becomes a concat of this many copies at most


def _expand(x: Any, *sizes: Any) -> Tensor:
    x = tensor_arg(x, "expand")
    sizes = _dims(x, sizes)
    if len(sizes) < x.ndim:
        raise UnsupportedOpError(f"expand of a {x.ndim}-d tensor to {len(sizes)} dims")
    lead = len(sizes) - x.ndim
    y = x.reshape((1,) * lead + x.shape) if lead else x
    for d, n in enumerate(sizes):
        cur = y.shape[d]
        if n in (-1, cur):
            continue
        if cur != 1 or n > MAX_EXPAND:
            raise UnsupportedOpError(f"expand of dim {d} from {cur} to {n} (a size-1 dim is "
                                     f"expanded to at most {MAX_EXPAND} copies)")
        y = concat([y] * n, axis=d)
    return y


def repeated_heads(t: Tensor) -> tuple[Tensor, int] | None:
    """``(x, r)`` when ``t`` is ``x`` with its size-1 axis ``a`` repeated ``r`` times and
    merged into the axis before it (transformers' ``repeat_kv``: ``x[:, :, None]`` expanded
    to ``r`` copies, reshaped to ``kv * r`` heads; ``x`` is (..., kv, 1, L, d)), else None.
    Attention reads ``x`` once per key head instead of ``r`` written copies."""
    node = t.node
    if node.op is not Op.RESHAPE or node.srcs[0].op is not Op.CONCAT:
        return None
    cat = node.srcs[0]
    x, a = cat.srcs[0], cat.arg
    if len(cat.srcs) < 2 or any(s is not x for s in cat.srcs) or a != len(x.shape) - 3 or \
            a == 0 or x.shape[a] != 1:  # the size-1 axis right after the heads of (.., L, d)
        return None
    r = len(cat.srcs)
    if node.shape != x.shape[:a - 1] + (x.shape[a - 1] * r,) + x.shape[a + 1:]:
        return None
    return Tensor(x, t.graph), r


MAX_PIECES = 64  # a gathered or flipped axis becomes a concat of this many slices at most


def _cut(x: Tensor, axis: int, start: int, stop: int) -> Tensor:
    """``x[start:stop]`` along ``axis`` (a slice with step 1; non-empty)."""
    return x[(slice(None),) * axis + (slice(start, stop),)]


def _drop(x: Tensor, axis: int) -> Tensor:
    """``x`` without its size-1 axis ``axis``."""
    return x.reshape(x.shape[:axis] + x.shape[axis + 1:])


def _strided(x: Tensor, axis: int, start: int, step: int, m: int) -> Tensor:
    """The ``m`` elements ``start, start + step, ...`` of ``axis`` (all in range, m >= 1):
    a window of ``m * step`` elements reshaped to ``(m, step)`` and one column of it kept,
    so that slices with step 1 and reshapes express it exactly (``x[..., ::2]`` of an axis
    of ``2n``: reshape to ``(n, 2)``, keep column 0); where no such window fits in the axis
    (``x[::2]`` of 5), the last element is a slice of its own, concatenated."""
    n = x.shape[axis]
    if m == 1 or step == 1:
        return _cut(x, axis, start, start + (m - 1) * step + 1)
    if m * step > n:  # (m - 1) * step < n - start: the first m - 1 have a window
        head = _strided(x, axis, start, step, m - 1)
        last = start + (m - 1) * step
        return concat([head, _cut(x, axis, last, last + 1)], axis=axis)
    col = max(0, start + m * step - n)  # the window [start - col, ... + m * step) fits
    win = _cut(x, axis, start - col, start - col + m * step)
    win = win.reshape(x.shape[:axis] + (m, step) + x.shape[axis + 1:])
    return _drop(_cut(win, axis + 1, col, col + 1), axis + 1)


def take(x: Tensor, axis: int, index: list[int], what: str) -> Tensor:
    """The elements ``index`` (ints, negative from the end, in range) of ``axis`` of ``x``, in
    that order: runs of consecutive indices become slices, concatenated; an arithmetic
    progression is a strided slice (``_strided``). ``what`` names the op in errors."""
    n = x.shape[axis]
    bad = [i for i in index if not -n <= i < n]
    if bad:
        raise ShapeError(f"{what}: index {bad[0]} is out of range for axis {axis} of size {n} "
                         f"(tensor of shape {x.shape})")
    index = [i % n for i in index]
    steps = {b - a for a, b in zip(index, index[1:])}
    if len(steps) == 1 and min(steps) > 1:
        return _strided(x, axis, index[0], steps.pop(), len(index))
    runs: list[list[int]] = []
    for i in index:
        if runs and i == runs[-1][1]:
            runs[-1][1] += 1
        else:
            runs.append([i, i + 1])
    if len(runs) > MAX_PIECES:
        raise UnsupportedOpError(f"{what}: {len(index)} indices of an axis of {n} in "
                                 f"{len(runs)} runs (at most {MAX_PIECES} runs of consecutive "
                                 "indices are supported)")
    parts = [_cut(x, axis, a, b) for a, b in runs]
    return parts[0] if len(parts) == 1 else concat(parts, axis=axis)


def _index_items(x: Tensor, index: Any) -> list:
    """The items of index ``index`` of ``x`` with ``...`` expanded; refuses what has no form."""
    items = list(index) if isinstance(index, tuple) else [index]
    for i in items:
        if isinstance(i, Empty) or isinstance(i, Tensor) and i.dtype not in INDEX_DTYPES:
            raise UnsupportedOpError(f"indexing with a {i.dtype} tensor of the program "
                                     f"(x[{index!r}]): only integer index tensors (int64, "
                                     "int32) and constant indices are supported")
        if isinstance(i, Tensor):
            continue
        try:
            held = torch.as_tensor(i) if isinstance(i, (list, torch.Tensor)) else None
        except (TypeError, ValueError, RuntimeError) as exc:  # a list holding a tensor
            raise UnsupportedOpError(f"indexing x[{index!r}] with a list that is not of "
                                     f"numbers ({exc})") from None
        if isinstance(i, bool) or (held is not None and (
                held.dtype == torch.bool or held.is_floating_point() or held.is_complex())):
            raise UnsupportedOpError(f"indexing with a bool or float index (x[{index!r}])")
        if not (i is None or i is Ellipsis or isinstance(i, (int, slice, list, torch.Tensor))):
            raise UnsupportedOpError(f"tensor indexing x[{index!r}] with a "
                                     f"{type(i).__name__} (supported: ints, slices, None, "
                                     "..., and one list or integer tensor of indices)")
    if sum(isinstance(i, (list, torch.Tensor, Tensor)) for i in items) > 1:
        raise UnsupportedOpError(f"tensor indexing x[{index!r}] with more than one list or "
                                 "tensor of indices (their broadcasting is not supported)")
    if any(isinstance(i, Tensor) for i in items) and not all(
            isinstance(i, (Tensor, slice)) or i is Ellipsis for i in items):
        raise UnsupportedOpError(f"indexing x[{index!r}] with a tensor of the program beside "
                                 "ints or None (supported: the tensor with slices and '...')")
    if sum(i is Ellipsis for i in items) > 1:
        raise ShapeError(f"indexing x[{index!r}]: more than one '...'")
    if any(isinstance(i, slice) and i.step is not None and i.step <= 0 for i in items):
        raise UnsupportedOpError(f"indexing x[{index!r}]: a step below 1 (torch needs a "
                                 "positive step)")
    real = sum(i is not None and i is not Ellipsis for i in items)
    if real > x.ndim:
        raise ShapeError(f"indexing x[{index!r}]: {real} indices for a tensor of shape "
                         f"{x.shape}")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at:at + 1] = [slice(None)] * (x.ndim - real)
    return items + [slice(None)] * (x.ndim - sum(i is not None for i in items))


def _outer_gather(x: Tensor, index: tuple) -> Tensor:
    """``x[..., i, j, ...]`` with ``i`` and ``j`` integer tensors of the program on adjacent
    axes ``a`` and ``a + 1``, the other items full slices or ``...``, where each dim of
    their broadcast shape is one index's and ``i``'s come first (masking_utils'
    ``padding_mask[batch_idx, kv_idx]``: ``(B, 1, 1, 1)`` and ``(1, 1, 1, K)``): a gather
    by ``i`` along ``a``, then by ``j`` along ``a + 1``, reshaped to the broadcast shape. A
    bool ``x`` is gathered as 0/1 floats and compared with 0."""
    where = f"indexing x[{index!r}]"
    if any(not (isinstance(i, Tensor) or i is Ellipsis or i == slice(None)) for i in index) \
            or sum(i is Ellipsis for i in index) > 1:
        raise UnsupportedOpError(f"{where} with two tensors of indices beside other than "
                                 "full slices and '...'")
    items = list(index)
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at:at + 1] = [slice(None)] * (x.ndim - len(items) + 1)
    at = [k for k, i in enumerate(items) if isinstance(i, Tensor)]
    i, j = items[at[0]], items[at[1]]
    if at[1] != at[0] + 1 or any(t.dtype not in INDEX_DTYPES for t in (i, j)):
        raise UnsupportedOpError(f"{where}: two integer index tensors on adjacent axes are "
                                 "supported")
    rank = max(i.ndim, j.ndim)
    si, sj = (1,) * (rank - i.ndim) + i.shape, (1,) * (rank - j.ndim) + j.shape
    own_i = [d for d in range(rank) if si[d] != 1]
    own_j = [d for d in range(rank) if sj[d] != 1]
    if set(own_i) & set(own_j) or (own_i and own_j and max(own_i) > min(own_j)):
        raise UnsupportedOpError(f"{where}: index tensors of shapes {i.shape} and {j.shape} "
                                 "(supported: an outer product, the first's sizes first)")
    a = at[0]
    shape = x.shape[:a] + tuple(max(p, q) for p, q in zip(si, sj)) + x.shape[a + 2:]
    return _gathered(x, lambda t: apply(Op.GATHER, apply(
        Op.GATHER, t, i.reshape((int(np.prod(i.shape)),)), arg=a),
        j.reshape((int(np.prod(j.shape)),)), arg=a + 1).reshape(shape))


def _gathered(x: Tensor, gather: Any) -> Tensor:
    """``gather(x)``; a bool ``x`` gathered as 0/1 floats and compared with 0 (a gather
    reads a float table)."""
    if x.dtype != "bool":
        return gather(x)
    return ne(gather(where_(x, 1.0, 0.0)), 0.0)


def index_tensor(x: Tensor, index: Any) -> Tensor | Empty:
    """``x[index]`` as torch computes it, of slices with step 1 and reshapes: ints, slices
    with any positive step, ``None``, ``...`` and one list or constant integer tensor of
    indices of one axis (``x[..., [-2], :]``; its shape replaces the axis). An index that
    selects no element gives ``Empty``. One integer tensor of the program with slices and
    ``...`` (``w[expert_ids]``) is a gather (``Op.GATHER``) along its axis; a negative
    index there raises when the program runs (torch counts it from the end); two of them
    on adjacent axes whose sizes broadcast as an outer product (``_outer_gather``) are two
    gathers."""
    if isinstance(index, tuple) and sum(isinstance(i, Tensor) for i in index) == 2:
        return _outer_gather(x, index)
    items = _index_items(x, index)
    probe = tuple(torch.empty(i.shape, dtype=torch.int64, device="meta")
                  if isinstance(i, Tensor) else i for i in items)
    try:
        want = tuple(torch.empty(x.shape, device="meta")[probe].shape)
    except (IndexError, ValueError, RuntimeError) as exc:
        raise ShapeError(f"indexing x[{index!r}] of a tensor of shape {x.shape}: {exc}") from None
    if 0 in want:
        return Empty(want, x.dtype)
    out, axis = x, 0
    for item in items:
        if item is None:
            out = out.reshape(out.shape[:axis] + (1,) + out.shape[axis:])
            axis += 1
        elif isinstance(item, slice):
            start, stop, step = item.indices(out.shape[axis])
            m = len(range(start, stop, step))
            if m != out.shape[axis]:
                out = _strided(out, axis, start, step, m)
            axis += 1
        elif isinstance(item, int):
            out = _drop(take(out, axis, [item], f"indexing x[{index!r}]"), axis)
        elif isinstance(item, Tensor):  # a gather: the index's shape takes the axis's place
            out = _gathered(out, lambda t, item=item, axis=axis: apply(Op.GATHER, t, item,
                                                                       arg=axis))
            axis += item.ndim
        else:
            idx = torch.as_tensor(item)
            flat = take(out, axis, [int(i) for i in idx.flatten()], f"indexing x[{index!r}]")
            out = flat.reshape(out.shape[:axis] + tuple(idx.shape) + out.shape[axis + 1:])
            axis += idx.ndim
    if out.shape != want:  # the composition must give torch's shape
        raise ShapeError(f"indexing x[{index!r}] of shape {x.shape}: got {out.shape}, torch "
                         f"gives {want}")
    return out


def _select(x: Any, dim: int, index: int) -> Tensor:
    x = tensor_arg(x, "select")
    return _drop(take(x, dim % x.ndim, [int(index)], "select"), dim % x.ndim)


def _stack(tensors: Any, dim: int = 0, *, out: Any = None) -> Tensor | Empty:
    refuse(out, "out=")
    tensors = list(tensors)
    if not tensors:
        raise UnsupportedOpError("stack of no tensors")
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) != 1:
        raise ShapeError(f"stack of tensors of different shapes {sorted(shapes)}")
    shape = tensors[0].shape
    d = dim % (len(shape) + 1)
    new = tuple(shape[:d]) + (1,) + tuple(shape[d:])
    if 0 in shape:
        return Empty(new[:d] + (len(tensors),) + new[d + 1:], tensors[0].dtype)
    parts = [tensor_arg(t, "stack").reshape(new) for t in tensors]
    return parts[0] if len(parts) == 1 else concat(parts, axis=d)


def _repeat_interleave(x: Any, repeats: Any, dim: Any = None, *,
                       output_size: Any = None) -> Tensor:
    x = tensor_arg(x, "repeat_interleave")
    if isinstance(repeats, torch.Tensor) and repeats.numel() == 1:
        repeats = int(repeats)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise UnsupportedOpError(f"repeat_interleave with repeats={repeats!r} (one positive "
                                 "int count is supported)")
    if repeats > MAX_EXPAND:
        raise UnsupportedOpError(f"repeat_interleave with repeats={repeats} (at most "
                                 f"{MAX_EXPAND})")
    if dim is None:
        x, dim = _flatten(x), 0
    d = dim % x.ndim
    y = x.reshape(x.shape[:d + 1] + (1,) + x.shape[d + 1:])
    if repeats > 1:
        y = concat([y] * repeats, axis=d + 1)
    return y.reshape(x.shape[:d] + (x.shape[d] * repeats,) + x.shape[d + 1:])


def _flip(x: Any, *dims: Any, **kw: Any) -> Tensor:
    x = tensor_arg(x, "flip")
    for d in {d % x.ndim for d in _dims(x, dims or (kw.pop("dims"),))}:
        n = x.shape[d]
        if n > 1:
            x = take(x, d, list(range(n - 1, -1, -1)), "flip")
    return x


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
        return index_tensor(obj, index)
    if isinstance(obj, Empty):
        raise UnsupportedOpError("indexing a zero-size tensor")
    return obj[index]


def index_with_tensor(x: Any, index: Any) -> Any:
    """``x[index]`` where ``index`` holds an index tensor: the target the torch.compile
    backend gives such an indexing before torch.fx partitions the graph
    (``dynamo.support.retarget_tensor_indexing``), converted as ``x[index]`` is."""
    return x[index]


def _size(x: Any, dim: Any = None) -> Any:
    shape = torch.Size(tensor_arg(x, "size").shape)
    return shape if dim is None else shape[dim]


def _dim(x: Any) -> int:
    return tensor_arg(x, "dim").ndim


def _dropout_module(cv: Any, mod: nn.Dropout, path: str, x: Any) -> Tensor:
    return _dropout(x, mod.p, mod.training, mod.inplace)


# -- this part of the support table (torch_ops.py holds the whole) --------------------------
MOVEMENT_FUNCTIONS = {
    torch.narrow: _narrow, torch.split: _split, torch.chunk: _chunk,
    torch.nn.functional.dropout: _dropout,
    torch.cat: _cat, torch.concat: _cat, torch.concatenate: _cat,
    torch.transpose: _transpose, torch.swapaxes: _transpose, torch.permute: _permute,
    torch.t: _t, torch.reshape: _reshape, torch.flatten: _flatten,
    torch.unsqueeze: _unsqueeze, torch.squeeze: _squeeze,
    torch.stack: _stack, torch.repeat_interleave: _repeat_interleave, torch.flip: _flip,
    torch.select: _select,
    getattr: _getattr, operator.getitem: _getitem, index_with_tensor: _getitem,
}

MOVEMENT_METHODS = {
    "transpose": _transpose,
    "swapaxes": _transpose, "permute": _permute, "t": _t, "reshape": _reshape,
    "view": _reshape, "flatten": _flatten, "unsqueeze": _unsqueeze, "squeeze": _squeeze,
    "contiguous": _identity, "size": _size, "dim": _dim,
    "narrow": _narrow, "split": _split, "chunk": _chunk, "expand": _expand,
    "repeat_interleave": _repeat_interleave, "flip": _flip, "select": _select,
}

_A = torch.ops.aten
MOVEMENT_ATEN = {
    _A.cat: _cat, _A.permute: _permute, _A.transpose: _transpose, _A.t: _t,
    _A.view: _reshape, _A._unsafe_view: _reshape, _A.reshape: _reshape,
    _A.unsqueeze: _unsqueeze, _A.squeeze: _squeeze,
    _A.clone: _identity, _A.alias: _identity, _A.detach: _identity,
}

MOVEMENT_MODULES = {nn.Dropout: _dropout_module}
