"""int8/uint8 weights as values (issue 53, weight-only int8): an integer input cast to a
float dtype, every backend (float, native, field, torch, Triton), and the int8 weight-only
linear ``x @ (w_q.astype(f) * s)`` (with and without a zero point) optimized into one
kernel that loads the int8 tile and dequantizes it in registers."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat_mirage as em
from eqsat_mirage.ir.errors import DTypeError, InputError
from eqsat_mirage.ir.node import ITEMSIZE, QUANT_RANGE
from eqsat_mirage.semantics.floating import draw_ints
from eqsat_mirage.semantics.torch_reference import torch_reference
from eqsat_mirage.verifier.draws import Draws

torch = pytest.importorskip("torch")

from torch_models import assert_close_to_eager, run_compiled  # noqa: E402


def w8_linear(m: int, k: int, n: int, act: str = "float16", zero_point: bool = False,
              wdtype: str = "int8", scale_2d: bool = False) -> em.Graph:
    """``y = x @ ((w_q.astype(act) - z) * s)``: w_q (K, N) integers, s and z per output
    channel (N,) (s as (1, N) with ``scale_2d``)."""
    g = em.Graph("w8_linear")
    x = g.input("x", (m, k), dtype=act)
    wq = g.input("Wq", (k, n), dtype=wdtype)
    s = g.input("s", (1, n) if scale_2d else (n,), dtype=act)
    w = wq.astype(act)
    if zero_point:
        w = w - g.input("z", (n,), dtype=act)
    g.output(x @ (w * s), "y")
    return g


def _inputs(g: em.Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, node in g.inputs.items():
        if node.dtype in QUANT_RANGE:
            lo, hi = QUANT_RANGE[node.dtype]
            out[name] = rng.integers(lo, hi + 1, node.shape).astype(np.float64)
        elif name == "s":
            out[name] = rng.random(node.shape) * 0.02 + 0.001
        elif name == "z":
            out[name] = rng.integers(-8, 9, node.shape).astype(np.float64)
        else:
            out[name] = rng.standard_normal(node.shape)
    return out


def _eager(g: em.Graph, inputs: dict[str, np.ndarray]) -> torch.Tensor:
    """torch's dequantized eager reference, in the activation dtype."""
    act = getattr(torch, g.inputs["x"].dtype)
    x = torch.tensor(inputs["x"]).to(act)
    w = torch.tensor(inputs["Wq"]).to(getattr(torch, g.inputs["Wq"].dtype)).to(act)
    if "z" in inputs:
        w = w - torch.tensor(inputs["z"]).to(act)
    return x @ (w * torch.tensor(inputs["s"]).to(act))


def _run(res, g: em.Graph, inputs: dict[str, np.ndarray]) -> torch.Tensor:
    """The optimized program's output ``y`` (``torch_models.run_compiled``)."""
    return run_compiled(res, g, inputs)["y"]


def test_int8_input_cast_in_the_ir_and_the_float_backend():
    g = em.Graph("cast")
    w = g.input("w", (4,), dtype="int8")
    g.output(w.astype("float16"), "f")
    g.output(w.astype("uint8").astype("float32"), "wrapped")
    assert "w: i8[4]" in str(g)
    vals = np.array([-128, -1, 0, 127])
    for dtype in (None, "native"):
        out = em.evaluate(g, {"w": vals}, dtype=dtype)
        assert out["f"].tolist() == [-128, -1, 0, 127]
        assert out["wrapped"].tolist() == [128, 255, 0, 127]  # as torch's int8 -> uint8
    assert torch.tensor(vals, dtype=torch.int8).to(torch.uint8).tolist() == [128, 255, 0, 127]
    assert ITEMSIZE["int8"] == ITEMSIZE["uint8"] == 1


@pytest.mark.parametrize("bad", [
    lambda w, x: w + 1, lambda w, x: w * x, lambda w, x: w.sum(axis=0),
    lambda w, x: em.exp(w), lambda w, x: x @ w])
def test_arithmetic_on_int8_is_refused(bad):  # (movement: tests/ir/test_int4_weights.py)
    g = em.Graph("bad")
    w = g.input("w", (4, 4), dtype="int8")
    x = g.input("x", (4, 4), dtype="float16")
    with pytest.raises(DTypeError, match="int8 tensor .*can only be cast"):
        bad(w, x)


def test_casts_to_int8_and_out_of_range_inputs_are_refused():
    g = em.Graph("bad")
    x = g.input("x", (4,), dtype="float16")
    with pytest.raises(DTypeError, match="cast to 'int8'"):
        x.astype("int8")
    g = em.Graph("range")
    w = g.input("w", (4,), dtype="uint8")
    g.output(w.astype("float32"), "y")
    with pytest.raises(InputError, match=r"'w' \(uint8\): expected integers in \[0, 255\]"):
        em.evaluate(g, {"w": np.array([0, 1, 2, 256])})
    with pytest.raises(InputError, match="not all integers"):
        em.evaluate(g, {"w": np.array([0, 1, 2, 2.5])})


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_integer_draws_cover_the_whole_range(dtype):
    lo, hi = QUANT_RANGE[dtype]
    rng = np.random.default_rng(3)
    big = draw_ints(rng, (16, 32), dtype)
    assert set(np.unique(big).tolist()) == set(range(lo, hi + 1))
    small = draw_ints(rng, (5,), dtype)
    assert {lo, hi, 0} <= set(small.tolist()) and np.all(small == np.round(small))
    # the verifier's float checks: integer values of the range in every draw, never scaled
    g = w8_linear(4, 32, 16, wdtype=dtype)
    draws = Draws(g, np.random.default_rng(0), None)
    for kind, s in (("signed", 1.0), ("folded", 0.5), ("constant", 3.0)):
        w = np.asarray(draws.inputs(kind, s)["Wq"])
        assert w.min() == lo and w.max() == hi and np.all(w == np.round(w))
        assert len(np.unique(w)) == hi - lo + 1


