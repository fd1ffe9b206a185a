"""``Search``: one program searched as one piece, its passes as methods in order.

check -> rules (user rules checked for soundness) -> saturate (phases, guarded) ->
extract (k best kernel-level Graphs, DAG-aware) -> plan (``level="mugraph"``, the
default: each candidate and the input planned into a MuGraph of custom and predefined
kernels by ``fusion.forms`` under the Kern nodes and facts of the block phase, costed
with ``gpucost``) -> build and verify (cheapest first: a plan is built for the target,
``build.Builder``, then checked with ``em.verify`` against the input, tiled interpreter
included; the first that passes wins) -> result.

``level="kernel"`` stops after extraction: the program is a kernel-level Graph costed
one kernel per op (``cost/per_op.py``). Every returned program passed ``em.verify``; when
none does (or the input is not Lax, so nothing can be verified) the input itself is
returned, one kernel per op.

Whole programs (``whole.py``), shape families (``family.py``) and ``optimize_many``
(``many.py``) choose what feeds a ``Search``; ``search`` runs one through the results
cache.
"""

from __future__ import annotations

import bisect
import math
import sqlite3
import time
import warnings

from ..cost.gpucost import mugraph_cost, roofline_us
from ..cost.per_op import Hardware, graph_cost_us
from ..cost.profile import GPUProfile
from ..egraph.boundaries import Boundaries, written_form
from ..egraph.encode import graph_from_outputs
from ..egraph.extract import extract
from ..egraph.rulefiles import builtin_rules_dir, load_rule_files, rule_paths
from ..egraph.saturate import DEFAULT_PHASES, KERNEL_PHASES, PHASE_WEIGHT, Limits, Saturator
from ..fusion.forms import Form, KernelPlanner
from ..fusion.planner import DEFAULT_STRATEGY
from ..ir.check import check, check_lax
from ..ir.errors import BudgetError, LaxError, MirageError, TimeLimitError, unexpected
from ..ir.limits import AUTO, check_bytes
from ..mugraph.program import from_graph
from ..verifier.memory import check_parts
from ..verifier.verify import VerifyResult, verify
from .build import Builder
from .cache import CacheError, ResultCache, lookup, make_key, open_cache, store_result
from .options import Budget, SearchOptions, VerifyPlan, progress_fn
from .records import (
    ExtractionRecord,
    PlanningRecord,
    SaturationRecord,
    SearchRecord,
    VerificationRecord,
)
from .result import OptimizeResult
from .tuning import EAGER, default_timer, tune

NOT_IN_TIME = "time limit reached before a candidate verified; input returned"


