"""Weights quantized by torchao's ``quantize_`` (issue 53): the backend and ``em.from_torch``
read a quantized weight (a torchao wrapper tensor) as its parts, int8 ``qdata``, ``scale``
and ``zero_point``, and dequantize it inside the program, so the compiled module equals
eager torchao and its kernels load int8. A layout it cannot read keeps the ops reading
that weight eager, with the weight and its class in the reason."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat_mirage as em
from eqsat_mirage.frontend.from_torch import graph_inputs

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    quantization = pytest.importorskip("torchao.quantization")

from torch_models import assert_close_to_eager, quantized_linear_result  # noqa: E402

nn = torch.nn
PerGroup = quantization.granularity.PerGroup

CONFIGS = {
    "int8 per row": lambda: quantization.Int8WeightOnlyConfig(),
    "int8 group 32": lambda: quantization.Int8WeightOnlyConfig(granularity=PerGroup(32)),
    "int4 group 32": lambda: quantization.IntxWeightOnlyConfig(weight_dtype=torch.int4,
                                                               granularity=PerGroup(32)),
}


class Block(nn.Module):
    """RMSNorm, a linear with bias, SiLU, a linear, a residual: two quantized weights."""

    def __init__(self, d: int = 64, h: int = 96) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(d)
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, d, bias=False)

    def forward(self, x):
        return x + self.down(nn.functional.silu(self.up(self.norm(x))))


def _quantized(module: nn.Module, config: str, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    module = module.to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantization.quantize_(module, CONFIGS[config]())
    return module


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_torchao_linear_runs_optimized_and_equals_eager(config, dtype):
    dtype = getattr(torch, dtype)
    m = _quantized(nn.Linear(64, 48, bias=False), config, dtype)
    res = quantized_linear_result(m, torch.randn(4, 64, dtype=dtype))
    parts = {n: node.dtype for n, node in res.program.inputs.items()}
    qdata = [n for n in parts if n.endswith("_qdata")]
    assert len(qdata) == 1 and parts[qdata[0]] == "int8", parts  # the stored int8, not W
    assert any(n.endswith("_scale") for n in parts), parts
    if config == "int8 per row":  # the dequantization is fused into the matmul's W load
        assert len(res.program.kernels) == 1, res.program


def test_a_quantized_block_is_one_partition_equal_to_eager():
    m = _quantized(Block(), "int8 per row", torch.float32)
    be = em.backend(warmup=0, cache=False, warn=False)
    x = torch.randn(1, 5, 64)
    with torch.no_grad():
        want, got = m(x), torch.compile(m, backend=be)(x)
    assert_close_to_eager(got, want, x.dtype)
    s = be.summary()
    assert s["optimized_compute_ops"] == s["compute_ops"] == 5, s
    (entry,) = be.report
    assert entry.status == "optimized" and entry.calls == 1, entry


def test_a_layout_it_cannot_read_stays_eager_with_the_reason():
    """int8 weights that quantize the activations too (act_quant_kwargs): not weight-only,
    so the ops reading them run eagerly (fp8 weights: tests/dynamo/test_fp8_linear.py)."""
    torch.manual_seed(0)
    m = Block()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantization.quantize_(m, quantization.Int8DynamicActivationInt8WeightConfig())
    be = em.backend(warmup=0, cache=False, warn=False)
    x = torch.randn(1, 5, 64)
    with torch.no_grad():
        want, got = m(x), torch.compile(m, backend=be)(x)
    assert torch.equal(got, want)
    eager = " ".join(be.summary()["eager"])
    assert "Int8Tensor" in eager and "up_parameters_weight" in eager, eager
    assert "quantizes the activations too" in eager, eager


def test_from_torch_reads_the_parts_and_evaluates_to_eager():
    m = _quantized(Block(), "int4 group 32", torch.float32)
    x = torch.randn(2, 64)
    g = em.from_torch(m, x)
    assert g.inputs["up_weight_qdata"].dtype == "int8", g.inputs
    assert g.inputs["up_weight_scale"].shape == (96, 2), g.inputs
    feed = graph_inputs(g, m, x)
    assert feed["up_weight_qdata"] is m.up.weight.qdata
    got = em.evaluate(g, {n: t.detach().numpy() for n, t in feed.items()})
    with torch.no_grad():
        want = m(x).numpy()
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-5, atol=1e-5)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.sampled_from([16, 48]), k=st.sampled_from([64, 128]),
       group=st.sampled_from([16, 32, 64, None]), bits=st.sampled_from([4, 8]),
       dtype=st.sampled_from(["float32", "float16", "bfloat16"]), seed=st.integers(0, 99))
def test_quantized_linears_over_shapes_equal_eager(n, k, group, bits, dtype, seed):
    """Random weight shapes, group sizes (None: per row), bit widths and activation dtypes:
    the optimized program (Triton, interpreted) equals torchao's eager linear."""
    granularity = PerGroup(group) if group else quantization.granularity.PerAxis(0)
    config = quantization.IntxWeightOnlyConfig(weight_dtype=getattr(torch, f"int{bits}"),
                                               granularity=granularity)
    torch.manual_seed(seed)
    m = nn.Linear(k, n, bias=False).to(getattr(torch, dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantization.quantize_(m, config)
    quantized_linear_result(m, torch.randn(2, k, dtype=getattr(torch, dtype)))


def test_from_torch_reads_a_quantized_weight_passed_as_an_argument():
    m = _quantized(nn.Linear(64, 16, bias=False), "int8 per row", torch.float32)
    x, w = torch.randn(3, 64), m.weight
    g = em.from_torch(lambda x, w: nn.functional.linear(x, w).relu(), x, w)
    assert g.inputs["w_qdata"].dtype == "int8", g.inputs
    feed = graph_inputs(g, None, x, w)
    got = next(iter(em.evaluate(g, {n: t.detach().numpy() for n, t in feed.items()}).values()))
    with torch.no_grad():
        want = nn.functional.linear(x, w).relu().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_quantized_buffer_is_read_as_its_parts():
    """A quantized weight held as a buffer (a get_attr in the traced graph), not a
    parameter."""
    lin = _quantized(nn.Linear(64, 16, bias=False), "int8 group 32", torch.float32)

    class Held(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("w", lin.weight.detach())  # not a Parameter

        def forward(self, x):
            return nn.functional.linear(x, self.w) * 2.0

    m, x = Held(), torch.randn(3, 64)
    g = em.from_torch(m, x)
    assert g.inputs["w_qdata"].dtype == "int8", g.inputs
    feed = graph_inputs(g, m, x)
    got = next(iter(em.evaluate(g, {n: t.detach().numpy() for n, t in feed.items()}).values()))
    with torch.no_grad():
        np.testing.assert_allclose(got, m(x).numpy(), rtol=1e-5, atol=1e-5)


def test_parts_laid_out_otherwise_are_refused():
    """A scale stored per block but transposed, or qdata not of the weight's shape, is not
    read by element count: the op stays eager with the reason."""
    lin = _quantized(nn.Linear(64, 16, bias=False), "int8 group 32", torch.float32)
    w = lin.weight
    cls = type(w)
    bad = cls(w.qdata, w.scale.t().contiguous(), w.block_size, w.dtype,
              zero_point=w.zero_point)
    with pytest.raises(em.UnsupportedOpError, match="scale has shape .2, 16., not one per"):
        em.from_torch(lambda x, w: nn.functional.linear(x, w), torch.randn(2, 64), bad)
