"""The gather op (issue 52): ``em.embedding`` and ``em.index_select`` (``Op.GATHER``).

Each backend's semantics against torch (float and native dtypes, the field, the torch
reference, the generated module with its Triton kernels under TRITON_INTERPRET=1), indices
out of range raising everywhere, the verifier accepting true rewrites and refusing wrong
ones (wrong axis, off-by-one indices), and the torch front ends (``from_torch`` and
``torch.compile(backend=em.backend(...))``).
"""

# Tensors are named like the math (T the table).
# ruff: noqa: N803, N806, E402

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.ir.errors import DTypeError, ShapeError
from eqsat_mirage.ir.node import Op
from eqsat_mirage.semantics.field import FieldCtx, evaluate_field
from eqsat_mirage.semantics.gather import IndexRangeError, draw_indices, index_bounds
from eqsat_mirage.semantics.primes import field_primes
from eqsat_mirage.semantics.torch_reference import torch_reference

torch = pytest.importorskip("torch")
F = torch.nn.functional

ROWS, DIM = 12, 8
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def graph(build, dtype="float32", ishape=(2, 3), idtype="int64", rows=ROWS, dim=DIM):
    """A program of a table T (rows, dim) and an index input i of ``ishape``."""
    g = em.Graph("gather")
    T = g.input("T", (rows, dim), dtype)
    i = g.input("i", ishape, idtype)
    g.output(build(T, i), "y")
    return g


def feed(rows=ROWS, dim=DIM, ishape=(2, 3), seed=0):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, rows, size=ishape)
    idx.reshape(-1)[0], idx.reshape(-1)[-1] = 0, rows - 1
    return {"T": rng.standard_normal((rows, dim)), "i": idx}


# --- semantics against torch ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("idtype", ["int64", "int32"])
def test_embedding_matches_torch_in_every_dtype(dtype, idtype):
    g = graph(em.embedding, dtype, idtype=idtype)
    x = feed()
    T = torch.tensor(x["T"]).to(TORCH[dtype])
    want = F.embedding(torch.tensor(x["i"]), T)
    got = em.evaluate(g, x, dtype="native")["y"]
    assert got.shape == (2, 3, DIM)
    np.testing.assert_array_equal(got, want.double().numpy())  # a gather rounds nothing
    np.testing.assert_array_equal(em.evaluate(g, x)["y"], x["T"][x["i"]])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_index_select_matches_torch(axis):
    rng = np.random.default_rng(1)
    g = em.Graph("select")
    X = g.input("X", (3, 5, 4), "float32")
    c = g.input("c", (6,), "int64")
    g.output(em.index_select(X, axis, c), "y")
    size = (3, 5, 4)[axis]
    x = {"X": rng.standard_normal((3, 5, 4)), "c": rng.integers(0, size, 6)}
    want = torch.index_select(torch.tensor(x["X"]), axis, torch.tensor(x["c"]))
    np.testing.assert_array_equal(em.evaluate(g, x)["y"], want.numpy())
    ref = torch_reference(g)(X=torch.tensor(x["X"]), c=torch.tensor(x["c"]))["y"]
    assert torch.equal(ref, want)


def test_torch_reference_matches_embedding():
    g = graph(lambda T, i: em.rms_norm(em.embedding(T, i)))
    x = feed()
    T, i = torch.tensor(x["T"]), torch.tensor(x["i"])
    want = F.rms_norm(F.embedding(i, T), (DIM,), eps=1e-6)
    got = torch_reference(g)(T=T, i=i)["y"]
    torch.testing.assert_close(got, want)


def test_field_gathers_the_residues_at_plain_integer_indices():
    p, q = field_primes()
    g = graph(em.embedding, ishape=(4, 5))
    ctx = FieldCtx(p, q, np.random.default_rng(3))
    ctx.inputs = ctx.random_inputs(g)
    idx = ctx.inputs["i"][0]
    assert idx.dtype == np.int64 and idx.min() == 0 and idx.max() == ROWS - 1  # both extremes
    assert np.array_equal(ctx.inputs["i"][1], idx)  # plain integers in both parts
    out = evaluate_field(g, ctx)["y"][0]
    assert np.array_equal(out, np.asarray(ctx.inputs["T"][0])[idx])


def test_index_bounds_and_draws_take_the_indexed_axis():
    g = graph(lambda T, i: em.index_select(T, 1, i), ishape=(5,))
    assert index_bounds(g) == {"i": DIM}
    d = draw_indices(np.random.default_rng(0), (5,), DIM)
    assert d[0] == 0 and d[-1] == DIM - 1 and ((d >= 0) & (d < DIM)).all()


