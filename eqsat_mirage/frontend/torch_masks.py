"""Bool masks in the torch front end: ``masked_fill``, ``where``, ``~`` and the comparisons
that make masks out of constant buffers.

nanoGPT and minGPT write causal attention as ``att.masked_fill(self.bias[:, :, :T, :T] == 0,
float("-inf"))`` with ``bias`` a buffer holding ``tril(ones(T, T))``. The buffer is a
constant of the module: the ``Converter`` knows its value (``Converter.known``) and folds
every op computed from constants alone in torch; a folded *bool* result becomes a
``BoolMask`` (``constant_mask``): the causal mask built from positions (or its complement)
when it is one, else a constant bool input fed from the folded value. A constant read this
way is guarded (``Snapshot``): the compiled partition checks at each call that the buffer
still holds the value it was folded at, and ``graph_inputs`` refuses a changed one.

``masked_fill(m, v)`` is ``where(m, v, x)``, i.e. ``where(~m, x, v)``: a ``BoolMask`` keeps a
graph bool tensor and whether it is negated, so ``~`` costs nothing and a ``-inf`` fill
lands in the third argument of ``em.where`` (the ``mask`` op, which the verifier handles).
``~``, ``logical_not``, ``mask == 0`` and ``mask == False`` of a bool graph tensor are its
logical not (``em.logical_not``; ``not not y`` is ``y``), ``mask != 0`` and ``mask == 1`` the
mask; ``select`` reads ``where(not y, a, b)`` as ``where(y, b, a)``, so a not is computed
only where a ``-inf`` lands where the mask holds (nanoGPT's ``masked_fill(mask, -inf)`` with
a ``mask`` argument): ``mask(not m, x)``, inside the program (its inputs stay the function's
arguments; a ``not_mask`` input was added before issue 52). ``&``, ``|``, ``logical_and``,
``logical_or``, ``bitwise_and`` and ``bitwise_or`` of two bool masks (padding and causal
masks combined) are their logical and / or (``em.logical_and``, ``em.logical_or``),
broadcast as torch broadcasts them; a negated ``BoolMask`` operand is its logical not.
"""

from __future__ import annotations

import math
import operator
from numbers import Real
from typing import Any

import numpy as np
import torch

from ..ir.errors import MirageError, UnsupportedOpError
from ..ir.node import DTYPES, INDEX_DTYPES, Op
from .functions import logical_and, logical_not, logical_or, where
from .graph import Tensor, apply

__all__ = ["BoolMask", "MASK_FUNCTIONS", "MASK_METHODS", "Snapshot", "combine", "constant_mask",
           "is_mask", "select", "source_value"]

# a folded constant larger than this (elements) is not folded (it stays an ordinary input)
FOLD_LIMIT = 1 << 24


class BoolMask:
    """A bool mask of ``shape``: the graph bool tensor ``base`` (whose shape is ``shape``
    without some leading 1s; it broadcasts to ``shape``), or its complement when
    ``negated``. ``~mask`` flips ``negated``; nothing is computed."""

    dtype = "bool"

    def __init__(self, base: Tensor, shape: tuple[int, ...], negated: bool = False) -> None:
        self.base, self.shape, self.negated = base, tuple(shape), bool(negated)

    @property
    def ndim(self) -> int:
        """The mask's rank."""
        return len(self.shape)

    def __invert__(self) -> BoolMask:
        return BoolMask(self.base, self.shape, not self.negated)

    def __repr__(self) -> str:
        return (f"BoolMask({'~' if self.negated else ''}{self.base.node.describe()}, "
                f"shape={list(self.shape)})")


def is_mask(x: Any) -> bool:
    """Whether ``x`` is a converted bool mask (a ``BoolMask`` or a bool graph tensor)."""
    return isinstance(x, BoolMask) or (isinstance(x, Tensor) and x.dtype == "bool")


def _as_mask(x: Any, what: str) -> BoolMask:
    if isinstance(x, BoolMask):
        return x
    if isinstance(x, Tensor) and x.dtype == "bool":
        return BoolMask(x, x.shape)
    kind = x.dtype if isinstance(x, Tensor) else type(x).__name__
    raise UnsupportedOpError(f"{what} with a {kind} mask (a bool mask is needed)")


def _neg_inf(v: Any) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool) and float(v) == -math.inf


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(v.shape) if isinstance(v, Tensor) else ()


