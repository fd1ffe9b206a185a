"""A packed int4 weight-only linear module (issue 53, second slice): a uint8 buffer ``w_p``
(K//2, N) holding two 4-bit weights a byte (GPTQ's order along K: row 2i in the low
nibble), group-wise scales (K//G, N), unpacked with ``&`` and ``>>`` (or
``torch.bitwise_and`` / ``torch.bitwise_right_shift``) and ``torch.stack``. Through
``em.from_torch`` and ``torch.compile(m, backend=em.backend())`` it equals eager."""

from __future__ import annotations

import re

import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")

from torch_models import quantized_linear_result  # noqa: E402

nn = torch.nn


class W4Linear(nn.Module):
    """y = x @ W, W = (q - 8) * s per group of G rows, q unpacked from ``w_p``."""

    def __init__(self, k: int, n: int, group: int, spelling: str = "operators",
                 seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        q = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.uint8)
        self.register_buffer("w_p", q[0::2] | (q[1::2] << 4))  # packed by hand, as GPTQ does
        self.register_buffer("s", torch.rand(k // group, n, generator=gen) * 0.02 + 0.001)
        self.k, self.n, self.group, self.spelling = k, n, group, spelling

    def forward(self, x):
        k, n, g = self.k, self.n, self.group
        if self.spelling == "operators":
            lo, hi = self.w_p & 0xF, self.w_p >> 4
        elif self.spelling == "functions":
            lo, hi = torch.bitwise_and(self.w_p, 15), torch.bitwise_right_shift(self.w_p, 4)
        else:
            lo, hi = self.w_p.bitwise_and(15), self.w_p.bitwise_right_shift(4)
        q = torch.stack([lo, hi], dim=1).reshape(k, n)
        w = (q.reshape(k // g, g, n).to(x.dtype) - 8) * self.s.to(x.dtype)[:, None, :]
        return x @ w.reshape(k, n)


@pytest.mark.parametrize("spelling", ["operators", "functions", "methods"])
def test_from_torch_maps_the_bit_ops(spelling):
    m = W4Linear(64, 16, 32, spelling)
    x = torch.randn(4, 64)
    g = em.from_torch(m, x)
    assert g.inputs["w_p"].dtype == "uint8" and g.inputs["w_p"].shape == (32, 16)
    assert "bitand 0xf w_p" in str(g) and "shr 4 w_p" in str(g)
    inputs = {"x": x.double().numpy(), "w_p": m.w_p.double().numpy(), "s": m.s.double().numpy()}
    with torch.no_grad():
        want = m(x.double()).numpy()
    got = em.evaluate(g, inputs)["out"] if "out" in g.outputs else \
        next(iter(em.evaluate(g, inputs).values()))
    assert abs(got - want).max() <= 1e-9 * abs(want).max()


def test_a_tensor_mask_or_shift_is_refused():
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("w_p", torch.zeros(4, 4, dtype=torch.uint8))

        def forward(self, x):
            return (self.w_p & self.w_p).to(x.dtype) * x

    with pytest.raises(em.UnsupportedOpError, match="integer constant"):
        em.from_torch(Bad(), torch.randn(4, 4))


@pytest.mark.parametrize("dtype,group", [("float16", 32), ("float16", 128), ("float32", 32),
                                         ("float32", 128)])
def test_int4_linear_module_runs_optimized_through_torch_compile(dtype, group):
    k, n = 256, 64
    m = W4Linear(k, n, group)
    x = torch.randn(16, k, dtype=getattr(torch, dtype))
    res = quantized_linear_result(m, x)
    src = res.triton_source()
    assert "torch.uint8)" in src, src  # the packed bytes are an input, unpacked by the code
    assert re.search(r"& 15\b|bitwise_and\(\w+, 15\)", src), src
    assert re.search(r">> 4\b|bitwise_right_shift\(\w+, 4\)", src), src
