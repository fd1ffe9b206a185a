"""Other plans of one program beside the planner's choice, for measured tuning to time.

The cost model ranks schedules poorly on a real device (issue 50), so where a timer is there
the search times several plans of each piece. ``variants`` gives ``plan(...,
alternatives=N)`` up to N other plans of the same program, each built by the planner's own
code (``Planner.build``) and priced by the same model, distinct from the chosen plan and
from each other (``plan_key``):

- schedule variants: the same partition with its custom regions taking their next-best
  legal, feasible schedules (``Planner.ranked``: another grid, loop range or split), one
  region at a time and in combinations, cheapest total first (a best-first walk over the
  regions' ranked lists, by the sum of the regions' extra cost);
- library-matmul variants: a custom region holding matmuls recut so that its matmuls run
  as predefined (library) kernels and the ops before them and after them form their own
  fused regions (a region left with no feasible schedule is split into its forced units);
  every such region recut alone, and all of them together when there are several;
- partition variants: the next-best partitions one local move away from the chosen one
  (``regions.neighbours``);
- schedule shapes: for each custom region, the model's best schedule of every *shape* the
  chosen one is not (``shape_of``: whether it splits its reduction across blocks, whether
  its main kernel has fewer blocks than SMs, one to two per SM, or two or more, and whether
  its largest input is read in runs of at least 128 bytes). These are the choices
  ../shared/KERNELS.md says decide a weight-streaming kernel (split-K for parallelism,
  enough blocks to keep bytes in flight, coalesced rows) and the ones the model ranks worst
  (rank correlation -0.37 to 0.80 on measured sweeps), so tuning times one of each rather
  than N near-copies of the model's favourite.

The N kept are: the cheapest library-matmul and partition variants, every schedule shape
(cheapest first), the cheapest other schedule, then the cheapest of the rest; they come cheapest
first, labelled "schedule 2", "library matmul", "partition 2", "shape (split, 384 blocks,
256 B runs)", ... (numbered by kind in cost order; the chosen plan is schedule 1 and
partition 1). New prices count against the planner's
evaluation budget and stop at its deadline; what is priced already is used.
"""

from __future__ import annotations

import heapq
import math

from ..cost.gpucost import LINE_BYTES, mugraph_cost, run_bytes, tensor_bytes
from ..ir.errors import MirageError
from ..ir.node import Op
from ..mugraph.program import MuGraph
from .indexing import ScheduleError
from .lower import add_kernel
from .plans import FusionPlan, Pricing, Region, plan_key
from .regions import RegionSpace, neighbours

SCHEDULE, LIBRARY, PARTITION, SHAPE = "schedule", "library matmul", "partition", "shape"
SHAPE_POOL = 512  # schedules of a region ranked to find its best of each shape (all of them
#   under the planner's default strategy: it lists at most 512 per region)


def variants(planner, chosen: FusionPlan, regions: list[frozenset], why_not: dict,
             budget: int, limit: int) -> list[tuple[str, MuGraph, list[Region], float]]:
    """Up to ``limit`` other plans of ``planner``'s program (``planner``: the
    ``planner.Planner`` that chose ``regions``, the partition of ``chosen``) as (label,
    MuGraph, report, model cost), cheapest first (module docstring)."""
    space = planner.space(budget)
    seen = {plan_key(chosen.mugraph)}
    found: list[tuple[str, float, MuGraph, list[Region]]] = []

    def add(kind: str, regs: list[frozenset], overrides: dict | None = None) -> None:
        try:
            mg, report = planner.build(regs, why_not, overrides)
        except (MirageError, ScheduleError):  # no schedule for a region: not a plan
            return
        key = plan_key(mg)
        cost = mugraph_cost(mg, planner.prof).total_us
        if key not in seen and math.isfinite(cost):
            seen.add(key)
            found.append((kind, cost, mg, report))

    ranked = {r: planner.ranked(r, SHAPE_POOL) for r in regions
              if planner.price(r, True).schedule is not None and not space.stop()}
    for label, overrides in shape_variants(planner, regions, ranked):  # first: a plan that
        add(f"{SHAPE} ({label})", regions, overrides)  # is also a next-best keeps its shape
    for overrides in schedule_variants(planner, space, regions, limit, ranked):
        add(SCHEDULE, regions, overrides)
    for regs in library_variants(planner, space, regions):
        add(LIBRARY, regs)
    for _, regs in neighbours(space, regions, limit):
        add(PARTITION, regs)
    return _labelled(_pick(found, limit))


