"""Numerically safe attention: em.max, em.softmax, their field semantics and realistic logits.

Logits of 20-40 (what a QK-normed or unscaled head produces) overflow float16's exp
(e^11.1 = 65504) and float32's (e^88.7). The max-subtracted form stays finite wherever
eager torch does, is verified equal to the unsafe form by the field test (softmax is
invariant to a shift of its row), and runs finite when compiled (Triton interpreter).
"""

import attention_graphs
import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.semantics.field import FieldCtx, evaluate_field
from eqsat_mirage.semantics.primes import field_primes


def attention(safe: bool, b=2, m=16, d=64, n=128, dtype="float16") -> em.Graph:
    """The shared attention, scores unscaled."""
    return attention_graphs.attention(safe, dtype, b, m, d, n)


def logits_inputs(top: float, b=2, m=16, d=64, n=128, seed=0) -> dict[str, np.ndarray]:
    """Q, K, V whose largest |score| is ``top`` (the scores of one row spread over +-top)."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((b, m, d)), rng.standard_normal((b, d, n))
    scale = np.sqrt(top / np.abs(q @ k).max())
    return {"Q": q * scale, "K": k * scale, "V": rng.standard_normal((b, n, d))}


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("top", [20.0, 40.0])
def test_safe_softmax_is_finite_where_the_unsafe_one_overflows(dtype, d, top):
    x = logits_inputs(top, d=d)
    ref = em.evaluate(attention(True, d=d, dtype=dtype), x)["O"]  # float64
    got = em.evaluate(attention(True, d=d, dtype=dtype), x, dtype="native")["O"]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, atol=2e-2 if dtype == "float16" else 1e-4)
    if dtype == "float16":  # e^20 > 65504: the unsafe form is not finite anywhere it matters
        unsafe = em.evaluate(attention(False, d=d, dtype=dtype), x, dtype="native")["O"]
        assert not np.isfinite(unsafe).all()


def test_safe_and_unsafe_attention_verify_equal_in_the_field():
    res = em.verify(attention(False, dtype="float32"), attention(True, dtype="float32"), seed=0)
    assert res.equivalent and res.false_positive_bound <= 1e-9, res
    # in float16 the unsafe form is the one that overflows: the safe one may replace it
    res = em.verify(attention(False), attention(True), seed=0)
    assert res.equivalent, res
    # ... but not the other way round: the unsafe one overflows where the safe one is finite
    back = em.verify(attention(True), attention(False), seed=0)
    # (refused by the static check: the max subtraction is dropped; the draws agree)
    assert not back.equivalent and back.counterexample.domain in ("native dtype",
                                                                   "float safety (static)")


def test_row_max_in_the_field_depends_on_the_row_only():
    g = em.Graph("maxes")
    x = g.input("X", (3, 4, 5), "float32")
    g.output(x.max(axis=(0, 2)), "both")
    g.output(x.max(axis=0, keepdims=True).max(axis=2, keepdims=True).reshape(4), "nested")
    g.output(x.transpose(2, 1, 0).max(axis=(0, 2)), "transposed")
    g.output(x.max(axis=2), "last")
    p, q = field_primes()
    ctx = FieldCtx(p, q, np.random.default_rng(0))
    ctx.inputs = ctx.random_inputs(g)
    out = evaluate_field(g, ctx)
    np.testing.assert_array_equal(out["both"][0], out["nested"][0])
    # the max is associative over a partition of the row: the order of the axes is free
    np.testing.assert_array_equal(out["both"][0], out["transposed"][0])
    assert len(set(out["last"][0].ravel().tolist())) == 12  # rows differ: values differ


def tiled_max(kind: str) -> em.Graph:
    """``exp(X).max(axis=(0, 1))`` computed as ``kind`` says (issue 51)."""
    g = em.Graph(kind)
    e = em.exp(g.input("X", (8, 16), "float32"))
    if kind == "whole":
        m = e.max(axis=(0, 1))
    elif kind == "rows_then_columns":
        m = e.max(axis=1).max(axis=0)
    elif kind == "tiles":  # the max of the maxes of 4-element tiles of each row
        m = e.reshape((8, 4, 4)).max(axis=2).max(axis=(1, 0))
    elif kind == "missing_one":  # a max over all but the last element
        m = e.reshape((128,))[0:127].max(axis=0)
    elif kind == "one_twice":  # a max over a wrong multiset: row 0 stands in for row 7
        m = em.concat([e[0:7], e[0:1]], axis=0).max(axis=(0, 1))
    else:  # "rows_only": the max of the rows' maxes of half of the rows
        m = e[0:4].max(axis=1).max(axis=0)
    g.output(m, "M")
    return g


@pytest.mark.parametrize("kind", ["rows_then_columns", "tiles"])
def test_a_max_of_maxes_over_a_partition_of_the_row_verifies(kind):
    """Issue 51: the max of partial maxes (a tiled, looped or split max) over a partition of
    the row is the row's max, and verifies against it, both ways."""
    for a, b in ((tiled_max("whole"), tiled_max(kind)), (tiled_max(kind), tiled_max("whole"))):
        res = em.verify(a, b, seed=0)
        assert res.equivalent and res.false_positive_bound <= 1e-9, res


