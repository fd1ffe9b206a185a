"""The ``check`` pass and the Lax-fragment check, separate from construction.

``check`` re-derives every node's shape and dtype with ``ir.infer`` and
confirms the graph's inputs and outputs are consistent; ``check_lax`` confirms
a program is in the fragment the finite-field verifier's theorem covers.
"""

from __future__ import annotations

from .errors import GraphError, LaxError, ShapeError
from .node import ALL_DTYPES, ARITY, Node, Op, fmt_shape, infer


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
        if node.dtype not in ALL_DTYPES:
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
    functions (sqrt, rsqrt, silu, relu, tanh, erf, cos, sin) are allowed anywhere; paths through
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
    masked: dict[int, bool] = {}
    for node in program.nodes():
        masked[id(node)] = masked_fact(node, [masked[id(s)] for s in node.srcs], what)
    for name, node in program.outputs.items():
        if masked[id(node)]:
            raise LaxError(f"{what} {program.name!r}: output {name!r} holds -inf where masked "
                           "(a masked value must go through exp or max before an output)")


def masked_fact(node, srcs: list[bool], what: str = "program") -> bool:
    """Whether ``node`` holds a masked value (``where(mask, x, -inf)``), given its operands';
    ``LaxError`` if it uses one in a way the verifier cannot follow. Allowed: ``x - m`` and
    ``x + c`` (finite c or m), transposes, reshapes and casts (still masked: -inf in every
    float dtype), exp and max (no longer masked: the exp of a masked element is 0)."""
    if node.op is Op.MASK:
        if srcs[1]:
            raise LaxError(f"{what}: {node.describe()} masks a value that is already masked")
        return True
    if not any(srcs):
        return False
    if node.op in (Op.EXP, Op.MAX):
        return False
    if node.op in (Op.TRANSPOSE, Op.RESHAPE, Op.CAST):
        return True
    if (node.op is Op.ADD and srcs.count(True) == 1) or (
            node.op is Op.SUB and srcs == [True, False]):
        return True
    raise LaxError(f"{what}: {node.describe()} uses a masked value (-inf where masked): the "
                   "verifier follows one only through + or - of finite values, transposes, "
                   "reshapes, casts, max and exp")

