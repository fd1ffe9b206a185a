"""``em.optimize``: the pipeline as a list of named passes.

build/check -> load rules (user rules checked for soundness) -> encode +
saturate (phases, guarded) -> extract (k best kernel-level Graphs, DAG-aware) ->
fusion (``level="mugraph"``, the default: each candidate and the input program
planned into a MuGraph of custom and predefined kernels, ``fusion.plan``, and
costed with ``gpucost``) -> verify (cheapest first; the first that passes
``em.verify`` against the input, tiled interpreter included, wins).

``level="kernel"`` stops after extraction: the program is a kernel-level Graph
costed one kernel per op (``cost/per_op.py``). Every returned program passed
``em.verify``; when none does (or the input is not Lax, so nothing can be
verified) the input itself is returned, one kernel per op.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from pathlib import Path

from ..cost.per_op import Hardware, graph_cost_us
from ..cost.profile import GPUProfile
from ..egraph.encode import graph_from_outputs
from ..egraph.extract import extract
from ..egraph.rulefiles import builtin_rules_dir, load_rules, rule_paths
from ..egraph.saturate import DEFAULT_PHASES, Limits, Saturator
from ..ir.check import check, check_lax
from ..ir.errors import BudgetError, LaxError, MirageError, TimeLimitError
from ..ir.limits import Deadline, check_memory
from ..verifier.runner import THREADS, footprint
from ..verifier.verify import VerifyResult, verify
from .build import Builder
from .result import OptimizeResult

LEVELS = ("mugraph", "kernel")

DEFAULT_SPLITS = (4, 16, 64)  # Mirage's loop ranges: candidate inner factors of split-K


def check_limits(**limits) -> None:
    """Every limit a positive number (ints where counted); a MirageError naming the first bad."""
    for name, value in limits.items():
        counted = name != "time_limit_s"
        ok = isinstance(value, int | float) and not isinstance(value, bool) and (
            isinstance(value, int) or not counted) and 0 < value < float("inf")
        if not ok:
            kind = "a positive integer" if counted else "a positive finite number of seconds"
            raise MirageError(f"optimize: {name} must be {kind}, got {value!r}")


def candidate_splits(graph, factors) -> list[tuple[int, int, int]]:
    """The split-K candidates ``(n, n // f, f)``: every dim size n of ``graph`` cut into
    n // f > 1 parts of f > 1 (f from ``factors``, ``DEFAULT_SPLITS`` by default)."""
    dims = {d for n in graph.nodes() for d in n.shape}
    return sorted({(n, n // f, f) for n in dims for f in factors if n % f == 0 and n // f > 1
                   and f > 1})


def optimize(graph, target: str | Path = "h100", rules=("rules",), guards: bool = True,
             time_limit_s: float = 60.0, node_limit: int = 200_000, iter_limit: int = 12,
             k: int = 4, trials: int = 3, seed: int = 0, split_factors=DEFAULT_SPLITS,
             progress: Callable[[str], None] | None = None, level: str = "mugraph",
             strategy=None, cache=True, max_bound: float = 1e-9,
             allow_unchecked_rules: bool = False,
             compile_check: bool | None = None, launch: str = "plain") -> OptimizeResult:
    """Superoptimize ``graph`` for ``target``; returns the best verified program.

    ``rules`` lists rule files and folders ("rules" is the built-in set); user
    files are checked for soundness first and an unsound rule is refused with
    a ``RuleError``, and so is a rule the check cannot instantiate or decide,
    unless ``allow_unchecked_rules`` is True. Saturation stops at ``node_limit`` tensor e-nodes,
    ``iter_limit`` iterations per phase. ``time_limit_s`` bounds the whole call
    (wall clock, within about 10%): rule checks get up to 30% of it, saturation
    runs until 50%, extraction until 70%, fusion planning starts no plan after
    85%, and verification stops at 100%; a pass that reaches its share stops with
    what it has, and when no candidate verified in time the input is returned.
    A program too large to verify within the memory budget (``ir/limits.py``)
    is refused at once with a ``BudgetError``. ``level``
    is "mugraph" (the default: ``res.program`` is a ``MuGraph`` of fused custom
    kernels, costed by ``gpucost``; ``strategy`` is the ``strategy.Strategy``
    for the candidate schedules, ``fusion.DEFAULT_STRATEGY`` if None) or
    "kernel" (a kernel-level ``Graph``, costed one kernel per op). Every
    returned program other than the input itself passed ``em.verify`` against
    ``graph`` with a false-positive bound of at most ``max_bound`` (at least
    ``trials`` trials, more until the bound holds); an inconclusive candidate is
    never returned.

    ``compile_check``: before a MuGraph is verified, build its Triton kernels for the target
    (``codegen.tune``: sm_90a for h100/h200, sm_80 for a100; no GPU needed); a kernel that
    spills is rebuilt at other warp counts, and one that cannot build cleanly sends its
    candidate back to the planner with that schedule refused (``res.stats["compiled"]``).
    None (the default): on for a built-in target with Triton's NVIDIA compiler installed,
    unless ``$EQSAT_MIRAGE_COMPILE_CHECK`` is "0".

    ``launch``: how the program will be launched, which sets the price of every kernel
    launch: "plain" (from Python, the default) or "graph" (replayed from a CUDA graph, as
    ``res.compile(cuda_graph=True)`` does: more, smaller kernels can pay off).

    ``cache`` is True (the default results cache, see ``cache.py``), a path,
    a ``cache.ResultCache``, or False/None (no cache); ``res.stats["cache"]``
    says "hit", "miss" or "off". A hit returns the stored result at once.
    """
    options = dict(locals())  # every keyword that can change the result: the cache key
    del options["graph"], options["progress"], options["cache"]
    if compile_check is None:
        compile_check = options["compile_check"] = _compile_check_default(target)
    if level not in LEVELS:
        raise MirageError(f"optimize: level must be one of {', '.join(LEVELS)}, got {level!r}")
    check_limits(time_limit_s=time_limit_s, node_limit=node_limit, iter_limit=iter_limit, k=k,
                  trials=trials)
    if cache is not None and cache is not False:
        from .cache import cached_optimize, open_cache

        store = open_cache(cache)  # None when $EQSAT_MIRAGE_CACHE is "off"
        if store is not None:
            return cached_optimize(graph, store, progress, options, optimize)
    t0 = time.perf_counter()
    deadline = Deadline(time_limit_s, t0)
    check(graph)
    check_memory(footprint(graph), 16 * THREADS, f"verifying {graph.name!r}")
    _check_splits(split_factors)
    prof = GPUProfile.load(target).for_launch(launch)  # read once; both cost models use it
    if compile_check:
        from ..codegen.tune import can_tune

        if not can_tune(prof.name):
            raise MirageError(f"optimize: compile_check needs a built-in GPU target (h100, h200, "
                              f"a100) and Triton's NVIDIA compiler; target {prof.name!r} "
                              "cannot be built here (compile_check=False skips the check)")
    hw = Hardware.load(prof)
    user = [p for p in rule_paths(rules) if p.parent != builtin_rules_dir()]
    if user:
        from ..egraph.check_rules import assert_sound

        assert_sound([str(p) for p in user], strict=not allow_unchecked_rules,
                     time_limit_s=deadline.part(0.3))
    rulesets, rule_list = load_rules(rules)
    stats: dict = {"target": hw.name, "target_spec": str(target), "guards": guards,
                   "rules": len(rule_list), "level": level, "cache": "off"}
    try:
        check_lax(graph)
        lax = True
    except LaxError:
        lax = False
    try:
        cands, data, ctors = _search(graph, rulesets, rule_list, level, guards, hw, stats,
                                     (node_limit, iter_limit, k, split_factors), deadline,
                                     progress)
    except TimeLimitError as exc:  # nothing to extract in time: the input is the answer
        stats["note"] = f"time limit: {exc}; input returned"
        cands, data, ctors = [], None, None
    stats["candidates"] = len(cands)
    if level == "kernel":
        res = _kernel_level(graph, cands, hw, lax, (trials, seed, max_bound, {}, deadline),
                            progress, stats)
    else:
        from ..egraph.boundaries import Boundaries

        res = _mugraph_level(graph, cands, Boundaries(data, ctors) if data else None, prof,
                             (strategy, compile_check), lax,
                             (trials, seed, max_bound, {}, deadline), progress, stats)
    stats["phase_seconds"] = {"saturate": stats.get("saturate_seconds", 0.0),
                              "extract": stats.get("extract_seconds", 0.0),
                              "fusion": stats.get("fusion_seconds", 0.0),
                              "verify": stats.get("verify_seconds", 0.0)}
    stats["seconds"] = time.perf_counter() - t0
    compiled = stats.get("compiled") or {}
    # a search the time limit cut short is not the search's answer: the cache keeps none
    stats["time_limited"] = bool(deadline.expired() or stats.get("fusion_skipped")
                                 or compiled.get("skipped") or "time limit" in
                                 stats.get("note", ""))
    if not lax:
        stats["note"] = "not a Lax program: the verifier cannot check rewrites, input returned"
    return res


def _search(graph, rulesets, rule_list, level, guards, hw, stats, counts, deadline, progress):
    """The saturate and extract passes: the candidates, the serialized e-graph, its ctors."""
    node_limit, iter_limit, k, split_factors = counts
    t1 = time.perf_counter()
    sat = Saturator(graph, rulesets, rule_list, guards=guards,
                    splits=candidate_splits(graph, split_factors), deadline=deadline.part(0.5))
    limits = Limits(node_limit=node_limit, iter_limit=iter_limit,
                    time_limit_s=deadline.seconds)
    phases = [(name, tuple(r for r in rs if r in rulesets)) for name, rs in DEFAULT_PHASES
              if level == "mugraph" or name != "tiling"]  # kernel level: no boundaries
    extra = tuple(r for r in rulesets if all(r not in rs for _, rs in DEFAULT_PHASES))
    if extra:
        phases.append(("user", extra))
    phases = [(name, rs) for name, rs in phases if rs]
    spent = (time.perf_counter() - deadline.start) / deadline.seconds
    for i, (name, rs) in enumerate(phases):  # each phase gets an equal share of the 50%
        share = spent + (0.5 - spent) * (i + 1) / len(phases)
        sat.run_phase(name, rs, limits, progress, deadline.part(share))
    stats["saturate_seconds"] = time.perf_counter() - t1
    stats["phases"] = [vars(p) for p in sat.stats]
    stats["enodes"] = sat.size()
    data = sat.serialize()
    cands, xstats = extract(data, sat.root_classes(data), graph, sat.ctors, hw, k=k,
                            encoder=sat.encoder if level == "mugraph" else None,
                            deadline=deadline.part(0.7))
    stats.update(xstats)
    return cands, data, sat.ctors


def _compile_check_default(target) -> bool:
    """Whether optimize builds the chosen kernels for ``target`` when not told (see there)."""
    import os

    from ..codegen.tune import can_tune

    return os.environ.get("EQSAT_MIRAGE_COMPILE_CHECK", "1") != "0" and can_tune(str(target))


def _check_splits(split_factors) -> None:
    """``split_factors``: a sequence of integers >= 2 (a MirageError naming the bad one)."""
    if isinstance(split_factors, str) or not hasattr(split_factors, "__iter__"):
        raise MirageError(f"optimize: split_factors must be a sequence of integers >= 2, got "
                          f"{split_factors!r}")
    for f in split_factors:
        if not isinstance(f, int) or isinstance(f, bool) or f < 2:
            raise MirageError(f"optimize: split_factors must hold integers >= 2, got {f!r} in "
                              f"{tuple(split_factors)!r}")


def _check_input(graph, program, lax: bool, vopts):
    """The input returned as it is, checked against itself (one trial) when time is left;
    None when it is not Lax or the time limit has passed (``stats["note"]`` says which)."""
    if not lax or vopts[4].expired():
        return None
    res = _verify(graph, program, vopts, trials=1)
    return res if res.equivalent else None  # cut short by the deadline part way through


def _verify(graph, program, vopts, trials: int | None = None):
    """``em.verify`` with optimize's trials (at least), seed, ``max_bound`` and deadline."""
    t, seed, max_bound, memo, deadline = vopts  # memo: the input program's outputs, once
    try:
        return verify(graph, program, trials=t if trials is None else trials, seed=seed,
                      max_bound=max_bound, memo=memo, float_first=True, time_limit_s=deadline)
    except BudgetError as exc:  # this candidate is too large to check: the next one may fit
        return VerifyResult(False, 1.0, reason=f"not checked: {exc}", inconclusive=True,
                            max_bound=max_bound)


def _kernel_level(graph, cands, hw, lax, vopts, progress, stats) -> OptimizeResult:
    """The cheapest extracted Graph (one kernel per op) that verifies."""
    baseline = graph_cost_us(graph, hw)
    chosen, result = None, None
    tried = 0
    t = time.perf_counter()
    for cand in cands:
        if cand.cost_us > baseline:
            continue
        tried += 1
        if not lax:
            break
        if vopts[4].expired():
            stats["note"] = "time limit reached before a candidate verified; input returned"
            break
        res = _verify(graph, cand.program, vopts)
        if not res.equivalent and vopts[4].expired():
            stats["note"] = f"time limit reached while verifying ({res.reason}); input returned"
        if res.equivalent:
            chosen, result = cand, res
            break
        if progress:
            progress(f"candidate rejected by the verifier: {res.reason}")
    stats["candidates_tried"] = tried
    if chosen is None:  # nothing cheaper verified: the input program is the answer
        program = graph_from_outputs(graph, graph.outputs, f"{graph.name}_opt")
        cost = baseline
        result = _check_input(graph, program, lax, vopts)
        if result is None and lax and "note" not in stats:
            stats["note"] = "time limit reached before a candidate verified; input returned"
    else:
        program, cost = chosen.program, chosen.cost_us
    stats["verify_seconds"] = time.perf_counter() - t
    return OptimizeResult(program, cost, baseline, result, stats, cands, graph)


def _canonical(graph) -> int:
    """A hash of ``graph`` up to the order of add/mul operands (duplicates are planned once)."""
    from ..ir.node import Op

    memo: dict[int, int] = {}
    for n in graph.nodes():
        kids = [memo[id(s)] for s in n.srcs]
        if n.op in (Op.ADD, Op.MUL):
            kids.sort()
        memo[id(n)] = hash((n.op, n.arg, n.shape, n.dtype, tuple(kids)))
    return hash(tuple(sorted((name, memo[id(n)]) for name, n in graph.outputs.items())))


def _plan_key(mg) -> str:
    """The MuGraph's listing without its name and fragment names (duplicates verify once)."""
    lines = str(mg).splitlines()[1:]
    return "\n".join(line for line in lines if not line.lstrip().startswith("source:"))


def _mugraph_level(graph, cands, bounds, prof, how_to, lax, vopts, progress,
                   stats) -> OptimizeResult:
    """Plan every candidate and the input into MuGraphs; the cheapest that builds cleanly for
    the target (``how_to``: the strategy, and whether to compile-check) and verifies wins."""
    from ..cost.gpucost import mugraph_cost, roofline_us
    from ..fusion.planner import plan
    from ..mugraph.program import from_graph

    strategy, check = how_to
    base_mg = from_graph(graph)
    baseline = mugraph_cost(base_mg, prof).total_us
    t = time.perf_counter()
    plans, seen, errors, distinct, priced = [], set(), [], set(), {}
    todo = [(c.how, c.program, bounds.edges(c.program, c.keys)) for c in cands]
    late = vopts[4].part(0.85)  # fusion starts no new plan after this
    if not any(c.how == "input" for c in cands):  # its terms were not found: any boundary
        todo.append(("input (any boundary)", graph, None))
    allowed = {}
    for i, (how, g, cuts) in enumerate(todo):
        canon = _canonical(g)
        if canon in distinct:
            continue
        if plans and late.expired():  # planned in time: the rest are dropped (and counted)
            stats["fusion_skipped"] = stats.get("fusion_skipped", 0) + 1
            continue
        distinct.add(canon)
        edges = {(id(s), id(n)) for n in g.nodes() for s in n.srcs if n.srcs and s.srcs}
        allowed[i] = f"{len(edges) if cuts is None else len(cuts & edges)}/{len(edges)}"
        try:
            p = plan(g, prof, strategy, cuts=cuts, shared=priced, deadline=late)
            if late.expired():  # the planner may have left fragments unfused
                stats["fusion_skipped"] = stats.get("fusion_skipped", 0) + 1
        except (MirageError, ValueError, KeyError) as exc:  # recorded in stats, skipped
            errors.append(f"{how}: {exc}")
            continue
        key = _plan_key(p.mugraph)
        if key not in seen:
            seen.add(key)
            plans.append((p.cost_us, i, how, p))
    plans.sort(key=lambda x: (x[0], x[1]))
    stats["fusion_seconds"] = time.perf_counter() - t
    if errors:
        stats["fusion_errors"] = errors
    t = time.perf_counter()
    chosen, result, tried, summary = None, None, 0, []
    builder = Builder(prof, strategy, todo, vopts[4].part(0.7), progress) if check else None
    while plans:
        cost, i, how, p = plans.pop(0)
        entry = {"how": how, "cost_us": cost, "kernels": len(p.mugraph.kernels), "verified": None,
                 "boundaries": allowed[i]}  # op edges where rules/tiling.egg allows a cut
        summary.append(entry)
        if chosen is not None or not lax:
            continue
        if vopts[4].expired():
            stats["note"] = "time limit reached before a candidate verified; input returned"
            continue
        if builder is not None and not builder.clean(p, i, how, entry, plans):
            continue
        if plans and p.cost_us > max(cost, plans[0][0]):  # retuned warps cost more than the
            summary.pop()                                # next plan: that one goes first
            bisect.insort(plans, (p.cost_us, i, how, p), key=lambda x: (x[0], x[1]))
            continue
        tried += 1
        res = _verify(graph, p.mugraph, vopts)
        entry["verified"] = res.equivalent
        if not res.equivalent and vopts[4].expired():
            stats["note"] = f"time limit reached while verifying ({res.reason}); input returned"
        if res.equivalent:
            chosen, result = p, res
        elif progress:
            progress(f"MuGraph from {how} rejected by the verifier: {res.reason}")
    if builder is not None:
        stats["compiled"] = builder.report()
    stats["candidates_tried"] = tried
    stats["plans"] = summary
    if chosen is None:  # nothing verified (or not Lax): the input, one kernel per op
        program, cost = base_mg, baseline
        result = _check_input(graph, program, lax, vopts)
        if result is None and lax and "note" not in stats:
            stats["note"] = "time limit reached before a candidate verified; input returned"
        stats["regions"] = []
    else:
        program, cost = chosen.mugraph, mugraph_cost(chosen.mugraph, prof).total_us
        program.name = f"{graph.name}_opt"
        stats["regions"] = [str(r) for r in chosen.regions]
    stats["verify_seconds"] = time.perf_counter() - t
    stats["kernels"] = len(program.kernels)
    stats["custom_kernels"] = sum(kk.kind == "custom" for kk in program.kernels)
    return OptimizeResult(program, cost, baseline, result, stats, cands, graph,
                          roofline_us(graph, prof), chosen)
