"""The float checks' rounded draws in their dtypes' own 2 bytes: ``pack`` and ``unpack``
(exact both ways), how a search's memo keeps them (``draws.Draws``), and a draw made input
by input as it is read and kept (``kept``)."""

from __future__ import annotations

import weakref

import numpy as np

from ..semantics.floating import LazyInputs, round_to
from ..semantics.half import from_half


def pack(x: np.ndarray, dtype: str) -> np.ndarray:
    """A rounded input (float32 values of ``dtype``) in ``dtype``'s own 2 bytes where it has
    them (float16 as float16, bfloat16 as its upper 16 bits), exactly; a broadcast of one
    value, or an array already packed, as it is."""
    if x.dtype != np.float32 or (x.ndim and not any(x.strides)):
        return x
    if dtype == "float16":
        return x.astype(np.float16)
    if dtype == "bfloat16":
        return (np.ascontiguousarray(x).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    return x


def unpack(x: np.ndarray) -> np.ndarray:
    """The float32 array ``pack`` packed (float32 arrays and broadcasts as they are)."""
    if x.dtype == np.float16:
        return from_half(x)
    if x.dtype == np.uint16:
        return (x.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return x


def read_only(x: np.ndarray) -> np.ndarray:
    """A read-only view of ``x``: a draw shared by several evaluations is never written. A
    NumPy scalar (what NumPy makes of some ops on a 0-d array: a 0-d bool mask's draw, a
    0-d input times a scalar) becomes a read-only 0-d array."""
    view = np.asarray(x).view()
    view.flags.writeable = False
    return view


def unpacked(packed, name: str) -> np.ndarray:
    """Input ``name`` of a packed draw (``draws.Draws._packed``), as float32."""
    return unpack(packed[name])


def kept(names, make) -> LazyInputs:
    """``make(name)`` read-only, made on the first read of each name and kept (a draw that
    up to four evaluations read in a row: ``draws.Draws.rounded``)."""
    held: dict = {}

    def get(name: str) -> np.ndarray:
        if name not in held:
            held[name] = read_only(make(name))
        return held[name]

    return LazyInputs(names, get)


def scaled_up(packed, dtypes: dict, factor: float, name: str) -> np.ndarray:
    """Input ``name`` of a packed draw times a power of two >= 1 (``dtypes``: each input's
    dtype), as float32: exact, or past the dtype's largest (inf), so no second rounding
    pass; a float16 input straight from its 2 bytes (``from_half``)."""
    x, dt = packed[name], dtypes[name]
    if dt == "bool":
        return x
    if x.dtype == np.float16:  # every float16 input that is not one value
        return from_half(x, factor)
    x = unpack(x)
    with np.errstate(over="ignore"):
        if x.ndim and not any(x.strides):
            return np.broadcast_to(round_to(x.reshape(-1)[:1] * np.float32(factor), dt),
                                   x.shape)
        # bfloat16 and float32: float32's own range (np.asarray: a 0-d input times a
        # NumPy scalar is a NumPy scalar, which ``read_only`` cannot flag)
        return np.asarray(x * np.float32(factor))


def weakly(method):
    """``method`` (bound) called through a weak reference to its object: a maker that the
    object keeps (its memo, its current draw) keeps it in no reference cycle, so it is
    freed as soon as its last user drops it, not at the cycle collector's next pass."""
    ref = weakref.WeakMethod(method)
    return lambda *args: ref()(*args)
