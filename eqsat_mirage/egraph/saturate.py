"""The ``saturate`` pass: load a program and rule files into egglog and run them.

egglog 13 has no node limit, so each phase runs one iteration at a time:
one application of every ruleset of the phase, then shape facts and
abstract-expression values (when guards are on) to a fixpoint; after each
iteration the e-graph's size is read back and the phase stops at the node,
iteration or time limit, or when nothing changed (saturated).

Nothing runs unbounded: the fixpoints run a few iterations per egglog call and
stop at the deadline or at ``FACT_LIMIT`` facts (a ``TimeLimitError``), and
each rule's matches per iteration are capped so that one iteration cannot
overshoot the node limit by much (``_match_limit``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import egglog.bindings as eb

from ..ir.errors import MirageError, TimeLimitError
from ..ir.limits import Deadline
from ..ir.node import INDEX_DTYPES
from ..ir.ops import SPECS
from .encode import IDENTITIES, Encoder
from .rulefiles import Rule, SList, Sym, guards_text, schema_text, to_text

# Abstract constructor of each T constructor (how its arguments map): the ops' specs' guards;
# the identities of encode.IDENTITIES (a kernel boundary, a kernel choice, the online
# softmax's marks, a value kept in registers) map to their one T argument.
ABSTRACT = {**{s.egglog: s.guard for s in SPECS.values() if s.guard is not None},
            **{c: "{0}" for c in IDENTITIES}}

_ABS_CTORS = {"AVar", "AConst", "AAdd", "AMul", "ADiv", "AExp", "ASum", "AFn", "ACat"}

# The phases in order: algebra first, then where kernel boundaries may go (rules/tiling.egg),
# then the schedules a kernel may run under (rules/block.egg: Kern and Online nodes), then
# the values a kernel may keep in registers (rules/thread.egg: Reg nodes).
DEFAULT_PHASES = (("algebraic", ("assoc", "distrib", "lora", "scalar", "expo", "reduce", "comm")),
                  ("tiling", ("tiling",)), ("block", ("block",)), ("thread", ("thread",)))
KERNEL_PHASES = ("tiling", "block", "thread")  # the MuGraph level's (not run at kernel level)
# Each phase's weight in the saturation time (a phase that ends early leaves its time to the
# next): the algebraic and user phases do the search, the kernel phases add identities
# (milliseconds to a second; a cut-short kernel phase leaves its level unsettled, permitted).
PHASE_WEIGHT = {"tiling": 0.5, "block": 0.25, "thread": 0.25}


@dataclass
class PhaseStats:
    """What one saturation phase did."""

    name: str
    iterations: int = 0
    seconds: float = 0.0
    enodes: int = 0
    stop: str = ""
    rules_fired: dict[str, int] = field(default_factory=dict)


@dataclass
class Limits:
    """Per-phase limits of saturation."""

    node_limit: int = 200_000
    iter_limit: int = 12
    time_limit_s: float = 30.0
    match_limit: int = 2000  # per rule and iteration (egglog's back-off scheduler)


FACT_LIMIT = 2_000_000  # e-nodes and facts of every sort: a fixpoint that passes it is refused
_CHUNK = 4  # fixpoint iterations per egglog call between checks of time and size


def _guard_facts(rule: Rule, schema_ctors: dict[str, tuple[str, ...]]) -> list[str]:
    """Query facts that hold only if every new term of the rule's right side is in-target."""
    facts: list[str] = []
    lhs_terms = set()

    def collect(x):
        if isinstance(x, SList):
            lhs_terms.add(to_text(x))
            for i in x.items[1:]:
                collect(i)
    collect(rule.lhs)
    abs_vars: dict[str, str] = {}

    def abs_of(x) -> str | None:
        if isinstance(x, Sym):
            if x not in abs_vars:
                abs_vars[x] = f"__abs_{x}"
                facts.append(f"(= __abs_{x} (absval {x}))")
            return abs_vars[x]
        head = x.head()
        sorts = schema_ctors[head]
        t_args = [abs_of(a) for a, s in zip(x.items[1:], sorts) if s == "T"]
        if head not in ABSTRACT or any(a is None for a in t_args):
            return None
        term = ABSTRACT[head].format(*t_args)
        if to_text(x) not in lhs_terms and head != "Const":
            facts.append(f"(in-target {term})")
        return term
    if isinstance(rule.rhs, SList):
        abs_of(rule.rhs)
    return facts