def candidate_splits(graph, factors) -> list[tuple[int, int, int]]:
    """The ``(split n i j)`` facts for ``graph``: n = i * j for each dim n of its tensors and
    each factor j of ``factors`` (``split_factors``) with i, j >= 2. No built-in rule reads
    them (split-K is rules/block.egg's SplitOver rules); they are there for user rules."""
    dims = {d for n in graph.nodes() for d in n.shape}
    return sorted({(n, n // f, f) for n in dims for f in factors if n % f == 0 and n // f > 1
                   and f > 1})


def search(graph, options: SearchOptions, progress=None, cache=True,
           timer=None, start: float | None = None, gate=None) -> OptimizeResult:
    """One program searched as one piece with ``options``, through the results cache
    ``cache`` (True: the default cache; a path, a ``ResultCache``, or False/None: none),
    tuned with ``timer`` where tuning runs (``em.optimize``'s docstring tells the rest).
    ``start``: when the time limit's clock started (``time.perf_counter()``; default now:
    ``em.optimize`` passes the moment it was called, so the limit bounds the whole call).
    ``gate``: a further test a verified plan must pass to be chosen (``Search``); a gated
    search is not cached (its answer depends on the gate: a shape family caches its own)."""
    start = time.perf_counter() if start is None else start
    options, timer = resolve_tuning(options.resolved(), timer)
    progress = progress_fn(progress)
    if gate is not None:
        return Search(graph, options, progress, timer, start, gate).run()
    if cache is not None and cache is not False:
        store = open_cache(cache)  # None when $EQSAT_MIRAGE_CACHE is "off"
        if store is not None:
            return cached_search(graph, store, progress, options, timer=timer, start=start)
    return Search(graph, options, progress, timer, start).run()


def resolve_tuning(options: SearchOptions, timer=None) -> tuple[SearchOptions, object]:
    """``options`` with ``tune`` decided (``SearchOptions.tuned_on``) and the timer tuning
    uses (None when the model decides): ``timer`` if given, else the CUDA device's."""
    if options.tune == "model":
        return options, None
    if timer is None:
        timer = default_timer()
    return options.tuned_on(timer), timer


def cached_search(graph, store: ResultCache, progress, options: SearchOptions,
                  key: str | None = None, timer=None,
                  start: float | None = None) -> OptimizeResult:
    """One ``Search`` of ``graph`` through the open cache ``store``: a stored result when it
    loads and validates (``cache.lookup``), else a search whose result is stored (unless the
    time limit cut it short). ``key`` is the entry's key when the caller computed it
    (``optimize_many``'s workers use their parent's, so that both sides agree). ``start``:
    when the time limit's clock started (default now)."""
    t0 = time.perf_counter() if start is None else start
    check(graph)
    options, timer = resolve_tuning(options.resolved(), timer)
    key = make_key(graph, options) if key is None else key
    name = getattr(graph, "name", "program")
    try:
        res = lookup(store, graph, key, t0, reverifier(graph, options))
    except (sqlite3.Error, OSError, CacheError) as exc:
        warnings.warn(f"results cache {store.path} cannot be read ({exc}); running uncached",
                      RuntimeWarning, stacklevel=3)
        store, res = None, None
    if res is not None:
        if progress:
            progress(f"cache {res.stats['cache']}: {name} ({key[:12]}, {res.cost_us:.2f} us) "
                     f"from {store.path}")
        return res
    if progress and store is not None:
        progress(f"cache miss: {name} ({key[:12]}); searching")
    res = Search(graph, options, progress, timer, t0).run()
    if store is not None:
        store_result(store, key, res, name)
        if res.stats.get("time_limited") and progress:
            progress(f"not cached: {name}'s search was cut short by its time limit")
    return res


class Search:
    """One uncached search of ``graph`` under ``options`` (a checked ``SearchOptions``;
    ``compile_check`` and ``tune`` decided here when not yet), reporting to ``progress``
    (None, or a callable taking a line), tuning with ``timer`` (None: the CUDA device's, when
    there is one). ``run()`` calls the passes in order; each records what it did in
    ``record`` (``res.passes``), from which ``res.stats`` is written. The time limit counts
    from ``start`` (a ``time.perf_counter()``; default: now, before the timer is decided,
    whose first use imports torch). ``gate`` (None, or a callable on a verified MuGraph
    giving why it may not be chosen, "" when it may, with a ``done`` flag that ends the
    verification of further plans): a shape family's check at its other sizes
    (``family.sizes.SizeGate``), so a plan failing there sends the search to its next.
    Only MuGraph plans are gated (``level="kernel"`` has none: the gate is not called)."""

    def __init__(self, graph, options: SearchOptions, progress=None, timer=None,
                 start: float | None = None, gate=None) -> None:
        self.start = time.perf_counter() if start is None else start
        self.graph = graph
        self.gate = gate
        self.options, self.timer = resolve_tuning(options.resolved(), timer)
        self.progress = progress_fn(progress)
        self.limit = self.options.limit_for(graph)  # seconds: time_limit_s, "auto" resolved
        self.record = SearchRecord(verification=VerificationRecord())
        self.stats: dict = {}
        self.budget: Budget | None = None
        self.lax = False

    def _say(self, text: str) -> None:
        if self.progress:
            self.progress(text)

    def run(self) -> OptimizeResult:
        """Every pass in order; the result, its stats written from the records."""
        t0 = self.start
        self.budget = Budget.start(self.limit, t0)
        self.check()
        loaded = self.rules()
        record = self.record
        sat = None
        try:
            sat = self.saturate(loaded)
            cands, data = self.extract(sat)
            egraph = (data, sat.ctors, sat.encoder)
        except TimeLimitError as exc:  # nothing to extract in time: the input is the answer
            record.search_timed_out = True
            record.verification.note = f"time limit: {exc}; input returned"
            cands, egraph = [], (None, None, None)
        finally:
            if sat is not None:
                sat.release()  # the e-graph's data is serialized: its rules go back
        vplan = VerifyPlan.of(self.options, self.budget)
        if self.options.level == "kernel":
            res = self.choose_graph(cands, vplan)
        else:
            forms = self.forms(cands, egraph)
            kernels, plans, allowed = self.plan(forms, egraph[0])
            res = self.choose_mugraph(forms, kernels, plans, allowed, vplan)
        res.candidates = cands
        return self.finish(res, len(cands), t0)

    # -- the passes ------------------------------------------------------------------------

    def check(self) -> GPUProfile:
        """The program checked (``ir.check``, the memory budget of its verification) and the
        target's profile loaded for the launch mode (a MirageError when the compile check
        cannot build for it); the stats' header written."""
        graph, options = self.graph, self.options
        check(graph)
        check_bytes(check_parts(graph), f"verifying {graph.name!r}")
        prof = GPUProfile.load(options.target).for_launch(options.launch)  # both models
        if options.compile_check:
            from ..codegen.compiled import start_builds
            from ..codegen.tune import can_tune

            if not can_tune(prof.name):
                raise MirageError(f"optimize: compile_check needs a built-in GPU target (h100, "
                                  f"h200, a100) and Triton's NVIDIA compiler; target "
                                  f"{prof.name!r} cannot be built here (compile_check=False "
                                  "skips the check)")
            start_builds()  # its imports beside saturation, not before the first build
        self.profile, self.hardware = prof, Hardware.load(prof)
        return prof

    def rules(self) -> tuple:
        """The rule files loaded (rulesets, rules, facts); user files checked for soundness
        first (``check_rules.assert_sound``, within the rule checks' share)."""
        options = self.options
        user = [p for p in rule_paths(options.rules) if p.parent != builtin_rules_dir()]
        if user:
            from ..egraph.check_rules import assert_sound

            assert_sound([str(p) for p in user], strict=not options.allow_unchecked_rules,
                         time_limit_s=self.budget.rule_checks(),
                         allow_float_unsafe=options.allow_float_unsafe_rules)
        loaded = load_rule_files(options.rules)
        self.stats = {"target": self.hardware.name, "target_spec": str(options.target),
                      "guards": options.guards, "rules": len(loaded[1]),
                      "level": options.level, "launch": options.launch, "cache": "off"}
        try:
            check_lax(self.graph)
            self.lax = True
        except LaxError:
            self.lax = False
        return loaded

    def saturate(self, loaded) -> Saturator:
        """The program's e-graph saturated phase by phase (algebra, user rulesets, block,
        thread), each phase until its share of saturation's time (by weight)."""
        t1 = time.perf_counter()
        graph, options, budget = self.graph, self.options, self.budget
        if budget.saturation().expired():  # spent before (a first call's imports): loading
            raise TimeLimitError("the time limit's share of saturation was spent before it "
                                 "started")  # the rules alone is 0.25 s of CPU, 4 s loaded
        rulesets, rule_list, facts = loaded
        sat = Saturator(graph, rulesets, rule_list, guards=options.guards,
                        splits=candidate_splits(graph, options.split_factors),
                        deadline=budget.saturation(), facts=facts)
        limits = Limits(node_limit=options.node_limit, iter_limit=options.iter_limit,
                        time_limit_s=budget.seconds)
        level = options.level
        phases = [(name, tuple(r for r in rs if r in rulesets)) for name, rs in DEFAULT_PHASES
                  if level == "mugraph" or name not in KERNEL_PHASES]  # kernel level: none
        extra = tuple(r for r in rulesets if all(r not in rs for _, rs in DEFAULT_PHASES))
        if extra:  # user rulesets right after the algebra, so the kernel phases see them
            phases.insert(1, ("user", extra))
        phases = [(name, rs) for name, rs in phases if rs]
        spent, weights = budget.spent(), [PHASE_WEIGHT.get(name, 1.0) for name, _ in phases]
        for i, (name, rs) in enumerate(phases):  # each phase's share of saturation's
            share = spent + (budget.SATURATION - spent) * sum(weights[:i + 1]) / sum(weights)
            sat.run_phase(name, rs, limits, self.progress, budget.share(share))
        self.record.saturation = SaturationRecord(time.perf_counter() - t1,
                                                  [vars(p) for p in sat.stats], sat.size())
        return sat

    def extract(self, sat: Saturator) -> tuple[list, dict]:
        """The k cheapest distinct candidates of the saturated e-graph, and its serialized
        data (``egraph.extract``, until extraction's share)."""
        data = sat.serialize()
        cands, xstats = extract(data, sat.root_classes(data), self.graph, sat.ctors,
                                self.hardware, k=self.options.k,
                                encoder=sat.encoder if self.options.level == "mugraph" else None,
                                deadline=self.budget.extraction())
        self.record.extraction = ExtractionRecord(xstats, len(cands))
        return cands, data

    def forms(self, cands: list, egraph: tuple) -> list[Form]:
        """What the plan pass plans: every candidate (its op edges that may be kernel
        boundaries), and the input both as decoded from its own terms and as written (a
        multi-axis reduction, a transpose or an n-ary concat is several terms in the
        e-graph, so the two can differ)."""
        graph = self.graph
        data, ctors, encoder = egraph
        bounds = Boundaries(data, ctors) if data else None
        todo = [Form(c.how, c.program, bounds.edges(c.program, c.keys), c.keys) for c in cands]
        written = (written_form(graph, encoder, data, bounds)
                   if any(c.how == "input" for c in cands) else None)
        if written is not None:  # the program as written, unless equal to the input's terms
            todo.append(Form("input as written", graph, written[0], classes=written[1]))
        elif not any(c.how == "input" for c in cands):  # its terms not found: any boundary
            todo.append(Form("input (any boundary)", graph, None))
        return todo

    def plan(self, forms: list[Form], data: dict | None) -> tuple:
        """Each form planned into a MuGraph under the e-graph's Kern nodes and facts
        (``fusion.forms.KernelPlanner``), until planning's share: the planner, the plans in
        cost order and each form's cuttable op edges. A kernel level whose phase ran and
        did not saturate is unsettled: planned as if its rules permitted everything."""
        t = time.perf_counter()
        sat = self.record.saturation
        phases = sat.phases if sat is not None else []
        unsettled = [p["name"] for p in phases
                     if p["name"] in ("block", "thread") and p["stop"] != "saturated"]
        self.record.planning = planning = PlanningRecord(unsettled=unsettled)
        kernels = KernelPlanner(data, self.profile, self.options.strategy or DEFAULT_STRATEGY,
                                unsettled=frozenset(unsettled))
        # tuning times several plans: each form's other schedules, library-matmul cuts and
        # next-best partitions join the plans (none without a timer: the model decides)
        more = self.options.tune_candidates - 1 if self.timer is not None else 0
        plans, allowed = kernels.plan_all(forms, self.budget.planning(), planning, more)
        planning.seconds = time.perf_counter() - t
        return kernels, plans, allowed

    def choose_mugraph(self, forms: list[Form], kernels: KernelPlanner, plans: list,
                       allowed: dict, vplan: VerifyPlan) -> OptimizeResult:
        """Build and verify, cheapest plan first (``build_and_verify``); without tuning the
        first plan that passes wins, with it the fastest on the device of the verified ones
        and the eager form (``tune_verified``); else the input, one kernel per op."""
        graph, stats, prof = self.graph, self.stats, self.profile
        base_mg = from_graph(graph)
        baseline = mugraph_cost(base_mg, prof).total_us
        t = time.perf_counter()
        verified = self.build_and_verify(forms, kernels, plans, allowed, vplan)
        chosen, result = verified[0][:2] if verified else (None, None)
        if self.timer is not None and verified:
            chosen, result = self.tune_verified(verified, base_mg)
        if chosen is None:  # nothing verified (or not Lax, or eager measured fastest)
            program, cost = base_mg, baseline
            result = self.check_input(program, vplan)
            stats["regions"] = []
        else:
            program, cost = chosen.mugraph, mugraph_cost(chosen.mugraph, prof).total_us
            program.name = f"{graph.name}_opt"
            stats["regions"] = [str(r) for r in chosen.regions]
        self.record.verification.seconds = time.perf_counter() - t
        stats["kernels"] = len(program.kernels)
        stats["custom_kernels"] = sum(kk.kind == "custom" for kk in program.kernels)
        return OptimizeResult(program=program, cost_us=cost, baseline_cost_us=baseline,
                              verified=result, stats=stats, candidates=[], source=graph,
                              roofline_us=roofline_us(graph, prof), plan=chosen)

    def build_and_verify(self, forms: list[Form], kernels: KernelPlanner, plans: list,
                         allowed: dict, vplan: VerifyPlan) -> list[tuple]:
        """Each plan, cheapest first, built for the target (the compile check,
        ``build.Builder``: a refused schedule sends its form back to the planner) and
        verified, until one passes (``tune_candidates`` pass when tuning): the verified
        (plan, verdict, its ``stats["plans"]`` entry), cheapest first."""
        options, budget = self.options, self.budget
        want = options.tune_candidates if self.timer is not None else 1
        verified, summary = [], []
        ver = self.record.verification
        builder = Builder(self.profile, kernels, forms, budget.compile_check(), self.progress,
                          build=options.compile_check)
        while plans:
            cost, i, how, p = plans.pop(0)
            entry = {"how": how, "cost_us": cost, "kernels": len(p.mugraph.kernels),
                     "verified": None, "boundaries": allowed[i]}  # edges the rules may cut
            summary.append(entry)
            if len(verified) >= want or not self.lax:
                continue
            if vplan.deadline.expired():
                if not verified:
                    ver.time_out(NOT_IN_TIME)
                continue
            if self.gate is not None and self.gate.done:
                continue
            if not builder.clean(p, i, how, entry, plans):
                continue
            if plans and p.cost_us > max(cost, plans[0][0]):  # retuned warps cost more than
                summary.pop()                                # the next plan: that goes first
                bisect.insort(plans, (p.cost_us, i, how, p), key=lambda x: (x[0], x[1]))
                continue
            self.judge(p, how, entry, vplan, verified)
        if not verified and self.lax and not vplan.deadline.expired():
            self.last_resort(builder, vplan, verified, summary, allowed)
        if options.compile_check:
            self.record.compile = builder.report()
        self.stats["plans"] = summary
        return verified

    def last_resort(self, builder: Builder, vplan: VerifyPlan, verified: list,
                    summary: list, allowed: dict) -> None:
        """When no plan verified: the cheapest plan refused only for small spills
        (``Builder.last_resort``), verified as any plan (and gated), joins ``verified``
        when it passes and is cheaper than one kernel per op."""
        spilling = builder.last_resort()
        if spilling is None:
            return
        cost, i, how, p, note = spilling
        if cost >= mugraph_cost(from_graph(self.graph), self.profile).total_us:
            return
        how = f"{how} (spilling)"
        entry = {"how": how, "cost_us": cost, "kernels": len(p.mugraph.kernels),
                 "verified": None, "boundaries": allowed[i], "compiled": note}
        summary.append(entry)
        self._say(f"MuGraph from {how}: {note}; verifying it as the last resort")
        self.judge(p, how, entry, vplan, verified)

    def judge(self, p, how: str, entry: dict, vplan: VerifyPlan, verified: list) -> None:
        """Plan ``p`` verified against the input and, when it passes, put to the gate: it
        joins ``verified`` (with its verdict and ``stats["plans"]`` ``entry``) when both pass;
        else why is recorded among the rejections."""
        res = self.verify(p.mugraph, vplan)
        entry["verified"] = res.equivalent
        refused = self.gate_check(p.mugraph) if res.equivalent else ""
        if refused:
            entry["refused"] = refused
            self.record.verification.rejected.append(f"MuGraph from {how}: {refused}")
        elif res.equivalent:
            verified.append((p, res, entry))
        else:
            self.record.verification.rejected.append(f"MuGraph from {how}: {res.reason}")
            self._say(f"MuGraph from {how} rejected by the verifier: {res.reason}")

    def gate_check(self, program) -> str:
        """Why the gate refuses ``program`` ("" without a gate, or when it passes). The gate
        has its own deadline: the time it takes moves the search's shares later
        (``Budget.pause``), so that its checks never starve the next plan's."""
        if self.gate is None:
            return ""
        t = time.perf_counter()
        try:
            return self.gate(program)
        finally:
            self.budget.pause(time.perf_counter() - t)

    def tune_verified(self, verified: list[tuple], eager) -> tuple:
        """The tuning pass (``tuning.tune``): the verified plans and the eager form timed on
        the device; the fastest plan and its verdict, or (None, None) when the eager form
        was fastest. Each plan's entry gets its measured time."""
        names = []
        for entry in (v[2] for v in verified):
            name = entry["how"]
            while name in names or name == EAGER:
                name += "'"
            names.append(name)
        record = tune(self.graph, [(n, v[0].mugraph) for n, v in zip(names, verified)], eager,
                      self.timer, self.progress)
        self.record.tuning = record
        for name, (_, _, entry) in zip(names, verified):
            entry["measured_us"] = record.times_us.get(name)
        if record.chosen == EAGER:
            return None, None
        return verified[names.index(record.chosen)][:2]

    def choose_graph(self, cands: list, vplan: VerifyPlan) -> OptimizeResult:
        """``level="kernel"``: the cheapest extracted Graph (one kernel per op) that
        verifies, else the input."""
        graph = self.graph
        baseline = graph_cost_us(graph, self.hardware)
        chosen, result = None, None
        ver = self.record.verification
        t = time.perf_counter()
        for cand in cands:
            if cand.cost_us > baseline:
                continue
            if not self.lax:
                ver.tried += 1
                break
            if vplan.deadline.expired():
                ver.tried += 1
                ver.time_out(NOT_IN_TIME)
                break
            res = self.verify(cand.program, vplan)
            if res.equivalent:
                chosen, result = cand, res
                break
            ver.rejected.append(res.reason)
            self._say(f"candidate rejected by the verifier: {res.reason}")
        if chosen is None:  # nothing cheaper verified: the input program is the answer
            program = graph_from_outputs(graph, graph.outputs, f"{graph.name}_opt")
            cost = baseline
            result = self.check_input(program, vplan)
        else:
            program, cost = chosen.program, chosen.cost_us
        ver.seconds = time.perf_counter() - t
        return OptimizeResult(program=program, cost_us=cost, baseline_cost_us=baseline,
                              verified=result, stats=self.stats, candidates=cands, source=graph)

    def verify(self, program, vplan: VerifyPlan) -> VerifyResult:
        """One candidate verified against the input (counted; the time limit noted if it ran
        out). A candidate that cannot be checked is rejected, and the next one tried."""
        record = self.record.verification
        record.tried += 1
        try:
            res = verify_with(self.graph, program, vplan)
        except Exception as exc:  # this candidate cannot be checked: rejected, next one tried
            if unexpected(exc):   # (a bug propagates in strict mode)
                raise
            why = str(exc) if isinstance(exc, MirageError) else f"{type(exc).__name__}: {exc}"
            return VerifyResult(False, 1.0, reason=f"not checked: {why}", inconclusive=True,
                                max_bound=vplan.max_bound)
        if not res.equivalent and vplan.deadline.expired():
            record.time_out(f"time limit reached while verifying ({res.reason}); input "
                            "returned")
        return res

    def check_input(self, program, vplan: VerifyPlan) -> VerifyResult | None:
        """The input returned as it is, checked against itself (one trial) when time is
        left; None when it is not Lax, or when the check did not conclude: the verification
        record's note then says why (the time limit, or the verifier's own reason, e.g. a
        denominator that vanishes on every draw where a mask empties a whole row)."""
        ver = self.record.verification
        if not self.lax:
            return None
        if vplan.deadline.expired():
            ver.time_out(NOT_IN_TIME, overwrite=False)
            return None
        res = verify_with(self.graph, program, vplan, trials=1)
        if res.equivalent:
            return res
        if vplan.deadline.expired():  # cut short part way through
            ver.time_out(NOT_IN_TIME, overwrite=False)
        elif ver.note is None:
            ver.note = (f"no candidate verified ({len(ver.rejected)} rejected), and the input "
                        f"could not be checked against itself ({res.reason}); input returned")
        return None

    def finish(self, res: OptimizeResult, candidates: int, t0: float) -> OptimizeResult:
        """``res.stats`` written from the pass records, with the time limit it ran under."""
        stats, record = self.stats, self.record
        write_stats(stats, record, candidates)
        stats["seconds"] = time.perf_counter() - t0
        record.deadline_passed = self.budget.expired()
        # a search the time limit cut short is not the search's answer: the cache keeps none
        stats["time_limited"] = record.time_limited
        if not self.lax:
            stats["note"] = "not a Lax program: the verifier cannot check rewrites, input returned"
        res.passes = record
        stats["time_limit_s"] = self.limit
        stats["time_limit_auto"] = self.options.time_limit_s == AUTO
        return res


THOROUGH_SEEDS = (0, 1, 2, 3)  # a foreign cache entry passes the full check at each of these
THOROUGH_TRIALS = 4  # and with at least this many field trials at each


def price(graph, program, options: SearchOptions) -> tuple[float, float]:
    """``program``'s cost and ``graph``'s one-kernel-per-op baseline as a search with
    ``options`` prices them (the same model, the same launch mode)."""
    prof = GPUProfile.load(options.target).for_launch(options.launch)
    if options.level == "kernel":
        hw = Hardware.load(prof)
        return graph_cost_us(program, hw), graph_cost_us(graph, hw)
    return mugraph_cost(program, prof).total_us, mugraph_cost(from_graph(graph), prof).total_us


def reverifier(graph, options: SearchOptions):
    """How a cache entry this user did not write is checked before use (``cache.lookup``):
    its figures re-priced from its program must be the ones it states, and its program must
    pass the full check (field trials, float64 and native-dtype float checks) at every seed
    of a fixed thorough plan (``THOROUGH_SEEDS``), so the verdict on an entry does not
    depend on a draw. The function returns the last ``VerifyResult`` (a refusal says why)."""
    from ..mugraph.program import MuGraph

    def run(res) -> VerifyResult:
        program = res.program
        if (options.level == "kernel") == isinstance(program, MuGraph):
            return VerifyResult(False, 1.0, reason=f"a {type(program).__name__} is not what a "
                                f"level={options.level!r} search returns",
                                max_bound=options.max_bound)
        cost, baseline = price(graph, program, options)
        roof = None
        if isinstance(program, MuGraph):
            roof = roofline_us(graph, GPUProfile.load(options.target).for_launch(
                options.launch))
        pairs = [(res.cost_us, cost), (res.baseline_cost_us, baseline)]
        if res.roofline_us is not None:  # (an entry may state none: given below)
            pairs.append((res.roofline_us, roof))
        if not all(a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9)
                   for a, b in pairs):
            return VerifyResult(False, 1.0, reason=(
                f"its figures are not its program's (cost {res.cost_us!r} us, baseline "
                f"{res.baseline_cost_us!r} us and roofline {res.roofline_us!r} us stated; "
                f"{cost!r}, {baseline!r} and {roof!r} re-priced)"),
                max_bound=options.max_bound)
        verdict = None
        for seed in THOROUGH_SEEDS:
            verdict = verify(graph, program, trials=max(options.trials, THOROUGH_TRIALS),
                             seed=seed, max_bound=options.max_bound)
            if not verdict.equivalent:
                return verdict
        res.roofline_us = roof
        restate(res)
        return verdict
    return run


