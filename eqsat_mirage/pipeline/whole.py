"""Whole programs: partition into Lax pieces, search each, stitch, verify, report.

``em.optimize`` (``optimize.py``) sends here a program that is not one piece
(``partition.needs_partition``: more than ``piece_ops`` ops, or exp taken twice on a
path); ``optimize_whole`` goes through these steps:

1. ``partition.partition`` cuts it into Lax pieces at the cheapest places;
2. pieces equal up to renaming are searched once; the distinct ones are searched
   one after another (each gets a share of the time left weighted by its expected
   search cost, ``limits.search_weight``: time a piece leaves unused goes to the
   pieces after it; ``stats["pieces"]`` gives each its ``share_s``), or with
   ``jobs > 1`` in parallel through ``optimize_many`` (``jobs="auto"``, the default:
   one per core when the pieces are large, ``auto_jobs``), the largest first, each
   until the same deadline (the time left); each search goes through
   the results cache, so a piece met before (another layer of the same model) is
   not searched again;
3. ``partition.stitch`` puts the chosen programs back together as one MuGraph,
   costed by the same model as the one-kernel-per-op baseline of the whole;
4. each optimized piece was verified on its own with a bound of at most
   ``max_bound / distinct pieces``, so the union bound for the whole program is at
   most ``max_bound``; an end-to-end float check (float64 and native dtype) of the
   stitched program against the input runs on top, in the time left (at least
   ``END_TO_END_MIN_S``), on the whole program or, where piece contexts repeat (a
   stack of layers), on its prefix through the first occurrence of every context
   (``end_to_end``). If it finds a difference, the input is returned, one kernel
   per op, and ``stats["note"]`` says why. If the time limit cuts it short, nothing
   found and nothing proven, the verified pieces are kept: each passed its own
   finite-field trials and float checks (float64 and native dtype), the standard of a
   program optimized as one piece; ``stats["end_to_end"]`` says so. Work done is never
   thrown away: a piece that verified in time is optimized in the stitched program, one
   that did not stays as it was (``time_limited`` in its entry).

``res.stats["pieces"]`` has one entry per piece: its ops, status ("optimized" or
"unchanged"), the reason, its cost before and after, and its bound.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace

from ..ir.errors import BudgetError, unexpected
from ..ir.limits import AUTO, Deadline, memory_budget, physical_memory, search_weight
from ..partition.contexts import first_contexts, peaked_inputs
from ..partition.pieces import DEFAULT_PIECE_OPS, Piece, partition
from ..partition.stitch import stitch
from ..verifier.endtoend import FloatCheck, float_check
from ..verifier.truth import effort
from ..verifier.verify import VerifyResult
from .options import SearchOptions
from .result import OptimizeResult
from .search import search

SHARE_END = 0.85  # piece searches end by this fraction of the time limit; the rest: stitch
END_TO_END_MIN_S = 0.5  # the end-to-end check runs at least this long past the piece searches
# why the optimized pieces stand when the end-to-end check did not run or was cut short
OWN_CHECKS = ("the optimized pieces stand on their own verification (finite-field trials, "
              "float64 and native-dtype checks, per piece)")
# A piece (or a one-piece program) counts as optimized only when its predicted cost is below
# (1 - MIN_GAIN) of its input's: a gain within the cost model's rounding (a lone silu priced
# 3.02 -> 3.01 us) is no reason to replace eager ops (docs/pytorch.md)
MIN_GAIN = 0.01
PARALLEL_WORK = 2**30  # verification effort of the distinct pieces: from here, worker processes


def _say(progress: Callable[[str], None] | None, text: str) -> None:
    if progress:
        progress(text)


def changed(res) -> bool:
    """Whether a piece's result is a verified program other than its input."""
    if isinstance(res, BaseException) or res.verified is None or not res.verified.equivalent:
        return False
    if res.stats.get("level") == "mugraph" and not res.stats.get("regions"):
        return False
    tuned = res.stats.get("tuned") or {}
    times, chosen = tuned.get("times_us", {}), tuned.get("chosen")
    if chosen in times and chosen != "eager" and "eager" in times and \
            times[chosen] < times["eager"]:
        return True  # measured faster than the eager form on the device, whatever the model
    # "verified and cheaper" by more than MIN_GAIN: both, or unchanged
    return res.cost_us < res.baseline_cost_us * (1.0 - MIN_GAIN)


