"""Which fx nodes may join an optimized partition, and which graphs stay eager as a whole.

``NodeSupport`` is the ``torch.compile`` backend's operator support for torch.fx's
``CapabilityBasedPartitioner``: a node is supported when the ``Converter`` (the table
``from_torch`` uses) turns it into the shape and dtype Dynamo recorded, and otherwise it
keeps the reason it runs eagerly. ``mutation`` finds the in-place write that keeps a whole
graph eager; ``served`` gives a converted input its shape with the family sizes as ``em.Dim``.
``buffer_constants`` finds the graph inputs that are module buffers (nanoGPT's causal mask
``bias``): the constants that comparisons are folded from (``frontend.torch_masks``).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx
from torch.fx.passes.operator_support import OperatorSupportBase

from ..frontend.from_torch import Converter, op_name, source_line
from ..frontend.graph import Graph, Tensor
from ..frontend.quantized import dequantized, is_wrapped
from ..frontend.torch_masks import FOLD_LIMIT, BoolMask, Snapshot, constant_mask
from ..frontend.torch_movement import Empty, index_with_tensor
from ..ir.errors import MirageError, unexpected
from ..ir.limits import search_weight
from ..ir.node import Op, located
from .specs import SymbolicSizes, computes, empty, recorded, size_expr

__all__ = ["CONSTANTS", "NodeSupport", "buffer_constants", "constant_input", "mutation",
           "retarget_tensor_indexing", "served", "symbolic_view_sizes"]

CONSTANTS = "eqsat_mirage_constants"  # gm.meta key: {placeholder target: its buffer's tensor}


def _spec_tensor(value: Tensor | BoolMask) -> tuple[tuple[int, ...], str]:
    """The shape and dtype of a converted value, as ``SymbolicSizes.spec`` gives them."""
    return tuple(value.shape), value.dtype


def buffer_constants(gm: fx.GraphModule, example_inputs: list) -> dict[str, torch.Tensor]:
    """The placeholders of a Dynamo graph that are module buffers (Dynamo's source of the
    input names ``._buffers[...]``), by target, with their tensors: what a comparison may be
    folded from. Parameters and the caller's inputs are never folded."""
    out = {}
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, value in zip(places, example_inputs):
        arg = node.meta.get("grapharg")
        source = getattr(arg, "source", None)
        name = getattr(source, "name", "")
        name = name() if callable(name) else str(name)
        if "._buffers[" in name and isinstance(value, torch.Tensor) and \
                not isinstance(value, torch.nn.Parameter) and not value.requires_grad and \
                value.numel() <= FOLD_LIMIT:
            out[str(node.target)] = value
    return out


def constant_input(cv: Converter, node: fx.Node, name: str, shape: tuple, dtype: str,
                   source: tuple, value: torch.Tensor | None) -> Tensor | BoolMask:
    """Convert a graph input: a ``cv.input`` of ``shape`` and ``dtype`` fed from ``source``;
    with a known constant ``value``, a bool one is its folded mask (guarded: the input must
    hold ``value`` at each call) and a float one an input the converter folds comparisons
    of (``Converter.constant``). A quantized weight (a wrapper tensor, Dynamo's recorded
    value) is its dequantization from inputs for its parts (``quantized.dequantized``).
    The input's place is the user's line that made the value (not torch's partitioner)."""
    with located(source_line(node).split(" (")[0] or "an argument of the graph"):
        return _input(cv, node, name, shape, dtype, source, value)


def _input(cv: Converter, node: fx.Node, name: str, shape: tuple, dtype: str,
           source: tuple, value: torch.Tensor | None) -> Tensor | BoolMask:
    if is_wrapped(recorded(node)):
        return dequantized(cv.input, name, recorded(node), source, node.name)
    if value is not None and value.dtype == torch.bool:
        cv.snapshots.setdefault(source, Snapshot(value))
        return constant_mask(cv.graph, value, name, cv.input)
    t = cv.input(name, shape, dtype, source)
    if value is not None:
        cv.constant(node, value, source)
    return t


