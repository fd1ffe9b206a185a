"""A program's ops as the fusion planner sees them: numbered in topological order (inputs
and constants left out), each op's users, a device-tensor name for every value, and any set
of ops (a region) cut out as one kernel's program. The planner and the brute-force yardstick
(bench/brute_force.py) form regions the same way through this class."""

from __future__ import annotations

from ..frontend.graph import Graph
from ..ir.node import Node, Op


class OpSpace:
    """The ops of ``graph``: ``ops`` (topological), ``index`` (id -> position), ``users``
    (position -> the positions reading it), ``out_ids`` (the program's outputs) and
    ``tensor`` (id -> device tensor name: inputs and outputs keep theirs, other values are
    ``t<i>``, never clashing with a user's name)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.ops = [n for n in graph.nodes() if n.op not in (Op.INPUT, Op.CONST)]
        self.index = {id(n): i for i, n in enumerate(self.ops)}
        self.users: list[set[int]] = [set() for _ in self.ops]
        for i, n in enumerate(self.ops):
            for s in n.srcs:
                if id(s) in self.index:
                    self.users[self.index[id(s)]].add(i)
        self.out_ids = {id(n) for n in graph.outputs.values()}
        self.tensor = self._names()

    def _names(self) -> dict[int, str]:
        names = {id(n): name for name, n in self.graph.inputs.items()}
        for name, n in self.graph.outputs.items():
            names.setdefault(id(n), name)
        used = set(self.graph.inputs) | set(self.graph.outputs)
        for i, n in enumerate(self.ops):
            if id(n) not in names:
                name = f"t{i}"
                while name in used:
                    name += "_"
                used.add(name)
                names[id(n)] = name
        return names

    def reads(self, region: frozenset) -> set[str]:
        """The device tensors ``region`` reads from outside it."""
        return {self.tensor[id(s)] for i in region for s in self.ops[i].srcs
                if s.op is not Op.CONST and self.index.get(id(s)) not in region}

    def fragment(self, region: frozenset, name: str | None = None,
                 origin: dict[int, int] | None = None) -> Graph:
        """The ops of ``region`` as one kernel's program: values from outside become inputs
        named after their tensors; values used outside or returned become outputs.
        ``origin`` (when given) receives id(fragment node) -> the op's position."""
        frag = Graph(name or f"{self.graph.name}.r{min(region)}")
        new: dict[int, Node] = {}
        for i in sorted(region):
            n = self.ops[i]
            srcs = []
            for s in n.srcs:
                if s.op is Op.CONST or self.index.get(id(s)) in region:
                    srcs.append(s if s.op is Op.CONST else new[id(s)])
                    continue
                tname = self.tensor[id(s)]
                if tname not in frag.inputs:
                    frag.inputs[tname] = Node(Op.INPUT, (), tname, s.shape, s.dtype)
                srcs.append(frag.inputs[tname])
            new[id(n)] = Node(n.op, tuple(srcs), n.arg, n.shape, n.dtype, n.loc)
            if origin is not None:
                origin[id(new[id(n)])] = i
        for i in sorted(region):
            n = self.ops[i]
            if id(n) in self.out_ids or self.users[i] - region:
                frag.outputs[self.tensor[id(n)]] = new[id(n)]
        return frag
