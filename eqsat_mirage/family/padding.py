"""A shape family as one padded, masked program: what one search optimizes.

A family ``g`` (symbolic size L) at a length L runs as the program at a padded size
Lp >= L: every input is read as if zero-padded from L to Lp (masked loads), outputs
keep their first L entries (masked stores), and wherever a reduction over L would
see the padding, a *length mask* hides it. The mask is ``CAUSAL(1, Lp, L - 1)``,
True where ``col <= L - 1``: a mask the kernels compute from positions, with L a
runtime argument (``codegen``), never a tensor in memory.

Where masks go follows the padding's value through the program (``State``): inputs
pad with 0; ``exp`` of -inf is 0; a sum needs zeros, a max needs -inf, a matmul over
L needs one operand zero and the other finite. An unmet need is fixed as early as
possible: at the value's producer (the matmul ``Q @ K`` of attention is masked to
-inf, as a masked softmax is), else at the operand. ``plan_masks`` decides where,
once per family; ``planned_size`` picks the padded size Lp0 the search plans at (the
hint rounded up to a tile); ``padded_graph`` builds the program at any (Lp, L).

Which axes follow the size (``dynamic_axes``): the program is rebuilt one size at a
time at another value and the axes that moved are the dynamic ones. An axis whose size
is derived from a symbolic one (``L + 1`` from a concat, ``2 L`` from a reshape) is
refused: one search serves sizes that are the symbol itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..frontend.family import rebuild
from ..frontend.graph import Graph
from ..ir.dims import DynamicShapeError
from ..ir.node import BINARY, COMPARE, ELEMENTWISE, REDUCE, Node, Op, fmt_shape, make, toposort
from ..ir.ops import ANY, FINITE, NEG_INF, SPECS, ZERO

PAD_QUANTUM = 64  # the hint is padded up to a multiple of this (16 below it)


def probe_value(dim) -> int:
    """A second value of ``dim`` (hint + 1, or hint - 1 at the top of its range)."""
    if dim.max is None or dim.hint < dim.max:
        return dim.hint + 1
    if dim.hint > dim.min:
        return dim.hint - 1
    raise DynamicShapeError(f"size {dim} takes one value: declare it as an int")


def dynamic_axes(g) -> dict[int, dict[int, str]]:
    """id(node) -> {axis: size name} for every node of family ``g`` with a dynamic axis.

    Raises ``DynamicShapeError`` naming the node whose size is derived from a symbolic
    one rather than equal to it (``L + 1``, ``2 L``).
    """
    axes: dict[int, dict[int, str]] = {}
    nodes = g.nodes()
    for name, dim in g.dims.items():
        probe = probe_value(dim)
        _, moved = rebuild(g, {name: probe})
        for node in nodes:
            after = moved[id(node)].shape
            for axis, (a, b) in enumerate(zip(node.shape, after)):
                if a == b:
                    continue
                if (a, b) != (dim.hint, probe):
                    raise DynamicShapeError(
                        f"{node.describe()} has an axis of size "
                        f"{a} at {name}={dim.hint} and {b} at {name}={probe}: a size derived "
                        f"from {name} ({fmt_shape(node.shape)}) is not supported; only the "
                        f"size {name} itself")
                mine = axes.setdefault(id(node), {})
                if axis in mine:
                    raise DynamicShapeError(f"{node.describe()}: axis "
                                            f"{axis} follows both {mine[axis]} and {name}")
                mine[axis] = name
    return axes


def unary_state(op: Op, s: str | None) -> str | None:
    """Padding state of elementwise unary ``op`` applied to state ``s``: from its spec (what
    op(0), op(-inf) and op(finite) are)."""
    return SPECS[op].padding.after(s)


def _binary(op: Op, a: str | None, b: str | None) -> str:
    """Padding state of ``a op b`` (None: the operand has no dynamic axis, a finite value
    broadcast along it)."""
    if op in (Op.ADD, Op.SUB):
        if b is None or a is None:
            s = a if b is None else b
            if s == NEG_INF and op is Op.SUB and a is None:
                return ANY  # finite - (-inf)
            return FINITE if s == ZERO else s
        if a == b == ZERO:
            return ZERO
        if op is Op.ADD and {a, b} <= {NEG_INF, ZERO, FINITE} and NEG_INF in (a, b):
            return NEG_INF
        return FINITE if {a, b} <= {ZERO, FINITE} else ANY
    if op is Op.MUL:
        if ZERO in (a, b) and {a, b} <= {ZERO, FINITE, None}:
            return ZERO
        return FINITE if {a, b} <= {FINITE, None} else ANY
    # DIV: by a value without a dynamic axis (a row's sum): finite wherever the program is
    if b is None:
        return a if a in (ZERO, FINITE) else ANY
    return ANY


def _state(node: Node, srcs: list[str | None]) -> str:
    op = node.op
    if op is Op.INPUT:
        return ZERO
    if op in ELEMENTWISE:
        return unary_state(op, srcs[0]) if op not in BINARY else _binary(op, *srcs)
    if op is Op.MASK:
        # padding may be kept: 0 > -1 holds, not False does, False or a mask broadcast along
        # the padded axis holds where that mask does (False and anything stays False)
        if any(n.op in (Op.NOT, Op.OR) or n.op in COMPARE for n in toposort([node.srcs[0]])):
            return ANY
        return NEG_INF if node.srcs[0].op is Op.INPUT or srcs[0] is not None else srcs[1]
    if op is Op.WHERE:
        a, b = srcs[1], srcs[2]
        return a if a == b else (FINITE if {a, b} <= {ZERO, FINITE, None} else ANY)
    if op is Op.MATMUL:
        return srcs[0] if srcs[0] is not None else srcs[1]
    if op in REDUCE or op in (Op.TRANSPOSE, Op.RESHAPE, Op.SLICE, Op.CONCAT):
        known = [s for s in srcs if s is not None]
        return known[0] if len(set(known)) == 1 else ANY
    return ANY


def _need(node: Node, dyn: Mapping[int, dict]) -> tuple[str, Node] | None:
    """(what the operand's padding must be, the operand) for a reduction over a dynamic
    axis; None for a node that reduces none."""
    src = node.srcs[0] if node.srcs else None
    if node.op in REDUCE:
        hit = [a for a in node.arg[0] if a in dyn.get(id(src), {})]
        if not hit:
            return None
        if node.op is Op.MEAN:
            raise DynamicShapeError(f"{node.describe()}: a mean over the "
                                    f"dynamic size {dyn[id(src)][hit[0]]} divides by it; write "
                                    "it as a sum times a 1/size input")
        return (NEG_INF if node.op is Op.MAX else ZERO), src
    if node.op is Op.MATMUL and len(src.shape) - 1 in dyn.get(id(src), {}):
        return "contract", src
    return None


@dataclass(frozen=True)
class MaskPlan:
    """Where a family's length masks go: id(family node) -> ("mask": -inf | "where": 0)."""

    graph: Graph
    axes: dict[int, dict[int, str]]
    masks: dict[int, str]


def _states(g: Graph, axes, masks) -> dict[int, str | None]:
    out: dict[int, str | None] = {}
    for node in g.nodes():
        if id(node) not in axes:
            out[id(node)] = None
            continue
        s = _state(node, [out[id(x)] for x in node.srcs])
        out[id(node)] = {"mask": NEG_INF, "where": ZERO}.get(masks.get(id(node)), s)
    return out


def _met(node: Node, need: str, states) -> bool:
    s = states[id(node.srcs[0])]
    if need != "contract":
        return s == need
    r = states[id(node.srcs[1])]
    r = FINITE if r is None else r
    return (s == ZERO and r in (ZERO, FINITE)) or (r == ZERO and s in (ZERO, FINITE))


def _producer(x: Node, axes) -> Node:
    """Walk back from ``x`` through elementwise ops with one dynamic operand."""
    while x.op in ELEMENTWISE:
        dyn = [s for s in x.srcs if id(s) in axes]
        if len(dyn) != 1:
            break
        x = dyn[0]
    return x


def plan_masks(g: Graph) -> MaskPlan:
    """Decide where family ``g``'s length masks go (see the module docstring)."""
    axes = dynamic_axes(g)
    masks: dict[int, str] = {}
    for node in g.nodes():
        need = _need(node, axes)
        if need is None or _met(node, need[0], _states(g, axes, masks)):
            continue
        x = need[1]
        tries = [(_producer(x, axes), "mask"), (_producer(x, axes), "where"),
                 (x, "mask" if need[0] == NEG_INF else "where")]
        for cand, kind in tries:
            last = len(cand.shape) - 1
            if last not in axes.get(id(cand), {}):
                continue  # a length mask runs along the last axis only
            trial = {**masks, id(cand): kind}
            if _met(node, need[0], _states(g, axes, trial)):
                masks = trial
                break
        else:
            raise DynamicShapeError(
                f"{node.describe()} reduces over a dynamic size whose "
                "padding no length mask along the last axis can hide; make that size static")
    return MaskPlan(g, axes, masks)


def padded_hint(hint: int) -> int:
    """The padded size the search plans at: the hint rounded up to a tile."""
    q = PAD_QUANTUM if hint >= PAD_QUANTUM else 16
    return -(-hint // q) * q


def planned_size(plan: MaskPlan, dim) -> int:
    """The padded size Lp0 the search plans family ``plan.graph`` at: ``padded_hint`` of
    ``dim``'s hint, moved up a tile while a static axis has that size (Lp0 names the
    dynamic dims of intermediates)."""
    lp0 = padded_hint(dim.hint)
    fixed = {n for node in plan.graph.nodes() for a, n in enumerate(node.shape)
             if a not in plan.axes.get(id(node), {})}
    while lp0 in fixed:
        lp0 += PAD_QUANTUM if dim.hint >= PAD_QUANTUM else 16
    return lp0


def padded_graph(plan: MaskPlan, padded: Mapping[str, int], lengths: Mapping[str, int]
                 ) -> Graph:
    """The family's program at padded sizes ``padded`` (each a size >= its length), with
    the length masks ``CAUSAL(1, Lp, length - 1)`` placed by ``plan``."""
    g = plan.graph
    out, new = rebuild(g, padded)
    cache: dict[tuple[str, int], Node] = {}

    def mask_for(name: str, rank: int) -> Node:
        key = (name, rank)
        if key not in cache:
            lp = padded[name]
            m = make(Op.CAUSAL, (), (1, lp, lengths[name] - 1))
            cache[key] = m if rank > 1 else make(Op.RESHAPE, (m,), (lp,))
        return cache[key]

    done: dict[int, Node] = {}
    for node in g.nodes():
        v = new[id(node)]
        if node.op not in (Op.INPUT, Op.CONST):
            srcs = tuple(done[id(s)] for s in node.srcs)
            if any(a is not b for a, b in zip(srcs, v.srcs)):
                v = make(v.op, srcs, v.arg, v.loc)
        kind = plan.masks.get(id(node))
        if kind is not None:
            dim = plan.axes[id(node)][len(node.shape) - 1]
            m = mask_for(dim, len(node.shape))
            v = make(Op.MASK, (m, v)) if kind == "mask" else make(
                Op.WHERE, (m, v, Node(Op.CONST, (), 0.0, (), v.dtype)))
        done[id(node)] = v
    result = Graph(g.name)
    result.inputs = dict(out.inputs)
    result.outputs = {n: done[id(v)] for n, v in g.outputs.items()}
    return result
