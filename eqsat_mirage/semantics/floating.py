"""Float semantics: one table, used by ``em.evaluate`` (float64 or native dtypes)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.node import (
    BIT_OPS,
    CODED_DTYPES,
    FP8_DTYPES,
    INDEX_DTYPES,
    QUANT_DTYPES,
    QUANT_RANGE,
    Node,
    Op,
    slice_index,
)
from ..ir.ops import NAN_STRICT, SPECS, VIEWS
from .coded import Coded, CodedValue, coded_op, coded_sums
from .fp8 import round_fp8
from .gather import checked_indices, take
from .gemm import matmul as gemm
from .half import round_half
from .interp import Later, check_inputs, check_values, made, run


def uniform(x: Any) -> bool:
    """True for a value that is one number everywhere: a scalar, or a broadcast of one value
    (every stride 0). The float checks' constant draws are such views; ops on them stay so."""
    return np.ndim(x) == 0 or (isinstance(x, np.ndarray) and x.size > 0 and not any(x.strides))


def _one(x: Any) -> Any:
    """The value of a ``uniform`` array, as a 0-d array."""
    return np.asarray(x).reshape(-1)[:1].reshape(())


def _spread(value: Any, shape: tuple[int, ...]) -> Any:
    """``value`` (0-d) as a read-only broadcast of ``shape`` (no memory per element)."""
    if not shape:
        return value
    one = np.asarray(value).reshape(1)  # a read-only view with every stride 0, made
    out = np.ndarray(shape, one.dtype, one, 0, (0,) * len(shape))  # directly: half the
    out.flags.writeable = False  # time of np.broadcast_to (4 against 8 us; a bisection
    return out  # evaluates a layer's uniform nodes thousands of times)


def as_float64(x: Any) -> np.ndarray:
    """``x`` as float64; a broadcast of one value (``uniform``) stays one (the peak draws'
    outputs: one value, not a copy per element)."""
    if isinstance(x, np.ndarray) and x.ndim and x.dtype != np.float64 and uniform(x):
        return _spread(np.asarray(_one(x), dtype=np.float64), x.shape)
    return np.asarray(x, dtype=np.float64)


# float dtypes that hold every int8 and uint8 value exactly (8 significant bits or more): a
# cast to one from such a tensor rounds nothing (``FloatCtx.fix``: a quantized weight's
# dequantization, tile by tile in a kernel, skips a rounding pass over the weight)
_HOLDS_BYTES = ("float16", "bfloat16", "float32")


def round_to(x: np.ndarray, dtype: str | None) -> np.ndarray:
    """Round ``x`` to ``dtype`` (float16, bfloat16, float32), or leave it (None).
    A broadcast of one value is rounded once and stays a broadcast."""
    if dtype is None:
        return x
    if np.ndim(x) and uniform(x):
        return _spread(round_to(_one(x), dtype), np.shape(x))
    if dtype == "bool":  # a mask: 1.0 where it holds, else 0.0
        return (np.asarray(x) != 0).astype(np.float32)
    if dtype in INDEX_DTYPES:  # integer indices: exact in float64, never rounded
        return np.asarray(x, dtype=np.float64)
    if dtype in QUANT_DTYPES:
        return wrap_int(x, dtype)
    if dtype in FP8_DTYPES:  # fp8 values (inputs, moved): exact, rounded to no other dtype
        return round_fp8(x, dtype)
    if dtype == "float16":
        return round_half(x)
    if dtype == "bfloat16":
        u = np.asarray(x, dtype=np.float32).view(np.uint32)
        u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
        return u.view(np.float32)
    return np.asarray(x, dtype=np.float32)


def wrap_int(x: np.ndarray, dtype: str) -> np.ndarray:
    """Integer values ``x`` as ``dtype`` (int8 or uint8) holds them, exact in float64:
    wrapped modulo 256 into its range, as a cast between integer dtypes does (int8 -1 is
    uint8 255); a value of the range stays."""
    lo, hi = QUANT_RANGE[dtype]
    x = np.asarray(x, dtype=np.float64)
    if x.size and not uniform(x) and lo <= np.min(x) and np.max(x) <= hi:  # (NaN: False)
        return x  # values of the range (a draw, an input) stay: no pass of ``np.mod``
    return np.mod(x - lo, hi - lo + 1) + lo


