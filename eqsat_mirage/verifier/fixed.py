"""The fixed inputs of the float checks (index, int8/uint8 and fp8 inputs: the same drawn
values in every float draw): which nodes are computed from them alone, under a key equal
in two programs that compute them alike (``fixed_keys``), and float arrays of few distinct
values as codes into a table (``table_codes``). ``draws.Draws`` keeps such values once for
every draw and both programs."""

from __future__ import annotations

import numpy as np

from ..ir.node import CODED_DTYPES, FIXED_DTYPES, Op
from ..ir.ops import VIEWS
from ..semantics.floating import FLOAT_SEMANTICS, float_ctx, uniform
from ..semantics.interp import Outputs, run
from .floatsafe import input_deps

__all__ = ["UINT", "fixed_keys", "scale_units", "table_codes"]

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


def scale_units(program, fixed: dict[str, np.ndarray]) -> dict[str, float]:
    """The float inputs of ``program`` that scale a dequantized weight, each with the unit
    its draws are taken in: 1 / the largest magnitude of the codes it multiplies
    (``w_q.astype(f) * s``: 1/128 for int8 codes, 1/8 for int4 codes less their zero point
    8, 1/448 for e4m3 codes), so that the dequantized weight is drawn at the magnitude of a
    float weight, as a real model's scales (absmax / 127) make it. ``fixed``: the fixed
    inputs' drawn values (``sampling.index_draws``). Codes are int8, uint8 and fp8 inputs
    (never positions: ``pos * inv_freq`` keeps its draw). An input counts only when every
    use of it, through views (reshape, broadcast, transpose) and casts, is such a product
    (a scale that is also an addend or a divisor keeps its draw); one that scales several
    products takes the smallest unit. Without it a float check drew weights 128 times their
    float draw's magnitude, and a stitched layer's float16 sums overflowed at draws no
    model meets (docs/verifier.md, "Integer inputs")."""
    units: dict[str, float] = {}
    for name, f in program.derived("scale products", _scale_products):
        top = _largest(program, f, fixed)
        if np.isfinite(top) and top > 1.0:
            units[name] = min(units.get(name, 1.0), 1.0 / top)
    return units


def _scale_products(program) -> tuple[tuple[str, object], ...]:
    """(float input, the codes' node it multiplies) for each product of ``scale_units``'s
    form, of the inputs read nowhere else: the program's structure, worked out once per
    program (``scale_units`` runs for every ``Draws``)."""
    deps = input_deps(program)
    products: list[tuple[str, object]] = []
    other_uses: set[str] = set()  # inputs read somewhere other than as a scale of codes
    for n in program.nodes():
        if n.op in VIEWS or n.op is Op.CAST or n.op is Op.INPUT:
            continue
        scaled = set()
        if n.op is Op.MUL and len(n.srcs) == 2:
            for f, other in (n.srcs, n.srcs[::-1]):
                names = deps[id(f)]
                root = _viewed_input(other)
                if not names or root is None or root.dtype in FIXED_DTYPES or \
                        not all(program.inputs[x].dtype in CODED_DTYPES for x in names):
                    continue
                products.append((root.arg, f))
                scaled.add(id(other))
        for src in n.srcs:
            root = _viewed_input(src)
            if root is not None and id(src) not in scaled:
                other_uses.add(root.arg)
    for n in program.outputs.values():  # an input returned (through views) is a use too
        root = _viewed_input(n)
        if root is not None:
            other_uses.add(root.arg)
    return tuple((name, f) for name, f in products if name not in other_uses)


def _largest(program, f, fixed: dict[str, np.ndarray]) -> float:
    """The largest magnitude of node ``f`` of ``program``, computed from the fixed inputs
    alone: read off the input where ``f`` is a view or cast of one (a 4096 x 11008 weight
    is not converted to float64 for it), else evaluated."""
    root = _viewed_input(f)
    if root is not None:
        value = fixed[root.arg]
    else:
        ins = {n: fixed[n] if n in fixed else np.broadcast_to(0.0, node.shape)
               for n, node in program.inputs.items()}  # the others: never read here
        with np.errstate(all="ignore"):
            value = run(Outputs({"f": f}), FLOAT_SEMANTICS,
                        float_ctx(program, ins, None, False))["f"]
    return float(np.max(np.abs(value), initial=0.0))


def _viewed_input(n):
    """The input node ``n`` is a view or a cast of (through movement ops of one operand and
    casts), or None."""
    while n.op in VIEWS or n.op is Op.CAST:
        n = n.srcs[0]
    return n if n.op is Op.INPUT else None
