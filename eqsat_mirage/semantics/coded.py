"""Arrays known as a table of a few values and a code an element (an int8 or fp8 weight: 256
values), for the float interpreter's evaluations of the verifier's draws
(``floating.evaluate_kept``; docs/verifier.md, section 6).

An elementwise op on such an array and operands small beside it (one value, a per-channel
scale or zero point) is computed on the table, and its result is the new table with the
same codes: a ``CodedValue``, looked up (one value an element) only where something reads
it whole. A chain of such ops (a weight's dequantization, ``(w - z) * s``) is then one
look-up, and a matmul by one value (the bisections' draws, every float input one value)
needs none: the sums over the contraction are the table times each code's count along it
(``coded_sums``)."""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any

import numpy as np

from .interp import Later, made

COUNTS_BYTES = 64 * 2**20  # the code counts ``Coded.counts`` keeps (one a weight and axis)
_CHUNK = 1 << 20  # elements counted at a time (``_count``): a bounded int64 copy


class Coded:
    """Arrays whose values are ``table[codes]`` (a table of a few values, one uint8 code an
    element), by ``id``: an int8 or fp8 weight (256 values), and the count of each code
    along an axis of such codes (``counts``). Entries go with their arrays (weakrefs);
    shared by threads (each entry written once)."""

    def __init__(self) -> None:
        self.entries: dict[int, tuple] = {}
        self._counts: dict[tuple, tuple] = {}
        self._counted = 0
        self._lock = threading.Lock()
        self._last = threading.local()  # per thread: the last values looked up (``look_up``)

    def add(self, x: np.ndarray, codes: np.ndarray, table: np.ndarray) -> None:
        """Know ``x`` as ``table[codes]`` while it lives."""
        key, entries = id(x), self.entries

        def gone(ref, key=key) -> None:
            if entries.get(key, (None,))[0] is ref:
                entries.pop(key, None)

        entries[key] = (weakref.ref(x, gone), codes, table)

    def get(self, x: Any) -> tuple[np.ndarray, np.ndarray] | None:
        """``(codes, table)`` of ``x`` where known (a ``CodedValue``'s own), else None."""
        if isinstance(x, CodedValue):
            return x.codes, x.table
        found = self.entries.get(id(x))
        if found is None or found[0]() is not x:
            return None
        return found[1], found[2]

    def look_up(self, codes: np.ndarray, table: np.ndarray) -> np.ndarray:
        """``look_up(codes, table)``; the same array again where one of this thread's last
        two look-ups had the same codes and a table equal bit for bit (a check evaluates the
        first program natively, then in float64 for its ground truth, then the second
        natively: the second's weight is the first's). On a match the other is dropped,
        and before a third is made the older one: besides what an evaluation holds anyway,
        one weight a thread at most (``memory.float_check_peak`` counts it), none after
        ``forget``."""
        held = getattr(self._last, "held", None) or []
        where = _where(codes)
        for entry in held:  # (the codes kept alive with their key: no other array there)
            _, at, kept_table, value = entry
            if at == where and kept_table.shape == table.shape and \
                    kept_table.dtype == table.dtype and kept_table.tobytes() == table.tobytes():
                self._last.held = [entry]
                return value
        self._last.held = held = held[-1:]
        value = look_up(codes, table)
        value.flags.writeable = False  # shared by the programs: none may write into it
        self._last.held = held + [(codes, where, table.copy(), value)]
        return value

    def forget(self) -> None:
        """Drop this thread's last look-up (``look_up``): its check is done."""
        self._last.held = None

    def counts(self, codes: np.ndarray, axis: int) -> np.ndarray:
        """How many elements along ``axis`` hold each code: int64 of shape ``(256,) +
        codes.shape`` with ``axis`` 1, kept per codes array (a view of it too: its base,
        offset, shape and strides) and axis up to ``COUNTS_BYTES``."""
        base = codes if codes.base is None else codes.base
        key = _where(codes) + (axis,)
        found = self._counts.get(key)
        if found is not None and found[0] is base:
            return found[1]
        counts = _count(codes, axis)
        with self._lock:
            if self._counted + counts.nbytes <= COUNTS_BYTES:
                self._counts[key] = (base, counts)  # (the base kept alive with its key)
                self._counted += counts.nbytes
        return counts