class Loaded:
    """E-graphs holding a schema and rule set as loaded (the text they were loaded from, by
    ``Saturator``), idle between searches: parsing and loading the built-in rules took 0.7
    to 1.4 s of every search, as much as saturating a small program. Kept per thread (an
    egglog e-graph may only be used by the thread that made it) and dropped with it; at
    most ``per_text`` idle e-graphs for each of the ``texts`` most recent texts (a few MB
    each)."""

    def __init__(self, texts: int = 4, per_text: int = 2) -> None:
        self.texts, self.per_text = texts, per_text
        self.local = threading.local()

    def _idle(self) -> dict[str, list]:
        if not hasattr(self.local, "idle"):
            self.local.idle = {}
        return self.local.idle

    def idle(self, text: str) -> int:
        """How many idle e-graphs of this thread hold ``text``."""
        return len(self._idle().get(text, []))

    def take(self, text: str):
        """An idle e-graph of this thread loaded from ``text`` (now the caller's), or None."""
        found = self._idle().get(text)
        return found.pop() if found else None

    def give(self, text: str, egraph) -> None:
        """``egraph``, made by this thread, loaded from ``text`` and holding nothing else,
        back to the pool."""
        idle = self._idle()
        found = idle.pop(text, [])  # re-inserted: the most recent text last
        if len(found) < self.per_text:
            found.append(egraph)
        idle[text] = found
        while len(idle) > self.texts:
            del idle[next(iter(idle))]


LOADED = Loaded()