def improved(res) -> bool:
    """Whether ``em.optimize`` returned a verified program other than its input (for a
    whole program: whether some piece was optimized)."""
    if not isinstance(res, BaseException) and "pieces" in res.stats:
        return any(e["status"] == "optimized" for e in res.stats["pieces"])
    return changed(res)


def unchanged_reason(res) -> str:
    """Why a piece's input came back as it was."""
    if isinstance(res, TimeoutError):
        return str(res)
    if isinstance(res, BaseException):
        return f"search failed: {type(res).__name__}: {res}"
    st = res.stats
    if st.get("note"):
        return str(st["note"])
    tuned = st.get("tuned")
    if tuned and tuned["chosen"] == "eager" and "eager" in tuned["times_us"]:
        times = tuned["times_us"]
        best = min((us for n, us in times.items() if n != "eager"), default=None)
        return (f"the eager form measured fastest on {tuned['device'].split('|')[0]} "
                f"({times['eager']:.2f} us" + (f" against {best:.2f} us" if best else "")
                + ")")
    rejected = [p for p in st.get("plans", []) if p.get("verified") is False]
    if rejected:
        return f"{len(rejected)} cheaper candidate(s) rejected by the verifier"
    if st.get("time_limited"):  # a pass cut short: the search did not finish
        return "time limit reached before a cheaper candidate verified; input returned"
    refused = list(dict.fromkeys((st.get("compiled") or {}).get("refused") or []))
    if refused:  # every cheaper plan refused by the compile check: say so, with the first why
        return (f"{len(refused)} cheaper plan(s) refused by the compile check "
                f"(first: {refused[0][:300]})")
    if res.verified is not None and res.verified.equivalent and \
            res.cost_us < res.baseline_cost_us:
        return (f"predicted gain {res.baseline_cost_us - res.cost_us:.2f} us "
                f"({res.baseline_cost_us:.2f} -> {res.cost_us:.2f} us) is below MIN_GAIN "
                f"({MIN_GAIN:.0%} of the input's cost)")
    return "no candidate cheaper than one kernel per op"


def auto_jobs(distinct: list[Piece]) -> int:
    """How many distinct pieces ``jobs="auto"`` searches at once: one per core (up to one
    per piece) when verifying them takes at least ``PARALLEL_WORK`` element operations
    (``truth.effort``: a 7B layer's pieces 4.5e10 at sequence 128, 1.1e10 at sequence 1;
    a hidden-256 layer's 9e7), where a worker process's start (imports, a cold Triton
    cache: about 6 s) is small beside a piece's verification, where the machine has twice
    the memory budget in RAM (the workers share the budget for their verifications and
    each holds about 1.5 GB besides: a 7B-size layer's processes together peaked at 10.1
    GB against one process's 7.9) and the main script may be imported by a spawned
    worker (``many.spawn_safe``); else 1, in this process.
    Measured: bench/RESULTS.md, "Real sizes"."""
    from .many import spawn_safe

    cores = os.cpu_count() or 1
    if len(distinct) < 2 or cores < 2 or sum(effort(p.graph) for p in distinct) < PARALLEL_WORK:
        return 1
    if physical_memory() < 2 * memory_budget():  # the budget bounds the verifications the
        return 1  # workers share; each worker holds about 1.5 GB besides (imports, rules)
    return min(cores, len(distinct)) if spawn_safe() else 1


