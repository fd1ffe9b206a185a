"""The ``check`` pass and the Lax-fragment check, separate from construction.

``check`` re-derives every node's shape and dtype with ``ir.infer`` and
confirms the graph's inputs and outputs are consistent; ``check_lax`` confirms
a program is in the fragment the finite-field verifier's theorem covers.
"""

from __future__ import annotations

from .errors import GraphError, LaxError, ShapeError
from .node import ARITY, DTYPES, Node, Op, fmt_shape, infer


def _name(i: int, node: Node) -> str:
    return f"node %{i} {node.describe()}"


def check(program) -> None:
    """Validate a Graph: arities, shapes, dtypes, inputs and outputs.

    Raises a ``MirageError`` subclass naming the node, its operands and their
    shapes. Returns None when the graph is well formed.
    """
    if not program.outputs:
        raise GraphError(f"graph {program.name!r} has no outputs (call g.output(tensor, name))")
    for name, node in program.outputs.items():
        if not isinstance(node, Node):
            raise GraphError(f"output {name!r} is not a node of graph {program.name!r}")
    for i, node in enumerate(program.nodes()):
        if not isinstance(node.op, Op):
            raise GraphError(f"{_name(i, node)}: unknown op {node.op!r}")
        if node.dtype not in DTYPES:
            raise GraphError(f"{_name(i, node)}: unknown dtype {node.dtype!r}")
        arity = ARITY[node.op]
        if arity is not None and len(node.srcs) != arity:
            raise GraphError(f"{_name(i, node)}: expects {arity} operands, got {len(node.srcs)}")
        if node.op is Op.INPUT:
            if program.inputs.get(node.arg) is not node:
                raise GraphError(f"{_name(i, node)}: input {node.arg!r} is not declared by "
                                 f"graph {program.name!r} (a tensor from another graph?)")
            continue
        if node.op is Op.CONST:
            continue
        try:
            shape, dtype = infer(node.op, node.srcs, node.arg)
        except ShapeError as exc:
            raise ShapeError(f"{_name(i, node)}: {exc}") from None
        if shape != node.shape or dtype != node.dtype:
            raise ShapeError(f"{_name(i, node)}: recorded as {node.dtype}{fmt_shape(node.shape)} "
                             f"but its operands give {dtype}{fmt_shape(shape)}")


def exp_depth(program) -> dict[int, int]:
    """For each node (by id), the most exps on any path from an input to it."""
    depth: dict[int, int] = {}
    for node in program.nodes():
        d = max((depth[id(s)] for s in node.srcs), default=0)
        depth[id(node)] = d + (node.op is Op.EXP)
    return depth


def check_lax(program, what: str = "program") -> None:
    """Raise ``LaxError`` unless every input-to-output path takes exp at most once.

    That is what the finite-field theorem needs: exp maps the Z_q part into
    Z_p and drops it, so a second exp on a path has nothing to act on. Opaque
    functions (sqrt, rsqrt, silu, relu) are allowed anywhere; paths through
    them are counted too, which is conservative.
    """
    depth = exp_depth(program)
    for i, node in enumerate(program.nodes()):
        if depth[id(node)] > 1 and node.op is Op.EXP:
            chain = [node]
            cur = node
            while cur.srcs:
                cur = max(cur.srcs, key=lambda s: depth[id(s)])
                if depth[id(cur)] == 0:
                    break
                if cur.op is Op.EXP:
                    chain.append(cur)
            path = " <- ".join(n.describe() for n in chain)
            raise LaxError(f"{what} {program.name!r} is not a Lax program: {_name(i, node)} "
                           f"takes exp of a value that already went through exp ({path}); "
                           "the finite-field verifier cannot decide equivalence for it")
