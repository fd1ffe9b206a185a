"""Issue 52 (part C): torch indexing and movement ops the front end composes of slices with
step 1, concats and reshapes (list and integer indices of one axis, strided slices, stack,
repeat_interleave, flip, select) and SDPA with key heads broadcast (multi-query attention);
each equal to torch eager."""

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.ir.ops import Op

torch = pytest.importorskip("torch")
F = torch.nn.functional

from eqsat_mirage.frontend.from_torch import graph_inputs  # noqa: E402
from eqsat_mirage.frontend.torch_movement import MAX_PIECES  # noqa: E402

MOVES = {Op.INPUT, Op.SLICE, Op.RESHAPE, Op.CONCAT, Op.TRANSPOSE}


def _check(fn, *xs, rtol=1e-6, atol=1e-6):
    """from_torch(fn) evaluated by em.evaluate equals fn(*xs) (shape and values)."""
    g = em.from_torch(fn, *xs)
    feed = {k: v.detach().double().numpy() for k, v in graph_inputs(g, fn, *xs).items()}
    got = list(em.evaluate(g, feed).values())[0]
    with torch.no_grad():
        want = fn(*xs).double().numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return g


X = torch.randn(2, 3, 10, generator=torch.Generator().manual_seed(0))
IDX = torch.tensor([[1, 2], [9, 0]])

MOVEMENT = {
    "list_of_one": lambda a: a[..., [-2], :],  # Falcon's fused_qkv[..., [-2], :]
    "list_reordered": lambda a: a[:, [2, 0, 1]],
    "list_repeated": lambda a: a[:, :, [3, 3, 4, 5, 0]],
    "list_progression": lambda a: a[..., [1, 4, 7]],
    "int": lambda a: a[..., 0, :],
    "negative_int": lambda a: a[-1],
    "step_2": lambda a: a[..., ::2],  # GPT-J's rotate_every_two
    "step_2_odd": lambda a: a[..., 1::2],
    "step_3_window": lambda a: a[..., 1:9:3],
    "step_3_tail": lambda a: a[..., ::3],  # 0, 3, 6, 9: no window of 4 * 3 fits in 10
    "steps_on_two_axes": lambda a: a[:, ::2, 1:8:2],
    "step_past_the_end": lambda a: a[..., 4::7],
    "none_int_ellipsis": lambda a: a[None, 1, ..., None, 2:],
    "int_tensor": lambda a: a[..., IDX],
    "int_tensor_0d": lambda a: a[:, torch.tensor(2)],
    "stack_last": lambda a: torch.stack((-a, a * 2), dim=-1).flatten(-2),
    "stack_first": lambda a: torch.stack([a, a + 1]),
    "stack_one": lambda a: torch.stack([a], dim=1),
    "rotate_every_two": lambda a: torch.stack((-a[..., 1::2], a[..., ::2]), dim=-1).flatten(-2),
    "repeat_interleave": lambda a: torch.repeat_interleave(a[:, :, None, :], 2, 3),
    "repeat_interleave_method": lambda a: a.repeat_interleave(3, dim=1),
    "repeat_interleave_flat": lambda a: torch.repeat_interleave(a, 2),
    "flip": lambda a: torch.flip(a, dims=(0, 2)),
    "flip_method": lambda a: a.flip(-1),
    "select": lambda a: a.select(1, -1)[:, :3] + torch.select(a, 2, 3),
}


@pytest.mark.parametrize("name", list(MOVEMENT))
def test_each_movement_op_matches_torch_and_is_slices_concats_and_reshapes(name):
    g = _check(MOVEMENT[name], X)
    ops = {n.op for n in g.nodes()}
    assert ops <= MOVES | {Op.NEG, Op.MUL, Op.ADD, Op.CONST}, ops


def test_a_strided_slice_is_one_window_reshaped_where_it_fits():
    """x[..., 1::2] of an axis of 10 is reshape (5, 2), column 1, reshape: no concat."""
    g = _check(lambda a: a[..., 1::2], X)
    assert [n.op for n in g.nodes()] == [Op.INPUT, Op.RESHAPE, Op.SLICE, Op.RESHAPE]
    g = _check(lambda a: a[..., 1:8:3], X)  # 1, 4, 7: the window [0, 9) as (3, 3), column 1
    assert [n.op for n in g.nodes()] == [Op.INPUT, Op.SLICE, Op.RESHAPE, Op.SLICE, Op.RESHAPE]


def test_in_float16_and_with_odd_sizes():
    x = torch.randn(3, 7, 5).half()
    for fn in (lambda a: a[:, 1::3, [4, 0]], lambda a: torch.stack((a, -a), 1)[:, ::5],
               lambda a: a.flip(1).repeat_interleave(2, dim=-1)[..., 2:9:2]):
        _check(fn, x)