def schedule_variants(planner, space: RegionSpace, regions: list[frozenset],
                      limit: int, ranked: dict[frozenset, list[Pricing]] | None = None
                      ) -> list[dict[frozenset, Pricing]]:
    """Up to ``limit`` choices of other schedules for the custom regions of ``regions``
    (region -> its pricing under another schedule), the least extra cost first
    (``ranked``: each region's ranked schedules, when already at hand)."""
    lists: list[tuple[frozenset, list[Pricing]]] = []
    for r in regions:
        p = planner.price(r, True)
        if p.schedule is None or (ranked is None and space.stop()):
            continue
        pool = ranked.get(r, []) if ranked is not None else planner.ranked(r, limit + 1)
        others = [q for q in pool if q.schedule != p.schedule]
        if others:
            lists.append((r, [p] + others[:limit]))

    def extra(vec: tuple[int, ...]) -> float:
        return sum(ps[k].cost_us - ps[0].cost_us for (_, ps), k in zip(lists, vec))

    start = (0,) * len(lists)
    heap, seen, out = [(0.0, start)], {start}, []
    while heap and len(out) < limit:
        _, vec = heapq.heappop(heap)
        if any(vec):
            out.append({lists[j][0]: lists[j][1][k] for j, k in enumerate(vec) if k})
        for j, (_, ps) in enumerate(lists):
            nxt = vec[:j] + (vec[j] + 1,) + vec[j + 1:]
            if vec[j] + 1 < len(ps) and nxt not in seen:
                seen.add(nxt)
                heapq.heappush(heap, (extra(nxt), nxt))
    return out


