"""float8 weights as values (issue 53, fp8 weight-only): a float8_e4m3fn or float8_e5m2
input read only through a cast to a float dtype (or moved), in every backend (float,
native, field, torch, Triton), the verifier's draws of fp8 values, and the fp8 linear
``x @ (w_q.astype(float32) * s).astype(f).T`` optimized into one kernel that loads the fp8
tile and converts it in registers (Triton's interpreter runs it; its kernel also compiles
for sm_90a without a GPU)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.ir.errors import DTypeError, GraphError, InputError
from eqsat_mirage.ir.node import FP8_DTYPES, FP8_MAX, ITEMSIZE
from eqsat_mirage.semantics.field import FieldCtx, evaluate_field
from eqsat_mirage.semantics.fp8 import draw_fp8, finite_codes, fp8_values, is_fp8, round_fp8
from eqsat_mirage.semantics.primes import field_primes
from eqsat_mirage.semantics.torch_reference import torch_reference
from eqsat_mirage.verifier.draws import Draws

torch = pytest.importorskip("torch")

from torch_models import assert_close_to_eager, run_compiled  # noqa: E402

FLOATS = ("float16", "bfloat16", "float32")


def _codes(dtype: str) -> torch.Tensor:
    """Every byte 0..255 as a torch tensor of ``dtype``."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(getattr(torch, dtype))


def _casts(dtype: str, n: int) -> em.Graph:
    g = em.Graph("casts")
    w = g.input("w", (n,), dtype=dtype)
    for f in FLOATS:
        g.output(w.astype(f), f)
    return g


@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_every_code_casts_as_torch_casts_it(dtype):
    """The table of the 256 codes is torch's decoding (NaN codes included); on every finite
    code, the float and native backends, the torch reference and the Triton kernel cast to
    float16, bfloat16 and float32 exactly as torch does."""
    want = _codes(dtype).double().numpy()
    got = fp8_values(dtype)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)])
    codes = finite_codes(dtype)
    assert len(codes) == (254 if dtype == "float8_e4m3fn" else 248)
    w = _codes(dtype)[torch.tensor(codes)]
    g = _casts(dtype, len(codes))
    assert f"w: f8{dtype.split('_')[1]}[{len(codes)}]" in str(g) and ITEMSIZE[dtype] == 1
    want = {f: w.to(getattr(torch, f)) for f in FLOATS}
    for mode in (None, "native"):
        out = em.evaluate(g, {"w": w}, dtype=mode)
        for f in FLOATS:
            assert np.array_equal(out[f], want[f].double().numpy()), (mode, f)
            assert np.array_equal(np.signbit(out[f]), np.signbit(want[f].double().numpy()))
    ref = torch_reference(g)(w=w)
    res = em.optimize(g)
    assert [k.kind for k in res.program.kernels] == ["custom"], str(res.program)
    got = res.compile()(w=w)
    for f in FLOATS:
        assert ref[f].dtype == want[f].dtype and torch.equal(ref[f], want[f]), f
        assert got[f].dtype == want[f].dtype and torch.equal(got[f], want[f]), f
    # the field: a cast from fp8 is the identity on the drawn residues
    ctx = FieldCtx(*field_primes(), np.random.default_rng(0))
    ctx.inputs = ctx.random_inputs(g)
    out = evaluate_field(g, ctx)
    for f in FLOATS:
        assert np.array_equal(np.asarray(out[f][0]), np.asarray(ctx.inputs["w"][0]))


