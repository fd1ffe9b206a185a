"""Every kernel-level op, declared once: the ``Op`` enum and one ``OpSpec`` per op.

A spec holds what every backend needs to know about its op: its group and
arity, its argument, its float (NumPy) semantics, its finite-field form, its
torch function, its Triton form, its egglog constructor and abstract
expression (the guard), its cost, what it does to padding and its value range.
The op groups (``UNARY``, ``OPAQUE``, ...) and each backend's table are derived
from the specs, so adding an op means adding its ``Op`` member and its spec
here, its constructor in rules/schema.egg, its front-end names and its tests
(docs/architecture.md, "Adding an op"); its per-op egglog rules (shapes, ``is-op``,
abstract expression, ``Dev``, ``Reg``) are generated from its spec (egraph/op_rules.py).

Ops with structural, op-specific logic (matmul, the reductions, exp's field
homomorphism, where/mask/causal, cast, the movement ops) keep a handler in the
backends that need one; their specs still hold every facet that is a plain fact.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

import numpy as np


class Op(Enum):
    """Every kernel-level op (``SPECS[op]`` says what it means). The order is fixed:
    the verifier draws each op's random-function keys in it, so a new op goes last."""

    INPUT = auto()
    CONST = auto()
    NEG = auto()
    EXP = auto()
    SQRT = auto()
    RSQRT = auto()
    SILU = auto()
    RELU = auto()
    ADD = auto()
    SUB = auto()
    MUL = auto()
    DIV = auto()
    MATMUL = auto()
    SUM = auto()
    MEAN = auto()
    TRANSPOSE = auto()
    RESHAPE = auto()
    CONCAT = auto()
    MAX = auto()
    WHERE = auto()
    MASK = auto()
    CAUSAL = auto()
    TANH = auto()
    ERF = auto()
    CAST = auto()
    SLICE = auto()
    COS = auto()
    SIN = auto()
    SIGMOID = auto()
    NOT = auto()
    GATHER = auto()
    GT = auto()
    GE = auto()
    LT = auto()
    LE = auto()
    EQ = auto()
    NE = auto()
    BITAND = auto()
    SHR = auto()
    AND = auto()
    OR = auto()
    TAKE_ALONG_AXIS = auto()


# What a padded (zero-filled) tensor holds where it is padded (family/padding.py).
ZERO, NEG_INF, FINITE, ANY = "0", "-inf", "finite", "any"

# "logic": elementwise ops on bool masks, a bool mask: of the operand's shape (logical not),
# or of the operands' broadcast shape (logical and, or)
# "gather": elements of a table picked along an axis by an integer index tensor (np.take:
# embedding, index_select; np.take_along_axis: torch.gather)
# "compare": a comparison of two float values (broadcast as binary ops are), a bool mask
GROUPS = ("leaf", "unary", "binary", "matmul", "reduce", "movement", "select", "mask",
          "logic", "gather", "compare")


@dataclass(frozen=True)
class Padding:
    """What an elementwise unary op does to a padding value: ``zero`` is the state of
    ``op(0)``, ``neg_inf`` of ``op(-inf)``, ``finite``: a finite value stays finite."""

    zero: str
    neg_inf: str = ANY
    finite: bool = True

    def after(self, state: str | None) -> str | None:
        """The padding's state after the op, given its state before (None: the operand
        has no dynamic axis)."""
        if state == ZERO:
            return self.zero
        if state == NEG_INF:
            return self.neg_inf
        return state if self.finite else ANY


