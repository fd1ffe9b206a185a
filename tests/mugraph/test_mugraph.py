"""MuGraph: the data structure, the tiled interpreter (floats and Z_p x Z_q) and verification.

Three hand-built custom kernels (tiled matmul, fused RMSNorm+Linear, FlashAttention-style
attention) must match their reference graphs; broken tilings must be rejected by em.verify.
"""

import json

import numpy as np
import pytest
from mugraph_examples import (
    attention_graph,
    flash_attention,
    matmul_graph,
    rmsnorm_linear,
    rmsnorm_linear_graph,
    tiled_matmul,
)

import eqsat_mirage as em
from eqsat_mirage.semantics.field import FieldCtx, evaluate_field
from eqsat_mirage.semantics.primes import field_primes
from eqsat_mirage.verifier.bound import degrees

RNG = np.random.default_rng(0)


def random_inputs(program, rng=RNG):
    return {n: rng.standard_normal(v.shape) for n, v in program.inputs.items()}


def assert_matches(graph, mg, rtol=1e-9):
    inputs = random_inputs(graph)
    want, got = em.evaluate(graph, inputs), em.evaluate(mg, inputs)
    assert set(want) == set(got)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=1e-12)


def assert_rejected(graph, mg):
    res = em.verify(graph, mg, seed=1)
    assert not res.equivalent
    assert res.counterexample is not None and res.counterexample.domain == "Z_p x Z_q"
    return res


# -- (1) tiled matmul: grid over rows and cols, K in the loop ------------------------------


def test_tiled_matmul_matches_and_verifies():
    g, mg = tiled_matmul()
    assert_matches(g, mg)
    res = em.verify(g, mg, seed=0)
    assert res.equivalent, res
    assert res.false_positive_bound < 1e-20  # per trial: degree 2 / p and 1 / 1.6M primes
    assert em.verify(mg, g, seed=3).equivalent  # either side


