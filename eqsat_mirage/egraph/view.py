"""The tensor part of a serialized e-graph, read in Python: ``view`` builds an ``EGraphView``.

Every tensor e-class gets a representative IR node (so its shape is known and
ill-shaped e-nodes are dropped) and every e-node its cost from the per-op cost
model. ``extract`` chooses e-nodes over this view; ``boundaries`` reads kernel
boundaries from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..cost.per_op import Hardware, node_cost_us
from ..ir.errors import MirageError, TimeLimitError, unexpected
from ..ir.limits import Deadline
from ..ir.node import Node
from .encode import IDENTITIES, build_node


@dataclass
class ENode:
    """A tensor e-node: constructor, literal arguments and child classes."""

    key: str
    ctor: str
    eclass: str
    children: list  # class id (str) for tensor children, a literal for the rest
    cost: float = 0.0


@dataclass
class EGraphView:
    """The tensor part of a serialized e-graph, with one representative per class."""

    nodes: dict[str, ENode]
    classes: dict[str, list[str]]
    reps: dict[str, Node] = field(default_factory=dict)


def _literal(data: dict, key: str):
    node = data["nodes"][key]
    op = node["op"]
    if op == "vec-of":
        return tuple(_literal(data, c) for c in node["children"])
    if op == "vec-empty":
        return ()
    if op.startswith('"'):
        return op[1:-1]
    try:
        return int(op)
    except ValueError:
        return float(op)


def view(data: dict, ctors: dict[str, tuple[str, ...]], inputs: dict[str, Node],
         hw: Hardware, deadline: Deadline | None = None) -> EGraphView:
    """Read the tensor e-nodes of ``data``, build representatives and costs
    (``TimeLimitError`` if ``deadline`` passes first)."""
    nodes: dict[str, ENode] = {}
    classes: dict[str, list[str]] = {}
    for key, n in data["nodes"].items():
        sorts = ctors.get(n["op"])
        # boundaries (boundaries.py), kernel choices, online exps and register values
        # (kernels.py) are identities on values
        if sorts is None or n.get("subsumed") or n["op"] in IDENTITIES:
            continue
        kids = [data["nodes"][c]["eclass"] if s == "T" else _literal(data, c)
                for c, s in zip(n["children"], sorts)]
        nodes[key] = ENode(key, n["op"], n["eclass"], kids)
        classes.setdefault(n["eclass"], []).append(key)
    ev = EGraphView(nodes, classes)
    pending = dict(nodes)
    changed = True
    while changed:  # representatives bottom-up, dropping e-nodes that do not type-check
        if deadline is not None and deadline.expired():
            raise TimeLimitError(f"extraction: reading {len(nodes)} e-nodes did not finish "
                                 "within the time limit")
        changed = False
        for key, en in list(pending.items()):
            args = []
            for c, s in zip(en.children, ctors[en.ctor]):
                if s != "T":
                    args.append(c)
                elif c in ev.reps:
                    args.append(ev.reps[c])
                else:
                    break
            else:
                del pending[key]
                changed = True
                try:
                    rep = build_node(en.ctor, args, inputs)
                except MirageError:  # ill-typed (a ShapeError, DTypeError): dropped
                    del nodes[key]
                    continue
                except Exception as exc:  # noqa: BLE001 - a decoding bug drops one e-node
                    if unexpected(exc):
                        raise
                    del nodes[key]
                    continue
                en.cost = node_cost_us(rep, hw)
                ev.reps.setdefault(en.eclass, rep)
    for key in pending:  # never buildable (its children have no representative)
        nodes.pop(key, None)
    ev.classes = {c: [k for k in ks if k in nodes] for c, ks in classes.items()}
    return ev
