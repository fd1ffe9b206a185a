"""The kernel-level IR: one immutable node type and shape inference.

A program is a DAG of ``Node``s. Every node carries its op, its operand nodes,
an op-specific argument, its shape and its dtype. Shapes are computed by
``infer`` (the single source of shape rules), which both the builder and the
separate ``check`` pass call, so a graph built any other way (decoded from
egglog, deserialized) is validated by the same rules. The ops and their groups are
declared in ``ops.py`` (re-exported here).
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from .errors import DTypeError, ShapeError
from .ops import (  # noqa: F401  (re-exported: the op groups, derived from the specs)
    ARITY,
    BINARY,
    BIT_OPS,  # noqa: F401  (re-exported)
    COMPARE,
    ELEMENTWISE,
    GATHERS,
    KEYED,
    LEAF,
    LOGIC,
    LOGIC_BINARY,
    MOVEMENT,
    OPAQUE,
    REDUCE,
    UNARY,
    VIEWS,
    Op,
)

DTYPES = ("float16", "bfloat16", "float32")  # the value dtypes; masks are "bool"
_VALUE_DTYPES = frozenset(DTYPES)
INDEX_DTYPES = ("int64", "int32")  # integer index tensors: a gather's indices (embedding)
# integer value tensors (quantized weights): cast to a float dtype before any arithmetic
QUANT_DTYPES = ("int8", "uint8")
QUANT_RANGE = {"int8": (-128, 127), "uint8": (0, 255)}  # each one's values, both ends in
# float8 value tensors (fp8 weights): cast to a wider float dtype (exact) before arithmetic
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}  # each one's largest finite value
# the dtypes of 256 codes: a fixed weight the verifier keeps as its table and codes
# (semantics/coded.py); with the indices, the inputs it draws once (verifier/fixed.py)
CODED_DTYPES = QUANT_DTYPES + FP8_DTYPES
FIXED_DTYPES = INDEX_DTYPES + CODED_DTYPES
ALL_DTYPES = DTYPES + ("bool",) + FIXED_DTYPES
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "bool": 1, "int64": 8,
            "int32": 4, "int8": 1, "uint8": 1, "float8_e4m3fn": 1,
            "float8_e5m2": 1}  # bytes per element
_DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16",
                  "fp32": "float32", "float": "float32", "long": "int64", "int": "int32",
                  "char": "int8"}
_DTYPE_RANK = {"float16": 0, "bfloat16": 0, "float32": 1}

Shape = tuple[int, ...]


def canonical_dtype(dtype: Any) -> str:
    """Return the canonical dtype name for ``dtype`` or raise ``DTypeError``."""
    name = getattr(dtype, "name", None) or str(dtype)
    name = name.replace("torch.", "")
    name = _DTYPE_ALIASES.get(name, name)
    if name not in ALL_DTYPES:
        raise DTypeError(f"unknown dtype {dtype!r}: expected one of {', '.join(ALL_DTYPES)}")
    return name


def promote(a: str, b: str) -> str:
    """Result dtype of a binary op: equal dtypes stay, mixed halves go to float32."""
    if a == b:
        return a
    if _DTYPE_RANK[a] == _DTYPE_RANK[b]:
        return "float32"  # float16 with bfloat16: neither holds the other
    return a if _DTYPE_RANK[a] > _DTYPE_RANK[b] else b


_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # eqsat_mirage/


@lru_cache(maxsize=1024)
def _in_package(fname: str) -> bool:
    return os.path.abspath(fname).startswith(_PKG_DIR)


_PINNED: ContextVar[str] = ContextVar("eqsat_mirage_user_location", default="")


class located:  # noqa: N801 (used as a function: ``with located(where):``)
    """Within the block, ``user_location()`` is ``where`` (``file:line``; "": unchanged): a
    front end converting a traced op names the op's source line, not its own caller's.
    A class, not a generator: the fusion planner enters one per schedule it prices."""

    __slots__ = ("where", "token")

    def __init__(self, where: str) -> None:
        self.where, self.token = where, None

    def __enter__(self) -> None:
        self.token = _PINNED.set(self.where or _PINNED.get())

    def __exit__(self, *exc: object) -> None:
        _PINNED.reset(self.token)


def user_location() -> str:
    """``file:line`` of the innermost caller outside this package (for errors), or the
    place ``located`` pins."""
    import sys

    pinned = _PINNED.get()
    if pinned:
        return pinned
    frame = sys._getframe(1)
    while frame is not None:
        fname = frame.f_code.co_filename
        if not _in_package(fname):
            return f"{os.path.basename(fname)}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


@dataclass(frozen=True, eq=False)
class Node:
    """One immutable IR node. Identity is structural via ``key``."""

    op: Op
    srcs: tuple[Node, ...]
    arg: Any
    shape: Shape
    dtype: str
    loc: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.op, tuple([s._hash for s in self.srcs]),
                                                 self.arg, self.shape, self.dtype)))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Node) or self._hash != other._hash:
            return False
        return (self.op, self.arg, self.shape, self.dtype) == (
            other.op, other.arg, other.shape, other.dtype) and self.srcs == other.srcs

    def describe(self) -> str:
        """A short human description: op, argument and where it was written."""
        arg = f"[{self.arg}]" if self.arg is not None and self.op is not Op.INPUT else ""
        if self.op in (Op.SUM, Op.MEAN, Op.MAX) and isinstance(self.arg, tuple):
            axes, keep = self.arg  # a reduction: its axes, as the API spells them
            arg = f"(axis={tuple(axes) if len(axes) != 1 else axes[0]}" + (
                ", keepdims)" if keep else ")")
        name = f" {self.arg!r}" if self.op is Op.INPUT else ""
        where = f" (at {self.loc})" if self.loc else ""
        return f"{self.op.name.lower()}{arg}{name}{where}"

    def __repr__(self) -> str:
        return f"Node({self.describe()}: {self.dtype}{list(self.shape)})"


def fmt_shape(shape: Shape) -> str:
    """Format a shape as ``(2, 3)``."""
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _operands(srcs: tuple[Node, ...]) -> str:
    return ", ".join(f"{s.describe()} {fmt_shape(s.shape)}" for s in srcs)


def broadcast_shapes(a: Shape, b: Shape) -> Shape | None:
    """NumPy broadcasting of two shapes, or ``None`` if they do not broadcast."""
    out = []
    for i in range(max(len(a), len(b))):
        da = a[-1 - i] if i < len(a) else 1
        db = b[-1 - i] if i < len(b) else 1
        if da != db and 1 not in (da, db):
            return None
        out.append(max(da, db) if 1 not in (da, db) else da * db)
    return tuple(reversed(out))


def normalize_axes(axis: Any, ndim: int, what: str) -> tuple[int, ...]:
    """Turn ``axis`` (None, int or sequence) into sorted non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, int | np.integer):
        axes = (axis,)
    elif isinstance(axis, list | tuple):
        axes = tuple(axis)
    else:
        raise ShapeError(f"{what}: axis {axis!r} out of range for a {ndim}-d tensor (an "
                         "axis is None, an int or a list or tuple of ints)")
    out = []
    for ax in axes:
        if isinstance(ax, np.integer):
            ax = int(ax)
        if not isinstance(ax, int) or isinstance(ax, bool) or not -ndim <= ax < ndim:
            raise ShapeError(f"{what}: axis {ax!r} out of range for a {ndim}-d tensor")
        out.append(ax % ndim)
    if len(set(out)) != len(out):
        raise ShapeError(f"{what}: repeated axis in {axis!r}")
    return tuple(sorted(out))


