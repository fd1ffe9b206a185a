"""Einsum-style index naming of kernel-level fragments, schedules and their legality.

The block-tiling level turns a kernel-level ``Graph`` fragment into a custom
kernel. Every tensor dim of the fragment gets an index name (``index_fragment``, in
``indexing.py``), unified through the ops: aligned broadcast dims of size > 1, a matmul's
contraction and batch dims, transposes; a sum/mean or a matmul contraction
marks its index *reduced* at that node. Dims split or merged by a reshape, and
concat axes, get indices that cannot be scheduled.

A ``Schedule`` maps index names to grid axes (with a block count) and at most
one index to the forloop (range F); every other index is read whole. A split
schedule puts a reduced index on the grid (FlashDecoding: two kernels), with
optionally a loop over the same index inside each split and its own grid for
the second (reduce) kernel.
``check_schedule`` decides whether a schedule is legal and classifies every
node for the chosen loop index L:

- ``inv``: does not depend on L-indexed values (computed wherever it is needed);
- ``loop``: carries L (computed per iteration on L-tiles);
- ``red``: a reduction over L (tile reduction + forloop accumulator);
- ``post``: depends on such a reduction (computed after the loop);
- ``max``: a max over L: a running maximum m (online softmax). The loop may subtract it
  and exponentiate, ``exp(x - m)``, and sum such values over L: their accumulators are
  rescaled by ``exp(m_old - m_new)`` as m grows (``mugraph/online.py``).

A value that carries L but depends on a reduction over L (softmax's
``A / sum(A)`` before ``@ V``) needs a second pass and is refused. Lowering
(``lower``, ``add_kernel``) lives in ``lower.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..frontend.graph import Graph
from ..ir.node import REDUCE, Node, Op, Shape, fmt_shape, numel
from .indexing import Indexing, ScheduleError, index_fragment, reshape_groups

# -- schedules ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """Index name -> grid axis (in order, with a block count), one loop index with range F.

    ``Schedule(grid={"a": 4, "c": 8}, loop="b", forloop=4)``: index ``a`` on grid
    axis x in 4 blocks, ``c`` on y in 8, ``b`` cut into 4 loop iterations.
    ``split`` names a grid index that is reduced in the fragment (FlashDecoding:
    each block reduces one part, a second kernel sums the parts). The loop is
    then either none or the split index itself: ``Schedule({"a": 2, "d": 8},
    "d", 4, "d")`` cuts ``d`` into 8 parts, one per block, and loops over each
    part in 4 iterations with accumulators, so a block's tiles stay small.
    ``reduce_grid`` (split only) is the grid of the second kernel, which sums
    the parts and runs what follows the reduction; by default the first
    kernel's grid without the split index. It may cut the outputs' indices
    more finely (a memory-bound kernel wants blocks on many SMs), but keeps
    every grid index that some reduction does not carry with the same count
    (the parts carry one copy per such block).
    """

    grid: tuple[tuple[str, int], ...] = ()
    loop: str | None = None
    forloop: int = 1
    split: str | None = None
    reduce_grid: tuple[tuple[str, int], ...] | None = None

    def __post_init__(self) -> None:
        grid = self.grid.items() if isinstance(self.grid, Mapping) else self.grid
        object.__setattr__(self, "grid", tuple([(str(i), int(b)) for i, b in grid]))
        if self.reduce_grid is not None:
            red = self.reduce_grid
            red = red.items() if isinstance(red, Mapping) else red
            object.__setattr__(self, "reduce_grid", tuple([(str(i), int(b)) for i, b in red]))

    @property
    def axes(self) -> dict[str, int]:
        """Index name -> grid axis."""
        return {idx: a for a, (idx, _) in enumerate(self.grid)}

    @property
    def blocks(self) -> int:
        """Total number of thread blocks."""
        return numel(tuple(b for _, b in self.grid))

    @cached_property
    def cuts(self) -> dict[str, int]:
        """Index -> into how many tiles it is cut (grid blocks, times the loop range for the
        loop index); an index not there is whole. Read-only (worked out once)."""
        cuts = dict(self.grid)
        if self.loop is not None:
            cuts[self.loop] = cuts.get(self.loop, 1) * self.forloop
        return cuts

    def parts(self, idx: str | None) -> int:
        """Into how many tiles index ``idx`` is cut (grid blocks, loop range, or 1)."""
        return 1 if idx is None else self.cuts.get(idx, 1)

    @property
    def second_grid(self) -> tuple[tuple[str, int], ...]:
        """The grid of a split schedule's reduce kernel (``reduce_grid`` or the default)."""
        if self.reduce_grid is not None:
            return self.reduce_grid
        return tuple((i, b) for i, b in self.grid if i != self.split)

    def __str__(self) -> str:
        grid = ", ".join(f"{i}={b}" for i, b in self.grid) or "1"
        loop = f" loop {self.loop}/{self.forloop}" if self.loop else ""
        red = ""
        if self.reduce_grid is not None:
            red = " reduce grid(" + (", ".join(f"{i}={b}" for i, b in self.reduce_grid)
                                     or "1") + ")"
        return f"grid({grid}){loop}" + (f" split {self.split}" if self.split else "") + red


