"""A catalogue of true identities and near-miss mutants, checked by ``em.verify``.

Every case is data: a name, the inputs both programs declare, and two functions
that build the left and right program from those inputs. An identity must be
reported equivalent with a tiny false-positive bound; a mutant (one small,
plausible mistake) must be reported NOT equivalent, with a counterexample that
names the output where the programs differ.
"""

# Tensors are named like the inputs they stand for (X, W, Q, K, V), as in the math.
# ruff: noqa: N803, N806

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

import eqsat_mirage as em
from eqsat_mirage.verifier.bound import compared

F32, F16 = "float32", "float16"


@dataclass(frozen=True)
class Case:
    """Two programs over the same inputs: ``lhs`` and ``rhs`` map input tensors to outputs.

    ``inputs`` is ``((name, shape, dtype), ...)``; each side returns a Tensor
    (the output ``O``) or a dict ``{output name: Tensor}``. ``output`` is the
    output a mutant's counterexample must name (``None``: any output).
    """

    name: str
    inputs: tuple[tuple[str, tuple[int, ...], str], ...]
    lhs: Callable[..., object]
    rhs: Callable[..., object]
    output: str | None = None

    def build(self, side: str) -> em.Graph:
        g = em.Graph(f"{self.name}.{side}")
        tensors = [g.input(name, shape, dtype=dtype) for name, shape, dtype in self.inputs]
        out = (self.lhs if side == "lhs" else self.rhs)(*tensors)
        for name, t in (out if isinstance(out, dict) else {"O": out}).items():
            g.output(t, name)
        return g

    def programs(self) -> tuple[em.Graph, em.Graph]:
        return self.build("lhs"), self.build("rhs")


def ins(*specs: str, dtype: str = F32) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    """``ins("A:4x8", "B:8x3")`` -> input declarations (``A:4`` is 1-d)."""
    out = []
    for spec in specs:  # "M:3x4:bool": a mask input
        name, dims, *kind = spec.split(":")
        out.append((name, tuple(int(d) for d in dims.split("x")), kind[0] if kind else dtype))
    return tuple(out)


def compare_all(X, Y, diff: bool = False):
    """Each comparison of X and Y (``diff``: of X - Y and 0, the same in IEEE arithmetic,
    gradual underflow included), selecting between them (or gating X)."""
    A, B = (X - Y, 0.0) if diff else (X, Y)
    return (em.where(A > B, X, Y) + em.where(A >= B, Y, X) + em.where(A < B, X, 2.0 * Y)
            + (A <= B).astype("float32") * X + em.where(em.eq(A, B), X, Y)
            + em.where(em.ne(A, B), Y, X))


def lora_lhs(W, X, A, B):
    return W @ X + B @ (A @ X)


def lora_rhs(W, X, A, B):
    return em.concat([W, B], 1) @ em.concat([X, A @ X], 0)


def softmax_av(Q, K, V):
    a = em.exp(Q @ K)
    return (a / a.sum(axis=-1, keepdims=True)) @ V


def causal_av(Q, K, V, offset=0, late=False):
    """Causal attention: scores above the diagonal (+ offset) masked to -inf."""
    s = em.where(Q.graph.causal_mask(Q.shape[-2], K.shape[-1], offset), Q @ K, float("-inf"))
    if not late:
        return em.softmax(s, axis=-1) @ V
    e = em.exp(s - s.max(axis=-1, keepdims=True))
    return (e @ V) / e.sum(axis=-1, keepdims=True)


def safe_softmax_av(Q, K, V):
    return em.softmax(Q @ K, axis=-1) @ V


def _flash_parts(Q, K1, K2, V1, V2):
    s1, s2 = Q @ K1, Q @ K2
    m1, m2 = s1.max(axis=-1, keepdims=True), s2.max(axis=-1, keepdims=True)
    e1, e2 = em.exp(s1 - m1), em.exp(s2 - m2)
    big = em.concat([m1, m2], 1).max(axis=-1, keepdims=True)  # the max over both splits
    return (e1 @ V1, e2 @ V2), (e1.sum(axis=-1, keepdims=True), e2.sum(axis=-1, keepdims=True)), \
        (m1, m2, big)


def flash_split_safe(Q, K1, K2, V1, V2):
    """FlashDecoding: per-split max, sum and partial output, rescaled by exp(m_j - M)."""
    (p1, p2), (l1, l2), (m1, m2, big) = _flash_parts(Q, K1, K2, V1, V2)
    r1, r2 = em.exp(m1 - big), em.exp(m2 - big)
    return (r1 * p1 + r2 * p2) / (r1 * l1 + r2 * l2)