def select(mask: Any, a: Any, b: Any, what: str) -> Tensor:
    """``a`` where the bool ``mask`` holds, else ``b`` (tensors or numbers, broadcast as torch
    broadcasts ``torch.where``). A ``-inf`` may be either value: it becomes the third
    argument of ``em.where`` (the kept positions' mask is the complement where needed)."""
    m = _as_mask(mask, what)
    base, negated = m.base, m.negated
    if base.node.op is Op.NOT:  # where(not y, a, b) is where(y, b, a): no not is computed
        base, negated = Tensor(base.node.srcs[0], base.graph), not negated
    first, second = (b, a) if negated else (a, b)  # where(base, first, second)
    if _neg_inf(first):  # -inf where base holds: second where its logical not does
        out = where(logical_not(base), second, first)
    else:
        out = where(base, first, second)
    want = tuple(np.broadcast_shapes(m.shape, _shape(a), _shape(b)))
    return out if out.shape == want else out.reshape(want)


def _causal_offset(plane: torch.Tensor) -> int | None:
    """The offset ``o`` with ``plane[i, j] == (j <= i + o)`` for every element, or None."""
    rows, cols = plane.shape
    counts = plane.sum(dim=1).tolist()
    partial = [i for i, n in enumerate(counts) if 0 < n < cols]
    if partial:
        off = counts[partial[0]] - 1 - partial[0]
    else:
        off = cols - 1 if counts[0] == cols else -rows
    want = torch.ones(rows, cols, dtype=torch.bool, device=plane.device).tril(off)
    return off if torch.equal(plane, want) else None


def constant_mask(graph: Any, value: torch.Tensor, name: str, make_input: Any) -> BoolMask:
    """The ``BoolMask`` of the constant bool torch tensor ``value``: a causal mask built from
    positions (or its complement: nanoGPT's ``bias == 0``) when its last two axes are one
    and the axes before them have size 1; else a bool graph input named after ``name``,
    made by ``make_input(name, shape, "bool", ("const", value))``."""
    shape = tuple(int(d) for d in value.shape)
    if value.ndim >= 2 and all(d == 1 for d in shape[:-2]) and 0 not in shape:
        rows, cols = shape[-2:]
        plane = value.reshape(rows, cols)
        for negated, p in ((False, plane), (True, ~plane)):
            off = _causal_offset(p)
            if off is not None:
                try:
                    return BoolMask(graph.causal_mask(rows, cols, off), shape, negated)
                except MirageError:  # an offset the causal mask does not take
                    break
    return BoolMask(make_input(f"{name}_mask", shape, "bool", ("const", value.clone())), shape)


def source_value(source: tuple, fetch: Any) -> Any:
    """The tensor that feeds an input of source ``source``: ``("const", tensor)`` is the
    tensor, ``("inner", (source, part))`` the tensor ``part`` that the wrapper tensor (a
    quantized weight, ``frontend.quantized``) fed from ``source`` holds, and any other source
    what ``fetch(kind, ref)`` gives (an argument, a keyword argument, a parameter)."""
    kind, ref = source
    if kind == "const":
        return ref
    if kind == "inner":
        return getattr(source_value(ref[0], fetch), ref[1])
    return fetch(kind, ref)


