"""Running maxima in custom kernels (online softmax): meaning, verification, codegen, errors."""

import numpy as np
import pytest
from mugraph_examples import online_attention

import eqsat_mirage as em
from eqsat_mirage.mugraph.kernels import MuGraphError


def _inputs(g, scale=4.0, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(v.shape) * (scale if n != "V" else 1.0)
            for n, v in g.inputs.items()}


def test_online_attention_equals_safe_softmax_in_float64():
    g, mg = online_attention()
    x = _inputs(g, scale=6.0)
    np.testing.assert_allclose(em.evaluate(mg, x)["O"], em.evaluate(g, x)["O"], atol=1e-12)


def test_online_attention_is_finite_in_float16_on_large_logits():
    g, mg = online_attention(dtype="float16")
    x = {n: v.astype(np.float16).astype(np.float64)  # scores up to about 200: e^200
         for n, v in _inputs(g, scale=8.0).items()}   # overflows every float dtype
    got = em.evaluate(mg, x, dtype="native")["O"]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, em.evaluate(g, x)["O"], atol=2e-2)


def test_online_attention_verifies_and_its_mutants_do_not():
    g, mg = online_attention()
    res = em.verify(g, mg, seed=0)
    assert res.equivalent and res.false_positive_bound <= 1e-9, res
    for mistake in ("no-max", "sum-not-rescaled"):
        g2, bad = online_attention(mistake)
        res = em.verify(g2, bad, seed=0, float_check=False)  # the field alone catches them
        assert not res.equivalent and res.counterexample.domain == "Z_p x Z_q", mistake


def test_listing_and_json_keep_the_running_maximum():
    _, mg = online_attention()
    text = str(mg)
    assert "acc m = max(m, %1)" in text and "acc o = o * exp(m_old - m_run) + %4" in text
    again = em.MuGraph.from_dict(mg.to_dict())
    assert again.kernels[0].maxima == ["m"] and str(again) == text


def test_running_reads_only_max_accumulators():
    _, mg = online_attention()
    k = mg.kernels[0]
    with pytest.raises(MuGraphError, match="not a max accumulator"):
        k.running("o")
    with pytest.raises(MuGraphError, match="how="):
        k.accumulate(k.running("m"), "z", how="min")


def test_a_maximum_may_not_read_its_own_running_value():
    g, _ = online_attention()
    mg = em.MuGraph("bad")
    for name, node in g.inputs.items():
        mg.input(name, node.shape, node.dtype)
    k = mg.custom_kernel(grid=(2, 2), forloop=4)
    q = k.input("Q", imap={0: 0, 1: 1})
    kk = k.input("K", imap={0: 0}, fmap=2)
    s = q @ kk
    k.accumulate(s.max(axis=2, keepdims=True), "m", how="max")
    k.loop.outputs["m"] = (s - k.running("m")).max(axis=2, keepdims=True).node
    k.output(k.accumulate(em.exp(s - k.running("m")).sum(axis=2, keepdims=True), "l"), "L",
             omap={0: 0, 1: 1})
    mg.output("L")
    with pytest.raises(MuGraphError, match="reads a running maximum"):
        mg.validate()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_compiled_online_kernel_matches(dtype):
    torch = pytest.importorskip("torch")
    from eqsat_mirage.codegen.source import compile_mugraph, triton_source

    g, mg = online_attention(dtype=dtype)
    src = triton_source(mg)
    assert "tl.maximum(acc_m, " in src and "acc_o = acc_o * alpha_m[:, None] + " in src
    x = _inputs(g, scale=5.0, seed=3)
    t = {n: torch.tensor(v, dtype=getattr(torch, dtype)) for n, v in x.items()}
    out = compile_mugraph(mg)(**t)
    got = (out["O"] if isinstance(out, dict) else out).float().numpy()
    want = em.evaluate(g, {n: v.float().numpy() for n, v in t.items()})["O"]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=2e-3 if dtype == "float16" else 1e-5)