def _search_pieces(distinct: list[Piece], options: SearchOptions, jobs: int | str, cache,
                   deadline: Deadline, progress, timer=None, shares: list | None = None
                   ) -> list:
    """The OptimizeResult (or the exception) of each distinct piece, in order; each
    piece's time limit is appended to ``shares`` (one after another: the time left times
    its ``search_weight`` over that of the pieces not yet searched; in worker processes:
    the time left, each search ending by the same deadline however late its worker starts
    it, so time one piece leaves unused goes to the others, the largest searched first)."""
    shares = [] if shares is None else shares
    opts = options.replace(max_bound=options.max_bound / max(1, len(distinct)))
    jobs = min(auto_jobs(distinct) if jobs == AUTO else jobs, len(distinct))
    end = deadline.part(SHARE_END)
    if jobs > 1:
        from .many import optimize_many

        left = end.remaining()
        opts = opts.replace(time_limit_s=max(0.05, left))
        shares += [opts.time_limit_s] * len(distinct)
        _say(progress, f"{len(distinct)} distinct pieces: searching {jobs} at once in worker "
                       f"processes (the largest first), each until {left:.1f} s from now at "
                       "most")
        return optimize_many([p.graph for p in distinct], jobs=jobs, errors="return",
                             progress=progress, cache=cache, end_at=time.time() + left,
                             timer=timer, **opts.key_data())
    out = []
    weights = [max(1.0, search_weight(p.graph.nodes())) for p in distinct]
    for i, p in enumerate(distinct):
        seconds = end.remaining() * weights[i] / sum(weights[i:])
        shares.append(seconds if seconds != float("inf") else None)  # None: no limit
        if seconds < 0.05:
            out.append(TimeoutError("the time limit was reached before this piece was searched"))
            continue
        _say(progress, f"piece {p.index} ({len(p.ops)} ops; {i + 1} of {len(distinct)} "
                       f"distinct): searching for {seconds:.1f} s at most")
        try:
            out.append(search(p.graph, opts.replace(time_limit_s=seconds),
                              progress=progress, cache=cache, timer=timer))
        except Exception as exc:  # e.g. a BudgetError: the piece stays as it is (a bug too,
            if unexpected(exc):   # outside strict mode, recorded with its type)
                raise
            out.append(exc)
    return out


def optimize_whole(graph, options: SearchOptions, cache, progress,
                   piece_ops: int = DEFAULT_PIECE_OPS, jobs: int | str = AUTO,
                   timer=None, start: float | None = None) -> OptimizeResult:
    """Partition ``graph`` into pieces of at most ``piece_ops`` ops, optimize each piece
    (``jobs`` at once; each tuned with ``timer`` where tuning runs), stitch and verify
    (module docstring). The time limit counts from ``start`` (default: now)."""
    from ..cost.gpucost import mugraph_cost, roofline_us
    from ..cost.per_op import Hardware, graph_cost_us
    from ..cost.profile import GPUProfile
    from ..egraph.rulefiles import rule_paths
    from ..mugraph.program import from_graph

    t0 = time.perf_counter() if start is None else start
    prof = GPUProfile.load(options.target)
    hw = Hardware.load(prof)
    rule_paths(options.rules)  # a bad rules= is reported once, not once per piece
    limit = options.limit_for(graph)
    deadline = Deadline(limit, t0)
    t_p = time.perf_counter()
    pieces = partition(graph, piece_ops)
    texts = [_text(p) for p in pieces]
    first: dict[str, int] = {}
    for p, text in zip(pieces, texts):
        first.setdefault(text, p.index)
    distinct = [pieces[i] for i in first.values()]
    t_part = time.perf_counter() - t_p
    _say(progress, f"partition: {graph.name!r} cut into {len(pieces)} Lax pieces "
                   f"({len(distinct)} distinct) of {', '.join(str(len(p.ops)) for p in pieces)} "
                   f"ops in {t_part:.2f} s")
    t_search = time.perf_counter()
    shares: list[float] = []
    found = dict(zip(first.values(), _search_pieces(distinct, options, jobs, cache, deadline,
                                                    progress, timer, shares)))
    share = dict(zip(first.values(), shares))
    t_search = time.perf_counter() - t_search
    results = [found[first[text]] for text in texts]
    did = [changed(r) for r in results]
    programs = [r.program if d else from_graph(p.graph) for p, r, d in zip(pieces, results, did)]
    t1 = time.perf_counter()
    mugraph = stitch(graph, pieces, programs, f"{graph.name}_opt")
    entries = [_entry(p, r, first[text], d, share.get(first[text]))
               for p, r, text, d in zip(pieces, results, texts, did)]
    stats = {"target": hw.name, "target_spec": str(options.target), "level": options.level,
             "launch": options.launch, "guards": options.guards, "cache": "pieces",
             "pieces": entries,
             "partition_seconds": t_part, "search_seconds": t_search,
             "time_limit_s": limit, "time_limit_auto": options.time_limit_s == AUTO}
    failed, ran = None, FloatCheck(None, False, False, 0.0, "not needed (every piece unchanged)")
    if any(did):
        failed, ran, programs, did, mugraph = _check_whole(
            graph, (pieces, texts, programs, did, entries), mugraph, options.seed, deadline)
    stats["end_to_end"] = ran.message
    stats["end_to_end_seconds"] = ran.seconds
    # the time limit shaped this result: a piece's search or the end-to-end check cut short
    stats["time_limited"] = ran.cut_short or any(e["time_limited"] for e in entries)
    if not any(did):  # nothing optimized: say why (the pieces' reasons, counted)
        why: dict[str, int] = {}
        for e in entries:
            why[e["reason"]] = why.get(e["reason"], 0) + 1
        stats["note"] = "no piece optimized, input returned: " + "; ".join(
            f"{n} piece(s): {r}" for r, n in why.items())
    if failed is not None:
        stats["note"] = f"end-to-end float check of the stitched program {failed}: input returned"
        mugraph = stitch(graph, pieces, [from_graph(p.graph) for p in pieces])
        for e in entries:
            e.update(status="unchanged", reason=f"the whole program's float check {failed}",
                     cost_after_us=e["cost_before_us"], bound=0.0)
    verdict = _verdict(entries, results, options.max_bound, failed, ran)
    if options.level == "kernel":
        program = mugraph.reference()
        program.name = f"{graph.name}_opt"
        cost, baseline, roof = graph_cost_us(program, hw), graph_cost_us(graph, hw), None
    else:
        program = mugraph
        cost = mugraph_cost(mugraph, prof).total_us
        baseline = mugraph_cost(from_graph(graph), prof).total_us
        roof = roofline_us(graph, prof)
        stats["kernels"] = len(mugraph.kernels)
        stats["custom_kernels"] = sum(k.kind == "custom" for k in mugraph.kernels)
    stats["stitch_seconds"] = time.perf_counter() - t1
    stats["seconds"] = time.perf_counter() - t0
    out = OptimizeResult(program=program, cost_us=cost, baseline_cost_us=baseline,
                         verified=verdict, stats=stats, source=graph, roofline_us=roof)
    out.pieces = [(p, d and failed is None) for p, d in zip(pieces, did)]
    return out