@dataclass(frozen=True)
class OpSpec:
    """One op's facets. ``None`` where a facet does not apply to the op's group (a
    reduction has no Triton expression template) or a backend handles it by code."""

    op: Op
    group: str  # one of GROUPS
    arity: int | None  # operands; None: any number (concat)
    doc: str  # one line: what the op computes
    arg: str | None = None  # what ``Node.arg`` holds, None: no argument
    floats: Callable[..., Any] | None = None  # elementwise on float64 NumPy arrays
    # in float16/bfloat16/float32 (``em.evaluate``'s native dtypes): True: the operands as
    # stored, summed in a float32 accumulator, the result rounded once to the node's dtype
    # (torch on CPU and GPU, and the generated kernels); False: the exact result rounded
    accumulates: bool = False
    opaque: bool = False  # in the finite field: a random function of its argument
    field: str | None = None  # the exact field form: "neg", "add", "sub", "mul", "div", "not",
    # "and", "or"
    reciprocal_of: Op | None = None  # in the field: 1 / that opaque op's random function
    torch: str | None = None  # the torch function, a dotted name as generated source spells it
    symbol: str | None = None  # a binary op's infix operator (torch and Triton source; a
    # comparison's, a logical and's or or's on bool tensors and int1 tiles)
    triton: str | None = None  # a unary or logic op's Triton form: {x} the operand, exp(..)
    # emitted as exp2
    egglog: str | None = None  # the constructor in rules/schema.egg (its rules: egraph/op_rules.py)
    guard: str | None = None  # the abstract expression, {0} {1} the operands' (section 4.3)
    cost: tuple[int, int] = (1, 0)  # per element: CUDA-core FLOPs, SFU ops
    padding: Padding | None = None  # a unary op's effect on padding
    bounds: Callable[[float, float], tuple[float, float]] | None = None  # (max |x|, min x) ->
    positive: bool = False  # its argument must be positive (sqrt, rsqrt)
    mutants: tuple[Op, ...] = ()  # same-shape ops a mutation test swaps in for it

    @property
    def name(self) -> str:
        """The op's name as the API and listings spell it (``silu``)."""
        return self.op.name.lower()

    def torch_callable(self) -> Callable[..., Any]:
        """The torch function named by ``torch`` (imports torch)."""
        import importlib

        top, *path = self.torch.split(".")
        obj = importlib.import_module(top)
        for attr in path:
            obj = getattr(obj, attr)
        return obj


def _erf(x: Any) -> Any:
    from scipy.special import erf

    return erf(np.asarray(x, dtype=np.float64))  # scipy has no long-double erf


def _fn(name: str) -> str:
    return f'(AFn "{name}" {{0}})'


def _compare(op: Op, symbol: str, ufunc: str, mutant: Op) -> OpSpec:
    """The spec of comparison ``op`` (``a symbol b``; NumPy's ``ufunc``)."""
    fn = getattr(np, ufunc)
    name = op.name.lower()
    return OpSpec(op, "compare", 2, f"a {symbol} b, a bool mask (NumPy broadcasting)",
                  floats=lambda a, b: fn(a, b).astype(np.float64), torch=f"torch.{name}",
                  symbol=symbol, egglog=name.capitalize(),
                  guard=f'(AFn "{name}" (AAdd {{0}} {{1}}))', cost=(1, 0), mutants=(mutant,))


def bit_and(x: Any, mask: int) -> Any:
    """``x & mask`` of integer values held as floats (two's complement, as int8 holds them)."""
    return np.bitwise_and(np.asarray(x).astype(np.int64), int(mask)).astype(np.float64)


def shift_right(x: Any, shift: int) -> Any:
    """``x >> shift`` of integer values held as floats (arithmetic: floor(x / 2**shift))."""
    return np.right_shift(np.asarray(x).astype(np.int64), int(shift)).astype(np.float64)


BIT_OPS = (Op.BITAND, Op.SHR)  # integer ops with a constant argument: x & mask, x >> shift


_UNIT = (lambda m, lo: (1.0, -1.0))  # noqa: E731 - tanh, erf, cos, sin lie in [-1, 1]
_KEEP = Padding(ZERO)  # op(0) = 0 and finite stays finite

