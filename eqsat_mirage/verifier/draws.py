"""The float checks' input draws (docs/verifier.md, sections 4 and 5): one standard-normal
draw per input, scaled, folded, replaced by a constant, spread over each input dtype's
exponent range, scaled to its largest finite magnitude, or set to realistic attention
logits; the first program's outputs and its ground truth per draw are memoized.
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

from ..ir.node import CODED_DTYPES, FIXED_DTYPES
from ..semantics.floating import (
    Coded,
    KeptValues,
    LazyInputs,
    evaluate,
    evaluate_finite,
    evaluate_kept,
    round_to,
    rounded_inputs,
    uniform,
)
from ..semantics.half import EVERY_HALF, by_bits, to_half
from .corners import PAIR_FORMS, REST_BELOW, TIE, half_ulp, offset_sets, pairs, tie_pairs
from .corners import offset as common_offset
from .fixed import UINT, fixed_keys, scale_units, table_codes
from .floatsafe import fingerprints, input_deps, is_graph, static_check, unsampled
from .kernelsafe import kernel_check
from .memory import keeps_draws, keeps_folded
from .packing import kept, pack, read_only, scaled_up, unpack, unpacked, weakly
from .sampling import index_draws, scaled, standard_normal, ties
from .scales import (
    LEAST_SCALE,
    apart_powers,
    exp_range,
    exponent_power,
    logit_scale,
    output_counts,
    zero_mask,
)
from .scales import trough as trough_power
from .truth import precision, truth

NATIVE_MAX = {"float16": 65504.0, "bfloat16": 3.3895e38, "float32": 3.4028e38}
# each dtype's smallest normal: below it the dtype holds values to a fixed spacing (its
# subnormals), not to a relative precision, so the relative tolerance is asked of
# magnitudes of at least this much (an absolute floor, rtol times it: 1.2e-6 for float16)
NATIVE_TINY = {"float16": 2.0**-14, "bfloat16": 2.0**-126, "float32": 2.0**-126}
# Float safety (docs/verifier.md, section 5): draws across each input dtype's exponent range.
SPREADS = ()  # each element +-2^e, e uniform in [-s, s] (none by default: its cost)
STATIC = "float safety (static)"
# A point of the exponent-range draws is valid where the first program is finite at it and
# at it with every input scaled by the headroom (the square of its longest reduction, at
# least 4), within 10% of the ground truth (truth.py), and where its output is below the
# dtype's largest value over that length: a candidate may sum before it divides
# ((X @ W) / n for (X / n) @ W, (e @ V) / sum(e) for softmax @ V) or reassociate
# ((A @ B) @ C), and then overflows within that factor of where the input program does;
# the unsafe rewrites overflow far below it.
HEADROOM = 2.0
KEPT_BYTES = 64 * 2**20  # node values the peak bisections keep between evaluations
# values computed from the fixed (index, int8, fp8) inputs alone, kept for every draw
FIXED_BYTES = 256 * 2**20
TROUGH_KEPT = 8 * 2**20  # the trough search keeps a first-program evaluation this small
SHARE_FIXED = True  # False: every evaluation computes them again (tests compare the two)
# drawn input by input
_ONE_BY_ONE = ("signed", "folded", "exponent", "logits", "peakfold", "offset", "pow2", "apart",
               "zeros")
# draws made again for each check, the first program's outputs on them held only while it
# runs: a search's memo keeps none of them (``memory.verify_parts`` counts what it keeps)
UNKEPT = ("offset",)
_SHARED = {("folded", 0.5), ("signed", 1.0)}  # rounded draws that other draws are made from
_LOOKUP_MIN = 1 << 18  # a float16 draw this large is drawn through ``_looked_up``'s table


class _Routed:
    """Two ``KeptValues`` as one: a key tagged "fixed" in ``fixed``, the others in ``rest``."""

    def __init__(self, rest: KeptValues, fixed: KeptValues) -> None:
        self.rest, self.fixed = rest, fixed

    def _of(self, key) -> KeptValues:
        return self.fixed if key[0] == "fixed" else self.rest

    def get(self, key):
        return self._of(key).get(key)

    def put(self, key, value) -> None:
        self._of(key).put(key, value)


class Draws:
    """One standard-normal draw per input, scaled, folded (|z|), replaced by a constant, or
    spread over the inputs' exponent ranges on demand; the first program's outputs per draw
    are kept in ``memo`` across calls. ``stop`` (a callable that raises, the verifier's
    deadline check) is called as the normal draws are made (``sampling.standard_normal``)."""

    def __init__(self, a, rng: np.random.Generator, memo: dict | None,
                 limit: float = np.inf, stop=None) -> None:
        self.a, self.memo, self.limit = a, memo if memo is not None else {}, limit
        self._own_memo = memo is None  # no other ``Draws`` reads it (``_packed``)
        # each input's dtype, read by the makers of lazy draws too (no ``Draws`` in them)
        self._dtypes = {n: node.dtype for n, node in a.inputs.items()}
        # a bool mask input: random bits, mostly kept (1.0 where it holds, as it evaluates);
        # the normal draw kept in float32 (every input dtype is float32 or narrower), a
        # large float16 input's in float16 (``standard_normal``: how each is drawn)
        self.normal = {n: (rng.random(node.shape) < 0.75).astype(np.float64)
                       if node.dtype == "bool" else standard_normal(
                           rng, node.shape, half=node.dtype == "float16", stop=stop)
                       for n, node in a.inputs.items()}
        # a search's memo keeps every rounded draw, when they are small (``keeps_draws``)
        self.keeps = memo is not None and keeps_draws(a)
        # an integer index input: the same valid indices in every draw (``_indexed``), drawn
        # from a generator of its own (the float inputs' draws stay as they were)
        self.index = index_draws(a, rng) if any(
            n.dtype in FIXED_DTYPES for n in a.inputs.values()
        ) else {}
        # a float input that scales a dequantized weight (``w_q.astype(f) * s``): drawn in
        # that weight's unit, so that the weight has a float draw's magnitude
        self.units = scale_units(a, self.index) if self.index and is_graph(a) else {}
        for n, u in self.units.items():
            self.normal[n] = (self.normal[n] * u).astype(self.normal[n].dtype)
        self.base = int(rng.integers(0, 2**62))  # the exponent-range draws' own generators
        self.lock = threading.Lock()  # the memo's short updates; each long first-time
        # computation has a lock of its own, so that no other holds up the checks that
        # do not need it (the logits draw waited behind the static checks' float64 run)
        self._locks = {k: threading.Lock() for k in ("fingerprints", "logits", "folded@h",
                                                     "trough")}
        self.headroom = HEADROOM
        self._current = threading.local()  # per thread: the rounded draw it reads now
        self._folded_h: LazyInputs | None = None  # ``_folded_at_headroom``
        self.static_done = threading.Event()  # ``static`` has run (or will not run: set)
        self.b_outputs: dict | None = None  # the second program's float64 outputs there

    @functools.cached_property
    def top(self) -> float:
        """The largest |z| of the draw (only the native check needs it)."""
        return max((float(np.max(np.abs(z))) for z in self.normal.values()), default=0.0)

    def largest(self, kind: str, s: float) -> float:
        """The largest input magnitude of a draw."""
        if kind == "constant":
            return s
        if kind in ("signed", "folded"):
            return s * self.top
        return max((float(np.max(np.abs(x), initial=0.0))
                    for n, x in self.rounded(kind, s).items() if n not in self.index),
                   default=0.0)

    def _range(self, name: str) -> tuple[int, int]:
        return exp_range(self._dtypes[name])

    def inputs(self, kind: str, s: float) -> dict:
        """The inputs of the draw (``kind``, ``s``) as drawn (float64 or float32 arrays, or
        ``LazyInputs`` made as they are read); an index input holds its drawn indices."""
        return self._indexed(self._drawn(kind, s))

    def _indexed(self, values):
        """``values`` with each integer index input's drawn indices in place of its draw:
        indices are positions, never scaled, folded or rounded (docs/verifier.md)."""
        if not self.index:
            return values
        index = self.index
        if isinstance(values, LazyInputs):
            return LazyInputs(values.names, lambda n: index[n] if n in index else values[n],
                              keep=lambda n: index[n] if n in index else values.keep(n))
        return {n: index.get(n, x) for n, x in values.items()}

    def _drawn(self, kind: str, s: float) -> dict:
        if kind.endswith("@h"):  # the same draw, every float input times ``headroom``
            out = {}
            for n, x in self.inputs(kind[:-2], s).items():
                if self._dtypes[n] == "bool":
                    out[n] = x
                elif np.ndim(x) and not any(x.strides):  # a broadcast stays one
                    out[n] = np.broadcast_to(x.reshape(-1)[:1] * self.headroom, x.shape)
                else:  # in float64: a float16 draw times 2^27 would overflow in float16
                    out[n] = np.asarray(x, dtype=np.float64) * self.headroom
            return out
        if kind == "constant":  # read-only views: no memory per input
            return {n: np.broadcast_to(np.float64(s) * self.units.get(n, 1.0), z.shape)
                    for n, z in self.normal.items()}
        if kind in ("peak", "peakset"):  # input s (every input: -1), or the inputs of
            # ``corners.pairs`` s, at their largest finite value, the others 1
            members = self.members(kind, s)
            big = (self.peak(int(s)) if kind == "peak" else self.peak_set(int(s))) / \
                self.headroom
            return {n: np.broadcast_to(np.float64(big if n in members else 1.0), z.shape)
                    for n, z in self.normal.items()}
        if kind in PAIR_FORMS or kind == TIE:  # the pair s in its form (``corners``' PAIR_FORMS,
            values = self.tie_values(int(s)) if kind == TIE else (  # over the headroom; TIE)
                self.pair_values(kind, int(s)))
            return {n: np.broadcast_to(np.float64(values.get(n, 1.0)), z.shape)
                    for n, z in self.normal.items()}
        if kind == "signed" and s == 1.0:  # the draw itself, read-only: no copies
            return {n: self._as_drawn(kind, s, n) for n in self.normal}
        if kind in _ONE_BY_ONE:  # as float64 evaluations read them (``_as_drawn``), each
            # made where the evaluation first reads it and dropped after its last reader
            return LazyInputs(self.normal, functools.partial(self._as_drawn, kind, s),
                              keep=functools.partial(self._draw, kind, s))
        if kind == "ties":  # every float input k * s, k uniform in [-TIE_STEPS, TIE_STEPS]
            return {n: z if self._dtypes[n] == "bool" else ties(i, z.shape, s)  # (seedless)
                    for i, (n, z) in enumerate(self.normal.items())}
        if kind == "spread":  # each element +-2^e, e uniform in [-s, s] (0: the whole range)
            g = np.random.default_rng([self.base, 2, int(s)])
            out = {}
            for n, z in self.normal.items():
                lo, hi = self._range(n)
                lo, hi = (max(lo, -s), min(hi - 1, s)) if s else (lo, hi - 1)
                out[n] = z if self._dtypes[n] == "bool" else (
                    np.copysign(np.exp2(g.uniform(lo, hi, z.shape)), z))
            return out
        raise ValueError(f"unknown float draw {kind!r}")

    def _draw(self, kind: str, s: float, name: str, z: np.ndarray | None = None) -> np.ndarray:
        """Input ``name``'s value in the draw (``kind``, ``s``), one of ``_ONE_BY_ONE``;
        ``z``: in place of its normal draw (``_looked_up``: every float16 value)."""
        z = self.normal[name] if z is None else z
        if kind == "peakfold":  # input s folded up to its largest finite value, others 0.5|z|
            return scaled(np.abs(z), self._fold(int(s)) if name == list(self.normal)[int(s)]
                           else 0.5)
        if kind == "exponent":  # z * 2^k, one k for every input, uniform across the
            return z if self._dtypes[name] == "bool" else (  # narrowest input range
                scaled(z, 2.0 ** self._power(int(s))))
        if kind == "apart":  # z * 2^k, each float input its own k (``apart_powers``)
            return z if self._dtypes[name] == "bool" else scaled(z, 2.0 ** self.powers(
                int(s))[name])
        if kind == "zeros":  # z, each float input 0 at about one element in 8 (``zero_mask``)
            return z if self._dtypes[name] == "bool" else np.where(
                zero_mask(list(self.normal).index(name), z.shape), z.dtype.type(0), z)
        if kind == "pow2":  # (u + |z|) 2^s with z's sign, every float input (the trough
            # draw's, s <= 0; u its unit, ``units``): none below 2^s in its unit
            return z if self._dtypes[name] == "bool" else scaled(
                np.copysign(self.units.get(name, 1.0) + np.abs(z), z), 2.0 ** s)
        if kind == "offset":  # N(0, 1) plus a common offset on the inputs of the set s
            return z if name not in self.members(kind, s) else z + np.float32(
                self.offset(int(s)))
        if kind == "logits":  # N(0, c^2), c setting the exp arguments' spread (LOGIT_STD)
            return scaled(z, self.logit_scale())
        if kind == "signed" and s == 1.0:  # the draw itself, read-only: no copy
            return read_only(z)
        return scaled(np.abs(z) if kind == "folded" else z, s)

    def _as_drawn(self, kind: str, s: float, name: str) -> np.ndarray:
        """``_draw`` for ``inputs``: the normal draw itself (read-only, ("signed", 1)), else
        in float64, so that a float64 evaluation holds no converted copy beside it."""
        if kind == "signed" and s == 1.0:
            return self._draw(kind, s, name)
        return self._looked_up(kind, s, name, lambda x: np.asarray(x, dtype=np.float64))

    def _looked_up(self, kind: str, s: float, name: str, finish) -> np.ndarray:
        """``finish(_draw(kind, s, name))``, elementwise in the normal draw: for a large
        float16 draw, ``finish`` of the draw of each of the 65536 float16 values, looked up
        by the draw's bits (``by_bits``; the same values: about 0.1 s for a 4096 x 11008 weight,
        against 0.33 s in float64 and 0.38 s rounded to float16, and several seconds where the
        rounding meets float16's subnormals: the exponent draws' small scales). The draw
        ("signed", 1) is the normal draw itself: nothing to look up, and no copy of it."""
        z = self.normal[name]
        if z.dtype != np.float16 or z.size < _LOOKUP_MIN or (kind, s) == ("signed", 1.0):
            return finish(self._draw(kind, s, name))
        with np.errstate(all="ignore"):  # the table's inf and NaN patterns: never looked up
            table = finish(self._draw(kind, s, name, EVERY_HALF))
        return by_bits(table, z)

    def _times(self, packed, factor: float) -> LazyInputs:
        """A rounded draw (``_packed``) times a power of two >= 1, as float32: exact, or
        past the dtype's largest (inf), so no second rounding pass; a float16 input straight
        from its 2 bytes (``from_half``: at a 7B layer's headroom, 2^27, most values
        overflow, and NumPy's cast of its subnormals is slow). Each input made as it is
        read (an evaluation that meets NaN everywhere reads no more of them)."""
        return LazyInputs(self.normal, functools.partial(scaled_up, packed, self._dtypes, factor))

    def _power(self, j: int) -> int:
        """The exponent k of exponent draw ``j`` (``scales.exponent_power``)."""
        return exponent_power(self.base, j, [self._dtypes[n] for n in self.normal])

    def powers(self, j: int) -> dict[str, int]:
        """Each float input's binary exponent in ``apart`` draw ``j`` (``apart_powers``)."""
        floats = [n for n in self.normal if self._dtypes[n] != "bool"]
        return dict(zip(floats, apart_powers(j, [self._dtypes[n] for n in floats])))

    def all_finite(self, kind: str, s: float) -> bool:
        """Whether the first program computes every value finite in its dtypes on the draw
        (``kind``, ``s``): an ``apart`` or the ``zeros`` draw (``evaluate_finite``; its
        outputs go to the memo for the check). Where one is not, the draw constrains
        nothing: at X = 2^90 and W = 2^77 (float32) ``relu(X @ W)`` is 0 by way of -inf,
        and a kernel that sums the same terms in tiles meets inf - inf. Memoized."""
        key = ("all finite", kind, s)
        if key not in self.memo:
            out, finite = evaluate_finite(self.a, self.rounded(kind, s), dtype="native",
                                          rounded=True)
            self.out_a("native", kind, s, True, outputs=out)
            self.memo[key] = finite
        return self.memo[key]

    def trough(self) -> int | None:
        """The trough draw's binary exponent k (``scales.trough``; docs/verifier.md,
        section 5) on the draws (u + |z|) 2^k with z's sign (every float input, one k, u
        its unit: none below 2^k in its unit), found on the first program's outputs (each
        op rounded once, ``evaluate``'s "exact"), from ``LEAST_SCALE`` (or the inputs'
        least normal) up to 0; None without float inputs and outputs. There the outputs
        are at the edge of their dtypes' subnormals (or, at the least scale, still normal)
        while a value of a higher degree in the inputs' scale (``X @ W`` before a division
        by ``rms(X)``) is far below: a candidate that computes it in the outputs' dtype
        loses what underflow takes. Memoized; the search's evaluations are its own, and
        the one at k, where its outputs are at most ``TROUGH_KEPT`` bytes, goes to the memo
        for the check (else the check evaluates it again)."""
        with self._locks["trough"]:
            if "trough" not in self.memo:
                floats = [n for n, o in self.a.outputs.items() if str(o.dtype) in NATIVE_TINY]
                names = [n for n in self.normal if self._dtypes[n] in NATIVE_TINY]
                lo = max([self._range(n)[0] for n in names] + [LEAST_SCALE])
                kept: dict[int, dict] = {}
                k = trough_power(functools.partial(self._output_counts, floats, kept), lo) \
                    if floats and names else None
                if k in kept:  # the check's first-program outputs
                    self.out_a("exact", "pow2", float(k), True, outputs=kept[k])
                self.memo["trough"] = k
            return self.memo["trough"]

    def _output_counts(self, floats: list[str], kept: dict, k: int
                       ) -> tuple[int, int, int, float]:
        """The first program's float outputs ``floats`` on the trough's draw at ``k``: their
        elements, finite and normal (at least their dtype's smallest normal) ones, and the
        median of the finite ones' binary exponents above that smallest normal. Its
        outputs go to ``kept`` where they are small (``TROUGH_KEPT``): the search holds at
        most 9 sets of them."""
        out = self.evaluate(self.a, self.rounded("pow2", float(k)), dtype="exact",
                            rounded=True)
        if sum(np.asarray(v).nbytes for v in out.values()) <= TROUGH_KEPT:
            kept[k] = out
        self.release("pow2", float(k))
        self.memo.pop(("rounded", "pow2", float(k)), None)  # kept or not: one draw a k
        return output_counts(out, {n: NATIVE_TINY[str(self.a.outputs[n].dtype)]
                                   for n in floats})

    def members(self, kind: str, s: float) -> set[str]:
        """The inputs a ``peak`` (s: one input's position, -1 every input), ``peakset`` or
        ``offset`` draw (s: an index into ``corners.pairs`` or ``corners.offset_sets``)
        sets apart."""
        names = list(self.normal)
        if kind == "peak":
            return set(names) if s < 0 else {names[int(s)]}
        sets = self._sets("pairs" if kind == "peakset" or kind in PAIR_FORMS else
                          "ties" if kind == TIE else "offsets")
        return {names[i] for i in sets[int(s)]}

    def _sets(self, which: str) -> list[tuple[int, ...]]:
        """``corners.pairs`` or ``corners.offset_sets`` of the first program, made once."""
        key = ("corner sets", which)
        if key not in self.memo:
            self.memo[key] = pairs(self.a) if which == "pairs" else tie_pairs(self.a) if \
                which == "ties" else offset_sets(self.a)
        return self.memo[key]

    def offset(self, j: int) -> float:
        """The common offset of ``offset`` draw ``j`` (``corners.offset``)."""
        return common_offset(self._dtypes[n] for n in self.members("offset", j))

    def _fold(self, i: int) -> float:
        """The factor that takes input ``i``'s largest |z| to its peak over the headroom
        (1 where every |z| is 0: a zero input has no peak to fold up to)."""
        z = self.normal[list(self.normal)[i]]
        top = float(np.max(np.abs(z)))
        return self.peak(i) / self.headroom / top if top > 0.0 else 1.0

    def rounded(self, kind: str, s: float) -> dict:
        """The draw rounded once to each input's dtype (both programs read the same), as
        float32 arrays; kept in the memo in the inputs' own 2-byte formats (``packed``),
        except a draw at the headroom (``@h``): only the first program reads it, once."""
        if kind.endswith("@h"):
            return self._indexed(self._rounded(kind, s))
        return self._indexed(self._rounded_draw(kind, s))

    def _rounded_draw(self, kind: str, s: float) -> dict:
        cur = self._current  # up to four evaluations read a draw in a row (the first
        if getattr(cur, "key", None) != (kind, s):  # program, at the headroom, its truth,
            cur.key = cur.value = None  # the second): unpacked once per thread, the last
            if self._direct(kind, s):  # one dropped before the next is made; each input
                make = functools.partial(weakly(self._widened_one), kind, s, 1.0)  # first
            else:  # read (an evaluation that meets NaN everywhere reads no more of them)
                make = functools.partial(unpacked, self._packed(kind, s))
            cur.value = kept(self.normal, make)
            cur.key = (kind, s)
        return cur.value

    def _direct(self, kind: str, s: float) -> bool:
        """Whether the rounded draw (``kind``, ``s``) is made straight in float32 for this
        thread's evaluations: drawn input by input, kept by no memo and made from no other
        draw, nor already packed (an exponent draw's headroom check packs it first). One
        look-up per input (``_widened``, at the headroom too) instead of two (rounded to 2
        bytes, then widened), and no 2-byte copy held beside it."""
        if kind in UNKEPT:  # never kept: made again for each check that reads it
            return True
        by_one = kind in ("signed", "folded", "logits", "pow2", "apart", "zeros") or (
            kind == "exponent" and self._power(int(s)) < 0)
        return by_one and not self.keeps and (kind, s) not in _SHARED and \
            ("rounded", kind, s) not in self.memo

    def _widened(self, kind: str, s: float, factor: float = 1.0) -> LazyInputs:
        """A ``_direct`` draw rounded to each input's dtype, as float32 (times ``factor``,
        the headroom or 1), one look-up per large float16 input: the values that
        ``unpack`` (``factor`` 1) or ``_times`` of the packed draw give, exactly. Each
        input made as it is read."""
        return LazyInputs(self.normal, functools.partial(self._widened_one, kind, s, factor))

    def _widened_one(self, kind: str, s: float, factor: float, name: str) -> np.ndarray:
        def finish(x: np.ndarray) -> np.ndarray:
            packed = {name: pack(self._round(name, x), self._dtypes[name])}
            return unpack(packed[name]) if factor == 1.0 else scaled_up(packed, self._dtypes,
                                                                        factor, name)

        return self._looked_up(kind, s, name, finish)

    def release(self, kind: str, s: float) -> None:
        """The check on draw (``kind``, ``s``) is done: drop this thread's unpacked draw
        (``rounded``), and without a search's memo the rounded draw too, unless another
        draw is made from it (("folded", 0.5) for the per-input draws, ("signed", 1) for
        the exponent draws)."""
        self._current.key = self._current.value = self._current.outputs = None
        if "_coded" in self.__dict__:  # this thread's last weight looked up (``Coded``)
            self._coded.forget()
        if not self.keeps and (kind, s) not in _SHARED:
            self.memo.pop(("rounded", kind, s), None)

    def _packed(self, kind: str, s: float):
        """The draw rounded once to each input's dtype, in its 2-byte format (``pack``),
        memoized: each input as it is first read, or all at once where a search's memo
        keeps it for the next candidate's ``Draws`` (the rounded draws it keeps, and the
        shared ones): what is made input by input reads this ``Draws``, which the next
        must not keep alive."""
        key = ("rounded", kind, s)
        if key not in self.memo:
            src = self._rounded(kind, s)
            if self.keeps or not self._own_memo and (kind, s) in _SHARED:
                self.memo[key] = {n: pack(x, self._dtypes[n]) for n, x in src.items()}
            else:
                rounded, dtypes = weakly(self._rounded), self._dtypes  # its own memo: no
                self.memo[key] = kept(self.normal, lambda n: pack(rounded(kind, s)[n],  # cycle
                                                                   dtypes[n]))
        return self.memo[key]

    def _round(self, name: str, x: np.ndarray) -> np.ndarray:
        """Input ``name``'s draw ``x`` rounded once to its dtype: a float16 input straight
        to float16 (``pack``'s format: one conversion instead of three), the others as
        ``round_to`` rounds them."""
        dtype, x = self._dtypes[name], np.asarray(x)
        if name in self.index:  # its fixed draw, read in place of this one (``_indexed``):
            return x  # nothing to round (an int8 weight's wrap_int: a pass over it a draw)
        if x.dtype == np.float16:  # a float16 input's normal draw itself: already rounded,
            return x  # and packed as it is (``pack``: a view of the draw, no copy)
        if dtype == "float16" and x.ndim and not uniform(x):
            return to_half(x)
        return round_to(x, dtype)  # a broadcast of one value stays one (a bool mask too)

    def _rounded(self, kind: str, s: float):
        if kind == "peakfold@h":  # the others' values at the headroom made once for all
            # (the per-input draws: 0.65 s a draw at 7B)
            name, others = list(self.normal)[int(s)], self._folded_at_headroom()
            own = functools.partial(scaled_up, {name: self._packed(kind[:-2], s)[name]},
                                    self._dtypes, self.headroom)
            return LazyInputs(self.normal, lambda n: own(n) if n == name else others[n])
        if kind.endswith("@h") and self._direct(kind[:-2], s):  # one look-up an input
            return self._widened(kind[:-2], s, self.headroom)
        if kind.endswith("@h"):
            return self._times(self._packed(kind[:-2], s), self.headroom)
        if kind == "exponent" and self._power(int(s)) >= 0:
            return self._times(self._packed("signed", 1.0), 2.0 ** self._power(int(s)))
        if kind == "peakfold":  # the others as in ("folded", 0.5): rounded (and kept) once
            name, others = list(self.normal)[int(s)], self._packed("folded", 0.5)
            return LazyInputs(self.normal, lambda n: others[n] if n != name else
                              self._looked_up(kind, s, n, functools.partial(self._round, n)))
        if kind in _ONE_BY_ONE:  # one input's draw at a time, made as it is read
            return LazyInputs(self.normal, lambda n: self._looked_up(
                kind, s, n, functools.partial(self._round, n)))
        return {n: self._round(n, x) for n, x in self.inputs(kind, s).items()}

    def _folded_at_headroom(self) -> LazyInputs:
        """("folded", 0.5) at the headroom, float32 (read-only), made once per ``Draws``:
        every per-input draw at the headroom is it with one input changed. Kept where it is
        small (``memory.keeps_folded``); a larger one is made input by input where each
        per-input draw reads it (one table look-up an input: ``scaled_up``)."""
        with self._locks["folded@h"]:
            if self._folded_h is None:  # each input made as it is first read, then kept
                make = functools.partial(scaled_up, self._packed("folded", 0.5), self._dtypes,
                                         self.headroom)
                self._folded_h = kept(self.normal, make) if keeps_folded(self.a) else \
                    LazyInputs(self.normal, make)
            return self._folded_h

    def out_a(self, dtype: str | None, kind: str, s: float, of_rounded: bool = False,
              inputs: dict | None = None, outputs: dict | None = None) -> dict:
        """The first program's outputs on the draw (kind, s), as drawn or rounded to the
        inputs' dtypes (``of_rounded``), in float64 (``dtype=None``) or natively; memoized.
        ``inputs``: that draw, when the caller already holds it; ``outputs``: the outputs,
        when the caller already computed them (kept as they are)."""
        key, store = (dtype, kind, s, of_rounded), self._store(kind)
        if key not in store and outputs is not None:
            store[key] = outputs
        if key not in store:
            if inputs is None:
                inputs = self.rounded(kind, s) if of_rounded else self.inputs(kind, s)
            store[key] = self.evaluate(self.a, inputs, dtype=dtype,
                                       rounded=of_rounded and dtype in ("native", "exact"))
        return store[key]

    def truth(self, kind: str, s: float, of_rounded: bool = True) -> tuple[dict, str]:
        """The first program's ground truth on the draw, rounded to the inputs' dtypes
        (``of_rounded``) or as drawn (``truth.truth``: wider than float64 within its work
        bound), and the precision it was computed in; memoized."""
        key, store = ("truth", kind, s, of_rounded), self._store(kind)
        if key not in store:
            if precision(self.a) == "float64":  # the float64 outputs are the truth
                store[key] = self.out_a(None, kind, s, of_rounded), "float64"
            else:
                inputs = self.rounded(kind, s) if of_rounded else self.inputs(kind, s)
                store[key] = truth(self.a, inputs, {} if kind in UNKEPT else
                                   self.out_a(None, kind, s, of_rounded))
        return store[key]

    def _store(self, kind: str) -> dict:
        """Where the first program's outputs on a draw of ``kind`` are kept: the memo, or
        for the ``UNKEPT`` draws this thread's store, emptied when its check is done
        (``release``)."""
        if kind.removesuffix("@h") not in UNKEPT:
            return self.memo
        if getattr(self._current, "outputs", None) is None:
            self._current.outputs = {}
        return self._current.outputs

    def _finite(self, values: dict) -> bool:
        """Whether the first program is finite (below the dtype's largest) with every input
        one value (``values``); memoized by those values: the bisection of every input
        starts at every input 1, one evaluation for all of them."""
        # an index, int8 or fp8 input holds its fixed draw (``_indexed``) whatever its value
        # here: a bisection of one (each input's peak) evaluates one program, kept once
        index = self.index if SHARE_FIXED else {}
        key = ("finite", tuple(None if n in index else float(values[n]) for n in self.normal))
        if key in self.memo:
            return self.memo[key]
        inputs = rounded_inputs(self.a, {  # (a fixed input's stand-in: one value, replaced)
            n: np.broadcast_to(np.float64(0.0 if n in index else v), self.normal[n].shape)
            for n, v in values.items()})
        inputs.update(self._rounded_index if SHARE_FIXED else rounded_inputs(self.a, {
            n: self.index.get(n, x) for n, x in inputs.items()}))
        if is_graph(self.a):  # each node computed once for the values of its own inputs
            deps, fixed = self._deps, fixed_keys(self.a)

            def key_of(n) -> tuple:
                if id(n) in fixed and SHARE_FIXED:  # of the fixed inputs alone
                    return fixed[id(n)] and ("fixed", "finite", fixed[id(n)])
                return id(n), tuple(float(values[x]) for x in deps[id(n)] if x not in index)

            out = evaluate_kept(self.a, inputs, key_of, _Routed(self._kept, self._fixed),
                                coded=self._coded if SHARE_FIXED else None)
        else:
            out = evaluate(self.a, inputs, dtype="native", rounded=True)
        with np.errstate(invalid="ignore"):
            found = all(bool(np.all(np.abs(x.reshape(-1)[:1] if uniform(x) else x) <
                                    self.limit)) for x in out.values())
        self.memo[key] = found
        return found

    @functools.cached_property
    def _rounded_index(self) -> dict[str, np.ndarray]:
        """The index, int8 and fp8 inputs' fixed draws as ``rounded_inputs`` gives them (the
        ``_finite`` evaluations' inputs), made once."""
        return {n: round_to(np.asarray(x), self._dtypes[n]) for n, x in self.index.items()}

    @functools.cached_property
    def _coded(self) -> Coded:
        """The int8 and fp8 inputs' fixed draws of the ``_finite`` evaluations as a table of
        their values and a code an element (``floating.Coded``): there every float input is
        one value, and the elementwise ops on such a weight (its dequantization) are
        computed on the 256 values of its table."""
        coded = Coded()
        for n, x in self.index.items():
            if self._dtypes[n] in CODED_DTYPES:
                found = table_codes(x)
                if found is None:
                    continue
                codes, table = found
                coded.add(x, codes, table)  # as drawn, and as ``_finite`` reads it
                y = self._rounded_index[n]
                if y is not x and y.shape == x.shape and y.dtype.kind == "f":
                    wide = table.astype(y.dtype)  # the same values, exactly (wider)
                    if np.array_equal(wide[codes].view(UINT[y.dtype.itemsize]),
                                      y.view(UINT[y.dtype.itemsize])):
                        coded.add(y, codes, wide)
        return coded

    @functools.cached_property
    def _fixed(self) -> KeptValues:
        """Node values computed from the fixed inputs alone (an int8 weight's cast to
        float16), by ``fixed_keys`` and how they were evaluated: the same in every draw, and
        in both programs where both compute them. At most ``FIXED_BYTES`` of arrays."""
        return KeptValues(FIXED_BYTES)

    def shares(self, program) -> bool:
        """Whether ``evaluate`` keeps ``program``'s values computed from the fixed inputs."""
        return bool(SHARE_FIXED and self.index and is_graph(program))

    def evaluate(self, program, inputs, dtype: str | None = None, rounded: bool = False
                 ) -> dict:
        """``evaluate(program, inputs, dtype, rounded)`` on a draw of this ``Draws`` (its
        fixed inputs' values are ``self.index``'s), each value computed from the fixed
        inputs alone read from ``_fixed`` where an evaluation of either program left it."""
        if not self.shares(program):
            return evaluate(program, inputs, dtype=dtype, rounded=rounded)
        fixed, how = fixed_keys(program), ("draw", dtype, rounded)

        def key_of(n) -> tuple | None:
            k = fixed.get(id(n))
            return k and ("fixed", how, k)

        return evaluate_kept(program, inputs, key_of, self._fixed, dtype, rounded,
                             coded=self._coded)

    @functools.cached_property
    def _deps(self) -> dict[int, tuple[str, ...]]:
        """The inputs each node of the first program (a Graph) depends on, by node id."""
        return {k: tuple(sorted(v)) for k, v in input_deps(self.a).items()}

    @functools.cached_property
    def _kept(self) -> KeptValues:
        """The first program's node values in the ``_finite`` evaluations, by the values of
        the inputs each depends on: a bisection changes one or two inputs, and the nodes
        that read neither (a layer's attention, while its MLP's weights move) are computed
        once for all of them. At most ``KEPT_BYTES`` of arrays."""
        return KeptValues(KEPT_BYTES)

    def peak(self, i: int) -> float:
        """The largest magnitude for which the first program stays finite (in its dtypes)
        when input ``i`` (-1: every input) is that one value and the others are 1: a
        bisection over the binary exponent (to a quarter), from 1 up to the dtype's
        largest; 1 when it is not finite at 1. Memoized; the bisections of several inputs
        run at once on the verifier's threads (each is deterministic: a second thread that
        computes the same one finds the same value)."""
        return self._peak(("peak", i), self.members("peak", i))

    def peak_set(self, j: int) -> float:
        """``peak`` of the inputs of ``corners.pairs`` ``j`` together (the same value)."""
        return self._peak(("peakset", j), self.members("peakset", j))

    def tie_values(self, j: int) -> dict[str, float]:
        """The values of ``peaktie`` draw ``j`` (``corners.tie_pairs``): the pair's first
        input at ``peak`` (rounded to its dtype; not over the headroom), the second at half
        its last place (``corners.half_ulp``), the others 1."""
        (i, k), names = self._sets("ties")[j], list(self.normal)
        big = float(round_to(np.float64(self.peak(i)), self._dtypes[names[i]]))
        return {names[i]: big, names[k]: half_ulp(big, self._dtypes[names[i]])}

    def pair_values(self, kind: str, j: int) -> dict[str, float]:
        """The inputs' values in the draw of pair ``j`` (``corners.pairs``) in the form
        ``kind`` (``corners.PAIR_FORMS``): the pair's first input at the largest magnitude
        P for which the first program stays finite, the second at ``factor`` times P (or
        1 / P, ``factor`` None), the other float inputs at ``REST_BELOW`` below the largest
        value they keep it finite at together (the pair at 1) where ``rest`` is "large",
        at the smallest normal of their dtypes where it is "small", else 1; every float
        input over the headroom, a bool mask 1. Memoized."""
        key = ("pair form", kind, j)
        if key not in self.memo:
            factor, rest = PAIR_FORMS[kind]
            names = list(self.normal)
            first, second = (names[i] for i in self._sets("pairs")[j])
            others = {n for n in names if n not in (first, second)  # float inputs
                      and self._dtypes[n] != "bool" and "int" not in self._dtypes[n]}
            base = {}
            if rest == "large" and others:
                low = self._peak(("rest", j), others) / REST_BELOW
                base = dict.fromkeys(others, low)
            elif rest == "small":
                base = {n: NATIVE_TINY.get(self._dtypes[n], NATIVE_TINY["float32"])
                        for n in others}
            big = self._peak(key + ("peak",), {first, second}, base, {second: factor})
            values = {first: big, second: 1.0 / big if factor is None else big * factor,
                      **base}
            self.memo[key] = {n: v / self.headroom for n, v in values.items()}
        return self.memo[key]

    def _peak(self, key: tuple, members: set[str], base: dict | None = None,
              factors: dict | None = None) -> float:
        """``peak`` of the inputs ``members`` together, memoized under ``key``: each times
        its ``factors`` (1 if none; None: at the reciprocal), the other inputs at ``base``
        (1 if none)."""
        if key in self.memo:
            return self.memo[key]
        names = list(self.normal)
        base, factors = base or {}, factors or {}

        def at(n: str, k: float) -> float:
            if n not in members:
                return base.get(n, 1.0)
            f = factors.get(n, 1.0)
            return 2.0 ** -k if f is None else 2.0 ** k * f

        def ok(k: float) -> bool:
            return self._finite({n: at(n, k) for n in names})

        hi = max(self._range(n)[1] for n in members)
        lo, top = 0.0, hi + 1.0  # ok(lo), not ok(top)
        if not ok(lo):
            self.memo[key] = 1.0
            return 1.0
        if ok(hi + 0.99):
            lo = top = hi + 0.99
        while top - lo > 0.25:
            mid = math.floor((lo + top) * 2.0) / 4.0
            mid = mid if lo < mid < top else (lo + top) / 2.0
            lo, top = (mid, top) if ok(mid) else (lo, mid)
        self.memo[key] = 2.0 ** lo
        return self.memo[key]

    def logit_scale(self) -> float:
        """The input scale c at which the first program's exp arguments on N(0, c^2)
        inputs have standard deviation ``LOGIT_STD`` (estimated from scales 1 and 2 in
        float64, as a power law); 1 without an exp."""
        with self._locks["logits"]:
            if "logits" not in self.memo:
                self.memo["logits"] = logit_scale(self.a, self.inputs)
            return self.memo["logits"]

    def static(self, b) -> str:
        """The static float-safety checks of ``b`` on this draw (``floatsafe.static_check``;
        for a MuGraph also ``kernelsafe.kernel_check``, inside its kernels). The float64
        outputs of both programs on the draw, where a check ran them, are kept for the
        float64 check of the same draw (("signed", 1)): the first program's in the memo (as
        ``out_a`` keeps them), the second's in ``b_outputs``; ``static_done`` is set once
        this returns or raises (that check waits on it)."""
        try:
            inputs = self.inputs("signed", 1.0)
            sink: dict = {"a": {}, "b": {}}
            if is_graph(self.a) and not is_graph(b) and "fingerprints" not in self.memo:
                fa = unsampled(self.a)  # only its dtypes are compared with a MuGraph's: the
            else:  # first program runs once, in ``kernel_check`` or the strict float64 check
                with self._locks["fingerprints"]:
                    if "fingerprints" not in self.memo:
                        self.memo["fingerprints"] = fingerprints(self.a, inputs, sink["a"]) \
                            if is_graph(self.a) else None
                fa = self.memo["fingerprints"]
            why = static_check(self.a, b, fa, fingerprints(b, inputs, sink["b"])
                               if fa is not None and is_graph(b) else None)
            if not why and fa is not None and hasattr(b, "node_samples"):  # in its kernels
                why = kernel_check(self.a, b, inputs, sink)
            outs = {k: {n: np.asarray(v, dtype=np.float64) for n, v in got.items()}
                    for k, got in sink.items()}
            if set(outs["a"]) == set(self.a.outputs):
                with self.lock:
                    self.memo.setdefault((None, "signed", 1.0, False), outs["a"])
            if set(outs["b"]) == set(self.a.outputs):
                self.b_outputs = outs["b"]
            return why
        finally:
            self.static_done.set()
