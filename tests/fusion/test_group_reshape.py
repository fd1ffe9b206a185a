"""A reshape that splits a looped axis into groups (issue 53, group-wise quantized weights):
``[N, K] -> [N, K / g, g]`` gives the groups' dim the index of K (``indexing.py``), so a
loop over K takes chunks of a multiple of g, and the grouped int8 linear
``x @ (((q.astype(f).reshape(N, G, g) - z) * s).reshape(N, K)).T`` is one kernel that loads
int8 qdata and each chunk's group scales and zero points, never writing the fp16 W."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.fusion.indexing import ScheduleError, index_fragment
from eqsat_mirage.fusion.lower import lower
from eqsat_mirage.fusion.planner import plan
from eqsat_mirage.fusion.schedule import Schedule, check_schedule
from eqsat_mirage.fusion.strategy import candidate_schedules
from eqsat_mirage.ir.node import Op


def grouped_linear(m: int, k: int, n: int, g: int, act: str = "float16") -> em.Graph:
    """The program ``frontend.quantized.dequantized`` reads a per-group int8 weight as."""
    groups = k // g
    gr = em.Graph("w8_grouped")
    x = gr.input("x", (m, k), dtype=act)
    q = gr.input("qdata", (n, k), dtype="int8")
    z = gr.input("zero_point", (n, groups), dtype="int8")
    s = gr.input("scale", (n, groups), dtype=act)
    w = q.astype(act).reshape(n, groups, g)
    w = (w - z.reshape(n, groups, 1).astype(act)) * s.reshape(n, groups, 1)
    gr.output(x @ w.reshape(n, k).T, "y")
    return gr


def _dequant_then_matmul_us(m: int, k: int, n: int, g: int) -> float:
    """The two-kernel plan's model cost: a kernel writing W in fp16, then x @ W.T."""
    groups = k // g
    d = em.Graph("dequant")
    q = d.input("qdata", (n, k), dtype="int8")
    z = d.input("zero_point", (n, groups), dtype="int8")
    s = d.input("scale", (n, groups), dtype="float16")
    w = (q.astype("float16").reshape(n, groups, g) - z.reshape(n, groups, 1).astype("float16"))
    d.output((w * s.reshape(n, groups, 1)).reshape(n, k), "W")
    mm = em.Graph("matmul")
    mm.output(mm.input("x", (m, k), dtype="float16") @ mm.input("W", (n, k), dtype="float16").T,
              "y")
    return plan(d, "h200").cost_us + plan(mm, "h200").cost_us


@pytest.mark.parametrize("g", [128, 32])
def test_grouped_int8_linear_at_decode_size_is_one_kernel_looping_over_k(g):
    m, k, n = 1, 4096, 4096
    p = plan(grouped_linear(m, k, n, g), "h200")
    (kernel,) = p.mugraph.kernels
    assert kernel.kind == "custom" and kernel.forloop > 1, str(p.mugraph)
    # int8 qdata and the chunk's group scales / zero points are loaded per iteration
    ins = kernel.inputs
    assert ins["qdata"].fmap == 1 and ins["scale"].fmap == 1 and ins["zero_point"].fmap == 1
    tiles = kernel.stage("loop").inputs
    chunk = k // kernel.forloop
    assert chunk % g == 0 and tiles["qdata"].shape[1] == chunk
    assert tiles["scale"].shape[1] == tiles["zero_point"].shape[1] == chunk // g
    # no dequantized weight goes through device memory
    assert set(p.mugraph.tensors) == {"x", "qdata", "zero_point", "scale", "y"}
    assert p.cost_us < _dequant_then_matmul_us(m, k, n, g)