def _check_whole(graph, parts: tuple, mugraph, seed, deadline: Deadline) -> tuple:
    """The end-to-end check of the stitched ``mugraph`` (``parts``: the pieces, their
    texts, programs, which are optimized and their stats entries); a refusal puts the
    culprit pieces back (``isolate``) when that passes, their entries saying why. (why the
    input is returned or None, the check, the programs, which stay optimized, the stitched
    program)."""
    pieces, texts, programs, did, entries = parts
    failed = None
    try:
        ran = end_to_end(graph, pieces, texts, programs, mugraph, seed,
                         max(deadline.remaining(), END_TO_END_MIN_S))
    except BudgetError as exc:  # the pieces fit, their stitched whole does not
        ran = FloatCheck(None, False, False, 0.0, f"not run ({exc}); {OWN_CHECKS}",
                         over_budget=True)
    if ran.counterexample is not None:  # one piece's optimized form may be the cause:
        why: list[str] = []
        kept = isolate(graph, pieces, texts, programs, did, seed, deadline, ran.counterexample,
                       why)
        if kept is None:  # never a silent wrong answer: the input
            failed = f"failed ({ran.counterexample}); culprit search: {'; '.join(why)}"
        else:  # the culprit pieces stay as they were, the rest optimized
            first_why = f"failed with it optimized ({ran.counterexample})"
            programs, did, mugraph, ran = kept
            for e, d in zip(entries, did):
                if e["status"] == "optimized" and not d:
                    e.update(status="unchanged", cost_after_us=e["cost_before_us"],
                             bound=0.0, reason=f"the whole program's float check {first_why}")
    elif ran.cut_short:  # nothing found, nothing proven: the pieces' own checks stand
        ran = FloatCheck(None, True, False, ran.seconds, f"{ran.message}; {OWN_CHECKS}")
    return failed, ran, programs, did, mugraph