@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_rounding_to_fp8_is_torchs(dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(4000) * np.exp2(rng.uniform(-20, 17, 4000))
    vals = fp8_values(dtype)[finite_codes(dtype)]
    mids = (np.sort(vals)[1:] + np.sort(vals)[:-1]) / 2  # every tie
    x = np.concatenate([x, vals, mids, [np.inf, -np.inf, 61440.0, 61439.0, 464.0, 500.0]])
    want = torch.tensor(x).to(getattr(torch, dtype)).double().numpy()
    np.testing.assert_array_equal(round_fp8(x, dtype), want)
    x32 = x.astype(np.float32)  # rounded in float32 (the verifier's draws)
    got = round_fp8(x32, dtype)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, torch.tensor(x32).to(getattr(torch, dtype)).float())
    # is_fp8 (em.evaluate's check, and round_fp8's pass-through) from the float32 bits
    exact = np.isfinite(x32) & (got == x32) & (np.abs(x32) <= FP8_MAX[dtype])
    assert np.array_equal(is_fp8(x32, dtype), exact) and exact.sum() >= len(vals)
    assert np.array_equal(is_fp8(x, dtype), np.isfinite(x) & (round_fp8(x, dtype) == x))
    assert round_fp8(vals, dtype) is vals  # values of the dtype: returned as they are
    assert np.array_equal(np.signbit(round_fp8(np.array([-0.0, -1e-9]), dtype)), [True, True])


def test_fp8_values_can_only_be_cast_or_moved():
    g = em.Graph("bad")
    w = g.input("w", (4, 4), dtype="float8_e4m3fn")
    v = g.input("v", (4, 4), dtype="float8_e5m2")
    x = g.input("x", (4, 4), dtype="float16")
    for bad in (lambda: w + 1, lambda: w * x, lambda: w.sum(axis=0), lambda: em.exp(w),
                lambda: x @ w, lambda: w > 0.0):
        with pytest.raises(DTypeError, match="float8_e4m3fn"):
            bad()
    for bad, what in ((lambda: x.astype("float8_e4m3fn"), "cast to 'float8_e4m3fn'"),
                      (lambda: w.astype("int8"), "expected one of float16"),
                      (lambda: w.astype("float8_e5m2"), "expected one of float16"),
                      (lambda: em.concat([w, v], axis=0), "concat")):
        with pytest.raises(DTypeError, match=re.escape(what)):
            bad()
    moved = em.concat([w.T, w[1:3]], axis=0).reshape((24,))  # movement keeps the dtype
    assert moved.dtype == "float8_e4m3fn"
    g.output(moved.astype("float32"), "y")
    with pytest.raises(InputError, match=r"'w' \(float8_e4m3fn\): expected finite"):
        em.evaluate(g, {"w": np.full((4, 4), 449.0), "v": np.zeros((4, 4)), "x": np.zeros((4, 4))})
    with pytest.raises(InputError, match="0.3"):
        em.evaluate(g, {"w": np.full((4, 4), 0.3), "v": np.zeros((4, 4)), "x": np.zeros((4, 4))})


@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_fp8_draws_hold_every_finite_code_and_the_extremes(dtype):
    top = FP8_MAX[dtype]
    rng = np.random.default_rng(3)
    big = draw_fp8(rng, (16, 32), dtype)
    assert big.dtype == np.float32 and np.all(np.isfinite(big))
    bits = np.unique(big.view(np.uint32))
    assert len(bits) == len(finite_codes(dtype))  # every finite code once, -0 included
    small = draw_fp8(rng, (5,), dtype)
    assert {top, -top, 0.0} <= set(small.tolist())
    # the verifier's float checks: fp8 values in every draw, never scaled or rounded
    g = em.Graph("w")
    w = g.input("W", (24, 16), dtype=dtype)
    g.output(w.astype("float32") * g.input("s", (24, 1), dtype="float32"), "y")
    draws = Draws(g, np.random.default_rng(0), None)
    first = None
    for kind, s in (("signed", 1.0), ("folded", 0.5), ("constant", 3.0)):
        got = np.asarray(draws.inputs(kind, s)["W"])
        assert got.max() == top and got.min() == -top
        assert len(np.unique(got.astype(np.float32).view(np.uint32))) == len(finite_codes(dtype))
        first = got if first is None else first
        assert np.array_equal(got, first)


def fp8_linear(dtype: str, act: str, kind: str = "reference", n: int = 48, k: int = 64,
               m: int = 16) -> em.Graph:
    """``y = x @ W.T``, ``W = (w_q.astype(float32) * s).astype(act)``: w_q (N, K) fp8, s
    (N, 1) float32 (torchao's Float8Tensor and its ``_dequantize_affine_float8``); a mutant
    with the scale per input channel (``kind="scale axis"``, needs n == k)."""
    g = em.Graph(f"f8_{kind}".replace(" ", "_"))
    x = g.input("x", (m, k), dtype=act)
    wq = g.input("Wq", (n, k), dtype=dtype)
    s = g.input("s", (n, 1), dtype="float32")
    scale = s.reshape((1, n)) if kind == "scale axis" else s
    g.output(x @ (wq.astype("float32") * scale).astype(act).T, "y")
    return g


