"""The six benchmark programs of DESIGN.md ("Benchmarks"), built with the public API.

Each benchmark is a function ``batch -> em.Graph`` (fp16 inputs) registered in
``BENCHMARKS``; ``program(name, batch)`` builds one and ``cases()`` lists the
twelve (name, batch) pairs the results table covers (batch sizes 1 and 8).

``rewritten(name, batch)`` builds, for each benchmark, a hand-rewritten program
that is EQUIVALENT to ``program(name, batch)``: the kind of rewrite the
optimizer makes (softmax division moved after the matmul, the RMS scale moved
after the matmul, LoRA's concat form, split-K, the nTrans algebra expanded).
The pairs are what ``bench/verify_bench.py`` verifies; they are also a fixed
test set for the verifier until the optimizer produces its own candidates.

Shapes (b = batch size), exactly as DESIGN.md's table:

========  =====================================================================
gqa       Q(2b,256,64)  K(2b,64,4096)  V(2b,4096,64)
qknorm    same as gqa (rms_norm on Q over its last axis, on K over axis 1)
rmsnorm   X(2b,4096)  W(4096,6144)
lora      X(16,256)  W(256,4096)  A(256,16)  B(16,4096)   (independent of b)
gatedmlp  X(8,4096)  W1(4096,4096)  W2(4096,4096)          (independent of b)
ntrans    H(8b,4096)  X(8b,4096)  alpha(8b,4096)
========  =====================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import eqsat_mirage as em

DTYPE = "float16"
BATCHES = (1, 8)
EPS = 1e-6  # rms_norm epsilon everywhere (em.rms_norm's default)


def _graph(name: str, batch: int, form: str, shapes: dict[str, tuple[int, ...]]):
    g = em.Graph(f"{name}_b{batch}" + ("" if form == "program" else f"_{form}"))
    return g, [g.input(k, s, dtype=DTYPE) for k, s in shapes.items()]


def _rms(x: em.Tensor, axis: int) -> em.Tensor:
    """The RMS-norm scale ``rsqrt(mean(x*x) + eps)`` over ``axis`` (kept as size 1)."""
    return em.rsqrt((x * x).mean(axis=axis, keepdims=True) + EPS)


# ---------------------------------------------------------------- GQA

def _gqa_shapes(b: int) -> dict[str, tuple[int, ...]]:
    return {"Q": (2 * b, 256, 64), "K": (2 * b, 64, 4096), "V": (2 * b, 4096, 64)}


def gqa(batch: int) -> em.Graph:
    """Attention core: ``A = exp(Q@K); O = (A / sum(A, -1)) @ V``."""
    g, (q, k, v) = _graph("gqa", batch, "program", _gqa_shapes(batch))
    a = em.exp(q @ k)
    g.output((a / a.sum(axis=-1, keepdims=True)) @ v, "O")
    return g


def gqa_rewritten(batch: int) -> em.Graph:
    """Softmax division moved after the second matmul: ``(A @ V) / sum(A, -1)``."""
    g, (q, k, v) = _graph("gqa", batch, "rewritten", _gqa_shapes(batch))
    a = em.exp(q @ k)
    g.output((a @ v) / a.sum(axis=-1, keepdims=True), "O")
    return g


# ---------------------------------------------------------------- QKNorm

def qknorm(batch: int) -> em.Graph:
    """GQA with ``rms_norm`` on Q (over its last axis, the head dim) and on K.

    K is laid out (2b, head_dim, keys), so its head dim is axis 1.
    """
    g, (q, k, v) = _graph("qknorm", batch, "program", _gqa_shapes(batch))
    a = em.exp(em.rms_norm(q, eps=EPS, axis=-1) @ em.rms_norm(k, eps=EPS, axis=1))
    g.output((a / a.sum(axis=-1, keepdims=True)) @ v, "O")
    return g


def qknorm_rewritten(batch: int) -> em.Graph:
    """Both RMS scales moved after ``Q@K`` (a row and a column scale), and the
    softmax division moved after the second matmul."""
    g, (q, k, v) = _graph("qknorm", batch, "rewritten", _gqa_shapes(batch))
    a = em.exp((q @ k) * _rms(q, -1) * _rms(k, 1))
    g.output((a @ v) / a.sum(axis=-1, keepdims=True), "O")
    return g


# ---------------------------------------------------------------- RMSNorm + Linear

def _rmsnorm_shapes(b: int) -> dict[str, tuple[int, ...]]:
    return {"X": (2 * b, 4096), "W": (4096, 6144)}


def rmsnorm(batch: int) -> em.Graph:
    """``rms_norm(X) @ W``."""
    g, (x, w) = _graph("rmsnorm", batch, "program", _rmsnorm_shapes(batch))
    g.output(em.rms_norm(x, eps=EPS) @ w, "O")
    return g


def rmsnorm_rewritten(batch: int) -> em.Graph:
    """The division by the RMS (a row scalar) moved after the matmul:
    ``(X @ W) * rsqrt(mean(X*X) + eps)``."""
    g, (x, w) = _graph("rmsnorm", batch, "rewritten", _rmsnorm_shapes(batch))
    g.output((x @ w) * _rms(x, -1), "O")
    return g


# ---------------------------------------------------------------- LoRA

def _lora_shapes(b: int) -> dict[str, tuple[int, ...]]:
    # DESIGN.md gives LoRA one set of shapes: the batch size does not change them,
    # so batch 1 and batch 8 build the same program (kept as in Mirage's table).
    return {"X": (16, 256), "W": (256, 4096), "A": (256, 16), "B": (16, 4096)}


def lora(batch: int) -> em.Graph:
    """``X@W + (X@A)@B``."""
    g, (x, w, a, b) = _graph("lora", batch, "program", _lora_shapes(batch))
    g.output(x @ w + (x @ a) @ b, "O")
    return g


def lora_rewritten(batch: int) -> em.Graph:
    """The concat form: ``concat([X, X@A], 1) @ concat([W, B], 0)`` (one matmul)."""
    g, (x, w, a, b) = _graph("lora", batch, "rewritten", _lora_shapes(batch))
    g.output(em.concat([x, x @ a], axis=1) @ em.concat([w, b], axis=0), "O")
    return g


# ---------------------------------------------------------------- GatedMLP

def _gatedmlp_shapes(b: int) -> dict[str, tuple[int, ...]]:
    # As for LoRA, DESIGN.md's shapes do not depend on the batch size.
    return {"X": (8, 4096), "W1": (4096, 4096), "W2": (4096, 4096)}


def _split_k(x: em.Tensor, w: em.Tensor, parts: int) -> em.Tensor:
    """``x @ w`` as split-K: the contraction cut into ``parts`` chunks by reshapes,
    a batched matmul per chunk, then a sum over the chunks (a reassociation of the
    matmul's reduction, in the op set: there is no slice op)."""
    m, k = x.shape
    n = w.shape[1]
    xs = x.reshape(m, parts, k // parts).transpose(1, 0, 2)  # (parts, m, k/parts)
    ws = w.reshape(parts, k // parts, n)  # (parts, k/parts, n)
    return (xs @ ws).sum(axis=0)


def gatedmlp(batch: int) -> em.Graph:
    """``silu(X@W1) * (X@W2)``."""
    g, (x, w1, w2) = _graph("gatedmlp", batch, "program", _gatedmlp_shapes(batch))
    g.output(em.silu(x @ w1) * (x @ w2), "O")
    return g


def gatedmlp_rewritten(batch: int) -> em.Graph:
    """Both matmuls as split-K (4 and 2 chunks), the second one transposed:
    ``silu(splitk(X, W1)) * splitk(W2^T, X^T)^T``. (The fused form
    ``X @ concat([W1, W2], 1)`` needs a slice to split its result, and the IR
    has none.)"""
    g, (x, w1, w2) = _graph("gatedmlp", batch, "rewritten", _gatedmlp_shapes(batch))
    up = _split_k(w2.T, x.T, 2).T  # (X @ W2)^T^T, contraction split in two
    g.output(em.silu(_split_k(x, w1, 4)) * up, "O")
    return g


# ---------------------------------------------------------------- nTrans

def _ntrans_shapes(b: int) -> dict[str, tuple[int, ...]]:
    return {"H": (8 * b, 4096), "X": (8 * b, 4096), "alpha": (8 * b, 4096)}


def ntrans(batch: int) -> em.Graph:
    """The normalized-transformer update ``norm(H + alpha * (norm(X) - H))``, with
    ``norm`` the RMS norm over the hidden axis."""
    g, (h, x, alpha) = _graph("ntrans", batch, "program", _ntrans_shapes(batch))
    g.output(em.rms_norm(h + alpha * (em.rms_norm(x, eps=EPS) - h), eps=EPS), "O")
    return g


def ntrans_rewritten(batch: int) -> em.Graph:
    """The algebra expanded, ``H*(1-alpha) + alpha*norm(X)``, and both norms written
    out as a product with the RMS scale."""
    g, (h, x, alpha) = _graph("ntrans", batch, "rewritten", _ntrans_shapes(batch))
    y = h * (1.0 - alpha) + alpha * (x * _rms(x, -1))
    g.output(y * _rms(y, -1), "O")
    return g


# ---------------------------------------------------------------- safe attention (issue 14)
#
# Mirage's six are kept as they are (for comparison with the paper); these are the forms a
# real model uses: softmax with its row max subtracted (em.softmax), on the same shapes.


def gqa_safe(batch: int) -> em.Graph:
    """GQA with a numerically safe softmax: ``softmax(Q@K) @ V``."""
    g, (q, k, v) = _graph("gqa_safe", batch, "program", _gqa_shapes(batch))
    g.output(em.softmax(q @ k, axis=-1) @ v, "O")
    return g


def qknorm_safe(batch: int) -> em.Graph:
    """QKNorm with a numerically safe softmax (its logits reach about 35 on normed inputs)."""
    g, (q, k, v) = _graph("qknorm_safe", batch, "program", _gqa_shapes(batch))
    s = em.rms_norm(q, eps=EPS, axis=-1) @ em.rms_norm(k, eps=EPS, axis=1)
    g.output(em.softmax(s, axis=-1) @ v, "O")
    return g


def causal(batch: int) -> em.Graph:
    """Causal attention at a prefill shape (queries = keys = 1024, 2b heads of dim 64):
    ``softmax(where(causal, Q@K, -inf)) @ V``."""
    shapes = {"Q": (2 * batch, 1024, 64), "K": (2 * batch, 64, 1024), "V": (2 * batch, 1024, 64)}
    g, (q, k, v) = _graph("causal", batch, "program", shapes)
    s = em.where(g.causal_mask(1024, 1024), q @ k, float("-inf"))
    g.output(em.softmax(s, axis=-1) @ v, "O")
    return g


SAFE: dict[str, Callable[[int], em.Graph]] = {"gqa_safe": gqa_safe, "qknorm_safe": qknorm_safe,
                                              "causal": causal}

# ---------------------------------------------------------------- registry

BENCHMARKS: dict[str, Callable[[int], em.Graph]] = {
    "gqa": gqa,
    "qknorm": qknorm,
    "rmsnorm": rmsnorm,
    "lora": lora,
    "gatedmlp": gatedmlp,
    "ntrans": ntrans,
}

REWRITTEN: dict[str, Callable[[int], em.Graph]] = {
    "gqa": gqa_rewritten,
    "qknorm": qknorm_rewritten,
    "rmsnorm": rmsnorm_rewritten,
    "lora": lora_rewritten,
    "gatedmlp": gatedmlp_rewritten,
    "ntrans": ntrans_rewritten,
}

# The input shapes of every benchmark as a function of the batch size (DESIGN.md's table).
SHAPES: dict[str, Callable[[int], dict[str, tuple[int, ...]]]] = {
    "gqa": _gqa_shapes,
    "qknorm": _gqa_shapes,
    "rmsnorm": _rmsnorm_shapes,
    "lora": _lora_shapes,
    "gatedmlp": _gatedmlp_shapes,
    "ntrans": _ntrans_shapes,
}


def _lookup(table: dict[str, Callable[[int], em.Graph]], name: str, batch: int) -> em.Graph:
    if name not in table:
        raise em.MirageError(f"unknown benchmark {name!r}; choose one of {', '.join(table)}")
    if not isinstance(batch, int) or batch < 1:
        raise em.MirageError(f"benchmark {name!r}: batch size must be a positive int, "
                             f"got {batch!r}")
    return table[name](batch)


def program(name: str, batch: int = 1) -> em.Graph:
    """The benchmark ``name`` (one of Mirage's six, or a safe form in ``SAFE``) at batch
    size ``batch``, as written by a user."""
    return _lookup({**BENCHMARKS, **SAFE}, name, batch)


def rewritten(name: str, batch: int = 1) -> em.Graph:
    """A hand-rewritten program equivalent to ``program(name, batch)``."""
    return _lookup(REWRITTEN, name, batch)


@contextmanager
def dtype(name: str) -> Iterator[None]:
    """Build the benchmarks with inputs of dtype ``name`` (float16 by default) inside the
    block: the GPU bundle's bfloat16 cases."""
    global DTYPE
    old, DTYPE = DTYPE, name
    try:
        yield
    finally:
        DTYPE = old


def cases() -> Iterator[tuple[str, int]]:
    """The twelve (name, batch) pairs of the results table."""
    for name in BENCHMARKS:
        for batch in BATCHES:
            yield name, batch