class NodeSupport(OperatorSupportBase):
    """A node is supported when the Converter turns it into the shape and dtype Dynamo saw."""

    def __init__(self, gm: fx.GraphModule, sizes: SymbolicSizes) -> None:
        self.gm, self.sizes = gm, sizes
        self.reasons: dict[fx.Node, str | None] = {}
        self.weights: dict[fx.Node, float] = {}  # a supported node's ``search_weight``
        self._constants = dict(gm.meta.get(CONSTANTS, {}))
        self._known: dict[fx.Node, torch.Tensor] = {}
        self.aliased = returned_views(gm)
        self.fold_all(gm)

    def fold_all(self, gm: fx.GraphModule) -> None:
        """Fold, in graph order, every op of ``gm`` computed from constants alone (the
        partitioner may recreate nodes: the fused graph is folded again)."""
        if not self._constants:
            return
        fold = Converter(Graph("fold"), gm)
        for node in gm.graph.nodes:
            if node.op == "placeholder" and str(node.target) in self._constants:
                self._known[node] = self._constants[str(node.target)]
            srcs = node.all_input_nodes
            if node not in self._known and node.op in ("call_function", "call_method") and \
                    srcs and all(s in self._known for s in srcs):
                for s in srcs:
                    fold.env[s] = fold.known[s] = self._known[s]
                value = fold.fold(node)
                if value is not None:
                    self._known[node] = value

    def known(self, node: fx.Node) -> torch.Tensor | None:
        """The value of a node computed from buffer constants alone (every tensor operand
        one), or None: a mask the converter folds."""
        return self._known.get(node)

    def reason(self, node: fx.Node) -> str | None:
        """Why ``node`` is not supported, or None if it is."""
        if node not in self.reasons:
            self.reasons[node] = self._probe(node)
        return self.reasons[node]

    def weight(self, node: fx.Node) -> float:
        """The expected search cost of a supported node: ``limits.search_weight`` of the
        eqsat-mirage ops it converts to (an SDPA's matmuls, max and sum; a folded mask: 0)."""
        self.reason(node)
        return self.weights.get(node, 0.0)

    def is_node_supported(self, submodules: Any, node: fx.Node) -> bool:
        """The partitioner's question: may ``node`` join a partition?"""
        return node.op in ("call_function", "call_method", "call_module") and \
            self.reason(node) is None

    def _probe(self, node: fx.Node) -> str | None:
        if node.op not in ("call_function", "call_method", "call_module"):
            return f"{node.op} node"
        if node in self.aliased:
            return ("a view the graph returns of a graph input or of another output: eager, so "
                    "it aliases that tensor as in eager torch (a partition writes a copy)")
        cv = Converter(Graph("probe"), self.gm)
        try:
            cv.lookup(node)
        except (MirageError, AttributeError):
            return "no eqsat-mirage form (unsupported op)"
        if (empty(node) or any(empty(src) for src in node.all_input_nodes)) and \
                not _empty_flows(node):
            return "a zero-size tensor (e.g. an empty KV cache): nothing to compute"
        sizes = self.sizes
        why = sizes.reason(node)
        if why:
            return why
        want, several = sizes.spec(node), sizes.tuple_spec(node)
        if want is None and several is None:
            return "its result is not a float16/bfloat16/float32 tensor"
        specs = [(sizes.spec(src), sizes.tuple_spec(src)) for src in node.all_input_nodes]
        dims = sizes.dims([d for spec, parts in specs for sp in ([spec] if spec else parts or [])
                           for d in sp[0]])
        for src, (spec, parts) in zip(node.all_input_nodes, specs):
            if spec is not None and 0 in spec[0]:  # an empty slice: flows into a cat
                cv.env[src] = Empty(tuple(spec[0]), spec[1])
                continue
            if spec is None and parts is None:
                scalar = sizes.scalar(src)  # a float Dynamo made symbolic: a constant here
                if scalar is None:
                    return f"operand {src.name!r} is not a float tensor"
                cv.env[src] = scalar
                continue
        try:
            for i, (src, (spec, parts)) in enumerate(zip(node.all_input_nodes, specs)):
                if src not in cv.env:
                    cv.env[src] = constant_input(cv, src, f"x{i}", served(spec[0], dims),
                                                 spec[1], ("arg", i), self.known(src)) \
                        if spec else tuple(cv.input(f"x{i}_{j}", served(p[0], dims), p[1],
                                                    ("arg", i)) for j, p in enumerate(parts))
            value = cv.run(node)
        except MirageError as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - any failure: the node stays eager
            if unexpected(exc):
                raise
            return f"{type(exc).__name__}: {exc}"
        self.weights[node] = search_weight(_converted(value))
        if want is None:  # a tuple of tensors: each as torch gives it
            got = [_spec_tensor(v) if isinstance(v, Tensor) else None for v in value] \
                if isinstance(value, (tuple, list)) else None
            torch_gives = [(sizes.concrete(p[0]), p[1]) for p in several]
            if got != torch_gives:
                return f"converted to {got}, torch gives {torch_gives}"
            return None
        torch_gives = (sizes.concrete(want[0]), want[1])
        if isinstance(value, Empty) and (value.shape, value.dtype) == torch_gives:
            return None
        if isinstance(value, bool) and torch_gives == ((), "bool"):  # a constant, folded
            # where it is combined (``x.new_ones((), dtype=torch.bool)``): only there, and
            # only True by an and, False by an or (``torch_masks.combine``)
            if all(u.target in (_ANDS if value else _ORS) for u in node.users):
                return None
            return (f"a constant {value} read other than by "
                    f"{'&' if value else '|'} (it stays a tensor, eagerly)")
        if not isinstance(value, (Tensor, BoolMask)) or _spec_tensor(value) != torch_gives:
            got = _spec_tensor(value) if isinstance(value, (Tensor, BoolMask)) else \
                type(value).__name__
            return f"converted to {got}, torch gives {torch_gives}"
        return None