class Snapshot:
    """A constant tensor folded into a program (a mask buffer) and the check that a tensor
    passed later still holds its value: the same storage and version counter (no in-place
    write since), or else equal elements."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.value = tensor.detach().clone()
        self._seen = self._key(tensor)

    @staticmethod
    def _key(t: torch.Tensor) -> tuple:
        return (t.data_ptr(), t._version, tuple(t.shape), t.dtype, t.device)

    def holds(self, tensor: Any) -> bool:
        """Whether ``tensor`` holds the folded value."""
        if not isinstance(tensor, torch.Tensor):
            return False
        key = self._key(tensor)
        if key == self._seen:
            return True
        if key[2:] != self._seen[2:] or not torch.equal(tensor.detach(), self.value):
            return False
        self._seen = key
        return True


# -- handlers: comparisons (folded when constant), negation, masked_fill, where ------------
def _mask_literal(name: str, args: tuple, kwargs: dict) -> Any:
    """``mask == 0``, ``mask == False`` (the complement), ``mask != 0``, ``mask == 1`` (the
    mask) of a bool mask and a 0/1 number, either side; None for any other comparison."""
    if name not in ("eq", "ne") or len(args) != 2 or kwargs:
        return None
    a, b = args if is_mask(args[0]) else args[::-1]
    if not is_mask(a) or not isinstance(b, Real) or float(b) not in (0.0, 1.0):
        return None
    return a if (float(b) == 1.0) == (name == "eq") else _complement(a)


_OPS = {"eq": Op.EQ, "ne": Op.NE, "lt": Op.LT, "le": Op.LE, "gt": Op.GT, "ge": Op.GE}
# torch's long names of the comparisons
_ALIASES = {"greater": "gt", "greater_equal": "ge", "less": "lt", "less_equal": "le",
            "not_equal": "ne"}


def _compare(name: str):
    """The handler of comparison ``name`` (``x.bool()``: ``x != 0``): of a bool mask and a
    0/1 number, the mask or its complement; of float tensors (computed, arguments, buffers)
    and numbers, or of integer tensors (positions) and numbers, the comparison op, a bool
    mask (``em.gt``, ...)."""
    def h(*args: Any, out: Any = None, **kwargs: Any) -> Any:
        if out is not None:
            raise UnsupportedOpError("out= is not supported")
        which = name
        if which == "bool" and len(args) == 1 and not kwargs:  # x != 0 (a mask: itself)
            which, args = "ne", (args[0], 0.0)
        m = _mask_literal(which, args, kwargs)
        if m is not None:
            return m
        kinds = {x.dtype in DTYPES for x in args if isinstance(x, Tensor)}  # float or int
        if len(args) == 2 and not kwargs and len(kinds) == 1 and all(
                isinstance(x, Real) and not isinstance(x, bool) or
                isinstance(x, Tensor) and x.dtype in DTYPES + INDEX_DTYPES for x in args):
            return apply(_OPS.get(which, Op.NE), *args)
        kinds = ", ".join(getattr(x, "dtype", type(x).__name__) for x in args)
        raise UnsupportedOpError(
            f"{name} of ({kinds}){' with keyword arguments' if kwargs else ''}: float tensors, "
            "integer tensors and numbers are compared, a float with an integer tensor only "
            "after a cast (a bool mask only with 0 or 1: mask == 0)")
    return h


def _complement(x: Any) -> Any:
    """``~x``: a bool graph tensor's logical not (``not not y`` is ``y``), or a ``BoolMask``
    with its ``negated`` flipped."""
    if isinstance(x, Tensor) and x.dtype == "bool":
        return Tensor(x.node.srcs[0], x.graph) if x.node.op is Op.NOT else logical_not(x)
    return ~_as_mask(x, "logical not")


def _invert(x: Any, *, out: Any = None) -> Any:
    if out is not None:
        raise UnsupportedOpError("out= is not supported")
    return _complement(x)


def _mask_tensor(m: BoolMask) -> Tensor:
    """The bool graph tensor of ``m``: its base, or the base's logical not when negated."""
    return _complement(m.base) if m.negated else m.base


_COMBINE = {Op.AND: logical_and, Op.OR: logical_or}


def combine(op: Op, a: Any, b: Any, what: str) -> Tensor:
    """``a & b`` (``op`` ``Op.AND``) or ``a | b`` (``Op.OR``) of two bool masks (graph bool
    tensors or ``BoolMask``s), of torch's broadcast shape; with a constant (a Python bool,
    as ``x.new_ones((), dtype=torch.bool)`` converts), ``True & m`` and ``False | m`` are
    ``m``; ``UnsupportedOpError`` naming ``what`` and the operands for anything else."""
    for const, other in ((a, b), (b, a)):
        if isinstance(const, bool) and is_mask(other) and const == (op is Op.AND):
            m = _as_mask(other, what)
            t = _mask_tensor(m)
            return t if t.shape == m.shape else t.reshape(m.shape)
    if not (is_mask(a) and is_mask(b)):
        kinds = " and ".join(f"{getattr(x, 'dtype', type(x).__name__)} "
                             f"{list(getattr(x, 'shape', ()))}" for x in (a, b))
        raise UnsupportedOpError(f"{what} of {kinds}: two bool masks are combined (a logical "
                                 "and / or); an int8/uint8 tensor takes & with an integer "
                                 "constant")
    ma, mb = _as_mask(a, what), _as_mask(b, what)
    out = _COMBINE[op](_mask_tensor(ma), _mask_tensor(mb))
    want = tuple(np.broadcast_shapes(ma.shape, mb.shape))
    return out if out.shape == want else out.reshape(want)


def _logical(op: Op, name: str):
    """The handler of ``name`` (``logical_and``, ``|``, ...): ``combine`` of two masks."""
    def h(a: Any, b: Any, *, out: Any = None) -> Tensor:
        if out is not None:
            raise UnsupportedOpError("out= is not supported")
        return combine(op, a, b, name)
    return h


def _masked_fill(x: Any, mask: Any, value: Any) -> Tensor:
    if not isinstance(x, Tensor):
        raise UnsupportedOpError(f"masked_fill of a {type(x).__name__} (expected a tensor)")
    if isinstance(value, Tensor) or isinstance(value, bool) or not isinstance(value, Real):
        raise UnsupportedOpError(f"masked_fill with a {type(value).__name__} value (a "
                                 "number is supported, -inf included)")
    v = float(value)
    if math.isnan(v) or v == math.inf:
        raise UnsupportedOpError(f"masked_fill with the value {v} (finite numbers and -inf "
                                 "are supported)")
    out = select(mask, v, x, "masked_fill")
    if out.shape != x.shape:
        raise UnsupportedOpError(f"masked_fill: a mask of shape {list(_as_mask(mask, '').shape)}"
                                 f" does not broadcast to the tensor's {list(x.shape)}")
    return out


