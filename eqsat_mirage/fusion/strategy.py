"""Candidate schedules for the block-tiling level: a configurable strategy.

Mirage's defaults: between 32 and 4096 thread blocks, forloop ranges
{4, 16, 64}, up to 3 grid axes. ``candidate_schedules`` enumerates legal
schedules of a fragment (``schedule.py``) in a deterministic order, bounded by
``Strategy.max_candidates``:

- grid: subsets of the indices that are not reduced, not fixed by a reshape or
  concat, and carried by every output; block counts are divisors of the index
  size that keep a matmul operand's tile at least ``min_tile`` (indices that
  cannot be split that way stay whole); the total block count must lie in
  [min_blocks, max_blocks], or, when the shapes allow no such grid, be the
  largest count <= max_blocks that they do allow;
- loop: each reduced index whose single-pass lowering is legal (longest first), with each range
  of ``loop_ranges`` that divides it, preferring ranges that keep a matmul's
  contraction tile >= ``min_tile`` (the smallest dividing range otherwise);
  ``prefer_long_chunks`` drops the loops over a streamed weight's contraction (a matmul
  at decode's batch of 1-16 rows) in chunks under 512 bytes a row where a longer one is
  there; ``prefer_pow2_chunks`` then drops, among the schedules a caller may use, the loops over
  a matmul contraction whose chunk Triton pads when another loop over it has a chunk that
  is a power of two (on an H100 a chunk of 172, held as 256, ran 2.2x slower than 256);
  no loop only when no index can be looped, or when the only ones that can are carried by
  a reshape's major dim too (the reshaped dims read whole stay a choice: a loop over a few
  groups may cost more than reading them at once);
- split (``allow_split_reduction``): a reduced index on a grid axis instead,
  FlashDecoding style (two kernels, see ``lower.py``), in parts of at least
  ``min_split_part`` elements. Split grids
  are taken round robin over their block counts (so a bound keeps some of
  every count), each in variants: without a loop, or with a loop over each
  split (``split_loops``: ranges of ``loop_ranges`` keeping a matmul's
  contraction tile >= ``min_tile``), which keeps a block's tiles small enough
  for shared memory when the split parts are long; and with the reduce kernel
  on the first grid's other axes or on one of ``reduce_grids`` finer grids
  (the first grids over the outputs' indices with at least ``min_blocks``
  blocks): the reduce kernel is memory-bound and reads the parts, so it wants
  blocks on many SMs. Two variants of every split grid (the shortest loop with
  a finer reduce grid, and the plain split) come before the other variants.

Grid choices and loop choices are interleaved diagonally (the i-th grid with
the j-th loop in order of i + j), so a bound keeps variety in both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import combinations, product

from ..cost.tiles import pow2_ceil
from ..frontend.graph import Graph
from ..ir.node import ITEMSIZE, Op, numel
from .indexing import Indexing, ScheduleError, index_fragment
from .schedule import Schedule, check_schedule, classify


@dataclass(frozen=True)
class Strategy:
    """Where candidate grids and loops come from (Mirage's defaults)."""

    min_blocks: int = 32
    max_blocks: int = 4096
    loop_ranges: tuple[int, ...] = (4, 16, 64)
    max_grid_axes: int = 3
    allow_split_reduction: bool = False
    min_tile: int = 16  # smallest tile of a matmul operand dim, where the shapes allow
    max_candidates: int = 32
    max_grid_choices: int = 4096  # enumeration bound before ordering
    split_loops: bool = True  # split schedules also with a loop over each split
    min_split_part: int = 16  # smallest part of a split reduction (FlashDecoding's parts
    #   are thousands long; a part of 2 sums in a second kernel what a block sums in one)
    reduce_grids: int = 1  # finer reduce-kernel grids tried per split schedule


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def block_counts(ix: Indexing, idx: str, strategy: Strategy) -> list[int]:
    """Block counts (>= 2) for grid index ``idx``: divisors keeping matmul tiles >= min_tile
    (``GEMV_ROWS`` for a weight's rows that only matrix-vector products read)."""
    size = ix.sizes[idx]
    floor = (min(strategy.min_tile, GEMV_ROWS) if idx in gemv_rows(ix) else
             strategy.min_tile if idx in ix.matmul else 1)
    return [b for b in _divisors(ix.unit(idx))  # (what divides a reshape's major dim too)
            if 2 <= b <= strategy.max_blocks and size // b >= floor]


def grid_indices(ix: Indexing, late_ok: str | None = None) -> list[str]:
    """Indices that may go on the grid: unreduced, unfixed and carried by every output.

    With ``late_ok`` (a split index) outputs computed after the split reduction
    need not carry that index.
    """
    kind = classify(ix, late_ok, running=True) if late_ok is not None else {}
    out = []
    for idx in ix.sizes:
        if idx in ix.reduced or idx in ix.fixed:
            continue
        if all(idx in ix.of(n) for n in ix.graph.outputs.values()):
            out.append(idx)
    if late_ok is not None:
        early = [n for n in ix.graph.outputs.values() if kind[id(n)] == "loop"]
        if all(late_ok in ix.of(n) for n in early):
            out.append(late_ok)
    return out


def loop_choices(ix: Indexing, strategy: Strategy) -> list[tuple[str | None, int]]:
    """Legal (loop index, range) pairs, longest index first; ``[(None, 1)]`` if none.

    The longest reduction first: looping over it is what keeps the largest
    intermediate (attention's S x N scores) on chip.
    """
    out: list[tuple[str | None, int]] = []
    order = list(ix.sizes)
    for idx in sorted(order, key=lambda i: (-ix.sizes[i], order.index(i))):
        if idx not in ix.reduced or idx in ix.fixed:
            continue
        try:
            classify(ix, idx, running=True)  # a loop may carry a running maximum
        except ScheduleError:
            continue
        size = ix.sizes[idx]
        ranges = [f for f in strategy.loop_ranges if ix.divides(idx, f)]
        floor = strategy.min_tile if idx in ix.matmul else 1
        good = [f for f in ranges if size // f >= floor]
        out += [(idx, f) for f in (good or ranges[:1])]
    if all(idx in ix.units for idx, _ in out):  # only indices a reshape's major dim carries
        out.append((None, 1))  # (were they read whole, as they were before they could loop,
    return out  # no schedule that fused them is lost)


def loop_chunk(ix: Indexing, s: Schedule) -> int:
    """The elements of ``s``'s loop index one loop iteration takes (per split part)."""
    size = ix.sizes[s.loop]
    if s.split == s.loop:
        size //= dict(s.grid).get(s.split, 1)
    return size // max(1, s.forloop)


def prefer_pow2_chunks(ix: Indexing, scheds: list[Schedule]) -> list[Schedule]:
    """``scheds`` less the loops over a matmul contraction whose chunk is not a power of two
    (Triton pads it: 11008 / 64 = 172 is held as 256) where another of ``scheds`` loops over
    the same index in chunks that are; the order is kept. Applied to the schedules a caller
    may use (after the e-graph's permit), so a loop is never dropped for one it may not
    take."""
    def padded(s: Schedule) -> bool | None:  # None: not a loop over a contraction
        if s.loop is None or s.forloop < 2 or s.loop not in ix.matmul:
            return None
        chunk = loop_chunk(ix, s)
        return pow2_ceil(chunk) != chunk  # held padded to a power of two

    return _beside_better(scheds, padded)


def _beside_better(scheds: list[Schedule], worse) -> list[Schedule]:
    """``scheds`` less those ``worse`` says True of whose loop index another schedule of
    ``scheds`` loops over with ``worse`` False (None: not a loop ``worse`` judges); the
    order is kept."""
    better = {s.loop for s in scheds if worse(s) is False}
    return [s for s in scheds if not (worse(s) and s.loop in better)]


# a matmul whose other operand has at most this many rows streams its weight (decode's
# x @ W.T at batch 1): its time is the weight's bytes over the rate its loads reach
STREAMING_ROWS = 16
# the shortest K chunk of a streamed weight, in bytes a row: on an H200 (2026-12-04,
# bench/gemv_probe.py) one matrix-vector kernel read a 90 MB float16 weight at 3.1 TB/s in
# chunks of 512-1024 values and at 2.5 TB/s or more in every chunk of 256 or more with 3
# stages; the 7B layer's plans, in chunks of 64 (128 B), read theirs at 2.0 TB/s
LONG_CHUNK_BYTES = 512
# the fewest weight rows a block of a matrix-vector product takes (``gemv_rows``): on an H200
# the probe's fastest kernels for the 7B layer's down projection (4096 rows) took 8 rows a
# block (512 blocks, 3.1 TB/s); 16-row blocks make 256, under two waves of 132 SMs
GEMV_ROWS = 8


def streamed(ix: Indexing) -> dict[str, int]:
    """Contraction index -> the streamed operand's bytes per element, for each matmul of
    the fragment whose other operand has at most ``STREAMING_ROWS`` rows (batch included)."""
    out: dict[str, int] = {}
    for n in ix.nodes:
        if n.op is not Op.MATMUL or ix.of(n.srcs[0])[-1] is None:
            continue  # (None: a contraction of 1)
        a, b = n.srcs
        k, size = ix.of(a)[-1], a.shape[-1]
        weight = b if numel(a.shape) // size <= STREAMING_ROWS else \
            a if numel(b.shape) // size <= STREAMING_ROWS else None
        if weight is not None:
            out[k] = min(out.get(k, ITEMSIZE[weight.dtype]), ITEMSIZE[weight.dtype])
    return out


def gemv_rows(ix: Indexing) -> frozenset[str]:
    """The indices that are a matmul operand's dim only as the rows of a weight multiplied
    by one vector (decode's ``x @ W.T`` at batch 1: the other operand has one row, so a
    block's tile product is a broadcast product summed over K, never a ``tl.dot``, and its
    rows need not fill the tensor core's 16)."""
    gemv, other = set(), set()
    for n in ix.nodes:
        if n.op is not Op.MATMUL or ix.of(n.srcs[0])[-1] is None:
            continue
        (a, b), dims = n.srcs, set()
        for s in (a, b):
            dims.update(i for i in ix.of(s)[-2:] if i is not None)
        rows = (ix.of(b)[-1] if numel(a.shape) == a.shape[-1] else  # one row times W
                ix.of(a)[-2] if numel(b.shape) == b.shape[-2] else None)  # W times a column
        if rows is not None:
            gemv.add(rows)
        other.update(dims - {rows})
    return frozenset(gemv - other - {None})


def prefer_long_chunks(ix: Indexing, scheds: list[Schedule]) -> list[Schedule]:
    """``scheds`` less the loops over a streamed weight's contraction (``streamed``) in
    chunks shorter than ``LONG_CHUNK_BYTES``, where another of ``scheds`` loops over the same
    index in chunks at least that long; the order is kept. Applied as ``prefer_pow2_chunks``
    is, to the schedules a caller may use."""
    rows = streamed(ix)

    def short(s: Schedule) -> bool | None:  # None: not a loop over a streamed contraction
        if s.loop is None or s.forloop < 2 or s.loop not in rows:
            return None
        return loop_chunk(ix, s) * rows[s.loop] < LONG_CHUNK_BYTES

    return _beside_better(scheds, short)


def _grids(ix: Indexing, indices: list[str], strategy: Strategy,
           fixed: tuple[tuple[str, int], ...] = ()) -> list[tuple[tuple[str, int], ...]]:
    """Grid choices over ``indices`` (plus the ``fixed`` axes), filtered by the block range."""
    counts = {i: block_counts(ix, i, strategy) for i in indices}
    free = [i for i in indices if counts[i]]
    room = strategy.max_grid_axes - len(fixed)
    found: list[tuple[tuple[str, int], ...]] = []
    for n in range(0, min(room, len(free)) + 1):
        for subset in combinations(free, n):
            for blocks in product(*(counts[i] for i in subset)):
                grid = tuple(zip(subset, blocks)) + fixed
                if _total(grid) <= strategy.max_blocks:
                    found.append(grid)
                if len(found) >= strategy.max_grid_choices:
                    return _keep(ix, found, strategy)
    return _keep(ix, found, strategy)


def _keep(ix: Indexing, found: list, strategy: Strategy) -> list[tuple[tuple[str, int], ...]]:
    if not found:
        return []
    within = [g for g in found if _total(g) >= strategy.min_blocks]
    if not within:  # the shapes allow no grid that large: keep the largest they allow
        best = max(_total(g) for g in found)
        within = [g for g in found if _total(g) == best]
    order = {i: n for n, i in enumerate(ix.sizes)}
    return sorted(within, key=lambda g: (len(g), _total(g), [(order[i], b) for i, b in g]))


def _total(grid: tuple[tuple[str, int], ...]) -> int:
    total = 1
    for _, b in grid:
        total *= b
    return total


def _diagonal(grids: list, loops: list) -> list[tuple]:
    pairs = [(i + j, i, j) for i in range(len(grids)) for j in range(len(loops))]
    return [(grids[i], loops[j]) for _, i, j in sorted(pairs)]


def candidate_schedules(fragment: Graph | Indexing, strategy: Strategy | None = None
                        ) -> list[Schedule]:
    """Legal schedules of ``fragment`` under ``strategy``, deterministic and bounded.

    Raises ``ScheduleError`` only when the fragment cannot be indexed.
    """
    strategy = strategy or Strategy()
    ix = fragment if isinstance(fragment, Indexing) else index_fragment(fragment)
    # the order does not depend on max_candidates: one listing per indexing and strategy
    # less its bound, kept in ``ix.memo`` and checked as far as a bound asks (the quick
    # and the full strategies of one fragment share theirs)
    key = ("listing", replace(strategy, max_candidates=0))
    listing = ix.memo.get(key)
    if listing is None:
        listing = ix.memo[key] = _Listing(_ordered(ix, strategy))
    return listing.legal(ix, strategy.max_candidates)


class _Listing:
    """A strategy's schedules of one indexing in order (``_ordered``), and the legal ones
    among them as far as they have been checked."""

    def __init__(self, ordered: list[Schedule]) -> None:
        self.ordered, self.checked, self.found = ordered, 0, []

    def legal(self, ix: Indexing, bound: int) -> list[Schedule]:
        """The first ``bound`` legal schedules (``check_schedule``), or all of them."""
        while len(self.found) < bound and self.checked < len(self.ordered):
            s = self.ordered[self.checked]
            try:
                check_schedule(ix, s)
            except ScheduleError:
                self.checked += 1
                continue
            self.checked += 1
            self.found.append(s)
        return self.found[:max(bound, 0)]


def _ordered(ix: Indexing, strategy: Strategy) -> list[Schedule]:
    """``candidate_schedules``' schedules before the legality check and the bound: grids
    with loops diagonally, interleaved with the split variants, each once, in order."""
    pairs = _pairs(ix, strategy)
    if strategy.allow_split_reduction:
        splits: list[Schedule] = []
        for idx, _ in loop_choices(ix, Strategy(loop_ranges=(1,))):
            if idx is None:
                continue
            eligible = grid_indices(ix, idx)
            if idx not in eligible:
                continue
            others = [i for i in eligible if i != idx]
            choices = [_grids(ix, others, strategy, ((idx, b),))
                       for b in block_counts(ix, idx, strategy)
                       if ix.sizes[idx] // b >= strategy.min_split_part]
            splits += [Schedule(g, None, 1, idx) for gs in choices for g in gs]
        splits = sorted(splits, key=lambda s: (abs(s.blocks - strategy.min_blocks),
                                               -ix.sizes[s.split], len(s.grid), str(s)))
        memo: dict = {}
        variants = [_split_variants(ix, s, strategy, memo) for s in _by_total(splits)]
        splits = [v for vs in variants for v in vs[:_PRIMARY]] + \
            [v for vs in variants for v in vs[_PRIMARY:]]
        pairs = [s for pair in _interleave(pairs, splits) for s in pair]
    return list(dict.fromkeys(pairs))


def _pairs(ix: Indexing, strategy: Strategy) -> list[Schedule]:
    """The unsplit schedules: grids with loops diagonally (read-only; kept in ``ix.memo``
    for the strategy less its bound and its splits, which they do not depend on)."""
    key = ("pairs", replace(strategy, max_candidates=0, allow_split_reduction=False))
    found = ix.memo.get(key)
    if found is None:
        grids = _grids(ix, grid_indices(ix), strategy)
        loops = loop_choices(ix, strategy)
        found = ix.memo[key] = [Schedule(g, loop, f) for g, (loop, f) in _diagonal(grids, loops)]
    return found


def _by_total(splits: list[Schedule]) -> list[Schedule]:
    """Round robin over the block counts (in order of first appearance), so that a bound on
    the candidates keeps the best few splits of every count: the power-of-two shapes give no
    count near one block per SM on 132 SMs (128 is below, 256 above), and which of the two
    is cheaper is the cost model's call, not the ordering's."""
    groups: dict[int, list[Schedule]] = {}
    for s in splits:
        groups.setdefault(s.blocks, []).append(s)
    lists = list(groups.values())
    return [g[i] for i in range(max(map(len, lists), default=0)) for g in lists if i < len(g)]


_PRIMARY = 2  # variants of each split grid listed before any grid's other variants


def _split_variants(ix: Indexing, s: Schedule, strategy: Strategy,
                    memo: dict | None = None) -> list[Schedule]:
    """Variants of split schedule ``s`` (loop over each split, reduce-kernel grid), in order:
    the shortest loop (fewest iterations, largest tiles) with the first finer reduce grid,
    ``s`` as it is, then the other combinations (longer loops later, reduce grids in
    ``_grids`` order). Equal costs keep the first: the shortest loop that fits. ``memo``
    caches the reduce grids by split index and kept axes across the calls of one listing."""
    idx, parts = s.split, dict(s.grid)[s.split]
    size = ix.sizes[idx] // parts
    floor = strategy.min_tile if idx in ix.matmul else 1
    ranges = sorted(f for f in set(strategy.loop_ranges)
                    if f > 1 and ix.divides(idx, parts * f) and size // f >= floor)
    loops = [(idx, f) for f in ranges] if strategy.split_loops else []
    reduce: list[tuple[tuple[str, int], ...] | None] = [None]
    if strategy.reduce_grids > 0:
        memo = {} if memo is None else memo
        if idx not in memo:
            kind = classify(ix, idx, running=True)
            late = [n for n in ix.graph.outputs.values() if kind[id(n)] != "loop"]
            memo[idx] = (late, [n for n in ix.nodes if kind[id(n)] == "red"])
        late, reds = memo[idx]
        # grid indices some reduction does not carry keep their counts (its parts hold copies)
        kept = tuple((i, b) for i, b in s.grid
                     if i != idx and any(i not in ix.of(n) for n in reds))
        if (idx, kept) not in memo:
            free = [i for i in ix.sizes if i not in ix.reduced and i not in ix.fixed
                    and i not in dict(kept) and late and all(i in ix.of(n) for n in late)]
            memo[idx, kept] = _grids(ix, free, strategy, kept)
        default = tuple((i, b) for i, b in s.grid if i != idx)
        finer = sorted((g for g in memo[idx, kept]  # the most blocks first: a reduce kernel
                        if sorted(g) != sorted(default) and _total(g) > _total(default)),
                       key=lambda g: -_total(g))  # is latency-bound with few

        reduce += finer[:strategy.reduce_grids]
    first = [(loops[0], reduce[1] if len(reduce) > 1 else None)] if loops else []
    combos = first + [((None, 1), None)] + [
        (lf, r) for lf in [(None, 1)] + loops for r in reduce]
    return list(dict.fromkeys([Schedule(s.grid, loop, f, idx, red)
                               for (loop, f), red in combos]))


def _interleave(a: list, b: list) -> list[tuple]:
    """[(a0, b0), (a1, b1), ...] then the rest of the longer list, one at a time."""
    n = min(len(a), len(b))
    return [(a[i], b[i]) for i in range(n)] + [(x,) for x in a[n:] + b[n:]]


def reduction_index(ix: Indexing, node) -> str | None:
    """The index that ``node`` (a node of ``ix``'s fragment) reduces: the reduced axis of a
    sum, mean or max, a matmul's contraction; None when it reduces none. This maps a block
    rule's ``(LoopOver r F)`` / ``(SplitOver r P)``, named by the reduction r, to an index."""
    for idx, nodes in ix.reduced.items():
        if any(n is node for n in nodes):
            return idx
    return None


def kern_choice(s: Schedule, idx: str) -> tuple[int, int]:
    """What schedule ``s`` does with index ``idx`` as a Kern term says it: (loop range F,
    split parts P), 1 for no loop (``NoLoop``) and for no split (``NoSplit``)."""
    return (s.forloop if s.loop == idx else 1, dict(s.grid).get(idx, 1) if s.split == idx else 1)
