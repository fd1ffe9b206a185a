"""Finite-field semantics over Z_p x Z_q (q | p-1), section 5 of the Mirage paper.

A value is a pair of int64 arrays ``(p_part, q_part)``. Add, sub, mul, div and
matmul act on both parts (div by modular inverse). ``exp`` maps a value to
``omega ** q_part mod p`` for an ``omega`` of multiplicative order q, and drops
the q part (``None``), which is why a Lax program takes exp at most once on a
path. Opaque functions (the ops whose spec says so: sqrt, silu, tanh, ...) are random
functions of their argument, drawn per trial; ``rsqrt`` is ``1 / sqrt`` so that identity holds.

The exact modular arithmetic (matmuls by float64 BLAS) is in ``modular.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.errors import LaxError
from ..ir.node import COMPARE, KEYED, QUANT_DTYPES, Op, slice_index
from ..ir.ops import SPECS, OpSpec
from .gather import draw_indices, index_bounds, take
from .modular import (  # noqa: F401  (re-exported: the field backend's arithmetic)
    CHUNK,
    EXACT_K,
    PINNED,
    FieldZeroDivisionError,
    addmod,
    const_mod,
    invmod,
    is_array,
    matmul_mod,
    mod,
    mulmod,
    powmod,
    residues,
    submod,
)

# The ops whose keys are drawn from the trial's generator: the first 28 declared.
_KEYS_FROM_TRIAL = 28
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)


def _fmix(z: np.ndarray) -> np.ndarray:
    z = z ^ (z >> np.uint64(33))
    z = z * _M1
    z = z ^ (z >> np.uint64(33))
    z = z * _M2
    return z ^ (z >> np.uint64(33))


@dataclass
class FieldCtx:
    """One trial: primes, omega, random-function keys and the inputs."""

    p: int
    q: int
    rng: np.random.Generator
    inputs: Mapping[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    needs_q: set[int] = field(default_factory=set)  # ids of nodes whose q part is used
    needs_p: set[int] | None = None  # ids of nodes whose p part is used (None: every node)
    omega: int = 0
    keys: dict[Op, tuple[int, int, int]] = field(default_factory=dict)
    _tables: tuple[np.ndarray, np.ndarray] | None = None
    limb_cache: dict = field(default_factory=dict)
    pinned: set[int] = field(default_factory=set)  # ids of the inputs' arrays
    q_order: list[str] = field(default_factory=list)  # inputs whose q part was drawn, in order

    def __post_init__(self) -> None:
        while self.omega in (0, 1):
            g = int(self.rng.integers(2, self.p - 1))
            self.omega = pow(g, (self.p - 1) // self.q, self.p)
        later = []
        for op in sorted(Op, key=lambda o: o.value):
            if op.value > _KEYS_FROM_TRIAL:
                later.append(op)
                continue
            self.keys[op] = tuple(int(k) for k in self.rng.integers(1, 2**62, size=3))
        # An op declared later takes its keys from a generator seeded by the keys drawn
        # above: adding an op leaves the trial's later draws (its inputs) as they were.
        extra = np.random.default_rng([k for ks in self.keys.values() for k in ks])
        for op in later:
            self.keys[op] = tuple(int(k) for k in extra.integers(1, 2**62, size=3))

    def random_inputs(self, program) -> dict[str, LazyPair]:
        """Fresh uniform (p, q) pairs for every input of ``program``.

        The q part is drawn on first use: only inputs that reach an exp need it.
        """
        self.pinned = set()  # the inputs' arrays; q parts added when drawn
        rows = index_bounds(program)  # an index input: plain integers in [0, rows), not
        out = {name: _IndexPair(draw_indices(self.rng, node.shape, rows[name]))  # residues
               if name in rows else
               LazyPair(residues(self.rng, self.p, node.shape), node.shape, self, name)
               for name, node in program.inputs.items()}
        self.pinned.update(id(pair[0]) for pair in out.values())
        self.limb_cache = self.input_cache()
        return out

    def replay(self, program, q_order: list[str]) -> None:
        """Draw ``program``'s inputs again as ``random_inputs`` drew them on a generator in
        the same state, the q parts in ``q_order`` (the order an earlier evaluation drew
        them in): the same values, without keeping them between evaluations."""
        self.inputs = self.random_inputs(program)
        for name in q_order:
            self.inputs[name][1]

    def input_cache(self) -> dict:
        """A fresh ``limb_cache`` that keeps conversions of the trial's inputs only."""
        return {PINNED: self.pinned}

    def exp(self, x: np.ndarray) -> np.ndarray:
        """omega ** x mod p for x in [0, q), by two table look-ups."""
        if self._tables is None:
            self._tables = (_powers(self.omega, 1 << 15, self.p),
                            _powers(pow(self.omega, 1 << 15, self.p), (self.q >> 15) + 1, self.p))
        lo, hi = self._tables
        if not is_array(x):
            return (hi[x >> 15] * lo[x & 0x7FFF]) % self.p
        idx = np.ascontiguousarray(x >> 15)
        r = hi.take(idx)  # C-contiguous, like idx
        np.bitwise_and(x, 0x7FFF, out=idx)
        flat_r, flat_idx = r.reshape(-1), idx.reshape(-1)
        for s in range(0, flat_r.size, CHUNK):  # no third array of x's size
            flat_r[s:s + CHUNK] *= lo.take(flat_idx[s:s + CHUNK])
        r %= self.p
        return r

    def random_fn(self, op: Op, x: tuple) -> tuple[np.ndarray, np.ndarray]:
        """The trial's random function for ``op`` applied to the pair ``x``."""
        k1, k2, k3 = (np.uint64(k) for k in self.keys[op])
        # Keyed on the p part only: whether the q part was computed depends on the program
        # (needs_q), and equal arguments must give equal results in both programs.
        with np.errstate(over="ignore"):  # uint64 wrap-around is intended; 0-d values warn
            z = _fmix(x[0].astype(np.uint64) * k1 + np.uint64(k3))
            out_q = (_fmix(z ^ k2) % np.uint64(self.q)).astype(np.int64)
        out_p = (z % np.uint64(self.p)).astype(np.int64)
        return out_p, out_q


