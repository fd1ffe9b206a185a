"""Compile-time constants: the ops of a Dynamo graph computed from no graph input.

T5's relative-position buckets (``arange``, their differences, ``abs``, ``log``, ``min``
and casts over int64 and float positions) and position math like it are fixed by the
graph's static sizes and the Python constants Dynamo baked into it: the backend computes
them once in torch when it compiles the graph, and the graph reads the results (buffers of
the graph module) instead. The ops that fold are pure (``PURE_FUNCTIONS``,
``PURE_METHODS``): nothing random, no in-place write, nothing that reads a graph input,
a parameter or a buffer (those may change between calls; a buffer folds only into a mask,
guarded, in ``frontend.torch_masks``), nothing whose size is symbolic (a size Dynamo
made symbolic is a graph input), and nothing the graph returns (made at each call, as in
eager torch). Each value is at most ``FOLD_LIMIT`` elements.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from ..frontend.from_torch import call_in_torch, op_name, source_line
from ..frontend.torch_masks import FOLD_LIMIT

__all__ = ["PURE_FUNCTIONS", "PURE_METHODS", "Folded", "fold_constants"]

F = torch.nn.functional
PURE_FUNCTIONS = frozenset({
    # made from Python numbers and sizes
    torch.arange, torch.full, torch.zeros, torch.ones, torch.eye, torch.tensor,
    torch.full_like, torch.zeros_like, torch.ones_like,
    # elementwise and comparisons
    torch.abs, torch.log, torch.exp, torch.sqrt, torch.floor, torch.ceil, torch.sign,
    torch.minimum, torch.maximum, torch.min, torch.max, torch.where, torch.clamp,
    torch.add, torch.sub, torch.mul, torch.div, torch.neg, torch.pow,
    torch.eq, torch.ne, torch.gt, torch.ge, torch.lt, torch.le, torch.greater, torch.less,
    torch.greater_equal, torch.less_equal, torch.logical_and, torch.logical_or,
    torch.logical_not, torch.bitwise_and, torch.bitwise_or, torch.bitwise_not,
    # reductions, scans, movement
    torch.cumsum, torch.diff, torch.sum, torch.tril, torch.triu, torch.unsqueeze,
    torch.squeeze, torch.reshape, torch.permute, torch.transpose, torch.flip, torch.cat,
    torch.stack, F.one_hot, F.pad,
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
    operator.mod, operator.neg, operator.pow, operator.lt, operator.le, operator.gt,
    operator.ge, operator.eq, operator.ne, operator.and_, operator.or_, operator.invert,
    operator.getitem,
})
PURE_METHODS = frozenset({
    "to", "float", "half", "bfloat16", "long", "int", "bool", "type_as", "abs", "log",
    "exp", "sqrt", "neg", "add", "sub", "mul", "div", "eq", "ne", "gt", "ge", "lt", "le",
    "clamp", "clamp_min", "clamp_max", "min", "max", "sum", "cumsum", "diff", "where",
    "masked_fill", "unsqueeze", "squeeze", "view", "reshape", "permute", "transpose",
    "expand", "expand_as", "contiguous", "flip", "tril", "triu", "__getitem__",
})


@dataclass
class Folded:
    """What ``fold_constants`` did to one graph: the folded ops (``name at file:line``) and
    the buffers the graph now reads in their place (by attribute name)."""

    ops: list[str] = field(default_factory=list)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)


def _pure(node: fx.Node) -> bool:
    if node.op == "call_function":
        return node.target in PURE_FUNCTIONS
    return node.op == "call_method" and node.target in PURE_METHODS


def _leaves_constant(args: Any) -> bool:
    """Whether the non-node leaves of ``args`` are plain constants (numbers, dtypes,
    devices, strings, None, slices and tuples of them): no symbolic size."""
    if isinstance(args, (tuple, list)):
        return all(_leaves_constant(a) for a in args)
    if isinstance(args, dict):
        return all(_leaves_constant(a) for a in args.values())
    if isinstance(args, slice):
        return _leaves_constant((args.start, args.stop, args.step))
    return args is None or isinstance(args, (bool, int, float, str, torch.dtype, torch.device,
                                             torch.memory_format, torch.layout, fx.Node))


def _value(node: fx.Node, known: dict[fx.Node, torch.Tensor]) -> torch.Tensor | None:
    """``node``'s value in torch when it is a pure op of known values and constants."""
    if not _pure(node) or not all(s in known for s in node.all_input_nodes) or \
            not _leaves_constant((node.args, node.kwargs)):
        return None
    try:
        value = call_in_torch(node, known.__getitem__)
    except Exception:  # noqa: BLE001 - torch refuses these arguments: not folded
        return None
    if not isinstance(value, torch.Tensor) or value.numel() > FOLD_LIMIT or \
            value.requires_grad or type(value) is not torch.Tensor:
        return None
    return value


def fold_constants(gm: fx.GraphModule, prefix: str = "_eqsat_mirage_folded_") -> Folded:
    """Compute every op of ``gm`` that reads no graph input (see the module docstring) in
    torch now, and make the graph read the values that its other ops (or its outputs) use
    as buffers of ``gm`` (``prefix`` + a number), with the recorded metadata of the op they
    replace; the folded ops leave the graph. Returns what was folded."""
    known: dict[fx.Node, torch.Tensor] = {}
    for node in gm.graph.nodes:
        value = _value(node, known)
        if value is not None:
            known[node] = value
    # what the graph returns is made at each call, as in eager torch: a buffer (or a view
    # of one) returned would be the same tensor at every call, for the caller to write to
    stack = [n for n in gm.graph.nodes if n.op == "output"]
    while stack:
        for src in stack.pop().all_input_nodes:
            if src in known:
                del known[src]
                stack.append(src)
    out = Folded()
    if not known:
        return out
    frontier = [n for n in known if any(u not in known for u in n.users)]
    for k, node in enumerate(frontier):
        name = f"{prefix}{k}"
        while hasattr(gm, name):
            name += "_"
        value = known[node].detach().clone()
        gm.register_buffer(name, value, persistent=False)
        with gm.graph.inserting_before(node):
            attr = gm.graph.get_attr(name)
        attr.meta = dict(node.meta)
        node.replace_all_uses_with(attr)
        out.buffers[name] = value
    for node in reversed(list(known)):  # users first: each has none left when erased
        if not node.users:
            loc = source_line(node)
            out.ops.append(op_name(node, gm) + (f" at {loc.split(' (`')[0]}" if loc else ""))
            gm.graph.erase_node(node)
    out.ops.reverse()
    gm.recompile()
    return out
