"""Lowering a scheduled kernel-level fragment to a MuGraph custom kernel.

Given a legal ``Plan`` (``schedule.check_schedule``):

- every fragment input becomes a block input, ``imap`` from the grid indices
  of its dims, ``fmap`` at the dim carrying the loop index;
- loop stage: the ``loop`` nodes (and the ``inv`` nodes they need) on tiles,
  up to the reductions over the loop index, each of which becomes a tile
  reduction (a mean becomes a sum) and a forloop accumulator;
- post stage: the ``post`` nodes on the accumulators (a mean's accumulator is
  divided by the full reduced size) and the ``inv`` nodes recomputed from the
  block inputs without fmap;
- outputs by ``omap`` from the grid indices of their dims (an output carrying
  the loop index is written from the loop stage with an ``fmap``).

A split schedule (FlashDecoding) gives two kernels: the first computes each
grid part of the reductions over the split index and writes the partial
results with a leading dim per split (and one per grid axis the reduction
does not carry), the second loops over the splits, accumulates them and runs
the post stage. With a loop over the split index (``Schedule(..., loop=split)``)
the first kernel is lowered like an unsplit one (inputs with an imap and an
fmap on the split dim, accumulators) and writes its accumulators as the parts.
The second kernel runs on ``Schedule.second_grid``: by default the first
kernel's grid without the split axis, or ``reduce_grid``, which may cut the
outputs more finely.
"""

from __future__ import annotations

from collections.abc import Callable

from ..frontend.graph import Graph, Tensor
from ..ir.node import ELEMENTWISE, Node, Op, make, numel, toposort
from ..mugraph.kernels import CustomKernel
from ..mugraph.program import MuGraph
from ..mugraph.validate import validate_running_outputs
from .indexing import Indexing, ScheduleError, index_fragment
from .schedule import Plan, Schedule, check_schedule

Leaf = Callable[[Node], "Node | None"]


def _const(value: float) -> Node:
    return Node(Op.CONST, (), float(value), (), "float32")


def _fresh(prefix: str, used: set[str]) -> str:
    i = 0
    while f"{prefix}{i}" in used:
        i += 1
    used.add(f"{prefix}{i}")
    return f"{prefix}{i}"


class _Stage:
    """Rebuilds fragment nodes on tiles; ``leaf`` supplies inputs, accumulators, constants.
    ``origin`` collects id(tile node) -> the fragment node it computes."""

    def __init__(self, plan: Plan, leaf: Leaf, origin: dict[int, Node]) -> None:
        self.plan, self.leaf, self.memo, self.origin = plan, leaf, {}, origin

    def __call__(self, n: Node) -> Node:
        if id(n) in self.memo:
            return self.memo[id(n)]
        v = n if n.op is Op.CONST else self.leaf(n)
        if v is None:
            if n.op is Op.INPUT:
                raise ScheduleError(f"internal: input {n.arg!r} is not available in this stage")
            srcs = tuple([self(s) for s in n.srcs])
            red = self.plan.kind[id(n)] == "red"
            op = Op.SUM if red and n.op is Op.MEAN else n.op
            arg = self.plan.tile(n) if n.op is Op.RESHAPE else n.arg
            v = make(op, srcs, arg, n.loc)
            if v.shape != self.plan.tile(n):
                raise ScheduleError(f"internal: tile of {n.describe()} is {v.shape}, expected "
                                    f"{self.plan.tile(n)}")
            self.origin[id(v)] = n
        self.memo[id(n)] = v
        return v


def _reduced_size(n: Node) -> int:
    return numel(tuple(n.srcs[0].shape[a] for a in n.arg[0]))


def _finish(plan: Plan, n: Node, acc: Node) -> Node:
    """The post value of reduction ``n`` from its accumulator (a mean divides by its size)."""
    return make(Op.DIV, (acc, _const(_reduced_size(n)))) if n.op is Op.MEAN else acc


def _maps(ix: Indexing, node: Node, axes: dict[str, int], loop: str | None):
    dims = ix.of(node)
    imap = {d: axes[i] for d, i in enumerate(dims) if i in axes}
    fmap = next((d for d, i in enumerate(dims) if loop is not None and i == loop), None)
    return imap, fmap