class Saturator:
    """One egglog e-graph holding a program, its shape facts and the rules."""

    def __init__(self, graph, rulesets: list[str], rules: list[Rule], guards: bool = True,
                 splits: list[tuple[int, int, int]] = (), guard_limits: Limits | None = None,
                 deadline: Deadline | None = None, facts=()):
        from .rulefiles import Schema

        self.deadline = deadline or Deadline(None)
        self.graph = graph
        self.guards = guards
        self.rules = rules
        self.ctors = Schema.load().constructors
        self.stats: list[PhaseStats] = []
        parts = [schema_text(), "(relation split (i64 i64 i64))"]
        parts += [f.egglog() for f in facts]  # the rule files' facts (rulefiles.Fact)
        if guards:
            parts.append(guards_text())
        parts += [f"(ruleset {r})" for r in rulesets]
        self.rule_names: dict[str, str] = {}
        for k, rule in enumerate(rules):
            key = f"r{k}"
            self.rule_names[key] = f"{rule.name} [{rule.where}]"
            facts = _guard_facts(rule, self.ctors) if guards else []
            text = rule.egglog(facts)
            parts.append(text[:-1] + f' :name "{key}")')
        # the schema and rules loaded once per thread (``LOADED``), this program on top
        self.rules_text, self._thread = "\n".join(parts), threading.get_ident()
        self.egraph = LOADED.take(self.rules_text)
        if self.egraph is None:
            self.egraph = eb.EGraph()
            self._run(self.rules_text, "loading the schema and rules")
        self._run("(push)", "keeping the loaded rules")
        self.encoder = Encoder()
        self.roots = {name: self.encoder.encode(node) for name, node in graph.outputs.items()}
        self._run("\n".join([f"(split {n} {i} {j})" for n, i, j in splits]
                            + self.encoder.lines), "loading the program")
        self._fixpoint(("shapes",), "computing shape facts")
        if guards:
            self._saturate_target(guard_limits or Limits(node_limit=20_000, iter_limit=6,
                                                         time_limit_s=10.0, match_limit=500))

    def release(self) -> None:
        """Done with the e-graph (its data serialized): the loaded schema and rules go back
        to ``LOADED`` for the next search (egglog's ``pop`` restores the e-graph exactly as
        it was before this program was added). The Saturator cannot run after this. On
        another thread than its own: nothing (egglog's e-graphs are bound to theirs)."""
        if threading.get_ident() != self._thread:
            return  # another thread may not use nor drop it: kept until this one is dropped
        egraph, self.egraph = self.egraph, None
        if egraph is None:
            return
        try:
            egraph.run_program(*egraph.parse_program("(pop)"))
        except eb.EggSmolError:
            return  # not returned: the next search loads its own
        LOADED.give(self.rules_text, egraph)

    def _fixpoint(self, rulesets: tuple[str, ...], what: str) -> None:
        """Run ``rulesets`` to a fixpoint, ``_CHUNK`` iterations per call, checking the
        deadline and ``FACT_LIMIT`` between calls (``TimeLimitError`` / ``MirageError``)."""
        body = " ".join(f"(saturate (run {r}))" if r != rulesets[0] else f"(run {r})"
                        for r in rulesets)
        while True:
            out = self._run(f"(run-schedule (repeat {_CHUNK} {body}))", what)
            if not out[-1].report.updated:
                return
            if self.deadline.expired():
                raise TimeLimitError(f"{what} did not reach a fixpoint within the time limit "
                                     f"({self.deadline.seconds:g} s)")
            n = self.size("all")
            if n > FACT_LIMIT:
                raise MirageError(f"{what}: {n} facts and e-nodes without reaching a fixpoint "
                                  f"(limit {FACT_LIMIT}); a rule makes them grow without end")

    def _run(self, text: str, what: str):
        try:
            return self.egraph.run_program(*self.egraph.parse_program(text))
        except eb.EggSmolError as exc:
            raise MirageError(f"egglog failed while {what}: {exc}") from None

    def _saturate_target(self, limits: Limits) -> None:
        """Saturate the target's abstract expression under the axioms, mark in-target."""
        start = time.perf_counter()
        self._fixpoint(("absrules",), "computing abstract expressions")
        for root in self.roots.values():
            self._run(f"(in-target (absval {root}))", "marking the target")
        for node in self.graph.inputs.values():  # a gather's guard is its table's: the
            # indices' moves (a reshape, a boundary) would be out of target without this
            if node.dtype in INDEX_DTYPES and id(node) in self.encoder.names:
                self._run(f"(in-target (absval {self.encoder.names[id(node)]}))",
                          "marking the index inputs")
        st = PhaseStats("guards")
        while st.iterations < limits.iter_limit:
            out = self._run(f"(run-schedule (let-scheduler bo (back-off :match-limit "
                            f"{limits.match_limit})) (run-with bo axioms))",
                            "saturating the target's abstract expression")
            st.iterations += 1
            st.enodes = self.size("abstract")
            if not out[-1].report.updated:
                st.stop = "saturated"
                break
            if st.enodes > limits.node_limit:
                st.stop = "node limit"
                break
            if time.perf_counter() - start > limits.time_limit_s or self.deadline.expired():
                st.stop = "time limit"
                break
        else:
            st.stop = "iteration limit"
        self._fixpoint(("reach",), "marking target subexpressions")
        st.seconds = time.perf_counter() - start
        self.stats.append(st)

    def size(self, kind: str = "T") -> int:
        """Number of e-nodes: of sort T (tensor terms), "abstract" (sort A) or "all"."""
        out = self._run("(print-size)", "measuring the e-graph")
        sizes = dict(out[-1].sizes)
        if kind == "all":
            return sum(sizes.values())
        if kind == "abstract":
            return sum(n for name, n in sizes.items() if name in _ABS_CTORS)
        return sum(n for name, n in sizes.items() if name in self.ctors)

    def _match_limit(self, limits: Limits, enodes: int) -> int:
        """Matches per rule in the next iteration: ``limits.match_limit``, less when the
        room left under the node limit is small (so one iteration cannot blow past it)."""
        room = max(0, limits.node_limit - enodes) // max(1, len(self.rules))
        return max(1, min(limits.match_limit, room))

    def run_phase(self, name: str, rulesets: tuple[str, ...], limits: Limits,
                  progress: Callable[[str], None] | None = None,
                  deadline: Deadline | None = None) -> PhaseStats:
        """Run ``rulesets`` iteration by iteration under ``limits`` and ``deadline``
        (which also bounds the shape and abstract-expression fixpoints after each)."""
        st = PhaseStats(name)
        start = time.perf_counter()
        outer = self.deadline
        self.deadline = deadline or Deadline(limits.time_limit_s, start)
        try:
            self._phase_loop(st, rulesets, limits, progress, start)
        except TimeLimitError:
            st.stop = "time limit (inside an iteration's fixpoint)"
        finally:
            self.deadline = outer
        st.seconds = time.perf_counter() - start
        self.stats.append(st)
        return st

    def _phase_loop(self, st: PhaseStats, rulesets, limits: Limits, progress, start) -> None:
        enodes = self.size()
        while True:
            if st.iterations >= limits.iter_limit:
                st.stop = "iteration limit"
                break
            if self.deadline.expired():
                st.stop = "time limit"
                break
            sched = (f"(let-scheduler bo (back-off :match-limit "
                     f"{self._match_limit(limits, enodes)})) "
                     + " ".join(f"(run-with bo {r})" for r in rulesets))
            out = self._run(f"(run-schedule {sched})", f"running phase {st.name}")
            st.iterations += 1
            report = out[-1].report
            self._fixpoint(("shapes",), f"phase {st.name}: computing shape facts")
            if self.guards:
                self._fixpoint(("absrules", "reach"), f"phase {st.name}: guards")
            for key, n in report.num_matches_per_rule.items():
                rule = self.rule_names.get(key)
                if rule and n:
                    st.rules_fired[rule] = st.rules_fired.get(rule, 0) + n
            st.enodes = enodes = self.size()
            elapsed = time.perf_counter() - start
            if progress:
                progress(f"{st.name}: iteration {st.iterations}, {st.enodes} e-nodes, "
                         f"{elapsed:.1f} s")
            if not report.updated:
                st.stop = "saturated"
                break
            if st.enodes > limits.node_limit:
                st.stop = "node limit"
                break
            if elapsed > limits.time_limit_s or self.deadline.expired():
                st.stop = "time limit"
                break

    def serialize(self) -> dict:
        """The e-graph as JSON (nodes, classes), for external extraction."""
        return json.loads(self.egraph.serialize([]).to_json())

    def root_classes(self, data: dict) -> dict[str, str]:
        """Output name -> e-class id in ``data``."""
        by_let = let_classes(data)
        return {out: by_let[g] for out, g in self.roots.items()}


def let_classes(data: dict) -> dict[str, str]:
    """The e-class id in serialized ``data`` of every ``let``-bound global ($tK) of the encoding."""
    # a class holding several lets lists them all: "let": "$t4, $t9"
    return {name.strip(): k for k, v in data["class_data"].items() if v.get("let")
            for name in v["let"].split(",")}
