"""The block/thread level of the search: partition a kernel-level Graph into fused kernels.

``plan(graph, profile, strategy)`` turns one algebraic candidate (a kernel-level
``Graph``) into a ``MuGraph``. The graph's ops are partitioned into *regions*;
a region of one op runs as a predefined (library) kernel, as ``from_graph``
does, and a region of several ops runs as ONE custom kernel: its fragment (the
ops, reading device tensors, writing the values used outside it) gets the
legal schedule (``strategy.candidate_schedules``) of least ``gpucost`` and is
lowered with ``lower.add_kernel``. Inside a custom kernel, chains of
elementwise tile ops are recorded as thread graphs (``CustomKernel.fuse``).

This module prices regions and builds the chosen partition; which ops share a kernel is
decided by the region search (``regions.search``), called from ``plan``:

1. Units: one per op, joined across every edge where no rule of rules/tiling.egg allows a
   kernel boundary (``cuts``, read from the e-graph by ``boundaries.py``). Neighbours: a
   producer and its consumer, and two units reading a common device tensor (siblings:
   GatedMLP's two matmuls reading X, RMSNorm's mean and matmul reading X).
2. A region's price: its fragment's best legal, feasible schedule (memoized by op set and,
   across the plans of one search, by fragment shape through ``shared``), at two depths:
   quick (``search_candidates`` schedules, two thirds from grids of at least one block per
   SM, a third in Mirage's order, no splits) and full (``strategy``, up to
   ``max_candidates`` schedules, splits included, plus up to 96 SM-filling grids, plus any
   quick schedule those left out). The quick schedules are a subset of the full ones, so a
   quick price bounds the full one from above.
   A region of one op is its predefined kernel; the e-graph's Kern, Online and Reg nodes
   (``permit``) decide which schedules and thread graphs are priced at all.
3. The search (``regions.py``): exact dynamic programming over every acyclic partition of a
   program of at most ``regions.EXACT_MAX_UNITS`` units, bounded by the quick descent's
   total; for larger programs best-improvement merging of neighbours (quick, then full
   pricing), the whole program as one kernel, and local moves (bounded by regions priced,
   not by seconds: the plan is the same on a quiet or a busy machine). Elementwise chains need no
   special case: fusing them saves launches and round trips, so they join their producer's
   or consumer's region. The result never costs more than one kernel per unit (a region a
   passed deadline left unpriced is split back into its units: left unfused).
4. For each pair of neighbouring regions of the result, the report's "why not" (``why_not``,
   priced in full): the merge would make a cycle, has no legal schedule (a value carrying
   the loop index after a reduction over it, as in softmax before its division is moved),
   every legal schedule is infeasible (tiles exceed shared memory, K < 16), or it is simply
   dearer than separate kernels.

5. Asked for alternatives (measured tuning times them), the plan carries other plans of the
   program: its regions' next-best schedules, its matmuls as library kernels with the work
   around them fused apart, the next-best partitions (``alternatives.py``).

Bounded by ``max_evaluations`` fragments priced and the deadline; a program of at most 6
units is searched exactly (bench/RESULTS.md, "Planner against brute force").
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

from ..cost.gpucost import custom_floor_us, kernel_cost, mugraph_cost, tensor_bytes
from ..cost.profile import NUM_STAGES, GPUProfile
from ..cost.tiles import DEEP_STAGES, dynamic_context, pow2_ceil
from ..frontend.graph import Graph
from ..ir.errors import MirageError
from ..ir.limits import keep_bounded
from ..ir.node import GATHERS, ITEMSIZE, Node, Op, located, numel
from ..mugraph.kernels import PredefinedKernel
from ..mugraph.program import MuGraph, from_graph
from .alternatives import variants
from .indexing import Indexing, ScheduleError, UnionFind, index_fragment
from .lower import add_kernel
from .plans import FusionPlan, Pricing, Region, plan_key
from .regions import RegionSpace, search
from .schedule import Schedule, check_schedule, classify, running_exps
from .space import OpSpace
from .strategy import (
    Strategy,
    candidate_schedules,
    kern_choice,
    prefer_long_chunks,
    prefer_pow2_chunks,
)

# Mirage's ranges and block counts, and up to 512 schedules priced per final region
# (candidate_schedules lists small grids first; grids that fill the SMs and split reductions
# come later). No split reductions: whether a split is priced is decided by the SplitOver
# Kern nodes of rules/block.egg (egraph/kernels.py sets allow_split_reduction from them).
DEFAULT_STRATEGY = Strategy(max_candidates=512)
# why the block level read from the e-graph refuses a schedule (Pricing.reason)
_LEFT_OUT = {"Kern": "looping or splitting a reduction with no such Kern node",
             "Online": "where an exp reads a running maximum and has no Online node"}
# a fragment's kernel costs under one schedule (``Planner._cost``), kept across the plans of
# one search (``shared``) or one planner: at most this many (a tiny LLaMA layer's search
# prices about 11,000 schedules, about 900 of them again)
COSTS_KEPT = 16384
# ``Planner._floor`` times this, against the cheapest schedule so far: a margin far past the
# rounding of the cost's sums (a schedule within it of the best is worked out)
FLOOR_MARGIN = 1.0 - 1e-9


class Planner(OpSpace):
    """One program's planning state (``plan`` makes one): its ops, the prices of regions
    (memoized, quick and full), the region search over them, and the build of a chosen
    partition into a MuGraph; ``alternatives.py`` asks it for the variants of a plan."""

    def __init__(self, graph: Graph, prof: GPUProfile, strategy: Strategy,
                 search_candidates: int, cuts: frozenset | None = None,
                 shared: dict | None = None, permit=None, refused: dict | None = None) -> None:
        super().__init__(graph)
        self.refused = refused  # the compile check's refusals: tile/structure key -> reason
        self.permit = permit  # the schedules the e-graph's Kern nodes allow (plan's permit)
        self.prof, self.strategy = prof, strategy
        self.cuts, self.deadline = cuts, None  # plan() sets the deadline
        self.shared = shared  # fragment shape -> best schedule's position and cost, across plans
        # candidate_schedules lists small grids first: ``filled`` starts at one block per SM
        filled = replace(strategy, min_blocks=max(strategy.min_blocks, prof.sms))
        quick = min(search_candidates, strategy.max_candidates)
        self.quick = (replace(filled, max_candidates=quick - quick // 3,
                              allow_split_reduction=False),
                      replace(strategy, max_candidates=quick // 3, allow_split_reduction=False))
        # the full schedules include the quick ones (appended where a small max_candidates
        # left them out), so a quick price never falls below the full one (regions.search
        # bounds its exact search by the quick descent's total)
        self.full = (strategy, replace(filled, max_candidates=min(96, strategy.max_candidates)),
                     *self.quick)
        self.memo: dict[frozenset, Pricing] = {}  # search pricing (quick strategy)
        self.final: dict[frozenset, Pricing] = {}  # the chosen regions, full strategy
        # region -> its fragment and origin (``region_fragment``): the quick and the full
        # pricing of a region, its ranking and its report share one, and so its indexing
        self.fragments: dict[frozenset, tuple[Graph, dict[int, int]]] = {}
        self.evaluations = 0  # fragments priced as custom kernels
        # ``_cost``'s results by ``_cost_key`` (across the plans sharing ``shared``); the
        # refusals as a key, and the last fragment's register mask (``_cost_key``)
        self.costs: dict = {} if shared is None else shared.setdefault("kernel costs", {})
        self.refused_key = None if refused is None else tuple(refused.items())
        self.mask: tuple | None = None

    # -- regions ------------------------------------------------------------------------------
    def price(self, region: frozenset, final: bool = False) -> Pricing:
        memo = self.final if final else self.memo
        if region in memo:
            return memo[region]
        frag, origin = self.region_fragment(region)
        if len(region) == 1:
            node = frag.outputs[next(iter(frag.outputs))]
            k = PredefinedKernel(node, next(iter(frag.outputs)), "k")
            p = Pricing(frag, None, None, kernel_cost(k, MuGraph(), self.prof).time_us)
            self.memo[region] = self.final[region] = p  # exact at both depths
            return p
        p = self._price_custom(frag, final, origin)
        memo[region] = p
        return p

    def region_fragment(self, region: frozenset) -> tuple[Graph, dict[int, int]]:
        """``region``'s fragment (``OpSpace.fragment``) and its origin (id(fragment node) ->
        the op's position), made once per planner (read, never changed): a fragment is a
        function of the region, and the one object keeps its indexing and keys
        (``Graph.derived``) for every pricing of it."""
        found = self.fragments.get(region)
        if found is None:
            origin: dict[int, int] = {}
            found = self.fragments[region] = (self.fragment(region, origin=origin), origin)
        return found

    def registers(self, origin: dict[int, int]):
        """Which of a fragment's nodes may stay in registers (``add_kernel``'s predicate):
        those whose op's e-class holds a Reg node (rules/thread.egg); None (any) without an
        e-graph."""
        if self.permit is None:
            return None
        return lambda n: id(n) in origin and self.permit.in_registers(self.ops[origin[id(n)]])

    def _cost(self, frag: Graph, s: Schedule, ix: Indexing,
              origin: dict[int, int]) -> tuple[float, list]:
        """The fragment as one custom kernel with schedule ``s`` (its thread graphs included):
        its cost and the kernels' (the same list for an equal key: read, never changed),
        kept by ``_cost_key`` (a schedule that cannot be lowered raises each time)."""
        key = self._cost_key(frag, s, origin)
        costs = self.costs.get(key)
        if costs is None:
            costs = self._kernel_costs(frag, s, ix, origin)
            keep_bounded(self.costs, key, costs, COSTS_KEPT)
        return sum(c.time_us for c in costs), costs

    def _floor(self, frag: Graph, s: Schedule, ix: Indexing) -> float:
        """A lower bound of ``_cost(frag, s, ...)``'s total (``gpucost.custom_floor_us``): a
        launch per kernel (a split writes the outputs its reduce kernel makes from a second
        one) and the fragment's inputs read and outputs written once, by one kernel at the
        rate its blocks' loads in flight allow (``_flight_bound``); 0 where ``s`` cannot
        be lowered (``_cost`` says why)."""
        try:
            kind = check_schedule(ix, s).kind
        except (ScheduleError, MirageError):
            return 0.0
        moved = frag.derived("moved bytes", _moved_bytes)
        if s.split is None:
            return custom_floor_us(self.prof, moved, 1, s.blocks, _flight_bound(frag, s, ix))
        kernels = 1 + any(kind[id(n)] != "loop" for n in frag.outputs.values())
        return custom_floor_us(self.prof, moved, kernels)

    def _inputs_overflow(self, frag: Graph, s: Schedule, ix: Indexing) -> bool:
        """Whether the input tiles of ``s``'s (first) kernel alone take more shared memory
        than a block may hold, so that ``_cost(frag, s, ...)`` is infinite (or ``s`` cannot
        be lowered): ``gpucost.smem_bytes`` counts each block input's tile at least with its
        dims padded to powers of two, once per pipeline stage (at least
        ``min(NUM_STAGES, DEEP_STAGES)``) when it has an fmap and the loop runs more than
        once. Each input's tile is its dims cut by ``s`` (grid blocks, the loop range on the
        dim carrying the loop index), as ``lower`` declares it. False where ``s`` is not
        legal (``_cost`` says why)."""
        try:
            check_schedule(ix, s)
        except (ScheduleError, MirageError):
            return False
        stages = min(NUM_STAGES, DEEP_STAGES) if s.forloop > 1 else 1
        total = 0
        for node in frag.inputs.values():
            dims = ix.of(node)
            tile = tuple([pow2_ceil(size // s.parts(i)) for size, i in zip(node.shape, dims)])
            looped = s.loop is not None and s.loop in dims
            total += tensor_bytes(tile, node.dtype) * (stages if looped else 1)
        return total > self.prof.smem_per_block_KiB * 1024

    def _cost_key(self, frag: Graph, s: Schedule, origin: dict[int, int]) -> tuple:
        """What ``_kernel_costs`` depends on: the fragment up to its nodes' identity
        (``_named_key``: its reasons name tensors and source lines), ``s``, which of its
        nodes may stay in registers, the profile, the refusals and a shape family's dynamic
        dims (``tiles.refusal``)."""
        if self.mask is None or self.mask[0] is not frag or self.mask[1] is not origin:
            reg = self.registers(origin)
            self.mask = (frag, origin, None if reg is None else
                         tuple(bool(reg(n)) for n in frag.nodes()))
        dyn = dynamic_context()
        if dyn is not None:
            dyn = (tuple(sorted((t, tuple(sorted(a))) for t, a in dyn[0].items())), dyn[1])
        return (frag.derived("named key", _named_key), s, self.mask[2], self.prof,
                self.refused_key, dyn)

    def _kernel_costs(self, frag: Graph, s: Schedule, ix: Indexing,
                      origin: dict[int, int]) -> list:
        """``_cost``'s kernels' costs, worked out."""
        mg = MuGraph("scratch")
        for name, node in frag.inputs.items():
            mg.input(name, node.shape, node.dtype)
        # the tiles' nodes take the fragment's source line (not a walk up the stack each:
        # a tenth of the pricing's time)
        where = next((n.loc for n in frag.outputs.values() if n.loc), "") or "<fragment>"
        with located(where):
            ks = add_kernel(mg, frag, s, indexing=ix, registers=self.registers(origin))
        return [kernel_cost(k, mg, self.prof, self.refused) for k in ks]

    def _left_out(self, ix: Indexing, s: Schedule, origin: dict[int, int],
                 online: dict[str, bool]) -> str:
        """Why ``permit`` refuses ``s`` ("" when it does not): ``s`` may loop over / split an
        index only when every reduction of that index in the fragment (mapped to this graph's
        op by ``origin``) has a Kern node with that (loop range, split parts), and every exp
        reading a running maximum over it an Online node (``online`` memoizes that per
        index)."""
        for idx in sorted({s.loop, s.split} - {None}):
            reds = [self.ops[origin[id(n)]] for n in ix.reduced.get(idx, [])]
            if not self.permit.allows(kern_choice(s, idx), reds):
                return "Kern"
            if idx not in online:
                try:
                    exps = running_exps(ix, idx)
                except ScheduleError:  # no legal schedule loops over idx
                    exps = None
                online[idx] = exps is not None and all(
                    self.permit.online(self.ops[origin[id(n)]]) for n in exps)
            if not online[idx]:
                return "Online"
        return ""

    def _candidates(self, frag: Graph, final: bool, origin: dict[int, int]
                    ) -> tuple[Indexing, list[Schedule], tuple, dict[str, int]]:
        """``frag``'s indexing, its legal schedules (the full strategies, ``final``, or the
        quick ones) less those ``permit`` refuses, power-of-two chunks preferred, its key in
        ``shared`` and how many schedules ``permit`` left out and why. Raises
        ``ScheduleError`` or ``MirageError`` when ``frag`` cannot be indexed."""
        ix = frag.derived("indexing", index_fragment)  # (an error is raised, not kept)
        strategies = self.full if final else self.quick
        key = (_shape_key(frag), final)
        if self.permit is not None:
            key += (self.permit.key([self.ops[origin[id(n)]] for n in frag.nodes()
                                     if id(n) in origin]),)
        # the list is a function of the fragment's structure (the index names follow its
        # inputs' order, and an unused input's shape), the strategies and what ``permit``
        # says of its nodes: a fragment equal in all of these (another plan's, a re-plan's)
        # takes the list worked out before
        listed = ("candidates", key, _input_key(frag), strategies)
        if self.shared is not None and listed in self.shared:
            scheds, left_out = self.shared[listed]
            return ix, list(scheds), key, dict(left_out)
        scheds = list(dict.fromkeys(s for st in strategies for s in candidate_schedules(ix, st)))
        left_out: dict[str, int] = {}
        if self.permit is not None:
            online: dict[str, bool] = {}
            why_out = [self._left_out(ix, s, origin, online) for s in scheds]
            left_out = {w: why_out.count(w) for w in ("Kern", "Online") if w in why_out}
            scheds = [s for s, why in zip(scheds, why_out) if not why]
        scheds = prefer_pow2_chunks(ix, prefer_long_chunks(ix, scheds))
        if self.shared is not None:
            self.shared[listed] = (tuple(scheds), dict(left_out))
        return ix, scheds, key, left_out

    def late(self) -> bool:
        """Whether the plan's deadline (if any) has passed."""
        return self.deadline is not None and self.deadline.expired()

    def _price_custom(self, frag: Graph, final: bool, origin: dict[int, int]) -> Pricing:
        """The cheapest schedule of ``frag`` as one custom kernel, with the full strategies
        (``final``) or the quick ones of the search, less those ``permit`` refuses."""
        if self.deadline is not None and self.deadline.expired():
            return Pricing(frag, None, None, math.inf, "not priced: the time limit ran out")
        self.evaluations += 1
        try:
            ix, scheds, key, left_out = self._candidates(frag, final, origin)
        except (ScheduleError, MirageError) as exc:
            return Pricing(frag, None, None, math.inf, f"cannot be indexed: {exc}")
        known = None if self.shared is None else self.shared.get(key)
        if known is not None:  # an equal fragment of another plan: check its best, keep it
            pos, cost, reason = known
            try:
                if pos is not None and pos < len(scheds) and \
                        self._cost(frag, scheds[pos], ix, origin)[0] == cost:
                    return Pricing(frag, ix, scheds[pos], cost, tried=len(scheds),
                                   origin=origin)
            except (ScheduleError, MirageError):
                pass
            if pos is None:
                return Pricing(frag, ix, None, math.inf, reason, len(scheds))
        best, best_i, infeasible = math.inf, None, ""
        for i, s in enumerate(scheds):
            if self.late():  # one fragment's schedules took 3 s on a busy machine: the
                return Pricing(frag, None, None, math.inf,  # deadline is checked between
                               "not priced: the time limit ran out")  # them (nothing kept)
            if best < math.inf and self._floor(frag, s, ix) * FLOOR_MARGIN >= best - 1e-12:
                continue  # it cannot be cheaper than the best so far: not worked out
            if (best < math.inf or infeasible) and self._inputs_overflow(frag, s, ix):
                continue  # infinite, and its reason is not needed (one is kept, or a best)
            try:
                total, costs = self._cost(frag, s, ix, origin)
            except (ScheduleError, MirageError):
                continue
            if total < best - 1e-12:
                best, best_i = total, i
            elif not math.isfinite(total) and not infeasible:
                infeasible = f"schedule {s}: " + "; ".join(c.reason for c in costs if c.reason)
        if best_i is not None:
            if self.shared is not None:
                self.shared[key] = (best_i, best, "")
            return Pricing(frag, ix, scheds[best_i], best, tried=len(scheds), origin=origin)
        reason = _why_none(ix, scheds, infeasible)
        if left_out:  # what the e-graph's block level left out, said after the rest
            reason += "; the e-graph (rules/block.egg) left out " + ", ".join(
                f"{n} schedules {_LEFT_OUT[w]}" for w, n in left_out.items())
        if self.shared is not None:
            self.shared[key] = (None, math.inf, reason)
        return Pricing(frag, ix, None, math.inf, reason, len(scheds))

    def ranked(self, region: frozenset, limit: int) -> list[Pricing]:
        """Up to ``limit`` legal, feasible schedules of ``region`` as one custom kernel (the
        full strategies, less those ``permit`` refuses), cheapest first (ties: listing
        order, as ``price`` breaks them); [] for a region of one op, one that cannot be
        indexed, or past the deadline. Counts as one evaluation."""
        if len(region) < 2 or limit < 1 or (
                self.deadline is not None and self.deadline.expired()):
            return []
        self.evaluations += 1
        frag, origin = self.region_fragment(region)
        try:
            ix, scheds, _, _ = self._candidates(frag, True, origin)
        except (ScheduleError, MirageError):
            return []
        found = []
        for i, s in enumerate(scheds):
            if self.late():  # past the deadline: no schedule ranked (as before pricing)
                return []
            try:
                total = self._cost(frag, s, ix, origin)[0]
            except (ScheduleError, MirageError):
                continue
            if math.isfinite(total):
                found.append((total, i, s))
        found.sort(key=lambda x: x[:2])
        return [Pricing(frag, ix, s, cost, tried=len(scheds), origin=origin)
                for cost, _, s in found[:limit]]

    # -- search -------------------------------------------------------------------------------
    def pairs(self, regions: list[frozenset]) -> list[tuple[int, int, str]]:
        owner = {i: r for r, reg in enumerate(regions) for i in reg}
        found: dict[tuple[int, int], str] = {}
        for r, reg in enumerate(regions):
            for i in reg:
                for u in self.users[i]:
                    if owner[u] != r:
                        found.setdefault(tuple(sorted((r, owner[u]))), "producer-consumer")
        reads = [self.reads(reg) for reg in regions]
        for a in range(len(regions)):
            for b in range(a + 1, len(regions)):
                if reads[a] & reads[b]:
                    found.setdefault((a, b), f"siblings reading {sorted(reads[a] & reads[b])}")
        return sorted((a, b, why) for (a, b), why in found.items())

    def forced(self) -> list[frozenset]:
        """The starting regions: ops joined by every edge that may not be a kernel boundary.
        An edge into or out of a gather is always one: a gather runs as a kernel of its own
        (BERT's token-type ids, a concat of two index rows, had no boundary into their
        gather, and every plan of its embedding piece failed)."""
        uf = UnionFind()
        if self.cuts is not None:
            for i, n in enumerate(self.ops):
                for s in n.srcs:
                    j = self.index.get(id(s))
                    if j is not None and (id(s), id(n)) not in self.cuts and \
                            n.op not in GATHERS and s.op not in GATHERS:
                        uf.union(j, i)
        groups: dict[int, set[int]] = {}
        for i in range(len(self.ops)):
            groups.setdefault(uf.find(i), set()).add(i)
        return sorted((frozenset(g) for g in groups.values()), key=min)

    def search(self, budget: int) -> tuple[list[frozenset], dict[frozenset, list[str]]]:
        """The region search (``regions.search``) over this planner's prices, and why each
        pair of neighbouring regions of the result is not one kernel."""
        found = search(self.space(budget), self.space(budget, quick=True))
        return found, self.why_not(found, budget)

    def why_not(self, regions: list[frozenset], budget: int) -> dict[frozenset, list[str]]:
        """For each region, why it is not merged with each neighbour (``pairs``): a cycle,
        no feasible schedule, or a dearer kernel (priced, within the budget)."""
        why: dict[frozenset, list[str]] = {r: [] for r in regions}
        space = self.space(budget)
        for a, b, kind in self.pairs(regions):
            ra, rb = regions[a], regions[b]
            rest = [r for k, r in enumerate(regions) if k not in (a, b)]
            if not space.acyclic(space.masks(rest + [ra | rb])):
                text = "the region graph would have a cycle"
            elif ra | rb not in self.final and space.stop():
                text = ("the time limit ran out" if self.deadline is not None
                        and self.deadline.expired() else "search budget (max_evaluations) spent")
            else:
                pm = self.price(ra | rb, True)
                now = self.price(ra, True).cost_us + self.price(rb, True).cost_us
                text = (f"{kind}: {pm.reason}" if not math.isfinite(pm.cost_us) else
                        f"{kind}: one kernel {pm.schedule} would cost {pm.cost_us:.2f} us, "
                        f"separately {now:.2f} us")
            why[ra].append(f"with ops {sorted(rb)} ({text})")
            why[rb].append(f"with ops {sorted(ra)} ({text})")
        return why

    def space(self, budget: int, quick: bool = False) -> RegionSpace:
        """The region search's view of this planner (``regions.py``): full pricing (or the
        search's quick pricing), stopped by the evaluation budget or the plan's deadline."""
        def stop() -> bool:
            return self.evaluations >= budget or (
                self.deadline is not None and self.deadline.expired())
        units = self.forced()
        return RegionSpace(units, self.users, lambda r: self.price(r, not quick).cost_us,
                           lambda r: r in (self.memo if quick else self.final), stop,
                           [frozenset(self.reads(u)) for u in units])

    # -- assembly -----------------------------------------------------------------------------
    def order(self, regions: list[frozenset]) -> list[frozenset]:
        owner = {i: r for r, reg in enumerate(regions) for i in reg}
        preds = [{owner[self.index[id(s)]] for i in reg for s in self.ops[i].srcs
                  if id(s) in self.index} - {r} for r, reg in enumerate(regions)]
        done: list[int] = []
        while len(done) < len(regions):
            ready = [r for r in range(len(regions)) if r not in done and preds[r] <= set(done)]
            done.append(min(ready, key=lambda r: min(regions[r])))
        return [regions[r] for r in done]

    def build(self, regions: list[frozenset], why_not: dict,
              overrides: dict[frozenset, Pricing] | None = None
              ) -> tuple[MuGraph, list[Region]]:
        """The partition ``regions`` as a MuGraph and its per-region report: each region its
        best full pricing, or its pricing in ``overrides`` (another schedule of it)."""
        mg = MuGraph(f"{self.graph.name}_fused")
        for name, node in self.graph.inputs.items():
            mg.input(name, node.shape, node.dtype)
        report = []
        for reg in self.order(regions):
            p = (overrides or {}).get(reg) or self.price(reg, final=True)
            if p.schedule is None and len(reg) > 1:  # only a region the tiling rules forced
                raise MirageError(f"fusion: ops {sorted(reg)} of {self.graph.name!r} may not be "
                                  f"split into kernels (no tiling rule allows a boundary "
                                  f"between them) and have no schedule as one kernel: "
                                  f"{p.reason}")
            before = len(mg.kernels)
            if p.schedule is None:
                for i in sorted(reg):
                    self._predefined(mg, self.ops[i])
            else:
                add_kernel(mg, p.fragment, p.schedule, indexing=p.indexing,
                           registers=self.registers(p.origin or {}))
            names = [k.name for k in mg.kernels[before:]]
            outs = list(p.fragment.outputs)
            kind = "custom" if p.schedule is not None else "predefined"
            report.append(Region(tuple(sorted(reg)), kind, names, outs, p.cost_us, p.schedule,
                                 self._why(reg, p), why_not.get(reg, [])))
        for name, node in self.graph.outputs.items():
            mg.output(self.tensor[id(node)], name)
        return mg.validate(), report

    def _predefined(self, mg: MuGraph, n: Node) -> None:
        leaves: dict[str, Node] = {}
        srcs = tuple(s if s.op is Op.CONST else leaves.setdefault(
            self.tensor[id(s)], Node(Op.INPUT, (), self.tensor[id(s)], s.shape, s.dtype))
            for s in n.srcs)
        mg.kernels.append(PredefinedKernel(Node(n.op, srcs, n.arg, n.shape, n.dtype),
                                           self.tensor[id(n)], mg.kernel_name(None)))

    def _why(self, reg: frozenset, p: Pricing) -> str:
        if p.schedule is None:
            return ""
        alone = sum(self.price(frozenset({i})).cost_us for i in reg)
        kept = [self.ops[i] for i in sorted(reg)
                if not (id(self.ops[i]) in self.out_ids or self.users[i] - reg)
                and self.ops[i].op is not Op.RESHAPE]
        saved = sum(2 * numel(n.shape) * ITEMSIZE[n.dtype] for n in kept)
        on_chip = ", ".join(f"{self.tensor[id(n)]}{list(n.shape)}" for n in kept) or "nothing"
        return (f"{len(reg)} ops in one kernel ({p.tried} schedules priced): {p.cost_us:.2f} us "
                f"vs {alone:.2f} us one kernel per op; keeps {on_chip} on chip "
                f"(saves {saved / 1e6:.3f} MB of device-memory round trips)")


