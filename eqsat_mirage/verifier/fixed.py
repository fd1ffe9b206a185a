"""The fixed inputs of the float checks (index, int8/uint8 and fp8 inputs: the same drawn
values in every float draw): which nodes are computed from them alone, under a key equal
in two programs that compute them alike (``fixed_keys``), and float arrays of few distinct
values as codes into a table (``table_codes``). ``draws.Draws`` keeps such values once for
every draw and both programs."""

from __future__ import annotations

import numpy as np

from ..ir.node import FIXED_DTYPES, Op
from ..semantics.floating import uniform
from .floatsafe import input_deps

__all__ = ["UINT", "fixed_keys", "table_codes"]

UINT = {4: np.uint32, 8: np.uint64}  # a float array's bits, by item size


def table_codes(x: np.ndarray, most: int = 256) -> tuple[np.ndarray, np.ndarray] | None:
    """``(codes, table)`` with ``table[codes]`` bit for bit ``x`` (a float array; -0.0 and
    each NaN kept as they are), codes uint8; None where ``x`` holds more than ``most``
    distinct bit patterns."""
    x = np.ascontiguousarray(x)
    if x.dtype.kind != "f" or x.ndim == 0 or uniform(x):
        return None
    if x.dtype.itemsize not in UINT:
        return None
    bits = x.view(UINT[x.dtype.itemsize])
    if x.dtype == np.float32 and most <= 256:
        short = _short_codes(bits, most)
        if short is not None:
            codes, found = short
            return codes.reshape(x.shape), found.view(x.dtype)
    found, codes = np.unique(bits.reshape(-1), return_inverse=True)
    if len(found) > most:
        return None
    return codes.astype(np.uint8).reshape(x.shape), found.view(x.dtype)


def _short_codes(bits: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``table_codes`` of float32 values with 16 significant bits at most (an int8 or fp8
    weight's draw: 8 and 4), by their upper 16 bits: each pattern's count, then one look-up
    of the code of each (the same codes and table as ``np.unique`` gives, sorted by bit
    pattern, without its sort of every element: 4.3 of a 4096 x 4096 int8 weight's 4.6 s
    under load). None where a value has more bits, or more than ``most`` patterns occur."""
    flat = bits.reshape(-1)
    if np.any(flat & np.uint32(0xFFFF)):
        return None
    upper = (flat >> np.uint32(16)).astype(np.uint16)
    held = np.flatnonzero(np.bincount(upper, minlength=1 << 16))
    if len(held) > most:
        return None
    code = np.zeros(1 << 16, dtype=np.uint8)
    code[held] = np.arange(len(held), dtype=np.uint8)
    return code[upper], (held.astype(np.uint32) << np.uint32(16))


def _structural(n, keys: dict) -> tuple:
    """A key of node ``n`` equal for equal expressions (op, argument, dtype, shape and its
    sources' keys): the same in two programs that compute it alike."""
    return (n.op.name, repr(n.arg), str(n.dtype), tuple(n.shape),
            tuple(keys[id(x)] for x in n.srcs))


def fixed_keys(program) -> dict[int, tuple | None]:
    """Each node of a Graph computed from its fixed inputs alone (index, int8/uint8 and fp8
    inputs: the same values in every float draw, ``Draws.index``) and at least one of
    them, by id: its structural key (``_structural``); None for such an input itself (read
    as given or converted as it is read: nothing to keep)."""
    def make(g) -> dict[int, tuple | None]:
        keys: dict[int, tuple] = {}
        out: dict[int, tuple | None] = {}
        fixed_in = FIXED_DTYPES
        deps = input_deps(g)
        for n in g.nodes():
            keys[id(n)] = _structural(n, keys)
            names = deps[id(n)]
            if names and all(g.inputs[x].dtype in fixed_in for x in names):
                out[id(n)] = None if n.op is Op.INPUT else keys[id(n)]
        return out

    return program.derived("fixed keys", make) if hasattr(program, "derived") else make(program)
