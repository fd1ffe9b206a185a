"""The builder: ``Graph``, ``Tensor`` (with its NumPy-style operators and methods) and ``apply``.

The free functions (``em.exp``, ``em.softmax``, ...) are in ``functions.py``.

Construction records where each op was written, so errors point at the user's file and line.
Shapes are checked as the program is built (``ir.infer``); ``check`` re-validates any graph.
"""

from __future__ import annotations

import keyword
import math
import operator
from collections.abc import Callable, Sequence
from numbers import Integral, Real
from typing import Any

import numpy as np

from ..ir.dims import Dim
from ..ir.errors import DTypeError, GraphError, ShapeError
from ..ir.node import (
    Node,
    Op,
    canonical_dtype,
    fmt_shape,
    make,
    normalize_axes,
    numel,
    toposort,
    user_location,
)


def _is_int(v: Any) -> bool:
    """An integer that is not a bool; plain ints first (the planner declares tile inputs by
    the thousand, and an ABC check of ``Integral`` is most of the time such a check takes)."""
    return type(v) is int or (isinstance(v, Integral) and not isinstance(v, bool))


class Graph:
    """A kernel-level program: named inputs, a DAG of ops, named outputs."""

    def __init__(self, name: str = "program") -> None:
        if not isinstance(name, str):  # any text: generated code shows it as a literal only
            raise GraphError(f"graph name {name!r} must be a string, not {type(name).__name__}")
        self.name = name
        self.inputs: dict[str, Node] = {}
        self.outputs: dict[str, Node] = {}
        self.dims: dict[str, Dim] = {}  # symbolic sizes by name (a shape family when any)
        self.dynamic: dict[str, dict[int, str]] = {}  # input -> {axis: size name}

    def input(self, name: str, shape: Sequence[int | str | Dim],
              dtype: Any = "float16") -> Tensor:
        """Declare a named input tensor of ``shape`` and ``dtype``.

        A dim may be symbolic: an ``em.Dim`` or a name (``(2, 64, "L")``; a name not yet
        declared in this graph gets ``Dim(name)``'s default hint). The graph is then a
        shape family, built at each size's hint; ``em.optimize`` searches it once for
        every size.
        """
        loc = user_location()
        # a Python keyword is an input name too (issue 51: a torch module's buffer or argument
        # may be called ``class``); generated code holds names as string literals or mangled
        if not isinstance(name, str) or not name.isidentifier():
            raise GraphError(f"input name {name!r} (at {loc}) must be a Python identifier")
        if name in self.inputs:
            raise GraphError(f"duplicate input name {name!r} (at {loc}) in graph {self.name!r}")
        try:
            dims = tuple(shape)
        except TypeError as exc:
            raise ShapeError(f"input {name!r} (at {loc}): shape {shape!r} is not a "
                             "sequence of ints") from exc
        if all(type(d) is int and d > 0 for d in dims):  # plain sizes (the planner's tiles,
            shape, symbolic = dims, {}  # by the hundred thousand): nothing to convert
        else:
            shape, symbolic = self._checked_shape(name, dims, shape, loc)
        node = Node(Op.INPUT, (), name, shape, canonical_dtype(dtype), loc)
        self.inputs[name] = node
        if symbolic:
            self.dynamic[name] = symbolic
        return Tensor(node, self)

    def _checked_shape(self, name: str, dims: tuple, given: Any,
                       loc: str) -> tuple[tuple[int, ...], dict[int, str]]:
        """``dims`` of input ``name`` as positive ints (symbolic dims at their hints), and
        {axis: size name}; a ``ShapeError`` for anything else (``given``: as written)."""
        dims, symbolic = self._symbolic(name, dims, loc)
        if not all(_is_int(d) for d in dims):
            raise ShapeError(f"input {name!r} (at {loc}): shape {given!r} is not a sequence of "
                             "ints (a dim such as 2.5 or '3' is not rounded or parsed)")
        shape = tuple(int(d) for d in dims)
        if any(d <= 0 for d in shape):
            raise ShapeError(f"input {name!r} (at {loc}): shape {fmt_shape(shape)} has a "
                             "non-positive dim")
        return shape, symbolic

    def _symbolic(self, name: str, dims: tuple, loc: str) -> tuple[tuple, dict[int, str]]:
        """``dims`` with every symbolic entry at its hint, and {axis: size name}."""
        out, symbolic = [], {}
        for axis, d in enumerate(dims):
            if isinstance(d, str) and d.isidentifier():  # "3" is refused as not an int
                d = self.dims.get(d) or Dim(d)
            if isinstance(d, Dim):
                known = self.dims.setdefault(d.name, d)
                if known != d:
                    raise ShapeError(f"input {name!r} (at {loc}): size {d} differs from the "
                                     f"{known} declared earlier in graph {self.name!r}")
                symbolic[axis] = d.name
                d = d.hint
            out.append(d)
        return tuple(out), symbolic

    @property
    def is_family(self) -> bool:
        """Whether some input size is symbolic (``em.Dim``): one program per size."""
        return bool(self.dynamic)

    def at(self, sizes: dict[str, int]) -> Graph:
        """This family's program at concrete ``sizes`` ({size name: value}; a size left
        out stays at its hint), a plain Graph; a ``DynamicShapeError`` names the node whose
        shape rule or argument does not follow the size."""
        from .family import instantiate

        return instantiate(self, sizes)

    def output(self, tensor: Tensor, name: str | None = None) -> None:
        """Mark ``tensor`` as an output called ``name`` (default ``out{i}``)."""
        loc = user_location()
        name = name if name is not None else f"out{len(self.outputs)}"
        if not isinstance(tensor, Tensor):
            raise GraphError(f"output {name!r} (at {loc}): expected a Tensor of this graph, "
                             f"got {type(tensor).__name__}")
        if tensor.graph is not self:
            raise GraphError(f"output {name!r} (at {loc}): tensor {tensor.node.describe()} "
                             f"belongs to graph {tensor.graph.name!r}, not {self.name!r}")
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise GraphError(f"output name {name!r} (at {loc}) must be a Python identifier")
        if name in self.outputs:
            raise GraphError(f"duplicate output name {name!r} (at {loc})")
        if name in self.inputs:
            raise GraphError(f"output name {name!r} (at {loc}) is already an input name")
        self.outputs[name] = tensor.node

    def causal_mask(self, rows: int, cols: int | None = None, offset: int = 0) -> Tensor:
        """A bool (rows, cols) mask, True where ``col <= row + offset`` (torch's is_causal:
        offset 0; a query block at the end of a longer key sequence: ``cols - rows``). It is
        built from positions, not read from memory."""
        cols = rows if cols is None else cols
        loc = user_location()
        if not all(isinstance(v, Integral) and not isinstance(v, bool) for v in
                   (rows, cols, offset)):
            raise ShapeError(f"causal_mask (at {loc}): rows, cols and offset must be ints, got "
                             f"{rows!r}, {cols!r}, {offset!r}")
        try:
            node = make(Op.CAUSAL, (), (int(rows), int(cols), int(offset)), loc)
        except ShapeError as exc:
            raise ShapeError(f"{exc} (at {loc})") from None
        return Tensor(node, self)

    def nodes(self) -> list[Node]:
        """Every node reachable from the outputs, operands first (a fresh list; the order
        is remembered while the outputs are the same nodes: nodes are immutable)."""
        return list(self.derived("nodes", lambda g: toposort(list(g.outputs.values()))))

    def __getstate__(self) -> dict:
        """What a copy (``copy.copy``, ``copy.deepcopy``) takes: not the ``derived`` facts,
        which may be keyed by the ids of this graph's nodes (a deep copy has new ones)."""
        state = dict(self.__dict__)
        state.pop("_derived", None)
        return state

    def derived(self, what: str, make: Callable[[Graph], Any]) -> Any:
        """``make(self)``, kept under ``what`` while the outputs are the same nodes (nodes
        are immutable, so a fact of the nodes reachable from them stays true): the node
        order, the cost model's padded tile shapes. The caller must not change the value."""
        roots = tuple(self.outputs.values())
        facts = getattr(self, "_derived", None)
        if facts is None or len(facts[0]) != len(roots) or not all(
                map(operator.is_, facts[0], roots)):  # the same nodes (no generator: hot)
            facts = self._derived = (roots, {})
        if what not in facts[1]:
            facts[1][what] = make(self)
        return facts[1][what]

    def check(self) -> Graph:
        """Run the ``check`` pass on this graph and return it."""
        from ..ir.check import check

        check(self)
        return self

    def __str__(self) -> str:
        from ..ir.printing import format_graph

        return format_graph(self)

    def __repr__(self) -> str:
        return (f"Graph({self.name!r}, inputs={list(self.inputs)}, "
                f"outputs={list(self.outputs)}, nodes={len(self.nodes())})")