def _rows(frag: Graph, named: bool) -> tuple[tuple, dict[int, int]]:
    """Each node of ``frag`` in order as (op, argument, shape, dtype, operands' places), an
    input's argument (its name) and the source line only when ``named``; and each node's
    place by id."""
    pos: dict[int, int] = {}
    rows = []
    for n in frag.nodes():
        pos[id(n)] = len(pos)
        row = (n.op, n.arg if named or n.op is not Op.INPUT else None, n.shape, n.dtype,
               tuple(pos[id(x)] for x in n.srcs))
        rows.append(row + (n.loc,) if named else row)
    return tuple(rows), pos


def _shape_key(frag: Graph) -> tuple:
    """``frag`` up to the names of its tensors: ops, arguments, shapes, dtypes and wiring."""
    rows, pos = _rows(frag, False)
    return rows, tuple(pos[id(n)] for n in frag.outputs.values())


def _named_key(frag: Graph) -> tuple:
    """``frag`` up to its nodes' identity: each node's op, argument (an input's name),
    shape, dtype, operands' places and source line; its inputs' names, places (None for one
    no output reads), shapes and dtypes in order; its outputs' names and places."""
    rows, pos = _rows(frag, True)
    return (rows,
            tuple((k, pos.get(id(n)), n.shape, n.dtype) for k, n in frag.inputs.items()),
            tuple((k, pos[id(n)]) for k, n in frag.outputs.items()))