class LazyPair:
    """An input's (p part, q part); the q part is drawn uniformly on first access, from the
    trial's generator, and recorded in its ``pinned`` and ``q_order``. It keeps those, not
    the trial's ``FieldCtx``: a trial whose inputs pointed back at it would be a reference
    cycle, and its inputs and cached conversions (GBs at a 7B layer's size) would outlive
    it until the cycle collector's next pass."""

    def __init__(self, p_part: np.ndarray, shape, ctx: FieldCtx, name: str = "") -> None:
        self._p, self._q, self._shape, self._name = p_part, None, shape, name
        self._rng, self._mod, self._pinned, self._order = ctx.rng, ctx.q, ctx.pinned, ctx.q_order

    def __getitem__(self, i: int) -> np.ndarray:
        if i == 0:
            return self._p
        if self._q is None:
            self._q = residues(self._rng, self._mod, self._shape)
            self._pinned.add(id(self._q))
            self._order.append(self._name)
        return self._q

    def __iter__(self):
        return iter((self[0], self[1]))

    def __len__(self) -> int:
        return 2


class _IndexPair(tuple):
    """An index input's value in a trial: the same plain integers as both parts (a gather
    reads them as positions, not as residues)."""

    def __new__(cls, idx: np.ndarray) -> _IndexPair:
        return super().__new__(cls, (idx, idx))


def _gather(ctx, n, x, i):
    """GATHER, TAKE_ALONG_AXIS: linear in the table, so each part is gathered at the plain
    integer indices (``take``: np.take, np.take_along_axis; the index operand's parts are the
    same integers; either may be left uncomputed)."""
    idx = i[0] if i[0] is not None else i[1]
    return (_p(ctx, n, lambda: take(x[0], idx, n)), _q(ctx, n, lambda: take(x[1], idx, n)))