def _node(x: Any, graph: Graph | None, what: str) -> Node:
    if isinstance(x, Tensor):
        if graph is not None and x.graph is not graph:
            raise GraphError(f"{what}: operands come from different graphs "
                             f"({x.graph.name!r} and {graph.name!r})")
        return x.node
    if isinstance(x, Real) and not isinstance(x, bool):
        try:
            value = float(x)
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise GraphError(f"{what}: the constant {repr(x)[:40]} is not a finite number")
        return Node(Op.CONST, (), value, (), "float32")
    raise GraphError(f"{what}: unsupported operand of type {type(x).__name__}; use a Tensor "
                     "or a Python number")


def apply(op: Op, *args: Any, arg: Any = None) -> Tensor:
    """Apply ``op`` to tensors (or numbers) and return the resulting Tensor."""
    graphs = [a.graph for a in args if isinstance(a, Tensor)]
    if not graphs:
        raise GraphError(f"{op.name.lower()}: needs at least one Tensor operand")
    graph = graphs[0]
    loc = user_location()
    srcs = tuple(_node(a, graph, f"{op.name.lower()} (at {loc})") for a in args)
    try:
        node = make(op, srcs, arg, loc)
    except ShapeError as exc:
        raise ShapeError(f"{exc} (at {loc})") from None
    return Tensor(node, graph)


