"""The gather functions of the builder API: ``em.embedding``, ``em.index_select`` and
``em.take_along_axis``.

The first two build ``Op.GATHER`` (``np.take`` along an axis): an integer index tensor (a
graph input of dtype int64 or int32, or a view of one) picks slices of a float table.
``take_along_axis`` builds ``Op.TAKE_ALONG_AXIS`` (``np.take_along_axis``,
``torch.gather``): an index of the table's rank picks one element along the axis for each
of its elements. An index out of range raises when the program runs, in every backend
(``semantics/gather.py``).
"""

from __future__ import annotations

from numbers import Integral
from typing import Any

from ..ir.errors import DTypeError, GraphError, ShapeError
from ..ir.node import INDEX_DTYPES, Op, user_location
from .graph import Tensor, apply


def _tensors(what: str, table: Any, idx: Any) -> None:
    """``table`` a float Tensor and ``idx`` an integer Tensor, or a ``GraphError``."""
    where = f"{what} (at {user_location()})"
    if not isinstance(table, Tensor) or not isinstance(idx, Tensor):
        raise GraphError(f"{where}: expected Tensors, got {type(table).__name__} and "
                         f"{type(idx).__name__}")
    if idx.dtype not in INDEX_DTYPES:
        raise DTypeError(f"{where}: the indices must be an int64 or int32 Tensor (an input "
                         f"declared so), got {idx.dtype}")


def embedding(table: Tensor, idx: Tensor) -> Tensor:
    """Rows of the 2-D ``table`` (num_embeddings, dim) at the integer indices ``idx`` (any
    shape): shape ``idx.shape + (dim,)``, as ``torch.nn.functional.embedding``."""
    _tensors("embedding", table, idx)
    if table.ndim != 2:
        raise ShapeError(f"embedding (at {user_location()}): the table must be 2-d "
                         f"(num_embeddings, dim), got shape {table.shape}")
    return apply(Op.GATHER, table, idx, arg=0)


def index_select(x: Tensor, axis: int, idx: Tensor) -> Tensor:
    """The slices of ``x`` along ``axis`` at the 1-D integer indices ``idx``, as
    ``torch.index_select(x, axis, idx)`` (a 0-d index: one slice, the axis kept)."""
    _tensors("index_select", x, idx)
    if not isinstance(axis, Integral) or isinstance(axis, bool) or not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"index_select (at {user_location()}): axis {axis!r} out of range "
                         f"for a {x.ndim}-d tensor")
    if idx.ndim > 1:
        raise ShapeError(f"index_select (at {user_location()}): the indices must be 0-d or "
                         f"1-d, got shape {idx.shape}")
    return apply(Op.GATHER, x, idx if idx.ndim == 1 else idx.reshape(1), arg=int(axis) % x.ndim)


def take_along_axis(x: Tensor, idx: Tensor, axis: int = -1) -> Tensor:
    """The elements of ``x`` along ``axis`` at the integer indices ``idx``, as
    ``np.take_along_axis(x, idx, axis)`` and ``torch.gather(x, axis, idx)``: ``idx`` has
    ``x``'s rank and sizes but along ``axis`` (any size there; NumPy's broadcasting and
    torch's smaller sizes elsewhere raise ``ShapeError``), and ``out[i][j][k] =
    x[i][idx[i][j][k]][k]`` for axis 1; shape ``idx.shape``."""
    _tensors("take_along_axis", x, idx)
    where = f"take_along_axis (at {user_location()})"
    if not isinstance(axis, Integral) or isinstance(axis, bool) or not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"{where}: axis {axis!r} out of range for a {x.ndim}-d tensor of "
                         f"shape {x.shape}")
    axis = int(axis) % x.ndim
    if idx.ndim != x.ndim or any(a != axis and i != d
                                 for a, (i, d) in enumerate(zip(idx.shape, x.shape))):
        raise ShapeError(f"{where}: the indices must have the shape of the tensor but along "
                         f"axis {axis}, got {idx.shape} for a tensor of shape {x.shape} (sizes "
                         "that differ elsewhere are not supported)")
    return apply(Op.TAKE_ALONG_AXIS, x, idx, arg=axis)
