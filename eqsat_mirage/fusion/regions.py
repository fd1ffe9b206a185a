"""Region search: the partition of a program's ops into kernels of least total price.

This module decides which ops share a kernel (``fusion.plan`` calls ``search``; the planner
only prices a region, ``RegionSpace.price``, and builds the chosen partition). Prices come
from the planner: each region's cheapest legal schedule under ``gpucost``, with the
schedules the e-graph's Kern, Online and Reg nodes allow.

Units: the search works on *units*, the planner's forced groups (ops joined across every
edge where no tiling rule allows a kernel boundary; one op each when every edge may be cut).
A region is a set of units; a partition is valid when its kernel graph is acyclic.

1. Exact, for at most ``EXACT_MAX_UNITS`` units: dynamic programming over the downward-closed
   unit sets (ideals: with every unit, its producers). ``best(S) = min over ideals T < S of
   best(T) + price(S - T)``: each step peels one region ``S - T``, which is convex (a path
   leaving and re-entering it would put a unit of T after one of ``S - T``), and every
   acyclic partition is such a sequence of peels (take its kernels in topological order),
   so the minimum over all acyclic partitions is found. Region prices are memoized by the
   planner; a region is priced only when ``best(T)`` leaves room under both the best so far
   for ``S`` and the incumbent's total (prices are never negative; ``search`` passes the
   total of step 2's quick descent, an upper bound since a quick price is never below the
   full one, and keeps that partition when nothing beats it), and the DP is given up
   (``None``) when it would price more than ``EXACT_MAX_NEW`` regions not priced before.
2. Descent, for larger programs (or when a bound stopped the DP): from one region per unit,
   best-improvement merging of two neighbouring regions (a producer and its consumer, or
   two regions reading a common tensor) while a merge lowers the total and keeps the kernel
   graph acyclic, first with the planner's quick pricing (fewer schedules per region), then
   with full pricing; then the whole program as one region if that is cheaper.
3. Local moves from the descent's partition: one unit moved to a neighbouring region or
   split off on its own, two regions merged. Each round applies the move that lowers the
   total most; it stops when none does, after ``LOCAL_MAX_ROUNDS`` rounds, or when
   ``LOCAL_MAX_NEW`` new regions were priced. The same moves from the result give the
   next-best partitions when a plan's alternatives are asked for (``neighbours``).

All stop when ``RegionSpace.stop()`` says so (the planner's deadline or evaluation budget);
what is already priced is still used, so the result is always a valid partition no dearer
than one kernel per unit. Bounds are counts, not seconds, so a plan does not depend on the
machine's speed (except through the deadline).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

EXACT_MAX_UNITS = 6  # 2**6 - 1 = 63 regions at most (as many as the brute force prices)
EXACT_MAX_NEW = 64  # regions not priced before that the DP may price
LOCAL_MAX_ROUNDS = 4  # improving moves applied at most
LOCAL_MAX_NEW = 12  # regions not priced before that the local search may price
EPS_US = 1e-9


def _bits(mask: int):
    """The set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


@dataclass
class RegionSpace:
    """What the search needs of one planner: the units (forced op groups), the ops' users,
    the price of an op set (``inf``: no feasible kernel), whether an op set is already
    priced, when to stop (deadline passed or evaluation budget spent), and optionally the
    device tensors each unit reads from outside it (units reading a common one are
    neighbours too: siblings, as GatedMLP's two matmuls reading X)."""

    units: list[frozenset[int]]
    users: list[set[int]]
    price: Callable[[frozenset[int]], float]
    priced: Callable[[frozenset[int]], bool]
    stop: Callable[[], bool]
    reads: list[frozenset[str]] | None = None

    def __post_init__(self) -> None:
        owner = {i: u for u, ops in enumerate(self.units) for i in ops}
        self.succ = [{owner[w] for i in ops for w in self.users[i]} - {u}
                     for u, ops in enumerate(self.units)]
        self.pred: list[set[int]] = [set() for _ in self.units]
        for u, s in enumerate(self.succ):
            for v in s:
                self.pred[v].add(u)
        self.owner = owner
        self.near = [sum(1 << v for v in self.succ[u] | self.pred[u])
                     for u in range(len(self.units))]
        if self.reads is not None:
            for u, a in enumerate(self.reads):
                for v, b in enumerate(self.reads):
                    if u != v and a & b:
                        self.near[u] |= 1 << v

    def masks(self, regions: list[frozenset[int]]) -> list[int]:
        """Op-index regions as unit bitmasks (each region a union of units)."""
        return [sum(1 << u for u in {self.owner[i] for i in r}) for r in regions]

    def ops(self, mask: int) -> frozenset[int]:
        """The ops of the units in bitmask ``mask``."""
        return frozenset(i for u in _bits(mask) for i in self.units[u])

    def acyclic(self, regions: list[int]) -> bool:
        """Whether the partition (unit bitmasks) has an acyclic kernel graph."""
        where = {u: r for r, m in enumerate(regions) for u in _bits(m)}
        succ = [{where[v] for u in _bits(m) for v in self.succ[u]} - {r}
                for r, m in enumerate(regions)]
        indeg = [0] * len(regions)
        for s in succ:
            for r in s:
                indeg[r] += 1
        ready = [r for r in range(len(regions)) if indeg[r] == 0]
        seen = 0
        while ready:
            r = ready.pop()
            seen += 1
            for q in succ[r]:
                indeg[q] -= 1
                if indeg[q] == 0:
                    ready.append(q)
        return seen == len(regions)