_ALL = [
    OpSpec(Op.INPUT, "leaf", 0, "a named program input", arg="its name", egglog="Input"),
    OpSpec(Op.CONST, "leaf", 0, "a float scalar, shape ()", arg="the value", egglog="Const",
           guard="(AConst)"),
    OpSpec(Op.NEG, "unary", 1, "-x", floats=lambda x: -x, field="neg", torch="torch.neg",
           triton="-{x}", egglog="Neg", guard="{0}", padding=Padding(ZERO, ANY),
           bounds=lambda m, lo: (m, -m)),
    OpSpec(Op.EXP, "unary", 1, "e**x (the field's homomorphism Z_q -> Z_p*)", floats=np.exp,
           torch="torch.exp", triton="exp({x})", egglog="Exp", guard="(AExp {0})",
           cost=(1, 1), padding=Padding(FINITE, ZERO, finite=False),
           bounds=lambda m, lo: (math.exp(min(m, 700)), math.exp(-min(m, 700))),
           mutants=(Op.SILU,)),
    OpSpec(Op.SQRT, "unary", 1, "the square root", floats=np.sqrt, opaque=True,
           torch="torch.sqrt", triton="tl.sqrt({x})", egglog="Sqrt", guard=_fn("sqrt"),
           cost=(1, 1), padding=Padding(ZERO, finite=False), positive=True,
           bounds=lambda m, lo: (math.sqrt(m), math.sqrt(max(lo, 0.0))), mutants=(Op.RSQRT,)),
    OpSpec(Op.RSQRT, "unary", 1, "1 / sqrt(x)", floats=lambda x: 1.0 / np.sqrt(x), opaque=True,
           reciprocal_of=Op.SQRT, torch="torch.rsqrt", triton="tl.rsqrt({x})", egglog="Rsqrt",
           guard=_fn("rsqrt"), cost=(1, 1), padding=Padding(ANY, finite=False), positive=True,
           bounds=lambda m, lo: (1 / math.sqrt(max(lo, 1e-12)), 1 / math.sqrt(m)),
           mutants=(Op.SQRT,)),
    OpSpec(Op.SILU, "unary", 1, "x * sigmoid(x)", floats=lambda x: x / (1.0 + np.exp(-x)),
           opaque=True, torch="torch.nn.functional.silu", triton="{x} / (1.0 + exp(-{x}))",
           egglog="Silu", guard=_fn("silu"), cost=(3, 2), padding=_KEEP,
           bounds=lambda m, lo: (m, -0.3), mutants=(Op.RELU,)),
    OpSpec(Op.RELU, "unary", 1, "max(x, 0)", floats=lambda x: np.maximum(x, 0.0), opaque=True,
           torch="torch.relu",  # NaN stays NaN, as in torch (tl.maximum alone gives 0)
           triton="tl.maximum({x}, 0.0, propagate_nan=tl.PropagateNan.ALL)", egglog="Relu",
           guard=_fn("relu"),
           padding=Padding(ZERO, ZERO), bounds=lambda m, lo: (m, max(lo, 0.0)),
           mutants=(Op.SILU,)),
    OpSpec(Op.ADD, "binary", 2, "a + b (NumPy broadcasting)", floats=np.add, field="add",
           torch="torch.add", symbol="+", egglog="Add", guard="(AAdd {0} {1})",
           mutants=(Op.SUB, Op.MUL)),
    OpSpec(Op.SUB, "binary", 2, "a - b", floats=np.subtract, field="sub", torch="torch.sub",
           symbol="-", egglog="Sub", guard="(AAdd {0} {1})", mutants=(Op.ADD,)),
    OpSpec(Op.MUL, "binary", 2, "a * b", floats=np.multiply, field="mul", torch="torch.mul",
           symbol="*", egglog="Mul", guard="(AMul {0} {1})", mutants=(Op.ADD, Op.DIV)),
    OpSpec(Op.DIV, "binary", 2, "a / b (in the field: times the inverse)", floats=np.divide,
           field="div", torch="torch.div", symbol="/", egglog="Div", guard="(ADiv {0} {1})",
           cost=(1, 1), mutants=(Op.MUL,)),
    OpSpec(Op.MATMUL, "matmul", 2, "NumPy matmul, batch dims broadcast", accumulates=True,
           torch="torch.matmul", egglog="MatMul", guard="(ASum (AMul {0} {1}))"),
    OpSpec(Op.SUM, "reduce", 1, "the sum over axes", arg="(axes, keepdims)", accumulates=True,
           torch="torch.sum", egglog="Sum", guard="(ASum {0})", mutants=(Op.MEAN,)),
    OpSpec(Op.MEAN, "reduce", 1, "the mean over axes", arg="(axes, keepdims)",
           accumulates=True, torch="torch.mean", egglog="Mean",
           guard="(ADiv (ASum {0}) (AConst))",
           mutants=(Op.SUM,)),
    OpSpec(Op.TRANSPOSE, "movement", 1, "a permutation of the axes", arg="the permutation",
           torch="torch.permute", egglog="Swap", guard="{0}"),
    OpSpec(Op.RESHAPE, "movement", 1, "the same elements in a new shape", arg="the new shape",
           torch="torch.reshape", egglog="Reshape", guard="{0}"),
    OpSpec(Op.CONCAT, "movement", None, "concatenation along an axis", arg="the axis",
           torch="torch.cat", egglog="Concat", guard="(ACat {0} {1})"),
    OpSpec(Op.MAX, "reduce", 1, "the largest element over axes (a keyed random function of "
           "its row in the field)", arg="(axes, keepdims)", torch="torch.amax", egglog="Max",
           guard=_fn("max")),
    OpSpec(Op.WHERE, "select", 3, "a where the bool mask cond holds, else b",
           floats=lambda c, a, b: np.where(c != 0, a, b), torch="torch.where", egglog="Where",
           guard='(AFn "where" (AAdd {0} (AAdd {1} {2})))'),
    OpSpec(Op.MASK, "select", 2, "x where the bool mask cond holds, else -inf",
           floats=lambda c, x: np.where(c != 0, x, -np.inf), torch="torch.where",
           egglog="Mask", guard='(AFn "mask" (AAdd {0} {1}))'),
    OpSpec(Op.CAUSAL, "mask", 0, "bool (rows, cols), True where col <= row + offset",
           arg="(rows, cols, offset)", torch="torch.tril", egglog="Causal",
           guard='(AVar "causal")'),
    OpSpec(Op.TANH, "unary", 1, "the hyperbolic tangent", floats=np.tanh, opaque=True,
           torch="torch.tanh",  # near 0 its series: 1 - 2 / (e^2x + 1) cancels there
           triton="tl.where(tl.abs({x}) < 0.05, {x} * (1.0 - {x} * {x} * (1.0 / 3.0 - {x} * {x}"
                  " * (2.0 / 15.0))), 1.0 - 2.0 / (exp(2.0 * {x}) + 1.0))", egglog="Tanh",
           guard=_fn("tanh"), cost=(4, 2), padding=_KEEP, bounds=_UNIT, mutants=(Op.ERF,)),
    OpSpec(Op.ERF, "unary", 1, "the error function", floats=_erf, opaque=True,
           torch="torch.erf", triton="tl.erf({x})", egglog="Erf", guard=_fn("erf"),
           cost=(8, 1), padding=_KEEP, bounds=_UNIT, mutants=(Op.TANH,)),
    OpSpec(Op.CAST, "unary", 1, "rounds to a dtype (the identity on exact values)",
           arg="the dtype name", floats=lambda x: x,  # the float backend rounds to the dtype
           torch="torch.Tensor.to", egglog="Cast",
           guard="{0}", padding=_KEEP),
    OpSpec(Op.SLICE, "movement", 1, "a static range of one axis", arg="(axis, start, stop)",
           torch="torch.narrow", egglog="Slice", guard=_fn("slice")),
    OpSpec(Op.COS, "unary", 1, "the cosine", floats=np.cos, opaque=True, torch="torch.cos",
           triton="tl.cos({x})", egglog="Cos", guard=_fn("cos"), cost=(2, 1),
           padding=Padding(FINITE), bounds=_UNIT, mutants=(Op.SIN,)),
    OpSpec(Op.SIN, "unary", 1, "the sine", floats=np.sin, opaque=True, torch="torch.sin",
           triton="tl.sin({x})", egglog="Sin", guard=_fn("sin"), cost=(2, 1), padding=_KEEP,
           bounds=_UNIT, mutants=(Op.COS,)),
    OpSpec(Op.SIGMOID, "unary", 1, "1 / (1 + e**-x)", floats=lambda x: 1.0 / (1.0 + np.exp(-x)),
           opaque=True, torch="torch.sigmoid", triton="1.0 / (1.0 + exp(-{x}))",
           egglog="Sigmoid", guard=_fn("sigmoid"), cost=(2, 2),
           padding=Padding(FINITE, ZERO), bounds=lambda m, lo: (1.0, 0.0),
           mutants=(Op.SILU,)),
    # a bool mask's complement: masked_fill(m, -inf) keeps x where m does not hold, i.e.
    # mask(not m, x). Masks are 0/1 in the float semantics and any residue c in the field
    # (a bool input is drawn uniform there): 1 - c, the polynomial that is not on {0, 1}
    OpSpec(Op.NOT, "logic", 1, "the logical not of a bool mask",
           floats=lambda c: (np.asarray(c) == 0).astype(np.float64), field="not",
           torch="torch.logical_not", triton="({x} == 0)", egglog="Not",
           guard=_fn("not"), cost=(1, 0)),
    # np.take(table, idx, axis): the table's slices along ``axis`` picked by an int32/int64
    # index tensor, whose shape takes the axis's place (embedding: axis 0 of a 2-D table;
    # index_select: a 1-D index). Linear in the table: the field gathers its residues by the
    # indices, drawn as plain integers in [0, rows) (docs/verifier.md). An index out of range
    # raises in every backend, as torch does. The guard is the table's: a gather of exp(T)
    # is exp of the gather (as a view's)
    OpSpec(Op.GATHER, "gather", 2, "the table's slices along an axis at integer indices",
           arg="the axis", floats=None, torch="torch.index_select", egglog="Gather",
           guard="{0}", cost=(0, 0), mutants=()),
    # comparisons of float values, a bool mask (NumPy broadcasting): 0/1 in the float
    # semantics; in the field a keyed random function of a - b into {0, 1}, one per op
    # (docs/verifier.md, "Comparisons"), so any rewrite that keeps a - b keeps the mask
    *(_compare(op, sym, name, mutant) for op, sym, name, mutant in (
        (Op.GT, ">", "greater", Op.GE), (Op.GE, ">=", "greater_equal", Op.GT),
        (Op.LT, "<", "less", Op.LE), (Op.LE, "<=", "less_equal", Op.LT),
        (Op.EQ, "==", "equal", Op.NE), (Op.NE, "!=", "not_equal", Op.EQ))),
    # bit ops on int8/uint8 values with a constant (packed int4 weights: x & 0xF, x >> 4);
    # the result keeps the operand's integer dtype and, like it, is read only through a cast,
    # a view or another bit op. In the field x & 15 is a keyed random function lo(x) and
    # x >> 4 is (x - lo(x)) / 16, so that lo + 16 * hi == x holds; other masks and shifts
    # are keyed random functions of x of their own (docs/verifier.md, "Integer inputs")
    OpSpec(Op.BITAND, "unary", 1, "x & mask, an int8/uint8 tensor and a constant mask",
           arg="the mask (an integer of the dtype's range)", floats=bit_and,
           torch="torch.bitwise_and", symbol="&", triton="{x} & {arg}", egglog="BitAnd",
           guard=_fn("bitand"), padding=_KEEP, bounds=lambda m, lo: (m, 0.0)),
    OpSpec(Op.SHR, "unary", 1, "x >> shift (arithmetic on int8), a constant shift in [0, 7]",
           arg="the shift", floats=shift_right, torch="torch.bitwise_right_shift",
           symbol=">>", triton="{x} >> {arg}", egglog="Shr", guard=_fn("shr"), padding=_KEEP,
           bounds=lambda m, lo: (m, min(lo, 0.0))),
    # the logical and / or of two bool masks (NumPy broadcasting), a bool mask (attention
    # masks combined: padding & causal, transformers' and_masks / or_masks). 0/1 in the
    # float semantics; in the field a * b and a + b - a * b, the polynomials that are and /
    # or on {0, 1} (multilinear: a comparison's bit and a causal mask are 0/1, a bool input
    # is a uniform residue), so De Morgan's laws and commutativity hold as polynomials and
    # an and swapped for an or is refused; identities that need m * m = m (m & m is m) are
    # refused (incomplete, not unsound)
    OpSpec(Op.AND, "logic", 2, "a and b of two bool masks, a bool mask (NumPy broadcasting)",
           floats=lambda a, b: np.logical_and(np.asarray(a) != 0, np.asarray(b) != 0).astype(
               np.float64), field="and", torch="torch.logical_and", symbol="&", egglog="And",
           guard='(AFn "and" (AAdd {0} {1}))', cost=(1, 0), mutants=(Op.OR,)),
    OpSpec(Op.OR, "logic", 2, "a or b of two bool masks, a bool mask (NumPy broadcasting)",
           floats=lambda a, b: np.logical_or(np.asarray(a) != 0, np.asarray(b) != 0).astype(
               np.float64), field="or", torch="torch.logical_or", symbol="|", egglog="Or",
           guard='(AFn "or" (AAdd {0} {1}))', cost=(1, 0), mutants=(Op.AND,)),
    # np.take_along_axis(table, idx, axis) (torch.gather(table, axis, idx)): an index tensor
    # of the table's rank and sizes but along ``axis`` picks, for each of its elements, the
    # table's element at that index along the axis (out[i][j][k] = T[i][idx[i][j][k]][k] for
    # axis 1); the result has the index's shape. Like GATHER linear in the table (the field
    # takes its residues at the plain integer indices), checked in every backend, a library
    # kernel of its own (torch.gather), and its guard is the table's
    OpSpec(Op.TAKE_ALONG_AXIS, "gather", 2, "the table's elements along an axis at an index "
           "tensor of its rank (np.take_along_axis, torch.gather)", arg="the axis",
           floats=None, torch="torch.gather", egglog="TakeAlongAxis", guard="{0}",
           cost=(0, 0), mutants=()),
]