@pytest.mark.parametrize("kind", ["missing_one", "one_twice", "rows_only"])
def test_a_max_over_a_wrong_set_is_refused(kind):
    res = em.verify(tiled_max("whole"), tiled_max(kind), seed=0)
    assert not res.equivalent and res.counterexample.domain == "Z_p x Z_q", res


def test_a_looped_row_max_output_verifies():
    """Issue 51: a custom kernel whose loop keeps a running maximum writes the row max
    itself (not only a softmax it cancels in); it verifies against the whole-row max."""
    from eqsat_mirage.fusion.lower import lower
    from eqsat_mirage.fusion.schedule import Schedule

    g = em.Graph("rowmax_loop")
    x = g.input("X", (4, 512), "float32")
    m = x.max(axis=-1, keepdims=True)
    g.output(m, "M")
    g.output(em.exp(x - m).sum(axis=-1, keepdims=True), "S")
    for sched in (Schedule(grid=(("a", 2),), loop="b", forloop=8),
                  Schedule(grid=(("a", 2), ("b", 4)), split="b")):
        mg = lower(g, sched)
        assert any(k.maxima for k in mg.kernels if k.kind == "custom")
        res = em.verify(g, mg, seed=0)
        assert res.equivalent and res.false_positive_bound <= 1e-9, res


def test_max_shift_cancels_only_along_the_softmax_axis():
    g, h = attention(True, dtype="float32"), em.Graph("wrong")
    q, k, v = (h.input(n, node.shape, node.dtype) for n, node in g.inputs.items())
    s = q @ k
    e = em.exp(s - s.max(axis=1, keepdims=True))  # max over the queries: does not cancel
    h.output((e / e.sum(axis=-1, keepdims=True)) @ v, "O")
    res = em.verify(g, h, seed=1, float_check=False)
    assert not res.equivalent and res.counterexample.domain == "Z_p x Z_q"


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("d", [64, 128])
def test_optimized_safe_attention_runs_finite_when_compiled(dtype, d):
    torch = pytest.importorskip("torch")
    g = attention(True, n=256, d=d, dtype=dtype)
    res = em.optimize(g, cache=None, time_limit_s=60)
    assert res.verified is not None and res.verified.equivalent
    x = logits_inputs(30.0, n=256, d=d, seed=2)
    fn = res.compile()
    t = {k: torch.tensor(v, dtype=getattr(torch, dtype)) for k, v in x.items()}
    out = fn(**t)
    got = (out["O"] if isinstance(out, dict) else out).float().numpy()
    ref = em.evaluate(g, x)["O"]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, atol=2e-2 if dtype == "float16" else 1e-3)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("d", [64, 128])