class _Counter:
    """Prices op sets through the space, counting the ones not priced before."""

    def __init__(self, space: RegionSpace, limit: int) -> None:
        self.space, self.limit, self.new = space, limit, 0
        self.cache: dict[int, float] = {}

    def __call__(self, mask: int) -> float | None:
        """The price of unit set ``mask``; None once the search must stop."""
        if mask in self.cache:
            return self.cache[mask]
        ops = self.space.ops(mask)
        if not self.space.priced(ops):
            if self.new >= self.limit or self.space.stop():
                return None
            self.new += 1
        cost = self.space.price(ops)
        self.cache[mask] = cost
        return cost


def _ideals(space: RegionSpace) -> list[int] | None:
    """Every downward-closed unit set as a bitmask, smallest first; None if the unit graph
    has a cycle (the forced groups cannot be ordered)."""
    m = len(space.units)
    pred = [sum(1 << p for p in space.pred[u]) for u in range(m)]
    found, frontier = {0}, [0]
    while frontier:
        nxt = []
        for s in frontier:
            for u in range(m):
                if not s >> u & 1 and pred[u] & ~s == 0:
                    t = s | 1 << u
                    if t not in found:
                        found.add(t)
                        nxt.append(t)
        frontier = nxt
    full = (1 << m) - 1
    return sorted(found, key=lambda s: (bin(s).count("1"), s)) if full in found else None


def exact(space: RegionSpace, incumbent_us: float
          ) -> tuple[bool, list[frozenset[int]] | None]:
    """The cheapest acyclic partition (module docstring, step 1): (whether the DP ran to the
    end, the partition if it is cheaper than ``incumbent_us`` else None). Not run (False)
    when the program is too large, its units cannot be ordered, or a bound stopped it."""
    m = len(space.units)
    if m > EXACT_MAX_UNITS or m < 2:
        return m < 2, None
    ideals = _ideals(space)
    if ideals is None:
        return False, None
    price = _Counter(space, EXACT_MAX_NEW)
    best: dict[int, tuple[float, int]] = {0: (0.0, 0)}
    for s in ideals[1:]:
        subs = sorted((best[t][0], t) for t in best if t & ~s == 0 and t != s)
        top = (math.inf, -1)
        for base, t in subs:
            if base >= min(top[0], incumbent_us) - EPS_US:
                break  # sorted: no later T can do better
            cost = price(s & ~t)
            if cost is None:
                return False, None
            if base + cost < top[0] - EPS_US:
                top = (base + cost, t)
        best[s] = top
    full = (1 << m) - 1
    total, _ = best[full]
    if not total < incumbent_us - EPS_US:
        return True, None
    regions, s = [], full
    while s:
        t = best[s][1]
        regions.append(space.ops(s & ~t))
        s = t
    return True, sorted(regions, key=min)


