"""Einsum-style index naming of kernel-level fragments (``index_fragment``).

Every tensor dim of a fragment gets an index name, unified through the ops: aligned
broadcast dims of size > 1, a matmul's contraction and batch dims, transposes; a
sum/mean/max or a matmul contraction marks its index *reduced* at that node. A reshape that
splits one dim into several (``[N, K] -> [N, G, g]``) or merges several into one gives the
leading (major) dim of the group the index of the single dim: cutting that index into P
parts takes, of the single dim, P contiguous chunks of K / P and, of the major dim, chunks of
G / P, the same elements when the minor dims (``g``) are whole, which they are: they get
indices that cannot be scheduled (``Indexing.fixed``), as do concat axes and the dims of a
reshape that regroups several dims into several. An index so carried by dims of different
sizes is cut only into parts that divide each (``Indexing.divides``: a loop over K in chunks
of a multiple of g). Schedules over these names: ``schedule.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from string import ascii_lowercase

from ..frontend.graph import Graph
from ..ir.check import check
from ..ir.errors import MirageError
from ..ir.node import (
    BINARY,
    COMPARE,
    GATHERS,
    LOGIC,
    LOGIC_BINARY,
    REDUCE,
    UNARY,
    Node,
    Op,
    Shape,
    fmt_shape,
)
from ..ir.ops import SPECS


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
    # index -> the gcd of the sizes of the dims carrying it, where they differ (a split's
    # major dim: G of the K it splits into [G, g]); ``sizes`` holds the largest
    units: dict[str, int] = field(default_factory=dict)
    # what was worked out from this indexing (fixed once ``index_fragment`` returns it):
    # ``schedule.check_schedule``'s verdict per schedule and stage kinds per loop index, so
    # the schedules listed by several strategies, then lowered, are checked once
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def shape_groups(self) -> tuple[tuple[tuple[Shape, tuple[str | None, ...]], ...],
                                    tuple[tuple[int, int], ...]]:
        """The distinct (shape, index names) pairs of the nodes, and (id(node), its pair's
        position) for each node in order: a schedule's tiles are worked out once per pair
        (``schedule.check_schedule``: tens of thousands of schedules). Read-only."""
        pairs: dict[tuple, int] = {}
        members = tuple((id(n), pairs.setdefault((n.shape, self.dims[id(n)]), len(pairs)))
                        for n in self.nodes)
        return tuple(pairs), members

    def unit(self, idx: str) -> int:
        """The largest count of parts every dim carrying ``idx`` may be cut into evenly
        (its size, or for an index carried by a reshape's major dim too, their gcd)."""
        return self.units.get(idx, self.sizes[idx])

    def divides(self, idx: str, parts: int) -> bool:
        """Whether index ``idx`` can be cut into ``parts`` equal parts on every dim carrying
        it (a K chunk of a multiple of g where a reshape splits K into [K / g, g])."""
        return parts >= 1 and self.unit(idx) % parts == 0

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


def reshape_groups(src: Shape, out: Shape) -> list[tuple[list[int], list[int]]]:
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


class _Ties:
    """The dims ``index_fragment`` ties together (one index: ``uf``), the reduced ones, the
    ones fixed to a name of their own (``fixed``: why) and the matmul operands' last two."""

    def __init__(self, nodes: list[Node], coarse: bool = True) -> None:
        self.coarse = coarse  # a reshape's major dim carries the index of the dim it splits
        self.uf = UnionFind()
        self.reduced: list[tuple[tuple[int, int], Node]] = []
        self.fixed: dict[tuple[int, int], str] = {}
        self.matmul: list[tuple[int, int]] = []
        for n in nodes:
            for d, size in enumerate(n.shape):
                if size > 1:
                    self.uf.add((id(n), d))

    def tie(self, src: Node, sd: int, n: Node, d: int) -> None:
        """One index for dim ``sd`` of ``src`` and dim ``d`` of ``n`` (when of one size > 1)."""
        if src.shape[sd] > 1 and src.shape[sd] == n.shape[d]:
            self.uf.union((id(src), sd), (id(n), d))

    def node(self, n: Node) -> None:
        """Tie ``n``'s dims to its operands' by what its op does."""
        tie, r = self.tie, len(n.shape)
        if n.op in UNARY | (LOGIC - LOGIC_BINARY):  # elementwise on one operand (a bool
            for d in range(r):  # mask's not too)
                tie(n.srcs[0], d, n, d)
        elif n.op in BINARY | COMPARE | LOGIC_BINARY or n.op in (Op.WHERE, Op.MASK):
            # broadcasting ops (a bool masks' and, or too)
            for s in n.srcs:
                for i in range(1, len(s.shape) + 1):
                    tie(s, len(s.shape) - i, n, r - i)
        elif n.op is Op.MATMUL:
            self._matmul(n)
        elif n.op in REDUCE:
            axes, keepdims = n.arg
            src = n.srcs[0]
            kept = [d for d in range(len(src.shape)) if d not in axes]
            for ax in axes:
                if src.shape[ax] > 1:
                    self.reduced.append(((id(src), ax), n))
            for pos, d in enumerate(kept):
                tie(src, d, n, d if keepdims else pos)
        elif n.op is Op.TRANSPOSE:
            for d, sd in enumerate(n.arg):
                tie(n.srcs[0], sd, n, d)
        elif n.op is Op.RESHAPE:
            self._reshape(n)
        elif n.op is Op.SLICE:
            self._slice(n)
        elif n.op is Op.CONCAT:
            self._concat(n)
        elif n.op in GATHERS:  # rows at data-dependent positions: no dim ties to its table
            raise ScheduleError(f"{n.describe()}: a gather (embedding, index_select, "
                                "take_along_axis) runs as a kernel of its own "
                                f"({SPECS[n.op].torch}); fusing it into a custom kernel is "
                                "not supported yet")
        elif n.op not in (Op.INPUT, Op.CONST, Op.CAUSAL):
            raise ScheduleError(f"{n.describe()}: no indexing rule for {n.op.name.lower()}")

    def _matmul(self, n: Node) -> None:
        a, b = n.srcs
        r, tie = len(n.shape), self.tie
        if len(a.shape) < 2 or len(b.shape) < 2:
            raise ScheduleError(f"{n.describe()} of {fmt_shape(a.shape)} and "
                                f"{fmt_shape(b.shape)}: block matmuls need operands of at "
                                "least 2 dims (reshape the 1-d operand first)")
        ra, rb = len(a.shape), len(b.shape)
        if a.shape[-1] > 1:
            self.uf.union((id(a), ra - 1), (id(b), rb - 2))
            self.reduced.append(((id(a), ra - 1), n))
        tie(a, ra - 2, n, r - 2)
        tie(b, rb - 1, n, r - 1)
        for s, rs in ((a, ra), (b, rb)):
            self.matmul += [(id(s), rs - 2), (id(s), rs - 1)]
            for i in range(3, rs + 1):
                tie(s, rs - i, n, r - i)

    def _reshape(self, n: Node) -> None:
        src = n.srcs[0]
        for gs, go in reshape_groups(src.shape, n.shape):
            if len(gs) == 1 and len(go) == 1:
                self.tie(src, gs[0], n, go[0])
                continue
            why = f"split or merged by {n.describe()} {fmt_shape(src.shape)} -> " \
                  f"{fmt_shape(n.shape)}"
            if self.coarse and (len(gs) == 1 or len(go) == 1):
                # one dim split into several, or several merged into one: the major dim
                # carries the single dim's index (cut into parts, each holds whole rows of
                # the minor dims, which are read whole)
                self.uf.union((id(src), gs[0]), (id(n), go[0]))
                gs, go = gs[1:], go[1:]
            self.fixed.update({(id(src), d): why for d in gs})
            self.fixed.update({(id(n), d): why for d in go})

    def _slice(self, n: Node) -> None:
        src, axis = n.srcs[0], n.arg[0]
        if src.op is not Op.INPUT and src.op is not Op.CONCAT:
            raise ScheduleError(f"{n.describe()} slices a value computed in the kernel; "
                                "the Triton backend slices tiles it loads (or a concat's "
                                "parts), so the value goes through device memory")
        why = f"the sliced axis of {n.describe()}"
        for d in range(len(n.shape)):
            if d != axis:
                self.tie(src, d, n, d)
        if src.shape[axis] > 1:
            self.fixed[(id(src), axis)] = why
        if n.shape[axis] > 1:
            self.fixed[(id(n), axis)] = why

    def _concat(self, n: Node) -> None:
        why = f"the concat axis of {n.describe()}"
        for s in n.srcs:
            for d in range(len(n.shape)):
                if d == n.arg:
                    if s.shape[d] > 1:
                        self.fixed[(id(s), d)] = why
                else:
                    self.tie(s, d, n, d)
        if n.shape[n.arg] > 1:
            self.fixed[(id(n), n.arg)] = why


def index_fragment(graph: Graph) -> Indexing:
    """Name every dim of every node of ``graph`` (see the module docstring).

    Raises ``ScheduleError`` when one tensor would carry the same index on two
    dims (e.g. ``X @ X.T`` with a square X: the two uses of X need different
    names), or for a matmul with a 1-d operand.
    """
    check(graph)
    try:
        return _index(graph, coarse=True)
    except ScheduleError as e:  # a reshape's major dim tied to its dim of another size gave
        if not any(n.op is Op.RESHAPE for n in graph.nodes()):  # one node the same index
            raise  # twice: the reshaped dims go unscheduled instead
        try:
            return _index(graph, coarse=False)
        except ScheduleError:
            raise e from None


def _index(graph: Graph, coarse: bool) -> Indexing:
    nodes = graph.nodes()
    ties = _Ties(nodes, coarse)
    concats: set[int] = set()  # nodes computed from a concat in this fragment (split values)
    for n in nodes:
        if n.op is Op.CONCAT or any(id(x) in concats for x in n.srcs):
            concats.add(id(n))
        if n.op is Op.RESHAPE and id(n.srcs[0]) in concats and \
                [d for d in n.shape if d > 1] != [d for d in n.srcs[0].shape if d > 1]:
            raise ScheduleError(f"{n.describe()} merges or splits dims of a value computed "
                                "from a concat in the kernel; the Triton backend keeps a "
                                "concat as its parts, so the value goes through device memory")
        ties.node(n)
    return _name_classes(graph, nodes, ties.uf, ties.reduced, ties.fixed, ties.matmul)


def _name_classes(graph, nodes, uf, reduced, fixed, matmul) -> Indexing:
    names: dict = {}
    letters = _letters()
    ix = Indexing(graph, nodes, {}, {})
    order = list(graph.inputs.values()) + nodes
    units: dict[str, int] = {}
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
            name = names[root]
            ix.sizes[name] = max(ix.sizes.get(name, size), size)
            units[name] = math.gcd(units.get(name, size), size)
            dims.append(name)
        named = [x for x in dims if x is not None]
        if len(set(named)) != len(named):
            dup = next(x for x in named if named.count(x) > 1)
            raise ScheduleError(
                f"cannot index {n.describe()} {fmt_shape(n.shape)} consistently: dims "
                f"{[d for d, x in enumerate(dims) if x == dup]} get the same index "
                f"{ix.describe(dup)} (one tensor used in two roles, e.g. X @ X.T; give the "
                "second use its own input)")
        ix.dims[id(n)] = tuple(dims)
    ix.units = {i: u for i, u in units.items() if u != ix.sizes[i]}
    for slot, node in reduced:
        ix.reduced.setdefault(names[uf.find(slot)], []).append(node)
    for slot, why in fixed.items():
        ix.fixed.setdefault(names[uf.find(slot)], why)
    ix.matmul = {names[uf.find(s)] for s in matmul if s in uf.parent}
    return ix
