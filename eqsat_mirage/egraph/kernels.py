"""The block level read from the saturated e-graph (the rules of rules/block.egg).

After the "block" phase, the e-class of a reduction r (a Sum, Mean, Max or MatMul term)
holds ``(Kern (Sched LOOP SPLIT) r)`` for every schedule a block rule allowed: ``(LoopOver
r F)`` loops over r's reduced axis in F steps, ``(SplitOver r P)`` cuts it into P parts on
the grid. ``read_kernels`` collects them, with the facts (loop ranges, split parts, block
range), as a ``KernelChoices``; a Kern term is decoded as the pair (F, P), 1 standing for
``NoLoop`` / ``NoSplit``. Kern nodes are identities on values: ``view.py`` leaves them out,
so they never change which algebraic form is extracted or its per-op cost.

``KernelChoices.permit`` turns them into the schedule filter of the region search
(``fusion.plan(..., permit=)``): a candidate schedule of a kernel region that loops over or
splits an index is kept only when every reduction of that index in the region has a Kern
node with that (F, P). ``plan_forms`` plans each extracted form so, with the planning
function passed in (``fusion.plan``: lowering and pricing stay in Python, called from
here), and with the strategy's loop ranges, block range and split switch read from the
e-graph, so a user rule file changes the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class KernelChoices:
    """The schedules the block rules allowed: per reduction e-class, the (F, P) pairs of its
    Kern nodes; and the facts: loop ranges, split part counts and the block range."""

    by_class: dict[str, frozenset[tuple[int, int]]] = field(default_factory=dict)
    loop_facts: tuple[int, ...] = ()
    split_facts: tuple[int, ...] = ()
    block_range: tuple[int, int] | None = None  # the intersection of every block-range fact

    @property
    def kern_nodes(self) -> int:
        """How many Kern e-nodes the e-graph holds."""
        return sum(len(v) for v in self.by_class.values())

    @property
    def loop_ranges(self) -> tuple[int, ...]:
        """Every loop range some Kern node uses."""
        return tuple(sorted({f for v in self.by_class.values() for f, _ in v if f > 1}))

    @property
    def splits(self) -> bool:
        """Whether some Kern node splits a reduction."""
        return any(p > 1 for v in self.by_class.values() for _, p in v)

    def strategy(self, base):
        """``base`` (a ``fusion.strategy.Strategy``) with the loop ranges, the block range
        and the split switch the e-graph allows (splits only if ``base`` allows them too)."""
        changes: dict = {"loop_ranges": self.loop_ranges,
                         "allow_split_reduction": base.allow_split_reduction and self.splits}
        if self.block_range is not None:
            lo, hi = self.block_range
            changes.update(min_blocks=lo, max_blocks=hi)
        return replace(base, **changes)

    def permit(self, eclass_of: dict[int, str] | None) -> SchedulePermit:
        """The schedule filter for one form: ``eclass_of`` maps id(node) of the form's
        nodes to their e-classes (None: a program not read from the e-graph, whose
        reductions may take any (F, P) some Kern node of the same kind takes)."""
        return SchedulePermit(self, eclass_of)


@dataclass
class SchedulePermit:
    """Which (F, P) each reduction of one extracted form may take (``KernelChoices``)."""

    choices: KernelChoices
    eclass_of: dict[int, str] | None

    def pairs(self, node) -> frozenset[tuple[int, int]]:
        """The (loop range, split parts) pairs of ``node``'s Kern nodes (no loop, no split:
        (1, 1), always allowed)."""
        if self.eclass_of is None:
            found = frozenset(p for v in self.choices.by_class.values() for p in v)
        else:
            found = self.choices.by_class.get(self.eclass_of.get(id(node), ""), frozenset())
        return found | {(1, 1)}

    def allows(self, choice: tuple[int, int], reductions: list) -> bool:
        """Whether every one of ``reductions`` (nodes of this form reducing one index) may
        take ``choice`` (``fusion.strategy.kern_choice`` of a schedule and that index)."""
        return all(choice in self.pairs(n) for n in reductions)

    def key(self, reductions: list) -> tuple:
        """What ``allows`` depends on for these nodes (part of a memo key)."""
        return tuple(tuple(sorted(self.pairs(n))) for n in reductions)


def _int(data: dict, key: str) -> int:
    return int(data["nodes"][key]["op"])


def read_kernels(data: dict) -> KernelChoices:
    """The Kern nodes and block-level facts of serialized e-graph ``data``."""
    nodes = data["nodes"]
    by_class: dict[str, set[tuple[int, int]]] = {}
    loops: set[int] = set()
    splits: set[int] = set()
    lo, hi, ranged = 1, 2**62, False
    bounds = {"min-loop-range": 1, "max-loop-range": 2**62}
    for n in nodes.values():
        op, kids = n["op"], n["children"]
        if op == "loop-range":
            loops.add(_int(data, kids[0]))
        elif op == "split-parts":
            splits.add(_int(data, kids[0]))
        elif op == "block-range":
            lo, hi, ranged = max(lo, _int(data, kids[0])), min(hi, _int(data, kids[1])), True
        elif op in bounds:
            bounds[op] = next(int(m["op"]) for m in nodes.values()  # its value's node
                              if m["eclass"] == n["eclass"] and m["op"].lstrip("-").isdigit())
    for n in nodes.values():
        if n["op"] != "Kern" or n.get("subsumed"):
            continue
        loop, split = nodes[nodes[n["children"][0]]["children"][0]], \
            nodes[nodes[n["children"][0]]["children"][1]]
        f = _int(data, loop["children"][1]) if loop["op"] == "LoopOver" else 1
        p = _int(data, split["children"][1]) if split["op"] == "SplitOver" else 1
        named = loop if loop["op"] == "LoopOver" else split  # the reduction the Kern names
        cls = nodes[named["children"][0]]["eclass"] if named["children"] else n["eclass"]
        by_class.setdefault(cls, set()).add((f, p))
    in_range = tuple(sorted(f for f in loops
                            if bounds["min-loop-range"] <= f <= bounds["max-loop-range"]))
    return KernelChoices({c: frozenset(v) for c, v in by_class.items()}, in_range,
                         tuple(sorted(splits)), (lo, hi) if ranged else None)
