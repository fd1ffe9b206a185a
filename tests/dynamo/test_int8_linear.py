"""An int8 weight-only linear module (issue 53): an int8 buffer W (nn.Linear's (N, K)
layout) and a per-output-channel scale (and zero point) buffer, dequantized as
``w_q.to(x.dtype) * s[:, None]`` and read by ``F.linear``. ``em.from_torch`` makes the
int8 buffer an int8 input; ``torch.compile(m, backend=em.backend())`` runs it as one
kernel that loads the int8 tile, and equals eager."""

from __future__ import annotations

import re

import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")

from torch_models import quantized_linear_result  # noqa: E402

nn, F = torch.nn, torch.nn.functional


class W8Linear(nn.Module):
    """y = F.linear(x, (w_q.to(x.dtype) - z[:, None]) * s[:, None]): int8 weights of shape
    (N, K), a float scale (and zero point) per output channel."""

    def __init__(self, n: int, k: int, zero_point: bool, cast: str = "to", seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.register_buffer("w_q", torch.randint(-128, 128, (n, k), generator=gen,
                                                  dtype=torch.int8))
        self.register_buffer("s", torch.rand(n, generator=gen) * 0.02 + 0.001)
        self.zero_point, self.cast = zero_point, cast
        if zero_point:
            self.register_buffer("z", torch.randint(-8, 9, (n,), generator=gen).float())

    def forward(self, x):
        if self.cast == "to":
            w = self.w_q.to(x.dtype)
        elif self.cast == "half":
            w = self.w_q.half()
        elif self.cast == "float":
            w = self.w_q.float()
        else:
            w = self.w_q.to(torch.float16)
        if self.zero_point:
            w = w - self.z.to(w.dtype)[:, None]
        return F.linear(x, w * self.s.to(w.dtype)[:, None])


def test_from_torch_makes_the_int8_buffer_an_int8_input():
    m = W8Linear(24, 32, zero_point=True)
    g = em.from_torch(m, torch.randn(4, 32))
    assert g.inputs["w_q"].dtype == "int8" and g.inputs["w_q"].shape == (24, 32)
    assert "cast to=float32 w_q" in str(g)


@pytest.mark.parametrize("dtype,zero_point,cast", [
    ("float16", False, "to"), ("float16", True, "half"), ("float32", False, "float"),
    ("float32", True, "to"), ("float16", False, "to_float16")])
def test_int8_linear_module_runs_optimized_through_torch_compile(dtype, zero_point, cast):
    k, n = 64, 48
    m = W8Linear(n, k, zero_point, cast)
    x = torch.randn(16, k, dtype=getattr(torch, dtype))
    res = quantized_linear_result(m, x)
    src = res.triton_source()
    assert "torch.int8)" in src  # the int8 buffer is an input of the generated code
    load = re.search(r"^\s*(\w+) = tl\.load\(\w*w_q\w*_ptrs", src, re.M)
    assert load and re.search(rf"\b{load.group(1)}\.to\(tl\.float32\)", src), src
    # no dequantized W: nothing of W's size is allocated (the output is; a reshape of the
    # scale may be a view)
    made = re.findall(r"(?:new_empty|torch\.empty)\(\(([\d, ]+)\)", src)
    assert f"16, {n}" in made and not {f"{n}, {k}", f"{k}, {n}"} & set(made), made
    custom = [kn for kn in res.program.kernels if kn.kind == "custom"]
    assert len(custom) == 1 and "cast" in str(res.program), res.program


def test_a_view_of_a_scale_buffer_joins_the_partition():
    """``s[:, None]`` of a buffer is an indexing of a graph input: torch.fx's partitioner
    keeps a ``getitem`` with its source, which is in no partition, so it had stayed eager
    (counted as a compute op left out). It is retargeted and joins the partition."""
    from torch_models import Int8Linear

    torch.manual_seed(0)
    m = nn.Sequential(Int8Linear(nn.Linear(64, 32)), nn.SiLU(), Int8Linear(nn.Linear(32, 16)))
    be = em.backend(warmup=0, cache=False, warn=False)
    x = torch.randn(4, 64)
    with torch.no_grad():
        want, got = m(x), torch.compile(m, backend=be)(x)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)
    s = be.summary()
    assert s["eager"] == [] and s["optimized_compute_ops"] == s["compute_ops"], s