def _moves(space: RegionSpace, regions: list[int]) -> list[list[int]]:
    """The partitions one move away from ``regions`` (unit bitmasks), valid or not."""
    m = len(space.units)
    out = []
    for a, ra in enumerate(regions):  # move unit u out of region a
        units = [u for u in range(m) if ra >> u & 1]
        if len(units) < 2:
            continue
        for u in units:
            rest = [r for k, r in enumerate(regions) if k != a] + [ra & ~(1 << u)]
            out.append(rest + [1 << u])  # split off on its own
            near = {k for k, r in enumerate(regions) if k != a and any(
                r >> v & 1 for v in space.succ[u] | space.pred[u])}
            for b in sorted(near):
                moved = [r for k, r in enumerate(regions) if k not in (a, b)]
                out.append(moved + [ra & ~(1 << u), regions[b] | 1 << u])
    for a in range(len(regions)):  # merge two regions
        for b in range(a + 1, len(regions)):
            rest = [r for k, r in enumerate(regions) if k not in (a, b)]
            out.append(rest + [regions[a] | regions[b]])
    return out


def local(space: RegionSpace, start: list[frozenset[int]]) -> list[frozenset[int]] | None:
    """Local moves from ``start`` (module docstring, step 2): the improved partition, or
    None when no move lowers the cost within the bounds."""
    bit = {u: 1 << u for u in range(len(space.units))}
    cur = []
    for r in start:
        mask = 0
        for i in r:
            mask |= bit[space.owner[i]]
        cur.append(mask)
    price = _Counter(space, LOCAL_MAX_NEW)
    costs = [price(r) for r in cur]
    if any(c is None for c in costs):
        return None
    total, improved = sum(costs), False
    for _ in range(LOCAL_MAX_ROUNDS):
        best = None
        seen: set[frozenset[int]] = set()
        for cand in _moves(space, cur):
            key = frozenset(cand)
            if key in seen or not space.acyclic(cand):
                continue
            seen.add(key)
            cost = 0.0
            for r in cand:
                c = price(r)
                if c is None:
                    break
                cost += c
            else:
                if cost < total - EPS_US and (best is None or cost < best[0] - EPS_US):
                    best = (cost, cand)
                continue
            break  # a bound stopped the search: keep what was found
        if best is None:
            break
        total, cur, improved = best[0], best[1], True
    if not improved:
        return None
    return sorted((space.ops(r) for r in cur), key=min)


def improve(space: RegionSpace, incumbent: list[frozenset[int]], incumbent_us: float
            ) -> list[frozenset[int]] | None:
    """A partition strictly cheaper than ``incumbent`` (costing ``incumbent_us``), by the
    exact DP for small programs, else by local moves; None when none is found."""
    done, found = exact(space, incumbent_us)
    if done:  # the DP saw every partition: nothing cheaper than ``found`` exists
        return found
    return local(space, incumbent)


def _lowest(mask: int) -> int:
    return (mask & -mask).bit_length()


def reachability(space: RegionSpace, cur: list[int]) -> tuple[list[int], list[int]]:
    """Per region of the acyclic partition ``cur`` (unit bitmasks): its successor regions
    and every region reachable from it, as bitmasks over region indices."""
    where = {u: r for r, m in enumerate(cur) for u in _bits(m)}
    succ = [0] * len(cur)
    for r, m in enumerate(cur):
        for u in _bits(m):
            for v in space.succ[u]:
                if where[v] != r:
                    succ[r] |= 1 << where[v]
    reach = [-1] * len(cur)

    def close(r: int) -> int:  # depth-first, memoized (the region graph is acyclic)
        stack = [r]
        while stack:
            x = stack[-1]
            todo = [s for s in _bits(succ[x]) if reach[s] < 0]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            if reach[x] < 0:
                acc = succ[x]
                for s in _bits(succ[x]):
                    acc |= reach[s]
                reach[x] = acc
        return reach[r]

    for r in range(len(cur)):
        close(r)
    return succ, reach


def merge_cycles(succ: list[int], reach: list[int], a: int, b: int) -> bool:
    """Whether merging regions ``a`` and ``b`` of an acyclic partition (``reachability``'s
    bitmasks) makes a cycle: one reaches the other through a third region."""
    ab, ba = 1 << b, 1 << a
    return any(reach[s] & ab for s in _bits(succ[a] & ~ab)) or any(
        reach[s] & ba for s in _bits(succ[b] & ~ba))


