"""take_along_axis (``Op.TAKE_ALONG_AXIS``: ``np.take_along_axis``, ``torch.gather``).

Each backend against ``torch.gather`` (float and native dtypes, int64 and int32 indices,
axes 0, 1 and -1; the field, the torch reference, the generated module), indices out of
range raising everywhere, the shape rule's errors, the verifier accepting true rewrites and
refusing wrong ones (wrong axis, off-by-one indices), ``index_bounds``, and the torch front
ends (``from_torch`` of torch.gather, Tensor.gather and aten.gather, and
``torch.compile(backend=em.backend(...))``).
"""

# Tensors are named like the math (X the table).
# ruff: noqa: N803, N806, E402

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.ir.errors import DTypeError, ShapeError, UnsupportedOpError
from eqsat_mirage.ir.node import Op, make
from eqsat_mirage.semantics.field import FieldCtx, evaluate_field
from eqsat_mirage.semantics.gather import IndexRangeError, index_bounds
from eqsat_mirage.semantics.primes import field_primes
from eqsat_mirage.semantics.torch_reference import torch_reference

torch = pytest.importorskip("torch")

SHAPE = (3, 5, 4)  # the table X
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def ishape(axis, size=6):
    """The indices' shape: X's, ``size`` along ``axis``."""
    out = list(SHAPE)
    out[axis] = size
    return tuple(out)


def graph(build, axis=1, dtype="float32", idtype="int64", shape=SHAPE, size=6):
    """A program of a table X of ``shape`` and indices i of its shape but ``size`` along
    ``axis``; one output, ``build(X, i)``."""
    g = em.Graph("along")
    X = g.input("X", shape, dtype)
    idx = list(shape)
    idx[axis] = size
    i = g.input("i", tuple(idx), idtype)
    g.output(build(X, i), "y")
    return g


def feed(axis=1, shape=SHAPE, size=6, seed=0):
    """Inputs of ``graph``: indices in [0, rows), both extremes among them."""
    rng = np.random.default_rng(seed)
    rows = shape[axis]
    idx = list(shape)
    idx[axis] = size
    i = rng.integers(0, rows, size=tuple(idx))
    i.reshape(-1)[0], i.reshape(-1)[-1] = 0, rows - 1
    return {"X": rng.standard_normal(shape), "i": i}


# --- semantics against torch.gather -----------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("idtype", ["int64", "int32"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_every_backend_matches_torch_gather(dtype, idtype, axis):
    g = graph(lambda X, i: em.take_along_axis(X, i, axis), axis, dtype, idtype)
    x = feed(axis)
    x["i"] = x["i"].astype(idtype)
    X, i = torch.tensor(x["X"]).to(TORCH[dtype]), torch.tensor(x["i"])
    want = torch.gather(X, axis, i.long())
    assert want.shape == ishape(axis)
    got = em.evaluate(g, x, dtype="native")["y"]
    np.testing.assert_array_equal(got, want.double().numpy())  # a gather rounds nothing
    np.testing.assert_array_equal(em.evaluate(g, x)["y"],
                                  np.take_along_axis(x["X"], x["i"], axis))
    ref = torch_reference(g)(X=X, i=i)["y"]
    assert ref.dtype == TORCH[dtype] and torch.equal(ref, want)


def test_the_field_takes_the_residues_at_plain_integer_indices():
    p, q = field_primes()
    g = graph(lambda X, i: em.take_along_axis(X, i, 1))
    ctx = FieldCtx(p, q, np.random.default_rng(3))
    ctx.inputs = ctx.random_inputs(g)
    idx = ctx.inputs["i"][0]
    assert idx.dtype == np.int64 and idx.min() == 0 and idx.max() == SHAPE[1] - 1
    assert np.array_equal(ctx.inputs["i"][1], idx)  # plain integers in both parts
    out = evaluate_field(g, ctx)["y"][0]
    assert np.array_equal(out, np.take_along_axis(np.asarray(ctx.inputs["X"][0]), idx, 1))


def test_the_generated_module_runs_torch_gather_as_a_kernel_of_its_own():
    """em.optimize keeps the take_along_axis a library kernel (torch.gather in the module)
    and fuses the float ops after it into a Triton kernel; an index out of range raises
    IndexError (as a gather's torch.index_select does), never a read past the axis."""
    pytest.importorskip("triton")
    g = graph(lambda X, i: em.exp(em.take_along_axis(X, i, 1)) * 2.0)
    res = em.optimize(g, time_limit_s=300, cache=False)
    kinds = {k.node.op for k in res.program.kernels if k.kind == "predefined"}
    assert Op.TAKE_ALONG_AXIS in kinds and any(k.kind == "custom" for k in res.program.kernels)
    assert "torch.gather(" in res.triton_source()
    x = feed()
    X, i = torch.tensor(x["X"], dtype=torch.float32), torch.tensor(x["i"])
    run = res.compile()
    torch.testing.assert_close(run(X, i)["y"], torch.gather(X, 1, i).exp() * 2.0)
    with pytest.raises(IndexError, match="index 5 is out of range for an axis of 5"):
        run(X, torch.where(i == 0, 5, i))