def isolate(graph, pieces: list[Piece], texts: list[str], programs: list, did: list,
            seed, deadline: Deadline, cex=None, why: list[str] | None = None):
    """After the end-to-end check refused the stitched program (``cex``, its
    counterexample): culprit pieces put back as they were (a distinct piece with all its
    occurrences). Each round finds the fewest put-backs that make the counterexample's own
    check pass (``end_to_end(only=...)``, one draw: cheap): one distinct piece, else the
    first of them in order up to the one that fixes it, less those it does not need. Only
    then the whole check runs; when it fails elsewhere (another culprit) the next round
    starts from the put-backs kept and the new counterexample. The first whole check that
    passes gives (programs, which stay optimized, the stitched MuGraph, its check); so does
    one the time limit cuts short with nothing found: every counterexample found so far is
    fixed, and the pieces left optimized stand on their own verification, as when the first
    end-to-end check is cut short. None when every piece would go back, or the time runs
    out before the last counterexample is fixed: the input is returned, and ``why`` (a
    list) gets which of these it was (the time, a draw no set of put-backs fixes, or every
    piece back) with the replays run."""
    from ..mugraph.program import from_graph

    why = [] if why is None else why
    t0, replays, cut = time.perf_counter(), [0], [False]

    def give_up(reason: str, time_may_explain: bool = True) -> None:
        if time_may_explain and (cut[0] or deadline.remaining() < END_TO_END_MIN_S):
            reason = "the time limit ran out before a set of pieces to put back was found"
        why.append(f"{reason} ({replays[0]} replays of the failing draw, "
                   f"{time.perf_counter() - t0:.1f} s)")

    check = getattr(cex, "check", ())  # the check that found it (none: no replay)
    order = list(dict.fromkeys(t for t, d in zip(texts, did) if d))

    def run(out: set, only: tuple | None = None):
        keep = [d and t not in out for t, d in zip(texts, did)]
        progs = [prog if k else from_graph(p.graph)
                 for p, prog, k in zip(pieces, programs, keep)]
        mugraph = stitch(graph, pieces, progs, f"{graph.name}_opt")
        return end_to_end(graph, pieces, texts, progs, mugraph, seed, deadline.remaining(),
                          only=only), (progs, keep, mugraph)

    def fixes(out: set) -> bool:  # the counterexample's own draw passes with ``out`` back
        if not check:
            return True
        ran, _ = run(out, check)
        replays[0] += 1
        cut[0] = cut[0] or ran.cut_short
        return ran.counterexample is None and not ran.cut_short

    out: set[str] = set()
    try:
        while deadline.remaining() >= END_TO_END_MIN_S:
            rest = [t for t in order if t not in out]
            add = next(({t} for t in rest if fixes(out | {t})), None)
            if add is None:  # no one piece: the shortest prefix of them, then pared
                prefix = next((rest[:i] for i in range(2, len(rest) + 1)
                               if fixes(out | set(rest[:i]))), None)
                if prefix is None:
                    give_up("no set of pieces put back fixes the failing draw")
                    return None
                add = set(prefix)
                for t in prefix[:-1]:
                    if fixes(out | (add - {t})):
                        add.discard(t)
            out |= add
            if len(out) == len(order):  # nothing would stay optimized: the input
                give_up("every optimized piece would go back", False)
                return None
            ran, (progs, keep, mugraph) = run(out)
            if ran.counterexample is None:  # passed, or cut short with nothing found
                if ran.cut_short:
                    ran = FloatCheck(None, True, ran.native, ran.seconds,
                                     f"{ran.message} after putting the culprit pieces back; "
                                     f"{OWN_CHECKS}")
                return progs, keep, mugraph, ran
            check = getattr(ran.counterexample, "check", ())
    except BudgetError as exc:
        give_up(f"a replay did not fit the memory budget ({exc})", False)
        return None
    give_up("the time limit ran out")
    return None


