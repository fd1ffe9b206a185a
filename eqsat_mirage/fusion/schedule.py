"""Einsum-style index naming of kernel-level fragments, schedules and their legality.

The block-tiling level turns a kernel-level ``Graph`` fragment into a custom
kernel. Every tensor dim of the fragment gets an index name (``index_fragment``),
unified through the ops: aligned broadcast dims of size > 1, a matmul's
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
- ``post``: depends on such a reduction (computed after the loop).

A value that carries L but depends on a reduction over L (softmax's
``A / sum(A)`` before ``@ V``) needs a second pass and is refused. Lowering
(``lower``, ``add_kernel``) lives in ``lower.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from string import ascii_lowercase

from ..frontend.graph import Graph
from ..ir.check import check
from ..ir.errors import MirageError
from ..ir.node import BINARY, REDUCE, UNARY, Node, Op, Shape, fmt_shape, numel


class ScheduleError(MirageError):
    """A fragment that cannot be indexed, or a schedule that is illegal for it."""


# -- index naming ---------------------------------------------------------------------------


class UnionFind:
    """Disjoint sets of hashable keys (path halving)."""

    def __init__(self) -> None:
        self.parent: dict = {}

    def add(self, key) -> None:
        self.parent.setdefault(key, key)

    def find(self, key):
        self.parent.setdefault(key, key)  # a dim never tied to anything (an unused input)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a, b) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


@dataclass
class Indexing:
    """The index names of a fragment: per node, one name per dim (``None`` for size 1)."""

    graph: Graph
    nodes: list[Node]
    dims: dict[int, tuple[str | None, ...]]
    sizes: dict[str, int]
    reduced: dict[str, list[Node]] = field(default_factory=dict)
    fixed: dict[str, str] = field(default_factory=dict)  # index -> why it cannot be scheduled
    origin: dict[str, str] = field(default_factory=dict)  # index -> "X dim 1"
    matmul: set[str] = field(default_factory=set)  # indices of some matmul operand's last 2 dims

    def of(self, node: Node) -> tuple[str | None, ...]:
        """The index names of ``node``'s dims."""
        return self.dims[id(node)]

    def input_index(self, name: str, dim: int) -> str | None:
        """The index name of dim ``dim`` of input ``name``."""
        return self.of(self.graph.inputs[name])[dim]

    def output_index(self, name: str, dim: int) -> str | None:
        """The index name of dim ``dim`` of output ``name``."""
        return self.of(self.graph.outputs[name])[dim]

    def describe(self, idx: str) -> str:
        """``'b' (X dim 1, size 256)``: an index with where it first appears."""
        return f"{idx!r} ({self.origin.get(idx, '?')}, size {self.sizes[idx]})"

    def einsum(self, node: Node) -> str:
        """The node's indices as an einsum subscript (``1`` for a size-1 dim)."""
        return ",".join(i or "1" for i in self.of(node))


def _reshape_groups(src: Shape, out: Shape) -> list[tuple[list[int], list[int]]]:
    """Minimal groups of non-1 dims (source dims, output dims) with equal products."""
    si = [i for i, d in enumerate(src) if d > 1]
    oi = [i for i, d in enumerate(out) if d > 1]
    groups, i, j = [], 0, 0
    while i < len(si) and j < len(oi):
        gs, go, ps, po = [si[i]], [oi[j]], src[si[i]], out[oi[j]]
        i, j = i + 1, j + 1
        while ps != po:
            if ps < po:
                gs.append(si[i])
                ps, i = ps * src[si[i]], i + 1
            else:
                go.append(oi[j])
                po, j = po * out[oi[j]], j + 1
        groups.append((gs, go))
    return groups


