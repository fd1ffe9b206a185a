"""The gather ops (``GATHERS``) shared by the backends.

``gather(table, idx)`` along axis ``a`` (``Op.GATHER``: embedding, index_select) is
``np.take(table, idx, axis=a)``: the table's slices along ``a`` picked by an integer index
tensor, whose shape takes the axis's place. ``take_along_axis(table, idx)`` along ``a``
(``Op.TAKE_ALONG_AXIS``: torch.gather) is ``np.take_along_axis(table, idx, axis=a)``: an
index of the table's rank, its sizes but along ``a``, picks one element of the table along
``a`` for each of its elements (the result has its shape).
Every backend checks the indices first and raises ``IndexRangeError`` naming the node for
a negative or too large index (torch raises there; nothing is read out of bounds).

The verifier draws an index input as integers in ``[0, rows)``, ``rows`` the size of the
axis it indexes (``index_bounds``), with 0 and rows - 1 among them (``draw_indices``). An
integer input no gather reads is a value (``value_inputs``: positions cast to floats).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir.errors import InputError
from ..ir.node import GATHERS, INDEX_DTYPES, MOVEMENT, Node, Op


class IndexRangeError(InputError):
    """An index of a gather (embedding, index_select, take_along_axis) is negative or past
    the table's axis."""


def checked_indices(idx: Any, rows: int, node: Node) -> np.ndarray:
    """``idx`` (any real array holding integers) as int64, checked to lie in ``[0, rows)``:
    an ``IndexRangeError`` naming ``node`` otherwise."""
    given = np.asarray(idx)
    out = given.astype(np.int64)
    if given.dtype.kind == "f" and not np.array_equal(out, given):
        raise IndexRangeError(f"{node.describe()}: indices must be integers")
    if out.size and (int(out.min()) < 0 or int(out.max()) >= rows):
        bad = out[(out < 0) | (out >= rows)].reshape(-1)[0]
        raise IndexRangeError(f"{node.describe()}: index {int(bad)} is out of range for an "
                              f"axis of {rows} (indices lie in [0, {rows}))")
    return out


def take(table: Any, idx: Any, node: Node) -> np.ndarray:
    """The gather of ``node`` (one of ``GATHERS``, its axis in ``arg``) on NumPy values:
    ``np.take`` (``Op.GATHER``) or ``np.take_along_axis`` (``Op.TAKE_ALONG_AXIS``) at the
    checked indices."""
    axis = node.arg
    ix = checked_indices(idx, node.srcs[0].shape[axis], node)
    if node.op is Op.TAKE_ALONG_AXIS:
        return np.take_along_axis(np.asarray(table), ix, axis=axis)
    return np.take(np.asarray(table), ix, axis=axis)


def _index_inputs(node: Node) -> list[Node]:
    """The index inputs ``node`` (an index tensor) is moved from."""
    if node.op is Op.INPUT:
        return [node]
    if node.op in MOVEMENT:
        return [x for s in node.srcs for x in _index_inputs(s)]
    return []


def _gathers(program) -> list[tuple[int, list[str]]]:
    """(rows, the index inputs it reads) of each gather of ``program``: a kernel-level
    ``Graph``, or a ``MuGraph`` (whose gathers are library kernels: the index may be a
    tensor a movement kernel made from an input)."""
    if hasattr(program, "nodes"):
        return [(n.srcs[0].shape[n.arg], [i.arg for i in _index_inputs(n.srcs[1])])
                for n in program.nodes() if n.op in GATHERS]
    made = {k.output: k.node for k in program.kernels if getattr(k, "kind", "") == "predefined"}

    def sources(tensor: str) -> list[str]:
        node = made.get(tensor)
        if node is None:
            return [tensor] if tensor in program.inputs else []
        return [x for i in _index_inputs(node) for x in sources(i.arg)]

    return [(k.node.srcs[0].shape[k.node.arg], sources(k.node.srcs[1].arg))
            for k in program.kernels
            if getattr(k, "kind", "") == "predefined" and k.node.op in GATHERS]


def index_bounds(program) -> dict[str, int]:
    """``{index input: rows}``: each integer input of ``program`` (a ``Graph`` or a
    ``MuGraph``) and the size of the smallest axis a gather indexes with it (its valid
    values: ``[0, rows)``)."""
    out: dict[str, int] = {}
    for rows, names in _gathers(program):
        for name in names:
            out[name] = min(out.get(name, rows), rows)
    return out


POSITIONS = 2048  # an integer input no gather reads (positions): drawn in [0, POSITIONS)


def value_inputs(program) -> list[str]:
    """The integer inputs of ``program`` that no gather reads: values (positions cast to
    floats, moved or returned), drawn in the field from all of Z_p like any input, and in
    the float checks as integers in ``[0, POSITIONS)`` (exact in every float dtype but
    float16 past 2048, where the cast rounds as torch's does)."""
    rows = index_bounds(program)
    return [n for n, node in program.inputs.items()
            if node.dtype in INDEX_DTYPES and n not in rows]


def draw_indices(rng: np.random.Generator, shape: tuple[int, ...], rows: int) -> np.ndarray:
    """Uniform integers in ``[0, rows)`` of ``shape`` (int64), the first 0 and the last
    ``rows - 1`` (the extremes of the range, where an off-by-one reads past or short)."""
    out = rng.integers(0, rows, size=shape, dtype=np.int64)
    flat = out.reshape(-1)
    if flat.size:
        flat[0] = 0
        flat[-1] = rows - 1
    return out