def _moved_bytes(frag: Graph) -> int:
    """Bytes of ``frag``'s inputs and of its distinct output values: what any kernel(s)
    computing it read and write at least."""
    return sum(tensor_bytes(n.shape, n.dtype) for n in frag.inputs.values()) + sum(
        tensor_bytes(n.shape, n.dtype) for n in {id(n): n for n in frag.outputs.values()}.values())


def _flight_bound(frag: Graph, s: Schedule, ix: Indexing) -> int:
    """At least the bytes one block of unsplit ``s``'s kernel keeps in flight
    (``gpucost.in_flight_bytes``): each input's tile as ``lower`` cuts it (its dims by their
    grid index's blocks, the first dim carrying the loop index by the loop range too, its
    fmap), those with an fmap times the deepest pipeline's stages less one, or every tile
    where none has an fmap."""
    grid, looped, whole, fmapped = dict(s.grid), 0, 0, False
    for node in frag.inputs.values():
        dims = ix.of(node)
        fmap = next((d for d, i in enumerate(dims) if s.loop is not None and i == s.loop), None)
        tile = tuple([size // (grid.get(i, 1) * (s.forloop if d == fmap else 1))
                      for d, (size, i) in enumerate(zip(node.shape, dims))])
        whole += tensor_bytes(tile, node.dtype)
        if fmap is not None:
            fmapped, looped = True, looped + tensor_bytes(tile, node.dtype)
    return (max(NUM_STAGES, DEEP_STAGES) - 1) * looped if fmapped else whole