FOREIGN_NOTE = ("a cache entry from elsewhere, re-verified: its figures re-priced, its "
                "kernels recounted, its measured times dropped")


def restate(res) -> None:
    """A re-verified foreign entry's statistics: its kernel counts recounted from its
    program, its measured times (``tuned``: a device's, which no check here can confirm)
    dropped, and a note saying so (its cost, baseline and roofline were re-priced before
    it was verified)."""
    res.drop("tuned")
    if hasattr(res.program, "kernels"):
        res.record(kernels=len(res.program.kernels),
                   custom_kernels=sum(k.kind == "custom" for k in res.program.kernels))
    res.record(cache_note=FOREIGN_NOTE)


def verify_with(graph, program, vplan: VerifyPlan, trials: int | None = None) -> VerifyResult:
    """``em.verify`` with the search's trials (at least), seed, ``max_bound`` and deadline;
    a candidate too large to check within the memory budget is inconclusive."""
    try:
        return verify(graph, program, trials=vplan.trials if trials is None else trials,
                      seed=vplan.seed, max_bound=vplan.max_bound, memo=vplan.memo,
                      float_first=True, time_limit_s=vplan.deadline)
    except BudgetError as exc:  # this candidate is too large to check: the next one may fit
        return VerifyResult(False, 1.0, reason=f"not checked: {exc}", inconclusive=True,
                            max_bound=vplan.max_bound)


def write_stats(stats: dict, record: SearchRecord, candidates: int) -> None:
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
    if record.tuning is not None:
        stats["tuned"] = record.tuning.as_stats()
    if verification.rejected:
        stats["rejected"] = list(verification.rejected)
    stats["candidates_tried"] = verification.tried
    stats["verify_seconds"] = verification.seconds
    stats["phase_seconds"] = record.phase_seconds()