def test_grouped_linear_with_a_k_loop_runs_in_triton_and_equals_numpy():
    torch = pytest.importorskip("torch")
    from eqsat_mirage.codegen.source import compile_mugraph

    m, k, n, g = 4, 256, 64, 32
    groups = k // g
    gr = grouped_linear(m, k, n, g, act="float32")
    ix = index_fragment(gr)
    kk, nn = ix.input_index("x", 1), ix.input_index("qdata", 0)
    # the groups' dim carries K's index; the group's elements are read whole
    assert ix.input_index("scale", 1) == kk and ix.unit(kk) == groups
    assert any(s.loop == kk and s.forloop > 1 for s in candidate_schedules(gr))
    mg = lower(gr, Schedule(grid={nn: 2}, loop=kk, forloop=4))
    kernel = mg.kernels[0]
    assert kernel.forloop == 4 and kernel.stage("loop").inputs["scale"].shape == (32, 2)
    assert em.verify(gr, mg).equivalent
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k))
    q = rng.integers(-128, 128, (n, k))
    z = rng.integers(-8, 9, (n, groups))
    s = rng.random((n, groups)) * 0.02 + 0.001
    fn = compile_mugraph(mg)
    got = fn(x=torch.tensor(x, dtype=torch.float32), qdata=torch.tensor(q, dtype=torch.int8),
             zero_point=torch.tensor(z, dtype=torch.int8),
             scale=torch.tensor(s, dtype=torch.float32))["y"]
    w = ((q.reshape(n, groups, g) - z[:, :, None]) * s[:, :, None]).reshape(n, k)
    np.testing.assert_allclose(got.double().numpy(), x @ w.T, rtol=1e-4, atol=1e-4)


def test_a_cut_reshape_needs_whole_groups_and_power_of_two_tiles():
    gr = grouped_linear(4, 96, 32, 24, act="float32")  # 4 groups of 24
    ix = index_fragment(gr)
    kk = ix.input_index("x", 1)
    with pytest.raises(ScheduleError, match="does not divide .* whole groups"):
        check_schedule(ix, Schedule(loop=kk, forloop=3))  # chunks of 32: not whole groups
    with pytest.raises(ScheduleError, match="powers of two"):
        check_schedule(ix, Schedule(loop=kk, forloop=2))  # tiles of 2 groups of 24
    split = next(n for n in ix.nodes if n.op is Op.RESHAPE and n.shape == (32, 4, 24))
    with pytest.raises(ScheduleError, match="split or merged by reshape"):
        check_schedule(ix, Schedule(grid={ix.of(split)[2]: 2}))  # the minor dim


def test_a_reshape_whose_major_dim_would_clash_stays_unscheduled():
    """Tying a merge's major dim (a's 4) to the merged dim (64) would give c both dims' one
    index: the reshaped dims go unscheduled instead, as before."""
    gr = em.Graph("clash")
    a = gr.input("a", (4, 16), dtype="float32")
    c = gr.input("c", (4, 64), dtype="float32")
    gr.output(c * a.sum(axis=1, keepdims=True) + a.reshape(64), "y")
    ix = index_fragment(gr)
    assert ix.input_index("a", 0) in ix.fixed and not ix.units


@pytest.mark.parametrize("bits", [8, 4])
def test_a_torchao_grouped_linear_at_decode_size_plans_one_kernel(bits):
    """What em.from_torch reads of torchao's PerGroup(32) weights (int8, int4 one to an
    int8; an fp32 scale): one kernel at M = 1, K = N = 4096, no fp16 W between kernels."""
    torch = pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantization = pytest.importorskip("torchao.quantization")
        group = quantization.granularity.PerGroup(32)
        config = quantization.Int8WeightOnlyConfig(granularity=group) if bits == 8 else \
            quantization.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=group)
        torch.manual_seed(0)
        m = torch.nn.Linear(4096, 4096, bias=False).to(torch.float16)
        quantization.quantize_(m, config)
    g = em.from_torch(m, torch.randn(1, 4096, dtype=torch.float16))
    p = plan(g, "h200")
    (kernel,) = p.mugraph.kernels
    assert kernel.kind == "custom" and kernel.forloop > 1, str(p.mugraph)
    assert set(p.mugraph.tensors) == set(g.inputs) | set(g.outputs)
    assert p.cost_us < _dequant_then_matmul_us(1, 4096, 4096, 32)
