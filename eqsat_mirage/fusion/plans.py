"""The fusion planner's records: a region's best pricing, the regions of a plan and the plan.

``Pricing`` is how the planner runs one op set (its fragment, schedule and cost, or why no
custom kernel); ``Region`` and ``FusionPlan`` are ``planner.plan``'s result and its report
(each region with why it was, or was not, fused). ``plan_key`` tells equal plans apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..frontend.graph import Graph
from ..ir.node import Node, fmt_shape
from ..mugraph.program import MuGraph
from .indexing import Indexing
from .schedule import Schedule


@dataclass
class Pricing:
    """The best way to run one region (op set): its fragment, schedule, cost and why."""

    fragment: Graph
    indexing: Indexing | None
    schedule: Schedule | None  # None: predefined kernel(s)
    cost_us: float
    reason: str = ""  # why no custom kernel (when cost_us is inf)
    tried: int = 0
    origin: dict[int, int] | None = None  # id(fragment node) -> its op's index in the graph


@dataclass
class Region:
    """One region of the final plan and the report on it."""

    ops: tuple[int, ...]
    kind: str  # "custom" or "predefined"
    kernels: list[str]
    outputs: list[str]
    cost_us: float
    schedule: Schedule | None = None
    why: str = ""
    why_not: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        head = (f"ops {list(self.ops)} -> {self.kind} {', '.join(self.kernels)}"
                f"{f' {self.schedule}' if self.schedule else ''}: {self.cost_us:.2f} us, "
                f"writes {', '.join(self.outputs)}")
        lines = [head] + ([f"  fused: {self.why}"] if self.why else [])
        return "\n".join(lines + [f"  not fused: {w}" for w in self.why_not])


@dataclass
class FusionPlan:
    """``plan``'s result: the MuGraph, its cost, and a per-region report."""

    graph: Graph
    mugraph: MuGraph
    regions: list[Region]
    cost_us: float
    baseline_us: float
    evaluations: int
    seconds: float
    ops: list[Node] = field(repr=False, default_factory=list)
    # what this plan is beside its program's chosen one ("" for that one: "schedule 2",
    # "library matmul", "partition 2"), and the chosen one's alternatives (``plan``'s
    # ``alternatives``), cheapest by the model first
    label: str = ""
    alternatives: list[FusionPlan] = field(repr=False, default_factory=list)

    def report(self) -> str:
        """Readable: each op, then each region with why it was (not) fused."""
        lines = [f"fusion plan for {self.graph.name!r}: {len(self.mugraph.kernels)} kernels, "
                 f"{self.cost_us:.2f} us (this candidate's ops one kernel each: "
                 f"{self.baseline_us:.2f} us); "
                 f"{self.evaluations} fragments priced in {self.seconds:.2f} s"]
        lines += [f"  op {i}: {n.describe()} {fmt_shape(n.shape)}" for i, n in enumerate(self.ops)]
        for r in self.regions:
            lines += ["  " + line for line in str(r).splitlines()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


def plan_key(mg: MuGraph) -> str:
    """The MuGraph's listing without its name and fragment names (duplicates verify once)."""
    lines = str(mg).splitlines()[1:]
    return "\n".join(line for line in lines if not line.lstrip().startswith("source:"))
