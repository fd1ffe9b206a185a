"""A matmul reading a concat along its contraction dim beside a whole operand (GPT-NeoX's
partial rotary: ``q @ concat(rotated, passed).T`` with parts of 16 and 48): the Triton
backend cuts the whole operand in the same parts (issue 31: the backend refused every such
plan, each re-plan picked the same structure at other tile sizes, and the attention piece
of a GPT-NeoX layer came back as one kernel per op, 69.79 us instead of 9.97)."""

from __future__ import annotations

import numpy as np
import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")


def partial_rotary_scores(rot: int = 16, d: int = 64, seq: int = 32) -> em.Graph:
    """q @ concat(k[..., :rot] * c, k[..., rot:]).T, softmax, @ v; float32."""
    g = em.Graph("partial_rotary")
    q = g.input("q", (2, seq, d), dtype="float32")
    k = g.input("k", (2, seq, d), dtype="float32")
    c = g.input("c", (1, seq, rot), dtype="float32")
    v = g.input("v", (2, seq, d), dtype="float32")
    kk = em.concat([k[:, :, :rot] * c, k[:, :, rot:]], axis=2)
    s = q @ kk.transpose((0, 2, 1))
    g.output(em.softmax(s, axis=-1) @ v, "o")
    return g


def test_a_k_split_concat_beside_a_whole_operand_is_fused_and_runs():
    g = partial_rotary_scores()
    res = em.optimize(g, time_limit_s=600, cache=False)
    assert res.verified is not None and res.verified.equivalent, res.stats.get("note")
    assert res.cost_us < res.baseline_cost_us
    refused = [p.get("compiled", "") for p in res.stats["plans"]]
    assert not any("reads a concat of tiles" in r for r in refused), refused
    rng = np.random.default_rng(0)
    x = {n: rng.standard_normal(node.shape).astype(np.float32) for n, node in g.inputs.items()}
    want = em.evaluate(g, {n: a.astype(np.float64) for n, a in x.items()})["o"]
    fn = res.compile()  # its first launch is checked against the input program in torch
    got = fn(**{n: torch.from_numpy(a) for n, a in x.items()})["o"].double().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def rotary_query_scores(d: int = 32, seq: int = 32) -> em.Graph:
    """LLaMA's rotary query against whole keys: (q * c + concat(-q2, q1) * s) @ k.T,
    softmax, @ v; float32 (the rotated half is the concat, K is the transposed input)."""
    g = em.Graph("rotary_query")
    half = d // 2
    q = g.input("q", (2, 1, d), dtype="float32")
    k = g.input("k", (2, seq, d), dtype="float32")
    c = g.input("c", (1, 1, d), dtype="float32")
    s = g.input("s", (1, 1, d), dtype="float32")
    v = g.input("v", (2, seq, d), dtype="float32")
    rot = em.concat([-q[:, :, half:], q[:, :, :half]], axis=2)
    scores = (q * c + rot * s) @ k.transpose((0, 2, 1))
    g.output(em.softmax(scores, axis=-1) @ v, "o")
    return g


def test_a_k_split_concat_beside_a_transposed_input_is_cut_through_the_transpose():
    """The whole operand is ``k.T``: it is cut in the concat's parts through the transpose
    (a decode step's attention; the backend had refused every cheaper plan of it)."""
    g = rotary_query_scores()
    res = em.optimize(g, time_limit_s=600, cache=False)
    assert res.verified is not None and res.verified.equivalent, res.stats.get("note")
    refused = [p.get("compiled", "") for p in res.stats["plans"]]
    assert not any("reads a concat of tiles" in r for r in refused), refused
    rng = np.random.default_rng(1)
    x = {n: rng.standard_normal(node.shape).astype(np.float32) for n, node in g.inputs.items()}
    want = em.evaluate(g, {n: a.astype(np.float64) for n, a in x.items()})["o"]
    got = res.compile()(**{n: torch.from_numpy(a) for n, a in x.items()})["o"].double().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