def test_a_take_along_axis_is_never_indexed_into_a_custom_kernel():
    from eqsat_mirage.fusion.indexing import ScheduleError, index_fragment

    with pytest.raises(ScheduleError, match="runs as a kernel of its own .torch.gather."):
        index_fragment(graph(lambda X, i: em.exp(em.take_along_axis(X, i, 1))))


# --- index bounds, out-of-range indices, shapes ------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2])
def test_index_bounds_are_the_size_of_the_axis(axis):
    from eqsat_mirage.mugraph.program import from_graph

    g = graph(lambda X, i: em.take_along_axis(X, i, axis), axis)
    assert index_bounds(g) == {"i": SHAPE[axis]}
    assert index_bounds(from_graph(g)) == {"i": SHAPE[axis]}  # its library kernel's


@pytest.mark.parametrize("bad", [-1, 5])
def test_out_of_range_indices_raise_everywhere(bad):
    g = graph(lambda X, i: em.take_along_axis(X, i, 1))
    x = feed()
    x["i"][1, 2, 3] = bad
    msg = f"take_along_axis.*index {bad} is out of range for an axis of 5"
    with pytest.raises(IndexRangeError, match=msg):
        em.evaluate(g, x)
    with pytest.raises(IndexRangeError, match=msg):
        em.evaluate(g, x, dtype="native")
    with pytest.raises(IndexRangeError, match=msg):
        torch_reference(g)(X=torch.tensor(x["X"]), i=torch.tensor(x["i"]))
    ctx = FieldCtx(*field_primes(), np.random.default_rng(0))
    ctx.inputs = ctx.random_inputs(g)
    ctx.inputs["i"] = (x["i"], x["i"])
    with pytest.raises(IndexRangeError, match=msg):
        evaluate_field(g, ctx)
    x["i"] = x["i"] + 0.5  # a float index is not an index
    with pytest.raises(IndexRangeError, match="integers"):
        em.evaluate(g, x)


def test_the_shape_rule_names_the_node_and_the_shapes():
    g = em.Graph("bad")
    X = g.input("X", SHAPE, "float32")
    i = g.input("i", (3, 6, 4), "int64")
    assert em.take_along_axis(X, i, 1).shape == (3, 6, 4)
    assert em.take_along_axis(X, g.input("j", (3, 5, 2), "int32")).shape == (3, 5, 2)
    with pytest.raises(ShapeError, match=r"\(3, 6, 4\) for a tensor of shape \(3, 5, 4\)"):
        em.take_along_axis(X, i, 0)  # differs along axis 1 (torch allows smaller: refused)
    with pytest.raises(ShapeError, match="rank|shape of the tensor"):
        em.take_along_axis(X, g.input("k", (3, 6), "int64"), 1)
    with pytest.raises(ShapeError, match="axis 3 out of range"):
        em.take_along_axis(X, i, 3)
    with pytest.raises(DTypeError, match="int64 or int32"):
        em.take_along_axis(X, X, 1)
    # the IR's own rule (a graph decoded or deserialized), a ValueError naming the operands
    with pytest.raises(ShapeError, match=r"take_along_axis of .*\(3, 5, 4\).*\(3, 6, 4\): the "
                                         r"indices must have the table's rank"):
        make(Op.TAKE_ALONG_AXIS, (X.node, i.node), 2)
    with pytest.raises(DTypeError, match="int64 or int32"):
        make(Op.TAKE_ALONG_AXIS, (X.node, X.node), 1)
    assert issubclass(ShapeError, ValueError) and issubclass(IndexRangeError, ValueError)


# --- the verifier -------------------------------------------------------------------------------

def _roll(X):
    """X with its axis-1 entries moved by one (an off-by-one read)."""
    return em.concat([X[:, 1:], X[:, :1]], 1)


