"""The attention program the verifier tests share: ``softmax(Q @ K * scale) @ V``, written
max-subtracted (``em.softmax``) when ``safe``, else as ``exp(s) / sum(exp(s))`` (equal over
the reals, unsafe in floating point)."""

from __future__ import annotations

import eqsat_mirage as em


def attention(safe: bool, dtype: str = "float16", b: int = 2, m: int = 16, d: int = 64,
              n: int = 128, scale: float | None = None) -> em.Graph:
    """Q (b, m, d), K (b, d, n), V (b, n, d) in ``dtype``; the scores scaled by ``scale``
    when given."""
    g = em.Graph("attn_safe" if safe else "attn")
    q, k = g.input("Q", (b, m, d), dtype), g.input("K", (b, d, n), dtype)
    v = g.input("V", (b, n, d), dtype)
    s = q @ k if scale is None else (q @ k) * scale
    if safe:
        p = em.softmax(s, axis=-1)
    else:
        e = em.exp(s)
        p = e / e.sum(axis=-1, keepdims=True)
    g.output(p @ v, "O")
    return g
