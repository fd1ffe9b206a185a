"""Masks: em.where, causal masks, masked softmax, in every table, the search and the codegen.

A masked score is ``em.where(mask, S, -inf)`` (IR op ``mask``): its exp is 0 where masked.
In the field it is a value with its mask attached: exp gives ``mask * exp(S)`` and max a
random function of the kept values, so a mask shifted by one is caught; anything else done
to a -inf is refused before a verdict.
"""

import re

import numpy as np
import pytest

import eqsat_mirage as em


def causal_attention(n=64, d=16, offset=0, dtype="float32", late=False):
    g = em.Graph("causal")
    q = g.input("Q", (2, n, d), dtype)
    k = g.input("K", (2, d, n), dtype)
    v = g.input("V", (2, n, d), dtype)
    s = em.where(g.causal_mask(n, n, offset), q @ k, float("-inf"))
    if late:
        e = em.exp(s - s.max(axis=-1, keepdims=True))
        out = (e @ v) / e.sum(axis=-1, keepdims=True)
    else:
        out = em.softmax(s, axis=-1) @ v
    g.output(out, "O")
    return g


def _inputs(g, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(node.shape) * scale for n, node in g.inputs.items()}


def _reference(x, offset=0):
    s = x["Q"] @ x["K"]
    s = np.where(np.tri(s.shape[-2], s.shape[-1], offset, dtype=bool), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ x["V"]


def test_causal_attention_evaluates_like_a_masked_softmax():
    g = causal_attention()
    x = _inputs(g, scale=3.0)
    np.testing.assert_allclose(em.evaluate(g, x)["O"], _reference(x), atol=1e-12)
    native = em.evaluate(causal_attention(dtype="float16"), x, dtype="native")["O"]
    assert np.isfinite(native).all()


def test_mask_semantics_in_the_field():
    res = em.verify(causal_attention(), causal_attention(late=True), seed=0)
    assert res.equivalent and res.false_positive_bound <= 1e-9, res
    for off in (1, 2):  # (-1 masks row 0 whole: its sum vanishes, "inconclusive")
        bad = em.verify(causal_attention(), causal_attention(offset=off), seed=0,
                        float_check=False)
        assert not bad.equivalent and bad.counterexample.domain == "Z_p x Z_q"


def test_bool_mask_inputs_select():
    g = em.Graph("sel")
    a = g.input("A", (3, 4), "float32")
    m = g.input("M", (3, 4), "bool")
    g.output(em.where(m, a * 2.0, a - 1.0), "Y")
    x = {"A": np.arange(12.0).reshape(3, 4), "M": np.eye(3, 4)}
    want = np.where(np.eye(3, 4) > 0, x["A"] * 2.0, x["A"] - 1.0)
    np.testing.assert_array_equal(em.evaluate(g, x)["Y"], want)
    h = em.Graph("sel2")
    a2, m2 = h.input("A", (3, 4), "float32"), h.input("M", (3, 4), "bool")
    h.output(em.where(m2, a2 - 1.0, a2 * 2.0), "Y")  # the branches swapped
    assert not em.verify(g, h, seed=0).equivalent


@pytest.mark.parametrize("build, match", [
    (lambda g, s, c: em.where(c, s, float("-inf")).sum(axis=-1), "uses a masked value"),
    (lambda g, s, c: em.where(c, s, float("-inf")), "holds -inf where masked"),
    (lambda g, s, c: em.exp(-em.where(c, s, float("-inf"))), "uses a masked value"),
])
def test_what_the_verifier_cannot_follow_is_refused(build, match):
    g = em.Graph("bad")
    s = g.input("S", (4, 4), "float32")
    g.output(build(g, s, g.causal_mask(4)), "Y")
    with pytest.raises(em.LaxError, match=match):
        em.check_lax(g)


def test_mask_errors_name_the_problem():
    g = em.Graph("errs")
    s = g.input("S", (4, 4), "float32")
    m = g.input("M", (4, 4), "bool")
    with pytest.raises(em.GraphError, match="bool mask"):
        em.where(s, s, 0.0)
    with pytest.raises(em.GraphError, match="third argument"):
        em.where(m, float("-inf"), s)
    with pytest.raises(em.DTypeError, match="bool mask can only"):
        _ = s + m
    with pytest.raises(em.ShapeError, match="rows, cols"):
        g.causal_mask(0, 4)


def test_search_fuses_causal_attention_with_a_running_max():
    g = causal_attention(n=256, d=64, dtype="float16")
    res = em.optimize(g, cache=None, time_limit_s=60)
    assert res.verified is not None and res.verified.equivalent
    customs = [k for k in res.program.kernels if k.kind == "custom"]
    assert customs and customs[0].maxima
    assert all(spec.shape != (2, 256, 256) for spec in res.program.tensors.values())
    assert res.cost_us < 0.5 * res.baseline_cost_us
    src = res.triton_source()  # the mask: computed from positions, never written or read
    assert ".tril(" not in src and "from positions (not loaded)" in src
    assert "causal: skip masked tiles" in src
    # exp(s - m) as exp2 with log2(e) folded: one multiply-add per score, m scaled per row
    assert re.search(r"tl\.exp2\(v\d+ \* 1\.4426950408889634 - max\w+\[:, None\] \* "
                     r"1\.4426950408889634\)", src)
    again = em.MuGraph.from_dict(res.program.to_dict())
    assert str(again) == str(res.program)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_compiled_causal_attention_matches_torch(dtype):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F  # noqa: N812

    g = causal_attention(n=128, d=32, dtype=dtype)
    res = em.optimize(g, cache=None, time_limit_s=60)
    torch.manual_seed(0)
    t = getattr(torch, dtype)
    q, k, v = (torch.randn(2, 128, 32).to(t) * 2 for _ in range(3))
    out = res.compile()(q, k.transpose(-1, -2).contiguous(), v)
    got = (out["O"] if isinstance(out, dict) else out).float()
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True,
                                          scale=1.0)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=5e-3 if dtype == "float16" else 1e-4, rtol=0)