def flash_whole_safe(Q, K1, K2, V1, V2):
    return em.softmax(Q @ em.concat([K1, K2], 1), axis=-1) @ em.concat([V1, V2], 0)


def flash_split_mutant(kind: str):
    """``flash_split_safe`` with one mistake: no rescale, the rescale's sign flipped, or the
    denominator rescaled by a stale max (split 1's, not the maximum over both)."""
    def f(Q, K1, K2, V1, V2):
        (p1, p2), (l1, l2), (m1, m2, big) = _flash_parts(Q, K1, K2, V1, V2)
        if kind == "missing":
            return (p1 + p2) / (l1 + l2)
        if kind == "sign":
            r1, r2 = em.exp(big - m1), em.exp(big - m2)
            return (r1 * p1 + r2 * p2) / (r1 * l1 + r2 * l2)
        r1, r2 = em.exp(m1 - big), em.exp(m2 - big)  # "stale"
        return (r1 * p1 + r2 * p2) / (l1 + em.exp(m2 - m1) * l2)
    return f


def softmax_av_late(Q, K, V):
    a = em.exp(Q @ K)
    return (a @ V) / a.sum(axis=-1, keepdims=True)


def rms_expanded(X, w):
    ms = (X * X).sum(axis=-1, keepdims=True) / 8.0
    return w * (X / em.sqrt(ms + 1e-6))


def rms_linear_late(X, w, W):
    # RMSNorm + Linear with the division by the row scalar moved after the matmul.
    return ((X * w) @ W) * em.rsqrt((X * X).mean(axis=-1, keepdims=True) + 1e-6)


def split_k(A, B):
    # A(4,16) @ B(16,3) as four partial products over K-chunks of 4, then a sum.
    return (A.reshape(4, 4, 4).transpose(1, 0, 2) @ B.reshape(4, 4, 3)).sum(axis=0)


def flash_split(Q, K1, K2, V1, V2):
    return em.exp(Q @ K1) @ V1 + em.exp(Q @ K2) @ V2


def flash_whole(Q, K1, K2, V1, V2):
    return em.exp(Q @ em.concat([K1, K2], 1)) @ em.concat([V1, V2], 0)


def int4_linear(X, Wp, s):
    """X (4, 16) @ W, W (16, 3) unpacked from Wp (8, 3) uint8 (rows 2i, 2i + 1 in byte i's
    low and high nibble), (q - 8) times a scale per group of 8 rows (issue 53)."""
    q = em.concat([(Wp & 0xF).reshape((8, 1, 3)), (Wp >> 4).reshape((8, 1, 3))], axis=1)
    w = (q.reshape((2, 8, 3)).astype(F32) - 8.0) * s.reshape((2, 1, 3))
    return X @ w.reshape((16, 3))


def int4_regrouped(X, Wp, s):
    """``int4_linear`` with x's columns de-interleaved and the groups a summed batch axis."""
    pairs = X.reshape((4, 2, 4, 2))
    even, odd = (pairs[:, :, :, j:j + 1].reshape((4, 2, 4)).transpose((1, 0, 2)) for j in (0, 1))
    w3 = Wp.reshape((2, 4, 3))
    lo, hi = (w3 & 0xF).astype(F32) - 8.0, (w3 >> 4).astype(F32) - 8.0
    return ((even @ lo + odd @ hi) * s.reshape((2, 1, 3))).sum(axis=0)