def descend(space: RegionSpace, start: list[frozenset[int]]) -> list[frozenset[int]]:
    """Best-improvement merging from ``start`` (module docstring, step 2): repeatedly merge
    the two neighbouring regions whose merge lowers the total most (ties: the lowest
    units), keeping the kernel graph acyclic, until no merge lowers it. A region the space
    may no longer price (``stop``) is not a candidate; what is priced still is. Merging
    regions a and b makes a cycle exactly when one reaches the other through a third
    region; that is read from each round's reachability (``reachability``)."""
    price = _Counter(space, 1 << 62)
    cur = sorted(space.masks(start), key=_lowest)
    while True:
        costs = [price(r) for r in cur]
        succ, reach = reachability(space, cur)
        best = None
        for a in range(len(cur)):
            adj = 0
            for u in _bits(cur[a]):
                adj |= space.near[u]
            for b in range(a + 1, len(cur)):
                if not adj & cur[b] or costs[a] is None or costs[b] is None:
                    continue
                if merge_cycles(succ, reach, a, b):
                    continue
                c = price(cur[a] | cur[b])
                if c is None:
                    continue
                gain = costs[a] + costs[b] - c
                if gain > EPS_US and (best is None or gain > best[0] + EPS_US):
                    best = (gain, a, b)
        if best is None:
            return sorted((space.ops(r) for r in cur), key=min)
        _, a, b = best
        cur = sorted([r for k, r in enumerate(cur) if k not in (a, b)] + [cur[a] | cur[b]],
                     key=_lowest)


def total(space: RegionSpace, regions: list[frozenset[int]]) -> float:
    """The price of a partition (op-index regions)."""
    return sum(space.price(r) for r in regions)


def search(full: RegionSpace, quick: RegionSpace | None = None) -> list[frozenset[int]]:
    """The partition of least price found (module docstring): the exact DP for at most
    ``EXACT_MAX_UNITS`` units (bounded by the quick descent's total), else the descent (with
    ``quick`` pricing first, when given), the whole program as one region, and local moves.
    Every step is bounded by work (regions priced: ``EXACT_MAX_NEW``, ``LOCAL_MAX_NEW``,
    the space's evaluation budget), so the partition found does not depend on how fast the
    machine runs; the space's deadline is only a cap."""
    units = list(full.units)
    whole = frozenset(i for u in units for i in u)
    regions = descend(quick, units) if quick is not None else units
    if len(units) <= EXACT_MAX_UNITS:
        # quick prices bound full ones from above (the full schedules include them): the quick
        # descent's total bounds the optimum, and its partition attains it if nothing beats it
        bound = total(quick, regions) if quick is not None else math.inf
        done, found = exact(full, bound)
        if done:
            return settle(full, found or (regions if math.isfinite(bound) else units))
    regions = descend(full, regions)
    if len(regions) > 1 and (full.priced(whole) or not full.stop()):
        if full.price(whole) < total(full, regions) - EPS_US:
            regions = [whole]
    return settle(full, local(full, regions) or regions)


def neighbours(space: RegionSpace, regions: list[frozenset[int]], limit: int
               ) -> list[tuple[float, list[frozenset[int]]]]:
    """The next-best partitions near ``regions`` (the search's result): up to ``limit``
    valid partitions one local move away (a unit moved to a neighbouring region or split
    off, two regions merged), each with its finite total, cheapest first (ties: the order
    the moves are listed in). Prices what is priced already, and at most ``LOCAL_MAX_NEW``
    new regions while the space allows (``stop``)."""
    if limit < 1:
        return []
    price = _Counter(space, LOCAL_MAX_NEW)
    here = frozenset(space.masks(regions))
    found: dict[frozenset[int], float] = {}
    for cand in _moves(space, space.masks(regions)):
        key = frozenset(cand)
        if key == here or key in found or not space.acyclic(cand):
            continue
        costs = [price(r) for r in cand]
        if any(c is None for c in costs):
            continue  # a bound stopped pricing: what is priced is still used
        cost = sum(costs)
        if math.isfinite(cost):
            found[key] = cost
    ranked = sorted(found.items(), key=lambda kv: kv[1])[:limit]
    return [(cost, sorted((space.ops(r) for r in key), key=min)) for key, cost in ranked]


def settle(space: RegionSpace, regions: list[frozenset[int]]) -> list[frozenset[int]]:
    """``regions`` with every region of several units that has no finite full price (a
    passed deadline left it unpriced) split back into its units: left unfused. Splitting a
    region of an acyclic partition keeps it acyclic (the region is convex)."""
    out = []
    for r in regions:
        units = [u for u in space.units if u <= r]
        if len(units) > 1 and not math.isfinite(space.price(r)):
            out.extend(units)
        else:
            out.append(r)
    return sorted(out, key=min)