def test_index_bounds_of_a_mugraph_follow_its_library_kernels():
    """A MuGraph's gather is a library kernel; its index may be a moved input (a reshape
    kernel's output): the bound still reaches the input."""
    from eqsat_mirage.mugraph.program import from_graph

    g = graph(lambda T, i: em.index_select(T, 1, i), ishape=(5,))
    assert index_bounds(from_graph(g)) == {"i": DIM}
    moved = graph(lambda T, i: em.index_select(T, 1, i.reshape((5,))), ishape=(1, 5))
    assert index_bounds(from_graph(moved)) == {"i": DIM}


# --- indices out of range: every backend raises, naming the node -------------------------------

@pytest.mark.parametrize("bad", [-1, ROWS])
def test_out_of_range_indices_raise(bad):
    g = graph(em.embedding)
    x = feed()
    x["i"][1, 1] = bad
    with pytest.raises(IndexRangeError, match=f"index {bad} is out of range for an axis of 12"):
        em.evaluate(g, x)
    with pytest.raises(IndexRangeError, match="gather"):
        torch_reference(g)(T=torch.tensor(x["T"]), i=torch.tensor(x["i"]))
    x["i"] = x["i"] + 0.5  # a float index is not an index
    with pytest.raises(IndexRangeError, match="integers"):
        em.evaluate(g, x)


def test_integer_tensors_are_only_indices():
    g = em.Graph("ints")
    T = g.input("T", (4, 3), "float32")
    i = g.input("i", (2,), "int64")
    with pytest.raises(DTypeError, match="integer index tensor"):
        _ = i * 2.0
    with pytest.raises(DTypeError, match="int64 or int32"):
        em.embedding(T, T)
    with pytest.raises(ShapeError, match="2-d"):
        em.embedding(T.reshape(2, 2, 3), i)
    assert em.embedding(T, i.reshape(1, 2)).shape == (1, 2, 3)  # a moved index stays one


# --- the verifier -------------------------------------------------------------------------------

TRUE_REWRITES = {
    "exp commutes": (lambda T, i: em.exp(em.embedding(T, i)),
                     lambda T, i: em.embedding(em.exp(T), i)),
    "rms_norm of the rows": (lambda T, i: em.rms_norm(em.embedding(T, i)),
                             lambda T, i: em.embedding(em.rms_norm(T), i)),
    "axis 0 of the transpose": (lambda T, i: em.embedding(T, i),
                                lambda T, i: em.index_select(T.T, 1, i.reshape(6)).T.reshape(
                                    2, 3, DIM)),
}
WRONG_REWRITES = {
    "off by one": lambda T, i: em.embedding(em.concat([T[1:], T[:1]], 0), i),
    "last row for the first": lambda T, i: em.embedding(em.concat([T[ROWS - 1:], T[1:]], 0), i),
}


@pytest.mark.parametrize("name", sorted(TRUE_REWRITES))
def test_verify_accepts_true_rewrites(name):
    a, b = TRUE_REWRITES[name]
    res = em.verify(graph(a), graph(b))
    assert res.equivalent, res


@pytest.mark.parametrize("name", sorted(WRONG_REWRITES))
def test_verify_refuses_wrong_indices(name):
    res = em.verify(graph(em.embedding), graph(WRONG_REWRITES[name]))
    assert not res.equivalent and res.counterexample is not None


def test_verify_refuses_the_wrong_axis():
    a = graph(lambda T, i: em.index_select(T, 0, i), ishape=(4,), rows=8, dim=8)
    b = graph(lambda T, i: em.index_select(T, 1, i).T, ishape=(4,), rows=8, dim=8)
    assert not em.verify(a, b).equivalent


# --- the torch front ends -----------------------------------------------------------------------