class _Where:
    """``op of operands`` for error messages, formatted only when an error is raised."""

    __slots__ = ("op", "srcs")

    def __init__(self, op: Op, srcs: tuple[Node, ...]) -> None:
        self.op, self.srcs = op, srcs

    def __str__(self) -> str:
        return f"{self.op.name.lower()} of {_operands(self.srcs)}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def _matmul_shape(a: Shape, b: Shape, where: _Where | str) -> Shape:
    if len(a) == 0 or len(b) == 0:
        raise ShapeError(f"{where}: matmul needs operands of at least 1 dimension")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(f"{where}: contraction dims differ ({a2[-1]} vs {b2[-2]})")
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    if batch is None:
        raise ShapeError(f"{where}: batch dims {fmt_shape(a2[:-2])} and {fmt_shape(b2[:-2])} "
                         "do not broadcast")
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _weak(n: Node) -> bool:
    """A constant, or a scalar computed from constants alone (``1.0 / c``, as a rule may
    write it): like a Python number it takes the dtype of what it meets, never widening
    it (a float16 ``x * (1.0 / c)`` stays float16, as ``x / c`` is)."""
    return n.op is Op.CONST or (n.shape == () and bool(n.srcs) and n.op is not Op.CAST
                                and all(_weak(s) for s in n.srcs))


