"""What Dynamo recorded about each fx node (shape, dtype, device), and Dynamo's symbolic
sizes as shape families (``torch.compile(dynamic=True)``, and the
sizes automatic dynamic shapes mark after a recompile).

Dynamo records a symbolic size as a ``SymInt`` whose expression is a sympy symbol
(``s77``), or a formula of symbols (``s77 + 1`` after a ``torch.cat``). One search serves
one size per program (``em.Dim``), so ``SymbolicSizes`` picks, for a whole fx graph,
the *family* sizes:

- sizes Dynamo's guards pinned to a number (``s1 == 4096`` after a matmul with a
  parameter) are that number;
- the plain symbols with the largest hint are the family's size; symbols that share
  that hint are taken as one size (Dynamo gives the lengths of K and V separate
  symbols; the optimized program checks at run time that they agree);
- every other symbol is *specialized*: the program is built at its hint and the
  optimized partition checks it on every call, running eagerly when it differs.

A node whose result has a size *derived* from a family size (``s77 + 1``), not read
from its operands, stays eager: one search serves a size, not formulas of it. Its
consumers still join a partition, where the derived size is a family size of its own.
So does a node whose size is a specialized symbol plus a number (a decode step's
``torch.cat`` onto a KV cache whose length is not the family's): a partition holding it
could not search again when that length moves, and would run eagerly at every later step.
The consumers' partitions hold the formula at its value; a call that moves it searches
again with its symbol as the family (``held``, ``focus``).
"""

from __future__ import annotations

import copy
import re
from typing import Any

import sympy
import torch
from torch import fx

from ..ir.dims import Dim
from ..ir.limits import evaluation_work
from ..ir.node import ALL_DTYPES

__all__ = ["SymbolicSizes", "computes", "empty", "graph_work", "input_elements", "matmul_flops",
           "node_spec", "size_expr", "split_runs", "values"]


def recorded(node: fx.Node) -> Any:
    """The value Dynamo recorded for ``node`` (a fake tensor, a tuple of them, a SymInt...)."""
    return node.meta.get("example_value", node.meta.get("val"))


def values(node: fx.Node) -> list:
    """The value(s) Dynamo recorded for ``node``: a tuple's items, else the one value."""
    v = recorded(node)
    return list(v) if isinstance(v, (tuple, list)) else [v]


def _float_name(dtype: Any) -> str | None:
    """The dtype name of a float16/bfloat16/float32 (or bool) torch dtype, else None."""
    name = str(dtype).replace("torch.", "")
    return name if name in ALL_DTYPES else None


def size_expr(d: Any) -> Any:
    """The simplified sympy expression of a SymInt (Dynamo's guards applied)."""
    return d.node.shape_env.simplify(d.node.expr)


def node_spec(node: fx.Node) -> tuple[tuple[int, ...], str, Any] | None:
    """(shape, dtype name, device) of the float tensor an fx node produces, else None
    (other dtypes, or a symbolic size: ``SymbolicSizes.spec`` serves those)."""
    for key in ("example_value", "val"):
        v = node.meta.get(key)
        if isinstance(v, torch.Tensor):
            shape, dtype, device = tuple(v.shape), v.dtype, v.device
            break
    else:
        tm = node.meta.get("tensor_meta")
        if tm is None or not hasattr(tm, "shape"):
            return None
        shape, dtype, device = tuple(tm.shape), tm.dtype, None
    name = _float_name(dtype)
    if name is None or not all(type(d) is int for d in shape):
        return None
    return shape, name, device


def _surely(cond: Any) -> bool:
    """``cond`` (a bool, or a SymBool of Dynamo's sizes) where it is known; False where it
    depends on data (an unbacked size such as ``x[x > 0]``'s under
    ``capture_dynamic_output_shape_ops``: asking would raise ``GuardOnDataDependentSymNode``)."""
    if isinstance(cond, bool):
        return cond
    try:
        from torch.fx.experimental.symbolic_shapes import guard_or_false
    except ImportError:  # pragma: no cover - a torch before guard_or_false
        return False
    return bool(guard_or_false(cond))


def empty(node: fx.Node) -> bool:
    """Whether ``node`` produces a zero-size tensor (or a tuple holding one); a size that
    depends on data is not known to be empty."""
    return any(isinstance(t, torch.Tensor) and _surely(t.numel() == 0) for t in values(node))


