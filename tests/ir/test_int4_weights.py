"""Packed int4 weights (issue 53, second slice): two 4-bit values to a uint8, unpacked by
``w_p & 0xF`` and ``w_p >> 4`` (ops BITAND and SHR), interleaved back along K (GPTQ's
layout: ``W_p`` (K//2, N), row 2i in the low nibble of byte i, row 2i+1 in the high one),
dequantized with group-wise scales ``(q.reshape(K//G, G, N).astype(f) - 8) * s[:, None, :]``
and read by a matmul. Every backend (float, native, field, torch, Triton), the verifier's
mutants and the optimized program's generated code against torch's eager dequantization."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat_mirage as em
from eqsat_mirage.ir.errors import DTypeError, GraphError
from eqsat_mirage.semantics.field import FieldCtx, evaluate_field
from eqsat_mirage.semantics.primes import field_primes
from eqsat_mirage.semantics.torch_reference import torch_reference
from eqsat_mirage.verifier.draws import Draws

torch = pytest.importorskip("torch")

from torch_models import assert_close_to_eager, run_compiled  # noqa: E402


def w4_linear(m: int, k: int, n: int, group: int, act: str = "float16",
              kind: str = "reference") -> em.Graph:
    """``y = x @ W``, W (K, N) unpacked from ``Wp`` (K//2, N) uint8 and dequantized with a
    scale per group of ``group`` rows: ``kind`` 'reference', or a mutant: 'hi first'
    (the nibbles swapped), 'group axis' (rows k and k + K//G share a scale instead of
    k // G), 'no zero point' (the -8 left out)."""
    g = em.Graph(f"w4_{kind.replace(' ', '_')}")
    x = g.input("x", (m, k), dtype=act)
    wp = g.input("Wp", (k // 2, n), dtype="uint8")
    s = g.input("s", (k // group, n), dtype=act)
    lo, hi = wp & 0xF, wp >> 4
    first, second = (hi, lo) if kind == "hi first" else (lo, hi)
    q = em.concat([first.reshape((k // 2, 1, n)), second.reshape((k // 2, 1, n))], axis=1)
    q = q.reshape((k, n))
    if kind == "group axis":
        w = q.reshape((group, k // group, n)).astype(act) - 8.0
        w = (w * s.reshape((1, k // group, n))).reshape((k, n))
    else:
        w = q.reshape((k // group, group, n)).astype(act)
        w = w if kind == "no zero point" else w - 8.0
        w = (w * s.reshape((k // group, 1, n))).reshape((k, n))
    g.output(x @ w, "y")
    return g


def w4_regrouped(m: int, k: int, n: int, group: int, act: str = "float16") -> em.Graph:
    """``w4_linear`` written so that the search fuses the unpacking into the matmul: x's
    columns de-interleaved (even and odd k), the groups a batch axis summed,
    ``y = sum_g (x_even[g] @ (lo[g] - 8) + x_odd[g] @ (hi[g] - 8)) * s[g]``."""
    g = em.Graph("w4_regrouped")
    x = g.input("x", (m, k), dtype=act)
    wp = g.input("Wp", (k // 2, n), dtype="uint8")
    s = g.input("s", (k // group, n), dtype=act)
    pairs = x.reshape((m, k // group, group // 2, 2))
    x_even, x_odd = (pairs[:, :, :, j:j + 1].reshape((m, k // group, group // 2))
                     .transpose((1, 0, 2)) for j in (0, 1))
    w3 = wp.reshape((k // group, group // 2, n))
    lo, hi = ((w3 & 0xF).astype(act) - 8.0), ((w3 >> 4).astype(act) - 8.0)
    y = (x_even @ lo + x_odd @ hi) * s.reshape((k // group, 1, n))
    g.output(y.sum(axis=0), "y")
    return g


def _inputs(g: em.Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    k2, n = g.inputs["Wp"].shape
    return {"x": rng.standard_normal(g.inputs["x"].shape),
            "Wp": rng.permutation(np.resize(np.arange(256), k2 * n)).reshape(k2, n),
            "s": rng.random(g.inputs["s"].shape) * 0.02 + 0.001}


def _unpacked(wp: np.ndarray) -> np.ndarray:
    """GPTQ's order: byte i of a column holds row 2i (low nibble) and row 2i+1 (high)."""
    return np.stack([wp & 0xF, wp >> 4], axis=1).reshape(2 * wp.shape[0], wp.shape[1])


def _eager(g: em.Graph, inputs: dict[str, np.ndarray]) -> torch.Tensor:
    """torch's dequantized eager reference, in the activation dtype."""
    act = getattr(torch, g.inputs["x"].dtype)
    wp = torch.tensor(inputs["Wp"], dtype=torch.uint8)
    k, n = 2 * wp.shape[0], wp.shape[1]
    s = torch.tensor(inputs["s"]).to(act)
    group = k // s.shape[0]
    q = torch.stack([wp & 0xF, wp >> 4], dim=1).reshape(k, n)
    w = ((q.reshape(k // group, group, n).to(act) - 8) * s[:, None, :]).reshape(k, n)
    return torch.tensor(inputs["x"]).to(act) @ w


def _unpacks_the_loaded_bytes(src: str) -> bool:
    """Whether the generated source loads ``Wp``'s uint8 tile and applies ``& 15`` and
    ``>> 4`` to it (or to a ``tl.reshape`` of it) in registers."""
    load = re.search(r"^\s*(\w+) = tl\.load\(Wp_ptrs", src, re.M)
    if not load:
        return False
    names = {load.group(1)} | set(re.findall(rf"^\s*(\w+) = tl\.reshape\({load.group(1)}\b",
                                             src, re.M))
    return all(any(re.search(rf"\b{v}\.to\(tl\.int32\) {op}\b", src) for v in names)
               for op in ("& 15", ">> 4"))


def _ops(kernel) -> list:
    """The nodes of a custom kernel's loop and post stages."""
    return [*kernel.loop.nodes(), *kernel.post.nodes()]


def _run(res, g: em.Graph, inputs: dict[str, np.ndarray]) -> torch.Tensor:
    """The optimized program's output ``y`` (``torch_models.run_compiled``)."""
    return run_compiled(res, g, inputs)["y"]


def test_bit_ops_in_the_ir_and_the_float_backends():
    g = em.Graph("bits")
    b = g.input("b", (6,), dtype="uint8")
    c = g.input("c", (6,), dtype="int8")
    g.output((b & 0xF).astype("float32"), "lo")
    g.output((b >> 4).astype("float32"), "hi")
    g.output(em.bitwise_and(c, 0xF).astype("float32"), "clo")
    g.output(em.right_shift(c, 4).astype("float32"), "chi")
    assert "bitand 0xf b" in str(g) and "shr 4 b" in str(g)
    bv, cv = np.array([0, 15, 16, 0xA5, 240, 255]), np.array([-128, -1, 0, 7, 16, 127])
    for dtype in (None, "native"):
        out = em.evaluate(g, {"b": bv, "c": cv}, dtype=dtype)
        assert out["lo"].tolist() == (bv & 15).tolist() == [0, 15, 0, 5, 0, 15]
        assert out["hi"].tolist() == (bv >> 4).tolist() == [0, 0, 1, 10, 15, 15]
        # int8: the low nibble of the two's complement byte, an arithmetic shift (as torch)
        tc = torch.tensor(cv, dtype=torch.int8)
        assert out["clo"].tolist() == (tc & 0xF).tolist()
        assert out["chi"].tolist() == (tc >> 4).tolist() == [-8, -1, 0, 0, 1, 7]


@pytest.mark.parametrize("bad,error,match", [
    (lambda b, x: x & 0xF, DTypeError, "bit ops need an int8 or uint8 operand, got float16"),
    (lambda b, x: b & 256, DTypeError, r"mask must be an integer in \[0, 255\]"),
    (lambda b, x: b >> 8, DTypeError, r"shift must be an integer in \[0, 7\]"),
    (lambda b, x: b & 1.5, GraphError, "integer constant"),
    (lambda b, x: b & b, GraphError, "integer constant"),
    (lambda b, x: b + 1, DTypeError, "uint8 tensor .*can only be cast"),
    (lambda b, x: b.sum(axis=0), DTypeError, "uint8 tensor .*can only be cast"),
    (lambda b, x: em.concat([b, x], axis=0), DTypeError, "concat of a uint8 tensor"),
])
def test_bad_bit_ops_are_refused(bad, error, match):
    g = em.Graph("bad")
    b = g.input("b", (4, 4), dtype="uint8")
    x = g.input("x", (4, 4), dtype="float16")
    with pytest.raises(error, match=match):
        bad(b, x)


def test_integer_tensors_move_and_stay_integers():
    g = em.Graph("moves")
    b = g.input("b", (4, 6), dtype="uint8")
    moved = em.concat([b.T, (b >> 4).T], axis=1).reshape((6, 2, 4))[:, 1:2, :].reshape((6, 4))
    assert moved.dtype == "uint8" and moved.shape == (6, 4)
    g.output(moved.astype("float32"), "y")
    bv = np.arange(24).reshape(4, 6) * 10
    np.testing.assert_array_equal(em.evaluate(g, {"b": bv})["y"], (bv >> 4).T)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_the_nibbles_are_jointly_consistent_in_the_field(dtype):
    """``lo + 16 * hi == x`` holds in the field's model (lo a keyed random function of x,
    hi its complement), so the verifier proves it; a 3-bit split of the same byte is
    refused there (incomplete: other masks and shifts are unrelated random functions)."""
    def graph(kind: str) -> em.Graph:
        g = em.Graph(kind)
        b = g.input("b", (16, 8), dtype=dtype)
        if kind == "nibbles":
            y = (b & 15).astype("float32") + (b >> 4).astype("float32") * 16.0
        elif kind == "bits3":
            y = (b & 7).astype("float32") + (b >> 3).astype("float32") * 8.0
        else:
            y = b.astype("float32")
        g.output(y, "y")
        return g

    assert em.verify(graph("nibbles"), graph("byte")).equivalent
    assert not em.verify(graph("bits3"), graph("byte")).equivalent
    p, q = field_primes()
    ctx = FieldCtx(p, q, np.random.default_rng(1))
    g = em.Graph("parts")
    b = g.input("b", (32,), dtype=dtype)
    g.output((b & 15).astype("float32"), "lo")
    g.output((b >> 4).astype("float32"), "hi")
    ctx.inputs = ctx.random_inputs(g)
    out = evaluate_field(g, ctx)
    lo, hi = (np.asarray(out[n][0]).astype(object) for n in ("lo", "hi"))
    assert np.all((lo + 16 * hi - np.asarray(ctx.inputs["b"][0]).astype(object)) % p == 0)
    assert len(set(lo.tolist())) > 16  # drawn values of the field, not nibbles


def test_the_native_draws_of_a_packed_input_hold_every_byte():
    g = w4_linear(4, 64, 16, 32)
    draws = Draws(g, np.random.default_rng(0), None)
    for kind, s in (("signed", 1.0), ("folded", 0.5), ("constant", 3.0)):
        w = np.asarray(draws.inputs(kind, s)["Wp"])
        assert set(np.unique(w).tolist()) == set(range(256))  # both nibbles' 0 and 15


def test_evaluate_and_torch_reference_equal_eager():
    g = w4_linear(8, 64, 16, 32, "float32")
    inputs = _inputs(g)
    want = _eager(g, inputs).double()
    deq = (_unpacked(inputs["Wp"]).reshape(2, 32, 16) - 8.0) * inputs["s"][:, None, :]
    np.testing.assert_allclose(em.evaluate(g, inputs)["y"],
                               inputs["x"] @ deq.reshape(64, 16), rtol=1e-12)
    args = {n: torch.tensor(v).to(getattr(torch, g.inputs[n].dtype)) for n, v in inputs.items()}
    got = torch_reference(g)(**args)["y"].double()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    native = em.evaluate(g, inputs, dtype="native")["y"]
    np.testing.assert_allclose(native, want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act,group", [("float16", 32), ("float16", 128), ("float32", 32),
                                       ("float32", 128)])
def test_optimized_w4_linear_loads_uint8_and_equals_eager(act, group):
    k, n = 256, 64
    g = w4_linear(16, k, n, group, act)
    res = em.optimize(g)
    assert res.verified and res.verified.equivalent, res.verified
    src = res.triton_source()
    assert '"Wp": ((128, 64), torch.uint8)' in src
    assert _unpacks_the_loaded_bytes(src), src  # the packed bytes, unpacked in registers
    inputs = _inputs(g, seed=1)
    want = _eager(g, inputs).double()
    assert_close_to_eager(_run(res, g, inputs), want, act)
    assert res.cost_us < res.baseline_cost_us


def test_verify_refuses_the_int4_mutants():
    ref = w4_linear(8, 64, 16, 32)
    assert em.verify(ref, w4_linear(8, 64, 16, 32)).equivalent
    for kind in ("hi first", "group axis", "no zero point"):
        r = em.verify(ref, w4_linear(8, 64, 16, 32, kind=kind))
        assert not r.equivalent, (kind, str(r))


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.sampled_from([1, 4]), k=st.sampled_from([32, 64, 128]),
       n=st.sampled_from([16, 32]), group=st.sampled_from([16, 32]),
       act=st.sampled_from(["float16", "float32"]), seed=st.integers(0, 100))
def test_optimized_w4_linear_equals_eager_over_shapes(m, k, n, group, act, seed):
    g = w4_linear(m, k, n, group, act)
    res = em.optimize(g, time_limit_s=120)
    inputs = _inputs(g, seed)
    want = _eager(g, inputs).double()
    got = _run(res, g, inputs).double()
    tol = 2e-2 if act == "float16" else 1e-4
    assert torch.allclose(got, want, rtol=tol, atol=tol * float(want.abs().max()))
    np.testing.assert_allclose(em.evaluate(res.program, inputs)["y"],
                               em.evaluate(g, inputs)["y"], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("act,group", [("float16", 32), ("float32", 128)])
def test_the_regrouped_w4_linear_unpacks_inside_the_matmul_kernel(act, group):
    """Written regrouped (x de-interleaved, groups a batch axis), the search gives one
    kernel that loads the uint8 W tile, extracts both nibbles, subtracts 8, multiplies by
    x, scales by the group's scale row and sums the groups in its loop: no float W."""
    k, n = 256, 64
    g = w4_regrouped(16, k, n, group, act)
    # seed 0 (optimize's default). The native check once refused this pair in one of five
    # runs with fresh randomness (fp16, G 32); since the peak and pair-form draws, seeds
    # 0 to 59 all verify it (session 31, not run here: 3 minutes)
    assert em.verify(w4_linear(16, k, n, group, act), g, seed=0).equivalent
    res = em.optimize(g)
    assert res.verified and res.verified.equivalent, res.verified
    custom = [kn for kn in res.program.kernels if kn.kind == "custom"
              and {"matmul", "bitand", "shr"} <= {x.op.name.lower() for x in _ops(kn)}]
    assert len(custom) == 1, str(res.program)
    src = res.triton_source()
    assert _unpacks_the_loaded_bytes(src), src
    made = re.findall(r"(?:new_empty|torch\.empty)\(\(([\d, ]+)\)", src)
    assert not {f"{k}, {n}", f"{k // group}, {group // 2}, {n}"} & set(made), made
    inputs = _inputs(g, seed=2)
    want = _eager(w4_linear(16, k, n, group, act), inputs).double()
    assert_close_to_eager(_run(res, g, inputs), want, act)


def test_the_cost_model_reads_packed_int4_at_half_a_byte():
    """At a decode size the fused kernel's device-memory bytes are the packed weights (half
    a byte a weight), the scales and x: about half the int8 kernel's."""
    from eqsat_mirage.cost.gpucost import kernel_cost
    from eqsat_mirage.fusion.planner import plan

    k = n = 4096
    found = plan(w4_regrouped(1, k, n, 128), "h200")
    (fused,) = [kn for kn in found.mugraph.kernels if kn.kind == "custom"
                and any(x.op.name == "BITAND" for x in _ops(kn))]
    read = kernel_cost(fused, found.mugraph, "h200").dram_bytes
    packed, scales = k * n // 2, (k // 128) * n * 2
    assert packed + scales <= read <= 1.1 * (packed + scales), read
