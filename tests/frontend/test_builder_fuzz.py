"""Random values thrown at the builder API give only project errors (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import eqsat_mirage as em

ODD = st.one_of(st.integers(-10, 10), st.integers(min_value=2**40), st.floats(allow_nan=True),
                st.text(max_size=4), st.none(), st.booleans(),
                st.lists(st.integers(-3, 5), max_size=4).map(tuple),
                st.lists(st.integers(-3, 5), max_size=3),
                st.integers(-3, 5).map(np.int64), st.just([[1, 2]]), st.just({1}))
DTYPES = st.one_of(st.sampled_from(["float16", "float32", "bfloat16", "int8", "", "f16"]),
                   ODD)


def _build(name, shape, dtype, axis, keepdims, const, eps, perm):
    g = em.Graph(name)
    x = g.input("x", shape, dtype=dtype)
    y = g.input("y", (4, 6), dtype="float32")
    steps = [lambda t: t.sum(axis=axis, keepdims=keepdims), lambda t: t.mean(axis=axis),
             lambda t: t * const, lambda t: const + t, lambda t: t / const,
             lambda t: t.transpose(*perm) if isinstance(perm, tuple) else t.transpose(perm),
             lambda t: em.rms_norm(t, eps=eps), lambda t: em.concat([t, y], axis=axis),
             lambda t: t.reshape(perm), lambda t: t @ y, lambda t: em.exp(t)]
    out = x
    for step in steps:
        try:
            out = step(out)
        except em.MirageError:
            continue
    g.output(out, "out")
    return g


@settings(max_examples=300, deadline=None)
@given(name=st.one_of(st.just("g"), st.text(max_size=6), ODD),
       shape=st.one_of(st.sampled_from([(4, 6), (2, 4, 6), (6,), (4, 6, 1)]), ODD),
       dtype=st.one_of(st.just("float32"), DTYPES), axis=ODD, keepdims=ODD, const=ODD, eps=ODD,
       perm=ODD)
def test_the_builder_raises_only_project_errors(name, shape, dtype, axis, keepdims, const,
                                                eps, perm):
    try:
        g = _build(name, shape, dtype, axis, keepdims, const, eps, perm)
    except em.MirageError:
        return
    if any(np.prod(node.shape, dtype=float) > 2**22 for node in g.inputs.values()):
        return  # a valid graph too large to evaluate here (a string shape: 1024 per letter)
    inputs = {n: np.ones(node.shape) for n, node in g.inputs.items()}
    try:
        out = em.evaluate(g, inputs)["out"]
    except em.MirageError:
        return
    assert out.shape == g.outputs["out"].shape