def test_indexing_errors_name_the_index():
    with pytest.raises(em.UnsupportedOpError, match="more than one list"):
        em.from_torch(lambda a: a[[0, 1], :, [1, 2]], X)
    with pytest.raises(em.ShapeError, match="index 10 is out of range for axis 2 of size 10"):
        em.from_torch(lambda a: a[..., [1, 10]], X)
    with pytest.raises(em.UnsupportedOpError, match="bool or float index"):
        em.from_torch(lambda a: a[..., [True] * 10], X)
    with pytest.raises(em.UnsupportedOpError, match="a float32 tensor of the program"):
        em.from_torch(lambda a, b: a[b], X, X)  # a float index
    ids = torch.tensor([1, 0])
    with pytest.raises(em.UnsupportedOpError, match="beside ints or None"):
        em.from_torch(lambda a, i: a[0, i], X, ids)
    with pytest.raises(em.UnsupportedOpError, match="on adjacent axes"):
        em.from_torch(lambda a, i: a[i, :, i], X, ids)
    with pytest.raises(em.UnsupportedOpError, match="a list that is not of numbers"):
        em.from_torch(lambda a, i: a[[i, i]], X, ids)  # was a TypeError from torch
    with pytest.raises(em.UnsupportedOpError, match="a step below 1"):
        em.from_torch(lambda a: a[..., ::-1], X)
    with pytest.raises(em.ShapeError, match="4 indices for a tensor of shape"):
        em.from_torch(lambda a: a[0, 0, 0, 0], X)
    with pytest.raises(em.UnsupportedOpError, match=f"at most {MAX_PIECES} runs"):
        em.from_torch(lambda a: a.flip(-1), torch.randn(2, MAX_PIECES + 1))
    with pytest.raises(em.UnsupportedOpError, match="one positive int count"):
        em.from_torch(lambda a: a.repeat_interleave(torch.tensor([1, 2]), dim=0), X[0, :2])
    with pytest.raises(em.ShapeError, match="different shapes"):
        em.from_torch(lambda a: torch.stack([a, a[:1]]), X)


def test_an_index_selecting_nothing_is_empty_and_a_cat_drops_it():
    _check(lambda a: torch.cat([a[..., 10::2], a[..., [0]]], dim=-1), X)


SHAPES = {  # query, key (= value) shapes
    "mqa_broadcast": ((1, 4, 6, 8), (1, 1, 6, 8), {}),  # Falcon's multi-query attention
    "mqa_enable_gqa": ((1, 4, 6, 8), (1, 1, 6, 8), {"enable_gqa": True}),
    "gqa_ratio_3": ((2, 6, 5, 8), (2, 2, 5, 8), {"enable_gqa": True}),
    "batch_broadcast": ((2, 3, 6, 8), (1, 3, 7, 8), {}),
}


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_with_key_heads_broadcast_or_grouped(name, causal):
    qs, ks, kw = SHAPES[name]
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(s, generator=gen) for s in (qs, ks, ks))
    _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw),
           q, k, v, rtol=1e-5, atol=1e-6)


def test_sdpa_batch_dims_that_do_not_broadcast_are_refused():
    q, k = torch.randn(1, 4, 6, 8), torch.randn(1, 3, 6, 8)
    with pytest.raises(em.UnsupportedOpError, match="do not broadcast"):
        em.from_torch(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, k)


GATHERED = {  # an integer tensor of the program as the index: Op.GATHER along its axis
    "rows": (lambda w, i: w[i], (3, 4, 5), (6,)),  # transformers' batched_mm: w[expert_ids]
    "rows_2d_index": (lambda w, i: w[i] * 2.0, (3, 4), (2, 5)),
    "middle_axis": (lambda w, i: w[:, i], (2, 5, 3), (4,)),
    "after_ellipsis": (lambda w, i: w[..., i, :], (2, 5, 3), (2, 2)),
    "with_a_strided_slice": (lambda w, i: w[::2, i], (5, 4), (3,)),
    "moved_index": (lambda w, i: w[i.reshape(-1)], (4, 3), (2, 3)),
}


@pytest.mark.parametrize("name", sorted(GATHERED))
def test_an_integer_tensor_index_is_a_gather(name):
    """Issue 52: ``w[ids]`` with ``ids`` an integer tensor of the program (Mixtral's
    batched_mm gathers each token's expert weights so) is ``Op.GATHER``, equal to torch."""
    fn, shape, ishape = GATHERED[name]
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(shape, generator=gen)
    axis = {"middle_axis": 1, "after_ellipsis": 1, "with_a_strided_slice": 1}.get(name, 0)
    i = torch.randint(0, shape[axis], ishape, generator=gen)
    g = _check(fn, w, i)
    assert sum(n.op is Op.GATHER for n in g.nodes()) == 1


def _padding(am, b, kv, x):
    """masking_utils' ``padding_mask[batch_idx, kv_idx]`` of a bool mask, then a softmax."""
    m = am.to(torch.bool)[b[:, None, None, None], kv[None, None, None, :]]
    return torch.where(m, x, -1e4).softmax(-1)


def test_two_index_tensors_as_an_outer_product_are_two_gathers():
    """Issue 52: two integer tensors of the program on adjacent axes, broadcast as an outer
    product (the first's sizes first), are two gathers; a bool table is gathered as 0/1."""
    am = torch.ones(2, 7, dtype=torch.long)
    am[1, :3] = 0
    g = _check(_padding, am, torch.arange(2), torch.arange(7), torch.randn(2, 1, 5, 7))
    assert sum(n.op is Op.GATHER for n in g.nodes()) == 2
    # one index of a bool table: gathered as 0/1 too
    _check(lambda m, i, x: torch.where(m.to(torch.bool)[i], x, 0.0),
           torch.tensor([1, 0, 1, 1]), torch.tensor([3, 1, 0]), torch.randn(3))
    w, i, j = torch.randn(4, 9, 3), torch.tensor([3, 0, 1]), torch.tensor([8, 2])
    _check(lambda w, i, j: w[i[:, None], j[None, :]] * 2.0, w, i, j)
    _check(lambda w, i, j: w[..., i[:, None], j] + 1.0, torch.randn(2, 4, 9), i, j)
    for bad, why in ((lambda w, i, j: w[i, :, j[:1]], "adjacent axes"),
                     (lambda w, i, j: w[i[:2], j], "outer product"),
                     (lambda w, i, j: w[i[None, :], j[:, None]], "outer product"),
                     (lambda w, i, j: w[0, i[:, None], j[None, :]], "full slices")):
        with pytest.raises(em.UnsupportedOpError, match=why):
            em.from_torch(bad, torch.randn(4, 9, 9), i, j)