def add_kernel(mg: MuGraph, fragment: Graph, schedule: Schedule, name: str | None = None,
               indexing: Indexing | None = None,
               registers: Callable[[Node], bool] | None = None) -> list[CustomKernel]:
    """Append the custom kernel(s) implementing ``fragment`` under ``schedule`` to ``mg``.

    The fragment's inputs must be device tensors of ``mg`` with the same names;
    its outputs become new device tensors of the same names. Returns the new
    kernels (one; two for a split schedule), their elementwise chains already fused into
    thread graphs (``fuse_threads``): a value links a chain only where ``registers`` (a
    predicate on the fragment's nodes: rules/thread.egg's Reg nodes) allows it, anywhere
    when it is None. Raises ``ScheduleError`` (``TilingError`` for a tile written in the
    loop that reads a running maximum).
    """
    ix = indexing or index_fragment(fragment)
    plan = check_schedule(ix, schedule)
    missing = [n for n in fragment.inputs if mg.spec(n) is None]
    if missing:
        raise ScheduleError(f"fragment {fragment.name!r} reads {missing}, which are not device "
                            f"tensors of mugraph {mg.name!r}")
    origin: dict[int, Node] = {}
    if schedule.split is not None:
        kernels = _add_split(mg, fragment, plan, name, origin)
    else:
        kernels = _add_one(mg, fragment, plan, name, origin)
    # tiles the lowering makes itself (a mean's division, a split's rescale) are not terms
    # of the e-graph: they may always stay in registers
    keep = None if registers is None else (
        lambda v: id(v) not in origin or registers(origin[id(v)]))
    for k in kernels:
        fuse_threads(k, keep)
    return kernels


def _add_one(mg: MuGraph, fragment: Graph, plan: Plan, name: str | None,
             origin: dict[int, Node]) -> list[CustomKernel]:
    """The one custom kernel of an unsplit schedule."""
    ix, s, kind = plan.indexing, plan.schedule, plan.kind
    axes = s.axes
    grid = tuple(b for _, b in s.grid) or (1,)
    k = mg.custom_kernel(grid=grid, forloop=s.forloop, name=name, source=fragment)
    tiles = {}
    for iname, node in fragment.inputs.items():
        imap, fmap = _maps(ix, node, axes, s.loop)
        tiles[iname] = k.input(iname, imap=imap, fmap=fmap).node
    used = set(fragment.inputs) | set(fragment.outputs)
    accs: dict[int, Node] = {}
    maxima: dict[int, str] = {}  # a running maximum's node -> its max accumulator

    def maximum(n: Node) -> str:  # the max accumulator of this tile's max
        if id(n) not in maxima:
            tile_max = Tensor(make(Op.MAX, (loop(n.srcs[0]),), n.arg, n.loc), k.loop)
            maxima[id(n)] = _fresh("max", used)
            accs[id(n)] = k.accumulate(tile_max, maxima[id(n)], how="max").node
        return maxima[id(n)]

    def loop_leaf(n: Node) -> Node | None:
        if kind[id(n)] == "post":
            raise ScheduleError(f"internal: post value {n.describe()} used in the loop")
        if kind[id(n)] == "max":
            return k.running(maximum(n)).node
        return tiles[n.arg] if n.op is Op.INPUT else None

    def post_leaf(n: Node) -> Node | None:
        if kind[id(n)] == "max":
            maximum(n)
            return accs[id(n)]
        if kind[id(n)] == "red":
            if id(n) not in accs:
                value = Tensor(loop(n), k.loop)
                accs[id(n)] = _finish(plan, n, k.accumulate(value, _fresh("acc", used)).node)
            return accs[id(n)]
        if kind[id(n)] == "loop":
            raise ScheduleError(f"internal: loop value {n.describe()} used after the loop")
        return k.tile(n.arg).node if n.op is Op.INPUT else None

    loop, post = _Stage(plan, loop_leaf, origin), _Stage(plan, post_leaf, origin)
    for oname, out in fragment.outputs.items():
        omap, fmap = _maps(ix, out, axes, s.loop)
        if kind[id(out)] == "loop":
            k.output(Tensor(loop(out), k.loop), oname, omap=omap, fmap=fmap)
        else:
            k.output(Tensor(post(out), k.post), oname, omap=omap)
    validate_running_outputs(k)  # a tile written in the loop may not read a running max
    return [k]


