"""Concat of tiles in the Triton backend: a concat is kept as its parts, never materialized.

Triton 3.6 has no order-preserving concat of blocks (``tl.cat`` may reorder), so a
``concat`` tile op yields a *split* value: its parts and the concat axis. An op reading
a split value runs once per part (``split_op``):

- elementwise ops, when every other operand is split the same way or has size 1 on
  that axis (broadcast); the result is split;
- a reduction: per part; over the concat axis the part sums are added (a mean divides
  by the full count);
- a transpose: per part, the axis permuted with it;
- a matmul: operands split along the contraction dim with equal parts give the sum of
  one ``tl.dot`` per pair (LoRA's ``concat(X, XA) @ concat(W, B)``); an operand split
  along K beside a whole one cuts the whole one in the same parts where it can be
  (``split_node``: a block input loaded part by part, elementwise ops per part: GPT-NeoX's
  ``Q @ concat(rotated, passed).T``); a split along M, N or a batch dim gives a split
  result;
- an accumulator or a block output of a split value: one per part, each part stored at
  its offset along the axis (``kernel.py``).

Anything else reading a split value (a reshape, an operand that is a whole tile along
the concat axis, a matmul split along K on one side only) raises ``CodegenError``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.node import ELEMENTWISE, REDUCE, Node, Op, Shape, fmt_shape, numel
from ..mugraph.dots import squeezed
from ..runtime.load import CodegenError  # the code generator's error (raised here too)


@dataclass
class Val:
    """A tile in the generated code: expression, logical tile shape, Triton dtype, padding."""

    expr: str
    shape: Shape
    dtype: str  # "float32" once computed; a load keeps the tensor's dtype
    clean: bool = True  # zero in every padded element
    const: float | None = None  # a folded constant (shape ())
    parts: tuple[Val, ...] = ()  # a concat of tiles, kept as its parts
    axis: int = -1  # the concat axis of ``parts``

    @property
    def dims(self) -> tuple[int, ...]:
        return squeezed(self.shape)


def split(parts: list[Val], shape: Shape, axis: int, what: str) -> Val:
    """A split value of logical ``shape`` from ``parts`` along ``axis``."""
    return Val(f"<{what}>", shape, "float32" if len({p.dtype for p in parts}) > 1 else
               parts[0].dtype, all(p.clean for p in parts), parts=tuple(parts), axis=axis)


class ConcatOps:
    """Split values (mixin of ``TileOps``, which provides ``who``, ``names``, ``op``...)."""

    def plain(self, v: Val, user: Node | str, why: str = "") -> Val:
        """``v``, refusing a split value (a concat of tiles) where it cannot be read."""
        if v.parts:
            who = user.describe() if isinstance(user, Node) else user
            raise CodegenError(
                f"{self.who}: {who} reads a concat of tiles "
                f"{', '.join(fmt_shape(p.shape) for p in v.parts)} (axis {v.axis})"
                f"{': ' + why if why else ''}; the Triton backend keeps a concat as its parts "
                "and supports only elementwise ops, reductions, transposes, matmuls "
                "(split along K on both sides, or along M, N or a batch dim), accumulators and "
                "outputs reading it")
        return v

    def concat(self, node: Node, srcs: list[Val], section: list[str], label: str) -> Val:
        parts: list[Val] = []
        for s in srcs:
            if s.const is not None:
                raise CodegenError(f"{self.who}: {node.describe()} of a constant")
            if s.parts and s.axis != node.arg:
                self.plain(s, node, f"a concat along axis {node.arg} of one along {s.axis}")
            parts.extend(s.parts or (s,))
        section.append(f"# {label}: kept as its {len(parts)} parts")
        return split(parts, node.shape, node.arg, label)

    def _unit_reshape(self, node: Node, v: Val, label: str) -> Val:
        """A reshape that only adds or drops dims of size 1, of a split value: the same
        parts, the concat axis moved with its dim (no code)."""
        src, out = v.shape, node.shape
        k = sum(1 for d in src[:v.axis] if d > 1)  # the concat axis is the k-th dim > 1
        axis = [i for i, d in enumerate(out) if d > 1][k]
        parts = []
        for p in v.parts:
            shape = tuple(p.shape[v.axis] if i == axis else d for i, d in enumerate(out))
            parts.append(Val(p.expr, shape, p.dtype, p.clean, p.const, p.parts, p.axis))
        return split(parts, out, axis, label)

    def split_node(self, src: Node, axis: int, sizes: list[int], section: list[str],
                   label: str) -> Val | None:
        """``src`` (whole along ``axis``) recomputed in parts of ``sizes``: block inputs are
        loaded part by part at their offsets, elementwise ops run once per part (operands
        of size 1 along the axis broadcast). None when some leaf cannot be split."""
        if src.op is Op.INPUT:
            return self.split_input(src, axis, sizes)
        if src.op is Op.TRANSPOSE:  # its operand cut along the axis that lands on ``axis``
            inner = src.arg[axis]
            v = self.split_node(src.srcs[0], inner, sizes, section, label)
            if v is None:
                return None
            return split(self.per_part(src, [v], [inner], axis, section, label), src.shape,
                         axis, label)
        if src.op not in ELEMENTWISE:
            return None
        r, vals, axes = len(src.shape), [], []
        for o in src.srcs:
            j = axis - (r - len(o.shape))
            if j < 0 or o.shape[j] == 1:
                if id(o) not in self.env:
                    return None
                vals.append(self.env[id(o)])
                axes.append(None)
                continue
            v = self.split_node(o, j, sizes, section, label)
            if v is None:
                return None
            vals.append(v)
            axes.append(j)
        parts = self.per_part(src, vals, axes, axis, section, f"{label}: {src.describe()} in "
                              "parts")
        return split(parts, src.shape, axis, label)

    def split_input(self, src: Node, axis: int, sizes: list[int]) -> Val | None:
        """Block input ``src`` loaded in parts of ``sizes`` along ``axis`` (the kernel
        writer can; None: it cannot)."""
        return None

    def slice_parts(self, node: Node, v: Val, label: str) -> Val:
        """A slice of a concat that takes whole parts: those parts (the kernel writer
        loads a slice of an input tile directly; any other slice is refused)."""
        axis, start, stop = node.arg
        if not v.parts or v.axis != axis:
            raise CodegenError(f"{self.who}: {node.describe()} slices a computed tile; the "
                               "Triton backend slices input tiles (loaded at an offset) and "
                               "concats of tiles (whole parts)")
        taken, offset = [], 0
        for p in v.parts:
            lo, hi = offset, offset + p.shape[axis]
            offset = hi
            if lo >= start and hi <= stop:
                taken.append(p)
            elif hi > start and lo < stop:
                self.plain(v, node, f"the slice [{start}:{stop}] cuts a part [{lo}:{hi}]")
        return taken[0] if len(taken) == 1 else split(taken, node.shape, axis, label)

    def per_part(self, node: Node, srcs: list[Val], axes: list[int | None],
                 out_axis: int | None, section: list[str], label: str,
                 op: Op | None = None) -> list[Val]:
        """Emit ``node`` once per part: ``srcs[j]`` split along ``axes[j]`` (None: whole)."""
        sizes = None
        for s, ax in zip(srcs, axes):
            if ax is not None:
                these = [p.shape[ax] for p in s.parts]
                if sizes is not None and these != sizes:
                    self.plain(s, node, f"its parts differ from those of another operand "
                                        f"({these} vs {sizes})")
                sizes = these
        out = []
        for i, size in enumerate(sizes):
            vals = [s.parts[i] if ax is not None else s for s, ax in zip(srcs, axes)]
            dummies = tuple(Node(Op.INPUT, (), f"part{j}", v.shape if ax is not None else
                                 node.srcs[j].shape, node.srcs[j].dtype)
                            for j, (v, ax) in enumerate(zip(vals, axes)))
            shape = tuple(size if d == out_axis else n for d, n in enumerate(node.shape))
            part = Node(op or node.op, dummies, node.arg, shape, node.dtype)
            out.append(self.op(part, vals, section, f"{label} [part {i}]",
                               f"v{self.counter - 1}_{i}"))
        return out

    def _total(self, node: Node, parts: list[Val], section: list[str], label: str,
               count: int = 1) -> Val:
        var = self.names(f"v{self.counter - 1}")
        expr = " + ".join(p.expr for p in parts)
        expr = f"({expr}) / {float(count)!r}" if count > 1 else expr
        self.emit(section, var, expr, label)
        return Val(var, node.shape, "float32", all(p.clean for p in parts))

    def split_op(self, node: Node, srcs: list[Val], section: list[str], label: str) -> Val:
        """Emit ``node``, some of whose operands are split values (module docstring)."""
        first = next(s for s in srcs if s.parts)
        if node.op is Op.MATMUL:
            return self._split_matmul(node, srcs, section, label)
        if node.op in REDUCE:
            axes, keep = node.arg
            if first.axis in axes and node.op is Op.MAX:
                self.plain(first, node, "a max over the concat axis is not lowered part by part")
            if first.axis in axes:
                parts = self.per_part(node, srcs, [first.axis], None, section, label, Op.SUM)
                count = numel(tuple(node.srcs[0].shape[a] for a in axes))
                return self._total(node, parts, section, label,
                                   count if node.op is Op.MEAN else 1)
            out = first.axis if keep else first.axis - sum(a < first.axis for a in axes)
            return split(self.per_part(node, srcs, [first.axis], out, section, label),
                         node.shape, out, label)
        if node.op is Op.TRANSPOSE:
            out = list(node.arg).index(first.axis)
            return split(self.per_part(node, srcs, [first.axis], out, section, label),
                         node.shape, out, label)
        if node.op is Op.RESHAPE and squeezed(node.srcs[0].shape) == squeezed(node.shape):
            return self._unit_reshape(node, first, label)
        if node.op not in ELEMENTWISE:
            self.plain(first, node)
        r = len(node.shape)
        out = first.axis + r - len(first.shape)
        axes: list[int | None] = []
        srcs = list(srcs)
        for i, (s, src) in enumerate(zip(srcs, node.srcs)):
            if s.parts:
                if s.axis + r - len(s.shape) != out:
                    self.plain(s, node, "operands concatenated along different axes")
                axes.append(s.axis)
                continue
            j = out - (r - len(src.shape))
            if s.const is None and j >= 0 and src.shape[j] > 1:
                cut = self.split_node(src, j, [p.shape[first.axis] for p in first.parts],
                                      section, label)
                if cut is None:
                    self.plain(first, node, f"the other operand {fmt_shape(src.shape)} is a "
                                            "whole tile along the concat axis")
                srcs[i] = cut
                axes.append(j)
                continue
            axes.append(None)
        return split(self.per_part(node, srcs, axes, out, section, label), node.shape, out,
                     label)

    def _split_matmul(self, node: Node, srcs: list[Val], section: list[str],
                      label: str) -> Val:
        a, b = srcs
        ra, rb, r = len(a.shape), len(b.shape), len(node.shape)
        out_a = None if not a.parts else ("K" if a.axis == ra - 1 else r - 2 if a.axis == ra - 2
                                          else a.axis + r - ra)
        out_b = None if not b.parts else ("K" if b.axis == rb - 2 else r - 1 if b.axis == rb - 1
                                          else b.axis + r - rb)
        axes = [a.axis if a.parts else None, b.axis if b.parts else None]
        if "K" in (out_a, out_b):
            if out_a != out_b:  # the other operand cut along K in the same parts, if it can be
                cut, i = (a, 1) if out_a == "K" else (b, 0)
                src, v = node.srcs[i], srcs[i]
                j = len(src.shape) - 1 if i == 0 else len(src.shape) - 2
                other = None if v.parts or v.const is not None else self.split_node(
                    src, j, [p.shape[cut.axis] for p in cut.parts], section, label)
                if other is None:
                    self.plain(cut, node, "a matmul needs both operands split along its "
                               "contraction dim, with equal parts")
                srcs, axes[i] = [other if n == i else x for n, x in enumerate(srcs)], j
            return self._total(node, self.per_part(node, srcs, axes, None, section, label),
                               section, label)
        outs = {o for o in (out_a, out_b) if o is not None}
        if len(outs) > 1:
            self.plain(a, node, "operands concatenated along different axes")
        out = outs.pop()
        for v, o in ((a, out_a), (b, out_b)):
            j = out - (r - len(v.shape))
            if o is None and out < r - 2 and j >= 0 and v.shape[j] > 1:
                self.plain(a if a.parts else b, node, f"the other operand "
                           f"{fmt_shape(v.shape)} is a whole tile along the concat axis")
        return split(self.per_part(node, srcs, axes, out, section, label), node.shape, out,
                     label)