def _input_key(frag: Graph) -> tuple:
    """``frag``'s inputs in their order: each one's place among the nodes (``_shape_key``'s;
    None for an input no output reads), shape and dtype."""
    pos = {id(n): i for i, n in enumerate(frag.nodes())}
    return tuple((pos.get(id(n)), n.shape, n.dtype) for n in frag.inputs.values())


def _why_none(ix: Indexing, scheds: list[Schedule], infeasible: str) -> str:
    loops = []
    for idx in ix.reduced:
        try:
            classify(ix, idx)
        except ScheduleError as exc:
            loops.append(f"no single-pass loop over {idx!r}: {exc}")
    if not scheds:
        return "no legal schedule; " + ("; ".join(loops) or "no grid fits the strategy")
    head = f"all {len(scheds)} legal schedules are infeasible ({infeasible})"
    return head + (f"; {loops[0]}" if loops else "")


DATASHEET = "datasheet pick"  # an alternative: the plan the profile's datasheet figures choose

def plan(graph: Graph, profile: GPUProfile | str | Path = "h100",
         strategy: Strategy | None = None, max_evaluations: int = 400,
         search_candidates: int = 24, cuts: frozenset | None = None,
         shared: dict | None = None, deadline=None, permit=None,
         refused: dict | None = None, alternatives: int = 0) -> FusionPlan:
    """Partition ``graph`` into fused custom kernels and predefined kernels (module docstring).

    ``cuts`` holds the (id(producer), id(consumer)) op edges that may be kernel
    boundaries (``boundaries.Boundaries.edges``: what rules/tiling.egg allows);
    every other edge stays inside one kernel. None allows a boundary anywhere.
    ``shared``: a dict kept across plans of one search (same profile, strategy and
    refusals);
    a fragment equal up to names to one priced before reuses its best schedule.
    ``permit``: the block level read from the e-graph (``egraph.kernels.SchedulePermit``):
    a schedule that loops over or splits an index is priced only when
    ``permit.allows(kern_choice(schedule, index), reductions)`` holds for the graph's nodes
    reducing that index in the region, and ``permit.online(exp)`` for every exp reading a
    running maximum over it (``schedule.running_exps``); None allows every schedule of
    ``strategy``; a kernel's values stay in registers where ``permit.in_registers`` allows
    (thread graphs). ``refused``: the compile check's refusals (tile or structure key ->
    reason), priced as infeasible. Past ``deadline`` (an ``ir.limits.Deadline``) no new
    fragment is priced (left unfused).
    ``alternatives``: with N > 0 the plan carries up to N other plans of ``graph``
    (``FusionPlan.alternatives``, each labelled, distinct, cheapest by the model first): other
    schedules of its regions, its matmuls as library kernels, the next-best partitions
    (``alternatives.variants``); besides them, where ``profile`` holds figures measured on a
    GPU, the plan its datasheet figures choose, where it differs (``DATASHEET``, priced with
    ``profile``: ``forms.KernelPlanner.plan_all`` verifies it second, so the tuner times the
    two models' picks where they disagree); the plan itself is the same as without them.
    Returns a ``FusionPlan`` whose ``mugraph`` computes the same outputs as
    ``graph`` (same input and output names) and whose ``regions`` say why each
    group of ops was or was not fused. The plan is not verified here.
    """
    start = time.perf_counter()
    prof = GPUProfile.load(profile)
    planner = Planner(graph, prof, strategy or DEFAULT_STRATEGY, search_candidates, cuts, shared,
                      permit, refused)
    planner.deadline = deadline
    regions, why_not = planner.search(max_evaluations)
    mg, report = planner.build(regions, why_not)
    cost = mugraph_cost(mg, prof).total_us
    base = mugraph_cost(from_graph(graph), prof).total_us
    found = FusionPlan(graph, mg, report, cost, base, planner.evaluations,
                       time.perf_counter() - start, planner.ops)
    if alternatives > 0:
        found.alternatives = [
            FusionPlan(graph, amg, arep, acost, base, planner.evaluations,
                       time.perf_counter() - start, planner.ops, label=what)
            for what, amg, arep, acost in variants(planner, found, regions, why_not,
                                                   max_evaluations, alternatives)]
        sheet = prof.datasheet()
        if sheet is not prof:
            other = plan(graph, sheet, strategy, max_evaluations, search_candidates, cuts,
                         None, deadline, permit, refused)
            keys = {plan_key(p.mugraph) for p in (found, *found.alternatives)}
            if plan_key(other.mugraph) not in keys:
                hedge = replace(other, cost_us=mugraph_cost(other.mugraph, prof).total_us,
                                baseline_us=base, label=DATASHEET)
                found.alternatives = sorted([*found.alternatives, hedge], key=lambda p: p.cost_us)
    return found