def test_torch_softmax_through_the_backend_is_finite_on_large_logits(dtype, d):
    """Logits with a maximum of 30 (eager fp16 is finite: it subtracts the max too)."""
    torch = pytest.importorskip("torch")

    def f(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v

    x = {k: torch.tensor(v, dtype=getattr(torch, dtype)).transpose(-1, -2) if k == "K" else
         torch.tensor(v, dtype=getattr(torch, dtype))
         for k, v in logits_inputs(30.0, b=1, m=8, d=d, n=64, seed=3).items()}
    be = em.backend(warmup=0, time_limit_s=30, trials=2)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(f, backend=be)(x["Q"], x["K"], x["V"])
        want = f(*(t.double() for t in (x["Q"], x["K"], x["V"])))
        assert torch.isfinite(f(x["Q"], x["K"], x["V"])).all()  # eager is finite
    assert torch.isfinite(got).all()
    tol = 2e-2 if dtype == "float16" else 1e-4
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    assert [r.status for r in be.report] == ["optimized"]


def test_search_finds_the_online_softmax_kernel():
    """From plain safe-softmax attention the search finds one kernel with a running max:
    the score matrix never goes to device memory, and it costs no more than the unsafe
    form's plan (within 1.15x)."""
    safe = attention(True, b=2, m=128, d=64, n=2048)
    res = em.optimize(safe, cache=None, time_limit_s=60)
    assert res.verified is not None and res.verified.equivalent, res.stats.get("note")
    customs = [k for k in res.program.kernels if k.kind == "custom"]
    assert len(res.program.kernels) == 1 and customs and customs[0].maxima
    assert customs[0].rescaled() and customs[0].forloop > 1
    scores = (2, 128, 2048)
    assert all(spec.shape != scores for spec in res.program.tensors.values())
    unsafe = em.optimize(attention(False, b=2, m=128, d=64, n=2048), cache=None,
                         time_limit_s=60)
    assert res.cost_us <= 1.15 * unsafe.cost_us, (res.cost_us, unsafe.cost_us)


def test_sdpa_converts_to_safe_attention_and_runs_through_the_backend():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F  # noqa: N812

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    q = q * 12.0  # scaled logits up to about 40
    g = em.from_torch(f, q, k, v)
    assert sum(n.op is em.Op.MAX for n in g.nodes()) == 1
    got = em.evaluate(g, {n: t.double().numpy() for n, t in zip(g.inputs, (q, k, v))})["out"]
    want = f(q.double(), k.double(), v.double()).numpy()
    np.testing.assert_allclose(got, want, atol=1e-12)
    be = em.backend(warmup=0, time_limit_s=30, trials=2, min_ops=1)  # one FX node: the SDPA call
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(f, backend=be)(q, k, v)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), torch.from_numpy(want), rtol=1e-4, atol=1e-5)
    assert [r.status for r in be.report] == ["optimized"]


@pytest.mark.parametrize("kw", [dict(dropout_p=0.1)])
def test_sdpa_with_masks_or_dropout_is_refused_by_name(kw):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F  # noqa: N812

    x = torch.randn(1, 2, 8, 16)
    with pytest.raises(em.UnsupportedOpError, match="scaled_dot_product_attention with"):
        em.from_torch(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw), x, x, x)


def test_the_logit_scale_runs_only_what_the_exp_arguments_need():
    """``Draws.logit_scale`` evaluates only the exp arguments' ancestors (not the rest of a
    layer) and finds the scale a whole-program evaluation finds."""
    import numpy as np

    from eqsat_mirage.ir.node import Op
    from eqsat_mirage.semantics.floating import FLOAT_SEMANTICS, float_ctx
    from eqsat_mirage.semantics.interp import run
    from eqsat_mirage.verifier import draws as draws_mod
    from eqsat_mirage.verifier import scales as scales_mod

    g = em.Graph("attn_mlp")
    q, k = g.input("Q", (2, 8, 16), "float16"), g.input("K", (2, 16, 8), "float16")
    v, w = g.input("V", (2, 8, 16), "float16"), g.input("W", (16, 32), "float16")
    s = q @ k
    p = em.exp(s - s.max(axis=-1, keepdims=True))
    o = (p / p.sum(axis=-1, keepdims=True)) @ v
    g.output(em.silu(o @ w), "Y")
    d = draws_mod.Draws(g, np.random.default_rng(0), {})
    ran = []
    real = scales_mod.run
    scales_mod.run = lambda prog, *a, **kw: ran.append(len(prog.nodes())) or real(prog, *a, **kw)
    try:
        got = d.logit_scale()
    finally:
        scales_mod.run = real
    assert ran and max(ran) < len(g.nodes())  # the MLP after the attention did not run
    exps = [n.srcs[0] for n in g.nodes() if n.op is Op.EXP]

    def spread(scale):
        env = run(g, FLOAT_SEMANTICS, float_ctx(g, d.inputs("signed", scale), None, False),
                  outputs=False)
        return max(float(np.std(env[id(n)])) for n in exps)

    s1, s2 = spread(1.0), spread(2.0)
    degree = min(max(np.log2(s2 / s1), 0.5), 4.0)
    assert got == pytest.approx((scales_mod.LOGIT_STD / s1) ** (1.0 / degree), rel=1e-12)
