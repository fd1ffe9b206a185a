"""Movement and Python-level glue of the torch support table (``torch_ops.py``).

Handlers for ops that move or cut tensors (cat, transpose, permute, reshape/view,
flatten, (un)squeeze, slicing ``x[a:b]``, narrow, split, chunk, expand) and for the
Python values around them (``x.shape``, ``x.size(-1)``, ``getattr``, ``getitem``),
plus the argument helpers every handler uses (``tensor_arg``, ``refuse``).
``MOVEMENT_FUNCTIONS``, ``MOVEMENT_METHODS``, ``MOVEMENT_ATEN`` and ``MOVEMENT_MODULES``
are this part of the support table; ``torch_ops`` merges them into the whole.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..ir.errors import UnsupportedOpError
from .functions import concat
from .graph import Tensor


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


def _empty_slice(x: Tensor, items: tuple) -> Empty | None:
    """The ``Empty`` that basic index ``items`` selects from ``x``, or None when it selects
    elements (torch's rules: slices with step 1, None and ...)."""
    real = sum(i is not None and i is not Ellipsis for i in items)
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items = items[:at] + (slice(None),) * (x.ndim - real) + items[at + 1:]
    items = items + (slice(None),) * (x.ndim - sum(i is not None for i in items))
    shape, axis = [], 0
    for item in items:
        if item is None:
            shape.append(1)
            continue
        start, stop, _ = item.indices(x.shape[axis])
        shape.append(max(0, stop - start))
        axis += 1
    return Empty(tuple(shape), x.dtype) if 0 in shape else None


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
        items = index if isinstance(index, tuple) else (index,)
        if any(isinstance(i, Tensor) or not (i is None or i is Ellipsis or isinstance(i, slice))
               for i in items):
            raise UnsupportedOpError(f"tensor indexing x[{index!r}] (supported: slices with "
                                     "step 1, None and ...)")
        if sum(i is Ellipsis for i in items) <= 1 and all(
                i.step in (None, 1) for i in items if isinstance(i, slice)):
            empty = _empty_slice(obj, items)
            if empty is not None:
                return empty
    if isinstance(obj, Empty):
        raise UnsupportedOpError("indexing a zero-size tensor")
    return obj[index]


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
    getattr: _getattr, operator.getitem: _getitem,
}

MOVEMENT_METHODS = {
    "transpose": _transpose,
    "swapaxes": _transpose, "permute": _permute, "t": _t, "reshape": _reshape,
    "view": _reshape, "flatten": _flatten, "unsqueeze": _unsqueeze, "squeeze": _squeeze,
    "contiguous": _identity, "size": _size, "dim": _dim,
    "narrow": _narrow, "split": _split, "chunk": _chunk, "expand": _expand,
}

_A = torch.ops.aten
MOVEMENT_ATEN = {
    _A.cat: _cat, _A.permute: _permute, _A.transpose: _transpose, _A.t: _t,
    _A.view: _reshape, _A._unsafe_view: _reshape, _A.reshape: _reshape,
    _A.unsqueeze: _unsqueeze, _A.squeeze: _squeeze,
    _A.clone: _identity, _A.alias: _identity, _A.detach: _identity,
}

MOVEMENT_MODULES = {nn.Dropout: _dropout_module}
