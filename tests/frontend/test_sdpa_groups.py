"""Grouped-query attention through ``F.scaled_dot_product_attention`` (issue 52): with
``enable_gqa`` and with transformers' ``repeat_kv`` (keys expanded to every query head)
before it. Each group of query heads reads its key head once (no copies of the keys);
a decode step's group is folded into one head's rows; the mask keeps its batch axis."""

from __future__ import annotations

import numpy as np
import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")
F = torch.nn.functional

D = 8


def _mask(kind: str | None, b: int, h: int, s: int, n: int):
    gen = torch.Generator().manual_seed(1)
    shape = {None: None, "batch": (b, 1, s, n), "row": (b, 1, 1, n), "head": (b, h, s, n),
             "plain": (s, n)}[kind]
    if shape is None:
        return None
    m = torch.rand(shape, generator=gen) > 0.3
    m[..., 0] = True
    return m


def _attention(how: str, b: int, h: int, kv: int, n: int, causal: bool):
    r = h // kv

    def gqa(q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              enable_gqa=True)

    def repeated(q, k, v, mask=None):
        k = k[:, :, None].expand(b, kv, r, n, D).reshape(b, h, n, D)
        v = v[:, :, None].expand(b, kv, r, n, D).reshape(b, h, n, D)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)

    return gqa if how == "gqa" else repeated


def _check(how, b, h, kv, s, n, kind=None, causal=False):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen)
               for shape in ((b, h, s, D), (b, kv, n, D), (b, kv, n, D)))
    mask = _mask(kind, b, h, s, n)
    args = (q, k, v) + (() if mask is None else (mask,))
    fn = _attention(how, b, h, kv, n, causal)
    g = em.from_torch(fn, *args)
    feed = {"q": q.numpy(), "k": k.numpy(), "v": v.numpy()}
    if mask is not None:
        feed["mask"] = mask.numpy()
    got = em.evaluate(g, feed)["out"]
    np.testing.assert_allclose(got, fn(*args).numpy(), rtol=1e-5, atol=1e-5)
    return g


@pytest.mark.parametrize("how", ["gqa", "repeated"])
@pytest.mark.parametrize("b,kv,s,kind", [(2, 2, 1, None), (2, 2, 1, "batch"), (2, 2, 3, "batch"),
                                         (1, 2, 1, "head"), (2, 2, 3, "head"), (3, 1, 1, "row"),
                                         (3, 1, 3, "row"), (2, 2, 3, "plain")])
def test_grouped_attention_equals_torch(how, b, kv, s, kind):
    g = _check(how, b, 4, kv, s, 8, kind)
    assert not any(n.op is em.Op.CONCAT for n in g.nodes())  # no key copies


@pytest.mark.parametrize("how", ["gqa", "repeated"])
@pytest.mark.parametrize("s", [1, 3])
def test_grouped_causal_attention_equals_torch(how, s):
    _check(how, 2, 4, 2, s, 8, causal=True)


def test_a_batch_mask_stays_on_the_batch_axis_under_enable_gqa():
    """As many batch rows as key heads: the mask (b, 1, s, n) was aligned with the split
    heads (key heads, group) and batch row i's mask applied to key head i (error 1.88)."""
    _check("gqa", 2, 4, 2, 3, 8, "batch")


def test_a_decode_step_reads_each_key_head_once():
    """One query row per head: each group of query heads becomes one key head's rows, so
    the optimized program holds no copy of the keys and one attention kernel reads them."""
    g = _check("repeated", 1, 8, 2, 1, 64, "row")
    reshaped = [n for n in g.nodes() if n.op is em.Op.RESHAPE and n.srcs[0].op is em.Op.INPUT
                and n.srcs[0].arg == "q"]
    assert [n.shape for n in reshaped] == [(1, 2, 4, D)]  # (b, key heads, group rows, d)
    res = em.optimize(g, target="h100")
    assert res.verified.equivalent
    text = str(res.program)
    assert "concat" not in text
    assert text.count("custom grid") == 1, text