def test_torch_reference_of_an_int8_graph_equals_eager():
    g = w8_linear(8, 32, 16, "float32", zero_point=True)
    inputs = _inputs(g)
    args = {n: torch.tensor(v).to(getattr(torch, g.inputs[n].dtype)) for n, v in inputs.items()}
    got = torch_reference(g)(**args)["y"]
    assert torch.allclose(got, _eager(g, inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act,zero_point,scale_2d", [
    ("float16", False, False), ("float16", True, True), ("float32", False, True),
    ("float32", True, False)])
def test_w8_linear_is_one_kernel_that_loads_int8(act, zero_point, scale_2d):
    k, n = 64, 48
    g = w8_linear(16, k, n, act, zero_point, scale_2d=scale_2d)
    res = em.optimize(g)
    assert res.verified and res.verified.equivalent, res.verified
    kernels = res.program.kernels
    assert len(kernels) == 1 and kernels[0].kind == "custom", str(res.program)
    src = res.triton_source()
    # the int8 tile is loaded from Wq's pointer and converted in registers
    load = re.search(r"^\s*(\w+) = tl\.load\(Wq_ptrs", src, re.M)
    assert load, src
    assert re.search(rf"\b{load.group(1)}\.to\(tl\.float32\)", src), src
    assert '"Wq": ((64, 48), torch.int8)' in src
    # no dequantized W is allocated: the one buffer made is the output
    made = re.findall(r"(?:new_empty|torch\.empty)\(\(([\d, ]+)\)", src)
    assert made == ["16, 48"], made
    inputs = _inputs(g, seed=1)
    want = _eager(g, inputs).double()
    assert_close_to_eager(_run(res, g, inputs), want, act)
    # the cost model reads W at one byte an element: the fused kernel's price is below the
    # one-kernel-per-op plan's, which writes and reads the dequantized W in ``act``
    assert res.cost_us < res.baseline_cost_us


def test_verify_refuses_the_int8_mutants():
    """A wrong scale axis (per input channel), a missing zero point and int8 values read
    as uint8 (wrapped) are each refused."""
    k = n = 32

    def build(kind: str) -> em.Graph:
        g = em.Graph(f"w8_{kind}")
        x = g.input("x", (8, k), dtype="float16")
        wq = g.input("Wq", (k, n), dtype="int8")
        s = g.input("s", (n,), dtype="float16")
        z = g.input("z", (n,), dtype="float16")
        w = (wq.astype("uint8") if kind == "wrapped" else wq).astype("float16")
        if kind != "no zero point":
            w = w - z
        scale = s.reshape((k, 1)) if kind == "scale axis" else s
        g.output(x @ (w * scale), "y")
        return g

    ref = build("reference")
    assert em.verify(ref, build("reference")).equivalent
    for kind in ("scale axis", "no zero point", "wrapped"):
        r = em.verify(ref, build(kind))
        assert not r.equivalent, (kind, str(r))


def test_the_float_checks_alone_see_a_wrap():
    """Without the field's random function, the native float check still refuses the
    wrapped weights: the draws hold negative int8 values, which uint8 reads as v + 256."""
    g1, g2 = em.Graph("a"), em.Graph("b")
    for g, wrap in ((g1, False), (g2, True)):
        w = g.input("w", (64,), dtype="int8")
        g.output((w.astype("uint8") if wrap else w).astype("float32"), "y")
    draws = Draws(g1, np.random.default_rng(0), None)
    x = draws.inputs("signed", 1.0)
    a, b = em.evaluate(g1, x, dtype="native")["y"], em.evaluate(g2, x, dtype="native")["y"]
    assert np.any(a < 0) and np.all(b >= 0) and np.array_equal(np.mod(a, 256), b)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.sampled_from([1, 4, 16]), k=st.sampled_from([16, 32, 48]),
       n=st.sampled_from([16, 24, 64]), zero_point=st.booleans(),
       wdtype=st.sampled_from(["int8", "uint8"]), seed=st.integers(0, 100))
def test_optimized_w8_linear_equals_the_reference(m, k, n, zero_point, wdtype, seed):
    g = w8_linear(m, k, n, "float32", zero_point, wdtype)
    res = em.optimize(g, time_limit_s=120)
    inputs = _inputs(g, seed)
    want = _eager(g, inputs).double()
    got = _run(res, g, inputs).double()
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    np.testing.assert_allclose(em.evaluate(res.program, inputs)["y"],
                               em.evaluate(g, inputs)["y"], rtol=1e-9, atol=1e-9)


def test_the_cost_model_reads_int8_weights_at_one_byte():
    """A decode-size linear (memory bound): the fused int8 kernel is priced below the same
    kernel reading float16 weights, the W tile's bytes counted from ITEMSIZE."""
    from eqsat_mirage.cost.gpucost import tensor_bytes
    from eqsat_mirage.fusion.planner import plan

    assert tensor_bytes((4096, 4096), "int8") * 2 == tensor_bytes((4096, 4096), "float16")
    costs = {}
    for wdtype in ("int8", "float16"):
        g = em.Graph("decode")
        x = g.input("x", (1, 4096), dtype="float16")
        w = g.input("Wq", (4096, 4096), dtype=wdtype)
        s = g.input("s", (4096,), dtype="float16")
        g.output(x @ (w.astype("float16") * s), "y")
        found = plan(g, "h200")
        assert len(found.mugraph.kernels) == 1, str(found.mugraph)
        costs[wdtype] = found.cost_us
    assert costs["int8"] < costs["float16"], costs