def draw_ints(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Integer values of ``dtype``'s range (int8 or uint8) of ``shape``, as float32: uniform,
    with both ends of the range and 0 at random positions and, where the tensor has room,
    every value of the range once (where a wrong sign, offset or wrap-around shows)."""
    lo, hi = QUANT_RANGE[dtype]
    out = rng.integers(lo, hi + 1, size=shape).astype(np.float32)
    flat = out.reshape(-1)
    rest = np.array([v for v in rng.permutation(np.arange(lo, hi + 1)) if v not in (lo, hi, 0)])
    head = np.concatenate([np.unique([lo, hi, 0])[::-1], rest])[:flat.size]
    flat[rng.permutation(flat.size)[:head.size]] = head
    return out


_BITS = {"float16": (np.float16, np.uint16, 0), "bfloat16": (np.float32, np.uint32, 16),
         "float32": (np.float32, np.uint32, 0)}  # storage type, its bits, bits below the dtype


def neighbour(x: np.ndarray, dtype: str, away: np.ndarray) -> np.ndarray:
    """Each value of ``x`` (already a value of ``dtype``) moved by one unit in the last place
    of ``dtype``: away from zero where ``away`` holds, else towards it (0 and the largest
    finite value move the one way they can; inf and nan stay). A float32 array."""
    if dtype not in _BITS:
        raise ValueError(f"neighbour: no unit in the last place for dtype {dtype!r}")
    store, ut, low = _BITS[dtype]
    x = np.asarray(x, dtype=np.float32)
    bits = x.astype(store).view(ut)
    mag = bits & ut(np.iinfo(ut).max >> 1)  # the sign bit cleared
    top = (np.asarray(np.finfo(np.float16).max if dtype == "float16" else np.finfo(
        np.float32).max, dtype=store).view(ut) >> low) << low
    up = (np.asarray(away, dtype=bool) | (mag == 0)) & (mag != top)
    step = ut(1 << low)
    moved = np.where(up, bits + step, bits - step).astype(ut).view(store).astype(np.float32)
    return np.where(np.isfinite(x), moved, x)


@dataclass
class FloatCtx:
    """Per-run state of the float interpreter."""

    inputs: Mapping[str, np.ndarray]
    mode: str | None  # None: float64 throughout; "native": each node's dtype; else a dtype
    rounded: bool = False  # the inputs already hold values of their dtypes (used as given)
    coded: Coded | None = None  # arrays known as a table of few values and their codes
    exact: bool = False  # accumulations exact (float64), rounded once: ``evaluate``'s "exact"
    # nodes whose values stay exact (float64, not rounded): a kernel loop's partial sums and
    # their accumulation under ``exact``, rounded once after the loop (``mugraph.tiled``)
    unrounded: frozenset = frozenset()

    def fix(self, node: Node, value: Any) -> np.ndarray:
        """Apply the precision policy to a node's result."""
        if node.dtype in QUANT_DTYPES:  # integer values (an input, a wrapping cast): exact
            return wrap_int(value, node.dtype)
        if node.dtype in FP8_DTYPES:  # fp8 values (an input, moved): exact in every dtype
            return np.asarray(value, dtype=np.float64)
        if self.mode is None or node.dtype in INDEX_DTYPES or id(node) in self.unrounded:
            return as_float64(value)  # (indices: exact integers)
        if node.op is Op.CAST and node.srcs[0].dtype in QUANT_DTYPES and \
                node.dtype in _HOLDS_BYTES and not (np.ndim(value) and uniform(value)):
            return np.asarray(value, dtype=np.float32)  # every int8 / uint8 value is exact
        if node.op is Op.CAST and self.mode != "native":  # a cast rounds whatever the mode
            value = round_to(value, node.arg)  # (a MuGraph's tiles: float32 registers, as
        return round_to(value, node.dtype if self.mode == "native" else self.mode)  # codegen)


def accumulator(ctx: FloatCtx, n: Node) -> type:
    """The accumulator of node ``n``: float64 for the reference (``mode`` None); in a float
    dtype, float32 for the ops whose spec ``accumulates`` (matmul, sum, mean: operands as
    stored, a float32 accumulator, the result rounded once, as torch and GPUs compute
    them), unless ``ctx.exact``; else float64 (the exact result, rounded once)."""
    return np.float32 if ctx.mode is not None and not ctx.exact and SPECS[n.op].accumulates \
        else np.float64


def _sum(ctx, n, x):
    return ctx.fix(n, np.sum(x, axis=n.arg[0], keepdims=n.arg[1], dtype=accumulator(ctx, n)))


def _max(ctx, n, x):
    return ctx.fix(n, np.max(x, axis=n.arg[0], keepdims=n.arg[1]))


def _mean(ctx, n, x):
    return ctx.fix(n, np.mean(x, axis=n.arg[0], keepdims=n.arg[1], dtype=accumulator(ctx, n)))


def _matmul(ctx, n, a, b):
    acc = accumulator(ctx, n)
    a, b = np.asarray(a).astype(acc, copy=False), np.asarray(b).astype(acc, copy=False)
    # one GEMM where an operand is broadcast over the batch (the tiled interpreter's
    # products, in float64 or its float32 tiles); a Graph's own dtypes keep NumPy's
    # batching, which rounds bit for bit as eager torch does
    return ctx.fix(n, np.matmul(a, b) if ctx.mode == "native" else gemm(a, b))


def _elementwise(fn):
    """An elementwise entry; on ``uniform`` operands it computes one element and broadcasts;
    on a ``Coded`` array and one-value operands, on its table (``_coded``)."""
    def apply(ctx, n, *xs):
        if all(uniform(x) for x in xs) and any(np.ndim(x) for x in xs):
            shape = np.broadcast_shapes(*(np.shape(x) for x in xs))
            return _spread(ctx.fix(n, fn(*(_one(x) for x in xs))), shape)
        value = _coded(ctx, n, fn, xs)
        return ctx.fix(n, fn(*(made(x) for x in xs))) if value is None else value
    return apply


def _coded(ctx, n, fn, xs) -> CodedValue | None:
    """``coded.coded_op``: an elementwise op on a weight known as a table and codes."""
    return coded_op(ctx, n, fn, xs, uniform, _one)


def _uniform_reduce(fn, scaled: bool):
    """SUM (``scaled``: count times the value) or MEAN, one element on a uniform operand."""
    def apply(ctx, n, x):
        if np.ndim(x) and uniform(x):
            count = np.prod([np.shape(x)[a] for a in n.arg[0]])
            one = _one(x).astype(np.float64) * (count if scaled else 1)
            return _spread(ctx.fix(n, one), n.shape)
        return fn(ctx, n, x)
    return apply


def _times_nonfinite(x: np.ndarray, c: float, axis: int) -> np.ndarray:
    """The sum over ``axis`` of ``x * c`` for ``c`` inf or nan, as IEEE arithmetic gives it
    in any order: nan where a term is nan (``c`` nan, a zero or a nan in ``x``) or where
    terms of both signs meet (inf - inf), else inf of the terms' sign."""
    with np.errstate(invalid="ignore"):
        bad = np.isnan(c) | np.any((x == 0) | np.isnan(x), axis=axis, keepdims=True)
        pos = np.any(x > 0, axis=axis, keepdims=True)
        neg = np.any(x < 0, axis=axis, keepdims=True)
    sign = 1.0 if np.isnan(c) else float(np.sign(c))
    return np.where(bad | (pos & neg), np.nan, np.where(pos, sign * np.inf, -sign * np.inf))


def _uniform_matmul(ctx, n, a, b):
    """MATMUL; with an operand that is one value ``c`` (``uniform``: the float checks'
    constant and peak draws), ``c`` times the other's sums over the contraction, in the
    accumulator's dtype: the same sum in another order, without a GEMM that NumPy runs on a
    broadcast weight at a third of BLAS's rate (0.21 against 0.08 s for a 7B MLP's
    (128, 4096) @ (4096, 11008) in float32). Where ``c`` is inf or nan (a float16 draw at
    the headroom) every term is inf or nan: ``_times_nonfinite`` (a zero or a sign change
    in the other operand makes the GEMM's sum nan, where ``c`` times the sums would be
    inf). Not where a term or a
    partial sum could overflow the accumulator (``[[3e38, -3e38]] @ 4``: nan as a GEMM,
    0 as a sum first), which the largest |term| times the length rules out."""
    if isinstance(a, CodedValue) or isinstance(b, CodedValue):
        summed = _coded_matmul(ctx, n, a, b)
        if summed is not None:
            return summed
        a, b = made(a), made(b)
    if uniform(a) and uniform(b) and np.ndim(a) and np.ndim(b):
        one = _one(a).astype(np.float64) * _one(b).astype(np.float64) * np.shape(a)[-1]
        return _spread(ctx.fix(n, one), n.shape)
    if np.ndim(a) >= 2 and np.ndim(b) >= 2 and (uniform(a) or uniform(b)):
        acc = accumulator(ctx, n)
        c, other = (_one(b), a) if uniform(b) else (_one(a), b)
        c = c.astype(acc)
        axis = -1 if other is a else -2
        if not np.isfinite(c):  # every term inf or nan: the sum IEEE gives in any order
            return ctx.fix(n, np.ascontiguousarray(np.broadcast_to(
                _times_nonfinite(np.asarray(other), float(c), axis).astype(acc), n.shape)))
        with np.errstate(over="ignore", invalid="ignore"):
            top = float(np.max(np.abs(other), initial=0.0)) * abs(float(c)) * a.shape[-1]
        if top < float(np.finfo(acc).max):  # no term nor partial sum overflows, in any order
            sums = np.sum(np.asarray(other), axis=axis, keepdims=True, dtype=acc) * c
            return ctx.fix(n, np.ascontiguousarray(np.broadcast_to(sums, n.shape)))
    return _matmul(ctx, n, a, b)


def _coded_matmul(ctx, n, a, b):
    """``_uniform_matmul`` of one value ``c`` and a ``CodedValue`` (a weight's
    dequantization in a bisection's draw, every float input one value), from its table
    and each code's count along the contraction (``coded.coded_sums``), without looking
    the weight up: where no term nor partial sum of finite terms overflows (the largest
    finite |term| times the length, as there), ``c`` times the finite terms' sums, added
    in float64 and rounded once to the accumulator (the elements' sum in another order, as
    ``_uniform_matmul``'s own is the GEMM's); where a term is not finite (an inf or NaN
    element, ``c`` inf or NaN), the value IEEE gives it in any order: NaN where a term is
    NaN (a NaN element or ``c``, 0 times inf) or infs of both signs meet, else the infs'
    sign. None where this does not apply (the caller looks the weight up)."""
    if np.ndim(a) < 2 or np.ndim(b) < 2 or ctx.coded is None:
        return None
    if isinstance(b, CodedValue) and uniform(a):
        c, other, axis = _one(a), b, -2
    elif isinstance(a, CodedValue) and uniform(b):
        c, other, axis = _one(b), a, -1
    else:
        return None
    acc = accumulator(ctx, n)
    c = c.astype(acc)
    got = coded_sums(other, axis, ctx.coded)
    if got is None:
        return None
    cf = float(c)
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(cf):
            if not got.top * abs(cf) * np.shape(a)[-1] < float(np.finfo(acc).max):
                return None
            # multiplied in float64, rounded once (the sums alone may pass the
            # accumulator's largest where c < 1 brings them back)
            value = (np.asarray(got.sums, dtype=np.float64) * cf).astype(acc)
            # the terms c * element of the non-finite elements (c finite)
            nan = got.nan | (got.posinf & got.neginf) | ((got.posinf | got.neginf) & (cf == 0))
            inf = got.posinf | got.neginf
            sign = np.where(got.posinf, 1.0, -1.0) * (1.0 if cf > 0 else -1.0)
        else:  # every term c * element: nan where c or an element is nan or an element 0
            pos = got.has(lambda t: t > 0)
            nan = got.has(lambda t: t == 0) | got.nan | (pos & got.has(lambda t: t < 0)) | \
                bool(np.isnan(cf))
            inf = ~nan
            sign = np.where(pos, 1.0, -1.0) * (1.0 if cf > 0 else -1.0)
            value = np.zeros(got.sums.shape, dtype=acc)
        if inf.any() or nan.any():
            value = np.where(nan, np.nan, np.where(inf, sign * np.inf, value)).astype(acc)
    return ctx.fix(n, np.ascontiguousarray(np.broadcast_to(value, n.shape)))


def _input(ctx, n):
    """INPUT: as given where the inputs are rounded, else ``fix``ed; an int8 or fp8 input
    known as a table and codes (``ctx.coded``) then a ``CodedValue`` of its table fixed
    (the same values, each element's the table's: no pass over the weight)."""
    x = ctx.inputs[n.arg]
    if ctx.rounded:
        return x
    if ctx.coded is not None and n.dtype in CODED_DTYPES:
        found = ctx.coded.get(x)
        if found is not None:
            codes, table = found
            table = np.asarray(ctx.fix(n, table))
            if table.ndim == 1:
                table = table.reshape(table.shape + (1,) * codes.ndim)
            return CodedValue(codes, table, ctx.coded)
    return ctx.fix(n, x)


def _transpose(ctx, n, x):
    """TRANSPOSE; a ``CodedValue`` stays one (its codes and table transposed)."""
    if isinstance(x, CodedValue):
        return x.transposed(n.arg)
    return np.transpose(x, n.arg)


# Every op with an elementwise float form (its spec's ``floats``) is derived from it; the
# rest are handled here.
FLOAT_SEMANTICS = {
    **{op: _elementwise(s.floats) for op, s in SPECS.items() if s.floats is not None},
    Op.INPUT: lambda ctx, n: _input(ctx, n),
    Op.CONST: lambda ctx, n: np.float64(n.arg),
    Op.MATMUL: _uniform_matmul,
    Op.SUM: _uniform_reduce(_sum, scaled=True),
    Op.MEAN: _uniform_reduce(_mean, scaled=False),
    Op.MAX: _uniform_reduce(_max, scaled=False),
    Op.CAUSAL: lambda ctx, n: np.tri(n.arg[0], n.arg[1], n.arg[2], dtype=np.float64),
    Op.TRANSPOSE: _transpose,
    Op.RESHAPE: lambda ctx, n, x: np.reshape(x, n.arg),
    Op.CONCAT: lambda ctx, n, *xs: np.concatenate(xs, axis=n.arg),
    Op.SLICE: lambda ctx, n, x: x[slice_index(n.arg)],
    Op.GATHER: lambda ctx, n, x, i: _gather(ctx, n, x, i),
    Op.TAKE_ALONG_AXIS: lambda ctx, n, x, i: _gather(ctx, n, x, i),
    # x & mask, x >> shift of integer values (exact; the spec's function takes the constant)
    **{op: (lambda f: lambda ctx, n, x: ctx.fix(n, f(x, n.arg)))(SPECS[op].floats)
       for op in BIT_OPS},
}


def _gather(ctx, n, x, i):
    """GATHER, TAKE_ALONG_AXIS: the table's slices (its elements along the axis) at the
    (checked) indices; one value stays one."""
    if np.ndim(x) and uniform(x):
        checked_indices(i, n.srcs[0].shape[n.arg], n)
        return _spread(_one(x), n.shape)
    return take(x, i, n)


def _all_nan(x: Any) -> bool:
    """Whether ``x`` is NaN everywhere: one element looked at unless that one is NaN (a
    ``CodedValue``: its table)."""
    if isinstance(x, CodedValue):
        return x.all_nan()
    x = np.asarray(x)
    if not x.size or x.dtype.kind != "f" or not np.isnan(x.item(0)):
        return False
    return uniform(x) or bool(np.isnan(x).all())


_DEFERRED = VIEWS | {Op.CAST}  # one operand's values, rearranged or cast: nothing summed


def _nan_strict(fn):
    """``fn`` (an op of ``NAN_STRICT``), not computed where an operand is NaN everywhere:
    its value is then NaN everywhere (a float16 draw at the headroom, whose first matmul
    over an inf input is all NaN: the rest of a 7B layer, its attention and MLP). Operands
    that are inputs not yet read (``interp.Later``) are read only when the others do not
    decide it, and a view or cast of an unread input is computed where it is read: a draw
    made as it is read then makes no weight of what is all NaN."""
    def nan(n, xs, check) -> bool:
        return any(_all_nan(xs[i]) for i in check) or (
            n.op is Op.MATMUL and 0 in check and _rows_nan(xs[0]))

    takes = _TAKES_CODED  # the ops that read a ``CodedValue`` as it is

    def settled(op, x):
        """``x`` made, a ``CodedValue`` left as it is for an op that reads it so."""
        while isinstance(x, Later) and not (op in takes and isinstance(x, CodedValue)):
            x = x.value()
        return x

    def apply(ctx, n, *xs):
        later = [i for i, x in enumerate(xs)
                 if isinstance(x, Later) and not isinstance(x, CodedValue)]
        if later and n.op in _DEFERRED:  # a view or cast of an unread input (a weight's
            return Later(lambda: apply(ctx, n, settled(n.op, xs[0])))  # transpose): where read
        if nan(n, xs, [i for i in range(len(xs)) if i not in later]):
            return np.broadcast_to(np.float64(np.nan), n.shape)
        xs = tuple(settled(n.op, x) for x in xs)
        if later and nan(n, xs, later):
            return np.broadcast_to(np.float64(np.nan), n.shape)
        return fn(ctx, n, *xs)

    apply.lazy_args = True
    return apply


# elementwise ops (``_coded``), a matmul (``_coded_matmul``) and a transpose
_TAKES_CODED = frozenset(op for op, s in SPECS.items() if s.floats is not None) | {
    Op.MATMUL, Op.TRANSPOSE}


def _rows_nan(a: Any) -> bool:
    """Whether every row of a matmul's left operand holds a NaN (then every sum of the
    product has a NaN term): a float16 layer's RMSNorm at the headroom, NaN wherever its
    input overflowed, before the projections. One pass over ``a``, beside the GEMM's."""
    if isinstance(a, CodedValue):  # (NaN where its table is NaN everywhere: ``_all_nan``)
        return False
    a = np.asarray(a)
    if a.ndim < 2 or not a.size or a.dtype.kind != "f" or uniform(a):
        return False
    with np.errstate(invalid="ignore"):
        return bool(np.isnan(a).any(axis=-1).all())


# ``evaluate``'s table: FLOAT_SEMANTICS, NaN-strict ops not computed on an all-NaN operand
_EVALUATE = {op: _nan_strict(fn) if op in NAN_STRICT else fn for op, fn in FLOAT_SEMANTICS.items()}


def rounded_inputs(program, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``inputs`` rounded once to each input's dtype (float32 arrays), for ``rounded=True``.

    A read-only broadcast of one value (the verifier's constant draws) stays a
    broadcast of the rounded value, so it costs no memory.
    """
    out = {}
    for name, node in program.inputs.items():
        x = np.asarray(inputs[name])
        if x.ndim and x.strides and all(st == 0 for st in x.strides):
            out[name] = np.broadcast_to(round_to(x.reshape(-1)[:1], node.dtype)[0], x.shape)
        else:
            out[name] = round_to(x, node.dtype)
    return out


def evaluate(program, inputs: Mapping[str, Any], dtype: str | None = None,
             rounded: bool = False) -> dict[str, np.ndarray]:
    """Run ``program`` on ``inputs`` (a dict name -> array) and return its outputs.

    ``dtype=None`` computes in float64 (the reference). ``dtype="native"``
    rounds every node to its own dtype (fp32 accumulation in matmuls, as a GPU
    does); ``dtype="exact"`` rounds every node to its own dtype too, each matmul, sum and
    mean computed exactly (in float64) and rounded once, as Herbie's model rounds each
    operation: a result depends on a summation order (the BLAS kernel's, which differs
    from one CPU to another) only through float64's rounding; any dtype name rounds every
    node to that dtype (a cast first to its own, as a MuGraph's tiles, computed in float32,
    round at a cast).
    ``rounded=True`` (native and exact only) takes ``inputs`` from ``rounded_inputs``:
    they are used as given, so a draw shared by several programs is rounded once.
    """
    if hasattr(program, "evaluate"):  # MuGraph and other program kinds evaluate themselves
        return program.evaluate(inputs, dtype=dtype, rounded=rounded)
    _checked(program)
    return _outputs(program, _EVALUATE, float_ctx(program, inputs, dtype, rounded))


def evaluate_finite(program, inputs: Mapping[str, Any], dtype: str | None = None,
                    rounded: bool = False) -> tuple[dict[str, np.ndarray], bool]:
    """``evaluate``'s outputs of a Graph, and whether every value it computed on the way
    (every node's but the inputs') is finite: where one overflowed, its outputs may hang
    on how that inf was then used (``relu(-inf)`` is 0; a tiled sum of the same terms
    meets ``inf - inf``). One look per value (one element of a broadcast of one value)."""
    _checked(program)
    finite = [True]

    def watched(fn):
        def apply(ctx, n, *xs):
            value = fn(ctx, n, *xs)
            if finite[0] and isinstance(value, np.ndarray | np.generic) and \
                    value.dtype.kind == "f":
                one = _one(value) if np.ndim(value) and uniform(value) else value
                finite[0] = bool(np.isfinite(one).all())
            return value
        apply.lazy_args = getattr(fn, "lazy_args", False)
        return apply

    table = {op: fn if op is Op.INPUT else watched(fn) for op, fn in _EVALUATE.items()}
    out = _outputs(program, table, float_ctx(program, inputs, dtype, rounded))
    return out, finite[0]


def _outputs(program, table, ctx: FloatCtx) -> dict[str, np.ndarray]:
    """``program`` (checked) run with ``table``: its outputs in float64 (``evaluate`` and
    ``evaluate_kept``)."""
    with np.errstate(all="ignore"):
        out = run(program, table, ctx)
    return {k: as_float64(v) for k, v in out.items()}


def _checked(program) -> None:
    """The ``check`` pass on ``program``, once while a Graph's outputs are the same nodes
    (``Graph.derived``): the float checks evaluate one program hundreds of times."""
    from ..ir.check import check

    if hasattr(program, "derived"):
        program.derived("checked", lambda g: check(g) or True)
    else:
        check(program)


class KeptValues:
    """Node values kept across evaluations of one program (``evaluate_kept``), each under a
    key its caller derives from what the value depends on, at most ``max_bytes`` of arrays
    held (a one-value broadcast counts as a few bytes). Shared by threads: an entry is
    written once and never changed."""

    def __init__(self, max_bytes: int) -> None:
        self.values: dict[Hashable, Any] = {}
        self.max_bytes, self.held = max_bytes, 0
        self.lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        """The value kept under ``key``, or None."""
        return self.values.get(key)

    def put(self, key: Hashable, value: Any) -> None:
        """Keep ``value`` under ``key`` while the budget allows (a deferred input read,
        ``interp.Later``, is not kept: its size is not known yet)."""
        if isinstance(value, Later) and not isinstance(value, CodedValue):
            return  # (a ``CodedValue`` counts as looked up: ``nbytes``)
        size = 64 if uniform(value) else int(getattr(value, "nbytes", 64))
        with self.lock:
            if key not in self.values and self.held + size <= self.max_bytes:
                self.values[key] = value
                self.held += size


def _reading_kept(fn, key_of: Callable[[Node], Hashable], kept: KeptValues):
    """Table entry ``fn``, its value read from ``kept`` when there, else computed and kept."""
    def apply(ctx, n, *xs):
        key = key_of(n)
        if key is None:  # a value not to keep
            return fn(ctx, n, *xs)
        found = kept.get(key)
        if found is not None:
            return found
        value = fn(ctx, n, *xs)
        kept.put(key, value)
        return value
    apply.lazy_args = getattr(fn, "lazy_args", False)
    return apply


def evaluate_kept(program, inputs: Mapping[str, np.ndarray], key_of: Callable[[Node], Hashable],
                  kept: KeptValues, dtype: str | None = "native", rounded: bool = True,
                  coded: Coded | None = None) -> dict[str, np.ndarray]:
    """``evaluate(program, inputs, dtype, rounded)`` (by default natively on ``inputs`` from
    ``rounded_inputs``) reading each node's value from ``kept`` under ``key_of(node)`` where
    an earlier evaluation left it, and keeping what it computes: the float checks' peak
    bisections evaluate one program hundreds of times with a few inputs changed, and the
    nodes that depend on none of those are computed once. ``key_of`` must give equal keys
    only to equal values (the node, the evaluation's ``dtype`` and ``rounded``, and the
    values of the inputs it depends on); None: a value computed and not kept. ``coded``:
    the arrays known as a table and codes (``Coded``), elementwise ops on them computed on
    their tables."""
    _checked(program)
    ops = program.derived("ops", lambda g: frozenset(n.op for n in g.nodes())) \
        if hasattr(program, "derived") else frozenset(n.op for n in program.nodes())
    table = {op: _reading_kept(_EVALUATE[op], key_of, kept) for op in ops if op in _EVALUATE}
    ctx = float_ctx(program, inputs, dtype, rounded, coded)
    ctx.coded = coded
    return _outputs(program, table, ctx)


class LazyInputs(Mapping):
    """Input values made when read (``make(name)``), none held here: the interpreters
    (``interp.run``, the tiled ``execute``) read each input where its first reader runs and
    drop it after its last, so a float evaluation of a 7B-size stack holds the weights of
    the layer it is in, not of every layer (the verifier's float64 draws: ``Draws.inputs``).
    The values must already be float32 or float64 arrays of the program's input shapes."""

    def __init__(self, names, make: Callable[[str], np.ndarray],
                 keep: Callable[[str], np.ndarray] | None = None) -> None:
        self.names, self.make, self.keep = list(names), make, keep or make

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.names:
            raise KeyError(name)
        return self.make(name)

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def held(self) -> dict[str, np.ndarray]:
        """Every value made and held (a counterexample's inputs, kept for its report), by
        ``keep``: the same values in the narrowest array that holds them (a float32 draw,
        not its float64 conversion)."""
        return {n: self.keep(n) for n in self.names}


def float_ctx(program, inputs: Mapping[str, Any], dtype: str | None, rounded: bool,
              coded: Coded | None = None) -> FloatCtx:
    """The interpreter's context for ``evaluate``'s ``dtype`` and ``rounded``: inputs checked
    (or, from ``rounded_inputs``, used as given; ``LazyInputs``: made as they are read; an
    int8 or fp8 input known to ``coded``, checked by its table's values)."""
    from ..ir.errors import DTypeError
    from ..ir.node import canonical_dtype

    exact = dtype == "exact"  # as "native", accumulations exact (``evaluate``)
    mode = None if dtype is None else (
        "native" if dtype in ("native", "exact") else canonical_dtype(dtype))
    if mode not in (None, "native", *_BITS):
        raise DTypeError(f"unknown dtype {dtype!r} for an evaluation: expected one of "
                         f"{', '.join(_BITS)}, 'native' or 'exact'")
    if isinstance(inputs, LazyInputs) and set(inputs) == set(program.inputs):
        return FloatCtx(inputs, mode, rounded=rounded and mode == "native", exact=exact)
    if rounded and mode == "native" and _as_given(program, inputs, (np.float32,), coded):
        return FloatCtx(dict(inputs), mode, rounded=True, exact=exact)
    if mode is None and _as_given(program, inputs, (np.float16, np.float32, np.float64),
                                  coded):
        return FloatCtx(dict(inputs), mode)  # each converted to float64 as it is read (fix),
    return FloatCtx(check_inputs(program, inputs), mode, exact=exact)  # not all at once


def _as_given(program, inputs: Mapping[str, Any], dtypes: tuple, coded: Coded | None = None
              ) -> bool:
    """Whether ``inputs`` are NumPy arrays of ``dtypes``, one per input of ``program``, of
    its shapes: usable without ``check_inputs``'s float64 copies (an int8/uint8 input's
    values are checked there: integers of its range; an fp8 input's: values of its dtype;
    one known to ``coded`` as a table and codes, float32 or float64, is checked here by its
    table, which holds every value it holds)."""
    def given(n: str, node) -> bool:
        x = inputs[n]
        if not isinstance(x, np.ndarray) or x.shape != node.shape:
            return False
        if node.dtype not in CODED_DTYPES:
            return x.dtype in dtypes
        found = coded.get(x) if coded is not None else None
        if found is None or x.dtype not in (np.float32, np.float64):
            return False
        check_values(found[1], n, node.dtype)  # (raises for a value out of its range)
        return True

    return isinstance(inputs, Mapping) and set(inputs) == set(program.inputs) and all(
        given(n, node) for n, node in program.inputs.items())