def _powers(base: int, n: int, m: int) -> np.ndarray:
    table = np.ones(1, dtype=np.int64)
    while len(table) < n:
        step = pow(base, len(table), m)
        table = np.concatenate([table, (table * step) % m])
    return table[:n]


class MaskedPair(tuple):
    """A masked value (``em.where(mask, x, -inf)``): x's (p, q) parts and ``keep``, the
    mask's p part (0 or 1 for a causal mask, uniform for a mask given as input: the
    polynomial that equals the mask on {0, 1}). Only +/- finite values, transposes and
    reshapes keep it masked; exp turns it into ``keep * exp(x)`` and max into a random
    function of (x, keep) per row. Any other op on it is refused (``check_lax`` first)."""

    keep: Any

    @classmethod
    def of(cls, p: Any, q: Any, keep: Any) -> MaskedPair:
        """The masked pair (p, q) with mask ``keep``."""
        out = cls((p, q))
        out.keep = keep
        return out


def with_parts(value: Any, p: Any, q: Any) -> tuple:
    """``value`` with its parts replaced (a masked value stays masked)."""
    return MaskedPair.of(p, q, value.keep) if isinstance(value, MaskedPair) else (p, q)


def _q(ctx: FieldCtx, node, fn):
    return fn() if id(node) in ctx.needs_q else None


def _p(ctx: FieldCtx, node, fn):
    return fn() if ctx.needs_p is None or id(node) in ctx.needs_p else None


def _binary(op_p, op_q):
    def apply(ctx, n, a, b):
        out = (_p(ctx, n, lambda: op_p(a[0], b[0], ctx.p)),
               _q(ctx, n, lambda: op_q(a[1], b[1], ctx.q)))
        masked = [x for x in (a, b) if isinstance(x, MaskedPair)]
        if masked:  # x - m or x + c of a masked x: still masked (check_lax allows no more)
            if n.op not in (Op.ADD, Op.SUB) or len(masked) > 1 or b is masked[0] and \
                    n.op is Op.SUB:
                raise LaxError(f"{n.describe()}: a masked value (-inf where masked) is only "
                               "verified through + or - of finite values, max and exp")
            return MaskedPair.of(*out, masked[0].keep)
        return out
    return apply


def _unary(fn):
    def apply(ctx, n, x):
        return _p(ctx, n, lambda: fn(x[0], ctx.p)), _q(ctx, n, lambda: fn(x[1], ctx.q))
    return apply


def _reduce(mean: bool):
    def apply(ctx, n, x):
        axes, keep = n.arg
        count = 1
        for ax in axes:
            count *= n.srcs[0].shape[ax]

        def red(v, m):
            s = np.sum(v, axis=axes, keepdims=keep) % m
            return (s * pow(count, m - 2, m)) % m if mean else s
        return _p(ctx, n, lambda: red(x[0], ctx.p)), _q(ctx, n, lambda: red(x[1], ctx.q))
    return apply


def _movement(fn):
    def apply(ctx, n, *xs):
        out = (_p(ctx, n, lambda: fn([x[0] for x in xs], n.arg)),
               _q(ctx, n, lambda: fn([x[1] for x in xs], n.arg)))
        if any(isinstance(x, MaskedPair) for x in xs):
            if len(xs) > 1:
                raise LaxError(f"{n.describe()}: a concat of masked values is not verified")
            return MaskedPair.of(*out, fn([xs[0].keep], n.arg))
        return out
    return apply


def _cast(ctx, n, x):
    """CAST: the identity on exact values (a cast only rounds floats, and an int8/uint8
    value is exact in every float dtype); a wrapping cast between int8 and uint8 is no
    polynomial, so a keyed random function of its operand, one per target dtype."""
    if n.arg not in QUANT_DTYPES or n.srcs[0].dtype == n.arg:
        return _movement(lambda xs, dtype: xs[0])(ctx, n, x)
    shift = 1 + QUANT_DTYPES.index(n.arg)  # the target dtype's own function
    out = ctx.random_fn(Op.CAST, (addmod(np.asarray(x[0]), shift, ctx.p),))
    return out[0], _q(ctx, n, lambda: out[1])


