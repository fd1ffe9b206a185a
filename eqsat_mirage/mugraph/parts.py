"""Which parts of a field value a MuGraph's tiled run needs (docs/verifier.md, section 1).

A field value is a pair (Z_p part, Z_q part); the q part is needed only where an exp
reads it, and the p part only where an output depends on it. ``needs_q`` and ``needs_p``
walk the kernels' staged programs (``tiled.plans``) from the outputs back, through every
kernel, accumulator and tile, and give the ids of the (vectorised) nodes whose part is
used: the tiled interpreter computes only those (``tiled.evaluate_field``), and the memory
estimate counts only those (``mugraph/memory.py``).
"""

from __future__ import annotations

from ..ir.node import Node, Op
from ..semantics.field import back_p
from .kernels import KernelGraph, PredefinedKernel


def _back(nodes: list[Node], needed: set[int]) -> None:
    for node in reversed(nodes):
        if node.op is Op.EXP or id(node) in needed:
            needed.update(id(s) for s in node.srcs)


def _epilogue_reads(plan, needed: set[int]) -> set[str]:
    """The tiles a custom kernel's epilogue reads whose part is needed; an accumulator it
    reads marks the loop output and the sum behind it as needed instead."""
    tiles = set()
    for n in plan.post.nodes():
        if n.op is Op.INPUT and id(n) in needed:
            if n.arg in plan.adds:
                needed.update((id(plan.loop.outputs[n.arg]), id(plan.adds[n.arg])))
            else:
                tiles.add(n.arg)
    return tiles


def needs_q(mg: KernelGraph, plans: list) -> set[int]:
    """Ids of the (vectorised) nodes whose Z_q part some exp reads, across all kernels."""
    needed: set[int] = set()
    q_tensors: set[str] = set()
    for k, plan in reversed(list(zip(mg.kernels, plans))):
        if isinstance(k, PredefinedKernel):
            if k.output in q_tensors:
                needed.add(id(k.node))
            _back(plan.nodes(), needed)
            q_tensors.update(n.arg for n in plan.nodes() if n.op is Op.INPUT and id(n) in needed)
            continue
        for t, bo in k.outputs.items():
            if t in q_tensors:
                stage = plan.loop if bo.stage == "loop" else plan.post
                needed.add(id(stage.outputs[t]))
        _back(plan.post.nodes(), needed)
        tiles = _epilogue_reads(plan, needed)
        if plan.online is not None:  # a running maximum is keyed on its values: both parts
            needed.update(id(plan.loop.outputs[a]) for a in k.maxima)
        _back(plan.loop.nodes(), needed)
        tiles.update(n.arg for n in plan.loop.nodes() if n.op is Op.INPUT and id(n) in needed)
        q_tensors.update(k.inputs[name].tensor for name in tiles if name in k.inputs)
        if plan.online is not None:
            on = plan.online
            needed.update(id(n) for a in k.maxima for n in (on.combine[a],))
            for acc, (sub, ex, mul) in on.scale.items():
                needed.update((id(sub), id(ex)))
                if id(plan.loop.outputs[acc]) in needed:
                    needed.add(id(mul))
    needed.update(id(node) for name, node in mg.inputs.items() if name in q_tensors)
    return needed


def needs_p(mg: KernelGraph, plans: list, q_ids: set[int]) -> set[int]:
    """Ids of the (vectorised) nodes whose Z_p part is used (``field.back_p``), across all
    kernels: what the outputs read, back through every kernel, accumulator and tile."""
    needed: set[int] = set()
    p_tensors = set(mg.output_tensors.values())
    for k, plan in reversed(list(zip(mg.kernels, plans))):
        if isinstance(k, PredefinedKernel):
            if k.output in p_tensors:
                needed.add(id(k.node))
            back_p(plan.nodes(), needed, q_ids)
            p_tensors.update(n.arg for n in plan.nodes() if n.op is Op.INPUT and id(n) in needed)
            continue
        for t, bo in k.outputs.items():
            if t in p_tensors:
                needed.add(id((plan.loop if bo.stage == "loop" else plan.post).outputs[t]))
        back_p(plan.post.nodes(), needed, q_ids)
        tiles = _epilogue_reads(plan, needed)
        if plan.online is not None:
            needed.update(id(plan.loop.outputs[a]) for a in k.maxima)
            needed.update(id(n) for n in plan.online.synthetic())
        back_p(plan.loop.nodes(), needed, q_ids)
        tiles.update(n.arg for n in plan.loop.nodes() if n.op is Op.INPUT and id(n) in needed)
        p_tensors.update(k.inputs[name].tensor for name in tiles if name in k.inputs)
    needed.update(id(node) for name, node in mg.inputs.items() if name in p_tensors)
    return needed