def _where(codes: np.ndarray) -> tuple:
    """Where ``codes`` (an array or a view) lies: its base, offset, shape and strides (the
    base kept alive by who keeps the key)."""
    base = codes if codes.base is None else codes.base
    return (id(base), codes.__array_interface__["data"][0], codes.shape, codes.strides)


def _count(codes: np.ndarray, axis: int) -> np.ndarray:
    """``Coded.counts``, computed: a bincount of each code and position off ``axis``,
    ``_CHUNK`` elements at a time."""
    moved = np.moveaxis(codes, axis, -1)
    rest, length = moved.shape[:-1], moved.shape[-1]
    m = math.prod(rest)
    rows = moved.reshape(m, length)
    out = np.empty((m, 256), dtype=np.int64)
    step = max(1, _CHUNK // max(length, 1))
    for i in range(0, m, step):
        part = rows[i:i + step].astype(np.intp)
        part += (np.arange(part.shape[0], dtype=np.intp) * 256)[:, None]
        out[i:i + part.shape[0]] = np.bincount(part.reshape(-1),
                                               minlength=256 * part.shape[0]).reshape(-1, 256)
    return np.moveaxis(out.T.reshape((256,) + rest + (1,)), -1, axis + 1)


class CodedValue(Later):
    """``table[codes]`` not looked up yet: ``codes`` (uint8) of the value's shape, ``table``
    of shape ``(codes, *wide)``, ``wide`` of the same rank and broadcast to it (element
    ``i`` is ``table[codes[i], i]`` along the axes ``wide`` spans). ``value()`` (and
    ``interp.made``) looks it up once, and registers the array with ``coded``."""

    __slots__ = ("codes", "table", "coded", "shape")

    def __init__(self, codes: np.ndarray, table: np.ndarray, coded: Coded | None) -> None:
        super().__init__(None)
        self.codes, self.table, self.coded, self.shape = codes, table, coded, codes.shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.table.dtype

    @property
    def nbytes(self) -> int:
        """The bytes of the value looked up (what a cache that keeps it must count)."""
        return math.prod(self.shape) * self.table.dtype.itemsize

    def value(self) -> np.ndarray:
        if self._value is None:
            if self.coded is None:
                value = look_up(self.codes, self.table)
            else:
                value = self.coded.look_up(self.codes, self.table)
                self.coded.add(value, self.codes, self.table)
            self._value = value
        return self._value

    def transposed(self, axes) -> CodedValue:
        """The transpose (``np.transpose(value, axes)``), not looked up."""
        axes = tuple(range(self.ndim))[::-1] if axes is None else tuple(axes)
        return CodedValue(np.transpose(self.codes, axes),
                          np.transpose(self.table, (0,) + tuple(a + 1 for a in axes)),
                          self.coded)

    def all_nan(self) -> bool:
        """Whether the table is NaN everywhere (then so is the value)."""
        return self.table.dtype.kind == "f" and bool(np.isnan(self.table).all())


BY_ROWS_FROM = 256  # elements a row from which a per-channel table is looked up row by row


def look_up(codes: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``table[codes]`` element by element (``CodedValue``). A table that varies along one
    axis only (a per-channel scale) with long rows: ``_by_rows``."""
    wide = table.shape[1:]
    size = math.prod(wide)
    if size == 1:
        return table.reshape(-1)[codes]
    varying = [i for i, w in enumerate(wide) if w != 1]
    if len(varying) == 1 and codes.size >= BY_ROWS_FROM * size:
        return _by_rows(codes, table, varying[0])
    where = np.broadcast_to(np.arange(size).reshape(wide), codes.shape)
    return table.reshape(-1)[codes.astype(np.intp) * size + where]


def _by_rows(codes: np.ndarray, table: np.ndarray, axis: int) -> np.ndarray:
    """``look_up`` of a table varying along ``axis`` alone: one ``np.take`` of each
    channel's 256 values a row, the codes' row cast to an index in cache (2.5x faster
    than one index array of the whole weight: 90 against 227 ms for a 11008 x 4096 int8
    weight); the result in the codes' own memory order (a transposed weight's is a
    transposed view)."""
    rows = np.moveaxis(codes, axis, 0)
    per_row = np.ascontiguousarray(np.moveaxis(table.reshape(table.shape[0], -1), 0, 1))
    out = np.empty(rows.shape, dtype=table.dtype)
    for r in range(rows.shape[0]):
        np.take(per_row[r], rows[r], out=out[r])
    return np.moveaxis(out, 0, axis)


def coded_op(ctx, n, fn, xs, uniform, one) -> CodedValue | None:
    """``ctx.fix(n, fn(*xs))`` where one operand is known as a table and codes (``Coded``,
    a ``CodedValue``) of the result's shape and the others are small beside it (one value,
    or a per-channel vector: a scale, a zero point): computed on its table broadcast
    against them, a ``CodedValue`` with the same codes; None otherwise (``uniform`` and
    ``one``: ``floating``'s)."""
    coded = ctx.coded
    if coded is None:
        return None
    shape = tuple(n.shape)
    at = next((i for i, x in enumerate(xs) if np.shape(x) == shape and coded.get(x)), None)
    if at is None:
        return None
    codes, table = coded.get(xs[at])
    rank, args = len(shape), []
    if table.ndim == 1:  # one value a code: against the others' axes
        table = table.reshape(table.shape[:1] + (1,) * rank)
    wide = table.shape[1:]
    for i, x in enumerate(xs):
        if i == at:
            args.append(table)
            continue
        x = made(x)
        if uniform(x):
            args.append(one(x))
            continue
        x = np.asarray(x)
        if x.ndim > rank:
            return None
        lead = (1,) * (rank - x.ndim)
        args.append(x.reshape((1,) + lead + x.shape))
        wide = np.broadcast_shapes(wide, lead + x.shape)
    if np.broadcast_shapes(wide, shape) != shape or \
            table.shape[0] * math.prod(wide) * 4 > math.prod(shape):
        return None  # not small beside the array: computed as it is
    out = np.asarray(ctx.fix(n, fn(*args)))
    if out.shape != (table.shape[0],) + tuple(wide):
        return None
    return CodedValue(codes, out, coded)


class Sums:
    """What a sum of a ``CodedValue``'s elements over an axis is made of, each kept along it
    (``coded_sums``): ``top``, the largest magnitude of its finite elements; ``sums``,
    their sums in float64; whether the elements summed hold a NaN, a +inf or a -inf
    (``nan``, ``posinf``, ``neginf``: boolean arrays), and ``has(test)``: whether they
    hold an element where ``test`` of the table holds (a 0, a positive value)."""

    __slots__ = ("top", "sums", "nan", "posinf", "neginf", "counts", "table")

    def __init__(self, **parts) -> None:
        for k, v in parts.items():
            setattr(self, k, v)

    def has(self, test) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return np.any(self.counts & test(self.table), axis=0)


def coded_sums(x: CodedValue, axis: int, coded: Coded) -> Sums | None:
    """``Sums`` of ``x`` over ``axis``, from its table and each code's count along the axis
    (``Coded.counts``): each sum the table's finite values times their counts, exact
    products, added in float64 (the sum of the elements in another order, with no rounding
    of a narrower accumulator on the way); None where the table varies along ``axis`` (a
    scale per element of the sum)."""
    axis %= x.ndim
    if x.table.shape[1 + axis] != 1:
        return None
    counts = coded.counts(x.codes, axis)[:x.table.shape[0]]  # (codes below the table's size)
    held = counts > 0
    table = np.broadcast_to(x.table, counts.shape)
    finite = np.isfinite(x.table)
    off = np.zeros(counts.shape[1:], dtype=bool)
    with np.errstate(invalid="ignore"):
        if finite.all():  # (the usual case: every flag but the signs' and zero's False)
            part, nan, posinf, neginf = held, off, off, off
        else:
            part = held & finite
            nan = np.any(held & np.isnan(table), axis=0)
            posinf = np.any(held & (table == np.inf), axis=0)
            neginf = np.any(held & (table == -np.inf), axis=0)
        top = float(np.max(np.abs(table), where=part, initial=0.0))
        sums = np.einsum("i...,i...->...", counts, np.where(part, table, 0.0),
                         dtype=np.float64)
    return Sums(top=top, sums=sums, nan=nan, posinf=posinf, neginf=neginf, counts=held,
                table=table)