TRUE_REWRITES = {
    "exp commutes": (lambda X, i: em.take_along_axis(em.exp(X), i, 1),
                     lambda X, i: em.exp(em.take_along_axis(X, i, 1))),
    "a row scale commutes": (lambda X, i: em.take_along_axis(X * X.sum(axis=1, keepdims=True),
                                                             i, 1),
                             lambda X, i: em.take_along_axis(X, i, 1) * X.sum(axis=1,
                                                                              keepdims=True)),
    "axis 1 of the transpose": (lambda X, i: em.take_along_axis(X, i, 1),
                                lambda X, i: em.take_along_axis(
                                    X.transpose((0, 2, 1)), i.transpose((0, 2, 1)), 2
                                ).transpose((0, 2, 1))),
}
WRONG_REWRITES = {
    "off by one": lambda X, i: em.take_along_axis(_roll(X), i, 1),
    "exp of the neighbour": lambda X, i: em.exp(em.take_along_axis(_roll(X), i, 1)),
}


@pytest.mark.parametrize("name", sorted(TRUE_REWRITES))
def test_verify_accepts_true_rewrites(name):
    a, b = TRUE_REWRITES[name]
    res = em.verify(graph(a), graph(b))
    assert res.equivalent, res


@pytest.mark.parametrize("name", sorted(WRONG_REWRITES))
def test_verify_refuses_off_by_one_indices(name):
    good = TRUE_REWRITES["exp commutes" if "exp" in name else "axis 1 of the transpose"][0]
    res = em.verify(graph(good), graph(WRONG_REWRITES[name]))
    assert not res.equivalent and res.counterexample is not None


def test_verify_refuses_the_wrong_axis():
    """Square tables and indices: the same shapes along axis 0 and axis 1."""
    a = graph(lambda X, i: em.take_along_axis(X, i, 1), 1, shape=(4, 4), size=4)
    b = graph(lambda X, i: em.take_along_axis(X, i, 0), 1, shape=(4, 4), size=4)
    res = em.verify(a, b)
    assert not res.equivalent and res.counterexample is not None


# --- the torch front ends -----------------------------------------------------------------------

def test_from_torch_maps_gather_the_method_and_the_aten_overload():
    from torch.fx.experimental.proxy_tensor import make_fx

    def pick(x, i, j):
        return torch.gather(x, 1, i).exp(), x.gather(-1, j) * 2.0

    x, i = torch.randn(SHAPE), torch.randint(0, 5, (3, 2, 4))
    j = torch.randint(0, 4, (3, 5, 2), dtype=torch.int32)
    want = pick(x, i, j)
    for fn in (pick, make_fx(pick)(x, i, j)):  # torch functions; aten ops (aten.gather)
        g = em.from_torch(fn, x, i, j)
        names = list(g.inputs)  # make_fx names its placeholders x_1, i_1, j_1
        assert [g.inputs[n].dtype for n in names] == ["float32", "int64", "int32"]
        assert sorted(n.arg for n in g.nodes() if n.op is Op.TAKE_ALONG_AXIS) == [1, 2]
        out = em.evaluate(g, dict(zip(names, (x.numpy(), i.numpy(), j.numpy()))))
        for got, y in zip(out.values(), want):
            np.testing.assert_allclose(got, y.numpy(), rtol=1e-6)
    with pytest.raises(UnsupportedOpError, match="sparse_grad"):
        em.from_torch(lambda x, i: torch.gather(x, 1, i, sparse_grad=True), x, i)
    with pytest.raises(ShapeError, match="shape of the tensor but along axis 1"):
        em.from_torch(lambda x, i: torch.gather(x, 1, i[:2]), x, i)  # torch allows smaller


class GatherNorm(torch.nn.Module):
    """A gather of one entry per row (picked logits, top-k values) followed by float ops."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(4))

    def forward(self, x, idx):
        y = torch.gather(x, 1, idx)
        return torch.nn.functional.rms_norm(y * self.scale, (4,), eps=1e-6).exp()


def test_backend_runs_gather_and_its_float_ops_optimized():
    torch.manual_seed(0)
    mod, x = GatherNorm().eval(), torch.randn(SHAPE)
    idx = torch.randint(0, 5, (3, 6, 4))
    be = em.backend(time_limit_s=300, warn=False, warmup=0, cache=False)
    with torch.no_grad():
        want = mod(x, idx)
        fn = torch.compile(mod, backend=be)
        torch.testing.assert_close(fn(x, idx), want)
        s = be.summary()
        assert s["optimized_compute_ops"] == s["compute_ops"] >= 3, s  # the gather counted
        bad = idx.clone()
        bad[0, 1, 2] = 5  # eager torch raises: so does the compiled module (never a read
        with pytest.raises(RuntimeError, match="out of bounds"):  # past the axis)
            fn(x, bad)
        assert [r.eager_calls for r in be.report] == [1]  # that call only ran eagerly
        torch.testing.assert_close(fn(x, idx), want)
    assert [r.status for r in be.report] == ["optimized"]