def _mask_shape(op: Op, srcs: tuple[Node, ...], where: _Where) -> Shape:
    """The shape of a bool mask made by ``op``: a logical op's (not: its operand's; and,
    or: their broadcast) of bool masks, or a comparison's (the broadcast) of float tensors,
    or of integer tensors (positions), and numbers."""
    if op in LOGIC and any(s.dtype != "bool" for s in srcs):
        what = "operand must be a bool mask" if len(srcs) == 1 else "operands must be bool masks"
        raise DTypeError(f"{where}: the {what}, got {', '.join(s.dtype for s in srcs)}")
    if op in COMPARE:
        kinds = {"float" if s.dtype in DTYPES else "int" if s.dtype in INDEX_DTYPES else s.dtype
                 for s in srcs if not _weak(s)}  # a number meets either kind
        if not kinds <= {"float"} and kinds != {"int"}:
            raise DTypeError(f"{where}: a comparison's operands must be float tensors or "
                             f"integer (int64/int32) tensors, got "
                             f"{', '.join(s.dtype for s in srcs)}")
    if len(srcs) == 1:
        return srcs[0].shape
    shape = broadcast_shapes(srcs[0].shape, srcs[1].shape)
    if shape is None:
        raise ShapeError(f"{where}: shapes do not broadcast")
    return shape


def infer(op: Op, srcs: tuple[Node, ...], arg: Any) -> tuple[Shape, str]:
    """Shape and dtype of ``op`` applied to ``srcs``; raises ``ShapeError``."""
    where = _Where(op, srcs)
    if op is Op.INPUT:
        raise ShapeError("input nodes are created by Graph.input")
    if op is Op.CONST:
        return (), "float32"
    if op is Op.CAUSAL:
        return _causal_shape(arg, where), "bool"
    if op in LOGIC or op in COMPARE:
        return _mask_shape(op, srcs, where), "bool"
    # operands all of value dtypes (the planner's tiles, by the ten thousand): none of the
    # fp8, integer or bool cases below applies
    values = {s.dtype for s in srcs} <= _VALUE_DTYPES
    if not values and any(s.dtype in FP8_DTYPES for s in srcs):
        return _fp8_read(op, srcs, arg, where)
    if (not values and any(s.dtype in QUANT_DTYPES for s in srcs)) or op in BIT_OPS:
        return _quant_cast(op, srcs, arg, where)
    if op in (Op.WHERE, Op.MASK):
        return _masking(op, srcs, where)
    if op is Op.GATHER:
        return _gather_shape(srcs, arg, where)
    if op is Op.TAKE_ALONG_AXIS:
        return _take_along_shape(srcs, arg, where)
    if op is Op.CAST and srcs[0].dtype in INDEX_DTYPES and arg in DTYPES:
        return srcs[0].shape, arg  # integer positions as floats (rotary angles, masks)
    if not values and any(s.dtype in INDEX_DTYPES for s in srcs):
        if op not in VIEWS and op is not Op.CONCAT or any(
                s.dtype != srcs[0].dtype for s in srcs):
            raise DTypeError(f"{where}: an integer index tensor can only be moved (transpose, "
                             "reshape, concat, slice), cast to a float dtype or index a "
                             "gather (embedding, index_select, take_along_axis)")
        return _moved_indices(op, srcs, arg, where)
    if not values and any(s.dtype == "bool" for s in srcs):
        if op not in MOVEMENT or any(
                s.dtype != "bool" for s in srcs):
            raise DTypeError(f"{where}: a bool mask can only be moved (transpose, reshape, "
                             "concat, slice), negated (logical not), combined with another "
                             "(logical and, or) or used as the condition of em.where (a 0/1 "
                             "float: em.where(m, 1.0, 0.0))")
    if op is Op.CAST:
        if arg not in DTYPES:
            raise DTypeError(f"{where}: cast to {arg!r}; expected one of {', '.join(DTYPES)}")
        return srcs[0].shape, arg
    dtype = srcs[0].dtype if srcs else "float32"
    non_const = [s.dtype for s in srcs if not _weak(s)]
    if non_const:
        dtype = non_const[0]
        for d in non_const[1:]:
            dtype = promote(dtype, d)
    if op in UNARY:
        return srcs[0].shape, dtype
    if op in BINARY:
        shape = broadcast_shapes(srcs[0].shape, srcs[1].shape)
        if shape is None:
            raise ShapeError(f"{where}: shapes do not broadcast")
        return shape, dtype
    if op is Op.MATMUL:
        return _matmul_shape(srcs[0].shape, srcs[1].shape, where), dtype
    if op in REDUCE:
        axes, keepdims = arg
        shp = srcs[0].shape
        if any(not 0 <= ax < len(shp) for ax in axes):
            raise ShapeError(f"{where}: axes {axes} out of range")
        if keepdims:
            return tuple(1 if i in axes else d for i, d in enumerate(shp)), dtype
        return tuple(d for i, d in enumerate(shp) if i not in axes), dtype
    if op is Op.TRANSPOSE:
        if sorted(arg) != list(range(len(srcs[0].shape))):
            raise ShapeError(f"{where}: {arg} is not a permutation of {len(srcs[0].shape)} axes")
        return tuple(srcs[0].shape[i] for i in arg), dtype
    if op is Op.RESHAPE:
        size = 1
        for d in srcs[0].shape:
            size *= d
        new = 1
        for d in arg:
            new *= d
        if new != size or any(d <= 0 for d in arg):
            raise ShapeError(f"{where}: cannot reshape {fmt_shape(srcs[0].shape)} "
                             f"to {fmt_shape(arg)}")
        return tuple(arg), dtype
    if op is Op.CONCAT:
        ref = srcs[0].shape
        if not 0 <= arg < len(ref):
            raise ShapeError(f"{where}: axis {arg} out of range")
        for s in srcs[1:]:
            if len(s.shape) != len(ref) or any(
                    i != arg and x != y for i, (x, y) in enumerate(zip(s.shape, ref))):
                raise ShapeError(f"{where}: shapes differ outside axis {arg}")
        total = sum(s.shape[arg] for s in srcs)
        return ref[:arg] + (total,) + ref[arg + 1:], dtype
    if op is Op.SLICE:
        return _slice_shape(srcs[0].shape, arg, where), dtype
    raise ShapeError(f"unknown op {op!r}")