def shape_of(planner, p: Pricing) -> tuple[bool, int, bool, str]:
    """The shape of region pricing ``p`` (module docstring): (splits its reduction, 0 / 1 /
    2 for fewer blocks than SMs / one to two per SM / two or more, its largest input read in
    runs of at least ``LINE_BYTES``, a label)."""
    mg = MuGraph("shape")
    for name, node in p.fragment.inputs.items():
        mg.input(name, node.shape, node.dtype)
    kernels = add_kernel(mg, p.fragment, p.schedule, indexing=p.indexing,
                         registers=planner.registers(p.origin or {}))
    main = kernels[0]  # a split's first kernel: the one that reads the inputs
    blocks = math.prod(main.grid)
    fill = min(2, blocks // max(1, planner.prof.sms))
    specs = mg.tensors
    widest = max(main.inputs.values(), default=None, key=lambda bi: tensor_bytes(
        specs[bi.tensor].shape, specs[bi.tensor].dtype))
    run = LINE_BYTES if widest is None else run_bytes(main, widest, specs[widest.tensor])
    split = p.schedule.split is not None
    label = f"{'split' if split else 'one pass'}, {blocks} blocks, {min(run, 9999)} B runs"
    return split, fill, run >= LINE_BYTES, label


def shape_variants(planner, regions: list[frozenset], ranked: dict[frozenset, list[Pricing]]
                   ) -> list[tuple[str, dict[frozenset, Pricing]]]:
    """For each custom region with ranked schedules, its cheapest schedule of every shape
    (``shape_of``) other than its chosen schedule's, as (label, overrides), one region at a
    time, cheapest first within a region."""
    out = []
    for r, pool in ranked.items():
        chosen = planner.price(r, True)
        if chosen.schedule is None:
            continue
        seen = {shape_of(planner, chosen)[:3]}
        for q in pool:
            try:
                *shape, label = shape_of(planner, q)
            except (MirageError, ScheduleError):
                continue
            if tuple(shape) not in seen:
                seen.add(tuple(shape))
                out.append((label, {r: q}))
    return out


def library_variants(planner, space: RegionSpace, regions: list[frozenset]
                     ) -> list[list[frozenset]]:
    """Partitions with a custom region's matmuls as library kernels (module docstring):
    each region with all its matmuls recut, then (for a region of several) each matmul
    alone, then every region recut together; only acyclic partitions."""
    units = planner.forced()
    unit_of = {i: u for u in units for i in u}
    out: list[list[frozenset]] = []
    recut: dict[frozenset, list[frozenset]] = {}
    for r in regions:
        if len(r) < 2 or planner.price(r, True).schedule is None:
            continue
        mms = [i for i in sorted(r) if planner.ops[i].op is Op.MATMUL
               and unit_of[i] == frozenset({i})]  # a matmul a tiling rule keeps fused: not cut
        for chosen in [mms] + ([[m] for m in mms] if len(mms) > 1 else []):
            pieces = _recut(planner, space, r, chosen, units, unit_of)
            if pieces is None:
                continue
            regs = [x for x in regions if x != r] + pieces
            if space.acyclic(space.masks(regs)):
                out.append(regs)
                recut.setdefault(r, pieces)
    if len(recut) > 1:
        regs = [x for x in regions if x not in recut] + [x for ps in recut.values() for x in ps]
        if space.acyclic(space.masks(regs)):
            out.append(regs)
    return out


def _recut(planner, space: RegionSpace, region: frozenset, mms: list[int],
           units: list[frozenset], unit_of: dict[int, frozenset]) -> list[frozenset] | None:
    """``region`` cut into its matmuls ``mms`` (one op each), the units after them (reading
    a matmul's result, within the region) and the units before or beside them; a piece
    with no feasible schedule split into its units. None when a matmul reads another's
    result, a piece cannot run, or the budget stops its pricing."""
    after: set[int] = set()
    stack = list(mms)
    while stack:
        for u in planner.users[stack.pop()]:
            if u in region and u not in after:
                after.add(u)
                stack.append(u)
    if after & set(mms):
        return None
    rest = {unit_of[i] for i in region if i not in mms}
    late = frozenset(i for u in rest if u & after for i in u)
    early = frozenset(i for u in rest if not u & after for i in u)
    out = []
    for piece in [frozenset({m}) for m in mms] + [x for x in (early, late) if x]:
        if not space.priced(piece) and space.stop():
            return None
        if math.isfinite(planner.price(piece, True).cost_us):
            out.append(piece)
            continue
        parts = [u for u in units if u <= piece]
        if len(parts) < 2 or any(not space.priced(u) and space.stop() for u in parts) or \
                not all(math.isfinite(planner.price(u, True).cost_us) for u in parts):
            return None
        out.extend(parts)
    return out


def _pick(found: list[tuple[str, float, MuGraph, list[Region]]], limit: int) -> list:
    """``limit`` plans of ``found``: the cheapest library-matmul and partition variants,
    every schedule shape, the cheapest other schedule, then the cheapest of the rest;
    returned cheapest first (ties: the order found)."""
    order = sorted(range(len(found)), key=lambda i: found[i][1])
    keep: list[int] = []
    for kind in (LIBRARY, PARTITION):
        keep += [i for i in order if found[i][0] == kind][:1]
    keep += [i for i in order if found[i][0].startswith(SHAPE)]
    keep += [i for i in order if found[i][0] == SCHEDULE][:1]
    keep = keep[:limit]
    keep += [i for i in order if i not in keep][:max(0, limit - len(keep))]
    return [found[i] for i in sorted(keep, key=lambda i: (found[i][1], i))]


def _labelled(picked: list) -> list[tuple[str, MuGraph, list[Region], float]]:
    """Each picked plan with its label: its kind, numbered in cost order within the kind
    (schedule and partition variants from 2; a library variant and each shape, whose
    label says what it is, unnumbered when alone)."""
    count: dict[str, int] = {}
    out = []
    for kind, cost, mg, report in picked:
        count[kind] = count.get(kind, 0) + 1
        n = count[kind] + (kind in (SCHEDULE, PARTITION))  # library, shapes: unnumbered
        out.append((kind if n == 1 else f"{kind} {n}", mg, report, cost))
    return out