SPECS: dict[Op, OpSpec] = {s.op: s for s in _ALL}


def spec(op: Op) -> OpSpec:
    """The spec of ``op``."""
    return SPECS[op]


def ops_in(group: str) -> frozenset[Op]:
    """Every op of ``group`` (one of ``GROUPS``)."""
    return frozenset(s.op for s in _ALL if s.group == group)


LEAF = ops_in("leaf")
UNARY = ops_in("unary")
BINARY = ops_in("binary")
ELEMENTWISE = UNARY | BINARY
COMPARE = ops_in("compare")  # float, float -> a bool mask (gt, ge, lt, le, eq, ne)
LOGIC = ops_in("logic")  # bool masks -> a bool mask, elementwise: not, and, or
REDUCE = ops_in("reduce")
MOVEMENT = ops_in("movement")
# Movement of one operand: its values rearranged in its dtype, nothing computed (a view).
VIEWS = frozenset(s.op for s in _ALL if s.group == "movement" and s.arity == 1)
# Ops whose float result is NaN everywhere where one operand is NaN everywhere (IEEE NaN
# propagates through arithmetic, NumPy's max and sums, and views; a select or a concat may
# take its values from another operand): the float interpreter does not compute them then.
# (The bit ops read integer values, never NaN.)
NAN_STRICT = (UNARY - frozenset(BIT_OPS)) | BINARY | REDUCE | VIEWS | {Op.MATMUL}
# Functions outside the Lax algebra: the verifier models them as random functions.
OPAQUE = frozenset(s.op for s in _ALL if s.opaque)
# Ops whose field value is a random function keyed on the operand's Z_p part: the opaque
# functions (per element), max (per row: any consistent value, see docs/verifier.md) and
# the comparisons (a random bit keyed on a - b) and the bit ops (a nibble keyed on x).
KEYED = OPAQUE | {Op.MAX} | COMPARE | frozenset(BIT_OPS)  # bit ops: keyed on x (nibbles)
ARITY = {s.op: s.arity for s in _ALL}
# the logic ops of two bool masks (and, or): broadcast as the binary ops are
LOGIC_BINARY = frozenset(op for op in LOGIC if ARITY[op] == 2)
GATHERS = ops_in("gather")  # integer-indexed reads of a table (embedding, index_select,
# take_along_axis)
