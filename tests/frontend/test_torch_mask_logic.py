"""Bool masks combined in the torch front end (issue 52): every spelling of a logical and / or
of two bool masks (``&``, ``|``, ``torch.logical_and``, ``bitwise_or``, the methods, the aten
overloads) traces to ``Op.AND`` / ``Op.OR`` and equals eager torch; a folded causal buffer
combines with a mask argument; the result feeds ``masked_fill``, ``where`` and SDPA's
``attn_mask``; ``w & 0xF`` of an int8 tensor stays the bit op; anything else is refused."""

from __future__ import annotations

import operator

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.ir.node import Op

torch = pytest.importorskip("torch")

from eqsat_mirage.frontend.from_torch import graph_inputs  # noqa: E402
from eqsat_mirage.frontend.torch_ops import function_handler  # noqa: E402

SPELLINGS = {
    Op.AND: [operator.and_, torch.logical_and, torch.bitwise_and, lambda a, b: a & b,
             lambda a, b: a.logical_and(b), lambda a, b: a.bitwise_and(b),
             lambda a, b: a.__and__(b)],
    Op.OR: [operator.or_, torch.logical_or, torch.bitwise_or, lambda a, b: a | b,
            lambda a, b: a.logical_or(b), lambda a, b: a.bitwise_or(b),
            lambda a, b: a.__or__(b)],
}


def _feed(g, fn, *args) -> dict:
    return {k: v.double().numpy() if v.is_floating_point() else v.numpy()
            for k, v in graph_inputs(g, fn, *args).items()}


def _eager(fn, *args):
    return fn(*(a.double() if a.is_floating_point() else a for a in args)).numpy()


def _filled(combine):
    """``s.masked_fill(combine(s > 0, m), -1)``: a comparison's mask with a mask argument."""
    def fn(s, m):
        return s.masked_fill(combine(s > 0, m), -1.0)
    return fn


def _args(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(2, 4, 6, generator=gen)
    m = torch.rand(4, 6, generator=gen) < 0.5
    return s, m


@pytest.mark.parametrize("op", list(SPELLINGS), ids=lambda o: o.name)
def test_every_spelling_traces_to_its_op(op):
    s, m = _args()
    for combine in SPELLINGS[op]:
        fn = _filled(combine)
        g = em.from_torch(fn, s, m)
        assert [n.op for n in g.nodes() if n.op in (Op.AND, Op.OR)] == [op], combine
        np.testing.assert_array_equal(em.evaluate(g, _feed(g, fn, s, m))["out"],
                                      _eager(fn, s, m))


def test_aten_overloads_of_two_masks():
    g = em.Graph("aten")
    m, n = g.input("m", (4, 6), "bool"), g.input("n", (6,), "bool")
    aten = torch.ops.aten
    for target, op in ((aten.logical_and.default, Op.AND), (aten.logical_or.default, Op.OR),
                       (aten.bitwise_and.Tensor, Op.AND), (aten.bitwise_or.Tensor, Op.OR),
                       (aten.__and__.Tensor, Op.AND), (aten.__or__.Tensor, Op.OR)):
        out = function_handler(target)(m, n)
        assert out.node.op is op and out.shape == (4, 6), target
    w = g.input("w", (4, 6), "uint8")  # & of an int8/uint8 tensor and a constant: a bit op
    assert function_handler(aten.bitwise_and.Scalar)(w, 0xF).node.op is Op.BITAND


def test_a_folded_causal_buffer_combines_with_a_padding_argument():
    """nanoGPT's causal buffer and a padding mask passed in, combined as transformers'
    ``and_masks`` / ``or_masks`` do, then a negated combination: ~(causal & pad)."""
    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("bias", torch.tril(torch.ones(6, 6)).view(1, 1, 6, 6))

        def forward(self, s, pad):
            causal = self.bias[:, :, :6, :6] == 1
            keep = causal & pad[:, None, None, :]
            either = pad[:, None, None, :] | (self.bias == 0)
            a = s.masked_fill(~keep, float("-inf")).softmax(-1)
            return a + s.masked_fill(either, 0.5)

    mod = Masked()
    s, pad = torch.randn(2, 3, 6, 6), torch.rand(2, 6) < 0.6
    pad[:, 0] = True  # every row keeps its first column
    g = em.from_torch(mod, s, pad)
    ops = {n.op for n in g.nodes()}
    assert {Op.CAUSAL, Op.AND, Op.OR} <= ops and list(g.inputs) == ["s", "pad"]
    got = em.evaluate(g, _feed(g, mod, s, pad))["out"]
    want = mod(s.double(), pad).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


class Attend(torch.nn.Module):
    """SDPA under a padding mask and a causal buffer combined, or a score above 2; then a
    where on an or of two comparisons."""

    def __init__(self, n: int = 5) -> None:
        super().__init__()
        self.register_buffer("causal", torch.ones(n, n, dtype=torch.bool).tril())

    def forward(self, q, k, v, pad):
        n = q.shape[-2]  # the buffer sliced as nanoGPT does: folded into the causal mask
        mask = torch.logical_and(pad[:, None, None, :], self.causal[:n, :n]) | (
            q @ k.transpose(-2, -1) > 2.0)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return torch.where((out > 0) | (v.sum(-1, keepdim=True) < 0), out, 0.5 * out)


def test_a_combined_mask_feeds_where_and_sdpa():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=gen) for _ in range(3))
    pad = torch.rand(2, 5, generator=gen) < 0.5
    mod = Attend()
    g = em.from_torch(mod, q, k, v, pad)
    assert list(g.inputs) == ["q", "k", "v", "pad"] and any(n.op is Op.CAUSAL for n in g.nodes())
    assert sum(n.op is Op.OR for n in g.nodes()) == 2 and any(n.op is Op.AND for n in g.nodes())
    np.testing.assert_allclose(em.evaluate(g, _feed(g, mod, q, k, v, pad))["out"],
                               mod(q.double(), k.double(), v.double(), pad).numpy(),
                               rtol=1e-10, atol=1e-10)


