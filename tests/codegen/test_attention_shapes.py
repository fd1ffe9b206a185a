"""A LLaMA layer's attention piece at every sequence length and head dim (issue 31: a layer
at sequence 16 crashed code generation, ``_fold`` on a whole-mask tile, and sent the layer
eager). For causal GQA attention with a max-subtracted softmax at sequence lengths 1..130
and head dims 32..128, the fusion planner's plan lowers to Triton, and the generated module,
run under the CPU interpreter, equals the input program evaluated in float64.

The plan is not searched by ``em.optimize`` here (that is the layer tests' job, and costs a
search per example): this exercises the planner's schedules and the code generator over the
shapes, which is where the crash was.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import eqsat_mirage as em
from eqsat_mirage.codegen.source import compile_mugraph
from eqsat_mirage.fusion.planner import plan

torch = pytest.importorskip("torch")


def attention(seq: int, head_dim: int, kv_heads: int = 2, group: int = 2) -> em.Graph:
    """LLaMA's attention core: q (kv, group*seq, d) against k (kv, d, seq), causal mask per
    query's position, softmax scaled by d^-1/2, then @ v; float32."""
    g = em.Graph(f"attn_s{seq}_d{head_dim}")
    q = g.input("q", (kv_heads, group, seq, head_dim), dtype="float32")
    k = g.input("k", (kv_heads, 1, head_dim, seq), dtype="float32")
    v = g.input("v", (kv_heads, 1, seq, head_dim), dtype="float32")
    s = (q @ k) * head_dim ** -0.5
    s = em.where(em.causal_mask(g, seq, seq), s, float("-inf"))
    g.output(em.softmax(s, axis=-1) @ v, "o")
    return g


@pytest.mark.slow
@settings(deadline=None, max_examples=16, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate],  # no shrinking: the example is printed
          suppress_health_check=[HealthCheck.too_slow])
@given(seq=st.integers(1, 130), head_dim=st.sampled_from([32, 48, 64, 80, 96, 128]))
def test_causal_gqa_attention_plans_and_lowers_at_every_shape(seq, head_dim):
    g = attention(seq, head_dim)
    fp = plan(g, "h100")
    assert fp.mugraph.kernels, fp.regions
    rng = np.random.default_rng(seq * 1000 + head_dim)
    inputs = {n: rng.standard_normal(node.shape).astype(np.float32)
              for n, node in g.inputs.items()}
    want = em.evaluate(g, {n: x.astype(np.float64) for n, x in inputs.items()})["o"]
    run = compile_mugraph(fp.mugraph)
    got = run(**{n: torch.from_numpy(x) for n, x in inputs.items()})["o"].double().numpy()
    assert got.shape == want.shape
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())
