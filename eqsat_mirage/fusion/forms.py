"""Each extracted form planned into a MuGraph under the e-graph's kernel choices.

The seam between the e-graph and fusion: ``egraph.kernels.read_kernels`` reads the
block-level choices of the saturated e-graph (Kern, Online and Reg nodes, the facts) as
plain data (``KernelChoices``); ``KernelPlanner`` here plans each extracted ``Form`` with
the region search (``planner.plan``) under the schedules those choices permit and the
strategy their facts give, and keeps the compile check's refusals (``refuse``) as facts
of the search that every later plan prices as infeasible. ``canonical`` and ``plan_key``
tell duplicates apart: equal forms are planned once, equal plans verified once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..egraph.kernels import SchedulePermit, Terms, read_kernels
from .planner import DATASHEET, plan
from .plans import plan_key


def canonical(graph) -> int:
    """A hash of ``graph`` up to the order of add/mul operands (duplicates are planned once)."""
    from ..ir.node import Op

    memo: dict[int, int] = {}
    for n in graph.nodes():
        kids = [memo[id(s)] for s in n.srcs]
        if n.op in (Op.ADD, Op.MUL):
            kids.sort()
        memo[id(n)] = hash((n.op, n.arg, n.shape, n.dtype, tuple(kids)))
    return hash(tuple(sorted((name, memo[id(n)]) for name, n in graph.outputs.items())))


@dataclass
class Form:
    """One algebraic form to plan: how it was found, its program, the op edges that may be
    kernel boundaries (None: any) and id(node) -> its e-node key (None: not read from the
    e-graph), or -> its e-classes (``classes``)."""

    how: str
    graph: object
    cuts: frozenset | None
    keys: dict[int, str] | None = None
    # id(node) -> its terms' e-classes, for a form not decoded from single e-nodes (the
    # program as written, ``boundaries.written_form``); read instead of ``keys``
    classes: dict[int, Terms] | None = None


class KernelPlanner:
    """Extraction over kernel nodes: each extracted form planned into a MuGraph by the
    region search (``planner.plan``) under the schedules the e-graph's Kern, Online and Reg
    nodes allow and the strategy its facts give (``KernelChoices``, read from the
    serialized e-graph ``data``), and the compile check's refusals (``refuse``)."""

    def __init__(self, data: dict | None, profile, base_strategy,
                 unsettled: frozenset[str] = frozenset()) -> None:
        self.data, self.profile = data, profile
        self.refused: dict[tuple, str] = {}  # the compile check's refusals (``refuse``)
        # fragment shape -> its best schedule, across every plan of this search
        # (``planner.plan``'s ``shared``: each is checked again where it is reused)
        self.shared: dict = {}
        # no e-graph (saturation ran out of time): the base strategy, every schedule allowed;
        # ``unsettled``: the kernel levels whose phase was cut short (KernelChoices)
        self.choices = (replace(read_kernels(data), unsettled=frozenset(unsettled))
                        if data is not None else None)
        self.strategy = (self.choices.strategy(base_strategy) if self.choices is not None
                         else base_strategy)

    def permit(self, form: Form) -> SchedulePermit | None:
        """The schedule filter of ``form`` (its reductions' Kern nodes)."""
        if self.choices is None:
            return None
        if form.classes is not None:
            return self.choices.permit(form.classes)
        if form.keys is None:
            return self.choices.permit(None)
        nodes = self.data["nodes"]
        return self.choices.permit({i: nodes[k]["eclass"] for i, k in form.keys.items()
                                    if k in nodes})

    def refuse(self, found: dict[tuple, str]) -> None:
        """Keep the compile check's refusals (``codegen.tune``: a kernel's tile or structure
        key -> why) as facts of this search: every later plan prices such a kernel as
        infeasible."""
        self.refused.update(found)

    def plan(self, form: Form, shared: dict | None, deadline, alternatives: int = 0):
        """``form`` planned into a ``FusionPlan`` (``planner.plan``, with up to
        ``alternatives`` other plans), every refused kernel priced as infeasible."""
        return plan(form.graph, self.profile, self.strategy, cuts=form.cuts,
                    shared=shared, deadline=deadline, permit=self.permit(form),
                    refused=dict(self.refused) or None, alternatives=alternatives)

    def replan(self, form: Form, deadline):
        """``form`` planned again after the compile check refused some of its kernels
        (``refuse``): every fragment priced before keeps its best schedule unless that
        one is refused now (``planner.plan``'s ``shared``: its price is checked again),
        the rest are priced again; the plan is the one a fresh planner would find. A
        tiny LLaMA layer's 4 re-plans priced 8,609 schedules before, as many as the
        first plans."""
        return self.plan(form, self.shared, deadline)

    def plan_all(self, forms: list[Form], late, record,
                 alternatives: int = 0) -> tuple[list, dict]:
        """Each distinct form planned until ``late`` (a ``Deadline``): the plans as (cost,
        form index, how, plan) in cost order, and per form "cuttable/all" op edges.
        ``record`` counts forms skipped (``skipped``) and refused (``errors``).
        ``alternatives``: up to that many other plans of each form too (``planner.plan``),
        named "<how> / <label>" ("greedy-dag / schedule 2"), duplicates dropped; the first
        ``planner.DATASHEET`` plan right after the cheapest (the tuner times it)."""
        from ..ir.errors import MirageError, unexpected

        plans, seen, distinct, priced, allowed = [], set(), set(), self.shared, {}
        for i, form in enumerate(forms):
            g, cuts = form.graph, form.cuts
            canon = canonical(g)
            if canon in distinct:
                continue
            if plans and late.expired():  # planned in time: the rest are dropped (and counted)
                record.skipped += 1
                continue
            distinct.add(canon)
            edges = {(id(s), id(n)) for n in g.nodes() for s in n.srcs if n.srcs and s.srcs}
            allowed[i] = f"{len(edges) if cuts is None else len(cuts & edges)}/{len(edges)}"
            try:
                p = self.plan(form, priced, late, alternatives)
                if late.expired():  # the planner may have left fragments unfused
                    record.skipped += 1
            except Exception as exc:  # a refused schedule or program: recorded, skipped (a
                if unexpected(exc):   # bug too, outside strict mode: one form never sinks it)
                    raise
                why = str(exc) if isinstance(exc, MirageError) else f"{type(exc).__name__}: {exc}"
                record.errors.append(f"{form.how}: {why}")
                continue
            for how, q in [(form.how, p)] + [(f"{form.how} / {a.label}", a)
                                              for a in p.alternatives]:
                key = plan_key(q.mugraph)
                if key not in seen:
                    seen.add(key)
                    plans.append((q.cost_us, i, how, q))
        plans.sort(key=lambda x: (x[0], x[1]))
        hedge = next((j for j, x in enumerate(plans) if x[3].label == DATASHEET), 0)
        if hedge > 1:  # the datasheet's pick, however the measured figures price it: second
            plans.insert(1, plans.pop(hedge))
        return plans, allowed