def slice_index(arg: tuple[int, int, int]) -> tuple:
    """The NumPy (or torch) index of a SLICE node's ``(axis, start, stop)``."""
    axis, start, stop = arg
    return (slice(None),) * axis + (slice(start, stop),)


def tile_split(shape: Shape, imap: Any, fmap: int | None, grid: tuple[int, ...],
               forloop: int) -> tuple[list[int], dict[int, int], int | None, list[int]]:
    """How a tensor of ``shape`` is cut into tiles (the tiled interpreters' layout): the
    split shape (each dim as [grid part,] [loop part,] tile), where each grid axis and the
    loop axis sit in it, and where each tile dim sits. A dim in both maps is cut by the grid
    first, then each block's part by the loop."""
    split, grid_pos, loop_pos, tile_pos = [], {}, None, []
    for d, size in enumerate(shape):
        if d in imap:
            grid_pos[imap[d]] = len(split)
            split.append(grid[imap[d]])
            size //= grid[imap[d]]
        if d == fmap:
            loop_pos = len(split)
            split += [forloop, size // forloop]
        else:
            split.append(size)
        tile_pos.append(len(split) - 1)
    return split, grid_pos, loop_pos, tile_pos


def _slice_shape(shape: Shape, arg: Any, where: Any) -> Shape:
    ok = isinstance(arg, tuple) and len(arg) == 3 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in arg)
    if not ok or not 0 <= arg[0] < len(shape) or not 0 <= arg[1] < arg[2] <= shape[arg[0]]:
        raise ShapeError(f"{where}: a slice needs (axis, start, stop) with 0 <= start < stop <= "
                         f"the axis's size, got {arg!r} for shape {fmt_shape(shape)}")
    axis, start, stop = arg
    return shape[:axis] + (stop - start,) + shape[axis + 1:]


