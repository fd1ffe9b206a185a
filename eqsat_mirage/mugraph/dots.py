"""Which tile matmuls the Triton backend emits as ``tl.dot`` (tensor cores) and how:
``uses_dot`` (a plain or one-batch-dim matmul), ``merges_batch`` (a left operand whose batch
dims merge into M against a shared right operand); any other tile matmul is a broadcast
product summed over K (``codegen.tiles.TileOps``). Here, below both, because the cost model
prices what the backend emits (``cost.tiles.fma_k``) and must not import the backend.
"""

from __future__ import annotations

from ..ir.node import Node, Shape, numel

MIN_DOT = 16  # smallest tl.dot operand dim


def squeezed(shape: Shape) -> tuple[int, ...]:
    """The sizes of the dims of ``shape`` that a Triton block keeps (those > 1)."""
    return tuple(s for s in shape if s > 1)


def matmul_dims(node: Node) -> tuple[Shape, int, int, int]:
    """(batch shape of the result, M, K, N) of a tile matmul."""
    a, b = node.srcs
    return node.shape[:-2], a.shape[-2], a.shape[-1], b.shape[-1]


def uses_dot(node: Node) -> bool:
    """Whether a tile matmul becomes ``tl.dot``: M, K, N > 1 and at most one batch dim > 1,
    carried by both operands; otherwise it is a broadcast product summed over K."""
    batch, m, k, n = matmul_dims(node)
    if min(m, k, n) < 2:
        return False
    nb = len(squeezed(batch))
    return nb == 0 or (nb == 1 and all(len(squeezed(s.shape)) == 3 for s in node.srcs))


def merges_batch(node: Node) -> bool:
    """Whether a tile matmul whose left operand alone carries batch dims (attention's
    query-head group against one shared key tile) becomes one ``tl.dot``: the left
    operand's batch dims and M merged into one M of at least ``MIN_DOT`` rows
    (``tl.reshape``), the result reshaped back. Else the broadcast product takes batch x M x
    K x N values of registers (a 4 x 16 x 32 x 128 product spilled and ran 2.3 ms on an H100
    where the dot takes microseconds)."""
    batch, m, k, n = matmul_dims(node)
    a, b = node.srcs
    if min(k, n) < 2 or squeezed(b.shape[:-2]) or not squeezed(a.shape[:-2]):
        return False
    rows = numel(tuple(pow2(d) for d in squeezed(a.shape[:-1])))
    return rows >= MIN_DOT


def pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