NIBBLE, NIBBLE_BITS = 15, 4  # x & 15 and x >> 4: the two nibbles of a packed byte


def _bits(ctx, n, x):
    """BITAND / SHR of integer values: no polynomial. ``x & 15`` is a keyed random function
    lo(x) and ``x >> 4`` is ``(x - lo(x)) / 16``, one lo per trial, so that the nibbles
    are two values drawn for each byte with ``lo + 16 * hi == x``, which holds over the
    integers (for int8 too: ``x >> 4`` is floor(x / 16)); any other mask or shift is a
    keyed random function of its own (docs/verifier.md, "Integer inputs")."""
    xp = np.asarray(x[0])
    nibble = (n.op is Op.BITAND and n.arg == NIBBLE) or (n.op is Op.SHR and n.arg == NIBBLE_BITS)
    shift = 0 if nibble else (2000 if n.op is Op.SHR else 1000) + int(n.arg)
    lo = ctx.random_fn(Op.BITAND, (addmod(xp, shift, ctx.p),))
    if not nibble or n.op is Op.BITAND:
        return lo[0], _q(ctx, n, lambda: lo[1])
    return (mulmod(submod(xp, lo[0], ctx.p), pow(16, -1, ctx.p), ctx.p),
            _q(ctx, n, lambda: mulmod(submod(np.asarray(x[1]), lo[1], ctx.q),
                                      pow(16, -1, ctx.q), ctx.q)))


def _opaque(op):
    def apply(ctx, n, x):
        out = ctx.random_fn(op, x)
        return out[0], _q(ctx, n, lambda: out[1])
    return apply


_ROUNDS = 4  # Feistel rounds of the keyed permutation of Z_p (``_permute``)