@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_verify_accepts_the_fp8_linear_and_refuses_its_mutants(dtype):
    ref = fp8_linear(dtype, "float16", n=32, k=32)
    assert em.verify(ref, fp8_linear(dtype, "float16", n=32, k=32)).equivalent
    r = em.verify(ref, fp8_linear(dtype, "float16", "scale axis", n=32, k=32))
    assert not r.equivalent, str(r)
    other = FP8_DTYPES[1 - FP8_DTYPES.index(dtype)]  # e5m2 bits read as e4m3fn (or back)
    with pytest.raises(GraphError, match=f"{dtype} vs {other}"):
        em.verify(ref, fp8_linear(other, "float16", n=32, k=32))


@pytest.mark.parametrize("dtype,act", [("float8_e4m3fn", "float16"),
                                       ("float8_e5m2", "float32")])
def test_the_fp8_linear_is_one_kernel_that_loads_fp8(dtype, act):
    g = fp8_linear(dtype, act)
    res = em.optimize(g)
    assert res.verified and res.verified.equivalent, res.verified
    assert [kn.kind for kn in res.program.kernels] == ["custom"], str(res.program)
    src = res.triton_source()
    load = re.search(r"^\s*(\w+) = tl\.load\(Wq_ptrs", src, re.M)
    assert load and re.search(rf"\b{load.group(1)}\.to\(tl\.float32\)", src), src
    assert f'"Wq": ((48, 64), torch.{dtype})' in src
    made = re.findall(r"(?:new_empty|torch\.empty)\(\(([\d, ]+)\)", src)
    assert made == ["16, 48"], made  # no dequantized W
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((16, 64)), "Wq": draw_fp8(rng, (48, 64), dtype),
              "s": rng.random((48, 1)) * 0.01 + 1e-3}
    tw = torch.tensor(inputs["Wq"]).to(getattr(torch, dtype))
    x = torch.tensor(inputs["x"]).to(getattr(torch, act))
    want = x @ (tw.float() * torch.tensor(inputs["s"]).float()).to(x.dtype).T
    assert_close_to_eager(run_compiled(res, g, inputs)["y"], want, x.dtype)
    other = getattr(torch, FP8_DTYPES[1 - FP8_DTYPES.index(dtype)])  # the other fp8's bits
    with pytest.raises(ValueError, match=f"input 'Wq': expected dtype torch.{dtype}"):
        res.compile()(x=x, Wq=tw.view(other), s=torch.tensor(inputs["s"]).float())
    assert res.cost_us < res.baseline_cost_us
    # the kernel compiles for sm_90a (no GPU needed): tl.float8e4nv / tl.float8e5 pointers
    from eqsat_mirage.codegen.compiled import compile_report

    (built,) = compile_report(src, "h100")
    assert 0 < built.registers <= 255 and built.spill_bytes == 0, built


def test_the_cost_model_reads_fp8_weights_at_one_byte():
    """A decode-size linear (memory bound): the fused fp8 kernel is priced below the same
    kernel reading float16 weights, the W tile's bytes counted from ITEMSIZE."""
    from eqsat_mirage.fusion.planner import plan

    costs = {}
    for wdtype in ("float8_e4m3fn", "float16"):
        g = em.Graph("decode")
        x = g.input("x", (1, 4096), dtype="float16")
        w = g.input("Wq", (4096, 4096), dtype=wdtype)
        s = g.input("s", (4096, 1), dtype="float32")
        g.output(x @ (w.astype("float32") * s).astype("float16").T, "y")
        found = plan(g, "h200")
        assert len(found.mugraph.kernels) == 1, str(found.mugraph)
        costs[wdtype] = found.cost_us
    assert costs["float8_e4m3fn"] < costs["float16"], costs
