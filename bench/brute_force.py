"""Brute force against the fusion planner: the optimality yardstick of issue 33.

For a program of at most ``MAX_OPS`` ops, ``brute_force`` prices every partition of its ops
into kernels whose kernel graph is acyclic: each multi-op kernel with every schedule the
planner's final pricing offers (``full_strategies``: ``BUILTIN_STRATEGY``'s candidate
grids, loops and FlashDecoding splits, plus up to 96 grids of one block per SM or more), a
single op as its library kernel, all by the one GPU cost model (``gpucost.kernel_cost``,
target h100). ``compare`` sets the cheapest partition against ``fusion.plan`` on the SAME
program (the same algebraic form, no tiling-rule cuts): like with like, so the brute force
is a lower bound by construction and any gap is the region search's (``fusion/regions.py``).
Both sides are summed per kernel region, as the planner prices its search
(``FusionPlan.regions``); the planner's built MuGraph's ``mugraph_cost`` is kept beside
it. That one can be lower than the region sum: a causal mask read only inside fused kernels
is computed from positions for free, and thread fusion keeps chain interiors out of shared
memory; the brute force bounds the region sum, the scale both searches price on.

Not compared here: the algebraic choice (``em.optimize`` plans k extracted forms and keeps
the cheapest; ``bench/brute_force_bench.py --optimize`` reports it), the compile check's
refusals and retuned warps. Bounded: a program over ``MAX_OPS`` ops is refused
(``BruteForceError``), an enumeration stops at its time limit (flagged incomplete), and
region prices are memoized by fragment shape across programs (``Pricer``).
The program sets, the results cache and the command line: ``bench/brute_force_bench.py``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from eqsat_mirage.cost.gpucost import kernel_cost
from eqsat_mirage.cost.profile import GPUProfile
from eqsat_mirage.frontend.graph import Graph
from eqsat_mirage.fusion.indexing import ScheduleError, index_fragment
from eqsat_mirage.fusion.lower import add_kernel
from eqsat_mirage.fusion.planner import DEFAULT_STRATEGY, plan
from eqsat_mirage.fusion.space import OpSpace
from eqsat_mirage.fusion.strategy import Strategy, candidate_schedules
from eqsat_mirage.ir.errors import MirageError
from eqsat_mirage.ir.node import Op
from eqsat_mirage.mugraph.kernels import PredefinedKernel
from eqsat_mirage.mugraph.program import MuGraph

MAX_OPS = 6  # Bell(6) = 203 partitions, at most 63 regions to price per program
TIME_LIMIT_S = 120.0  # per program: past it the enumeration stops, flagged incomplete
EQUAL_RTOL = 1e-6  # planner / brute force within this ratio counts as equal
# the strategy em.optimize plans under with the built-in rules: fusion.DEFAULT_STRATEGY with
# splits, as egraph/kernels.py sets it where rules/block.egg's SplitOver rules fire
BUILTIN_STRATEGY = replace(DEFAULT_STRATEGY, allow_split_reduction=True)


class BruteForceError(MirageError):
    """A program the brute force cannot enumerate (too many ops)."""


# -- one program's ops and fragments, formed as the planner forms them -----------------------


class Space(OpSpace):
    """The ops of ``graph`` as ``fusion.plan`` numbers and names them (``OpSpace``: the
    planner's own class), with the acyclicity test of a partition into kernels."""

    def acyclic(self, label: tuple[int, ...]) -> bool:
        """Whether the kernels of partition ``label`` (op -> kernel) form an acyclic graph."""
        k = max(label) + 1
        succ = [set() for _ in range(k)]
        for i, users in enumerate(self.users):
            for u in users:
                if label[u] != label[i]:
                    succ[label[i]].add(label[u])
        state = [0] * k  # 0 new, 1 on the stack, 2 done
        for start in range(k):
            if state[start]:
                continue
            stack = [(start, iter(succ[start]))]
            state[start] = 1
            while stack:
                node, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    state[node] = 2
                    stack.pop()
                elif state[nxt] == 1:
                    return False
                elif state[nxt] == 0:
                    state[nxt] = 1
                    stack.append((nxt, iter(succ[nxt])))
        return True


def shape_key(frag: Graph) -> tuple:
    """``frag`` up to the names of its tensors: ops, arguments, shapes, dtypes and wiring."""
    pos: dict[int, int] = {}
    rows = []
    for n in frag.nodes():
        pos[id(n)] = len(pos)
        rows.append((n.op.name, None if n.op is Op.INPUT else repr(n.arg), n.shape, n.dtype,
                     tuple(pos[id(x)] for x in n.srcs)))
    return tuple(rows), tuple(pos[id(n)] for n in frag.outputs.values())


# -- pricing ---------------------------------------------------------------------------------


def full_strategies(prof: GPUProfile, strategy: Strategy = BUILTIN_STRATEGY
                    ) -> tuple[Strategy, Strategy]:
    """The schedule lists the planner prices a final region with (``fusion/planner.py``,
    step 4): ``strategy`` itself, and up to 96 grids of at least one block per SM."""
    filled = replace(strategy, min_blocks=max(strategy.min_blocks, prof.sms))
    return strategy, replace(filled, max_candidates=min(96, strategy.max_candidates))


@dataclass(frozen=True)
class RegionPrice:
    """The best way to run one region: its cost, schedule (None: a library kernel) and how
    many schedules were priced (why none fits when the cost is infinite)."""

    cost_us: float
    schedule: str | None
    tried: int
    reason: str = ""


class Pricer:
    """Regions priced with every schedule of ``full_strategies``, memoized by fragment shape
    (an equal fragment of another program is priced once)."""

    def __init__(self, target: str = "h100", strategy: Strategy = BUILTIN_STRATEGY) -> None:
        self.prof = GPUProfile.load(target)
        self.strategy = strategy
        self.strategies = full_strategies(self.prof, strategy)
        self.memo: dict[tuple, RegionPrice] = {}
        self.schedules_priced = 0

    def price(self, frag: Graph) -> RegionPrice:
        """The cheapest way to run ``frag`` as one kernel: a library kernel for one op, the
        best feasible custom-kernel schedule for several (infinite if none)."""
        key = shape_key(frag)
        if key not in self.memo:
            self.memo[key] = self._price(frag)
        return self.memo[key]

    def _price(self, frag: Graph) -> RegionPrice:
        ops = [n for n in frag.nodes() if n.op not in (Op.INPUT, Op.CONST)]
        if len(ops) == 1:
            oname = next(iter(frag.outputs))
            k = PredefinedKernel(frag.outputs[oname], oname, "k")
            return RegionPrice(kernel_cost(k, MuGraph(), self.prof).time_us, None, 1)
        try:
            ix = index_fragment(frag)
            scheds = list(dict.fromkeys(s for st in self.strategies
                                        for s in candidate_schedules(ix, st)))
        except (ScheduleError, MirageError) as exc:
            return RegionPrice(math.inf, None, 0, f"cannot be indexed: {exc}")
        best, best_s = math.inf, None
        for s in scheds:
            mg = MuGraph("scratch")
            for name, node in frag.inputs.items():
                mg.input(name, node.shape, node.dtype)
            try:
                ks = add_kernel(mg, frag, s, indexing=ix)
            except (ScheduleError, MirageError):
                continue
            self.schedules_priced += 1
            total = sum(kernel_cost(k, mg, self.prof).time_us for k in ks)
            if total < best - 1e-12:
                best, best_s = total, s
        if best_s is None:
            return RegionPrice(math.inf, None, len(scheds), "no feasible schedule")
        return RegionPrice(best, str(best_s), len(scheds))


# -- enumeration -----------------------------------------------------------------------------


def partitions(n: int) -> Iterator[tuple[int, ...]]:
    """Every partition of ``range(n)`` as a restricted growth string (op -> block number,
    the first op of each block numbered in order): Bell(n) of them."""
    if n == 0:
        yield ()
        return
    label = [0] * n

    def grow(i: int, top: int) -> Iterator[tuple[int, ...]]:
        if i == n:
            yield tuple(label)
            return
        for b in range(top + 2):
            label[i] = b
            yield from grow(i + 1, max(top, b))

    yield from grow(1, 0)


@dataclass
class BruteResult:
    """The cheapest acyclic partition of one program, and what it took to find."""

    cost_us: float
    regions: list[list[int]]
    partitions: int  # every partition of the ops (Bell number)
    acyclic: int  # those whose kernel graph is acyclic
    feasible: int  # those whose every kernel has a feasible schedule
    regions_priced: int
    seconds: float
    complete: bool = True


def brute_force(graph: Graph, pricer: Pricer, time_limit_s: float = TIME_LIMIT_S,
                max_ops: int = MAX_OPS) -> BruteResult:
    """The cheapest partition of ``graph``'s ops into kernels (module docstring).

    Raises ``BruteForceError`` when ``graph`` has more than ``max_ops`` ops. Past
    ``time_limit_s`` the enumeration stops with the best so far and ``complete=False``.
    """
    t0 = time.perf_counter()
    space = Space(graph)
    n = len(space.ops)
    if n > max_ops:
        raise BruteForceError(f"brute force: {graph.name!r} has {n} ops, more than {max_ops} "
                              f"(Bell({n}) partitions)")
    prices: dict[frozenset[int], float] = {}

    def price(region: frozenset[int]) -> float:
        if region not in prices:
            prices[region] = pricer.price(space.fragment(region)).cost_us
        return prices[region]

    best, best_label = math.inf, None
    total = acyclic = feasible = 0
    complete = True
    for label in partitions(n):
        total += 1
        if time.perf_counter() - t0 > time_limit_s:
            complete = False
            break
        if not space.acyclic(label):
            continue
        acyclic += 1
        blocks: dict[int, set[int]] = {}
        for i, b in enumerate(label):
            blocks.setdefault(b, set()).add(i)
        cost = 0.0
        for ops in blocks.values():
            cost += price(frozenset(ops))
            if cost >= math.inf:
                break
        if not math.isfinite(cost):
            continue
        feasible += 1
        if cost < best - 1e-12:
            best, best_label = cost, label
    regions = [] if best_label is None else sorted(
        sorted(i for i, b in enumerate(best_label) if b == k) for k in set(best_label))
    return BruteResult(best, regions, total, acyclic, feasible, len(prices),
                       time.perf_counter() - t0, complete)


@dataclass
class Comparison:
    """The planner's plan of one program against the brute force's cheapest partition."""

    label: str
    ops: int
    planner_us: float  # sum of the planner's region prices (its own search's figure)
    planner_built_us: float  # mugraph_cost of the MuGraph it builds (thread fusion included)
    planner_regions: list[list[int]]
    brute: BruteResult
    plan_seconds: float = 0.0
    cached: bool = field(default=False, compare=False)

    @property
    def ratio(self) -> float:
        """Planner over brute force (1.0: the planner found the optimum)."""
        if self.brute.cost_us == self.planner_us:
            return 1.0
        return self.planner_us / self.brute.cost_us

    @property
    def equal(self) -> bool:
        """Whether the planner's cost equals the brute force's (within ``EQUAL_RTOL``)."""
        return self.ratio <= 1 + EQUAL_RTOL


def compare(label: str, graph: Graph, pricer: Pricer, time_limit_s: float = TIME_LIMIT_S
            ) -> Comparison:
    """``fusion.plan(graph)`` (the default strategy, no cuts) against ``brute_force``."""
    t = time.perf_counter()
    p = plan(graph, pricer.prof, pricer.strategy)
    seconds = time.perf_counter() - t
    brute = brute_force(graph, pricer, time_limit_s)
    return Comparison(label, len(Space(graph).ops), sum(r.cost_us for r in p.regions),
                      p.cost_us, sorted(sorted(r.ops) for r in p.regions), brute, seconds)


@dataclass
class Summary:
    """The figures of a run: how many programs, equal, the worst ratio, where the planner lost."""

    programs: int
    complete: int
    equal: int
    worst_ratio: float
    losers: list[Comparison]
    skipped: list[str]
    incomplete: list[str]
    violations: list[str]  # brute force dearer than the planner: a bug in one of them

    def __str__(self) -> str:
        worst = max(self.losers, key=lambda c: c.ratio, default=None)
        return (f"{self.equal} of {self.complete} programs equal "
                f"({100 * self.equal / max(self.complete, 1):.1f}%), worst ratio "
                f"{self.worst_ratio:.3f}x{f' ({worst.label})' if worst else ''}; "
                f"{len(self.incomplete)} incomplete, {len(self.skipped)} skipped (over "
                f"{MAX_OPS} ops), {len(self.violations)} lower-bound violations")


def summarize(comps: list[Comparison], skipped: list[str] = ()) -> Summary:
    """The ``Summary`` of ``comps`` (incomplete enumerations left out of the figures)."""
    done = [c for c in comps if c.brute.complete]
    equal = [c for c in done if c.equal]
    losers = sorted((c for c in done if not c.equal), key=lambda c: -c.ratio)
    violations = [c.label for c in done
                  if c.brute.cost_us > c.planner_us * (1 + EQUAL_RTOL)]
    worst = max((c.ratio for c in done), default=1.0)
    return Summary(len(comps), len(done), len(equal), worst, losers, list(skipped),
                   [c.label for c in comps if not c.brute.complete], violations)