def _int_constant(value: Any, what: str) -> int:
    """A bit op's constant: a Python or NumPy integer (a Tensor operand is not supported)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise GraphError(f"{what} (at {user_location()}): the second operand must be an "
                         f"integer constant, got {type(value).__name__}")
    return int(value)


def bitwise_and(x: Tensor, mask: Any) -> Tensor:
    """``x & mask`` (NumPy's ``bitwise_and``): an int8/uint8 tensor and an integer constant
    of its dtype's range, e.g. ``w_p & 0xF``, the low nibbles of packed int4 weights."""
    return apply(Op.BITAND, x, arg=_int_constant(mask, "bitwise_and"))


def right_shift(x: Tensor, shift: Any) -> Tensor:
    """``x >> shift`` (NumPy's ``right_shift``): an int8/uint8 tensor and an integer
    constant in [0, 7] (arithmetic on int8), e.g. ``w_p >> 4``, the high nibbles."""
    return apply(Op.SHR, x, arg=_int_constant(shift, "right_shift"))


def _operand(x: Any) -> str:
    """An operand as an error message names it: a Tensor's dtype and shape, else its type."""
    if isinstance(x, Tensor):
        return f"{x.node.describe()}: {x.dtype} {fmt_shape(x.shape)}"
    return f"{type(x).__name__} {repr(x)[:40]}"


def _logic(op: Op, a: Any, b: Any, what: str) -> Tensor:
    """``op`` (logical and, or) of two bool mask Tensors; ``DTypeError`` naming the op and
    its operands' dtypes and shapes for anything else (a float tensor, a number)."""
    if not all(isinstance(x, Tensor) and x.dtype == "bool" for x in (a, b)):
        raise DTypeError(f"{what} (at {user_location()}): the operands must be bool masks, "
                         f"got {_operand(a)} and {_operand(b)} (a bool mask compares values "
                         "first: (x > 0) & m)")
    return apply(op, a, b)


def logical_and(a: Tensor, b: Tensor) -> Tensor:
    """``a & b`` of two bool masks (NumPy's ``logical_and``, broadcast): True where both
    hold. ``em.where(em.logical_and(pad, causal), S, float("-inf"))`` masks a score where
    either mask does not hold (transformers' ``and_masks``)."""
    return _logic(Op.AND, a, b, "logical_and")


def logical_or(a: Tensor, b: Tensor) -> Tensor:
    """``a | b`` of two bool masks (NumPy's ``logical_or``, broadcast): True where either
    holds (transformers' ``or_masks``)."""
    return _logic(Op.OR, a, b, "logical_or")


class Tensor:
    """A value in a Graph under construction, with NumPy-style operators."""

    __array_priority__ = 1000  # make numpy scalars defer to our operators

    def __init__(self, node: Node, graph: Graph) -> None:
        self.node = node
        self.graph = graph

    shape = property(lambda self: self.node.shape, doc="The tensor's shape.")
    dtype = property(lambda self: self.node.dtype, doc="The tensor's dtype name.")
    ndim = property(lambda self: len(self.node.shape), doc="Number of dimensions.")

    def __repr__(self) -> str:
        return f"Tensor({self.node.describe()}: {self.dtype}{list(self.shape)})"

    def __matmul__(self, o: Any) -> Tensor:
        return apply(Op.MATMUL, self, o)

    def __rmatmul__(self, o: Any) -> Tensor:
        return apply(Op.MATMUL, o, self)

    def __add__(self, o: Any) -> Tensor:
        return apply(Op.ADD, self, o)

    def __radd__(self, o: Any) -> Tensor:
        return apply(Op.ADD, o, self)

    def __sub__(self, o: Any) -> Tensor:
        return apply(Op.SUB, self, o)

    def __rsub__(self, o: Any) -> Tensor:
        return apply(Op.SUB, o, self)

    def __mul__(self, o: Any) -> Tensor:
        return apply(Op.MUL, self, o)

    def __rmul__(self, o: Any) -> Tensor:
        return apply(Op.MUL, o, self)

    def __truediv__(self, o: Any) -> Tensor:
        return apply(Op.DIV, self, o)

    def __rtruediv__(self, o: Any) -> Tensor:
        return apply(Op.DIV, o, self)

    def __neg__(self) -> Tensor:
        return apply(Op.NEG, self)

    def __invert__(self) -> Tensor:
        """``~mask``: the logical not of a bool mask (``em.logical_not``)."""
        return apply(Op.NOT, self)

    def __and__(self, other: Any) -> Tensor:
        """``m & n`` of two bool masks: their logical and (``em.logical_and``); ``w & mask``:
        an int8/uint8 tensor and an integer constant (``em.bitwise_and``)."""
        if self.dtype == "bool" or (isinstance(other, Tensor) and other.dtype == "bool"):
            return _logic(Op.AND, self, other, "&")
        return bitwise_and(self, other)

    def __rand__(self, other: Any) -> Tensor:
        """``mask & w``: as ``w & mask`` (a bool mask's other operand is a bool mask)."""
        if self.dtype == "bool":
            return _logic(Op.AND, other, self, "&")
        return bitwise_and(self, other)

    def __or__(self, other: Any) -> Tensor:
        """``m | n`` of two bool masks: their logical or (``em.logical_or``)."""
        return _logic(Op.OR, self, other, "|")

    def __ror__(self, other: Any) -> Tensor:
        """``other | m``: a logical or, whose operands are both bool masks."""
        return _logic(Op.OR, other, self, "|")

    def __rshift__(self, shift: Any) -> Tensor:
        """``w >> shift``: an int8/uint8 tensor, a constant in [0, 7] (``em.right_shift``)."""
        return right_shift(self, shift)

    def __gt__(self, o: Any) -> Tensor:
        """``x > y``: a bool mask (``em.gt``; ``==`` and ``!=`` are ``em.eq`` and ``em.ne``,
        a Tensor's ``==`` stays Python's identity)."""
        return apply(Op.GT, self, o)

    def __ge__(self, o: Any) -> Tensor:
        """``x >= y``: a bool mask (``em.ge``)."""
        return apply(Op.GE, self, o)

    def __lt__(self, o: Any) -> Tensor:
        """``x < y``: a bool mask (``em.lt``)."""
        return apply(Op.LT, self, o)

    def __le__(self, o: Any) -> Tensor:
        """``x <= y``: a bool mask (``em.le``)."""
        return apply(Op.LE, self, o)

    def __pow__(self, k: Any) -> Tensor:
        if k == 2:
            return apply(Op.MUL, self, self)
        if k == 0.5:
            return apply(Op.SQRT, self)
        if k == -0.5:
            return apply(Op.RSQRT, self)
        if k == 1:
            return self
        raise GraphError(f"power {k!r} (at {user_location()}): only 2, 1, 0.5 and -0.5 "
                         "are supported")

    def sum(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """Sum over ``axis`` (None: all axes)."""
        return apply(Op.SUM, self, arg=(normalize_axes(axis, self.ndim, self._what("sum")),
                                        bool(keepdims)))

    def max(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """The largest element over ``axis`` (None: all axes)."""
        return apply(Op.MAX, self,
                     arg=(normalize_axes(axis, self.ndim, self._what("max")), bool(keepdims)))

    def mean(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """Mean over ``axis`` (None: all axes)."""
        return apply(Op.MEAN, self,
                     arg=(normalize_axes(axis, self.ndim, self._what("mean")), bool(keepdims)))

    def _what(self, op: str) -> str:
        return f"{op} (at {user_location()}) of {self.node.describe()} {fmt_shape(self.shape)}"

    def _ints(self, values: tuple, op: str, what: str) -> tuple[int, ...]:
        """``values`` (one sequence, or ints) as ints; a ShapeError naming the op otherwise."""
        if len(values) == 1 and isinstance(values[0], list | tuple):
            values = tuple(values[0])
        if not all(_is_int(v) for v in values):
            raise ShapeError(f"{self._what(op)}: {what} must be ints, got {values!r}")
        return tuple(int(v) for v in values)

    def transpose(self, *axes: Any) -> Tensor:
        """Permute axes; with no argument, reverse them (NumPy semantics)."""
        axes = self._ints(axes, "transpose", "axes")
        perm = tuple(range(self.ndim))[::-1] if not axes else tuple(
            a % self.ndim if -self.ndim <= a < self.ndim else a for a in axes)
        return apply(Op.TRANSPOSE, self, arg=perm)

    @property
    def T(self) -> Tensor:  # noqa: N802 - NumPy's name
        """The tensor with its last two axes swapped (matrix transpose)."""
        if self.ndim < 2:
            return self
        perm = tuple(range(self.ndim - 2)) + (self.ndim - 1, self.ndim - 2)
        return apply(Op.TRANSPOSE, self, arg=perm)

    def reshape(self, *shape: Any) -> Tensor:
        """Reshape (one dim may be -1)."""
        shape = self._ints(shape, "reshape", "the new shape's dims")
        if shape.count(-1) == 1:
            rest = numel(tuple(d for d in shape if d != -1))
            if rest <= 0:
                raise ShapeError(f"{self._what('reshape')}: cannot infer -1 in {shape}")
            shape = tuple(numel(self.shape) // rest if d == -1 else d for d in shape)
        return apply(Op.RESHAPE, self, arg=shape)

    def astype(self, dtype: Any) -> Tensor:
        """The tensor rounded to ``dtype`` (NumPy's name; torch's ``.to``); the same tensor
        when it already has that dtype."""
        name = canonical_dtype(dtype)
        if name == self.dtype:
            return self
        if name == "bool":
            raise GraphError(f"{self._what('astype')}: casts to bool are not supported (a "
                             "comparison makes a mask: x != 0)")
        if self.dtype == "bool":  # a mask as 0/1 values: where(m, 1, 0) in ``name``
            return apply(Op.WHERE, self, 1.0, 0.0).astype(name)
        return apply(Op.CAST, self, arg=name)

    def __getitem__(self, index: Any) -> Tensor:
        """Basic indexing: slices with step 1, ``None`` (a new axis) and ``...``."""
        items = index if isinstance(index, tuple) else (index,)
        if sum(i is Ellipsis for i in items) > 1:
            raise ShapeError(f"{self._what('indexing')}: more than one '...'")
        real = sum(i is not None and i is not Ellipsis for i in items)
        if real > self.ndim:
            raise ShapeError(f"{self._what('indexing')}: {real} indices for {self.ndim} dims")
        if Ellipsis in items:
            at = items.index(Ellipsis)
            items = items[:at] + (slice(None),) * (self.ndim - real) + items[at + 1:]
        items = items + (slice(None),) * (self.ndim - sum(i is not None for i in items))
        out, axis, shape = self, 0, []
        for item in items:
            if item is None:
                shape.append(1)
                continue
            if not isinstance(item, slice) or item.step not in (None, 1):
                raise ShapeError(f"{self._what('indexing')}: index {item!r} (supported: slices "
                                 "with step 1, None and ...)")
            start, stop, _ = item.indices(self.shape[axis])
            if stop <= start:
                raise ShapeError(f"{self._what('indexing')}: empty slice {item!r} of an axis "
                                 f"of {self.shape[axis]}")
            if (start, stop) != (0, self.shape[axis]):
                out = apply(Op.SLICE, out, arg=(axis, start, stop))
            shape.append(stop - start)
            axis += 1
        return out if tuple(shape) == out.shape else out.reshape(tuple(shape))
