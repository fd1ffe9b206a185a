"""Brute force against the fusion planner: the optimality yardstick of issue 33.

    python bench/brute_force.py [--random N] [--window K] [--limit S] [--no-cache] [--json PATH]

For a program of at most ``MAX_OPS`` ops, every partition of its ops into kernels whose
kernel graph is acyclic is priced, each multi-op kernel with every schedule the planner's
final pricing offers (``full_strategies``: ``fusion.DEFAULT_STRATEGY``'s candidate grids,
loops and FlashDecoding splits, plus up to 96 grids of one block per SM or more), a single
op as its library kernel, all by the one GPU cost model (``gpucost.kernel_cost``, target
h100). The cheapest partition is compared with ``fusion.plan`` on the SAME program (the
same algebraic form, no tiling-rule cuts): like with like, so the brute force is a lower
bound by construction and any gap is the greedy merging's. Both sides are summed per
kernel region, as the planner prices its search (``FusionPlan.regions``); the planner's
built MuGraph's ``mugraph_cost`` is reported beside it (thread fusion can only lower it).

Not compared: the algebraic choice (``em.optimize`` plans k extracted forms and keeps the
cheapest), the compile check's refusals and retuned warps. Programs: the benchmark inputs
and rewritten forms of ``bench/programs.py`` with at most ``MAX_OPS`` ops, windows of
``MAX_OPS`` consecutive ops (topological order) of the larger ones, and random programs
from ``eqsat_mirage.testing.programs`` (drawn deterministically, at dims up to 6 and 64).

Bounded and cached: a program over ``MAX_OPS`` ops is skipped (counted), each program's
enumeration stops at ``--limit`` seconds (then flagged incomplete and left out of the
figures), region prices are memoized by fragment shape across programs, and finished
comparisons are kept in ``brute_force.json`` beside the results cache
(``pipeline.cache.default_dir()``), keyed by the program, the package's source digest,
the target profile and the strategy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eqsat_mirage.cost.gpucost import kernel_cost  # noqa: E402
from eqsat_mirage.cost.profile import GPUProfile  # noqa: E402
from eqsat_mirage.frontend.graph import Graph  # noqa: E402
from eqsat_mirage.fusion.indexing import ScheduleError, index_fragment  # noqa: E402
from eqsat_mirage.fusion.lower import add_kernel  # noqa: E402
from eqsat_mirage.fusion.planner import DEFAULT_STRATEGY, plan  # noqa: E402
from eqsat_mirage.fusion.strategy import Strategy, candidate_schedules  # noqa: E402
from eqsat_mirage.ir.errors import MirageError  # noqa: E402
from eqsat_mirage.ir.node import Node, Op  # noqa: E402
from eqsat_mirage.mugraph.kernels import PredefinedKernel  # noqa: E402
from eqsat_mirage.mugraph.program import MuGraph  # noqa: E402

MAX_OPS = 6  # Bell(6) = 203 partitions, at most 63 regions to price per program
TIME_LIMIT_S = 120.0  # per program: past it the enumeration stops, flagged incomplete
EQUAL_RTOL = 1e-6  # planner / brute force within this ratio counts as equal


class BruteForceError(MirageError):
    """A program the brute force cannot enumerate (too many ops)."""


# -- one program's ops and fragments, formed as the planner forms them -----------------------


class Space:
    """The ops of ``graph`` (inputs and constants left out), their users and tensor names;
    ``fragment(region)`` is the region as one kernel's program (``fusion.plan`` forms the
    same: outside values become inputs named after their tensors, values used outside or
    returned become outputs)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.ops = [n for n in graph.nodes() if n.op not in (Op.INPUT, Op.CONST)]
        self.index = {id(n): i for i, n in enumerate(self.ops)}
        self.users: list[set[int]] = [set() for _ in self.ops]
        for i, n in enumerate(self.ops):
            for s in n.srcs:
                if id(s) in self.index:
                    self.users[self.index[id(s)]].add(i)
        self.out_ids = {id(n) for n in graph.outputs.values()}
        names = {id(n): name for name, n in graph.inputs.items()}
        for name, n in graph.outputs.items():
            names.setdefault(id(n), name)
        used = set(graph.inputs) | set(graph.outputs)
        for i, n in enumerate(self.ops):
            if id(n) not in names:
                name = f"t{i}"
                while name in used:
                    name += "_"
                used.add(name)
                names[id(n)] = name
        self.tensor = names

    def fragment(self, region: frozenset[int], name: str | None = None) -> Graph:
        """The ops of ``region`` as a Graph reading device tensors (see the class)."""
        frag = Graph(name or f"{self.graph.name}.r{min(region)}")
        new: dict[int, Node] = {}
        for i in sorted(region):
            n = self.ops[i]
            srcs = []
            for s in n.srcs:
                if s.op is Op.CONST or self.index.get(id(s)) in region:
                    srcs.append(s if s.op is Op.CONST else new[id(s)])
                    continue
                tname = self.tensor[id(s)]
                if tname not in frag.inputs:
                    frag.inputs[tname] = Node(Op.INPUT, (), tname, s.shape, s.dtype)
                srcs.append(frag.inputs[tname])
            new[id(n)] = Node(n.op, tuple(srcs), n.arg, n.shape, n.dtype, n.loc)
        for i in sorted(region):
            n = self.ops[i]
            if id(n) in self.out_ids or self.users[i] - region:
                frag.outputs[self.tensor[id(n)]] = new[id(n)]
        return frag

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