def test_mixed_operands_are_refused_and_bit_ops_stay():
    s, m = _args()
    for fn in (lambda s, m: s.masked_fill(m & s, 0.0), lambda s, m: s.masked_fill(m | 1, 0.0),
               lambda s, m: s.masked_fill(torch.logical_or(s, m), 0.0)):
        with pytest.raises(em.UnsupportedOpError, match=r"(&|\||logical_or) of .*bool masks"):
            em.from_torch(fn, s, m)

    def unpack(w, x):  # packed int4 weights: the low nibbles, as before
        return x @ (w & 0xF).to(torch.float32)

    w, x = torch.randint(0, 256, (6, 3), dtype=torch.uint8), torch.randn(2, 6)
    g = em.from_torch(unpack, w, x)
    assert any(n.op is Op.BITAND for n in g.nodes())
    assert not any(n.op is Op.AND for n in g.nodes())


def test_new_ones_and_friends_are_constants():
    """``x.new_ones((), dtype=torch.bool)`` is True, folded by ``&`` (no input added: the
    traced function keeps its arguments); a 0-dim float ``*_like``/``new_*`` is a constant;
    other shapes and uses are refused with the op named."""
    def started_true(q, k, x):
        mask = q.new_ones((), dtype=torch.bool) & (k[None, :] <= q[:, None])
        return torch.where(mask, x, torch.zeros_like(x[0, 0]) - 5.0)

    q, k, x = torch.arange(6), torch.arange(6), torch.randn(6, 6)
    g = em.from_torch(started_true, q, k, x)
    assert list(g.inputs) == ["q", "k", "x"]
    got = em.evaluate(g, {"q": q.numpy(), "k": k.numpy(), "x": x.numpy()})
    np.testing.assert_allclose(next(iter(got.values())), started_true(q, k, x).numpy())
    for bad, what in ((lambda q, x: x * q.new_zeros((), dtype=torch.bool), "mul"),
                      (lambda q, x: torch.where(q.new_zeros((), dtype=torch.bool)
                                                & (q[:, None] > 0), x, 0.0), "&"),
                      (lambda q, x: x + torch.full_like(x, 2.0), "full_like")):
        with pytest.raises(ValueError, match=what):
            em.from_torch(bad, q, x)