def end_to_end(graph, pieces: list[Piece], texts: list[str], programs: list, mugraph,
                seed, seconds: float, only: tuple | None = None) -> FloatCheck:
    """The end-to-end float check of the stitched program: on the whole program, or where
    piece contexts repeat (a stack of identical layers) on its shortest prefix that holds
    the first occurrence of every context (``contexts.first_contexts``; docs/verifier.md,
    section 5), its per-input draws on one occurrence of each context. ``only``: one check
    (a counterexample's ``check``) replayed alone."""
    head = first_contexts(graph, pieces, texts)
    if head is None:
        return float_check(graph, mugraph, seed=seed, time_limit_s=seconds,
                           peaked=peaked_inputs(graph, pieces, texts), only=only)
    stitched = stitch(head.graph, head.pieces, programs[:len(head.pieces)],
                      f"{head.graph.name}_opt")
    ran = float_check(head.graph, stitched, seed=seed, time_limit_s=seconds,
                      peaked=peaked_inputs(head.graph, head.pieces, head.texts), only=only)
    where = (f"on the first {len(head.pieces)} of {len(pieces)} pieces (every piece "
             f"context; the rest repeat them)")
    if ran.counterexample is not None and ran.counterexample.output in head.cut:
        ran.counterexample.detail += (f"; {ran.counterexample.output!r} is a tensor the "
                                      f"later pieces read, checked {where}")
    return replace(ran, message=f"{where}: {ran.message}")


def _text(piece: Piece) -> str:
    from .cache import program_text

    return program_text(piece.graph)


def _entry(piece: Piece, res, first: int, did: bool, share_s: float | None = None) -> dict:
    """The ``stats["pieces"]`` entry of one piece (``share_s``: its search's time limit)."""
    entry = {"index": piece.index, "ops": piece.op_names(), "inputs": len(piece.inputs),
             "share_s": share_s,
             "outputs": len(piece.outputs), "same_as": None if first == piece.index else first,
             "status": "optimized" if did else "unchanged",
             "reason": "verified and cheaper" if did else unchanged_reason(res),
             "time_limited": not did and (isinstance(res, TimeoutError) or (
                 not isinstance(res, BaseException) and bool(res.stats.get("time_limited"))))}
    if isinstance(res, BaseException):
        return {**entry, "cost_before_us": None, "cost_after_us": None, "bound": None,
                "seconds": 0.0, "cache": "off", "tuned": None}
    return {**entry, "cost_before_us": res.baseline_cost_us,
            "cost_after_us": res.cost_us if did else res.baseline_cost_us,
            "bound": res.verified.false_positive_bound if did else 0.0,
            "kernels": res.stats.get("kernels"), "seconds": res.stats.get("seconds", 0.0),
            "phase_seconds": dict(res.stats.get("phase_seconds", {})),
            "compile_seconds": (res.stats.get("compiled") or {}).get("seconds", 0.0),
            "cache": res.stats.get("cache", "off"), "tuned": res.stats.get("tuned")}


def _verdict(entries: list[dict], results: list, max_bound: float, failed: str | None,
             ran: FloatCheck) -> VerifyResult | None:
    """The whole program's verdict: the union of the distinct optimized pieces' bounds
    (``failed``: why the end-to-end check refused the stitched program, which means the
    input was returned)."""
    if failed is not None:
        return VerifyResult(True, 0.0, None, max_bound=max_bound, reason=(
            f"input returned: the stitched program's end-to-end float check {failed}"))
    used = [results[e["index"]] for e in entries
            if e["status"] == "optimized" and e["same_as"] is None]
    if not used:  # nothing verified: no verdict (stats["note"] says why)
        return None
    kept = sum(e["status"] == "unchanged" for e in entries)
    native = ran.native or ((ran.cut_short or ran.over_budget)
                            and all(r.verified.native_checked for r in used))
    out = VerifyResult(True, sum(r.verified.false_positive_bound for r in used), None,
                       min((r.verified.trials for r in used), default=0), max_bound=max_bound,
                       float_checked=bool(used), native_checked=native)
    if used:
        out.p, out.q = used[0].verified.p, used[0].verified.q
        out.seconds = sum(r.verified.seconds for r in used)
    out.reason = (f"union bound over {len(used)} distinct verified piece(s), {kept} piece(s) "
                  f"unchanged; end-to-end check: {ran.message}")
    return out