def computes(node: fx.Node) -> bool:
    """Whether a call node computes a float tensor with elements (or a tuple of them): the
    ops that count as compute in ``summary()`` (not int position math, tensor creation of
    empty caches, or Python glue)."""
    return node.op.startswith("call") and any(
        isinstance(t, torch.Tensor) and t.is_floating_point() and _surely(t.numel() > 0)
        for t in values(node))


def dim_name(expr: Any) -> str:
    """An identifier naming size ``expr`` (``s77``; ``s77 + 1`` -> ``s77_plus_1``)."""
    text = str(expr).replace("+", " plus ").replace("*", " times ").replace("-", " minus ")
    name = re.sub(r"\W+", "_", text).strip("_")
    return name if name.isidentifier() else f"size_{name}"


def split_runs(parts: list, gm: fx.GraphModule, kind) -> list:
    """Each partition of ``parts`` cut into runs of consecutive nodes (in ``gm``'s order)
    of equal ``kind(node)``. The runs of a partition follow each other in topological
    order, so no path leads from a later run back to an earlier one: the fused graph
    stays acyclic."""
    from torch.fx.passes.infra.partitioner import Partition

    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    out = []
    for p in parts:
        runs: list[tuple[bool, list]] = []
        for n in sorted(p.nodes, key=order.__getitem__):
            k = kind(n)
            if runs and runs[-1][0] == k:
                runs[-1][1].append(n)
            else:
                runs.append((k, [n]))
        out += [Partition(id=len(out) + i, nodes=ns) for i, (_, ns) in enumerate(runs)]
    return out