def _part_values(k1: CustomKernel, plan: Plan, used: set[str],
                 origin: dict[int, Node]) -> Callable[[Node], Node]:
    """The first kernel's value of each reduction over the split index (a post-stage node)."""
    ix, s = plan.indexing, plan.schedule
    for iname, node in ix.graph.inputs.items():
        imap, fmap = _maps(ix, node, s.axes, s.loop)
        k1.input(iname, imap=imap, fmap=fmap)
    if s.loop is None and "max" not in plan.kind.values():  # one pass: all post-stage work
        return _Stage(plan, lambda n: k1.tile(n.arg).node if n.op is Op.INPUT else None, origin)
    # (a maximum over the split goes through the loop stage even in one pass, F = 1: its
    # running value reads -inf as 0 there, so a split the mask empties gives 0, not NaN)

    accs: dict[int, Node] = {}
    maxima: dict[int, str] = {}

    def maximum(n: Node) -> str:  # the split's running maximum of a max over the split
        if id(n) not in maxima:
            tile_max = Tensor(make(Op.MAX, (loop(n.srcs[0]),), n.arg, n.loc), k1.loop)
            maxima[id(n)] = _fresh("max", used)
            accs[id(n)] = k1.accumulate(tile_max, maxima[id(n)], how="max").node
        return maxima[id(n)]

    def loop_leaf(n: Node) -> Node | None:
        if plan.kind[id(n)] == "max":
            return k1.running(maximum(n)).node
        return k1.loop.inputs[n.arg] if n.op is Op.INPUT else None

    loop = _Stage(plan, loop_leaf, origin)

    def value(n: Node) -> Node:  # the accumulated partial sum (a mean's division waits)
        if plan.kind[id(n)] == "max":
            maximum(n)
        elif id(n) not in accs:
            accs[id(n)] = k1.accumulate(Tensor(loop(n), k1.loop), _fresh("acc", used)).node
        return accs[id(n)]

    return value