IDENTITIES = [
    # issue 53: a byte's nibbles recombine to it; packed int4 weights regrouped
    Case("nibbles-recombine", ins("B:4x6:uint8"),
         lambda B: (B & 15).astype(F32) + (B >> 4).astype(F32) * 16.0,
         lambda B: B.astype(F32)),
    Case("int4-linear-regrouped", ins("X:4x16", "Wp:8x3:uint8", "s:2x3"),
         int4_linear, int4_regrouped),
    Case("matmul-assoc", ins("A:4x8", "B:8x3", "C:3x5"),
         lambda A, B, C: (A @ B) @ C, lambda A, B, C: A @ (B @ C)),
    Case("matmul-assoc-fp16", ins("A:4x8", "B:8x3", "C:3x5", dtype=F16),
         lambda A, B, C: (A @ B) @ C, lambda A, B, C: A @ (B @ C)),
    Case("matmul-distrib-left", ins("A:4x8", "B:8x3", "C:8x3"),
         lambda A, B, C: A @ (B + C), lambda A, B, C: A @ B + A @ C),
    # a sum: (A - B) @ C -> A @ C - B @ C cancels where A and B nearly agree, losing the
    # bits (A - B) @ C keeps (issue 51; tests/verifier/test_seed_independence.py)
    Case("matmul-distrib-right", ins("A:4x8", "B:4x8", "C:8x3"),
         lambda A, B, C: (A + B) @ C, lambda A, B, C: A @ C + B @ C),
    Case("mul-distrib-broadcast-row", ins("X:4x8", "Y:4x8", "Z:1x8"),
         lambda X, Y, Z: X * (Y + Z), lambda X, Y, Z: X * Y + X * Z),
    Case("div-distrib", ins("A:3x5", "B:3x5", "C:3x1"),
         lambda A, B, C: (A + B) / C, lambda A, B, C: A / C + B / C),
    Case("lora-concat-matmul", ins("W:6x8", "X:8x5", "A:2x8", "B:6x2"), lora_lhs, lora_rhs),
    Case("lora-design-form", ins("X:4x8", "W:8x6", "A:8x2", "B:2x6"),
         lambda X, W, A, B: X @ W + (X @ A) @ B,
         lambda X, W, A, B: em.concat([X, X @ A], 1) @ em.concat([W, B], 0)),
    Case("concat-rows-matmul", ins("A:2x8", "B:3x8", "W:8x4"),
         lambda A, B, W: em.concat([A, B], 0) @ W,
         lambda A, B, W: em.concat([A @ W, B @ W], 0)),
    Case("div-row-scalar-matmul", ins("X:4x8", "W:8x5"),
         lambda X, W: (X / ((X * X).sum(axis=-1, keepdims=True) + 1.0)) @ W,
         lambda X, W: (X @ W) / ((X * X).sum(axis=-1, keepdims=True) + 1.0)),
    Case("div-row-scalar-sum", ins("X:4x8", "S:4x1"),
         lambda X, S: (X / S).sum(axis=-1, keepdims=True),
         lambda X, S: X.sum(axis=-1, keepdims=True) / S),
    Case("exp-add", ins("A:3x4", "B:3x4"),  # the float-safe direction (inf * 0 otherwise)
         lambda A, B: em.exp(A) * em.exp(B), lambda A, B: em.exp(A + B)),
    # the float-safe direction: exp(A) / exp(B) overflows float16 from A = 11.1 where
    # exp(A - B) is finite, so only the rewrite towards exp(A - B) is accepted
    Case("exp-sub-fp16", ins("A:3x4", "B:1x4", dtype=F16),
         lambda A, B: em.exp(A) / em.exp(B), lambda A, B: em.exp(A - B)),
    Case("exp-double", ins("X:3x4"),
         lambda X: em.exp(X * 2.0), lambda X: em.exp(X) * em.exp(X)),
    Case("sum-of-sum", ins("X:3x4x5"),
         lambda X: X.sum(axis=2).sum(axis=1), lambda X: X.sum(axis=(1, 2))),
    Case("sum-all", ins("X:3x4"),
         lambda X: X.sum(), lambda X: X.sum(axis=0).sum(axis=0)),
    Case("split-reduction-reshape", ins("X:4x12"),
         lambda X: X.sum(axis=-1), lambda X: X.reshape(4, 3, 4).sum(axis=-1).sum(axis=-1)),
    Case("split-k-matmul", ins("A:4x16", "B:16x3"), lambda A, B: A @ B, split_k),
    Case("sum-through-add", ins("A:3x6", "B:3x6"),
         lambda A, B: (A + B).sum(axis=-1), lambda A, B: A.sum(axis=-1) + B.sum(axis=-1)),
    Case("sum-through-const-mul", ins("X:5x3"),
         lambda X: (X * 2.5).sum(axis=0), lambda X: X.sum(axis=0) * 2.5),
    Case("sum-of-concat", ins("A:3x4", "B:3x2"),
         lambda A, B: em.concat([A, B], 1).sum(axis=1),
         lambda A, B: A.sum(axis=1) + B.sum(axis=1)),
    Case("mean-is-sum-times-inv-n", ins("X:4x8"),
         lambda X: X.mean(axis=-1), lambda X: X.sum(axis=-1) * (1 / 8)),
    Case("mean-is-sum-div-n", ins("X:3x6"),
         lambda X: X.mean(axis=-1, keepdims=True), lambda X: X.sum(axis=-1, keepdims=True) / 6),
    Case("transpose-of-matmul", ins("A:4x8", "B:8x3"),
         lambda A, B: (A @ B).T, lambda A, B: B.T @ A.T),
    Case("transpose-twice", ins("X:4x7"), lambda X: X.T.T, lambda X: X),
    Case("transpose-3d-compose", ins("X:2x3x4"),
         lambda X: X.transpose(1, 2, 0).transpose(2, 0, 1), lambda X: X),
    Case("transpose-sum", ins("X:4x6"),
         lambda X: X.T.sum(axis=0), lambda X: X.sum(axis=1)),
    Case("reshape-roundtrip", ins("X:4x8"), lambda X: X.reshape(8, 4).reshape(4, 8), lambda X: X),
    Case("sub-is-add-neg", ins("A:3x4", "B:3x4"),
         lambda A, B: A - B, lambda A, B: A + (-B)),
    Case("neg-neg", ins("X:3x4"), lambda X: -(-X), lambda X: X),  # noqa: B002
    Case("neg-is-mul-minus-one", ins("X:3x4"), lambda X: -X, lambda X: X * -1.0),
    Case("rsqrt-is-inv-sqrt", ins("X:3x4"), lambda X: em.rsqrt(X), lambda X: 1.0 / em.sqrt(X)),
    Case("silu-congruence", ins("A:3x4", "B:3x4"),
         lambda A, B: em.silu(A + B), lambda A, B: em.silu(B + A)),
    Case("sigmoid-congruence", ins("A:3x4", "B:3x4"),
         lambda A, B: em.sigmoid(A * B), lambda A, B: em.sigmoid(B * A)),
    Case("relu-congruence-fp16", ins("A:3x4", "B:3x4", dtype=F16),
         lambda A, B: em.relu(A * B), lambda A, B: em.relu(B * A)),
    Case("sqrt-congruence", ins("X:3x4"),
         lambda X: em.sqrt(X.T.T + 1.0), lambda X: em.sqrt(1.0 + X)),
    Case("opaque-shared-vs-duplicated", ins("X:4x8"),
         lambda X: {"O1": em.silu(X), "O2": em.exp(em.silu(X))},
         lambda X: {"O1": em.silu(X * 1.0), "O2": em.exp(em.silu(X))}),
    Case("concat-of-elementwise", ins("A:2x4", "B:2x4", "C:3x4", "D:3x4"),
         lambda A, B, C, D: em.concat([A * B, C * D], 0),
         lambda A, B, C, D: em.concat([A, C], 0) * em.concat([B, D], 0)),
    Case("concat-of-exp", ins("A:3x2", "B:3x5"),
         lambda A, B: em.concat([em.exp(A), em.exp(B)], 1),
         lambda A, B: em.exp(em.concat([A, B], 1))),
    Case("concat-of-silu", ins("A:3x2", "B:3x5"),
         lambda A, B: em.concat([em.silu(A), em.silu(B)], 1),
         lambda A, B: em.silu(em.concat([A, B], 1))),
    Case("batched-matmul-as-2d", ins("X:2x4x8", "W:8x3"),
         lambda X, W: X @ W, lambda X, W: (X.reshape(8, 8) @ W).reshape(2, 4, 3)),
    Case("broadcast-batch-dims", ins("A:2x1x4x8", "B:1x3x8x5"),
         lambda A, B: (A @ B).sum(axis=1),
         lambda A, B: A.reshape(2, 4, 8) @ B.sum(axis=1)),
    Case("rms-norm-vs-expansion", ins("X:4x8", "w:8"),
         lambda X, w: em.rms_norm(X, w), rms_expanded),
    Case("rms-norm-linear-late-div", ins("X:4x8", "w:8", "W:8x5"),
         lambda X, w, W: em.rms_norm(X, w) @ W, rms_linear_late),
    Case("attention-late-softmax-div", ins("Q:2x4x8", "K:2x8x6", "V:2x6x8"),
         softmax_av, softmax_av_late),
    Case("attention-late-div-fp16", ins("Q:2x4x8", "K:2x8x6", "V:2x6x8", dtype=F16),
         softmax_av, softmax_av_late),
    Case("flash-decoding-split-kv", ins("Q:4x8", "K1:8x6", "K2:8x6", "V1:6x8", "V2:6x8"),
         flash_split, flash_whole),
    Case("safe-softmax-is-softmax", ins("Q:2x4x8", "K:2x8x6", "V:2x6x8"),
         softmax_av, safe_softmax_av),
    Case("safe-softmax-fp16", ins("Q:2x4x8", "K:2x8x6", "V:2x6x8", dtype=F16),
         softmax_av, safe_softmax_av),
    Case("causal-softmax-late-division", ins("Q:2x6x8", "K:2x8x6", "V:2x6x8"),
         lambda Q, K, V: causal_av(Q, K, V), lambda Q, K, V: causal_av(Q, K, V, late=True)),
    Case("mask-select-distributes", ins("A:3x4", "B:3x4", "M:3x4:bool"),
         lambda A, B, M: em.where(M, A, B) * 2.0, lambda A, B, M: em.where(M, A * 2.0, B * 2.0)),
    # issue 52: a bool mask's logical not swaps where's values, and ~~M is M
    # issue 52: a gather is linear in its table; an RMSNorm of the rows gathered is the
    # rows of the normed table (ids drawn in [0, 6), both extremes)
    Case("embedding-commutes-with-rms-norm", ins("E:6x8", "ids:2x3:int64"),
         lambda E, ids: em.rms_norm(em.embedding(E, ids)),
         lambda E, ids: em.embedding(em.rms_norm(E), ids)),
    # take_along_axis (torch.gather) is linear in its table the same way
    Case("take-along-axis-commutes-with-exp", ins("X:3x6", "i:3x4:int64"),
         lambda X, i: em.exp(em.take_along_axis(X, i, 1)),
         lambda X, i: em.take_along_axis(em.exp(X), i, 1)),
    Case("mask-not-swaps-where", ins("A:3x4", "B:3x4", "M:3x4:bool"),
         lambda A, B, M: em.where(~M, A, B), lambda A, B, M: em.where(~~M, B, A)),
    # issue 52: a comparison is a keyed bit of a - b: x - y against 0 is x against y
    Case("comparisons-keep-their-difference", ins("X:3x4", "Y:3x4"),
         lambda X, Y: compare_all(X, Y), lambda X, Y: compare_all(X, Y, diff=True)),
    # issue 52: masks combined: and / or commute, and De Morgan's laws hold (a * b and
    # a + b - a * b in the field), for mask inputs and for comparisons' bits
    Case("mask-and-commutes", ins("S:2x3x4", "M:3x4:bool", "N:4:bool"),
         lambda S, M, N: em.softmax(em.where(M & N, S, float("-inf"))),
         lambda S, M, N: em.softmax(em.where(N & M, S, float("-inf")))),
    Case("mask-de-morgan", ins("A:3x4", "B:3x4", "M:3x4:bool", "N:3x4:bool"),
         lambda A, B, M, N: {"D1": em.where(~(M & N), A, B), "D2": em.where(~(M | N), A, B)},
         lambda A, B, M, N: {"D1": em.where(~M | ~N, A, B), "D2": em.where(~M & ~N, A, B)}),
    Case("compared-masks-de-morgan", ins("X:3x4", "Y:3x4", "M:3x4:bool"),
         lambda X, Y, M: em.where(~((X > Y) | M), X, Y),
         lambda X, Y, M: em.where(em.logical_and(~(X > Y), ~M), X, Y)),
    Case("flash-decoding-max-rescaled", ins("Q:4x8", "K1:8x6", "K2:8x6", "V1:6x8", "V2:6x8"),
         flash_whole_safe, flash_split_safe),
    Case("gated-mlp-commute", ins("X:4x8", "W1:8x6", "W2:8x6"),
         lambda X, W1, W2: em.silu(X @ W1) * (X @ W2),
         lambda X, W1, W2: (X @ W2) * em.silu(X @ W1)),
    Case("ntrans-lerp", ins("H:4x8", "N:4x8", "a:1x8"),
         lambda H, N, a: H + a * (N - H), lambda H, N, a: (1.0 - a) * H + a * N),
    Case("two-outputs", ins("A:4x8", "B:8x3"),
         lambda A, B: {"P": A @ B, "S": (A @ B).sum(axis=0)},
         lambda A, B: {"S": A.sum(axis=0) @ B, "P": A @ B}),
    # issue 15: RoPE's halves, GELU's opaque functions, casts (exact in the field)
    Case("rotary-tables-commute", ins("X:4x8", "P:4x8"),
         lambda X, P: X * em.cos(P) + X * em.sin(P), lambda X, P: (em.sin(P) + em.cos(P)) * X),
    Case("rope-slices-of-a-matmul", ins("X:4x8", "W:8x6"),
         lambda X, W: em.concat([-(X @ W)[:, 3:], (X @ W)[:, :3]], axis=1),
         lambda X, W: em.concat([-(X @ W[:, 3:]), X @ W[:, :3]], axis=1)),
    Case("gelu-tanh-commutes", ins("X:4x8", "W:8x6"),
         lambda X, W: em.gelu(X @ W, approximate="tanh") + em.erf(X @ W),
         lambda X, W: em.erf(X @ W) + em.gelu(X @ W, approximate="tanh")),
    Case("cast-round-trip-fp16", ins("X:4x8", "W:8x6", dtype=F16),
         lambda X, W: (X.astype(F32) @ W.astype(F32)).astype(F16),
         lambda X, W: (X.astype(F32) @ W.astype(F32)).astype(F16) * 1.0),
]