def _where(condition: Any, input: Any, other: Any, *, out: Any = None) -> Tensor:  # noqa: A002
    if out is not None:
        raise UnsupportedOpError("out= is not supported")
    for v in (input, other):
        if not isinstance(v, (Tensor, Real)) or isinstance(v, bool) or (
                isinstance(v, Tensor) and v.dtype == "bool"):
            raise UnsupportedOpError(f"where with a {getattr(v, 'dtype', type(v).__name__)} "
                                     "value (float tensors and numbers are supported)")
        if isinstance(v, Real) and (math.isnan(float(v)) or float(v) == math.inf):
            raise UnsupportedOpError(f"where with the value {float(v)} (finite numbers and "
                                     "-inf are supported)")
    return select(condition, input, other, "where")


def _clamp(input: Any, min: Any = None, max: Any = None, *,  # noqa: A002
           out: Any = None) -> Tensor:
    """``torch.clamp``: ``where(x < min, min, x)``, then ``where(y > max, max, y)`` (so
    ``max`` wins where ``min > max``, and NaN stays NaN, as in torch). A bound is a finite
    number or a float tensor; a 0-dim one is cast to the input's dtype (torch's result
    dtype). T5's float16 overflow guard clamps by a 0-dim tensor."""
    if out is not None:
        raise UnsupportedOpError("out= is not supported")
    if not isinstance(input, Tensor) or input.dtype not in DTYPES:
        raise UnsupportedOpError(f"clamp of a {getattr(input, 'dtype', type(input).__name__)}"
                                 " value (a float tensor is supported)")
    if min is None and max is None:
        raise UnsupportedOpError("clamp without a bound")
    x = input
    for bound, op in ((min, Op.LT), (max, Op.GT)):
        if bound is None:
            continue
        if isinstance(bound, Tensor) and bound.dtype in DTYPES:
            bound = bound.astype(x.dtype) if not bound.shape and bound.dtype != x.dtype \
                else bound
        elif not isinstance(bound, Real) or isinstance(bound, bool) or \
                not math.isfinite(float(bound)):
            raise UnsupportedOpError(f"clamp with the bound {bound!r} (finite numbers and "
                                     "float tensors are supported)")
        else:
            bound = float(bound)
        x = where(apply(op, x, bound), bound, x)
    return x


def _clamp_min(x: Any, min: Any) -> Tensor:  # noqa: A002
    return _clamp(x, min=min)


def _clamp_max(x: Any, max: Any) -> Tensor:  # noqa: A002
    return _clamp(x, max=max)


_COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")
MASK_FUNCTIONS = {
    **{getattr(torch, n): _compare(n) for n in _COMPARISONS},
    **{getattr(torch, n): _compare(short) for n, short in _ALIASES.items()},
    **{getattr(operator, n): _compare(n) for n in _COMPARISONS},
    operator.invert: _invert, torch.logical_not: _invert,
    torch.bitwise_not: _invert, torch.where: _where, torch.masked_fill: _masked_fill,
    torch.clamp: _clamp, torch.clip: _clamp, torch.clamp_min: _clamp_min,
    torch.clamp_max: _clamp_max,
    torch.logical_and: _logical(Op.AND, "logical_and"),
    torch.logical_or: _logical(Op.OR, "logical_or"),
    # & of int8/uint8 tensors and a constant: torch_ops' bit ops, which call ``combine`` for
    # two masks; | has no integer form
    operator.or_: _logical(Op.OR, "|"), torch.bitwise_or: _logical(Op.OR, "bitwise_or"),
}
MASK_METHODS = {
    **{n: _compare(n) for n in _COMPARISONS},
    **{f"__{n}__": _compare(n) for n in _COMPARISONS},
    **{n: _compare(short) for n, short in _ALIASES.items()},
    "logical_not": _invert, "bitwise_not": _invert, "__invert__": _invert,
    "masked_fill": _masked_fill, "where": lambda x, cond, y: _where(cond, x, y),
    "bool": _compare("bool"), "clamp": _clamp, "clip": _clamp, "clamp_min": _clamp_min,
    "clamp_max": _clamp_max,
    "logical_and": MASK_FUNCTIONS[torch.logical_and],
    "logical_or": MASK_FUNCTIONS[torch.logical_or], "__or__": MASK_FUNCTIONS[operator.or_],
    "bitwise_or": MASK_FUNCTIONS[torch.bitwise_or],
}