def test_tiled_matmul_field_values_equal_reference():
    g, mg = tiled_matmul()
    p, q = field_primes()
    ctx = FieldCtx(p, q, np.random.default_rng(5))
    ctx.inputs = ctx.random_inputs(g)
    want = evaluate_field(g, ctx)["C"][0]
    got = mg.evaluate_field(ctx)["C"][0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("broken", [
    dict(drop_acc=True),                       # accumulator dropped: only the last iteration
    dict(omap={0: 1, 1: 0}),                   # tiles written to swapped grid positions
    dict(a_imap={0: 1}),                       # blocks read the wrong rows of A
    dict(b_imap={0: 1}, b_fmap=1),             # loop walks B's columns, grid its rows
], ids=["accumulator-dropped", "wrong-omap", "wrong-imap", "fmap-wrong-dim"])
def test_broken_matmul_tilings_rejected(broken):
    g, mg = tiled_matmul(**broken)
    mg.validate()  # well formed: only its values are wrong
    res = assert_rejected(g, mg)
    assert res.counterexample.output == "C"
    assert "C" in str(res)


# -- (2) RMSNorm + Linear in one kernel ------------------------------------------------------

EPS = 1e-6


def test_rmsnorm_linear_fused_matches_and_verifies():
    g, mg = rmsnorm_linear()
    assert_matches(g, mg)
    assert em.verify(g, mg, seed=0).equivalent
    # against the textbook form too: the division moved after the matmul
    assert em.verify(rmsnorm_linear_graph(moved=False), mg, seed=0).equivalent
    assert len(mg.kernels) == 1 and mg.kernels[0].kind == "custom"


def test_rmsnorm_mean_over_one_tile_rejected():
    g, mg = rmsnorm_linear(local_mean=True)
    assert_rejected(g, mg)


def test_native_dtype_runs_and_is_close():
    g, mg = rmsnorm_linear()
    inputs = random_inputs(g)
    want = em.evaluate(g, inputs)["Y"]
    got = em.evaluate(mg, inputs, dtype="native")["Y"]
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


# -- (3) attention, FlashAttention style without the max ------------------------------------


def test_flash_attention_matches_and_verifies():
    g, mg = flash_attention()
    assert_matches(g, mg)
    assert em.verify(g, mg, seed=0).equivalent
    assert em.verify(attention_graph(gqa_form=True), mg, seed=2).equivalent


def test_flash_attention_dropped_accumulator_rejected():
    g, mg = flash_attention(drop_sum_acc=True)
    assert_rejected(g, mg)


def test_exp_argument_tiled_in_an_earlier_kernel():
    """q parts flow through an accumulator and across kernels to a later kernel's exp."""
    g = attention_graph()
    mg = em.MuGraph("two_kernels")
    for name, node in g.inputs.items():
        mg.input(name, node.shape, node.dtype)
    k0 = mg.custom_kernel(grid=(2, 2), forloop=2, name="scores")
    acc = k0.accumulate(k0.input("Q", imap={0: 0, 1: 1}, fmap=2)
                        @ k0.input("K", imap={0: 0}, fmap=1), "s")
    k0.output(acc, "S", omap={0: 0, 1: 1})
    k1 = mg.custom_kernel(grid=(2, 4), forloop=4, name="softmax_v")
    e = em.exp(k1.input("S", imap={0: 0, 1: 1}, fmap=2))
    v = k1.input("V", imap={0: 0}, fmap=1)
    o = k1.accumulate(e @ v, "o")
    lse = k1.accumulate(e.sum(axis=2, keepdims=True), "l")
    k1.output(o / lse, "O", omap={0: 0, 1: 1})
    mg.output("O")
    assert_matches(g, mg)
    assert em.verify(g, mg, seed=0).equivalent
    assert em.verify(g, mg.reference(), seed=0).equivalent  # reference by untiling


def test_loop_output_with_fmap_streams_tiles():
    g = em.Graph("scale")
    x = g.input("X", (16, 64), "float32")
    g.output(em.exp(x) * 2.0 + x, "Y")
    mg = em.MuGraph("scale_tiled")
    mg.input("X", (16, 64), "float32")
    k = mg.custom_kernel(grid=(2,), forloop=4)
    t = k.input("X", imap={0: 0}, fmap=1)
    k.output(em.exp(t) * 2.0 + t, "Y", omap={0: 0}, fmap=1)
    mg.output("Y")
    assert_matches(g, mg)
    assert em.verify(g, mg, seed=0).equivalent
    assert em.verify(g, mg.reference(), seed=0).equivalent
    mg.kernels[0].outputs["Y"].fmap = None  # every iteration writes the same tile
    mg.kernels[0].outputs["Y"].omap = {0: 0}
    with pytest.raises(em.MirageError):  # the tensor would be (16, 16): interfaces differ
        em.verify(g, mg)


# -- baseline, static facts, printing, JSON -------------------------------------------------


@pytest.mark.parametrize("make", [matmul_graph, rmsnorm_linear_graph, attention_graph])
def test_from_graph_is_one_kernel_per_op(make):
    g = make()
    mg = em.from_graph(g)
    ops = [n for n in g.nodes() if n.op not in (em.Op.INPUT, em.Op.CONST)]
    assert len(mg.kernels) == len(ops)
    assert all(k.kind == "predefined" for k in mg.kernels)
    assert_matches(g, mg)
    assert em.verify(g, mg, seed=0).equivalent
    assert em.MuGraph.from_json(mg.to_json()) == mg


@pytest.mark.parametrize("build", [tiled_matmul, rmsnorm_linear, flash_attention])
def test_reference_degrees_and_json(build):
    g, mg = build()
    assert em.verify(g, mg.reference(), seed=0).equivalent
    def algebra(ds):  # degrees and exp-argument degrees; the heights and axes may differ
        return {name: (d.num, d.den, d.arg) for name, d in ds.items()}

    assert algebra(degrees(mg)) == algebra(degrees(g))  # tiling keeps the degree facts
    text = mg.to_json(indent=1)
    json.loads(text)
    back = em.MuGraph.from_json(text)
    assert back == mg and back.to_json(indent=1) == text
    inputs = random_inputs(g)
    np.testing.assert_array_equal(em.evaluate(back, inputs)[list(g.outputs)[0]],
                                  em.evaluate(mg, inputs)[list(g.outputs)[0]])
    assert mg != tiled_matmul(omap={0: 1, 1: 0})[1]


def test_printing_shows_the_tiling():
    _, mg = rmsnorm_linear()
    text = str(mg)
    for part in ("kernel rms_linear: custom grid=(x=4)", "forloop=4", "imap={1: x} fmap=0",
                 "in  X: f16[8, 16] <- X[8, 64]", "acc ss +=", "acc xw +=",
                 "out Y[8, 32] <- post", "omap={1: x}", "thread (post):"):
        assert part in text, (part, text)
    assert "matmul" in str(em.from_graph(rmsnorm_linear_graph()))
    assert "MuGraph('rmsnorm_linear_fused'" in repr(mg)


# -- errors ---------------------------------------------------------------------------------


def two_inputs():
    mg = em.MuGraph("bad")
    mg.input("A", (32, 48), "float32")
    mg.input("B", (48, 24), "float32")
    return mg


def test_tile_not_dividing_dim():
    k = two_inputs().custom_kernel(grid=(5,), forloop=4)
    with pytest.raises(em.TilingError, match=r"'A' \(32, 48\): dim 0 of size 32 .* size 5"):
        k.input("A", imap={0: 0})
    with pytest.raises(em.TilingError, match=r"dim 0 of size 48 .*forloop range 5"):
        two_inputs().custom_kernel(grid=(4,), forloop=5).input("B", fmap=0)


def test_grid_axis_used_twice():
    k = two_inputs().custom_kernel(grid=(4, 4), forloop=1, name="kk")
    with pytest.raises(em.TilingError, match=r"kernel 'kk'.*'A'.*grid axis x used twice"):
        k.input("A", imap={0: 0, 1: 0})


def test_dim_in_both_imap_and_fmap_is_cut_by_the_grid_then_the_loop():
    mg = two_inputs()
    k = mg.custom_kernel(grid=(2,), forloop=4, name="kk")  # B's 48 rows: 2 parts of 4 x 6
    assert k.input("B", imap={0: 0}, fmap=0).shape == (6, 24)
    with pytest.raises(em.TilingError, match=r"size 48 .*grid axis x of size 4 times the "
                                             r"forloop range 5"):
        mg.custom_kernel(grid=(4,), forloop=5).input("B", imap={0: 0}, fmap=0)
    # block x sums its rows x*24 .. x*24+23 over the 4 iterations: a split sum with a loop
    mg = em.MuGraph("nested")
    mg.input("X", (48, 3), "float32")
    k = mg.custom_kernel(grid=(2,), forloop=4, name="part")
    x = k.input("X", imap={0: 0}, fmap=0)
    k.output(k.accumulate(x.sum(axis=0, keepdims=True), "acc"), "P", omap={0: 0})
    mg.output("P")
    xs = np.arange(48 * 3, dtype=float).reshape(48, 3)
    want = xs.reshape(2, 24, 3).sum(axis=1)
    np.testing.assert_allclose(em.evaluate(mg, {"X": xs})["P"], want)


def test_unknown_tensor_and_order():
    mg = two_inputs()
    with pytest.raises(em.UnknownTensorError, match="kernel 'k0' reads tensor 'Z'"):
        mg.custom_kernel(grid=(1,)).input("Z")
    with pytest.raises(em.UnknownTensorError, match="'Z'"):
        mg.predefined("add", "A", "Z")
    data = em.from_graph(matmul_graph()).to_dict()
    data["kernels"][0]["graph"]["inputs"][0]["name"] = "Q"
    data["kernels"][0]["graph"]["nodes"][0]["arg"] = "Q"
    with pytest.raises(em.UnknownTensorError, match="reads tensor 'Q'"):
        em.MuGraph.from_dict(data)


def test_output_not_covering_grid_and_bad_maps():
    mg = two_inputs()
    k = mg.custom_kernel(grid=(4, 2), forloop=1, name="k")
    a = k.input("A", imap={0: 0})
    k.output(a * 2.0, "C", omap={0: 0})
    mg.output("C")
    with pytest.raises(em.TilingError, match=r"output 'C'.*grid axis y \(size 2\).*2 blocks"):
        mg.validate()
    k.outputs["C"].omap = {0: 0, 5: 1}
    with pytest.raises(em.TilingError, match="5 is not a dim"):
        em.evaluate(mg, random_inputs(mg))
    data = tiled_matmul()[1].to_dict()
    data["kernels"][0]["inputs"][1]["imap"] = [[1, 7]]
    with pytest.raises(em.TilingError, match="grid axis 7 does not exist"):
        em.MuGraph.from_dict(data)


def test_errors_are_value_errors():
    for cls in (em.MuGraphError, em.TilingError, em.UnknownTensorError):
        assert issubclass(cls, em.MirageError) and issubclass(cls, ValueError)


def test_non_lax_mugraph_refused():
    g = em.Graph("ee")
    x = g.input("X", (8, 8), "float32")
    g.output(em.exp(em.exp(x)), "Y")
    mg = em.MuGraph("ee")
    mg.input("X", (8, 8), "float32")
    k = mg.custom_kernel(grid=(2,), name="double_exp")
    k.output(em.exp(em.exp(k.input("X", imap={0: 0}))), "Y", omap={0: 0})
    mg.output("Y")
    assert_matches(g, mg)
    with pytest.raises(em.LaxError, match="first program 'ee'.*kernel 'double_exp', loop stage"):
        em.verify(mg, g)


def test_interface_mismatch_and_bad_inputs():
    _, mg = tiled_matmul()
    with pytest.raises(em.InputError, match="missing"):
        em.evaluate(mg, {"A": np.zeros((32, 48))})
    with pytest.raises(em.MirageError):
        em.verify(attention_graph(), mg)


def test_every_kind_of_block_op_vectorises():
    """Broadcast against a lower-rank tile, constants, mean, concat, transpose, reshape."""
    g = em.Graph("mixed")
    x = g.input("X", (8, 32), "float32")
    b = g.input("b", (32,), "float32")
    both = em.concat([x * b, 1.0 / (x.mean(axis=1, keepdims=True) - x + 3.0)], axis=1)
    g.output(both.T.reshape(16, 4, 8), "Y")
    mg = em.MuGraph("mixed_tiled")
    mg.input("X", (8, 32), "float32")
    mg.input("b", (32,), "float32")
    k = mg.custom_kernel(grid=(2,), forloop=1, name="mixed")
    t, bt = k.input("X", imap={0: 0}), k.input("b")
    tile = em.concat([t * bt, 1.0 / (t.mean(axis=1, keepdims=True) - t + 3.0)], axis=1)
    k.output(tile.T.reshape(16, 4, 4), "Y", omap={2: 0})
    mg.output("Y")
    assert_matches(g, mg)
    with pytest.raises(em.MuGraphError, match="does not untile"):
        mg.reference()
    mg.kernels[0].source = g
    assert em.verify(g, mg, seed=0).equivalent
    assert em.MuGraph.from_json(mg.to_json()) == mg


def test_post_stage_reads_loop_invariant_tile():
    g = em.Graph("linear_bias")
    a = g.input("A", (32, 48), "float32")
    b = g.input("B", (48, 24), "float32")
    bias = g.input("bias", (24,), "float32")
    g.output(a @ b + bias, "C")
    mg = em.MuGraph("linear_bias_tiled")
    for name, node in g.inputs.items():
        mg.input(name, node.shape, node.dtype)
    k = mg.custom_kernel(grid=(4, 4), forloop=4, source=g)
    acc = k.accumulate(k.input("A", imap={0: 0}, fmap=1) @ k.input("B", imap={1: 1}, fmap=0),
                       "acc")
    k.input("bias", imap={0: 1})
    k.output(acc + k.tile("bias"), "C", omap={0: 0, 1: 1})
    mg.output("C")
    assert_matches(g, mg)
    assert em.verify(g, mg, seed=0).equivalent
    with pytest.raises(em.MuGraphError, match="not a block input without fmap"):
        k.tile("A")


def test_malformed_json():
    with pytest.raises(em.MuGraphError, match="not a serialized MuGraph"):
        em.MuGraph.from_json("[1, 2]")
    data = tiled_matmul()[1].to_dict()
    del data["kernels"][0]["loop"]
    with pytest.raises(em.MuGraphError, match="malformed"):
        em.MuGraph.from_dict(data)
    data = tiled_matmul()[1].to_dict()
    data["kernels"][0]["loop"]["nodes"][-1]["shape"] = [8, 7]
    with pytest.raises(em.MuGraphError, match=r"recorded as float32\(8, 7\)"):
        em.MuGraph.from_dict(data)


@pytest.mark.parametrize("field, value", [("forloop", 10**9), ("grid", [1 << 13, 1 << 12])])
def test_a_json_mugraph_with_a_huge_loop_or_grid_is_refused_before_it_runs(field, value):
    data = json.loads(json.dumps(tiled_matmul()[1].to_dict()))
    custom = next(k for k in data["kernels"] if "forloop" in k)
    custom[field] = value
    with pytest.raises(em.TilingError, match="must stay within 16777216 blocks and 65536"):
        em.MuGraph.from_dict(data).validate()


def test_exact_evaluation_sums_a_split_loop_once():
    """``dtype="exact"`` (the offset draws'): a matmul and a sum split over a kernel's loop
    are each one exact sum rounded once, as the input program's are, so RMSNorm + Linear
    tiled over the hidden dimension equals its Graph bit for bit on inputs at a common
    offset; "native" rounds each step's partial sum to float32 (the generated code's
    accumulators)."""
    g32, mg32 = rmsnorm_linear(dtype="float32")
    rng = np.random.default_rng(0)
    ins = {"X": (rng.standard_normal((8, 64)) + 65536).astype(np.float32),
           "W": rng.standard_normal((64, 32)).astype(np.float32)}
    exact = em.evaluate(g32, ins, dtype="exact")["Y"]
    assert np.array_equal(em.evaluate(mg32, ins, dtype="exact")["Y"], exact)
    assert not np.array_equal(em.evaluate(mg32, ins, dtype="native")["Y"], exact)
