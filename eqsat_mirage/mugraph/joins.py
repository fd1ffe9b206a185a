"""Matmul accumulators summed as one matmul over a kernel's whole loop (the tiled
interpreter's ``_Plan.fused``): sum_f L_f @ R_f = [L_0 .. L_F-1] @ [R_0; ..; R_F-1].

- ``joined``: the exact (field) operands of every iteration joined along the contraction;
- ``adjacent``: tiles that lie side by side in one array joined as a view of it (no copy);
- ``FloatJoin``: the same over float64, for operands that are views of the kernel's inputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir.node import Node, Op
from ..semantics.gemm import copied, owner
from ..semantics.interp import Table
from ..semantics.modular import compact


def contraction_axes(m: Node) -> tuple[int, int]:
    """The axes of matmul ``m``'s two operands along which its loop tiles join: the left
    operand's last, the right's second to last (its only one when it is a vector)."""
    return -1, -1 if len(m.srcs[1].shape) == 1 else -2


def joined(operands: list, m: Node) -> tuple:
    """A matmul's per-iteration field operands (L_f, R_f) joined along the contraction
    (batch axes broadcast over the grid stay length 1: matmul broadcasts them)."""
    axes = contraction_axes(m)

    def join(side: int, part: int):
        xs = [x[side][part] for x in operands]
        if any(x is None for x in xs):
            return None
        small = [compact(x) for x in xs]
        if len({x.shape for x in small}) > 1:
            small = [np.broadcast_to(x, np.shape(xs[0])) for x in xs]
        side_by_side = adjacent(small, axes[side])
        return side_by_side if side_by_side is not None else np.concatenate(
            small, axis=axes[side])
    return tuple(tuple(join(side, part) for part in (0, 1)) for side in (0, 1))


def adjacent(xs: list, axis: int) -> np.ndarray | None:
    """``np.concatenate(xs, axis)`` as a read-only view, where ``xs`` are equal views of one
    array, each beginning where the one before ends along ``axis`` (a weight's tiles over
    the loop: side by side, a slice of the weight; 172 x 64 tiles of a 7B MLP weight
    joined without copying its 360 MB); None otherwise."""
    first = xs[0] if xs else None
    if len(xs) < 2 or not all(isinstance(x, np.ndarray) for x in xs) or first.ndim == 0:
        return None
    axis %= first.ndim
    step = first.strides[axis] * first.shape[axis]
    if step <= 0 or min(first.strides) < 0 or any(
            x.shape != first.shape or x.strides != first.strides or x.dtype != first.dtype
            or owner(x) is not owner(first) for x in xs):
        return None
    start = first.__array_interface__["data"][0]
    if any(x.__array_interface__["data"][0] != start + i * step for i, x in enumerate(xs)):
        return None
    shape = list(first.shape)
    shape[axis] *= len(xs)
    return np.lib.stride_tricks.as_strided(first, tuple(shape), first.strides, writeable=False)


class FloatJoin:
    """A float64 run's matmul accumulators (``_Plan.fused``) summed as one matmul over the
    whole loop, as the exact backends sum them (float64 is the reference precision: the
    same products summed in another order; 64 products of 128 x 64 @ 64 x 11008 summed
    one by one ran a 7B MLP kernel at a quarter of one GEMM's rate). Only operands that are
    views of the kernel's inputs (tiles cut from them) are held across iterations, and the
    joined ones are views too (``adjacent``: a weight's tiles side by side, a slice of it)
    that ``gemm.matmul`` reads in place: no more memory than the loop's own. Where an
    operand is computed, or the tiles do not join so, the products are summed iteration
    by iteration in order, as the loop sums them."""

    def __init__(self, plan: Any, table: Table, ctx: Any, accs: dict, inputs: list) -> None:
        self.plan, self.table, self.ctx, self.accs = plan, table, ctx, accs
        self.sources = {id(owner(np.asarray(x))) for x in inputs}
        self.held: dict[str, list] = {a: [] for a in plan.fused}
        self.spilled: set[str] = set()

    def take(self, a: str, lhs: Any, rhs: Any) -> None:
        """One iteration's operands of accumulator ``a``."""
        if a not in self.spilled and all(isinstance(x, np.ndarray) and
                                         id(owner(x)) in self.sources for x in (lhs, rhs)):
            self.held[a].append((lhs, rhs))
            return
        self.spilled.add(a)  # from here on, product by product
        self._sum(a, self.held[a] + [(lhs, rhs)])
        self.held[a] = []

    def finish(self, a: str) -> None:
        """Accumulator ``a``'s value: its held operands joined into one matmul, or summed."""
        m, held = self.plan.fused[a], self.held.pop(a, [])
        if not held:
            return
        axes = contraction_axes(m)
        lhs = adjacent([x for x, _ in held], axes[0])
        rhs = adjacent([y for _, y in held], axes[1])
        if a in self.spilled or lhs is None or rhs is None or copied(lhs, rhs):
            self._sum(a, held)
            return
        x = self.table[Op.MATMUL](self.ctx, m, lhs, rhs)
        self.accs[a] = x if np.shape(x) == m.shape else np.broadcast_to(x, m.shape)

    def _sum(self, a: str, operands: list) -> None:
        m = self.plan.fused[a]
        for lhs, rhs in operands:
            x = self.table[Op.MATMUL](self.ctx, m, lhs, rhs)
            self.accs[a] = x if a not in self.accs else self.table[Op.ADD](
                self.ctx, self.plan.adds[a], self.accs[a], x)