def _gather_shape(srcs: tuple[Node, ...], arg: Any, where: Any) -> tuple[Shape, str]:
    """gather(table, idx) along axis ``arg``: idx's shape in place of that axis."""
    table, idx = srcs
    if idx.dtype not in INDEX_DTYPES:
        raise DTypeError(f"{where}: the indices must be an integer tensor (int64 or int32), "
                         f"got {idx.dtype}")
    if table.dtype not in DTYPES:
        raise DTypeError(f"{where}: the table must be a float tensor, got {table.dtype}")
    if not isinstance(arg, int) or isinstance(arg, bool) or not 0 <= arg < len(table.shape):
        raise ShapeError(f"{where}: axis {arg!r} out of range for a {len(table.shape)}-d table")
    return table.shape[:arg] + idx.shape + table.shape[arg + 1:], table.dtype


def _take_along_shape(srcs: tuple[Node, ...], arg: Any, where: Any) -> tuple[Shape, str]:
    """take_along_axis(table, idx) along axis ``arg``: idx of the table's rank and sizes but
    along that axis (torch.gather's smaller sizes elsewhere are refused); idx's shape."""
    table, idx = srcs
    _gather_shape((table, idx), arg, where)  # the dtypes and the axis, checked as a gather's
    if len(idx.shape) != len(table.shape) or any(
            a != arg and i != t for a, (i, t) in enumerate(zip(idx.shape, table.shape))):
        raise ShapeError(f"{where}: the indices must have the table's rank and its sizes but "
                         f"along axis {arg}, got {fmt_shape(idx.shape)} for a table of "
                         f"{fmt_shape(table.shape)}")
    return idx.shape, table.dtype


def _quant_cast(op: Op, srcs: tuple[Node, ...], arg: Any, where: Any) -> tuple[Shape, str]:
    """An int8/uint8 value tensor: read by a cast (to a float dtype, or a wrapping cast to
    the other integer dtype), moved (a view or a concat of one integer dtype) or unpacked by
    a bit op with a constant (``x & mask``, ``x >> shift``); arithmetic on integer values is
    not supported."""
    dtype = next((s.dtype for s in srcs if s.dtype in QUANT_DTYPES), srcs[0].dtype)
    if op in BIT_OPS:
        return _bit_op(op, srcs[0], arg, where)
    if op in VIEWS or op is Op.CONCAT:
        return _moved_as_is(op, srcs, arg, where, dtype)
    if op is not Op.CAST:
        raise DTypeError(f"{where}: {'an' if dtype == 'int8' else 'a'} {dtype} tensor (integer "
                         "values) can only be cast (to a float dtype, w.astype('float16'), "
                         "before any arithmetic), moved (reshape, transpose, concat, slice) "
                         "or unpacked (w & mask, w >> shift); integer arithmetic is not "
                         "supported")
    if arg not in DTYPES + QUANT_DTYPES:
        raise DTypeError(f"{where}: cast of an integer tensor to {arg!r}; expected one of "
                         f"{', '.join(DTYPES + QUANT_DTYPES)}")
    return srcs[0].shape, arg


def _moved_as_is(op: Op, srcs: tuple[Node, ...], arg: Any, where: Any,
                 dtype: str) -> tuple[Shape, str]:
    """A view or concat of integer or fp8 tensors of ``dtype`` (moved, not computed); a
    ``DTypeError`` for a concat that mixes in another dtype."""
    if any(s.dtype != dtype for s in srcs):
        article = "an" if dtype == "int8" else "a"
        raise DTypeError(f"{where}: a concat of {article} {dtype} tensor with "
                         f"{', '.join(sorted({s.dtype for s in srcs} - {dtype}))}; cast "
                         "them to one dtype first")
    return _moved_indices(op, srcs, arg, where)


def _fp8_read(op: Op, srcs: tuple[Node, ...], arg: Any, where: Any) -> tuple[Shape, str]:
    """A float8 value tensor (e4m3fn or e5m2): read by a cast to a float dtype (exact: every
    finite fp8 value is a float16, bfloat16 and float32 value) or moved (a view or a concat
    of one fp8 dtype); arithmetic on fp8 values is not supported (no fp8 compute)."""
    dtype = next(s.dtype for s in srcs if s.dtype in FP8_DTYPES)
    if op in VIEWS or op is Op.CONCAT:
        return _moved_as_is(op, srcs, arg, where, dtype)
    if op is not Op.CAST:
        raise DTypeError(f"{where}: a {dtype} tensor (fp8 values) can only be cast (to a float "
                         "dtype, w.astype('float16'), before any arithmetic) or moved "
                         "(reshape, transpose, concat, slice); fp8 arithmetic is not supported")
    if arg not in DTYPES:
        raise DTypeError(f"{where}: cast of a {dtype} tensor to {arg!r}; expected one of "
                         f"{', '.join(DTYPES)}")
    return srcs[0].shape, arg


