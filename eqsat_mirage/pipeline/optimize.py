"""``em.optimize``: the pipeline as a list of named passes.

build/check -> load rules (user rules checked for soundness) -> encode +
saturate (phases, guarded) -> extract (k best kernel-level Graphs, DAG-aware) ->
fusion (``level="mugraph"``, the default: each candidate and the input program
planned into a MuGraph of custom and predefined kernels by ``egraph.kernels`` under the
Kern nodes and facts of the block phase, calling ``fusion.plan``, and
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
from ..egraph.rulefiles import builtin_rules_dir, load_rule_files, rule_paths
from ..egraph.saturate import DEFAULT_PHASES, KERNEL_PHASES, PHASE_WEIGHT, Limits, Saturator
from ..ir.check import check, check_lax
from ..ir.errors import BudgetError, LaxError, MirageError, TimeLimitError, unexpected
from ..ir.limits import AUTO, check_bytes
from ..verifier.memory import check_parts
from ..verifier.verify import VerifyResult, verify
from .build import Builder
from .options import (
    DEFAULT_SPLITS,
    DEFAULTS,
    LEVELS,
    Budget,
    SearchOptions,
    VerifyPlan,
    progress_fn,
)
from .records import (
    ExtractionRecord,
    PlanningRecord,
    SaturationRecord,
    SearchRecord,
    VerificationRecord,
)
from .result import OptimizeResult

__all__ = ["DEFAULT_SPLITS", "LEVELS", "OptimizeResult", "optimize", "search"]


def candidate_splits(graph, factors) -> list[tuple[int, int, int]]:
    """The ``(split n i j)`` facts for ``graph``: n = i * j for each dim n of its tensors and
    each factor j of ``factors`` (``split_factors``) with i, j >= 2. No built-in rule reads
    them (split-K is rules/block.egg's SplitOver rules); they are there for user rules."""
    dims = {d for n in graph.nodes() for d in n.shape}
    return sorted({(n, n // f, f) for n in dims for f in factors if n % f == 0 and n // f > 1
                   and f > 1})


def optimize(graph, target: str | Path = DEFAULTS.target, rules=DEFAULTS.rules,
             guards: bool = DEFAULTS.guards, time_limit_s: float | str = AUTO,
             node_limit: int = DEFAULTS.node_limit, iter_limit: int = DEFAULTS.iter_limit,
             k: int = DEFAULTS.k, trials: int = DEFAULTS.trials, seed: int = DEFAULTS.seed,
             split_factors=DEFAULTS.split_factors,
             progress: Callable[[str], None] | bool | None = None,
             level: str = DEFAULTS.level,
             strategy=DEFAULTS.strategy, cache=True, max_bound: float = DEFAULTS.max_bound,
             allow_unchecked_rules: bool = DEFAULTS.allow_unchecked_rules,
             compile_check: bool | None = DEFAULTS.compile_check,
             launch: str = DEFAULTS.launch,
             allow_float_unsafe_rules: bool = DEFAULTS.allow_float_unsafe_rules
             ) -> OptimizeResult:
    """Superoptimize ``graph`` for ``target``; returns the best verified program.

    ``rules`` lists rule files and folders ("rules" is the built-in set); user
    files are checked for soundness first and an unsound rule is refused with
    a ``RuleError``, and so is a rule the check cannot instantiate or decide,
    unless ``allow_unchecked_rules`` is True; a user rule sound over the reals but unsafe
    in floating point (it drops a softmax's max, narrows a dtype: ``check_rules``'s "sound,
    float-unsafe") is refused too, unless ``allow_float_unsafe_rules`` is True. Saturation
    stops at ``node_limit`` tensor e-nodes, ``iter_limit`` iterations per phase.
    ``time_limit_s`` bounds the whole call
    (wall clock, within about 10%); "auto" (the default) is 60 s for a program of toy size
    and more for a large one (``limits.auto_time_limit``: 130 float64 evaluations of the
    program, its matmuls and its inputs' elements, at this machine's measured matmul rate
    on top, at most 600 s; the value used is ``res.stats["time_limit_s"]``): rule checks
    get up to 30% of it, saturation runs until 50%, extraction until 70%, fusion planning
    starts no plan after 85%, and verification stops at 100%; a pass that reaches its
    share stops with what it has, and when no candidate verified in time the input is returned.
    A program too large to verify within the memory budget (``ir/limits.py``)
    is refused at once with a ``BudgetError``. ``level``
    is "mugraph" (the default: ``res.program`` is a ``MuGraph`` of fused custom
    kernels, costed by ``gpucost``; ``strategy`` is the ``strategy.Strategy``
    for the candidate schedules, ``fusion.DEFAULT_STRATEGY`` if None; its loop ranges,
    block range and split switch are replaced by what the block rules allow) or
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

    ``progress``: True prints a line to stderr at each step of the search (phases,
    rejected candidates), a callable receives each line, None or False is quiet.

    ``launch``: how the program will be launched, which sets the price of every kernel
    launch: "plain" (from Python, the default) or "graph" (replayed from a CUDA graph, as
    ``res.compile(cuda_graph=True)`` does: more, smaller kernels can pay off).

    ``cache`` is True (the default results cache, see ``cache.py``), a path,
    a ``cache.ResultCache``, or False/None (no cache); ``res.stats["cache"]``
    says "hit", "miss" or "off". A hit returns the stored result at once.
    """
    options = SearchOptions(target=target, rules=rules, guards=guards,
                            time_limit_s=time_limit_s, node_limit=node_limit,
                            iter_limit=iter_limit, k=k, trials=trials, seed=seed,
                            split_factors=split_factors, level=level, strategy=strategy,
                            max_bound=max_bound, allow_unchecked_rules=allow_unchecked_rules,
                            compile_check=compile_check, launch=launch,
                            allow_float_unsafe_rules=allow_float_unsafe_rules)
    return search(graph, options, progress, cache)


def search(graph, options: SearchOptions, progress: Callable[[str], None] | None = None,
           cache=True) -> OptimizeResult:
    """``optimize`` with its options as one checked ``SearchOptions``: one program searched
    as one piece, through the results cache ``cache`` (see ``optimize``)."""
    options = options.resolved()
    progress = progress_fn(progress)
    if cache is not None and cache is not False:
        from .cache import cached_optimize, open_cache

        store = open_cache(cache)  # None when $EQSAT_MIRAGE_CACHE is "off"
        if store is not None:
            return cached_optimize(graph, store, progress, options, search)
    return _run(graph, options, progress)


def _run(graph, options: SearchOptions, progress) -> OptimizeResult:
    """One uncached search; its stats say the time limit it ran under."""
    limit = options.limit_for(graph)
    res = _passes(graph, options, progress, limit)
    res.stats["time_limit_s"] = limit
    res.stats["time_limit_auto"] = options.time_limit_s == AUTO
    return res


def _passes(graph, options: SearchOptions, progress, limit: float) -> OptimizeResult:
    """The passes of one uncached search (module docstring)."""
    t0 = time.perf_counter()
    budget = Budget.start(limit, t0)
    check(graph)
    check_bytes(check_parts(graph), f"verifying {graph.name!r}")
    prof = GPUProfile.load(options.target).for_launch(options.launch)  # both models use it
    if options.compile_check:
        from ..codegen.tune import can_tune

        if not can_tune(prof.name):
            raise MirageError(f"optimize: compile_check needs a built-in GPU target (h100, h200, "
                              f"a100) and Triton's NVIDIA compiler; target {prof.name!r} "
                              "cannot be built here (compile_check=False skips the check)")
    hw = Hardware.load(prof)
    user = [p for p in rule_paths(options.rules) if p.parent != builtin_rules_dir()]
    if user:
        from ..egraph.check_rules import assert_sound

        assert_sound([str(p) for p in user], strict=not options.allow_unchecked_rules,
                     time_limit_s=budget.rule_checks(),
                     allow_float_unsafe=options.allow_float_unsafe_rules)
    rulesets, rule_list, facts = load_rule_files(options.rules)
    stats: dict = {"target": hw.name, "target_spec": str(options.target),
                   "guards": options.guards, "rules": len(rule_list), "level": options.level,
                   "cache": "off"}
    try:
        check_lax(graph)
        lax = True
    except LaxError:
        lax = False
    record = SearchRecord(verification=VerificationRecord())
    try:
        cands, data, ctors, encoder = _search(graph, (rulesets, rule_list, facts), options,
                                              hw, record, budget, progress)
    except TimeLimitError as exc:  # nothing to extract in time: the input is the answer
        record.search_timed_out = True
        record.verification.note = f"time limit: {exc}; input returned"
        cands, data, ctors, encoder = [], None, None, None
    vplan = VerifyPlan.of(options, budget)
    if options.level == "kernel":
        res = _kernel_level(graph, cands, hw, lax, vplan, progress, stats, record)
    else:
        from ..egraph.boundaries import Boundaries

        res = _mugraph_level(graph, cands, (data, Boundaries(data, ctors) if data else None,
                                            encoder),
                             prof, options, lax, (vplan, budget), progress, stats, record)
    _write_stats(stats, record, len(cands))
    stats["seconds"] = time.perf_counter() - t0
    record.deadline_passed = budget.expired()
    # a search the time limit cut short is not the search's answer: the cache keeps none
    stats["time_limited"] = record.time_limited
    if not lax:
        stats["note"] = "not a Lax program: the verifier cannot check rewrites, input returned"
    res.passes = record
    return res


def _write_stats(stats: dict, record: SearchRecord, candidates: int) -> None:
    """``res.stats``'s entries of every pass, from their records."""
    for part in (record.saturation, record.extraction):
        if part is not None:
            part.write(stats)
    verification = record.verification
    if verification.note is not None:
        stats["note"] = verification.note
    stats["candidates"] = candidates
    if record.planning is not None:
        record.planning.write(stats)
    if record.compile is not None:
        stats["compiled"] = record.compile.as_stats()
    if verification.rejected:
        stats["rejected"] = list(verification.rejected)
    stats["candidates_tried"] = verification.tried
    stats["verify_seconds"] = verification.seconds
    stats["phase_seconds"] = record.phase_seconds()


def _search(graph, loaded, options: SearchOptions, hw, record: SearchRecord,
            budget: Budget, progress):
    """The saturate and extract passes over ``loaded`` (the rule files' rulesets, rules and
    facts): the candidates, the serialized e-graph, its ctors and the encoder that loaded
    ``graph`` (records into ``record``)."""
    t1 = time.perf_counter()
    rulesets, rule_list, facts = loaded
    sat = Saturator(graph, rulesets, rule_list, guards=options.guards,
                    splits=candidate_splits(graph, options.split_factors),
                    deadline=budget.saturation(), facts=facts)
    limits = Limits(node_limit=options.node_limit, iter_limit=options.iter_limit,
                    time_limit_s=budget.seconds)
    level = options.level
    phases = [(name, tuple(r for r in rs if r in rulesets)) for name, rs in DEFAULT_PHASES
              if level == "mugraph" or name not in KERNEL_PHASES]  # kernel level: no kernels
    extra = tuple(r for r in rulesets if all(r not in rs for _, rs in DEFAULT_PHASES))
    if extra:  # user rulesets right after the algebra, so the kernel phases see their terms
        phases.insert(1, ("user", extra))
    phases = [(name, rs) for name, rs in phases if rs]
    spent, weights = budget.spent(), [PHASE_WEIGHT.get(name, 1.0) for name, _ in phases]
    for i, (name, rs) in enumerate(phases):  # each phase's share of saturation's, by weight
        share = spent + (budget.SATURATION - spent) * sum(weights[:i + 1]) / sum(weights)
        sat.run_phase(name, rs, limits, progress, budget.share(share))
    record.saturation = SaturationRecord(time.perf_counter() - t1,
                                         [vars(p) for p in sat.stats], sat.size())
    data = sat.serialize()
    cands, xstats = extract(data, sat.root_classes(data), graph, sat.ctors, hw, k=options.k,
                            encoder=sat.encoder if level == "mugraph" else None,
                            deadline=budget.extraction())
    record.extraction = ExtractionRecord(xstats, len(cands))
    return cands, data, sat.ctors, sat.encoder


NOT_IN_TIME = "time limit reached before a candidate verified; input returned"


def _check_input(graph, program, lax: bool, vplan: VerifyPlan, ver: VerificationRecord):
    """The input returned as it is, checked against itself (one trial) when time is left;
    None when it is not Lax, or when the check did not conclude: ``ver`` then says why in
    its note (the time limit, or the verifier's own reason, e.g. a denominator that vanishes
    on every draw where a mask empties a whole row)."""
    if not lax:
        return None
    if vplan.deadline.expired():
        ver.time_out(NOT_IN_TIME, overwrite=False)
        return None
    res = _verify(graph, program, vplan, trials=1)
    if res.equivalent:
        return res
    if vplan.deadline.expired():  # cut short part way through
        ver.time_out(NOT_IN_TIME, overwrite=False)
    elif ver.note is None:
        ver.note = (f"no candidate verified ({len(ver.rejected)} rejected), and the input "
                    f"could not be checked against itself ({res.reason}); input returned")
    return None


def _verify(graph, program, vplan: VerifyPlan, trials: int | None = None):
    """``em.verify`` with optimize's trials (at least), seed, ``max_bound`` and deadline."""
    try:
        return verify(graph, program, trials=vplan.trials if trials is None else trials,
                      seed=vplan.seed, max_bound=vplan.max_bound, memo=vplan.memo,
                      float_first=True, time_limit_s=vplan.deadline)
    except BudgetError as exc:  # this candidate is too large to check: the next one may fit
        return VerifyResult(False, 1.0, reason=f"not checked: {exc}", inconclusive=True,
                            max_bound=vplan.max_bound)


def _verify_candidate(graph, program, vplan: VerifyPlan, record: VerificationRecord):
    """One candidate verified (counted in ``record``, with the time limit if it ran out)."""
    record.tried += 1
    try:
        res = _verify(graph, program, vplan)
    except Exception as exc:  # this candidate cannot be checked: rejected, the next one tried
        if unexpected(exc):   # (a bug propagates in strict mode)
            raise
        why = str(exc) if isinstance(exc, MirageError) else f"{type(exc).__name__}: {exc}"
        return VerifyResult(False, 1.0, reason=f"not checked: {why}", inconclusive=True,
                            max_bound=vplan.max_bound)
    if not res.equivalent and vplan.deadline.expired():
        record.time_out(f"time limit reached while verifying ({res.reason}); input returned")
    return res


def _kernel_level(graph, cands, hw, lax, vplan: VerifyPlan, progress, stats,
                  record: SearchRecord) -> OptimizeResult:
    """The cheapest extracted Graph (one kernel per op) that verifies."""
    baseline = graph_cost_us(graph, hw)
    chosen, result = None, None
    ver = record.verification
    t = time.perf_counter()
    for cand in cands:
        if cand.cost_us > baseline:
            continue
        if not lax:
            ver.tried += 1
            break
        if vplan.deadline.expired():
            ver.tried += 1
            ver.time_out(NOT_IN_TIME)
            break
        res = _verify_candidate(graph, cand.program, vplan, ver)
        if res.equivalent:
            chosen, result = cand, res
            break
        ver.rejected.append(res.reason)
        if progress:
            progress(f"candidate rejected by the verifier: {res.reason}")
    if chosen is None:  # nothing cheaper verified: the input program is the answer
        program = graph_from_outputs(graph, graph.outputs, f"{graph.name}_opt")
        cost = baseline
        result = _check_input(graph, program, lax, vplan, ver)
    else:
        program, cost = chosen.program, chosen.cost_us
    ver.seconds = time.perf_counter() - t
    return OptimizeResult(program, cost, baseline, result, stats, cands, graph)


def _mugraph_level(graph, cands, egraph, prof, options: SearchOptions, lax, timing, progress,
                   stats, record: SearchRecord) -> OptimizeResult:
    """Plan every candidate and the input into MuGraphs (``egraph.kernels``: under the Kern
    nodes and facts of the saturated e-graph ``egraph``, its serialized data, kernel
    boundaries and the encoder that loaded ``graph``): the input both as decoded from its
    own terms and as written (a multi-axis reduction, a transpose or an n-ary concat is
    several terms in the e-graph, so the two can differ); the cheapest that builds cleanly
    for the target (``options``: the base strategy, and whether to compile-check) and
    verifies wins. ``timing``: the verify plan
    and the search's budget."""
    from ..cost.gpucost import mugraph_cost, roofline_us
    from ..egraph.boundaries import written_form
    from ..egraph.kernels import Form, KernelPlanner
    from ..fusion.planner import DEFAULT_STRATEGY, plan
    from ..mugraph.program import from_graph

    data, bounds, encoder = egraph
    vplan, budget = timing
    base_mg = from_graph(graph)
    baseline = mugraph_cost(base_mg, prof).total_us
    t = time.perf_counter()
    todo = [Form(c.how, c.program, bounds.edges(c.program, c.keys), c.keys) for c in cands]
    written = (written_form(graph, encoder, data, bounds)
               if any(c.how == "input" for c in cands) else None)
    if written is not None:  # the program as written, unless equal to the input's terms
        todo.append(Form("input as written", graph, written[0], classes=written[1]))
    elif not any(c.how == "input" for c in cands):  # its terms were not found: any boundary
        todo.append(Form("input (any boundary)", graph, None))
    # a kernel level whose phase ran and did not saturate is unsettled: planned as permitted
    phases = record.saturation.phases if record.saturation is not None else []
    unsettled = [p["name"] for p in phases
                 if p["name"] in ("block", "thread") and p["stop"] != "saturated"]
    record.planning = planning = PlanningRecord(unsettled=unsettled)
    # extraction over kernel nodes: each form planned under the e-graph's Kern nodes and facts
    kernels = KernelPlanner(data, plan, prof, options.strategy or DEFAULT_STRATEGY,
                            unsettled=frozenset(unsettled))
    plans, allowed = kernels.plan_all(todo, budget.planning(), planning)
    planning.seconds = time.perf_counter() - t
    t = time.perf_counter()
    chosen, result, summary = None, None, []
    ver = record.verification
    builder = Builder(prof, kernels, todo, budget.compile_check(), progress,
                      build=options.compile_check, replan=budget.planning())
    while plans:
        cost, i, how, p = plans.pop(0)
        entry = {"how": how, "cost_us": cost, "kernels": len(p.mugraph.kernels), "verified": None,
                 "boundaries": allowed[i]}  # op edges where rules/tiling.egg allows a cut
        summary.append(entry)
        if chosen is not None or not lax:
            continue
        if vplan.deadline.expired():
            ver.time_out(NOT_IN_TIME)
            continue
        if not builder.clean(p, i, how, entry, plans):
            continue
        if plans and p.cost_us > max(cost, plans[0][0]):  # retuned warps cost more than the
            summary.pop()                                # next plan: that one goes first
            bisect.insort(plans, (p.cost_us, i, how, p), key=lambda x: (x[0], x[1]))
            continue
        res = _verify_candidate(graph, p.mugraph, vplan, ver)
        entry["verified"] = res.equivalent
        if res.equivalent:
            chosen, result = p, res
        else:
            ver.rejected.append(f"MuGraph from {how}: {res.reason}")
            if progress:
                progress(f"MuGraph from {how} rejected by the verifier: {res.reason}")
    if options.compile_check:
        record.compile = builder.report()
    stats["plans"] = summary
    if chosen is None:  # nothing verified (or not Lax): the input, one kernel per op
        program, cost = base_mg, baseline
        result = _check_input(graph, program, lax, vplan, ver)
        stats["regions"] = []
    else:
        program, cost = chosen.mugraph, mugraph_cost(chosen.mugraph, prof).total_us
        program.name = f"{graph.name}_opt"
        stats["regions"] = [str(r) for r in chosen.regions]
    ver.seconds = time.perf_counter() - t
    stats["kernels"] = len(program.kernels)
    stats["custom_kernels"] = sum(kk.kind == "custom" for kk in program.kernels)
    return OptimizeResult(program, cost, baseline, result, stats, cands, graph,
                          roofline_us(graph, prof), chosen)