def test_sdpa_causal_and_bool_masks_convert():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F  # noqa: N812

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    mask = torch.rand(1, 2, 8, 8) < 0.7
    mask[..., 0] = True  # no row fully masked
    def causal(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def masked(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    for f, extra in ((causal, ()), (masked, (mask,))):
        g = em.from_torch(f, q, k, v, *extra)
        # causal: -inf where masked (a causal row keeps column 0); a bool mask: the lowest
        # finite value, and 0 on a row it keeps nowhere (as eager)
        op = em.Op.MASK if f is causal else em.Op.WHERE
        assert any(n.op is op for n in g.nodes())
        feed = {n: t.double().numpy() if t.dtype != torch.bool else t.numpy()
                for n, t in zip(g.inputs, (q, k, v, *extra))}
        want = f(q.double(), k.double(), v.double(), *extra).numpy()
        np.testing.assert_allclose(em.evaluate(g, feed)["out"], want, atol=1e-12)


def test_fully_masked_tiles_are_skipped_only_when_they_change_nothing():
    from eqsat_mirage.cost.gpucost import kept_fraction
    from eqsat_mirage.fusion.lower import lower
    from eqsat_mirage.fusion.schedule import Schedule
    from eqsat_mirage.mugraph.online import causal_skip

    g = causal_attention(n=128, d=16, late=True)
    res = em.optimize(g, cache=None, time_limit_s=60)
    (k,) = [k for k in res.program.kernels if k.kind == "custom"]
    causal = {c.output: c.node.arg for c in res.program.kernels if c.kind == "predefined"}
    assert causal_skip(k, causal) is not None
    frac = kept_fraction(k, res.program)
    assert 0.5 < frac < 1.0  # about half the key tiles of a square causal mask
    assert "f_end = tl.minimum(" in res.triton_source()
    # an accumulator the mask does not empty (a plain sum of V) forbids the skip
    for extra, skips in ((False, True), (True, False)):
        h = em.Graph("extra")
        q, kk, v = (h.input(n, node.shape, node.dtype) for n, node in g.inputs.items())
        m = h.input("M", (128, 128), "bool")  # standing for the causal mask tensor
        s = em.where(m, q @ kk, float("-inf"))
        e = em.exp(s - s.max(axis=-1, keepdims=True))
        o = (e @ v) / e.sum(axis=-1, keepdims=True)
        h.output(o + v.sum(axis=1, keepdims=True) if extra else o, "O")
        mg = lower(h, Schedule(grid=(("a", 2), ("b", 4)), loop="d", forloop=4))
        (c,) = [c for c in mg.kernels if c.kind == "custom"]
        assert (causal_skip(c, {"M": (128, 128, 0)}) is not None) is skips


def test_torch_where_and_masked_fill_convert():
    torch = pytest.importorskip("torch")

    def filled(s, m):
        return torch.softmax(s.masked_fill(m, -1e4), -1)

    def masked(s, keep):
        return torch.where(keep, s, float("-inf")).softmax(-1)

    torch.manual_seed(0)
    s = torch.randn(2, 4, 4)
    m = torch.rand(2, 4, 4) < 0.3
    m[..., 0] = False  # every row keeps its first score
    for fn, mask in ((filled, m), (masked, ~m)):
        g = em.from_torch(fn, s, mask)
        got = em.evaluate(g, {"s": s.double().numpy(), "m" if fn is filled else "keep":
                              mask.numpy()})
        np.testing.assert_allclose(next(iter(got.values())), fn(s.double(), mask).numpy(),
                                   atol=1e-12)
    # a -inf fill where a bool input holds: the kept positions are its logical not, computed
    # in the program (issue 52; a second input before, issue 31; refused before that)
    from eqsat_mirage.frontend.from_torch import graph_inputs

    def neg_inf(s, m):
        return s.masked_fill(m, float("-inf")).softmax(-1)

    g = em.from_torch(neg_inf, s, m)
    assert list(g.inputs) == ["s", "m"] and any(n.op is em.Op.NOT for n in g.nodes())
    feed = {k: v.double().numpy() if v.is_floating_point() else v.numpy()
            for k, v in graph_inputs(g, neg_inf, s, m).items()}
    np.testing.assert_allclose(em.evaluate(g, feed)["out"], neg_inf(s.double(), m).numpy(),
                               atol=1e-12)


@pytest.mark.parametrize("split", [False, True])
def test_tiles_and_splits_a_mask_empties_give_no_nan(split):
    """Rows with nothing kept yet (a fully masked first tile, or a whole split) keep their
    running maximum at -inf; the loop subtracts 0 instead, so no NaN reaches the output."""
    from eqsat_mirage.fusion.lower import lower
    from eqsat_mirage.fusion.schedule import Schedule

    g = em.Graph("masked_late")
    q = g.input("Q", (2, 64, 16), "float32")
    k = g.input("K", (2, 16, 128), "float32")
    v = g.input("V", (2, 128, 16), "float32")
    m = g.input("M", (64, 128), "bool")
    s = em.where(m, q @ k, float("-inf"))
    e = em.exp(s - s.max(axis=-1, keepdims=True))
    g.output((e @ v) / e.sum(axis=-1, keepdims=True), "O")
    sched = (Schedule(grid=(("a", 2), ("b", 2), ("d", 4)), split="d") if split else
             Schedule(grid=(("a", 2), ("b", 2)), loop="d", forloop=4))
    mg = lower(g, sched)
    rng = np.random.default_rng(0)
    x = {n: rng.standard_normal(node.shape) for n, node in g.inputs.items() if n != "M"}
    x["M"] = np.tri(64, 128, 64 - 128 + 40)  # row r keeps keys <= r + 40: late tiles empty
    x["M"][:, 100:] = 1.0  # and every row keeps the last keys: a first tile can be empty
    want = em.evaluate(g, x)["O"]
    assert np.isfinite(want).all()
    for dtype in (None, "native"):
        got = em.evaluate(mg, x, dtype=dtype)["O"]
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, atol=1e-4 if dtype else 1e-12)
    assert em.verify(g, mg, seed=0).equivalent


@pytest.mark.parametrize("split", [False, True])
def test_compiled_kernels_give_no_nan_where_a_mask_empties_tiles(split):
    torch = pytest.importorskip("torch")
    from eqsat_mirage.codegen.source import compile_mugraph
    from eqsat_mirage.fusion.lower import lower
    from eqsat_mirage.fusion.schedule import Schedule

    g = em.Graph("masked_late")
    q = g.input("Q", (2, 64, 16), "float32")
    k = g.input("K", (2, 16, 128), "float32")
    v = g.input("V", (2, 128, 16), "float32")
    m = g.input("M", (64, 128), "bool")
    s = em.where(m, q @ k, float("-inf"))
    e = em.exp(s - s.max(axis=-1, keepdims=True))
    g.output((e @ v) / e.sum(axis=-1, keepdims=True), "O")
    sched = (Schedule(grid=(("a", 2), ("b", 2), ("d", 4)), split="d") if split else
             Schedule(grid=(("a", 2), ("b", 2)), loop="d", forloop=4))
    mg = lower(g, sched)
    torch.manual_seed(0)
    x = {n: torch.randn(node.shape) for n, node in g.inputs.items() if n != "M"}
    mask = torch.from_numpy(np.tri(64, 128, 64 - 128 + 40) > 0)
    mask[:, 100:] = True
    out = compile_mugraph(mg)(x["Q"], x["K"], x["V"], mask)
    got = (out["O"] if isinstance(out, dict) else out).numpy()
    want = em.evaluate(g, {**{n: t.double().numpy() for n, t in x.items()},
                           "M": mask.numpy()})["O"]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_bool_masks_reach_the_optimizer_through_torch_compile():
    torch = pytest.importorskip("torch")

    def f(s, v, keep):
        return torch.where(keep, s, float("-inf")).softmax(-1) @ v

    torch.manual_seed(0)
    s, v = torch.randn(2, 8, 8) * 4, torch.randn(2, 8, 4)
    keep = torch.rand(2, 8, 8) < 0.7
    keep[..., 0] = True
    be = em.backend(warmup=0, time_limit_s=30, trials=2)
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(f, backend=be)(s, v, keep)
    torch.testing.assert_close(out.double(), f(s.double(), v.double(), keep), rtol=1e-5,
                               atol=1e-5)
    assert [r.status for r in be.report] == ["optimized"]