def _bit_op(op: Op, x: Node, arg: Any, where: Any) -> tuple[Shape, str]:
    """``x & mask`` or ``x >> shift``: an int8/uint8 ``x``, a constant of the dtype's range
    (a mask) or in [0, 7] (a shift); the result has ``x``'s shape and dtype."""
    if x.dtype not in QUANT_DTYPES:
        raise DTypeError(f"{where}: bit ops need an int8 or uint8 operand, got {x.dtype} "
                         "(cast packed weights' storage to uint8)")
    lo, hi = QUANT_RANGE[x.dtype] if op is Op.BITAND else (0, 7)
    if not isinstance(arg, (int, np.integer)) or isinstance(arg, bool) or not lo <= arg <= hi:
        what = "mask" if op is Op.BITAND else "shift"
        raise DTypeError(f"{where}: the {what} must be an integer in [{lo}, {hi}] for "
                         f"{'an' if x.dtype == 'int8' else 'a'} {x.dtype} tensor, got {arg!r}")
    return x.shape, x.dtype


def _moved_indices(op: Op, srcs: tuple[Node, ...], arg: Any, where: Any) -> tuple[Shape, str]:
    """An index tensor moved (a view or a concat of index tensors): its dtype kept."""
    fake = tuple(Node(s.op, s.srcs, s.arg, s.shape, "float32") for s in srcs)
    return infer(op, fake, arg)[0], srcs[0].dtype


def _causal_shape(arg: Any, where: Any) -> Shape:
    if not (isinstance(arg, tuple) and len(arg) == 3 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in arg)) or min(arg[:2]) < 1:
        raise ShapeError(f"{where}: a causal mask needs (rows, cols, offset) ints with "
                         f"rows, cols >= 1, got {arg!r}")
    return (arg[0], arg[1])


def _masking(op: Op, srcs: tuple[Node, ...], where: Any) -> tuple[Shape, str]:
    """where(cond, a, b) and mask(cond, x): cond a bool mask, the values not."""
    cond, *vals = srcs
    if cond.dtype != "bool":
        raise DTypeError(f"{where}: the condition must be a bool mask, got {cond.dtype}")
    if any(v.dtype == "bool" for v in vals):
        raise DTypeError(f"{where}: the values must not be bool masks")
    shape: Shape | None = cond.shape
    for v in vals:
        shape = broadcast_shapes(shape, v.shape) if shape is not None else None
    if shape is None:
        raise ShapeError(f"{where}: shapes do not broadcast")
    dts = [v.dtype for v in vals if v.op is not Op.CONST] or ["float32"]
    dtype = dts[0]
    for d in dts[1:]:
        dtype = promote(dtype, d)
    return shape, dtype


def make(op: Op, srcs: tuple[Node, ...], arg: Any = None, loc: str = "") -> Node:
    """Build a node after inferring (and so checking) its shape and dtype."""
    shape, dtype = infer(op, srcs, arg)
    return Node(op, srcs, arg, shape, dtype, loc)


def toposort(roots: list[Node]) -> list[Node]:
    """All nodes reachable from ``roots``, operands before users (iterative DFS)."""
    order: list[Node] = []
    seen: set[int] = set()
    for root in roots:
        stack: list[tuple[Node, int]] = [(root, 0)]
        while stack:
            node, i = stack.pop()
            if i == 0 and id(node) in seen:
                continue
            if i < len(node.srcs):
                stack.append((node, i + 1))
                child = node.srcs[i]
                if id(child) not in seen:
                    stack.append((child, 0))
            else:
                seen.add(id(node))
                order.append(node)
    return order


def numel(shape: Shape) -> int:
    """Number of elements of a shape."""
    n = 1
    for d in shape:
        n *= d
    return n
