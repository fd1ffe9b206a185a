"""A shape family's plan verified at six sizes, priced at several, and the report of both.

``check_sizes`` finds how the chosen plan serves every size (``scale.scaling``) and
verifies it at ``test_sizes`` (the hint, hint +/- 1, a prime, one below a tile, the
largest tested): the plan at each, zero-padded and cut (``FamilyMember``), against the
family's program at that size, finite-field trials and float checks each (the float
checks' pair draws at the hint and the tightest size, ``verify_sizes`` says why).
``SizeGate`` runs these checks on each plan the search verified at the hint, so a plan
failing at a size sends the search to its next; when none serves, the family falls back
to one kernel per op, verified the same way. When the memory budget refuses the largest
size, the largest verified moves halfway to the hint until it fits
(``SizeCheck.over_budget`` names each refused size).
The checks stop at a deadline (the time limit again, for each plan checked): a size not
verified by then leaves that plan unverified (``SizeCheck.timed_out``), never served.
``family_costs`` prices the plan at ``cost_sizes``; ``SizeCheck.record`` is
``stats["family"]``, and ``family_rows`` its report.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..cost.gpucost import mugraph_cost
from ..ir.errors import BudgetError, unexpected
from ..ir.limits import Deadline
from ..mugraph.program import from_graph
from ..verifier.floatcheck import headroom_slack
from ..verifier.verify import VerifyResult, verify, verify_without_pairs
from .scale import FamilyMember, NotScalableError, Scaling, scaling


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % p for p in range(2, math.isqrt(n) + 1))


def test_sizes(dim, granule: int) -> list[int]:
    """The sizes a family is verified at: the hint, hint - 1 and + 1, a prime, one size
    below a tile (the plan's granule), and the largest (``max``, or 2 hint + 1)."""
    h = dim.hint
    prime = next(p for p in range(h + 2, 4 * h + 8) if _is_prime(p))
    top = dim.max if dim.max is not None else 2 * h + 1
    small = max(dim.min, min(granule - 1, h) if granule > 1 else 1)
    sizes = [h, h - 1, h + 1, prime, small, top]
    return sorted({s for s in sizes if dim.min <= s and (dim.max is None or s <= dim.max)},
                  key=sizes.index)



def cost_sizes(dim) -> list[int]:
    """Sizes the report prices the plan at: the hint and a few around and above it."""
    h = dim.hint
    sizes = [h, h + 1, h + h // 64 + 1, 2 * h]
    return [s for s in dict.fromkeys(sizes) if dim.max is None or s <= dim.max]


def family_costs(sc: Scaling, dim, target) -> dict[int, float]:
    """The plan's predicted time (us) on ``target`` at each of ``cost_sizes``."""
    return {s: mugraph_cost(sc.at(s), target).total_us for s in cost_sizes(dim)}


def verify_sizes(graph, sc: Scaling, dim, opts: dict, refused: dict,
                 deadline: Deadline | None = None
                 ) -> tuple[dict[int, VerifyResult], VerifyResult | None]:
    """Verify the plan at each of ``test_sizes`` (stopping at the first failure, or at
    ``deadline``: past it a verdict is inconclusive); the largest, when the memory budget
    refuses it, moves halfway to the hint until it fits (``refused`` records each). Gives
    the verdict at each size and the hint's.

    The float checks' pair draws run at the hint, and at the size
    whose overflow headroom is tightest (``floatcheck.headroom_slack``: the square of the
    longest reduction rounded up to a power of two gives a candidate from 1x to 2x that
    square of room, depending on the size) when that is another. They judge the algebraic
    form against two inputs at once (``exp(A - B)`` against ``exp(A) / exp(B)``), and the
    form is the same at every size; what a size changes is the tiling (tail tiles, masks,
    loop counts), which the field trials and the per-input draws check at each
    (``verify_without_pairs``). They were
    95% of a 19-input attention family's check at each size (26 of 27 s;
    bench/history/2026-12-03_session39.md). When the memory budget moves the largest size,
    the tightest is found again among the sizes verified, and given the pair draws if it
    had none."""
    verdicts, hint_verdict = {}, None
    sizes = test_sizes(dim, sc.granule)
    top = max(sizes)
    at = functools.cache(lambda size: graph.at({dim.name: size}))  # the program at a size
    slack = functools.cache(lambda size: headroom_slack(at(size)))

    def tightest(among) -> int:  # the smallest slack, the hint first among equals
        return min(among, key=lambda s: (slack(s), s != dim.hint))

    paired = {dim.hint, tightest(sizes)}
    for size in sizes:
        pairs = size in paired
        while True:
            ref = at(size)
            member = FamilyMember(sc, size, ref.inputs, ref.outputs)
            try:  # the pair draws at the hint and the tightest size
                check = verify if pairs else verify_without_pairs
                v = check(ref, member, **opts, time_limit_s=deadline)
                break
            except BudgetError as exc:
                lower = (size + dim.hint) // 2
                if size != top or lower <= dim.hint + 1:
                    raise
                refused[size] = str(exc)
                size = top = lower
                if size in verdicts:  # moved onto a size verified already
                    v, pairs = verdicts[size], False
                    break
                pairs = size == tightest([*verdicts, size])
        verdicts[size] = v
        if size == dim.hint:
            hint_verdict = v
        if not v.equivalent:
            return verdicts, hint_verdict
        paired |= {size} if pairs else set()
    tight = tightest(verdicts)  # the largest moved: the tightest may have had none
    if tight not in paired:
        ref = at(tight)
        verdicts[tight] = verify(ref, FamilyMember(sc, tight, ref.inputs, ref.outputs),
                                 **opts, time_limit_s=deadline)
    return verdicts, hint_verdict


@dataclass
class SizeCheck:
    """What ``check_sizes`` found: the ``scaling`` kept (the chosen plan's, or one kernel
    per op's after a ``fallback``, which says why), the verdict at each size tested, the
    hint's, and the sizes the memory budget refused (size -> why)."""

    scaling: Scaling
    verdicts: dict[int, VerifyResult]
    hint: VerifyResult | None
    fallback: str = ""
    over_budget: dict[int, str] = field(default_factory=dict)
    timed_out: str = ""  # the size whose check the deadline cut, in words ("" if none)

    @property
    def ok(self) -> bool:
        """Whether the plan kept is equivalent at every size tested."""
        return all(v.equivalent for v in self.verdicts.values())

    @property
    def verdict(self) -> VerifyResult | None:
        """The hint's verdict, or (when a size failed) the first failing one."""
        return self.hint if self.ok else next(v for v in self.verdicts.values()
                                              if not v.equivalent)

    def record(self, dim, planned_at: int, masks: int, costs: dict[int, float],
               seconds: float) -> dict:
        """``stats["family"]``: where the family was planned, which sizes were verified,
        the bounds, the refused sizes, the costs and what grows with the size."""
        sc = self.scaling
        return {
            "dim": str(dim), "planned_at": planned_at, "granule": sc.granule,
            "masks": masks, "fallback": self.fallback,
            "verified_sizes": {s: bool(v.equivalent) for s, v in self.verdicts.items()},
            "bounds": {s: v.false_positive_bound for s, v in self.verdicts.items()},
            "over_budget": dict(self.over_budget),  # refused by the memory budget
            "timed_out": self.timed_out,
            "cost_us": costs,
            "grows": {k: sorted(a) for k, a in sc.grid.items() if a} | {
                k: ["loop"] for k in sc.loop},
            "seconds": seconds}


def _check_plan(graph, program, dim, lp0: int, opts: dict,
                deadline: Deadline | None) -> tuple[SizeCheck | None, str]:
    """``program`` scaled and verified at every size: its ``SizeCheck``, and why it cannot
    serve the family ("" when it can, or when the deadline cut its checks)."""
    try:
        sc = scaling(program if hasattr(program, "kernels") else from_graph(program),
                     graph.dynamic, dim.name, lp0)
    except NotScalableError as exc:
        return None, f"the plan does not scale ({exc})"
    refused: dict[int, str] = {}
    verdicts, hint_v = verify_sizes(graph, sc, dim, opts, refused, deadline)
    check = SizeCheck(sc, verdicts, hint_v, "", refused, _cut(verdicts, dim, deadline))
    bad = [s for s, v in verdicts.items() if not v.equivalent]
    if not bad or check.timed_out:  # a cut: the verdict is nobody's fault, no second round
        return check, ""
    return check, f"the plan fails at {dim.name}={bad[0]}: {verdicts[bad[0]]}"


class SizeGate:
    """The family's acceptance test of a search's plans (``Search``'s ``gate``): a plan
    verified at the hint serves the family only when it scales and verifies at every one
    of ``test_sizes`` (``_check_plan``), so a plan that fails at one size sends the search
    on to its next plan, not the family to one kernel per op. At most ``TRIES`` plans are
    checked at sizes (each is six verifications; with tuning, the plans it times count
    too); then ``done`` is set and the search verifies no more plans (it returns the ones
    that passed, or its input). Each plan's checks have ``seconds`` (None: no limit) of
    their own (``clock``), so a slow plan that fails does not starve the next: at most
    ``TRIES`` times the time limit in all. A plan whose checks the clock cut, or that
    cannot be checked, is refused."""

    TRIES = 3

    def __init__(self, graph, dim, lp0: int, opts: dict, say: Callable[[str], None],
                 seconds: float | None = None) -> None:
        self.graph, self.dim, self.lp0, self.opts, self.say = graph, dim, lp0, opts, say
        self.seconds = seconds
        self.checks: dict[int, SizeCheck] = {}  # id(plan) -> its size checks, when they passed
        self.refusals: list[str] = []  # why each plan tried at sizes could not serve
        self.tried = 0  # plans checked at sizes

    def clock(self) -> Deadline:
        """A deadline for one plan's checks at sizes, starting now."""
        return Deadline(self.seconds)

    @property
    def done(self) -> bool:
        """Whether no more plans are checked: ``TRIES`` were (passed or refused)."""
        return self.tried >= self.TRIES

    def __call__(self, program) -> str:
        """Why ``program`` (a plan verified at the hint) cannot serve the family, or "". A
        plan whose checks cannot run (an error) or were cut by the clock is refused."""
        if self.done:
            return f"not checked at the family's sizes ({self.tried} plans checked)"
        self.tried += 1
        try:
            check, why = _check_plan(self.graph, program, self.dim, self.lp0, self.opts,
                                     self.clock())
        except Exception as exc:  # as a candidate the verifier cannot check: refused
            if unexpected(exc):
                raise
            check, why = None, f"not checked at the family's sizes: {type(exc).__name__}: {exc}"
        if check is not None and check.timed_out:
            why = check.timed_out
        if why:
            self.refusals.append(why)
            self.say(f"family {self.graph.name!r}: {why}; the search's next plan instead")
            return why
        self.checks[id(program)] = check
        return ""

    def kept(self, program) -> SizeCheck | None:
        """The size checks of ``program`` when this gate passed it (None otherwise)."""
        return self.checks.get(id(program))

    def fallback(self) -> str:
        """Why the search's plans could not serve the family, in words ("" if none failed)."""
        if not self.refusals:
            return ""
        more = f" ({len(self.refusals) - 1} more plan(s) failed too)" \
            if len(self.refusals) > 1 else ""
        return self.refusals[0] + more


def check_sizes(graph, padded, program, dim, lp0: int, opts: dict,
                say: Callable[[str], None], deadline: Deadline | None = None,
                gate: SizeGate | None = None) -> SizeCheck:
    """Scale ``program`` (the search's plan of ``padded``, the family ``graph`` at padded
    size ``lp0``) to every size and verify it at ``test_sizes`` with ``verify``'s
    ``opts``, until ``deadline``; a plan that does not scale or fails anywhere is
    replaced by one kernel per op of ``padded``, verified the same way (``say`` tells
    why). A check the deadline cut leaves the family unverified (``timed_out``). With
    the search's ``gate``, a plan it passed keeps its checks, and the plans it refused
    are the fallback's reason."""
    check = gate.kept(program) if gate is not None else None
    # plans refused and none passed: they are why; else (the search chose its input: none
    # verified, or tuning measured it fastest) the input is checked as any plan
    fallback = "" if check is not None or gate is None or gate.checks else gate.fallback()
    if check is None and not fallback:
        check, fallback = _check_plan(graph, program, dim, lp0, opts, deadline)
    if fallback:  # one kernel per op scales to any size (its kernels are predefined)
        say(f"family {graph.name!r}: {fallback}; one kernel per op instead")
        check, _ = _check_plan(graph, padded, dim, lp0, opts, deadline)
        check.fallback = fallback
    if check.timed_out:
        say(f"family {graph.name!r}: {check.timed_out}; not served")
    return check


def _cut(verdicts: dict[int, VerifyResult], dim, deadline: Deadline | None) -> str:
    """Where ``deadline`` ended the checks, in words: the first size not verified, when its
    verdict is inconclusive and the deadline has passed (not a difference found); else ""."""
    bad = next((s for s, v in verdicts.items() if not v.equivalent), None)
    if bad is None or deadline is None or not verdicts[bad].inconclusive or \
            not deadline.expired():
        return ""
    return (f"the size checks' share of the time limit ({deadline.seconds:.1f} s) ran out "
            f"at {dim.name}={bad}")


def family_rows(fam: dict | None) -> list[str]:
    """The report of a shape family (``stats["family"]``): where it was planned, which
    sizes were verified and what it costs at several."""
    if not fam:
        return []
    name = fam["dim"].split("(")[0]
    sizes = ", ".join(str(n) for n, ok in fam["verified_sizes"].items() if ok)
    rows = [f"family       {fam['dim']}: planned at {name} = {fam['planned_at']} "
            f"({fam['masks']} length mask(s)), granule {fam['granule']}; "
            + (f"fell back to one kernel per op: {fam['fallback']}; " if fam["fallback"]
               else "")
            + f"verified at {name} = {sizes} (bound <= "
            f"{max(fam['bounds'].values(), default=1.0):.1e})",
            "  cost at    " + ", ".join(f"{name} = {n}: {c:.2f} us"
                                        for n, c in fam["cost_us"].items())]
    if fam.get("timed_out"):
        rows.append(f"  not verified: {fam['timed_out']}")
    if fam.get("over_budget"):
        rows.append(f"  not verified (memory budget): {name} = "
                    + ", ".join(str(n) for n in fam["over_budget"]))
    return rows
