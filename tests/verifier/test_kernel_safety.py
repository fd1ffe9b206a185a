"""The static float-safety checks inside a MuGraph's kernels (verifier/kernelsafe.py,
docs/verifier.md section 5): a custom kernel that rounds to float16 a value the input
program computes in float32, or takes an exp the input max-subtracts without the max, is
refused with the kernel and the op in the reason; the safe forms verify."""

import attention_graphs
import numpy as np
import pytest
from mugraph_examples import online_attention

import eqsat_mirage as em
from eqsat_mirage.fusion.planner import plan
from eqsat_mirage.verifier.floatcheck import STATIC


def sum_of_squares() -> em.Graph:
    """Row sums of x^2, squared after an upcast to float32 (RMSNorm's pattern)."""
    g = em.Graph("sumsq")
    x = g.input("X", (8, 16), "float16")
    xf = x.astype("float32")
    g.output((xf * xf).sum(axis=1, keepdims=True), "Y")
    return g


def sum_of_squares_kernel(how: str) -> em.MuGraph:
    """The same in one custom kernel; ``how``: "float32" (as the input), "cast" (the squares
    cast to float16 inside the kernel) or "store" (written to a float16 device tensor and
    summed by a second kernel)."""
    mg = em.MuGraph(f"sumsq_{how}")
    mg.input("X", (8, 16), "float16")
    k = mg.custom_kernel(grid=(2,), forloop=1, name="squares",
                         source=None if how == "store" else sum_of_squares())
    t = k.input("X", imap={0: 0})
    sq = t.astype("float32") * t.astype("float32")
    if how == "store":
        k.output(sq, "S", omap={0: 0}, dtype="float16")
        k2 = mg.custom_kernel(grid=(2,), forloop=1, name="rowsum")
        s = k2.input("S", imap={0: 0})
        k2.output(s.astype("float32").sum(axis=1, keepdims=True), "Y", omap={0: 0})
    else:
        if how == "cast":
            sq = sq.astype("float16").astype("float32")
        k.output(sq.sum(axis=1, keepdims=True), "Y", omap={0: 0})
    mg.output("Y")
    return mg


def test_narrowing_inside_a_kernel_is_unsafe():
    """What the check guards against: the generated code rounds at the cast and the store
    (inf at |x| = 300, where the input program gives 1.44e6)."""
    big = {"X": np.full((8, 16), 300.0)}
    assert np.isfinite(em.evaluate(sum_of_squares(), big, dtype="native")["Y"]).all()
    assert np.isinf(em.evaluate(sum_of_squares_kernel("store"), big, dtype="native")["Y"]).all()


@pytest.mark.parametrize("how,what", [("cast", "cast to float16"),
                                      ("store", "store to 'S' as float16")])
def test_a_kernel_that_narrows_is_refused_naming_kernel_and_op(how, what):
    res = em.verify(sum_of_squares(), sum_of_squares_kernel(how), seed=0)
    assert not res.equivalent and res.counterexample.domain == STATIC, res
    kernel = "squares"
    assert f"kernel {kernel!r}" in res.reason and what in res.reason, res.reason
    assert "a value the input program computes in float32" in res.reason, res.reason


def test_the_kernel_that_keeps_float32_verifies():
    assert em.verify(sum_of_squares(), sum_of_squares_kernel("float32"), seed=0).equivalent


def attention(safe: bool, b=1, m=8, d=16, n=32) -> em.Graph:
    """The shared attention in float32, scores scaled by 1/8."""
    return attention_graphs.attention(safe, "float32", b, m, d, n, scale=0.125)


def test_a_kernel_exp_without_the_max_is_refused():
    """The planner fuses the bare softmax into one custom kernel: its exp is a block op. At
    these sizes no float draw happens to overflow it (exp arguments of realistic size stay
    below float32's 88), so the static check is what refuses it."""
    safe, bare = attention(True), plan(attention(False)).mugraph
    assert any(k.kind == "custom" and any(n.op.name == "EXP" for n in k.post.nodes())
               for k in bare.kernels), bare
    res = em.verify(safe, bare, seed=0)
    assert not res.equivalent and res.counterexample.domain == STATIC, res
    assert "post op exp" in res.reason and "not max-subtracted" in res.reason, res.reason
    # the fused safe softmax, and the bare one against a bare input, verify
    assert em.verify(safe, plan(safe).mugraph, seed=0).equivalent
    assert em.verify(attention(False), bare, seed=0).equivalent


def test_the_running_max_of_an_online_softmax_counts_as_max_subtraction():
    g, mg = online_attention()
    assert em.verify(g, mg, seed=0).equivalent


