"""The block level read from the saturated e-graph (the rules of rules/block.egg).

After the "block" phase, the e-class of a reduction r (a Sum, Mean, Max or MatMul term)
holds ``(Kern (Sched LOOP SPLIT) r)`` for every schedule a block rule allowed: ``(LoopOver
r F)`` loops over r's reduced axis in F steps, ``(SplitOver r P)`` cuts it into P parts on
the grid. ``read_kernels`` collects them, with the facts (loop ranges, split parts, block
range), as a ``KernelChoices``; a Kern term is decoded as the pair (F, P), 1 standing for
``NoLoop`` / ``NoSplit``. Kern nodes are identities on values: ``view.py`` leaves them out,
so they never change which algebraic form is extracted or its per-op cost. ``(Online e)``
(the online-softmax rule) marks an exp that may read a running maximum: a schedule whose
loop or split grows a max is kept only when every exp reading that max in the loop has one.
``(Reg x)`` (rules/thread.egg) marks a value that may stay in registers: a kernel's thread
graphs (its elementwise chains) link only such values, when the kernel is priced and built.

``KernelChoices.permit`` turns them into the schedule filter of the region search
(``fusion.plan(..., permit=)``): a candidate schedule of a kernel region that loops over or
splits an index is kept only when every reduction of that index in the region has a Kern
node with that (F, P), and every exp reading a running maximum over it an Online node;
a value links a thread graph only where its class has a Reg node; the strategy's loop
ranges, block range and split switch come from the facts (``KernelChoices.strategy``), so a
user rule file changes the plan. A level whose phase was cut short (``unsettled``) permits
everything: its nodes are incomplete, and refusing what is missing would fail closed.

This module only reads the e-graph into plain data; ``fusion/forms.py`` plans each
extracted form under these choices.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property


@dataclass(frozen=True)
class KernelChoices:
    """The schedules the block rules allowed: per reduction e-class, the (F, P) pairs of its
    Kern nodes; and the facts: loop ranges, split part counts and the block range."""

    by_class: dict[str, frozenset[tuple[int, int]]] = field(default_factory=dict)
    loop_facts: tuple[int, ...] = ()
    split_facts: tuple[int, ...] = ()
    block_range: tuple[int, int] | None = None  # the intersection of every block-range fact
    online: frozenset[str] = frozenset()  # e-classes of exps holding an Online node
    registers: frozenset[str] = frozenset()  # e-classes holding a Reg node (rules/thread.egg)
    # levels whose phase was cut short (time or node limit): their nodes are incomplete, so
    # everything is permitted there ("block": loops, splits, running maxima; "thread")
    unsettled: frozenset[str] = frozenset()

    @property
    def kern_nodes(self) -> int:
        """How many Kern e-nodes the e-graph holds."""
        return sum(len(v) for v in self.by_class.values())

    @property
    def loop_ranges(self) -> tuple[int, ...]:
        """Every loop range some Kern node uses."""
        return tuple(sorted({f for v in self.by_class.values() for f, _ in v if f > 1}))

    @cached_property
    def any_pairs(self) -> frozenset[tuple[int, int]]:
        """Every (F, P) some Kern node takes (a program not read from the e-graph may take
        any of them)."""
        return frozenset(p for v in self.by_class.values() for p in v)

    @property
    def splits(self) -> bool:
        """Whether some Kern node splits a reduction."""
        return any(p > 1 for v in self.by_class.values() for _, p in v)

    def strategy(self, base):
        """``base`` (a ``fusion.strategy.Strategy``) with the loop ranges, the block range
        and the split switch the e-graph allows: splits are priced exactly when some
        SplitOver Kern node exists (``base``'s switch is not read: the rules decide)."""
        changes: dict = {"loop_ranges": self.loop_ranges, "allow_split_reduction": self.splits}
        if "block" in self.unsettled:  # the facts' ranges, whatever Kern nodes were made
            changes = {"loop_ranges": self.loop_facts or base.loop_ranges,
                       "allow_split_reduction": bool(self.split_facts)}
        if self.block_range is not None:
            lo, hi = self.block_range
            changes.update(min_blocks=lo, max_blocks=hi)
        return replace(base, **changes)

    def permit(self, eclass_of: dict[int, str | Terms] | None) -> SchedulePermit:
        """The schedule filter for one form: ``eclass_of`` maps id(node) of the form's
        nodes to their e-class, or to ``Terms`` when the e-graph holds the node as several
        terms (the program as written: ``boundaries.written_form``); None: a program not
        read from the e-graph, whose reductions may take any (F, P) some Kern node takes."""
        return SchedulePermit(self, eclass_of)


@dataclass(frozen=True)
class Terms:
    """A node of the program as written that the e-graph holds as several terms (a
    multi-axis reduction as nested ones, a transpose as swaps): the e-class of its value and
    those of its reduction terms, where its Kern nodes sit (``boundaries.written_form``)."""

    value: str
    reductions: tuple[str, ...] = ()


@dataclass
class SchedulePermit:
    """Which (F, P) each reduction of one extracted form may take (``KernelChoices``)."""

    choices: KernelChoices
    eclass_of: dict[int, str | Terms] | None

    def _value(self, node) -> str:
        held = self.eclass_of.get(id(node), "")
        return held.value if isinstance(held, Terms) else held

    def pairs(self, node) -> frozenset[tuple[int, int]]:
        """The (loop range, split parts) pairs of ``node``'s Kern nodes (no loop, no split:
        (1, 1), always allowed); for a node held as several terms, those all its reduction
        terms' Kern nodes take."""
        if self.eclass_of is None:
            return self.choices.any_pairs | {(1, 1)}
        held = self.eclass_of.get(id(node), "")
        classes = (held,) if isinstance(held, str) else held.reductions or (held.value,)
        found = frozenset.intersection(*(self.choices.by_class.get(c, frozenset())
                                         for c in classes))
        return found | {(1, 1)}

    def allows(self, choice: tuple[int, int], reductions: list) -> bool:
        """Whether every one of ``reductions`` (nodes of this form reducing one index) may
        take ``choice`` (``fusion.strategy.kern_choice`` of a schedule and that index)."""
        return "block" in self.choices.unsettled or all(choice in self.pairs(n)
                                                         for n in reductions)

    def online(self, node) -> bool:
        """Whether exp ``node`` may read a running maximum (its e-class holds an ``Online``
        node; a program not read from the e-graph: whether any exp's does)."""
        return self._marked(node, "block", self.choices.online)

    def in_registers(self, node) -> bool:
        """Whether ``node``'s value may stay in registers for its one elementwise user (a
        thread graph: its e-class holds a ``Reg`` node; a program not read from the e-graph:
        whether any e-class does)."""
        return self._marked(node, "thread", self.choices.registers)

    def _marked(self, node, level: str, classes: frozenset[str]) -> bool:
        """Whether ``node``'s value class is among ``classes`` (the e-classes holding one
        kind of mark of ``level``): always when that level is unsettled; for a program not
        read from the e-graph, whenever any class is."""
        if level in self.choices.unsettled:
            return True
        if self.eclass_of is None:
            return bool(classes)
        return self._value(node) in classes

    def key(self, nodes: list) -> tuple:
        """What ``allows``, ``online`` and ``in_registers`` depend on for these nodes (part of
        a memo key)."""
        return tuple((tuple(sorted(self.pairs(n))), self.online(n), self.in_registers(n))
                     for n in nodes)


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
    online, registers = (frozenset(n["eclass"] for n in nodes.values()
                                   if n["op"] == op and not n.get("subsumed"))
                         for op in ("Online", "Reg"))
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
                         tuple(sorted(splits)), (lo, hi) if ranged else None, online, registers)