MUTANTS = [
    # issue 53: the nibbles swapped
    Case("nibbles-swapped", ins("B:4x6:uint8"),
         lambda B: (B & 15).astype(F32) + (B >> 4).astype(F32) * 16.0,
         lambda B: (B >> 4).astype(F32) + (B & 15).astype(F32) * 16.0),
    Case("wrong-reduction-axis", ins("X:4x4"),
         lambda X: X.sum(axis=0), lambda X: X.sum(axis=1)),
    Case("sum-over-wrong-axes", ins("X:3x4x4"),
         lambda X: X.sum(axis=(0, 1)), lambda X: X.sum(axis=(0, 2))),
    Case("transposed-operand", ins("A:4x4", "B:4x3"),
         lambda A, B: A @ B, lambda A, B: A.T @ B),
    Case("matmul-order-square", ins("A:4x4", "B:4x4"),
         lambda A, B: A @ B, lambda A, B: B @ A),
    Case("matmul-assoc-misordered", ins("A:4x4", "B:4x4", "C:4x4"),
         lambda A, B, C: (A @ B) @ C, lambda A, B, C: (A @ C) @ B),
    Case("transpose-of-matmul-unswapped", ins("A:4x4", "B:4x4"),
         lambda A, B: (A @ B).T, lambda A, B: A.T @ B.T),
    Case("exp-of-sum-vs-sum-of-exp", ins("X:3x4"),
         lambda X: em.exp(X.sum(axis=-1)), lambda X: em.exp(X).sum(axis=-1)),
    Case("exp-add-as-sum", ins("A:3x4", "B:3x4"),
         lambda A, B: em.exp(A + B), lambda A, B: em.exp(A) + em.exp(B)),
    Case("exp-mul-as-product", ins("A:3x4", "B:3x4"),
         lambda A, B: em.exp(A * B), lambda A, B: em.exp(A) * em.exp(B)),
    Case("exp-sub-as-product", ins("A:3x4", "B:3x4", dtype=F16),
         lambda A, B: em.exp(A - B), lambda A, B: em.exp(A) * em.exp(B)),
    Case("swapped-division", ins("A:3x4", "B:3x4"),
         lambda A, B: A / B, lambda A, B: B / A),
    Case("missing-1-over-n", ins("X:4x8"),
         lambda X: X.mean(axis=-1), lambda X: X.sum(axis=-1)),
    Case("mean-wrong-n", ins("X:4x8"),
         lambda X: X.mean(axis=-1), lambda X: X.sum(axis=-1) / 7.0),
    # 1/6 is not a float: the field sees the exact dyadic constant, so this is a real difference.
    Case("mean-inexact-reciprocal", ins("X:4x6"),
         lambda X: X.mean(axis=-1), lambda X: X.sum(axis=-1) * (1 / 6)),
    Case("mean-vs-sum-keepdims-fp16", ins("X:4x8", dtype=F16),
         lambda X: X.mean(axis=0, keepdims=True), lambda X: X.sum(axis=0, keepdims=True)),
    Case("rope-halves-swapped", ins("X:4x8"),
         lambda X: em.concat([-X[:, 4:], X[:, :4]], axis=1),
         lambda X: em.concat([-X[:, :4], X[:, 4:]], axis=1)),
    Case("tanh-for-erf", ins("X:4x8"), lambda X: em.tanh(X) * 2.0, lambda X: em.erf(X) * 2.0),
    Case("sin-for-cos", ins("X:4x8", "C:4x8"), lambda X, C: X * em.cos(C),
         lambda X, C: X * em.sin(C)),
    Case("swapped-concat-order", ins("A:2x4", "B:2x4"),
         lambda A, B: em.concat([A, B], 0), lambda A, B: em.concat([B, A], 0)),
    Case("concat-wrong-axis", ins("A:2x4", "B:2x4"),
         lambda A, B: em.concat([A, B], 0), lambda A, B: em.concat([A, B], 1).reshape(4, 4)),
    Case("lora-swapped-blocks", ins("W:6x4", "X:4x5", "A:4x4", "B:6x4"),
         lora_lhs, lambda W, X, A, B: em.concat([W, B], 1) @ em.concat([A @ X, X], 0)),
    Case("broadcast-row-vs-column", ins("X:4x4", "S:4"),
         lambda X, S: X / S.reshape(4, 1), lambda X, S: X / S.reshape(1, 4)),
    Case("keepdims-row-vs-column", ins("X:4x4"),
         lambda X: X / X.sum(axis=-1, keepdims=True), lambda X: X / X.sum(axis=0, keepdims=True)),
    Case("dropped-term", ins("A:4x8", "B:8x3", "C:4x3"),
         lambda A, B, C: A @ B + C, lambda A, B, C: A @ B),
    Case("dropped-division", ins("X:4x8", "S:4x1", "W:8x5"),
         lambda X, S, W: (X / S) @ W, lambda X, S, W: X @ W),
    Case("off-by-constant", ins("X:4x8"), lambda X: X * 1.0000001, lambda X: X),
    Case("off-by-constant-matmul", ins("A:4x8", "B:8x3"),
         lambda A, B: (A @ B) * 1.0000001, lambda A, B: A @ B),
    Case("relu-vs-identity", ins("X:3x4"), lambda X: em.relu(X), lambda X: X),
    Case("silu-vs-relu", ins("X:3x4"), lambda X: em.silu(X), lambda X: em.relu(X)),
    Case("sqrt-vs-rsqrt", ins("X:3x4"), lambda X: em.sqrt(X), lambda X: em.rsqrt(X)),
    Case("sqrt-vs-rsqrt-fp16", ins("X:3x4", dtype=F16),
         lambda X: em.sqrt(X) + 1.0, lambda X: em.rsqrt(X) + 1.0),
    Case("rsqrt-vs-reciprocal", ins("X:3x4"), lambda X: em.rsqrt(X), lambda X: 1.0 / X),
    Case("silu-not-additive", ins("A:3x4", "B:3x4"),
         lambda A, B: em.silu(A + B), lambda A, B: em.silu(A) + em.silu(B)),
    Case("relu-argument-negated", ins("A:3x4", "B:3x4"),
         lambda A, B: em.relu(A - B), lambda A, B: em.relu(B - A)),
    Case("sub-reversed", ins("A:3x4", "B:3x4"), lambda A, B: A - B, lambda A, B: B - A),
    Case("neg-missing", ins("X:3x4"), lambda X: -X, lambda X: X),
    Case("reshape-is-not-transpose", ins("X:2x8"), lambda X: X.T, lambda X: X.reshape(8, 2)),
    Case("split-reduction-mixes-rows", ins("X:4x12"),
         lambda X: X.sum(axis=-1),
         lambda X: X.reshape(12, 4).sum(axis=-1).reshape(3, 4).sum(axis=0)),
    Case("rms-norm-missing-weight", ins("X:4x8", "w:8"),
         lambda X, w: em.rms_norm(X, w), lambda X, w: em.rms_norm(X) + w * 0.0),
    Case("rms-norm-other-eps", ins("X:4x8"),
         lambda X: em.rms_norm(X, eps=1e-6), lambda X: em.rms_norm(X, eps=1e-5)),
    Case("attention-unnormalized", ins("Q:2x4x8", "K:2x8x6", "V:2x6x8"),
         softmax_av, lambda Q, K, V: em.exp(Q @ K) @ V),
    Case("attention-normalized-over-queries", ins("Q:4x8", "K:8x4", "V:4x8"),
         softmax_av, lambda Q, K, V: (em.exp(Q @ K) / em.exp(Q @ K).sum(axis=0, keepdims=True))
         @ V),
    Case("causal-mask-shifted-by-one", ins("Q:2x6x8", "K:2x8x6", "V:2x6x8"),
         lambda Q, K, V: causal_av(Q, K, V), lambda Q, K, V: causal_av(Q, K, V, offset=1)),
    # issue 52: masked_fill(M, -inf) keeps the scores where ~M holds; the not dropped
    # issue 52: a gather reading the next row (off by one), or along the other axis
    Case("embedding-off-by-one", ins("E:6x8", "ids:2x3:int64"),
         lambda E, ids: em.embedding(E, ids),
         lambda E, ids: em.embedding(em.concat([E[1:], E[:1]], 0), ids)),
    Case("index-select-wrong-axis", ins("X:6x6", "c:4:int32"),
         lambda X, c: em.index_select(X, 0, c), lambda X, c: em.index_select(X, 1, c).T),
    Case("take-along-axis-wrong-axis", ins("X:5x5", "i:5x5:int32"),
         lambda X, i: em.take_along_axis(X, i, 1), lambda X, i: em.take_along_axis(X, i, 0)),
    # issue 52: a comparison the wrong way round, or its where's branches swapped
    Case("comparison-flipped", ins("X:3x4", "Y:3x4"),
         lambda X, Y: em.where(X > Y, X - Y, Y), lambda X, Y: em.where(X < Y, X - Y, Y)),
    Case("comparison-branches-swapped", ins("S:3x4"),
         lambda S: em.where(S > 0.0, S, 0.1 * S), lambda S: em.where(S > 0.0, 0.1 * S, S)),
    # issue 52: an and where the program has an or (padding | causal for padding & causal)
    Case("mask-and-for-or", ins("S:2x4x6", "M:4x6:bool", "N:6:bool"),
         lambda S, M, N: em.softmax(em.where(M | N, S, float("-inf"))),
         lambda S, M, N: em.softmax(em.where(M & N, S, float("-inf")))),
    Case("masked-fill-not-dropped", ins("S:2x4x6", "M:4x6:bool"),
         lambda S, M: em.softmax(em.where(~M, S, float("-inf"))),
         lambda S, M: em.softmax(em.where(M, S, float("-inf")))),
    Case("safe-softmax-max-over-wrong-axis", ins("Q:4x8", "K:8x6", "V:6x8"),
         safe_softmax_av, lambda Q, K, V: (lambda S: (lambda E: E / E.sum(
             axis=-1, keepdims=True))(em.exp(S - S.max(axis=0, keepdims=True))) @ V)(Q @ K)),
    Case("flash-decoding-missing-rescale",
         ins("Q:4x8", "K1:8x6", "K2:8x6", "V1:6x8", "V2:6x8"),
         flash_whole_safe, flash_split_mutant("missing")),
    Case("flash-decoding-rescale-wrong-sign",
         ins("Q:4x8", "K1:8x6", "K2:8x6", "V1:6x8", "V2:6x8"),
         flash_whole_safe, flash_split_mutant("sign")),
    Case("flash-decoding-stale-max", ins("Q:4x8", "K1:8x6", "K2:8x6", "V1:6x8", "V2:6x8"),
         flash_whole_safe, flash_split_mutant("stale")),
    Case("batch-broadcast-wrong-sum", ins("A:2x1x4x8", "B:1x2x8x5"),
         lambda A, B: (A @ B).sum(axis=1), lambda A, B: (A @ B).sum(axis=0)),
    Case("one-output-wrong", ins("A:4x8", "B:8x3"),
         lambda A, B: {"P": A @ B, "S": (A @ B).sum(axis=0)},
         lambda A, B: {"P": A @ B, "S": (A @ B).sum(axis=0) * 2.0}, output="S"),
]