def _letters():
    n = 0
    while True:
        yield ascii_lowercase[n % 26] + (str(n // 26) if n >= 26 else "")
        n += 1


def index_fragment(graph: Graph) -> Indexing:
    """Name every dim of every node of ``graph`` (see the module docstring).

    Raises ``ScheduleError`` when one tensor would carry the same index on two
    dims (e.g. ``X @ X.T`` with a square X: the two uses of X need different
    names), or for a matmul with a 1-d operand.
    """
    check(graph)
    nodes = graph.nodes()
    uf = UnionFind()
    reduced: list[tuple[tuple[int, int], Node]] = []
    fixed: dict[tuple[int, int], str] = {}
    matmul: list[tuple[int, int]] = []
    for n in nodes:
        for d, size in enumerate(n.shape):
            if size > 1:
                uf.add((id(n), d))

    def tie(src: Node, sd: int, n: Node, d: int) -> None:
        if src.shape[sd] > 1 and src.shape[sd] == n.shape[d]:
            uf.union((id(src), sd), (id(n), d))

    for n in nodes:
        r = len(n.shape)
        if n.op in UNARY:
            for d in range(r):
                tie(n.srcs[0], d, n, d)
        elif n.op in BINARY:
            for s in n.srcs:
                for i in range(1, len(s.shape) + 1):
                    tie(s, len(s.shape) - i, n, r - i)
        elif n.op is Op.MATMUL:
            a, b = n.srcs
            if len(a.shape) < 2 or len(b.shape) < 2:
                raise ScheduleError(f"{n.describe()} of {fmt_shape(a.shape)} and "
                                    f"{fmt_shape(b.shape)}: block matmuls need operands of at "
                                    "least 2 dims (reshape the 1-d operand first)")
            ra, rb = len(a.shape), len(b.shape)
            if a.shape[-1] > 1:
                uf.union((id(a), ra - 1), (id(b), rb - 2))
                reduced.append(((id(a), ra - 1), n))
            tie(a, ra - 2, n, r - 2)
            tie(b, rb - 1, n, r - 1)
            for s, rs in ((a, ra), (b, rb)):
                matmul += [(id(s), rs - 2), (id(s), rs - 1)]
                for i in range(3, rs + 1):
                    tie(s, rs - i, n, r - i)
        elif n.op in REDUCE:
            axes, keepdims = n.arg
            src = n.srcs[0]
            kept = [d for d in range(len(src.shape)) if d not in axes]
            for ax in axes:
                if src.shape[ax] > 1:
                    reduced.append(((id(src), ax), n))
            for pos, d in enumerate(kept):
                tie(src, d, n, d if keepdims else pos)
        elif n.op is Op.TRANSPOSE:
            for d, sd in enumerate(n.arg):
                tie(n.srcs[0], sd, n, d)
        elif n.op is Op.RESHAPE:
            src = n.srcs[0]
            for gs, go in _reshape_groups(src.shape, n.shape):
                if len(gs) == 1 and len(go) == 1:
                    tie(src, gs[0], n, go[0])
                    continue
                why = f"split or merged by {n.describe()} {fmt_shape(src.shape)} -> " \
                      f"{fmt_shape(n.shape)}"
                fixed.update({(id(src), d): why for d in gs})
                fixed.update({(id(n), d): why for d in go})
        elif n.op is Op.CONCAT:
            why = f"the concat axis of {n.describe()}"
            for s in n.srcs:
                for d in range(r):
                    if d == n.arg:
                        if s.shape[d] > 1:
                            fixed[(id(s), d)] = why
                    else:
                        tie(s, d, n, d)
            if n.shape[n.arg] > 1:
                fixed[(id(n), n.arg)] = why
    return _name_classes(graph, nodes, uf, reduced, fixed, matmul)


def _name_classes(graph, nodes, uf, reduced, fixed, matmul) -> Indexing:
    names: dict = {}
    letters = _letters()
    ix = Indexing(graph, nodes, {}, {})
    order = list(graph.inputs.values()) + nodes
    for n in order:
        if id(n) in ix.dims:
            continue
        dims = []
        for d, size in enumerate(n.shape):
            if size == 1:
                dims.append(None)
                continue
            root = uf.find((id(n), d))
            if root not in names:
                names[root] = next(letters)
                where = f"input {n.arg!r}" if n.op is Op.INPUT else n.describe()
                ix.origin[names[root]] = f"{where} dim {d}"
                ix.sizes[names[root]] = size
            dims.append(names[root])
        named = [x for x in dims if x is not None]
        if len(set(named)) != len(named):
            dup = next(x for x in named if named.count(x) > 1)
            raise ScheduleError(
                f"cannot index {n.describe()} {fmt_shape(n.shape)} consistently: dims "
                f"{[d for d, x in enumerate(dims) if x == dup]} get the same index "
                f"{ix.describe(dup)} (one tensor used in two roles, e.g. X @ X.T; give the "
                "second use its own input)")
        ix.dims[id(n)] = tuple(dims)
    for slot, node in reduced:
        ix.reduced.setdefault(names[uf.find(slot)], []).append(node)
    for slot, why in fixed.items():
        ix.fixed.setdefault(names[uf.find(slot)], why)
    ix.matmul = {names[uf.find(s)] for s in matmul if s in uf.parent}
    return ix


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
        object.__setattr__(self, "grid", tuple((str(i), int(b)) for i, b in grid))
        if self.reduce_grid is not None:
            red = self.reduce_grid
            red = red.items() if isinstance(red, Mapping) else red
            object.__setattr__(self, "reduce_grid", tuple((str(i), int(b)) for i, b in red))

    @property
    def axes(self) -> dict[str, int]:
        """Index name -> grid axis."""
        return {idx: a for a, (idx, _) in enumerate(self.grid)}

    @property
    def blocks(self) -> int:
        """Total number of thread blocks."""
        return numel(tuple(b for _, b in self.grid))

    def parts(self, idx: str | None) -> int:
        """Into how many tiles index ``idx`` is cut (grid blocks, loop range, or 1)."""
        if idx is None:
            return 1
        blocks = dict(self.grid).get(idx, 1)
        return blocks * self.forloop if idx == self.loop else blocks

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


@dataclass
class Plan:
    """A legal schedule with every node's stage kind and tile shape."""

    indexing: Indexing
    schedule: Schedule
    kind: dict[int, str]  # id(node) -> "inv" | "loop" | "red" | "post"
    tiles: dict[int, Shape]

    def tile(self, node: Node) -> Shape:
        """The tile shape of ``node`` under the schedule."""
        return self.tiles[id(node)]


def reduces(ix: Indexing, node: Node, idx: str) -> bool:
    """Whether ``node`` is a sum/mean over index ``idx`` or a matmul contracting it."""
    if node.op in REDUCE:
        src = ix.of(node.srcs[0])
        return any(src[a] == idx for a in node.arg[0])
    if node.op is Op.MATMUL:
        return ix.of(node.srcs[0])[-1] == idx
    return False


def classify(ix: Indexing, idx: str | None) -> dict[int, str]:
    """Stage kind of every node when index ``idx`` is the loop (or the split grid) index.

    Raises ``ScheduleError`` when a value indexed by ``idx`` depends on a
    reduction over ``idx``: that needs a second pass over the loop.
    """
    kind: dict[int, str] = {}
    red_of: dict[int, Node] = {}
    for n in ix.nodes:
        after = next((red_of[id(s)] for s in n.srcs if id(s) in red_of), None)
        if idx is not None and reduces(ix, n, idx):
            k = "red"
            if n.op is Op.MAX:
                raise ScheduleError(
                    f"loop index {ix.describe(idx)}: {n.describe()} takes a max over it; a "
                    "max is not carried through a loop or split (each block needs its whole "
                    "row)")
            if after is not None:
                raise ScheduleError(
                    f"loop index {ix.describe(idx)}: {n.describe()} reduces over it a value that "
                    f"already depends on {after.describe()}, an earlier reduction over it; that "
                    "needs two passes over the loop")
            red_of[id(n)] = n
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
        if blocks < 1 or ix.sizes[idx] % blocks:
            raise ScheduleError(f"schedule {s}: {blocks} blocks do not divide grid index "
                                f"{ix.describe(idx)}")
        if idx in ix.reduced and idx != s.split:
            raise ScheduleError(
                f"schedule {s}: grid index {ix.describe(idx)} is reduced inside the fragment "
                f"by {ix.reduced[idx][0].describe()}, so no block could compute its outputs "
                "alone (put it in the loop, or use a split reduction)")


def check_schedule(ix: Indexing | Graph, schedule: Schedule) -> Plan:
    """Check ``schedule`` against the fragment; returns the ``Plan`` or raises ``ScheduleError``."""
    ix = ix if isinstance(ix, Indexing) else index_fragment(ix)
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
        if s.forloop < 1 or ix.sizes[s.loop] % s.parts(s.loop):
            raise ScheduleError(f"schedule {s}: forloop range {s.forloop} does not divide loop "
                                f"index {ix.describe(s.loop)}"
                                + (" split across the grid" if s.loop == s.split else ""))
    elif s.forloop != 1:
        raise ScheduleError(f"schedule {s}: a forloop range without a loop index")
    if s.split is not None and (s.split not in dict(s.grid) or s.split not in ix.reduced):
        raise ScheduleError(f"schedule {s}: split index {s.split!r} must be a reduced grid index")
    kind = classify(ix, s.loop if s.split is None else s.split)
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
    tiles = {id(n): tuple(size // s.parts(i) for size, i in zip(n.shape, ix.of(n)))
             for n in ix.nodes}
    return Plan(ix, s, kind, tiles)


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
        if blocks < 1 or ix.sizes[idx] % blocks:
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