class EmbedNorm(torch.nn.Module):
    """An embedding lookup and an RMSNorm: a decoder's first step."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(ROWS, DIM)
        self.norm = torch.nn.RMSNorm(DIM, eps=1e-6)

    def forward(self, ids):
        return self.norm(self.emb(ids))


def test_from_torch_maps_embedding_and_index_select():
    torch.manual_seed(0)
    ids = torch.tensor([[0, 5, 11], [3, 3, 7]])
    g = em.from_torch(EmbedNorm().eval(), ids)
    assert g.inputs["ids"].dtype == "int64"
    assert [n.arg for n in g.nodes() if n.op is Op.GATHER] == [0]

    def pick(x, c):
        return torch.index_select(x, 1, c) + x.index_select(0, c[:2]).sum()

    x, c = torch.randn(4, 6), torch.tensor([3, 0, 2], dtype=torch.int32)
    h = em.from_torch(pick, x, c)
    out = em.evaluate(h, {"x": x.numpy(), "c": c.numpy()})
    np.testing.assert_allclose(next(iter(out.values())), pick(x, c).numpy(), rtol=1e-6)


def test_optimized_module_runs_with_its_triton_kernels():
    """em.optimize plans the gather as a kernel of its own (torch.index_select in the
    generated module) and the RMSNorm as a Triton kernel; run under TRITON_INTERPRET=1."""
    pytest.importorskip("triton")
    torch.manual_seed(0)
    ids = torch.tensor([[0, 5, 11], [3, 3, 7]])
    mod = EmbedNorm().eval()
    res = em.optimize(em.from_torch(mod, ids), time_limit_s=300, cache=False)
    kernels = res.program.kernels
    assert Op.GATHER in {k.node.op for k in kernels if k.kind == "predefined"}
    assert any(k.kind == "custom" for k in kernels)
    assert "torch.index_select(" in res.triton_source()
    run = res.compile()
    with torch.no_grad():
        want = mod(ids)
        got = run(ids, mod.emb.weight, mod.norm.weight)
    torch.testing.assert_close(next(iter(got.values())), want, rtol=1e-5, atol=1e-5)


def test_a_gather_is_never_indexed_into_a_custom_kernel():
    """Its rows sit at data-dependent positions: the fusion indexer refuses it (the planner
    then keeps it a kernel of its own) instead of leaving its dims untied."""
    from eqsat_mirage.fusion.indexing import ScheduleError, index_fragment

    with pytest.raises(ScheduleError, match="gather .* runs as a kernel of its own"):
        index_fragment(graph(lambda T, i: em.rms_norm(em.embedding(T, i))))


def test_backend_runs_embedding_and_rms_norm_optimized():
    torch.manual_seed(0)
    mod, ids = EmbedNorm().eval(), torch.tensor([[0, 5, 11], [3, 3, 7]])
    be = em.backend(time_limit_s=300, warn=False, warmup=0, cache=False)
    with torch.no_grad():
        want = mod(ids)
        fn = torch.compile(mod, backend=be)
        got = fn(ids)
        torch.testing.assert_close(got, want)
        s = be.summary()
        assert s["optimized_compute_ops"] == s["compute_ops"] == 2, s  # the gather counted
        bad = ids.clone()
        bad[0, 1] = ROWS  # eager torch raises: so does the compiled module (never a read
        with pytest.raises(IndexError):  # past the table)
            fn(bad)
        assert [r.eager_calls for r in be.report] == [1]  # that call only ran eagerly
        torch.testing.assert_close(fn(ids), want)
    assert [r.status for r in be.report] == ["optimized"]


def test_moved_indices_may_cross_a_kernel_boundary():
    """A gather's guard is its table's, so the abstract expression of its indices was in no
    target and the guard refused every kernel boundary after a reshape of them: the whole
    program stayed one kernel per op (Mixtral's batched_mm, ``w[ids.reshape(-1)]``). The
    index inputs are marked in-target now; the product after the gather fuses."""
    g = em.Graph("moe")
    w = g.input("w", (4, 64, 32), dtype="float32")
    ids = g.input("ids", (4, 2), dtype="int64").reshape((8,))
    x = g.input("x", (8, 32), dtype="float32")
    y = (em.index_select(w, 0, ids) @ x.reshape((8, 32, 1))).reshape((8, 64))
    g.output(em.silu(y) * 2.0, "y")
    res = em.optimize(g, time_limit_s=300, cache=False)
    assert res.verified.equivalent
    assert any(k.kind == "custom" for k in res.program.kernels)
    assert res.cost_us < res.baseline_cost_us


def test_a_gather_is_a_kernel_boundary_whatever_computes_its_indices():
    """A gather runs as a kernel of its own, so the edges into and out of it are kernel
    boundaries whatever the e-graph's boundary rules say. BERT's token-type ids, two
    position rows concatenated (``expand`` of a buffer) and gathered, had no boundary
    between the concat and the gather: every plan of its 24-op embedding piece failed
    ("may not be split into kernels ... cannot be indexed"), and the piece stayed one
    kernel per op (26.14 us; 11.79 us planned now)."""
    g = em.Graph("token_types")
    a = g.input("a", (1, 64), dtype="int64")
    b = g.input("b", (1, 64), dtype="int64")
    table = g.input("table", (2, 256), dtype="float32")
    rows = em.embedding(table, em.concat([a, b], axis=0))  # (2, 64, 256)
    x = g.input("x", (2, 64, 256), dtype="float32")
    g.output(em.rms_norm(x + rows), "y")
    res = em.optimize(g, time_limit_s=300, cache=False)
    assert res.verified.equivalent
    assert not res.stats.get("fusion_errors"), res.stats["fusion_errors"]
    assert any(k.kind == "custom" for k in res.program.kernels)
    assert res.cost_us < res.baseline_cost_us