def _ids(cases: list[Case]) -> list[str]:
    return [c.name for c in cases]


def test_catalogue_sizes_and_unique_names():
    assert len(IDENTITIES) >= 30 and len(MUTANTS) >= 30
    names = _ids(IDENTITIES) + _ids(MUTANTS)
    assert len(names) == len(set(names))


def test_identities_cover_every_op():
    used = set()
    for case in IDENTITIES:
        for g in case.programs():
            used |= {node.op for node in g.nodes()}
    assert set(em.Op) - used == set()


@pytest.mark.parametrize("case", IDENTITIES, ids=_ids(IDENTITIES))
def test_identity_is_equivalent(case: Case):
    a, b = case.programs()
    res = em.verify(a, b, trials=3, seed=IDENTITIES.index(case))
    assert res.equivalent, str(res)
    assert res.counterexample is None
    # a comparison's bit is a coin: the trials go on until 2^-T is under max_bound (30)
    assert res.trials == (3 if not compared(a) else 30) and res.float_checked
    assert 0.0 < res.false_positive_bound < 1e-6


@pytest.mark.parametrize("case", MUTANTS, ids=_ids(MUTANTS))
def test_mutant_is_caught(case: Case):
    a, b = case.programs()
    res = em.verify(a, b, trials=3, seed=MUTANTS.index(case))
    assert not res.equivalent
    assert not res
    cex = res.counterexample
    assert cex is not None, res.reason
    assert cex.output in a.outputs
    if case.output is not None:
        assert cex.output == case.output
    assert cex.output in str(res)
    assert len(cex.index) == len(a.outputs[cex.output].shape)
    assert cex.value_a != cex.value_b


@pytest.mark.parametrize("case", IDENTITIES[:6], ids=_ids(IDENTITIES[:6]))
def test_identity_verdict_is_symmetric(case: Case):
    a, b = case.programs()
    assert em.verify(b, a, trials=2, seed=1).equivalent