def _add_split(mg: MuGraph, fragment: Graph, plan: Plan, name: str | None,
               origin: dict[int, Node]) -> list[CustomKernel]:
    ix, s, kind = plan.indexing, plan.schedule, plan.kind
    axes, split = s.axes, s.split
    base = name or f"k{len(mg.kernels)}"
    k1 = mg.custom_kernel(grid=tuple(b for _, b in s.grid), forloop=s.forloop,
                          name=f"{base}_part")
    used = set(mg.tensors) | set(fragment.outputs)
    stage1 = _part_values(k1, plan, used, origin)
    reds = [n for n in ix.nodes if kind[id(n)] in ("red", "max")]  # written as parts
    rest = [(i, b) for i, b in s.grid if i != split]
    parts = {}
    for n in reds:
        tile, dims = plan.tile(n), ix.of(n)
        lost = [i for i, _ in rest if i not in dims]  # grid indices n does not carry
        value = make(Op.RESHAPE, (stage1(n),), (1,) * (1 + len(lost)) + tile)
        omap = {0: axes[split], **{1 + j: axes[i] for j, i in enumerate(lost)}}
        omap.update({1 + len(lost) + d: axes[i] for d, i in enumerate(dims) if i in axes})
        parts[id(n)] = (k1.output(Tensor(value, k1.post), _fresh(f"{base}_part", used),
                                  omap=omap, dtype="float32"), lost)  # fp32 partials
    for oname, out in fragment.outputs.items():
        if kind[id(out)] == "loop":  # split without a loop only (check_schedule)
            partial = next((m for m in toposort([out])[:-1]
                            if kind.get(id(m)) in ("red", "max")), None)
            if partial is not None:  # it would hold its part's maximum or sum, not the whole's
                raise ScheduleError(f"a split writes output {oname!r} from "
                                    f"{partial.describe()} of its own part, which only the "
                                    "reduce kernel combines")
            k1.output(Tensor(stage1(out), k1.post), oname, omap=_maps(ix, out, axes, None)[0])
    late = {o: n for o, n in fragment.outputs.items() if kind[id(n)] != "loop"}
    if not late:
        return [k1]
    second = s.second_grid
    axes2 = {i: a for a, (i, _) in enumerate(second)}
    counts2 = dict(second)
    tiles2 = {id(n): tuple(size // counts2.get(i, 1) for size, i in zip(n.shape, ix.of(n)))
              for n in ix.nodes}
    plan2 = Plan(ix, s, kind, tiles2)
    k2 = mg.custom_kernel(grid=tuple(b for _, b in second) or (1,), forloop=dict(s.grid)[split],
                          name=f"{base}_reduce")
    accs: dict[int, Node] = {}
    part_tiles: dict[int, Node] = {}
    maxima: dict[int, str] = {}

    def part(n: Node) -> Node:  # this iteration's part of reduction n, as a loop tile
        if id(n) not in part_tiles:
            tensor, lost = parts[id(n)]
            imap = {1 + j: axes2[i] for j, i in enumerate(lost)}
            imap.update({1 + len(lost) + d: axes2[i] for d, i in enumerate(ix.of(n))
                         if i in axes2})
            t = k2.input(tensor, imap=imap, fmap=0)
            part_tiles[id(n)] = make(Op.RESHAPE, (t.node,), plan2.tile(n))
        return part_tiles[id(n)]

    def maximum(n: Node) -> str:  # the maximum over the splits' maxima, running
        if id(n) not in maxima:
            maxima[id(n)] = _fresh("max", used)
            accs[id(n)] = k2.accumulate(Tensor(part(n), k2.loop), maxima[id(n)],
                                        how="max").node
        return maxima[id(n)]

    def leaf2(n: Node) -> Node | None:
        if kind[id(n)] == "max":
            maximum(n)
            return accs[id(n)]
        if kind[id(n)] == "red":
            if id(n) not in accs:
                value = part(n)
                for m in _maxima_read(n, kind):  # exp(m_j - M) rescales split j's partial
                    run = k2.running(maximum(m)).node
                    value = make(Op.MUL, (value, make(Op.EXP, (make(Op.SUB, (part(m), run)),))))
                accs[id(n)] = _finish(plan, n, k2.accumulate(Tensor(value, k2.loop),
                                                             _fresh("acc", used)).node)
            return accs[id(n)]
        if n.op is Op.INPUT:
            if n.arg not in k2.inputs:
                k2.input(n.arg, imap=_maps(ix, n, axes2, None)[0])
            return k2.tile(n.arg).node
        return None

    stage2 = _Stage(plan2, leaf2, origin)
    for oname, out in late.items():
        k2.output(Tensor(stage2(out), k2.post), oname, omap=_maps(ix, out, axes2, None)[0],
                  dtype=out.dtype)
    return [k1, k2]


def _maxima_read(n: Node, kind: dict[int, str]) -> list[Node]:
    """The running maxima (kind "max") that reduction ``n``'s partials are relative to."""
    found = [m for m in toposort([n])[:-1] if kind.get(id(m)) == "max"]
    if len(found) > 1:
        raise ScheduleError(f"{n.describe()} reads {len(found)} running maxima; a split "
                            "combines partials relative to one")
    return found


def lower(fragment: Graph, schedule: Schedule, name: str | None = None,
          indexing: Indexing | None = None) -> MuGraph:
    """A MuGraph computing ``fragment`` with the custom kernel(s) of ``schedule``.

    The fragment's inputs become device inputs and its outputs the MuGraph's
    outputs (same names), so ``em.verify(fragment, lower(fragment, s))`` compares
    them directly. Raises ``ScheduleError`` for an illegal schedule.
    """
    mg = MuGraph(name or f"{fragment.name}.tiled")
    for iname, node in fragment.inputs.items():
        mg.input(iname, node.shape, node.dtype)
    add_kernel(mg, fragment, schedule, indexing=indexing)
    for oname in fragment.outputs:
        mg.output(oname)
    return mg.validate()


def fuse_threads(k: CustomKernel, keep: Callable[[Node], bool] | None = None) -> None:
    """Record maximal elementwise chains of each stage as thread graphs: a tile with one
    elementwise user continues its chain (staying in registers) where ``keep`` allows it
    (None: everywhere)."""
    for stage in ("loop", "post"):
        g = k.stage(stage)
        nodes = g.nodes()
        users: dict[int, list[Node]] = {}
        for n in nodes:
            for s in n.srcs:
                users.setdefault(id(s), []).append(n)
        outs = {id(n) for n in g.outputs.values()}
        taken: set[int] = set()
        for n in nodes:
            if n.op not in ELEMENTWISE or id(n) in taken:
                continue
            chain = [n]
            while id(chain[-1]) not in outs and len(users.get(id(chain[-1]), [])) == 1 \
                    and (keep is None or keep(chain[-1])):
                nxt = users[id(chain[-1])][0]
                if nxt.op not in ELEMENTWISE or id(nxt) in taken:
                    break
                chain.append(nxt)
            if len(chain) > 1:
                taken.update(id(c) for c in chain)
                k.fuse(*(Tensor(c, g) for c in chain))
