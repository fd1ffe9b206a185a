"""Kernel boundaries read from the saturated e-graph (the rules of rules/tiling.egg).

After the "tiling" phase, an e-class holding ``(Exp x)`` also holds
``(Exp (Dev x))`` wherever a tiling rule let that operand come from device
memory. An extracted candidate is a plain term (no ``Dev``); for each of its
edges (producer -> consumer operand) this module looks up whether the
consumer's e-class holds the same e-node with that operand behind a ``Dev``.
Edges without one must stay inside one kernel; ``fusion.plan`` starts from
those forced regions and merges further where the cost model says so.

The input program is decoded from its own encoded terms (the ``let`` names of
``encode``), so it is planned under the same rules as the extracted candidates; and so is
the program as written (``written_form``), whose multi-axis reductions, transposes and
n-ary concats the encoding splits into several terms.
"""

from __future__ import annotations

from ..frontend.graph import Graph
from ..ir.node import Op
from .encode import REDUCE_CTOR_OP, Encoder
from .kernels import Terms
from .rulefiles import parse_sexprs
from .saturate import let_classes
from .view import EGraphView


class Boundaries:
    """Which operand edges of which e-nodes may be kernel boundaries."""

    def __init__(self, data: dict, ctors: dict[str, tuple[str, ...]]) -> None:
        self.data, self.ctors = data, ctors
        nodes = data["nodes"]
        self.dev_of: dict[str, str] = {}  # operand class -> class of (Dev operand)
        self.sigs: set[tuple] = set()
        for n in nodes.values():
            if n["op"] not in ctors or n.get("subsumed"):
                continue
            kids = tuple(nodes[c]["eclass"] for c in n["children"])
            self.sigs.add((n["eclass"], n["op"], kids))
            if n["op"] == "Dev":
                self.dev_of[kids[0]] = n["eclass"]

    def cuttable(self, key: str, position: int) -> bool:
        """Whether operand ``position`` (an argument index) of e-node ``key`` may be a boundary."""
        n = self.data["nodes"][key]
        kids = [self.data["nodes"][c]["eclass"] for c in n["children"]]
        dev = self.dev_of.get(kids[position])
        if dev is None:
            return False
        kids[position] = dev
        return (n["eclass"], n["op"], tuple(kids)) in self.sigs

    def edges(self, graph: Graph, chosen: dict[int, str]) -> frozenset[tuple[int, int]]:
        """(id(producer), id(consumer)) op edges of ``graph`` that may be kernel boundaries.

        ``chosen`` maps id(node) to the e-node key it was decoded from. An edge
        qualifies when every operand slot reading the producer may be cut.
        """
        out = set()
        for n in graph.nodes():
            key = chosen.get(id(n))
            if key is None or n.op in (Op.INPUT, Op.CONST):
                continue
            slots = [i for i, s in enumerate(self.ctors[self.data["nodes"][key]["op"]])
                     if s == "T"]
            by_src: dict[int, list[int]] = {}
            for src, slot in zip(n.srcs, slots):
                by_src.setdefault(id(src), []).append(slot)
            for src in n.srcs:
                if src.op in (Op.INPUT, Op.CONST):
                    continue
                if all(self.cuttable(key, slot) for slot in by_src[id(src)]):
                    out.add((id(src), id(n)))
        return frozenset(out)


def input_selection(ev: EGraphView, data: dict, encoder: Encoder) -> dict[str, str] | None:
    """The e-node of each class that the input program's own terms chose (None if lost)."""
    by_let = let_classes(data)
    sel: dict[str, str] = {}
    for line in encoder.lines:
        if not line.startswith("(let "):
            continue
        form = parse_sexprs(line, "encode")[0][0]
        name, term = str(form.items[1]), form.items[2]
        cls = by_let.get(name)
        if cls is None or cls not in ev.classes:
            return None
        kids = [by_let.get(str(a)) for a in term.items[1:] if str(a).startswith("$")]
        for key in ev.classes[cls]:
            en = ev.nodes[key]
            t_kids = [c for c in en.children if isinstance(c, str) and c in ev.classes]
            if en.ctor == term.head() and t_kids == kids:
                sel.setdefault(cls, key)
                break
        else:
            return None
    return sel


def _let_enode(name: str, encoder: Encoder, by_let: dict[str, str], nodes: dict,
               by_class: dict[str, list[str]]) -> tuple[str, list] | None:
    """The e-node key of ``let`` ``name``'s own term (its constructor over its operands'
    classes) and the term's arguments; None when the e-graph does not hold it."""
    cls = by_let.get(name)
    if cls is None:
        return None
    term = parse_sexprs(encoder.terms[name], "encode")[0][0]
    args = term.items[1:]
    want = {p: by_let.get(str(a)) for p, a in enumerate(args) if str(a).startswith("$")}
    for key in by_class.get(cls, ()):
        en = nodes[key]
        kids = [nodes[c]["eclass"] for c in en["children"]]
        if en["op"] == term.head() and len(kids) == len(args) and all(
                kids[p] == c for p, c in want.items()):
            return key, args
    return None


def written_form(graph: Graph, encoder: Encoder, data: dict, bounds: Boundaries
                 ) -> tuple[frozenset[tuple[int, int]], dict[int, Terms]] | None:
    """The program ``graph`` as written (``encoder`` loaded it) read against the saturated
    e-graph ``data``: the op edges that may be kernel boundaries, and per op its ``Terms``
    (the e-class of its value, where its Online and Reg nodes sit, and those of its
    reduction terms, where the Kern nodes that allow its schedules sit).

    The e-graph holds a multi-axis reduction as nested single-axis ones, a transpose as
    axis swaps, an n-ary concat as binary ones (``encode``); the form decoded from those
    terms is another program. An edge of ``graph`` may be cut when every term of the
    consumer that reads the producer may read it from device memory; an op's schedule is
    allowed when every one of its reduction terms allows it. None when a term is not found.
    """
    nodes = data["nodes"]
    by_let = let_classes(data)
    by_class: dict[str, list[str]] = {}
    for key, en in nodes.items():
        by_class.setdefault(en["eclass"], []).append(key)
    cuts: set[tuple[int, int]] = set()
    classes: dict[int, Terms] = {}
    reducing = {"MatMul", *(ctor for ctor in REDUCE_CTOR_OP)}
    for n in graph.nodes():
        if n.op in (Op.INPUT, Op.CONST):
            continue
        lets = encoder.parts.get(id(n))
        if not lets:  # an op with no term of its own (a transpose that moves no axis)
            return None
        found = [_let_enode(name, encoder, by_let, nodes, by_class) for name in lets]
        if any(f is None for f in found):
            return None
        classes[id(n)] = Terms(by_let[lets[-1]], tuple(
            by_let[name] for name, (key, _) in zip(lets, found) if nodes[key]["op"] in reducing))
        for src in {id(s): s for s in n.srcs}.values():
            if src.op in (Op.INPUT, Op.CONST):
                continue
            ref = encoder.names[id(src)]
            slots = [(key, p) for key, args in found for p, a in enumerate(args)
                     if str(a) == ref]
            if not slots:
                return None
            if all(bounds.cuttable(key, p) for key, p in slots):
                cuts.add((id(src), id(n)))
    return frozenset(cuts), classes