class SymbolicSizes:
    """The symbolic sizes of one fx graph and how each is served (see the module doc)."""

    def __init__(self, gm: fx.GraphModule, hint: int | None = None,
                 top: int | None = None) -> None:
        # the family size's planning hint and maximum when given (``em.backend(size_hint=,
        # size_max=)``): else its example value and no maximum
        self.plan_hint, self.plan_max = hint, top
        self.values: dict[Any, int] = {}  # symbol -> its value in the example inputs
        self.unbacked: set[Any] = set()
        exprs: set[Any] = set()
        for node in gm.graph.nodes:
            for v in values(node):
                if isinstance(v, torch.Tensor):
                    exprs.update(self._record(d) for d in v.shape)
        symbols = {s for e in exprs if e is not None for s in e.free_symbols
                   if s in self.values}
        top = max((self.values[s] for s in symbols), default=None)
        self.family = {s for s in symbols if self.values[s] == top}
        self.specialized = {s: self.values[s] for s in symbols if s not in self.family}

    def _record(self, d: Any) -> Any:
        if isinstance(d, int):
            return None
        env = d.node.shape_env
        expr = size_expr(d)
        if expr.is_number:
            return None
        known = getattr(env, "backed_var_to_val", None)
        known = env.var_to_val if known is None else known
        for s in expr.free_symbols:
            value = known.get(s)
            if value is None:
                self.unbacked.add(s)
            else:
                self.values[s] = int(value)
        return expr

    def focus(self, symbols: frozenset) -> SymbolicSizes:
        """These sizes with ``symbols`` (those a call moved to one value: a KV cache's keys
        and values) as the family and every other symbol specialized."""
        group = set(symbols)
        out = copy.copy(self)
        out.family = group
        out.specialized = {s: v for s, v in self.values.items() if s not in group}
        return out

    def held(self, node: fx.Node) -> dict[int, tuple[Any, int]]:
        """{axis: (symbol, offset)} of the axes of ``node``'s tensor held at a number because
        of one specialized symbol: the symbol itself (offset 0) or the symbol plus a number
        (``s87 + 1``, a KV cache's length after a ``torch.cat``), so that a call moving it
        can tell the symbol's new value and search again with it symbolic."""
        v = recorded(node)
        if not isinstance(v, torch.Tensor):
            return {}
        shifts = ((axis, self._shift(size_expr(d))) for axis, d in enumerate(v.shape)
                  if not isinstance(d, int))
        return {axis: shift for axis, shift in shifts if shift is not None}

    def _shift(self, expr: Any) -> tuple[Any, int] | None:
        """``(s, c)`` when ``expr`` is ``s + c`` (``c`` an integer, 0 included) for one
        specialized symbol ``s``, else None."""
        if len(expr.free_symbols) != 1:
            return None
        (symbol,) = expr.free_symbols
        offset = sympy.simplify(expr - symbol)
        return (symbol, int(offset)) if symbol in self.specialized and offset.is_Integer \
            else None

    @property
    def dynamic(self) -> bool:
        """Whether the graph has any symbolic size at all."""
        return bool(self.values or self.unbacked)

    def size(self, d: Any) -> Any:
        """A size as served: an int (static, pinned or specialized), or the expression of
        family sizes it is (a sympy expression)."""
        if isinstance(d, int):
            return d
        expr = size_expr(d)
        if not expr.free_symbols & self.unbacked:
            expr = sympy.sympify(expr.xreplace(self.specialized))
        return int(expr) if expr.is_number else expr

    def shape(self, t: torch.Tensor) -> tuple:
        """The shape of (fake) tensor ``t`` as served (``size`` of each dim)."""
        return tuple(self.size(d) for d in t.shape)

    def spec(self, node: fx.Node) -> tuple[tuple, str, Any] | None:
        """(shape as served, dtype name, device) of the float tensor ``node`` produces."""
        v = recorded(node)
        if not isinstance(v, torch.Tensor):
            return node_spec(node) if "tensor_meta" in node.meta else None
        name = _float_name(v.dtype)
        return None if name is None else (self.shape(v), name, v.device)

    def tuple_spec(self, node: fx.Node) -> list[tuple[tuple, str, Any]] | None:
        """The specs of a node producing a tuple of float tensors (``split``, ``chunk``)."""
        v = recorded(node)
        if not isinstance(v, (tuple, list)) or not v or not all(
                isinstance(t, torch.Tensor) for t in v):
            return None
        names = [_float_name(t.dtype) for t in v]
        if None in names:
            return None
        return [(self.shape(t), n, t.device) for t, n in zip(v, names)]

    @staticmethod
    def scalar(node: fx.Node) -> float | None:
        """The example value of a float Dynamo made symbolic (a ``SymFloat``, e.g. a
        module's eps read with ``.item()`` under ``dynamic=True``), else None."""
        v = recorded(node)
        if isinstance(v, torch.SymFloat):
            hint = getattr(v.node, "hint", None)
            return None if hint is None else float(hint)
        return None

    def hint(self, expr: Any) -> int:
        """The hint of a size as served (an int is its own hint)."""
        return expr if isinstance(expr, int) else int(sympy.sympify(expr.xreplace(self.values)))

    def concrete(self, shape: tuple) -> tuple[int, ...]:
        """``shape`` with every family size at its hint (for comparisons with a Graph)."""
        return tuple(self.hint(d) for d in shape)

    def reason(self, node: fx.Node) -> str | None:
        """Why ``node``'s sizes keep it eager (unbacked, or derived from a family size),
        else None."""
        outs = {e for v in values(node) if isinstance(v, torch.Tensor)
                for e in self.shape(v) if not isinstance(e, int)}
        ins = {e for src in node.all_input_nodes for v in values(src)
               if isinstance(v, torch.Tensor) for e in self.shape(v) if not isinstance(e, int)}
        data = sorted((e for e in outs | ins if e.free_symbols & self.unbacked), key=str)
        if data:
            return f"its size {data[0]} depends on data (an unbacked symbolic size)"
        derived = sorted((e for e in outs if not e.is_Symbol and e not in ins), key=str)
        held = sorted(self._held_formulas(node), key=str)
        if held:  # s87 + 1 at s87's value: served once, and a moved s87 could not replan
            return (f"its size {held[0]} is computed from the symbolic size "
                    f"{sorted(map(str, held[0].free_symbols))[0]}, specialized here: a "
                    "partition holding it could not search again when that size moves "
                    "(the ops after it can still be optimized)")
        if derived:
            return (f"its size {derived[0]} is computed from the symbolic size "
                    f"{sorted(map(str, derived[0].free_symbols))[0]}: one search serves a "
                    "size, not formulas of it (the ops after it can still be optimized)")
        return None

    def _held_formulas(self, node: fx.Node) -> set:
        """The sizes ``s + c`` of ``node``'s results (``s`` a specialized symbol, ``c`` a
        number) that none of its operands has: a ``torch.cat`` onto a KV cache, whose
        length grows from step to step. (A reshape's product of held sizes, heads times
        head dim, does not move: it stays in its partition, at its value.)"""
        def raw(nodes: list) -> set:
            return {size_expr(d) for n in nodes for v in values(n)
                    if isinstance(v, torch.Tensor) for d in v.shape if not isinstance(d, int)}
        ins = raw(list(node.all_input_nodes))
        return {e for e in raw([node]) - ins if (shift := self._shift(e)) and shift[1]}

    def dims(self, exprs: list) -> dict[Any, Dim]:
        """One ``em.Dim`` per family size among ``exprs``: sizes that share a value are
        one Dim (named after the first), whose hint is that value (or the planning hint,
        when larger) and whose maximum is the planning maximum (when not below the value)."""
        by_hint: dict[int, Dim] = {}
        out = {}
        for e in exprs:
            if isinstance(e, int) or e in out:
                continue
            h = self.hint(e)
            if h not in by_hint:
                top = self.plan_max if self.plan_max is not None and self.plan_max >= h else None
                hint = max(h, self.plan_hint or 0)
                by_hint[h] = Dim(dim_name(e), hint=hint if top is None else min(hint, top),
                                 max=top)
            out[e] = by_hint[h]
        return out

    def touches(self, node: fx.Node) -> bool:
        """Whether ``node`` reads or produces a tensor with a family size."""
        vals = values(node) + [v for src in node.all_input_nodes for v in values(src)]
        return any(isinstance(v, torch.Tensor) and not all(isinstance(e, int)
                                                           for e in self.shape(v))
                   for v in vals)

    def describe(self) -> str:
        """One line: the family size(s) and the specialized ones, for warnings."""
        fam = ", ".join(f"{e}={self.values[e]}" for e in sorted(self.family, key=str))
        spec = ", ".join(f"{e}={h}" for e, h in sorted(self.specialized.items(), key=str))
        return f"symbolic size {fam}" + (f"; specialized at {spec}" if spec else "")


