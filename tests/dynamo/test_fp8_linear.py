"""fp8 weight-only linears (issue 53): a module holding a float8_e4m3fn (or e5m2) weight
buffer W (nn.Linear's (N, K) layout) and a per-output-channel scale, computing
``F.linear(x, w_q.to(x.dtype) * s[:, None])``, and torchao's ``Float8WeightOnlyConfig``
weights (``Float8Tensor``: fp8 qdata and a float32 scale per row). ``em.from_torch`` makes
the fp8 buffer (or qdata) an fp8 input; ``torch.compile(m, backend=em.backend())`` runs
the linear as one kernel that loads the fp8 tile, and equals eager."""

from __future__ import annotations

import re
import warnings

import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")

from torch_models import quantized_linear_result  # noqa: E402

nn, F = torch.nn, torch.nn.functional


class F8Linear(nn.Module):
    """y = F.linear(x, w_q.to(x.dtype) * s[:, None]): fp8 weights of shape (N, K) scaled
    to the dtype's range per output channel, a float32 scale per output channel."""

    def __init__(self, n: int, k: int, dtype: torch.dtype = torch.float8_e4m3fn, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        w = torch.randn(n, k, generator=gen)
        s = w.abs().amax(dim=1) / torch.finfo(dtype).max
        self.register_buffer("w_q", (w / s[:, None]).to(dtype))
        self.register_buffer("s", s)

    def forward(self, x):
        return F.linear(x, self.w_q.to(x.dtype) * self.s.to(x.dtype)[:, None])


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(64, 96), nn.Linear(96, 32, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.up(x)))


def _one_fp8_kernel(res, dtype: str, n: int, k: int) -> None:
    """The partition is one custom kernel that loads the fp8 weights and converts them in
    registers; nothing of W's size is allocated."""
    src = res.triton_source()
    assert f"torch.{dtype})" in src  # the fp8 tensor is an input of the generated code
    load = re.search(r"^\s*(\w+) = tl\.load\(\w*(?:w_q|qdata)\w*_ptrs", src, re.M)
    assert load and re.search(rf"\b{load.group(1)}\.to\(tl\.float32\)", src), src
    made = re.findall(r"(?:new_empty|torch\.empty)\(\(([\d, ]+)\)", src)
    assert not {f"{n}, {k}", f"{k}, {n}"} & set(made), made
    custom = [kn for kn in res.program.kernels if kn.kind == "custom"]
    assert len(custom) == 1 and "cast" in str(res.program), res.program


def test_from_torch_makes_the_fp8_buffer_an_fp8_input():
    m = F8Linear(24, 32)
    g = em.from_torch(m, torch.randn(4, 32))
    assert g.inputs["w_q"].dtype == "float8_e4m3fn" and g.inputs["w_q"].shape == (24, 32)
    assert "cast to=float32 w_q" in str(g)


@pytest.mark.parametrize("act,wdtype", [("float16", "float8_e4m3fn"),
                                        ("float32", "float8_e4m3fn"),
                                        ("float16", "float8_e5m2")])
def test_fp8_linear_module_runs_optimized_through_torch_compile(act, wdtype):
    k, n = 64, 48
    m = F8Linear(n, k, getattr(torch, wdtype))
    res = quantized_linear_result(m, torch.randn(16, k, dtype=getattr(torch, act)))
    _one_fp8_kernel(res, wdtype, n, k)


def _float8_weights(m: nn.Module, **config) -> nn.Module:
    """``m`` with its linears' weights quantized by torchao's Float8WeightOnlyConfig."""
    quantization = pytest.importorskip("torchao.quantization")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantization.quantize_(m, quantization.Float8WeightOnlyConfig(**config))
    return m


@pytest.mark.parametrize("act,wdtype", [("float16", "float8_e4m3fn"),
                                        ("float32", "float8_e4m3fn"),
                                        ("float32", "float8_e5m2")])
def test_a_torchao_float8_weight_only_linear_equals_eager(act, wdtype):
    torch.manual_seed(0)
    dtype = getattr(torch, act)
    m = _float8_weights(nn.Linear(64, 48, bias=False).to(dtype),
                        weight_dtype=getattr(torch, wdtype))
    assert type(m.weight).__name__ == "Float8Tensor" and m.weight.scale.dtype == torch.float32
    res = quantized_linear_result(m, torch.randn(4, 64, dtype=dtype))
    parts = {n: node.dtype for n, node in res.program.inputs.items()}
    (qdata,) = [n for n in parts if n.endswith("_qdata")]
    assert parts[qdata] == wdtype, parts  # the stored fp8, not W
    (scale,) = [n for n in parts if n.endswith("_scale")]
    assert parts[scale] == "float32" and res.program.inputs[scale].shape == (48, 1), parts
    _one_fp8_kernel(res, wdtype, 48, 64)


def test_from_torch_reads_the_float8_parts_and_evaluates_to_eager():
    import numpy as np

    from eqsat_mirage.frontend.from_torch import graph_inputs

    torch.manual_seed(0)
    m = _float8_weights(MLP())
    x = torch.randn(2, 64)
    g = em.from_torch(m, x)
    assert g.inputs["up_weight_qdata"].dtype == "float8_e4m3fn", g.inputs
    assert g.inputs["up_weight_scale"].shape == (96, 1), g.inputs
    feed = graph_inputs(g, m, x)
    assert feed["up_weight_qdata"] is m.up.weight.qdata
    got = em.evaluate(g, {n: t.detach() for n, t in feed.items()})
    with torch.no_grad():
        want = m(x).numpy()
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-5, atol=1e-5)


def test_float8_weights_that_quantize_the_activations_are_refused():
    """A Float8Tensor with act_quant_kwargs (fp8 activations; made by hand: torchao's
    dynamic-activation config needs a GPU) is not weight-only: UnsupportedOpError."""
    from torchao.quantization import Float8Tensor
    from torchao.quantization.quantize_.workflows import QuantizeTensorToFloat8Kwargs

    from eqsat_mirage.frontend.quantized import dequantized

    qdata = torch.randn(8, 16).to(torch.float8_e4m3fn)
    w = Float8Tensor(qdata, torch.ones(8, 1), block_size=[1, 16],
                     act_quant_kwargs=QuantizeTensorToFloat8Kwargs(), dtype=torch.float32)
    with pytest.raises(em.MirageError, match="quantizes the activations too"):
        dequantized(lambda *a: None, "w", w, ("param", "w"))
