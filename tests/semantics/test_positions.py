"""Integer positions as values (issue 52): an int64/int32 input that no gather reads may be
cast to a float dtype (``positions.float() * inv_freq``, as rotary embeddings compute their
angles). The verifier draws such an input as a value (all of Z_p in the field, integers in
``[0, POSITIONS)`` in the float checks), not as the zeros of an index into nothing, so a
rewrite that drops or rescales the positions is refused.
"""

# ruff: noqa: E402

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.ir.errors import DTypeError
from eqsat_mirage.semantics.gather import POSITIONS, index_bounds, value_inputs

torch = pytest.importorskip("torch")

SEQ, HALF = 16, 8


def rope(body, dtype="float32", idtype="int64"):
    """A graph of ``body(x, angles)``, angles = positions (1, SEQ, 1) cast times inv (1, 1,
    HALF); x (1, SEQ, HALF)."""
    g = em.Graph("rope")
    pos = g.input("pos", (1, SEQ, 1), dtype=idtype)
    inv = g.input("inv", (1, 1, HALF), dtype="float32")
    x = g.input("x", (1, SEQ, HALF), dtype=dtype)
    g.output(body(x, pos.astype("float32") * inv), "y")
    return g


def rotate(x, f):
    return x * em.cos(f) + x * em.sin(f)


def test_positions_cast_evaluates_as_torch():
    g = rope(rotate)
    pos, inv = np.arange(SEQ).reshape(1, SEQ, 1), np.full((1, 1, HALF), 0.25, np.float32)
    x = np.random.default_rng(0).standard_normal((1, SEQ, HALF)).astype(np.float32)
    got = em.evaluate(g, {"pos": pos, "inv": inv, "x": x})["y"]
    t = torch.from_numpy(pos).float() * torch.from_numpy(inv)
    want = torch.from_numpy(x) * t.cos() + torch.from_numpy(x) * t.sin()
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6)


def test_a_cast_position_is_a_value_not_an_index():
    g = rope(rotate)
    assert index_bounds(g) == {} and value_inputs(g) == ["pos"]
    pos = em.Graph("ints").input("pos", (SEQ,), dtype="int64")
    with pytest.raises(DTypeError, match="integer index tensor"):
        _ = pos * 2.0  # arithmetic on the integers themselves: not yet


@pytest.mark.parametrize("idtype", ["int64", "int32"])
def test_verify_accepts_a_true_rewrite_and_refuses_dropped_or_scaled_positions(idtype):
    def factored(x, f):
        return x * (em.cos(f) + em.sin(f))

    assert em.verify(rope(rotate, idtype=idtype), rope(factored, idtype=idtype),
                     seed=0).equivalent
    for wrong in (lambda x, f: x * em.cos(f) + x * em.sin(f * 2.0),  # angles doubled
                  lambda x, f: x * em.cos(f * 0.0) + x * em.sin(f * 0.0)):  # positions lost
        assert not em.verify(rope(rotate, idtype=idtype), rope(wrong, idtype=idtype),
                             seed=0).equivalent


def test_optimized_rope_runs_its_triton_kernels():
    g = rope(rotate)
    res = em.optimize(g, time_limit_s=300)
    assert res.verified.equivalent and res.cost_us < res.baseline_cost_us
    pos = torch.randint(0, POSITIONS, (1, SEQ, 1))
    inv, x = torch.full((1, 1, HALF), 0.01), torch.randn(1, SEQ, HALF)
    got = res.compile()(pos=pos, inv=inv, x=x)
    got = got["y"] if isinstance(got, dict) else got
    t = pos.float() * inv
    torch.testing.assert_close(got, x * t.cos() + x * t.sin())


def test_backend_optimizes_transformers_rotary_embedding():
    """LlamaRotaryEmbedding (transformers' own code): ``position_ids[..., None].float() *
    inv_freq``, cos and sin; every compute op optimized, equal to eager."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=64)
    mod = LlamaRotaryEmbedding(cfg).eval()
    x, pos = torch.randn(1, SEQ, 64), torch.arange(SEQ)[None] + 5
    torch._dynamo.reset()
    be = em.backend(time_limit_s=300, warn=False, warmup=0, cache=False)
    with torch.no_grad():
        want = mod(x, pos)
        got = torch.compile(mod, backend=be)(x, pos)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    s = be.summary()
    assert s["compute_ops"] >= 4 and s["optimized_compute_ops"] == s["compute_ops"], s


def causal_from_positions(op):
    """softmax(s) where ``op(k, q)`` holds: k (1, 1, SEQ) and q (1, SEQ, 1) integer positions."""
    g = em.Graph("positions_mask")
    q = g.input("q", (1, SEQ, 1), dtype="int64")
    k = g.input("k", (1, 1, SEQ), dtype="int64")
    s = g.input("s", (1, SEQ, SEQ), dtype="float32")
    g.output(em.softmax(em.where(op(k, q), s, float("-inf")), axis=-1), "y")
    return g


def test_integer_positions_compare_exactly_and_le_is_not_lt():
    g = causal_from_positions(em.le)
    pos = np.arange(SEQ)
    s = np.random.default_rng(0).standard_normal((1, SEQ, SEQ)).astype(np.float32)
    got = em.evaluate(g, {"q": pos.reshape(1, SEQ, 1), "k": pos.reshape(1, 1, SEQ), "s": s})
    want = torch.softmax(torch.from_numpy(s).masked_fill(
        torch.from_numpy(pos[None, :] > pos[:, None])[None], float("-inf")), -1)
    np.testing.assert_allclose(got["y"], want.numpy(), rtol=1e-6, atol=1e-7)
    assert em.verify(g, causal_from_positions(em.le), seed=0).equivalent
    assert not em.verify(g, causal_from_positions(em.lt), seed=0).equivalent
    h = em.Graph("mixed")  # an integer tensor against a float one: cast it first
    with pytest.raises(DTypeError, match="float tensors or integer"):
        em.le(h.input("k", (SEQ,), dtype="int64"), h.input("s", (SEQ,), dtype="float32"))


def test_backend_optimizes_a_mask_built_from_integer_positions():
    """transformers' masking_utils builds the SDPA mask from integer positions and the int64
    attention_mask: ``kv_idx <= q_idx``, ``attention_mask.to(torch.bool)``, ``&``. Every
    compute op runs optimized, equal to eager."""

    def masked_softmax(s, pos, am):
        kv = torch.arange(SEQ)
        m = (kv[None, None, :] <= pos[:, :, None]) & am[:, None, :].to(torch.bool)
        return torch.softmax(s.masked_fill(~m, float("-inf")), dim=-1)

    s, pos = torch.randn(1, SEQ, SEQ), torch.arange(SEQ)[None] + 3
    am = torch.ones(1, SEQ, dtype=torch.long)
    am[0, :2] = 0  # two padded keys: every row still has one
    torch._dynamo.reset()
    be = em.backend(time_limit_s=300, warn=False, warmup=0, cache=False)
    with torch.no_grad():
        want = masked_softmax(s, pos, am)
        got = torch.compile(masked_softmax, backend=be)(s, pos, am)
    torch.testing.assert_close(got, want)
    summary = be.summary()  # (compute ops: those computing floats; the mask ops are bool)
    assert summary["optimized_compute_ops"] == summary["compute_ops"] > 0, summary["eager"]
    assert [r.status for r in be.report] == ["optimized"], [r.reason for r in be.report]
    assert {"operator.le", "Tensor.to", "operator.and_"} <= set(be.report[0].ops)
