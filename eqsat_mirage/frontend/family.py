"""Shape families: a Graph with symbolic sizes, rebuilt at concrete sizes.

``instantiate(g, {"L": 4099})`` (``Graph.at``) rebuilds every node of ``g`` with its
inputs' symbolic axes at the new sizes (every shape rule runs again, so a program that
is only valid at the hint is caught). Which axes follow which size, and everything
else a shape family needs, is the family stage's (``family/``).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..ir.dims import DynamicShapeError
from ..ir.errors import ShapeError
from ..ir.node import Node, Op, make


def _sizes(g, sizes: Mapping[str, int]) -> dict[str, int]:
    unknown = sorted(set(sizes) - set(g.dims))
    if unknown:
        raise DynamicShapeError(f"graph {g.name!r} has no symbolic size named "
                                f"{', '.join(unknown)} (it has: {', '.join(g.dims) or 'none'})")
    return {n: d.check(sizes.get(n, d.hint), f"graph {g.name!r}: ") for n, d in g.dims.items()}


def remake(node: Node, srcs: tuple[Node, ...], old: Mapping[str, int],
           new: Mapping[str, int]) -> Node:
    """``node`` over new operands ``srcs`` whose symbolic sizes moved from ``old`` to
    ``new`` (a reshape's literal sizes move with them); a ``DynamicShapeError`` naming
    the node when it cannot follow."""
    try:
        return make(node.op, srcs, node.arg, node.loc)
    except ShapeError as exc:
        first = exc
    if node.op is Op.RESHAPE:  # an unsqueeze/view keeping a symbolic dim: the hint moves too
        swap = {old[n]: new[n] for n in old if old[n] != new[n]}
        arg = tuple(swap.get(a, a) for a in node.arg)
        try:
            return make(node.op, srcs, arg, node.loc)
        except ShapeError:
            pass
    at = ", ".join(f"{n}={v}" for n, v in new.items())
    raise DynamicShapeError(
        f"{node.describe()} does not follow the symbolic size at {at}: "
        f"{first}; write it without fixed sizes on a dynamic axis, or make the size static")


def rebuild(g, sizes: Mapping[str, int]) -> tuple[object, dict[int, Node]]:
    """``g`` at ``sizes`` and the map id(old node) -> new node (see ``instantiate``)."""
    new_sizes = _sizes(g, sizes)
    old_sizes = {n: d.hint for n, d in g.dims.items()}
    out = type(g)(g.name)  # a Graph (not imported here: graph.py's ``at`` imports this)
    new: dict[int, Node] = {}
    for name, node in g.inputs.items():
        shape = list(node.shape)
        for axis, dim in g.dynamic.get(name, {}).items():
            shape[axis] = new_sizes[dim]
        out.inputs[name] = Node(Op.INPUT, (), name, tuple(shape), node.dtype, node.loc)
        new[id(node)] = out.inputs[name]
    for node in g.nodes():
        if id(node) not in new:
            new[id(node)] = node if node.op is Op.CONST else remake(
                node, tuple(new[id(s)] for s in node.srcs), old_sizes, new_sizes)
    out.outputs = {n: new[id(v)] for n, v in g.outputs.items()}
    return out, new


def instantiate(g, sizes: Mapping[str, int]):
    """The plain Graph of family ``g`` at ``sizes`` (missing sizes at their hints)."""
    return rebuild(g, sizes)[0]
