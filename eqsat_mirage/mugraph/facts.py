"""MuGraph facts: the static analyses the verifier needs and the reference graph.

The static facts (exp depth for the Lax check, degrees for the verifier's
false-positive bound) are folded through the tiled computation itself: tile
ops at tile shapes, accumulators as sums of F terms. The reference graph is
the kernel-level algebra: predefined ops, and for a custom kernel its
``source`` fragment (or, without one, its block graph with the tiling removed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ..frontend.graph import Graph
from ..ir.check import check, masked_fact
from ..ir.errors import LaxError, ShapeError
from ..ir.node import OPAQUE, Node, Op, fmt_shape, make
from ..ir.ops import SPECS
from ..verifier.bound import (
    FRESH,
    BitFact,
    Degree,
    accumulated,
    bit_fact,
    node_degree,
    unit_axes,
)
from .kernels import (
    CustomKernel,
    KernelGraph,
    MuGraphError,
    PredefinedKernel,
)

# -- static facts folded through the tiled computation --------------------------------------


def _fold_graph(graph: Graph, leaves: Mapping[str, Any], on_node: Callable) -> dict[int, Any]:
    facts: dict[int, Any] = {}
    for n in graph.nodes():
        facts[id(n)] = leaves[n.arg] if n.op is Op.INPUT else on_node(
            n, [facts[id(s)] for s in n.srcs])
    return facts


def fold(mg: KernelGraph, leaf: Any, on_node: Callable, on_acc: Callable,
         on_write: Callable | None = None, on_tile: Callable | None = None) -> dict[str, Any]:
    """Fold a per-node fact through every kernel; returns the facts of all device tensors.

    ``on_node(kernel, stage, node, operand_facts)``; ``on_acc(kernel, fact)`` turns a loop
    value's fact into its accumulator's (a sum over ``kernel.forloop`` iterations);
    ``on_write(kernel, block_output, fact)`` (if given) turns a tile's fact into the fact of
    the device tensor the tiles are written to; ``on_tile(kernel, block_input, fact)`` (if
    given) turns a device tensor's fact into its tiles'.
    """
    env = {name: leaf for name in mg.inputs}
    for k in mg.kernels:
        if isinstance(k, PredefinedKernel):
            frag = Graph(k.name)
            frag.outputs = {k.output: k.node}
            facts = _fold_graph(frag, env, lambda n, fs, k=k: on_node(k, "kernel", n, fs))
            env[k.output] = facts[id(k.node)]
            continue
        tiles = {bi.name: env[bi.tensor] if on_tile is None else on_tile(k, bi, env[bi.tensor])
                 for bi in k.inputs.values()}
        node_fact = (lambda n, fs, k=k: on_node(k, "loop", n, fs))
        maxima = _running(k, tiles, node_fact)
        loop = _fold_graph(k.loop, {**tiles, **{f"{a}_run": f for a, f in maxima.items()}},
                           node_fact)
        accs = {a: maxima[a] if a in maxima else on_acc(k, _rescaled(k, a, loop, maxima,
                                                                     node_fact))
                for a in k.accumulators}
        post = _fold_graph(k.post, {**tiles, **accs},
                           lambda n, fs, k=k: on_node(k, "post", n, fs))
        for t, bo in k.outputs.items():
            fact = (loop if bo.stage == "loop" else post)[id(k.output_node(t))]
            env[t] = fact if on_write is None else on_write(k, bo, fact)
    return env


def _running(k: CustomKernel, tiles: Mapping[str, Any], node_fact: Callable) -> dict:
    """Max accumulator -> the fact of its running value: a max over the loop values, which
    read only tiles (validated)."""
    if not k.maxima:
        return {}
    g = Graph(f"{k.name}.maxima")
    g.outputs = {a: k.loop.outputs[a] for a in k.maxima}
    facts = _fold_graph(g, tiles, node_fact)
    out = {}
    for a in k.maxima:
        v = k.loop.outputs[a]
        pair = Node(Op.INPUT, (), a, v.shape + (2,), v.dtype)
        out[a] = node_fact(Node(Op.MAX, (pair,), ((len(v.shape),), False), v.shape, v.dtype),
                           [facts[id(v)]])
    return out


def _rescaled(k: CustomKernel, acc: str, loop: Mapping[int, Any], maxima: Mapping,
              node_fact: Callable) -> Any:
    """The fact of a loop value as accumulated: times exp(m_old - m_new) when a running
    maximum rescales it (the exp of a difference of two maxima)."""
    value = k.loop.outputs[acc]
    fact = loop[id(value)]
    rescaled = k.rescaled()
    if acc not in rescaled:
        return fact
    m = k.loop.outputs[rescaled[acc]]
    sub = Node(Op.SUB, (m, m), None, m.shape, "float32")
    ex = Node(Op.EXP, (sub,), None, m.shape, "float32")
    mf = maxima[rescaled[acc]]
    factor = node_fact(ex, [node_fact(sub, [mf, mf])])
    return node_fact(Node(Op.MUL, (value, ex), None, value.shape, "float32"), [fact, factor])


def check_lax(mg: KernelGraph, what: str = "program") -> None:
    """Raise ``LaxError`` if a path through the tiles takes exp of an exp result."""
    def depth(k, stage, node, ds):
        d = max(ds, default=0) + (node.op is Op.EXP)
        if d > 1:
            where = f"kernel {k.name!r}" + (f", {stage} stage" if stage != "kernel" else "")
            raise LaxError(f"{what} {mg.name!r} is not a Lax program: {where}: "
                           f"{node.describe()} takes exp of a value that already went through "
                           "exp; the finite-field verifier cannot decide equivalence for it")
        return d
    fold(mg, 0, depth, lambda k, d: d)

    def masked_acc(k, fact):
        if fact:
            raise LaxError(f"{what} {mg.name!r}: kernel {k.name!r} sums a masked value")
        return fact
    env = fold(mg, False, lambda k, stage, n, fs: masked_fact(n, fs, what), masked_acc)
    for name, t in mg.output_tensors.items():
        if env[t]:
            raise LaxError(f"{what} {mg.name!r}: output {name!r} holds -inf where masked")


def _tile_degree(k: CustomKernel, bi, f: tuple) -> tuple:
    """A tile's degree fact with what its values and its denominator vary with across
    blocks and iterations: ``("grid", axis)`` for each grid axis that cuts it, ``"loop"``
    when the loop does; the denominator only where the tensor's is not one function along
    the cut dim. A dim in both maps (a split reduction's loop inside each split) is cut by
    both: its tile varies with the grid axis and with the loop."""
    d = f[0]
    cuts = [(ax, ("grid", g)) for ax, g in bi.imap.items()]
    if bi.fmap is not None:
        cuts.append((bi.fmap, "loop"))
    return (d, frozenset(v for _, v in cuts),
            frozenset(v for ax, v in cuts if not d.common(ax)))


def _node_degree(k, stage, n: Node, fs: list[tuple]) -> tuple:
    """A tile op's degree fact and variation: its values vary with whatever an operand's
    do; its denominator with what the operands' denominators do, and with all of a value
    that becomes one (a divisor, rsqrt's argument: the only ops that make a denominator)."""
    d = node_degree(n, [f[0] for f in fs])
    every = frozenset().union(*(f[1] for f in fs))
    if d.den == 0:
        return (d, every, frozenset())
    den = frozenset().union(*(f[2] for f in fs))
    if n.op is Op.DIV:
        den |= fs[1][1]
    elif n.op in OPAQUE and SPECS[n.op].reciprocal_of is not None:
        den |= fs[0][1]
    return (d, every, den)


def degrees(mg: KernelGraph) -> dict[str, Degree]:
    """Degree facts (see ``verifier/bound.py``) of each output, from the tiled computation.

    An accumulator sums F loop values read from different tiles: their denominators are
    distinct (the worst case) unless the loop value's denominator reads no tile the loop
    cuts along a dim where that tile's denominator varies (a row's RMS computed before the
    loop, a tensor whose denominator is one function along the cut dim). A tile's
    common-denominator axes survive into its device tensor along a dim the grid or the
    loop splits only when its denominator does not vary with that grid axis or the loop.
    """
    def acc(k, f):
        d, every, den = f
        return (accumulated(d, k.forloop, shared="loop" not in den),
                every - {"loop"}, den - {"loop"})

    def write(k, bo, f):
        d, _, den = f
        if d.den == 0:
            return (d, frozenset(), frozenset())
        split = {ax for ax, g in bo.omap.items() if ("grid", g) in den}
        if bo.fmap is not None and "loop" in den:
            split.add(bo.fmap)
        shape = k.output_specs()[bo.tensor].shape
        return (replace(d, inv=(d.inv - split) | unit_axes(shape),
                        groups=tuple((ax, g) for ax, g in d.groups if ax not in split)),
                frozenset(), frozenset())

    leaf = (FRESH, frozenset(), frozenset())
    env = fold(mg, leaf, _node_degree, acc, write, _tile_degree)
    return {name: env[t][0] for name, t in mg.output_tensors.items()}


def bit_degrees(mg: KernelGraph) -> dict[str, int]:
    """The bit degree (``verifier.bound.BitFact.k``) of each output, folded through the
    tiled computation exactly as the tiles compute it: kernel by kernel, each device tensor
    carrying its facts to the kernels that read it (a tile's element is its tensor's),
    through the loop and post block graphs and predefined kernels' nodes. An accumulator is
    a sum over the iterations (the loop value's degree; its elements combine, so its bits
    are no longer counted); a running maximum's rescaling, exp(m_old - m_new), multiplies
    the value it rescales (their degrees add: an over-estimate where the max carries bits)."""
    def acc(k, f: BitFact) -> BitFact:
        return f if not f.bits else BitFact(f.degree, None)

    env = fold(mg, BitFact(), lambda k, stage, n, fs: bit_fact(n, fs), acc)
    return {name: env[t].k for name, t in mg.output_tensors.items()}


# -- the reference graph --------------------------------------------------------------------


def _rebuild(graph: Graph, leaves: Mapping[str, Node]) -> dict[str, Node]:
    new: dict[int, Node] = {}
    for n in graph.nodes():
        if n.op is Op.INPUT:
            new[id(n)] = leaves[n.arg]
        elif n.op is Op.CONST:
            new[id(n)] = n
        else:
            new[id(n)] = make(n.op, tuple(new[id(s)] for s in n.srcs), n.arg, n.loc)
    return {name: new[id(n)] for name, n in graph.outputs.items()}


def _untile(k: CustomKernel, env: Mapping[str, Node]) -> dict[str, Node]:
    """The block graph with every tile replaced by its whole tensor (for kernels without source)."""
    tiles = {bi.name: env[bi.tensor] for bi in k.inputs.values()}
    if k.running_inputs():  # an online softmax's m_run: a value of the iteration, not a tile
        raise MuGraphError(f"kernel {k.name!r} has no source and its block graph reads the "
                           f"running maxima {sorted(k.running_inputs())}, which do not untile; "
                           "give the kernel a source Graph")
    try:
        loop = _rebuild(k.loop, tiles)
        post = _rebuild(k.post, {**tiles, **{a: loop[a] for a in k.accumulators}})
    except ShapeError as exc:
        raise MuGraphError(f"kernel {k.name!r} has no source and its block graph does not "
                           f"untile ({exc}); give the kernel a source Graph") from None
    out = {}
    for t, spec in k.output_specs().items():
        node = (loop if k.outputs[t].stage == "loop" else post)[t]
        if node.shape != spec.shape:
            raise MuGraphError(f"kernel {k.name!r} has no source and its untiled output {t!r} "
                               f"is {fmt_shape(node.shape)}, not {fmt_shape(spec.shape)}; give "
                               "the kernel a source Graph")
        out[t] = node
    return out


def reference(mg: KernelGraph) -> Graph:
    """The kernel-level Graph computed by ``mg`` (validated by the caller)."""
    g = Graph(f"{mg.name}.reference")
    for name, node in mg.inputs.items():
        g.input(name, node.shape, node.dtype)
    env: dict[str, Node] = dict(g.inputs)
    for k in mg.kernels:
        if isinstance(k, PredefinedKernel):
            frag = Graph(k.name)
            frag.outputs = {k.output: k.node}
            env.update(_rebuild(frag, env))
        elif k.source is not None:
            env.update(_rebuild(k.source, env))
        else:
            env.update(_untile(k, env))
    g.outputs = {name: env[t] for name, t in mg.output_tensors.items()}
    check(g)
    return g