@pytest.mark.parametrize("axis", [0, 2, 3])
def test_a_repeat_of_another_axis_is_no_group_of_heads(axis):
    """A size-1 axis repeated and merged into the batch, the length or the head dim is
    not repeat_kv: converted as written (it raised a ShapeError)."""
    gen = torch.Generator().manual_seed(2)

    def rep(t):
        shape = [2, 2, 4, D]
        out = list(shape)
        out[axis] *= 2
        return t.unsqueeze(axis + 1).expand(*shape[:axis + 1], 2, *shape[axis + 1:]).reshape(out)

    qshape = {0: (4, 2, 3, D), 2: (2, 2, 3, D), 3: (2, 2, 3, 2 * D)}[axis]
    q, k, v = (torch.randn(s, generator=gen) for s in (qshape, (2, 2, 4, D), (2, 2, 4, D)))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, rep(k), rep(v))

    g = em.from_torch(fn, q, k, v)
    got = em.evaluate(g, {"q": q.numpy(), "k": k.numpy(), "v": v.numpy()})["out"]
    np.testing.assert_allclose(got, fn(q, k, v).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("s", [1, 3])
def test_keys_repeated_and_values_not(s):
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 4, s, D, generator=gen), torch.randn(1, 2, 5, D, generator=gen)
    v = torch.randn(1, 4, 5, D, generator=gen)

    def fn(q, k, v):
        k = k[:, :, None].expand(1, 2, 2, 5, D).reshape(1, 4, 5, D)
        return F.scaled_dot_product_attention(q, k, v)

    g = em.from_torch(fn, q, k, v)
    got = em.evaluate(g, {"q": q.numpy(), "k": k.numpy(), "v": v.numpy()})["out"]
    np.testing.assert_allclose(got, fn(q, k, v).numpy(), rtol=1e-5, atol=1e-5)


def _eager_attention(b: int, h: int, kv: int, n: int):
    """transformers' eager attention: repeat_kv, two matmuls and a softmax between."""
    r = h // kv

    def fn(q, k, v, mask):
        k = k[:, :, None].expand(b, kv, r, n, D).reshape(b, h, n, D)
        v = v[:, :, None].expand(b, kv, r, n, D).reshape(b, h, n, D)
        w = torch.softmax(torch.matmul(q, k.transpose(2, 3)) * 0.3 + mask, dim=-1)
        return torch.matmul(w, v)

    return fn


@pytest.mark.parametrize("b,kv,s", [(1, 2, 1), (2, 2, 1), (3, 1, 1), (2, 2, 3)])
def test_eager_attention_after_repeat_kv_equals_torch(b, kv, s):
    """One query row per head: each product reads its key head once (no copies); more
    rows keep the copies (the form the planner prices lower there)."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(shape, generator=gen)
               for shape in ((b, 4, s, D), (b, kv, 8, D), (b, kv, 8, D)))
    mask = torch.randn(b, 1, s, 8, generator=gen)
    fn = _eager_attention(b, 4, kv, 8)
    g = em.from_torch(fn, q, k, v, mask)
    feed = {"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "mask": mask.numpy()}
    np.testing.assert_allclose(em.evaluate(g, feed)["out"], fn(q, k, v, mask).numpy(),
                               rtol=1e-5, atol=1e-5)
    copies = any(n.op is em.Op.CONCAT for n in g.nodes())
    assert copies == (s > 1)


def test_a_mismatched_product_after_repeat_kv_names_the_users_shapes():
    def fn(q, k):
        k = k[:, :, None].expand(1, 2, 2, 5, D).reshape(1, 4, 5, D)
        return torch.matmul(q, k)  # (1, 4, 1, D) @ (1, 4, 5, D): inner sizes differ

    with pytest.raises(em.ShapeError, match=r"\(1, 4, 1, 8\).*\(1, 4, 5, 8\)"):
        em.from_torch(fn, torch.randn(1, 4, 1, D), torch.randn(1, 2, 5, D))