class Plan:
    """A legal schedule with every node's stage kind (``kind``: id(node) -> "inv", "loop",
    "red", "post" or "max") and tile shape (``tiles``: id(node) -> its tile; None: the
    schedule's cuts of every node, worked out when first read: most schedules checked are
    never lowered)."""

    def __init__(self, indexing: Indexing, schedule: Schedule, kind: dict[int, str],
                 tiles: dict[int, Shape] | None = None) -> None:
        self.indexing, self.schedule, self.kind = indexing, schedule, kind
        self._tiles = tiles

    @property
    def tiles(self) -> dict[int, Shape]:
        """id(node) -> the node's tile shape under the schedule (read-only)."""
        if self._tiles is None:
            self._tiles = _cut_tiles(self.indexing, self.schedule)
        return self._tiles

    def tile(self, node: Node) -> Shape:
        """The tile shape of ``node`` under the schedule."""
        return self.tiles[id(node)]

    def __repr__(self) -> str:
        return f"Plan({self.schedule}, kinds={list(self.kind.values())})"


def _cut_tiles(ix: Indexing, s: Schedule) -> dict[int, Shape]:
    """Every node's tile under ``s``: each dim cut by its index's grid blocks and loop
    range (``Schedule.cuts``), each distinct (shape, indices) cut once."""
    cut = s.cuts
    pairs, members = ix.shape_groups
    shapes = [tuple(size // cut.get(i, 1) for size, i in zip(shape, dims))
              for shape, dims in pairs]
    return {key: shapes[g] for key, g in members}


def reduces(ix: Indexing, node: Node, idx: str) -> bool:
    """Whether ``node`` is a sum/mean over index ``idx`` or a matmul contracting it."""
    if node.op in REDUCE:
        src = ix.of(node.srcs[0])
        return any(src[a] == idx for a in node.arg[0])
    if node.op is Op.MATMUL:
        return ix.of(node.srcs[0])[-1] == idx
    return False


def classify(ix: Indexing, idx: str | None, running: bool = False) -> dict[int, str]:
    """Stage kind of every node when index ``idx`` is the loop (or the split grid) index.

    Raises ``ScheduleError`` when a value indexed by ``idx`` depends on a
    reduction over ``idx``: that needs a second pass over the loop. With ``running`` (a
    loop, not a split), a max over ``idx`` is a running maximum (kind ``max``): the loop may
    use it in ``exp(x - max)`` and sum such values (the online softmax; ``_taint``).
    """
    kind: dict[int, str] = {}
    red_of: dict[int, Node] = {}
    taint: dict[int, str] = {}  # reads a running maximum: "m", "raw" (x - m) or "scaled"
    for n in ix.nodes:
        after = next((red_of[id(s)] for s in n.srcs if id(s) in red_of), None)
        tainted = [s for s in n.srcs if id(s) in taint]
        if idx is not None and n.op is Op.MAX and reduces(ix, n, idx):
            if not running:
                raise ScheduleError(
                    f"index {ix.describe(idx)}: {n.describe()} takes a max over it; only a "
                    "loop or a split carries a max (a running maximum)")
            if not n.arg[1] or after is not None or tainted:
                raise ScheduleError(
                    f"loop index {ix.describe(idx)}: {n.describe()} can be a running maximum "
                    "only with keepdims, of values that depend on no other reduction over it")
            kind[id(n)], taint[id(n)] = "max", "m"
            continue
        if tainted and after is not None:
            if any(taint[id(s)] != "m" for s in tainted):
                raise ScheduleError(f"loop index {ix.describe(idx)}: {n.describe()} mixes a "
                                    "running maximum's values with a finished reduction")
            kind[id(n)], red_of[id(n)] = "post", after  # reads the final maximum
            continue
        if idx is not None and reduces(ix, n, idx):
            k = "red"
            if tainted:
                _taint(ix, n, tainted, taint, idx, reduced=True)
            if after is not None:
                raise ScheduleError(
                    f"loop index {ix.describe(idx)}: {n.describe()} reduces over it a value that "
                    f"already depends on {after.describe()}, an earlier reduction over it; that "
                    "needs two passes over the loop")
            red_of[id(n)] = n
        elif tainted:  # computed in the loop from the running maximum
            k = "loop"
            taint[id(n)] = _taint(ix, n, tainted, taint, idx)
        elif idx is not None and idx in ix.of(n):
            k = "loop"
            if after is not None:
                raise ScheduleError(
                    f"loop index {ix.describe(idx)}: {n.describe()} combines values indexed by "
                    f"it with {after.describe()}, a reduction over it, before the loop is over; "
                    "a single loop pass cannot express that. Move the op after the last "
                    "reduction first (the algebraic level rewrites (A / sum(A)) @ V into "
                    "(A @ V) / sum(A))")
        elif any(kind[id(s)] == "loop" for s in n.srcs):
            raise ScheduleError(f"loop index {ix.describe(idx)}: {n.describe()} drops it "
                                "without reducing over it")
        elif after is not None:
            k = "post"
            red_of[id(n)] = after
        else:
            k = "inv"
        kind[id(n)] = k
    return kind


def running_exps(ix: Indexing, idx: str) -> list[Node]:
    """The exps that read a running maximum when ``idx`` is the loop (or split) index: the
    ``exp(x - m)`` of an online softmax, m a max over ``idx`` still growing in the loop,
    whose sums are rescaled as m grows (rules/block.egg's ``Online`` rule permits each).
    Raises ``ScheduleError`` as ``classify`` does."""
    kind = classify(ix, idx, running=True)
    reads = {id(n) for n in ix.nodes if kind[id(n)] == "max"}
    found = []
    for n in ix.nodes:
        if kind[id(n)] != "post" and any(id(s) in reads for s in n.srcs):
            reads.add(id(n))
            if n.op is Op.EXP:
                found.append(n)
    return found


_KEEPS = (Op.TRANSPOSE, Op.RESHAPE)


def _taint(ix: Indexing, n: Node, tainted: list[Node], taint: Mapping[int, str], idx: str,
           reduced: bool = False) -> str:
    """How ``n`` reads a running maximum m: "raw" (x - m, m with coefficient -1), "scaled"
    (exp(x - m) times values free of m), which a loop sum may accumulate with a rescale by
    exp(m_old - m_new). Anything else (exp(m - x), exp(2 (x - m)), ...) raises."""
    kinds = [taint[id(s)] for s in tainted]
    free = [s for s in n.srcs if id(s) not in taint]
    one = len(tainted) == 1 and len(set(map(id, n.srcs))) == len(n.srcs)
    t = kinds[0] if one else ""
    out = ""
    if n.op is Op.SUB and one and ((n.srcs[1] is tainted[0] and t == "m") or
                                   (n.srcs[0] is tainted[0] and t == "raw")):
        out = "raw"
    elif n.op is Op.ADD and one and t == "raw":
        out = "raw"
    elif n.op is Op.EXP and t == "raw":
        out = "scaled"
    elif n.op in (Op.MUL, Op.MATMUL) and one and t == "scaled":
        out = "scaled"
    elif n.op is Op.DIV and one and n.srcs[0] is tainted[0] and t == "scaled":
        out = "scaled"
    elif n.op in _KEEPS + (Op.SUM,) and t in ("raw", "scaled") and (n.op is not Op.SUM or
                                                                     t == "scaled"):
        out = t
    if not out or (reduced and out != "scaled") or (free and n.op is Op.EXP):
        raise ScheduleError(
            f"loop index {ix.describe(idx)}: {n.describe()} reads the running maximum in a "
            "form the online softmax cannot rescale (only exp(x - max), times or divided by "
            "values free of the max, may be summed over the loop)")
    return out


def _check_grid(ix: Indexing, s: Schedule) -> None:
    if not 0 <= len(s.grid) <= 3:
        raise ScheduleError(f"schedule {s}: at most 3 grid axes, got {len(s.grid)}")
    used = [i for i, _ in s.grid] + ([s.loop] if s.loop not in (None, s.split) else [])
    if len(set(used)) != len(used):
        raise ScheduleError(f"schedule {s}: an index is scheduled twice")
    for idx, blocks in s.grid:
        if idx not in ix.sizes:
            raise ScheduleError(f"schedule {s}: unknown index {idx!r} "
                                f"(known: {', '.join(sorted(ix.sizes))})")
        if idx in ix.fixed:
            raise ScheduleError(f"schedule {s}: grid index {ix.describe(idx)} cannot be "
                                f"scheduled: it is {ix.fixed[idx]}")
        if not ix.divides(idx, blocks):
            raise ScheduleError(f"schedule {s}: {blocks} blocks do not divide grid index "
                                f"{ix.describe(idx)}{_groups(ix, idx)}")
        if idx in ix.reduced and idx != s.split:
            raise ScheduleError(
                f"schedule {s}: grid index {ix.describe(idx)} is reduced inside the fragment "
                f"by {ix.reduced[idx][0].describe()}, so no block could compute its outputs "
                "alone (put it in the loop, or use a split reduction)")


def _groups(ix: Indexing, idx: str) -> str:
    """Why an index of a reshape's major dim is cut only into parts of whole groups."""
    if idx not in ix.units:
        return ""
    return (f" into parts of whole groups (a reshape's major dim carries it too: its parts "
            f"must divide {ix.unit(idx)})")


def check_schedule(ix: Indexing | Graph, schedule: Schedule) -> Plan:
    """Check ``schedule`` against the fragment; returns the ``Plan`` or raises ``ScheduleError``.

    The verdict is kept in ``ix.memo`` (an ``Indexing`` does not change once built): a
    schedule checked again against the same indexing gets the same ``Plan`` (read-only), or
    a ``ScheduleError`` with the same message, without the work."""
    ix = ix if isinstance(ix, Indexing) else index_fragment(ix)
    return _kept(ix, ("check", schedule), lambda: _check(ix, schedule))


def _kinds(ix: Indexing, idx: str | None) -> dict[int, str]:
    """``classify(ix, idx, running=True)``, kept in ``ix.memo`` (read-only; its
    ``ScheduleError`` raised again with the same message)."""
    return _kept(ix, ("kinds", idx), lambda: classify(ix, idx, running=True))


def _kept(ix: Indexing, key: tuple, work: Callable[[], Any]) -> Any:
    """``work()``'s result kept in ``ix.memo`` at ``key``: its value, or its
    ``ScheduleError`` raised again (a fresh one with the same message) at each call."""
    if key not in ix.memo:
        try:
            ix.memo[key] = work()
        except ScheduleError as exc:
            ix.memo[key] = exc
    found = ix.memo[key]
    if isinstance(found, ScheduleError):
        raise type(found)(*found.args)
    return found


def _check(ix: Indexing, schedule: Schedule) -> Plan:
    """``check_schedule``'s work, not memoized."""
    s = schedule
    _check_grid(ix, s)
    if s.loop is not None:
        if s.split is not None and s.loop != s.split:
            raise ScheduleError(f"schedule {s}: a split reduction loops over its split index "
                                "or not at all")
        if s.loop not in ix.sizes:
            raise ScheduleError(f"schedule {s}: unknown loop index {s.loop!r}")
        if s.loop in ix.fixed:
            raise ScheduleError(f"schedule {s}: loop index {ix.describe(s.loop)} cannot be "
                                f"scheduled: it is {ix.fixed[s.loop]}")
        if s.loop not in ix.reduced:
            raise ScheduleError(f"schedule {s}: loop index {ix.describe(s.loop)} is not reduced "
                                "(by a sum or a matmul contraction) in the fragment")
        if s.forloop < 1 or not ix.divides(s.loop, s.parts(s.loop)):
            raise ScheduleError(f"schedule {s}: forloop range {s.forloop} does not divide loop "
                                f"index {ix.describe(s.loop)}"
                                + (" split across the grid" if s.loop == s.split else "")
                                + _groups(ix, s.loop))
    elif s.forloop != 1:
        raise ScheduleError(f"schedule {s}: a forloop range without a loop index")
    if s.split is not None and (s.split not in dict(s.grid) or s.split not in ix.reduced):
        raise ScheduleError(f"schedule {s}: split index {s.split!r} must be a reduced grid index")
    kind = _kinds(ix, s.loop if s.split is None else s.split)
    for name, out in ix.graph.outputs.items():
        if out.op is Op.CONST:
            raise ScheduleError(f"output {name!r} is a constant")
        carried = set(ix.of(out))
        late = s.split is not None and kind[id(out)] != "loop"
        if s.split is not None and s.loop is not None and not late:
            raise ScheduleError(f"schedule {s}: output {name!r} carries the split index "
                                f"{ix.describe(s.split)}; with a loop inside each split it "
                                "would need the grid and the loop on one output dim")
        for idx, blocks in s.grid:
            if blocks > 1 and idx not in carried and not (late and idx == s.split):
                raise ScheduleError(
                    f"schedule {s}: output {name!r} {fmt_shape(out.shape)} does not carry grid "
                    f"index {ix.describe(idx)}, so {blocks} blocks would write the same elements")
    if s.reduce_grid is not None:
        _check_reduce_grid(ix, s, kind)
    cuts = [s.parts] + ([lambda i: dict(s.second_grid).get(i, 1)] if s.split else [])
    for n in ix.nodes:
        if n.op is Op.RESHAPE:
            for parts in cuts:  # the first kernel's tiles, a split's reduce kernel's
                _check_cut_reshape(ix, s, n, parts)
    return Plan(ix, s, kind)  # its tiles are cut when first read


def _check_cut_reshape(ix: Indexing, s: Schedule, n: Node, parts) -> None:
    """A reshape that splits or merges dims whose major index ``s`` cuts (into ``parts(i)``
    tiles) regroups each tile (``[Nt, K/P] -> [Nt, G/P, g]``): the Triton backend reshapes
    only tiles it holds unpadded, so every dim of such a group's tile must be a power of
    two."""
    src = n.srcs[0]
    for gs, go in reshape_groups(src.shape, n.shape):
        idx = ix.of(src)[gs[0]]
        if (len(gs) == 1 and len(go) == 1) or idx in ix.fixed or parts(idx) == 1:
            continue
        dims = [src.shape[d] // parts(ix.of(src)[d]) for d in gs] + \
            [n.shape[d] // parts(ix.of(n)[d]) for d in go]
        if any(d & (d - 1) for d in dims):
            raise ScheduleError(
                f"schedule {s}: {n.describe()} {fmt_shape(src.shape)} -> {fmt_shape(n.shape)} "
                f"regroups tiles of {dims} elements along index {ix.describe(idx)}; the Triton "
                "backend reshapes only tiles whose dims are powers of two")


def _check_reduce_grid(ix: Indexing, s: Schedule, kind: dict[int, str]) -> None:
    """A split schedule's reduce-kernel grid: outputs' indices, lost indices kept as they are."""
    if s.split is None:
        raise ScheduleError(f"schedule {s}: a reduce grid needs a split reduction")
    red = s.reduce_grid or ()
    if len(red) > 3 or len({i for i, _ in red}) != len(red):
        raise ScheduleError(f"schedule {s}: the reduce grid needs at most 3 distinct indices")
    late = [(name, out) for name, out in ix.graph.outputs.items() if kind[id(out)] != "loop"]
    for idx, blocks in red:
        if idx not in ix.sizes or idx == s.split or idx in ix.reduced or idx in ix.fixed:
            raise ScheduleError(f"schedule {s}: reduce grid index {idx!r} must be a known, "
                                "unreduced, unfixed index")
        if not ix.divides(idx, blocks):
            raise ScheduleError(f"schedule {s}: {blocks} blocks do not divide reduce grid index "
                                f"{ix.describe(idx)}")
        for name, out in late:
            if blocks > 1 and idx not in ix.of(out):
                raise ScheduleError(f"schedule {s}: output {name!r} does not carry reduce grid "
                                    f"index {ix.describe(idx)}")
    grid, red_d = dict(s.grid), dict(red)
    for n in ix.nodes:
        if kind[id(n)] != "red":
            continue
        for idx, blocks in grid.items():
            if idx != s.split and idx not in ix.of(n) and red_d.get(idx) != blocks:
                raise ScheduleError(
                    f"schedule {s}: {n.describe()} does not carry grid index "
                    f"{ix.describe(idx)}, so its parts hold one copy per block along it; the "
                    f"reduce grid must keep {idx}={blocks}")