def test_the_float_checks_round_at_a_block_cast_as_the_generated_code_does():
    """A MuGraph's tiles are float32 registers; a cast to float16 inside a kernel rounds
    there (``.to(tl.float16)``), and the native evaluation the float draws use does too
    (before, it kept the square 90000 that the generated code turns into inf)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("needs a GPU or TRITON_INTERPRET=1")
    from eqsat_mirage.codegen.source import compile_mugraph

    dev = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    for how in ("cast", "float32"):
        mg = sum_of_squares_kernel(how)
        fn = compile_mugraph(mg)
        for v in (300.0, 1.0001):
            x = np.full((8, 16), v)
            got = fn(X=torch.tensor(x, dtype=torch.float16, device=dev))["Y"]
            want = em.evaluate(mg, {"X": x}, dtype="native")["Y"]
            np.testing.assert_allclose(got.double().cpu().numpy(), want, rtol=1e-6)
            if v == 300.0:  # 90000 > 65504: inf where the cast rounds, 1.44e6 where not
                assert np.isinf(want).all() == (how == "cast"), want


def test_the_static_checks_kept_outputs_are_the_programs_on_that_draw():
    """Where the checks inside a MuGraph's kernels run both programs in float64 on the
    N(0, 1) draw (a float16 rounding point the input program also rounds at), the outputs
    they keep for the strict float64 check of that draw (``Draws.b_outputs``, the first
    program's in the memo) are ``em.evaluate``'s on it, bit for bit."""
    from eqsat_mirage.verifier.draws import Draws

    g = em.Graph("sumsq16")
    x = g.input("X", (8, 16), "float16")
    xf = x.astype("float32")
    g.output((xf * xf).astype("float16").astype("float32").sum(axis=1, keepdims=True), "Y")
    mg = sum_of_squares_kernel("cast")
    draws = Draws(g, np.random.default_rng(0), {}, 65504.0)
    assert draws.static(mg) == "" and draws.static_done.is_set()
    inputs = draws.inputs("signed", 1.0)
    for kept, program in ((draws.b_outputs, mg), (draws.memo[(None, "signed", 1.0, False)], g)):
        want = em.evaluate(program, inputs)
        assert kept is not None and set(kept) == set(want)
        assert all(np.array_equal(kept[k], want[k]) for k in want), program.name
    assert em.verify(g, mg, seed=0).equivalent


@pytest.mark.parametrize("how", ["float32", "cast"])
def test_the_static_checks_of_a_mugraph_run_the_first_program_once(how, monkeypatch):
    """Against a MuGraph the static checks compare the first program's dtypes, not its
    sampled values (``floatsafe.unsampled``): no fingerprint run of it; it runs once at
    most, where the checks inside kernels search it (``kernelsafe``), and the strict
    float64 check reads that run. A Graph candidate still gets its fingerprints, and the
    narrowing kernel is still refused."""
    from eqsat_mirage.verifier import floatsafe, kernelsafe
    from eqsat_mirage.verifier.draws import Draws

    g = sum_of_squares()
    runs: list = []
    for module in (floatsafe, kernelsafe):
        def counted(program, *args, real=module.run, **kwargs):
            runs.append(program is g)
            return real(program, *args, **kwargs)
        monkeypatch.setattr(module, "run", counted)
    d = Draws(g, np.random.default_rng(0), {}, 65504.0)
    why = d.static(sum_of_squares_kernel(how))
    assert ("cast to float16" in why) == (how == "cast"), why
    assert "fingerprints" not in d.memo and sum(runs) == (how == "cast"), runs
    d2 = Draws(g, np.random.default_rng(0), {}, 65504.0)
    assert d2.static(g) == "" and d2.memo["fingerprints"] is not None and sum(runs) >= 2


def test_value_search_in_chunks_finds_what_the_whole_array_search_finds(monkeypatch):
    """``kernelsafe._hits`` (the value searched chunk by chunk in its memory order, stopping
    once every value is found) finds the same values as one search of the whole array's
    finite elements: transposed and broadcast views, inf and NaN elements, values off by
    more than the tolerance, float16 and float32 values."""
    from eqsat_mirage.verifier import kernelsafe

    def whole(uniq, value):
        v = np.asarray(value, dtype=np.float64).reshape(-1)
        v = v[np.isfinite(v)]
        i = np.searchsorted(uniq, v)
        hit = set()
        for j in (np.minimum(i, uniq.size - 1), np.maximum(i - 1, 0)):
            hit.update(np.unique(j[np.abs(uniq[j] - v) <= 1e-9 * np.abs(uniq[j])]).tolist())
        return hit

    monkeypatch.setattr(kernelsafe, "_MATCH_CHUNK", 7)
    rng = np.random.default_rng(3)
    for dtype in (np.float16, np.float32, np.float64):
        x = rng.standard_normal((40, 30)).astype(dtype)
        x[3, 4], x[5, 6], x[7, 8] = np.inf, -np.inf, np.nan
        picked = np.asarray(x, dtype=np.float64).reshape(-1)[[0, 17, 599, 1000, 1199]]
        uniq = np.unique(np.concatenate([picked, picked * (1 + 1e-6), [1e30, -5.0]]))
        for value in (x, x.T, np.broadcast_to(x[:1], (9, 30)), x[::2, 1::3], x[::2, ::3]):
            assert kernelsafe._hits(uniq, value) == whole(uniq, value)
        assert kernelsafe._hits(uniq, x) == {int(np.searchsorted(uniq, p)) for p in picked}
