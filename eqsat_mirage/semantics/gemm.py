"""One matrix product where NumPy would run many: a batched matmul one of whose operands is
broadcast over the batch axes, as the tiled interpreter builds them (a tile replicated over
the grid, multiplied by each block's tile of a weight).

``np.matmul`` runs such a product as one small GEMM per batch element (172 products of
128 x 64 @ 64 x 64 for one loop step of a 7B MLP kernel), at a small fraction of the rate
of one GEMM of the same work. ``one_gemm`` rewrites it as a single 2-D product over the
joined batch: each output element is the same dot product of the same row and column
(only the batching differs). The exact field products (``modular.matmul_mod``) are equal
element by element; float64 and float32 results agree to rounding, not bit for bit (the
BLAS may sum a dot product in another order for another layout: with OpenBLAS 0.3.31 the
last bit differs in about a quarter of the tiled products), which is why only the float64
and explicit-dtype evaluations, compared with tolerances, use it, and the native dtype
keeps ``np.matmul``'s batching (bit-equal to eager torch).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

MIN_BATCH = 2  # below this a batched product is one GEMM already


def batch_broadcast(x: np.ndarray) -> bool:
    """True when every batch axis of ``x`` (all but the last two) has length 1 or stride 0:
    the same matrix for every batch element."""
    return all(n == 1 or st == 0 for n, st in zip(x.shape[:-2], x.strides[:-2]))


def one_gemm(a: np.ndarray, b: np.ndarray, dtype=None
             ) -> tuple[np.ndarray, np.ndarray, Callable[[np.ndarray], np.ndarray]] | None:
    """``(a2, b2, finish)`` with ``np.matmul(a, b) == finish(a2 @ b2)`` (two 2-D operands),
    or None when ``np.matmul`` runs one product already (no batch, a 1-D operand, or no
    operand broadcast over the batch). ``a2``/``b2`` are views where the layout allows,
    else one copy of the batched operand (its broadcast size); ``finish`` returns a
    C-contiguous array of the broadcast result shape. ``dtype``: the batched ``b`` laid out
    side by side is copied straight into it (the field products' float64 operand)."""
    if a.ndim < 2 or b.ndim < 2 or max(a.ndim, b.ndim) < 3:
        return None
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    count = math.prod(batch)
    if count < MIN_BATCH:
        return None
    (m, k), n = a.shape[-2:], b.shape[-1]
    first = (0,) * (a.ndim - 2), (0,) * (b.ndim - 2)
    if batch_broadcast(a) and batch_broadcast(b):  # one product, broadcast back
        return a[first[0]], b[first[1]], lambda r: np.ascontiguousarray(
            np.broadcast_to(r, batch + (m, n)))
    if batch_broadcast(b):  # rows of every batch element stacked: (count * m, k) @ (k, n)
        a2 = np.broadcast_to(a, batch + (m, k)).reshape(count * m, k)
        return a2, b[first[1]], lambda r: r.reshape(batch + (m, n))
    if batch_broadcast(a):  # columns of every batch element side by side: (m, k) @ (k, count * n)
        moved = np.moveaxis(np.broadcast_to(b, batch + (k, n)), -2, 0)
        b2 = _view(moved, (k, count * n)) if dtype in (None, b.dtype) else None
        if b2 is None:  # its columns, block after block, copied (and converted) once
            b2 = np.empty((k,) + batch + (n,), dtype or b.dtype)
            np.copyto(b2, moved)
            b2 = b2.reshape(k, count * n)
        return a[first[0]], b2, lambda r: np.ascontiguousarray(
            np.moveaxis(r.reshape((m,) + batch + (n,)), 0, -2))
    return None


def _view(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``x`` reshaped to the 2-D ``shape`` without a copy, with unit stride along its rows
    or its columns (BLAS reads it in place), or None. The tiles of a weight whose columns
    the grid cuts and whose rows the loop cuts are, side by side, a slice of that weight's
    rows (of its columns, for a transposed weight)."""
    try:
        y = np.reshape(x, shape, copy=False)
    except (TypeError, ValueError):  # a copy would be needed (or NumPy < 2.1)
        return None
    (r, c), size = y.strides, y.itemsize
    rows = c == size and r >= shape[1] * size  # row-major, or column-major (a transposed
    return y if rows or (r == size and c >= shape[0] * size) else None  # weight, x @ W.T)


def copied(a: np.ndarray, b: np.ndarray) -> int:
    """Bytes of operand copies that ``matmul(a, b)`` makes beyond NumPy's own (``one_gemm``
    laying a batched operand out as one matrix, where no view of it will do): 0 where it
    reads both in place (the tiled interpreter's joined loop operands: a weight's tiles side
    by side, a slice of that weight)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim < 2 or b.ndim < 2 or max(a.ndim, b.ndim) < 3:
        return 0
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if math.prod(batch) < MIN_BATCH or (batch_broadcast(a) and batch_broadcast(b)):
        return 0
    (m, k), n = a.shape[-2:], b.shape[-1]
    if batch_broadcast(b):  # the rows of every batch element stacked: a view when they are
        try:
            np.reshape(np.broadcast_to(a, batch + (m, k)), (-1, k), copy=False)
            return 0
        except (TypeError, ValueError):
            return math.prod(batch) * m * k * a.itemsize
    if batch_broadcast(a):
        moved = np.moveaxis(np.broadcast_to(b, batch + (k, n)), -2, 0)
        return 0 if _view(moved, (k, math.prod(batch) * n)) is not None else \
            math.prod(batch) * k * n * b.itemsize
    return 0  # np.matmul's own batching


def owner(x: np.ndarray) -> np.ndarray:
    """The array at the end of ``x``'s chain of views (``x`` itself when it is not a view),
    through NumPy's ``as_strided`` wrappers too."""
    for y in ancestors(x):
        x = y
    return x


def ancestors(x: np.ndarray):
    """``x`` and the arrays it is a view of, nearest first (through ``as_strided``'s
    wrapper objects, whose own ``base`` is the array)."""
    while isinstance(x, np.ndarray):
        yield x
        base = x.base
        x = base if isinstance(base, np.ndarray) else getattr(base, "base", None)


def matmul(a, b) -> np.ndarray:
    """``np.matmul(a, b)``, as one GEMM where ``one_gemm`` allows."""
    a, b = np.asarray(a), np.asarray(b)
    form = one_gemm(a, b)
    if form is None:
        return np.matmul(a, b)
    a2, b2, finish = form
    return finish(a2 @ b2)