_CATS = frozenset({torch.cat, torch.concat, torch.concatenate})
# the targets of an and / an or of two masks (a constant True / False folds into them)
_ANDS = (operator.and_, operator.iand, torch.logical_and, torch.bitwise_and, "__and__",
         "__iand__", "logical_and", "bitwise_and")
_ORS = (operator.or_, operator.ior, torch.logical_or, torch.bitwise_or, "__or__", "__ior__",
        "logical_or", "bitwise_or")


def _storage(value: Any) -> Any:
    """A key of the storage of a recorded (fake) tensor, None for anything else."""
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return torch.multiprocessing.reductions.StorageWeakRef(value.untyped_storage())
    except (RuntimeError, NotImplementedError):  # a tensor without storage
        return None


def returned_views(gm: fx.GraphModule) -> set[fx.Node]:
    """The nodes that must run eagerly for the graph's outputs to alias as in eager torch:
    every node after the first that shares the storage (as Dynamo recorded it) of an output
    that shares it with a graph input or with another output (``x.t()``, ``x[1:3]``, ``h``
    and ``h.t()``). A partition writes its outputs to fresh tensors, so a view it computed
    would be a copy, and a caller's later write to the input would not show through it."""

    first: dict[Any, fx.Node] = {}  # storage -> the node that made it (or the input)
    nodes: dict[Any, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        key = _storage(recorded(node))
        if key is not None:
            first.setdefault(key, node)
            nodes.setdefault(key, []).append(node)
    outs: list[fx.Node] = []
    for node in gm.graph.nodes:
        if node.op == "output":
            fx.node.map_arg(node.args, outs.append)
    shared, seen = set(), {}  # seen: storage -> the first output on it
    for o in outs:
        key = _storage(recorded(o))
        if key is None:
            continue
        base = first[key]
        if (base.op == "placeholder" and base is not o) or seen.get(key, o) is not o:
            shared.add(key)
        seen.setdefault(key, o)
    return {n for key in shared for n in nodes[key][1:] if n.op != "placeholder"}


def _converted(value: Any) -> list:
    """The eqsat-mirage nodes a probe's conversion made (up to the probe's inputs)."""
    stack = [v.node for v in (value if isinstance(value, (tuple, list)) else [value])
             if isinstance(v, Tensor)]
    seen: dict[int, Any] = {}
    while stack:
        n = stack.pop()
        if id(n) in seen or n.op is Op.INPUT:
            continue
        seen[id(n)] = n
        stack += list(n.srcs)
    return list(seen.values())


def _empty_flows(node: fx.Node) -> bool:
    """Whether the zero-size tensors at ``node`` flow through a partition: an empty slice
    of a tensor with elements (a full rotary embedding's pass-through half, ``q[..., 64:]``)
    read only by ``torch.cat``, which drops it; or such a cat. A zero-size tensor from
    anywhere else (an empty KV cache) stays eager."""
    def empty_slice(n: fx.Node) -> bool:
        return n.op == "call_function" and n.target is operator.getitem and empty(n) and \
            not any(empty(s) for s in n.all_input_nodes) and bool(n.users) and \
            all(u.op == "call_function" and u.target in _CATS for u in n.users)

    if empty_slice(node):
        return True
    return node.op == "call_function" and node.target in _CATS and not empty(node) and \
        all(empty_slice(s) for s in node.all_input_nodes if empty(s))


def served(shape: tuple, dims: dict) -> tuple:
    """``shape`` (ints and family sizes) with each family size as its ``em.Dim`` (``dims``:
    ``SymbolicSizes.dims``), as a converted input declares it."""
    return tuple(d if isinstance(d, int) else dims[d] for d in shape)


_INPLACE = frozenset({operator.iadd, operator.isub, operator.imul, operator.itruediv,
                      operator.ipow, operator.imatmul, operator.setitem, operator.iand,
                      operator.ior, operator.ixor, operator.ifloordiv, operator.imod,
                      operator.ilshift, operator.irshift})


def mutation(gm: fx.GraphModule) -> fx.Node | None:
    """The first node that mutates a tensor in place (``x.add_``, ``+=``, ``inplace=True``)."""
    for n in gm.graph.nodes:
        if n.op == "call_method":
            name = str(n.target)
        elif n.op == "call_function":
            if n.target in _INPLACE or n.kwargs.get("inplace") is True or "out" in n.kwargs:
                return n
            if isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable:
                return n
            if getattr(n.target, "__module__", None) in ("_operator", "operator"):
                continue  # operator.and_, or_, not_ ... are pure; their in-place forms are above
            name = getattr(n.target, "__name__", "")
        elif n.op == "call_module":
            mod = gm.get_submodule(n.target)
            if getattr(mod, "inplace", False) is True:
                return n
            continue
        else:
            continue
        if name.endswith("_") and not name.startswith("__"):
            return n
    return None


def retarget_tensor_indexing(gm: fx.GraphModule) -> int:
    """Make every ``operator.getitem`` whose index holds a tensor (``w[i]``, ``x[:, idx]``)
    a call of ``torch_movement.index_with_tensor`` (the same ``x[index]``); returns how
    many. torch.fx's partitioner moves a ``getitem`` into the partition of a producer whose
    users are all ``getitem``s, again until nothing moves: where every user of ``w`` and
    every user of ``i`` is ``w[i]`` it moves it between their two partitions forever (torch
    2.13, ``CapabilityBasedPartitioner.propose_partitions``). So is an indexing of a float
    graph input (``s[:, None]`` of a scale buffer): the partitioner keeps a ``getitem`` with its
    source, and an input is in no partition, so the view stayed eager, counted as an op
    left out. A tuple's ``getitem`` keeps its target: the partitioner places those with
    their tuple."""
    changed = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not operator.getitem or \
                len(node.args) != 2:
            continue
        found: list[fx.Node] = []
        fx.node.map_arg(node.args[1], found.append)
        source = node.args[0]
        if any(isinstance(recorded(n), torch.Tensor) for n in found) or (
                isinstance(source, fx.Node) and source.op == "placeholder"
                and isinstance(recorded(source), torch.Tensor)
                and recorded(source).is_floating_point()):
            node.target = index_with_tensor
            changed += 1
    if changed:
        gm.recompile()
    return changed


_EXPANDS = ("expand",)
_RESHAPES = ("reshape", "view")


def symbolic_view_sizes(gm: fx.GraphModule, symbols: set) -> int:
    """Give -1 in place of each size argument of an ``expand``, ``reshape`` or ``view`` that
    is a symbolic size computed in the graph (a ``SymInt`` node: ``s87 + 1``, a
    ``sym_sum``) where -1 means the same for every value of the symbols: an ``expand`` size
    whose expression is its operand's size on that axis (``repeat_kv``'s
    ``expand(b, kv_heads, n_rep, slen, head_dim)`` of a KV cache whose length is ``slen``),
    and the one symbolic size of a ``reshape`` or ``view`` without a -1 (its other sizes
    plain ints); returns how many nodes changed. Only sizes of ``symbols`` change (the
    family's and the specialized ones, ``SymbolicSizes``: a decode step's KV cache, held at
    its length, is searched again as a family when the length moves, and SDPA reads
    ``repeat_kv``'s keys without their copies). A SymInt operand is no tensor, so such a
    view stayed eager; the SymInt nodes left without users are removed."""
    changed = 0
    for node in gm.graph.nodes:
        name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
        if node.op not in ("call_method", "call_function") or \
                name not in _EXPANDS + _RESHAPES or not node.args:
            continue
        packed = len(node.args) == 2 and isinstance(node.args[1], (tuple, list))
        sizes = list(node.args[1] if packed else node.args[1:])
        new = _inferred(node.args[0], sizes, name in _EXPANDS, symbols)
        if new is not None:
            node.args = (node.args[0], tuple(new)) if packed else (node.args[0], *new)
            changed += 1
    if changed:
        for node in reversed(list(gm.graph.nodes)):
            if node.op == "call_function" and not node.users and \
                    isinstance(recorded(node), torch.SymInt):
                gm.graph.erase_node(node)
        gm.recompile()
    return changed


def _inferred(source: Any, sizes: list, expand: bool, symbols: set) -> list | None:
    """``sizes`` with -1 for the symbolic size nodes of ``symbols`` that -1 means
    exactly (see ``symbolic_view_sizes``), or None when none does."""
    x = recorded(source) if isinstance(source, fx.Node) else None
    symbolic = [i for i, a in enumerate(sizes) if isinstance(a, fx.Node)]
    if not isinstance(x, torch.Tensor) or not symbolic or not all(
            isinstance(recorded(sizes[i]), torch.SymInt)
            and size_expr(recorded(sizes[i])).free_symbols <= symbols for i in symbolic):
        return None
    if any(isinstance(a, int) and a == 0 for a in sizes):
        return None  # with a 0 among the sizes a -1 is ambiguous
    new = list(sizes)
    if expand:
        lead = len(sizes) - x.dim()
        for i in symbolic:
            d = x.shape[i - lead] if i >= lead else None
            if isinstance(d, torch.SymInt) and \
                    size_expr(d) == size_expr(recorded(sizes[i])):
                new[i] = -1
    elif len(symbolic) == 1 and -1 not in sizes and \
            all(isinstance(a, int) for i, a in enumerate(sizes) if i not in symbolic):
        new[symbolic[0]] = -1
    return new if new != sizes else None


def left_out(gm: fx.GraphModule, support: NodeSupport, placed: list) -> list[str]:
    """The supported call ops that torch.fx's partitioner put in no partition, with why."""
    inside = set(placed)
    out = []
    for n in gm.graph.nodes:
        if n.op.startswith("call") and n not in inside and support.reason(n) is None:
            why = ("the partitioner keeps an indexing op with its source when every user of "
                   "the source indexes it, and its source is outside every partition") \
                if n.op == "call_function" and n.target is operator.getitem else \
                "left out of every partition by torch.fx's partitioner"
            loc = source_line(n).split(" (`")[0]
            out.append(op_name(n, gm) + (f" at {loc}" if loc else "") + f" ({why})")
    return out


def time_limited_ops(sub: fx.GraphModule, cv: Converter, result: Any, unchanged: bool) -> int:
    """The compute ops (``specs.computes``) of a partition left as they were only because
    the time limit cut their search short: every one of a partition searched as one program
    and left unchanged so, or those whose result a piece so left computes (a whole
    program's pieces). Counted in the partition's own call ops, as the coverage is (a piece
    counts its program ops: an RMSNorm is several of them, a dequantized weight more).
    ``unchanged``: the partition runs eagerly as a whole."""
    if result is None:
        return 0
    entries, pieces = result.stats.get("pieces"), getattr(result, "pieces", None)
    calls = [n for n in sub.graph.nodes if n.op.startswith("call")
             and not isinstance(cv.env.get(n), BoolMask)]
    if not entries or not pieces:
        late = unchanged and result.stats.get("time_limited")
        return sum(computes(n) for n in calls) if late else 0
    late_ids = {id(n) for (piece, did), e in zip(pieces, entries)
                if not did and e.get("time_limited") for n in piece.ops}
    return sum(computes(n) for n in calls
               if any(id(m) in late_ids for m in _value_nodes(cv.env.get(n))))


def _value_nodes(value: Any) -> list:
    """The IR nodes holding a converted value (a Tensor, or a tuple or list of them)."""
    if isinstance(value, Tensor):
        return [value.node]
    if isinstance(value, (tuple, list)):
        return [n for v in value for n in _value_nodes(v)]
    return []


def optimized_ops(sub: fx.GraphModule, cv: Converter, result: Any) -> tuple[int, int]:
    """The call ops of an optimized partition that ran in an optimized piece (those whose
    result is not computed by a piece left unchanged, a whole program's pieces), and how
    many of them compute (``specs.computes``: the coverage's numerator)."""
    kept = {id(n) for piece, did in (getattr(result, "pieces", None) or []) if not did
            for n in piece.ops}
    # a bool mask (a folded comparison) computes no float tensor: not a compute op
    ran = [n for n in sub.graph.nodes if n.op.startswith("call")
           and not isinstance(cv.env.get(n), BoolMask)
           and not any(id(m) in kept for m in _value_nodes(cv.env.get(n)))]
    return len(ran), sum(computes(n) for n in ran)