def full_strategies(prof: GPUProfile, strategy: Strategy = DEFAULT_STRATEGY
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

    def __init__(self, target: str = "h100", strategy: Strategy = DEFAULT_STRATEGY) -> None:
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


# -- the fixed set of programs ---------------------------------------------------------------


def windows(label: str, graph: Graph, size: int = MAX_OPS) -> list[tuple[str, Graph]]:
    """Every run of ``size`` consecutive ops (in ``graph.nodes()`` order) of ``graph`` as a
    program of its own (labels ``label[i:j]``); ``graph`` itself when it is no larger."""
    space = Space(graph)
    n = len(space.ops)
    if n <= size:
        return [(label, graph)]
    return [(f"{label}[{i}:{i + size}]",
             space.fragment(frozenset(range(i, i + size)), f"{graph.name}_{i}"))
            for i in range(n - size + 1)]


def benchmark_programs(size: int = MAX_OPS) -> list[tuple[str, Graph]]:
    """The benchmark inputs, rewritten forms and safe forms of ``bench/programs.py`` at
    batches 1 and 8 (lora and gatedmlp once: their shapes do not depend on the batch), whole
    when at most ``size`` ops, else as ``windows``."""
    from bench import programs as bp

    out: list[tuple[str, Graph]] = []
    for name in [*bp.BENCHMARKS, *bp.SAFE]:
        for batch in bp.BATCHES:
            if batch > 1 and name in ("lora", "gatedmlp"):
                continue
            out += windows(f"{name} b={batch}", bp.program(name, batch), size)
            if name in bp.REWRITTEN:
                out += windows(f"{name} b={batch} rewritten", bp.rewritten(name, batch), size)
    return out


def random_programs(n: int, max_dim: int, max_ops: int = MAX_OPS) -> list[Graph]:
    """``n`` distinct programs of 2 to ``max_ops`` ops from ``testing.programs``, the same on
    every run (hypothesis, derandomized, no example database)."""
    from hypothesis import HealthCheck, Phase, given, settings

    from eqsat_mirage.testing import programs

    found: dict[tuple, Graph] = {}

    @settings(max_examples=10 * n, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(programs(max_ops=max_ops, max_dim=max_dim))
    def draw(g: Graph) -> None:
        ops = len(Space(g).ops)
        if len(found) < n and 2 <= ops <= max_ops:
            found.setdefault(shape_key(g), g)

    draw()
    return list(found.values())


def fixed_set(random_n: int = 24) -> list[tuple[str, Graph]]:
    """The programs the figures cover: ``benchmark_programs`` and ``random_n`` random
    programs at dims up to 6 and ``random_n`` at dims up to 64, duplicates (equal up to
    names) dropped."""
    progs = benchmark_programs()
    progs += [(f"random d<=6 #{i}", g) for i, g in enumerate(random_programs(random_n, 6))]
    progs += [(f"random d<=64 #{i}", g) for i, g in enumerate(random_programs(random_n, 64))]
    seen: set[tuple] = set()
    out = []
    for label, g in progs:
        key = shape_key(g)
        if key not in seen:
            seen.add(key)
            out.append((label, g))
    return out


# -- running, caching, reporting -------------------------------------------------------------


def cache_path() -> Path:
    """``brute_force.json`` in the results cache's folder."""
    from eqsat_mirage.pipeline.cache import default_dir

    return default_dir() / "brute_force.json"


def cache_key(graph: Graph, pricer: Pricer) -> str:
    """The sha256 of the program, the package's sources, the target and the strategy."""
    from eqsat_mirage.pipeline.cache import code_digest, program_text, target_digest

    text = json.dumps([program_text(graph), code_digest(), target_digest(pricer.prof.name),
                       repr(pricer.strategy), MAX_OPS])
    return hashlib.sha256(text.encode()).hexdigest()


def run(progs: list[tuple[str, Graph]], pricer: Pricer | None = None,
        time_limit_s: float = TIME_LIMIT_S, cache: Path | None = None,
        progress=None) -> tuple[list[Comparison], list[str]]:
    """Compare every program of ``progs``; returns the comparisons and the labels skipped
    (over ``MAX_OPS`` ops). ``cache``: a JSON file of finished comparisons (read and
    updated; incomplete ones are not kept)."""
    pricer = pricer or Pricer()
    stored = json.loads(cache.read_text()) if cache is not None and cache.is_file() else {}
    out, skipped = [], []
    for label, g in progs:
        if len(Space(g).ops) > MAX_OPS:
            skipped.append(label)
            continue
        key = cache_key(g, pricer) if cache is not None else None
        if key in stored:
            data = dict(stored[key], label=label)
            c = Comparison(**{**data, "brute": BruteResult(**data["brute"])}, cached=True)
        else:
            c = compare(label, g, pricer, time_limit_s)
            if key is not None and c.brute.complete:
                stored[key] = {k: v for k, v in asdict(c).items() if k != "cached"}
        out.append(c)
        if progress:
            progress(row(c))
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(stored, indent=0))
    return out, skipped


@dataclass
class Summary:
    """The figures of a run: how many programs, equal, the worst ratio, where greedy lost."""

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


def row(c: Comparison) -> str:
    """One Markdown table row."""
    return (f"| {c.label} | {c.ops} | {c.planner_us:.2f} | {len(c.planner_regions)} | "
            f"{c.brute.cost_us:.2f} | {len(c.brute.regions)} | {c.ratio:.3f} | "
            f"{c.brute.acyclic}/{c.brute.partitions} | {c.brute.seconds:.1f}"
            f"{'' if c.brute.complete else ' (incomplete)'} |")


HEADER = ("| program | ops | planner us | kernels | brute force us | kernels | ratio | "
          "acyclic partitions | s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")


def report(comps: list[Comparison], skipped: list[str]) -> str:
    """The summary line and the programs where greedy loses, as Markdown."""
    s = summarize(comps, skipped)
    lines = [str(s), "", HEADER] + [row(c) for c in s.losers]
    for c in s.losers:
        lines.append(f"- {c.label}: planner kernels {c.planner_regions}, brute force "
                     f"{c.brute.regions}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random", type=int, default=24,
                    help="random programs per dimension bound (6 and 64)")
    ap.add_argument("--limit", type=float, default=TIME_LIMIT_S,
                    help="seconds per program's enumeration")
    ap.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    ap.add_argument("--json", type=Path, help="write every comparison here")
    ap.add_argument("--all", action="store_true", help="print every program's row")
    args = ap.parse_args(argv)
    t = time.perf_counter()
    progs = fixed_set(args.random)
    comps, skipped = run(progs, Pricer(), args.limit, None if args.no_cache else cache_path(),
                         progress=(lambda line: print(line, file=sys.stderr)))
    if args.all:
        print(HEADER)
        print("\n".join(row(c) for c in comps))
        print()
    print(report(comps, skipped))
    print(f"\n{len(progs)} programs in {time.perf_counter() - t:.1f} s")
    if args.json:
        args.json.write_text(json.dumps([{**asdict(c), "ratio": c.ratio} for c in comps],
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