@functools.lru_cache(maxsize=64)
def _round_tables(keys: tuple[int, int, int], bits: int) -> tuple[np.ndarray, ...]:
    """The round functions of ``_feistel`` as tables (a round reads at most 16 bits): round
    r maps its low half ``lo`` to ``_fmix(lo ^ key_r)``, cut to the high half's width."""
    half = (bits - bits // 2, bits // 2)
    out = []
    with np.errstate(over="ignore"):  # uint64 wrap-around is intended
        for r, key in enumerate(_round_keys(keys)):
            hi_bits, lo_bits = half if r % 2 == 0 else half[::-1]
            table = _fmix(np.arange(1 << lo_bits, dtype=np.uint64) ^ key)
            out.append((table & np.uint64((1 << hi_bits) - 1)).astype(np.uint32))
    return tuple(out)


def _round_keys(keys: tuple[int, int, int]) -> tuple[np.uint64, ...]:
    """The round keys of ``_round_tables`` (round r: ``_fmix(k1 + r * k2) ^ k3``)."""
    k1, k2, k3 = (np.uint64(k) for k in keys)
    with np.errstate(over="ignore"):  # uint64 wrap-around is intended
        return tuple(_fmix(k1 + np.uint64(r) * k2) ^ k3 for r in range(_ROUNDS))


def _round(lo: np.ndarray, r: int, bits: int, tables: tuple) -> np.ndarray:
    """Round ``r``'s function of ``_feistel`` at ``lo``: a look-up in ``tables`` (the
    ``_round_tables``), or, given the round keys instead (``tables[0]`` a scalar: few
    values to permute), the same value computed at ``lo`` alone."""
    if isinstance(tables[r], np.ndarray):
        return tables[r].take(lo)
    hi_bits = (bits - bits // 2, bits // 2)[r % 2]
    with np.errstate(over="ignore"):
        z = _fmix(lo.astype(np.uint64) ^ tables[r])
    return (z & np.uint64((1 << hi_bits) - 1)).astype(np.uint32)


def _feistel(x: np.ndarray, bits: int, tables: tuple, inverse: bool) -> np.ndarray:
    """A keyed permutation of [0, 2**bits) on uint32 arrays: an unbalanced Feistel network
    of ``_ROUNDS`` rounds, round r's function ``_round`` (the table ``tables[r]``, or its
    value computed from round key ``tables[r]``)."""
    half = (bits - bits // 2, bits // 2)  # (high, low) widths of the first round's input
    for r in (range(_ROUNDS - 1, -1, -1) if inverse else range(_ROUNDS)):
        hi_bits, lo_bits = half if r % 2 == 0 else half[::-1]
        if inverse:  # the round's output is (lo << hi_bits) | (hi ^ F(lo))
            lo = x >> np.uint32(hi_bits)
            hi = (x & np.uint32((1 << hi_bits) - 1)) ^ _round(lo, r, bits, tables)
            x = (hi << np.uint32(lo_bits)) | lo
        else:
            lo = x & np.uint32((1 << lo_bits) - 1)
            x = (lo << np.uint32(hi_bits)) | ((x >> np.uint32(lo_bits)) ^
                                               _round(lo, r, bits, tables))
    return x


_DIRECT = 4096  # fewer values than this: the round functions computed, not tabulated


def _permute(v: Any, p: int, keys: tuple[int, int, int], inverse: bool = False) -> np.ndarray:
    """A keyed pseudo-random permutation of Z_p (or its inverse), on int64 residues: the
    Feistel permutation of [0, 2**bits) walked along its cycle until it lands below p."""
    bits = int(p - 1).bit_length()
    v = np.asarray(v)
    keys = tuple(int(k) for k in keys)
    tables = _round_keys(keys) if v.size < _DIRECT else _round_tables(keys, bits)
    out = _feistel(v.astype(np.uint32).reshape(-1), bits, tables, inverse)
    idx = np.flatnonzero(out >= np.uint32(p))
    while idx.size:  # cycle walking: each cycle through a value below p returns below p
        step = _feistel(out[idx], bits, tables, inverse)
        out[idx] = step
        idx = idx[step >= np.uint32(p)]
    return out.astype(np.int64).reshape(v.shape)


def _rowmax(ctx, n, x):
    """max over axes: a random function of the row's multiset of values (keyed on the p
    part, like the opaque functions) that is associative over a partition of the row, as
    the real max is: ``max(S) = g^-1(sum of g(s) for s in S)`` with ``g`` a keyed random
    permutation of Z_p, so the max of the maxes of the parts of a row is the max of the
    row (a tiled, looped or split max verifies against the whole-row one; the axes'
    order does not matter), a max over a different multiset is an unrelated value, and
    the max of one element is that element's p part. The q part is a keyed hash of the p
    part. Any consistent value is sound: softmax cancels a shift exactly, and a wrong
    axis, sign or stale max gives values that do not cancel (docs/verifier.md)."""
    keys = ctx.keys[Op.MAX]
    axes, keep = n.arg
    if not axes:  # the max over no axis is the value itself
        return x
    z = _permute(x[0], ctx.p, keys)
    if isinstance(x, MaskedPair):  # masked entries drop out
        z = _masked_terms(ctx, x, z, keys)
    total = np.sum(z, axis=tuple(axes), keepdims=True, dtype=np.int64) % ctx.p
    row = _permute(total, ctx.p, keys, inverse=True)
    if not keep:
        row = row.reshape(n.shape)
    k1, k2, k3 = (np.uint64(k) for k in keys)
    with np.errstate(over="ignore"):  # uint64 wrap-around is intended
        out_q = _q(ctx, n, lambda: (_fmix((row.astype(np.uint64) * k1 + k3) ^ k2)
                                    % np.uint64(ctx.q)).astype(np.int64))
    return _p(ctx, n, lambda: row.reshape(n.shape)), out_q


def _masked_terms(ctx, x: MaskedPair, z, keys):
    """A masked row's terms in ``_rowmax``'s sum: a kept entry (keep = 1) the same term as
    in an unmasked row, a masked one (keep = 0) none, so the max of a masked row is the
    max of its kept values (a length mask's padded columns drop out, and a row with
    nothing kept drops out of a max of maxes, as -inf does); any other keep (a mask given
    as input: a uniform value) a random function of (x, keep)."""
    keep = np.asarray(x.keep) % ctx.p
    k4 = int(ctx.keys[Op.MASK][0]) % ctx.p
    mixed = (np.asarray(x[0]) + mulmod(keep, k4, ctx.p)) % ctx.p
    k1, k2, k3 = (int(k) for k in keys)
    other = _permute(mixed, ctx.p, (k3, k1, k2 ^ k4))
    return np.where(keep == 1, z, np.where(keep == 0, 0, other))


def _select(c: Any, a: Any, b: Any, m: int) -> Any:
    """where(c, a, b) as c * a + (1 - c) * b mod m (multilinear in the mask)."""
    return addmod(mulmod(np.asarray(c), a, m), mulmod(np.asarray((1 - c) % m), b, m), m)


def _reciprocal(of: Op):
    """1 / the random function of ``of`` (rsqrt: 1 / sqrt, so that identity holds)."""
    def apply(ctx, n, x):
        sp, sq = ctx.random_fn(of, x)
        return _p(ctx, n, lambda: invmod(sp, ctx.p)), _q(ctx, n, lambda: invmod(sq, ctx.q))
    return apply


def _or(a: Any, b: Any, m: int) -> Any:
    """a + b - a * b mod m: the logical or of two masks, multilinear in both."""
    return submod(addmod(a, b, m), mulmod(a, b, m), m)


# The exact field forms a spec's ``field`` names ("not": a bool mask c as 1 - c, exact on
# {0, 1} and a uniform residue again for a mask drawn uniform; "and", "or": a * b and
# a + b - a * b, exact on {0, 1} and multilinear in each mask, so the polynomials of two
# programs agree wherever their masks' truth tables do as polynomials: De Morgan's laws,
# commutativity and associativity hold, an and for an or does not).
_EXACT = {"neg": lambda x, m: submod(0, x, m), "add": addmod, "sub": submod, "mul": mulmod,
          "div": lambda a, b, m: mulmod(a, invmod(b, m), m), "not": lambda x, m: submod(1, x, m),
          "and": mulmod, "or": _or}


def _from_spec(s: OpSpec):
    """The field entry of an elementwise op with no handler here, from its spec."""
    if s.reciprocal_of is not None:
        return _reciprocal(s.reciprocal_of)
    if s.opaque:
        return _opaque(s.op)
    fn = _EXACT[s.field]
    return _unary(fn) if s.arity == 1 else _binary(fn, fn)


def _comparison(op: Op):
    """A comparison ``a OP b`` (float values, a bool mask): not a polynomial, so modelled as
    a keyed random function of ``a - b`` into {0, 1}, one per op and trial (keyed on the p
    part, as the opaque functions are), the same bit as both parts: a mask that ``where``
    (``c * a + (1 - c) * b``), ``mask`` and ``not`` read as 0/1. Two comparisons agree
    wherever their differences agree as polynomials, which every rewrite that holds over
    the reals through ``a - b`` keeps (``x + c > y + c``); a different op, operand order
    or difference is an unrelated bit (docs/verifier.md, "Comparisons")."""
    def apply(ctx, n, a, b):
        k1, k2, k3 = (np.uint64(k) for k in ctx.keys[op])
        diff = np.broadcast_to(submod(a[0], b[0], ctx.p), n.shape)
        with np.errstate(over="ignore"):  # uint64 wrap-around is intended; 0-d values warn
            z = _fmix((diff.astype(np.uint64) * k1 + k3) ^ k2)
        bit = ((z >> np.uint64(40)) & np.uint64(1)).astype(np.int64)
        return _p(ctx, n, lambda: bit), _q(ctx, n, lambda: bit)
    return apply


def _input(ctx, n):
    pair = ctx.inputs[n.arg]
    return pair[0], _q(ctx, n, lambda: pair[1])


def _matmul(ctx, n, a, b):
    return (_p(ctx, n, lambda: matmul_mod(a[0], b[0], ctx.p, ctx.limb_cache)),
            _q(ctx, n, lambda: matmul_mod(a[1], b[1], ctx.q, ctx.limb_cache)))


def _const(ctx, n):
    return (np.int64(const_mod(n.arg, ctx.p)),
            _q(ctx, n, lambda: np.int64(const_mod(n.arg, ctx.q))))


# The opaque and exact elementwise ops come from their specs; the rest are handled here.
FIELD_SEMANTICS = {
    **{op: _from_spec(s) for op, s in SPECS.items() if s.opaque or s.field is not None},
    Op.INPUT: _input,
    Op.CONST: _const,
    Op.EXP: lambda ctx, n, x: ((mulmod(ctx.exp(x[1]), x.keep, ctx.p)
                                if isinstance(x, MaskedPair) else ctx.exp(x[1])), None),
    Op.MATMUL: _matmul,
    Op.SUM: _reduce(mean=False),
    Op.MEAN: _reduce(mean=True),
    Op.MAX: _rowmax,
    Op.WHERE: lambda ctx, n, c, a, b: (
        _p(ctx, n, lambda: _select(c[0], a[0], b[0], ctx.p)),
        _q(ctx, n, lambda: _select(c[1], a[1], b[1], ctx.q))),
    Op.MASK: lambda ctx, n, c, x: MaskedPair.of(
        None if x[0] is None else np.broadcast_to(x[0], n.shape),
        None if x[1] is None else np.broadcast_to(x[1], n.shape),
        np.broadcast_to(c[0], n.shape)),  # one layout for value and mask (tiles cut both)
    Op.CAUSAL: lambda ctx, n: (np.tri(*n.arg, dtype=np.int64),) * 2,
    Op.TRANSPOSE: _movement(lambda xs, perm: np.transpose(xs[0], perm)),
    Op.RESHAPE: _movement(lambda xs, shape: np.reshape(xs[0], shape)),
    Op.CONCAT: _movement(lambda xs, axis: np.concatenate(xs, axis=axis)),
    Op.CAST: _cast,
    Op.SLICE: _movement(lambda xs, arg: np.asarray(xs[0])[slice_index(arg)]),
    Op.GATHER: _gather,
    Op.TAKE_ALONG_AXIS: _gather,
    **{op: _comparison(op) for op in COMPARE},
    Op.BITAND: _bits,
    Op.SHR: _bits,
}


_MASK_AWARE = {Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.EXP, Op.MAX, Op.TRANSPOSE, Op.RESHAPE,
               Op.CONCAT, Op.CAST}  # a cast keeps -inf (the field's cast is the identity)


def _refuse_masked(op: Op, fn):
    def apply(ctx, n, *xs):
        if any(isinstance(x, MaskedPair) for x in xs):
            raise LaxError(f"{n.describe()}: a masked value (-inf where masked) is only "
                           "verified through + or - of finite values, max and exp")
        return fn(ctx, n, *xs)
    return apply


FIELD_SEMANTICS.update({op: _refuse_masked(op, fn) for op, fn in FIELD_SEMANTICS.items()
                        if op not in _MASK_AWARE})


def q_needed(program) -> set[int]:
    """Ids of nodes whose Z_q part some exp reads (ancestors of exp nodes)."""
    needed: set[int] = set()
    for node in reversed(program.nodes()):
        if node.op is Op.EXP or id(node) in needed:
            for s in node.srcs:
                needed.add(id(s))
    return needed


def back_p(nodes: list, needed_p: set[int], needed_q: set[int]) -> None:
    """Add to ``needed_p`` the operands whose Z_p part ``nodes`` (in order) read: every
    operand of a node whose p part is needed, except exp's (it reads the q part); and the
    operand of an opaque function or max whose q part is needed (keyed on the p part)."""
    for node in reversed(nodes):
        if (id(node) in needed_p and node.op is not Op.EXP) or (
                node.op in KEYED and id(node) in needed_q):
            needed_p.update(id(s) for s in node.srcs)
        if node.op in (Op.MASK, Op.WHERE) and (id(node) in needed_p or id(node) in needed_q):
            needed_p.add(id(node.srcs[0]))  # the mask's p part is what keeps or selects


def p_needed(program, needed_q: set[int]) -> set[int]:
    """Ids of nodes whose Z_p part is used: the outputs and what they read (``back_p``).
    A matmul that only feeds an exp (the attention scores) is computed in Z_q alone."""
    needed = {id(n) for n in program.outputs.values()}
    back_p(program.nodes(), needed, needed_q)
    return needed


def _structural_keys(program, ids: dict) -> dict[int, int]:
    """id(node) -> hash-consed key of (op, arg, shape, operands' keys), linear time."""
    keys: dict[int, int] = {}
    for node in program.nodes():
        k = (node.op, node.arg, node.shape, tuple(keys[id(s)] for s in node.srcs))
        keys[id(node)] = ids.setdefault(k, len(ids))
    return keys


class SharedValues:
    """Values of the subterms common to several programs evaluated in one trial.

    In a trial a node's value depends only on its op, argument, shape and its
    operands' values (inputs are looked up by name; omega and the random
    functions belong to the trial), so structurally equal nodes of the two
    programs the verifier compares have equal values: ``evaluate_field`` with
    a ``SharedValues`` computes each common subterm once and reuses it in the
    other program. Results are identical to separate evaluation.
    """

    def __init__(self, *programs) -> None:
        self._ids: dict[tuple, int] = {}
        self._keys = {id(p): _structural_keys(p, self._ids) for p in programs}
        counts: dict[int, int] = {}
        for program in programs:  # a program given twice shares with itself
            for k in set(self._keys[id(program)].values()):
                counts[k] = counts.get(k, 0) + 1
        self._common = {k for k, c in counts.items() if c > 1}
        self._values: dict[int, tuple] = {}

    def evaluate(self, program, ctx: FieldCtx) -> dict[str, tuple]:
        """Like ``run(program, FIELD_SEMANTICS, ctx)``, reusing common subterms."""
        keys = self._keys.get(id(program)) or _structural_keys(program, self._ids)
        env: dict[int, Any] = {}
        for node in program.nodes():
            k, need_q = keys[id(node)], id(node) in ctx.needs_q
            need_p = ctx.needs_p is None or id(node) in ctx.needs_p
            hit = self._values.get(k)
            if hit is not None and (hit[1] is not None or not need_q) and (
                    hit[0] is not None or not need_p):
                env[id(node)] = with_parts(hit, hit[0] if need_p else None,
                                           hit[1] if need_q else None)
                continue
            fn = FIELD_SEMANTICS.get(node.op)
            if fn is None:
                raise NotImplementedError(f"no semantics for {node.op} in this backend")
            env[id(node)] = value = fn(ctx, node, *(env[id(s)] for s in node.srcs))
            if k in self._common:
                self._values[k] = value
        return {name: env[id(node)] for name, node in program.outputs.items()}


def evaluate_field(program, ctx: FieldCtx, shared: SharedValues | None = None) -> dict[str, tuple]:
    """Run ``program`` over Z_p x Z_q with the trial ``ctx`` (inputs already set).

    ``shared`` (made for one trial from the programs compared in it) computes
    their common subterms once; the results are the same without it.
    """
    from .interp import run

    ctx.needs_q = q_needed(program)
    ctx.needs_p = p_needed(program, ctx.needs_q)
    if shared is not None:
        return shared.evaluate(program, ctx)
    return run(program, FIELD_SEMANTICS, ctx)