_CONTRACTIONS = {"matmul": 0, "mm": 0, "bmm": 0, "linear": 0, "addmm": 1, "baddbmm": 1,
                 "addbmm": 1}  # op name -> the operand whose last dim is contracted


def matmul_flops(nodes) -> float:
    """The float64 work of one evaluation of the matmuls among fx ``nodes`` (``F.linear``,
    ``@``, ``bmm``, ``addmm``, scaled-dot-product attention: 2 flops per multiply-add),
    from the shapes Dynamo recorded (symbolic sizes at their hints; a node without shapes
    counts 0)."""
    total = 0.0
    for n in nodes:
        if n.op not in ("call_function", "call_method"):
            continue
        name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
        try:
            out = recorded(n)
            numel = float(_hint(out.numel()))
            if name in _CONTRACTIONS:
                src = recorded(n.args[_CONTRACTIONS[name]])
                batch = float(_hint(src.shape[0])) if name == "addbmm" else 1.0  # summed over
                total += 2.0 * numel * batch * float(_hint(src.shape[-1]))
            elif name == "scaled_dot_product_attention":
                q, k = recorded(n.args[0]), recorded(n.args[1])
                keys = float(_hint(k.shape[-2]))
                total += 2.0 * keys * (float(_hint(q.numel())) + numel)
        except (AttributeError, IndexError, TypeError, ValueError):
            continue
    return total


def graph_work(nodes) -> float:
    """One float64 evaluation of fx ``nodes`` (``limits.evaluation_work``: their matmuls and
    the elements they read from outside), what ``time_limit_s="auto"`` scales with."""
    nodes = list(nodes)
    return evaluation_work(matmul_flops(nodes), input_elements(nodes))


def input_elements(nodes) -> float:
    """The elements of the values fx ``nodes`` read from outside themselves (inputs,
    parameters and buffers; what a verification draws), from the shapes Dynamo recorded."""
    inside, total, seen = set(nodes), 0.0, set()
    for n in inside:
        for a in n.all_input_nodes:
            if a in inside or a in seen:
                continue
            seen.add(a)
            try:
                total += float(_hint(recorded(a).numel()))
            except (AttributeError, TypeError, ValueError):
                continue
    return total


def _hint(size: Any) -> int:
    """A size as an int: a SymInt at its hint."""
    if isinstance(size, torch.SymInt):
        return int(size.node.hint)
    return int(size)
