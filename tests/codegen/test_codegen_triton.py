"""Triton lowering: generated modules run (in Triton's interpreter on CPU) and match em.evaluate.

Run as ``TRITON_INTERPRET=1 pytest tests/test_codegen_triton.py``; the module sets the
variable itself before triton is imported. Shapes are small: the interpreter runs every
block and every loop iteration in NumPy. Snapshots of the emitted source live in
tests/snapshots/*.py.txt; regenerate them with ``UPDATE_SNAPSHOTS=1``.
"""

# ruff: noqa: E402 (TRITON_INTERPRET is set before anything can import triton)
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (here or by a generated module)

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from mugraph_examples import flash_attention, rmsnorm_linear, tiled_matmul

import eqsat_mirage as em
from eqsat_mirage.codegen.concat import CodegenError
from eqsat_mirage.codegen.source import TRITON_API, TRITON_DENYLIST, compile_mugraph, triton_source
from eqsat_mirage.fusion.lower import lower
from eqsat_mirage.fusion.schedule import Schedule, index_fragment
from eqsat_mirage.fusion.strategy import Strategy, candidate_schedules
from eqsat_mirage.ir.ops import COMPARE
from eqsat_mirage.testing import programs

SNAPSHOTS = Path(__file__).parent / "snapshots"
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
TOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 6e-2}


def check_triton_api(src):
    """Generated code may only call the tl functions in TRITON_API (all in Triton 3.6); every
    source compiled or generated here is checked by the test that made it."""
    compile(src, "<generated>", "exec")
    used = set(re.findall(r"\btl\.(\w+)", src))
    assert used <= TRITON_API, used - TRITON_API
    for bad in TRITON_DENYLIST:
        assert bad not in src, bad
    assert set(re.findall(r"\btriton\.(\w+)", src)) <= {"jit", "language"}


def torch_inputs(program, seed=0, scale=0.5):
    rng = np.random.default_rng(seed)
    return {n: torch.tensor(rng.standard_normal(v.shape) * scale, dtype=TORCH[v.dtype])
            for n, v in program.inputs.items()}


def check_compiled(mg, reference=None, seed=0, scale=0.5):
    """Compile ``mg``, run it on random inputs, compare with em.evaluate of the reference."""
    reference = reference if reference is not None else mg.reference()
    fn = compile_mugraph(mg)
    check_triton_api(fn.source)
    inputs = torch_inputs(mg, seed, scale)
    got = fn(**inputs)
    want = em.evaluate(reference, {n: t.double().numpy() for n, t in inputs.items()})
    assert set(got) == set(want) == set(mg.output_tensors)
    for name, spec in mg.outputs.items():
        out = got[name]
        assert out.dtype == TORCH[spec.dtype] and tuple(out.shape) == spec.shape, name
        tol = TOL[spec.dtype]
        scale_ = max(1.0, float(np.abs(want[name]).max()))
        np.testing.assert_allclose(out.double().numpy(), want[name], rtol=tol,
                                   atol=tol * scale_, err_msg=f"output {name}")
    return fn


# -- small programs -------------------------------------------------------------------------


def many_ops(dtype="float32"):
    """Every kernel-level op, each a pre-defined kernel after from_graph."""
    g = em.Graph("many_ops")
    x = g.input("X", (16, 32), dtype)
    w = g.input("W", (32, 24), dtype)
    b = g.input("b", (24,), dtype)
    h = x @ w + b
    g.output(em.relu(h) * 2.0 - 1.0, "Y")
    s = em.sqrt(em.exp(-h).mean(axis=1, keepdims=True))
    g.output(h / s, "Z")
    t = em.concat([em.silu(h).T, em.rsqrt(x * x + 1.0).T], axis=0)  # (56, 16)
    g.output(t.reshape(8, 7, 16).sum(axis=(0, 2)), "T")
    return g


def matmul(m=32, k=64, n=48, dtype="float32"):
    g = em.Graph("matmul")
    a = g.input("A", (m, k), dtype)
    b = g.input("B", (k, n), dtype)
    g.output(a @ b, "C")
    return g


def rmsnorm_linear_frag(dtype="float16"):
    g = em.Graph("rmsnorm_linear")
    x = g.input("X", (8, 64), dtype)
    w = g.input("W", (64, 64), dtype)
    g.output((x @ w) * em.rsqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6), "Y")
    return g


def gated_mlp(dtype="float16"):
    g = em.Graph("gated_mlp")
    x = g.input("X", (8, 32), dtype)
    w1 = g.input("W1", (32, 64), dtype)
    w2 = g.input("W2", (32, 64), dtype)
    g.output(em.silu(x @ w1) * (x @ w2), "Y")
    return g


def attention(dtype="float32"):
    """The post-division form that a single loop pass can tile."""
    g = em.Graph("attention")
    q = g.input("Q", (2, 16, 16), dtype)
    k = g.input("K", (2, 16, 64), dtype)
    v = g.input("V", (2, 64, 16), dtype)
    a = em.exp(q @ k)
    g.output((a @ v) / a.sum(axis=-1, keepdims=True), "O")
    return g


def idx(g, name, dim):
    return index_fragment(g).input_index(name, dim)


# -- pre-defined kernels: torch ops ---------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_from_graph_programs_match(dtype):
    g = many_ops(dtype)
    mg = em.from_graph(g)
    assert all(k.kind == "predefined" for k in mg.kernels)
    fn = check_compiled(mg, g)
    assert "import triton" not in fn.source and "NEEDS_TRITON = False" in fn.source


def test_from_graph_batched_attention():
    g = attention("float16")
    check_compiled(em.from_graph(g), g)


# -- custom kernels built by schedule.lower ---------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_tiled_matmul(dtype):
    """bfloat16 too: Triton 3.8's interpreter multiplies bfloat16 bit patterns as integers in
    tl.dot (interpreter.py create_dot), so the generated module reads a bfloat16 dot's
    operands as BF16_DOT: float32 under the interpreter (said once, with a warning),
    bfloat16 on a GPU."""
    g = matmul(dtype=dtype)
    mg = lower(g, Schedule(grid={"a": 2, "c": 3}, loop="b", forloop=4))
    fn = check_compiled(mg, g)
    assert fn.source.count("tl.dot(") == 1 and "for f in range(4):" in fn.source
    assert ("input_precision" in fn.source) == (dtype == "float32")
    assert ("BF16_DOT = tl.constexpr(" in fn.source) == (dtype == "bfloat16")
    assert fn.source.count(".to(BF16_DOT)") == (2 if dtype == "bfloat16" else 0)


def test_the_bfloat16_upcast_is_said_once(monkeypatch):
    from eqsat_mirage.runtime import load

    g = matmul(dtype="bfloat16")
    mg = lower(g, Schedule(grid={"a": 2, "c": 3}, loop="b", forloop=4))
    monkeypatch.setattr(load, "_SAID", set())  # as in a fresh process
    with pytest.warns(UserWarning, match="bfloat16 tl.dot operands are upcast to float32"):
        compile_mugraph(mg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile_mugraph(mg, header="another module")


def test_padded_tiles_are_masked():
    g = matmul(24, 40, 20)  # tiles 12 x 10 x 10: every dim padded to 16
    mg = lower(g, Schedule(grid={"a": 2, "c": 2}, loop="b", forloop=4))
    fn = check_compiled(mg, g)
    assert "mask_10 = tl.arange(0, BLOCK_10) < 10" in fn.source
    assert "BLOCK_10=16" in fn.source and "BLOCK_12=16" in fn.source


def test_padding_never_leaks():
    """Padded K lanes of exp(.)+1 and of 1/x (inf there) must not reach a dot or a sum."""
    g = em.Graph("dirty")
    x = g.input("X", (16, 24), "float32")
    w = g.input("W", (24, 16), "float32")
    g.output((1.0 / x) @ w, "C")
    g.output((em.exp(x) + 1.0) @ (em.exp(w) + 1.0), "D")
    g.output(em.exp(x).sum(axis=1), "S")
    ix = index_fragment(g)
    mg = lower(g, Schedule(grid={ix.input_index("X", 0): 2}, loop=ix.input_index("X", 1),
                           forloop=2))
    fn = check_compiled(mg, g)
    assert "tl.where(mask_12" in fn.source


def test_non_contiguous_inputs_use_strides():
    g = matmul(dtype="float32")
    fn = compile_mugraph(lower(g, Schedule(grid={"a": 2, "c": 3}, loop="b", forloop=4)))
    a = torch.randn(64, 32).T  # (32, 64), column-major
    b = torch.randn(48, 64).T
    assert not a.is_contiguous()
    np.testing.assert_allclose(fn(a, b)["C"].numpy(), (a @ b).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_rmsnorm_linear_fused(dtype):
    g = rmsnorm_linear_frag(dtype)
    s = Schedule(grid={idx(g, "W", 1): 4}, loop=idx(g, "X", 1), forloop=4)
    mg = lower(g, s)
    assert len(mg.kernels[0].accumulators) == 2
    fn = check_compiled(mg, g)
    assert "tl.rsqrt(" in fn.source and fn.source.count("tl.zeros(") == 2


def test_gated_mlp_fused():
    g = gated_mlp()
    mg = lower(g, Schedule(grid={idx(g, "W1", 1): 4}, loop=idx(g, "X", 1), forloop=2))
    fn = check_compiled(mg, g)
    assert fn.source.count("tl.dot(") == 2 and "tl.exp2(" in fn.source


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_attention_two_accumulators(dtype):
    g = attention(dtype)
    s = Schedule(grid={idx(g, "Q", 0): 2, idx(g, "Q", 1): 2}, loop=idx(g, "K", 2), forloop=4)
    fn = check_compiled(lower(g, s), g)
    assert "tl.sum(" in fn.source and fn.source.count("+= ") >= 2


def test_flash_decoding_split_two_kernels():
    g = attention()
    n = idx(g, "K", 2)
    mg = lower(g, Schedule(grid={idx(g, "Q", 0): 2, n: 4}, split=n))
    assert [k.kind for k in mg.kernels] == ["custom", "custom"]
    fn = check_compiled(mg, g)
    assert fn.source.count("@triton.jit") == 2


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_lora_concat_form_splits_the_dot(dtype):
    g = em.Graph("lora")
    x = g.input("X", (16, 32), dtype)
    w = g.input("W", (32, 64), dtype)
    a = g.input("A", (32, 16), dtype)
    b = g.input("B", (16, 64), dtype)
    g.output(em.concat([x, x @ a], axis=1) @ em.concat([w, b], axis=0), "O")
    mg = lower(g, Schedule(grid={idx(g, "W", 1): 4}))
    fn = check_compiled(mg, g)
    assert fn.source.count("tl.dot(") == 3 and "kept as its 2 parts" in fn.source
    bad = em.Graph("lora_bad")  # K parts 32 + 16 against 16 + 32: not a pairwise split
    x = bad.input("X", (16, 32), dtype)
    w = bad.input("W", (16, 64), dtype)
    a = bad.input("A", (32, 16), dtype)
    b = bad.input("B", (32, 64), dtype)
    bad.output(em.concat([x, x @ a], axis=1) @ em.concat([w, b], axis=0), "O")
    with pytest.raises(CodegenError, match=r"matmul .* reads a concat of tiles \(16, 16\), "
                       r"\(32, 16\) \(axis 0\): its parts differ .* \(\[16, 32\] vs"):
        triton_source(lower(bad, Schedule(grid={idx(bad, "W", 1): 4})))


@pytest.mark.parametrize("make", [matmul, rmsnorm_linear_frag, gated_mlp, attention],
                         ids=lambda f: f.__name__)
def test_candidate_schedules_compile(make):
    g = make()
    strat = Strategy(min_blocks=2, max_blocks=8, loop_ranges=(2, 4), max_candidates=3,
                     allow_split_reduction=True)
    cands = candidate_schedules(g, strat)
    assert cands
    for s in cands:
        check_compiled(lower(g, s), g)


def test_split_with_a_loop_and_a_reduce_grid_compile():
    """FlashDecoding with a loop inside each split (K and V: imap and fmap on the key dim,
    each block's part starting at pid * F * tile) and a finer reduce-kernel grid."""
    g = attention()
    a, b, d = idx(g, "Q", 0), idx(g, "Q", 1), idx(g, "K", 2)
    for s in (Schedule({a: 2, d: 2}, d, 2, d), Schedule({a: 2, d: 2}, d, 2, d, {a: 2, b: 4}),
              Schedule({a: 2, b: 2, d: 4}, None, 1, d, {b: 8})):
        mg = lower(g, s)
        part, reduce = mg.kernels
        assert part.forloop == s.forloop and reduce.grid == tuple(n for _, n in s.second_grid)
        fn = check_compiled(mg, g)
        if s.loop:
            assert f"pid_y * {s.forloop * 16}" in fn.source  # K's 64 keys: 2 parts of 2 x 16


# -- fused plans of the benchmarks at small shapes (fusion.plan picks the kernels) -----------


def rms(x, axis):
    return em.rsqrt((x * x).mean(axis=axis, keepdims=True) + 1e-6)


def small_benchmarks():
    """DESIGN.md's six benchmarks (their optimized forms), fp16, at interpreter sizes."""
    def graph(name, **shapes):
        g = em.Graph(name)
        return g, [g.input(n, s, "float16") for n, s in shapes.items()]

    attn = dict(Q=(2, 32, 8), K=(2, 8, 128), V=(2, 128, 8))  # head dim 8: exp stays in fp16
    g, (q, k, v) = graph("gqa", **attn)
    a = em.exp(q @ k)
    g.output((a @ v) / a.sum(axis=-1, keepdims=True), "O")
    yield g
    g, (q, k, v) = graph("qknorm", **attn)
    a = em.exp((q @ k) * rms(q, -1) * rms(k, 1))
    g.output((a @ v) / a.sum(axis=-1, keepdims=True), "O")
    yield g
    g, (x, w) = graph("rmsnorm", X=(2, 128), W=(128, 192))
    g.output((x @ w) * rms(x, -1), "O")
    yield g
    g, (x, w, a, b) = graph("lora", X=(16, 64), W=(64, 128), A=(64, 16), B=(16, 128))
    g.output(em.concat([x, x @ a], axis=1) @ em.concat([w, b], axis=0), "O")
    yield g
    g, (x, w1, w2) = graph("gatedmlp", X=(8, 128), W1=(128, 128), W2=(128, 128))
    g.output(em.silu(x @ w1) * (x @ w2), "O")
    yield g
    g, (h, x, alpha) = graph("ntrans", H=(8, 128), X=(8, 128), alpha=(8, 128))
    y = h + alpha * (x * rms(x, -1) - h)
    g.output(y * rms(y, -1), "O")
    yield g


@pytest.mark.parametrize("g", list(small_benchmarks()), ids=lambda g: g.name)
def test_fusion_plans_of_small_benchmarks(g):
    fusion = pytest.importorskip("eqsat_mirage.fusion.planner")
    mg = fusion.plan(g).mugraph
    assert any(k.kind == "custom" for k in mg.kernels)
    check_compiled(mg, g)


def textbook_benchmarks():
    """The six benchmarks as a user writes them (softmax before @V, rms_norm before @W)."""
    def graph(name, **shapes):
        g = em.Graph(name)
        return g, [g.input(n, s, "float16") for n, s in shapes.items()]

    attn = dict(Q=(2, 32, 8), K=(2, 8, 128), V=(2, 128, 8))
    g, (q, k, v) = graph("gqa", **attn)
    a = em.exp(q @ k)
    g.output((a / a.sum(axis=-1, keepdims=True)) @ v, "O")
    yield g
    g, (q, k, v) = graph("qknorm", **attn)
    a = em.exp(em.rms_norm(q, axis=-1) @ em.rms_norm(k, axis=1))
    g.output((a / a.sum(axis=-1, keepdims=True)) @ v, "O")
    yield g
    g, (x, w) = graph("rmsnorm", X=(2, 128), W=(128, 192))
    g.output(em.rms_norm(x) @ w, "O")
    yield g
    g, (x, w, a, b) = graph("lora", X=(16, 64), W=(64, 128), A=(64, 16), B=(16, 128))
    g.output(x @ w + (x @ a) @ b, "O")
    yield g
    g, (x, w1, w2) = graph("gatedmlp", X=(8, 128), W1=(128, 128), W2=(128, 128))
    g.output(em.silu(x @ w1) * (x @ w2), "O")
    yield g
    g, (h, x, alpha) = graph("ntrans", H=(8, 128), X=(8, 128), alpha=(8, 128))
    g.output(em.rms_norm(h + alpha * (em.rms_norm(x) - h)), "O")
    yield g


@pytest.mark.parametrize("g", list(textbook_benchmarks()), ids=lambda g: g.name)
def test_optimized_small_benchmarks_compile_and_match(g):
    """em.optimize's chosen MuGraph, compiled, matches em.evaluate of the input program."""
    res = em.optimize(g, time_limit_s=10)
    assert isinstance(res.program, em.MuGraph)
    assert res.verified.equivalent and res.cost_us <= res.baseline_cost_us
    check_compiled(res.program, g)


def test_full_size_benchmark_plans_generate():
    """Every benchmark's fused plan (both forms, batch 1) lowers to Triton source (not run)."""
    fusion = pytest.importorskip("eqsat_mirage.fusion.planner")
    from bench.programs import BENCHMARKS, program, rewritten

    for name in BENCHMARKS:
        for make in (program, rewritten):
            src = triton_source(fusion.plan(make(name, 1)).mugraph)
            check_triton_api(src)
            assert "@triton.jit" in src and "tl.store(" in src, name


# -- hand-built MuGraphs (tests/test_mugraph.py) ---------------------------------------------


@pytest.mark.parametrize("build", [tiled_matmul, rmsnorm_linear, flash_attention])
def test_hand_built_kernels(build):
    g, mg = build()
    check_compiled(mg, g)


def test_streamed_loop_output_and_post_bias():
    g = em.Graph("stream")
    x = g.input("X", (16, 64), "float32")
    bias = g.input("bias", (16,), "float32")
    g.output(em.exp(x) * 2.0 + x, "Y")
    g.output(x.sum(axis=1) + bias, "S")
    mg = em.MuGraph("stream_tiled")
    mg.input("X", (16, 64), "float32")
    mg.input("bias", (16,), "float32")
    k = mg.custom_kernel(grid=(2,), forloop=4, source=g)
    t = k.input("X", imap={0: 0}, fmap=1)
    k.input("bias", imap={0: 0})
    k.output(em.exp(t) * 2.0 + t, "Y", omap={0: 0}, fmap=1)
    k.output(k.accumulate(t.sum(axis=1), "s") + k.tile("bias"), "S", omap={0: 0})
    mg.output("Y")
    mg.output("S")
    fn = check_compiled(mg, g)
    assert "Y_ptrs += 16 * stride_Y_1" in fn.source


def test_one_tensor_read_as_two_tiles_and_transposed():
    mg = em.MuGraph("gram_tiled")
    mg.input("X", (32, 48), "float32")
    k = mg.custom_kernel(grid=(2, 2), forloop=3, name="gram")
    a = k.input("X", imap={0: 0}, fmap=1, name="Xa")
    b = k.input("X", imap={0: 1}, fmap=1, name="Xb")
    k.output(k.accumulate(a @ b.T, "acc"), "G", omap={0: 0, 1: 1})
    mg.output("G")
    fn = compile_mugraph(mg)
    assert "tl.trans(Xb)" in fn.source and fn.source.count("X_ptr +") == 2
    xs = torch.randn(32, 48)
    np.testing.assert_allclose(fn(xs)["G"].numpy(), (xs @ xs.T).numpy(), rtol=1e-4, atol=1e-4)
    assert fn.source == triton_source(mg)


def test_mixed_predefined_and_custom_kernels():
    g = matmul(dtype="float32")
    mg = em.MuGraph("two")
    mg.input("A", (32, 64), "float32")
    mg.input("B", (64, 48), "float32")
    from eqsat_mirage.fusion.lower import add_kernel

    add_kernel(mg, g, Schedule(grid={"a": 2, "c": 3}, loop="b", forloop=2), name="mm")
    mg.predefined("exp", "C", out="D")
    mg.output("D")
    mg.output("C", "C_out")
    fn = compile_mugraph(mg)
    inputs = torch_inputs(mg)
    got = fn(inputs["A"], inputs["B"])
    want = torch.exp(inputs["A"] @ inputs["B"])
    np.testing.assert_allclose(got["D"].numpy(), want.numpy(), rtol=1e-4)
    assert set(got) == {"D", "C_out"}


# -- the launcher's errors -----------------------------------------------------------------


@pytest.fixture(scope="module")
def matmul_fn():
    g = matmul(dtype="float32")
    return compile_mugraph(lower(g, Schedule(grid={"a": 2, "c": 3}, loop="b", forloop=4)))


def test_call_by_position_name_or_dict(matmul_fn):
    a, b = torch.randn(32, 64), torch.randn(64, 48)
    want = (a @ b).numpy()
    for got in (matmul_fn(a, b), matmul_fn(A=a, B=b), matmul_fn(a, B=b), matmul_fn({"A": a,
                                                                                     "B": b})):
        np.testing.assert_allclose(got["C"].numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("call, match", [
    (lambda a, b: dict(A=a), r"missing input\(s\) 'B'"),
    (lambda a, b: dict(A=a, B=b, C=a), r"unknown input 'C'"),
    (lambda a, b: dict(A=a[:, :8], B=b), r"input 'A': expected shape \(32, 64\), got \(32, 8\)"),
    (lambda a, b: dict(A=a, B=b.half()),
     r"input 'B': expected dtype torch.float32, got torch.float16"),
    (lambda a, b: dict(A=a, B=b.numpy()), r"input 'B': expected a torch.Tensor .* ndarray"),
    (lambda a, b: dict(A=a, B=torch.empty(64, 48, device="meta")),
     r"input 'B': expected device cpu .* got meta"),
], ids=["missing", "unknown", "shape", "dtype", "type", "device"])
def test_bad_inputs_raise_value_errors(matmul_fn, call, match):
    a, b = torch.randn(32, 64), torch.randn(64, 48)
    with pytest.raises(ValueError, match=match):
        matmul_fn(**call(a, b))


@pytest.mark.parametrize("bad", [
    lambda a, b: (a[:, :8], b), lambda a, b: (a, b.half()), lambda a, b: (a, b.numpy()),
    lambda a, b: (a, torch.empty(64, 48, device="meta")), lambda a, b: (a.double(), b)],
    ids=["shape", "dtype", "type", "device", "dtype-a"])
def test_a_signature_checked_once_still_refuses_others(matmul_fn, bad):
    a, b = torch.randn(32, 64), torch.randn(64, 48)
    matmul_fn(a, b)  # this signature is now remembered as checked
    with pytest.raises(ValueError, match="expected"):
        matmul_fn(*bad(a, b))
    assert matmul_fn(a, b)["C"].shape == (32, 48)


def test_positional_errors(matmul_fn):
    a = torch.randn(32, 64)
    with pytest.raises(ValueError, match="takes 2 inputs"):
        matmul_fn(a, a, a)
    with pytest.raises(ValueError, match="given both by position and by name"):
        matmul_fn(a, A=a)


def test_cpu_without_interpreter_refused(monkeypatch):
    g = matmul(dtype="float32")  # a new module: the check runs at a signature's first call
    matmul_fn = compile_mugraph(lower(g, Schedule(grid={"a": 2, "c": 3}, loop="b", forloop=4)))
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="need a CUDA device, or TRITON_INTERPRET=1"):
        matmul_fn(torch.randn(32, 64), torch.randn(64, 48))


# -- refusals --------------------------------------------------------------------------------


def test_concat_of_tiles_kept_as_parts():
    """Ops on a concat run per part; the output is stored part by part at its offsets."""
    g = em.Graph("cat")
    x = g.input("X", (8, 24), "float32")
    w = g.input("W", (24, 16), "float32")
    c = em.concat([x, em.exp(x) * 2.0], axis=1)  # (8, 48)
    g.output(c * 3.0 + 1.0, "Y")
    g.output(c.sum(axis=1, keepdims=True) - c.mean(axis=0, keepdims=True), "S")
    g.output(em.concat([x.T, w], axis=1).T @ w, "M")  # (40, 16): split along M
    mg = em.MuGraph("cat_tiled")
    mg.input("X", (8, 24), "float32")
    mg.input("W", (24, 16), "float32")
    k = mg.custom_kernel(grid=(1,), name="cat", source=g)
    t, wt = k.input("X"), k.input("W")
    ct = em.concat([t, em.exp(t) * 2.0], axis=1)
    k.output(ct * 3.0 + 1.0, "Y")
    k.output(ct.sum(axis=1, keepdims=True) - ct.mean(axis=0, keepdims=True), "S")
    k.output(em.concat([t.T, wt], axis=1).T @ wt, "M")
    mg.output("Y")
    mg.output("S")
    mg.output("M")
    fn = check_compiled(mg, g)
    assert "kept as its 2 parts" in fn.source and "Y_p1_ptrs" in fn.source


def test_concat_and_splitting_padded_reshape_in_a_tile_refused():
    mg = em.MuGraph("cat")
    mg.input("X", (8, 32), "float32")
    mg.input("Z", (8, 64), "float32")
    k = mg.custom_kernel(grid=(2,), name="cat")
    mg.input("W", (64, 64), "float32")
    t, z = k.input("X", imap={0: 0}), k.input("Z", imap={0: 0})
    k.output(em.concat([t, t * 2.0], axis=1) + z @ k.input("W"), "Y", omap={0: 0})
    mg.output("Y")
    with pytest.raises(CodegenError, match=r"kernel 'cat': add .* reads a concat of tiles "
                       r"\(4, 32\), \(4, 32\) \(axis 1\): the other operand \(4, 64\) is a whole"):
        triton_source(mg)
    mg = em.MuGraph("split")
    mg.input("X", (8, 24), "float32")
    k = mg.custom_kernel(grid=(2,), name="rs")
    k.output(k.input("X", imap={0: 0}).reshape(4, 4, 6), "Y", omap={0: 0})
    mg.output("Y")
    with pytest.raises(CodegenError, match=r"kernel 'rs': reshape.* splits or merges .* padded"):
        triton_source(mg)
    assert issubclass(CodegenError, em.MirageError)


def test_concat_plus_inputs_loads_them_in_parts():
    """RoPE's ``x * cos + rotate_half(x) * sin``: the whole operands (x, cos, sin and x * cos)
    are loaded or recomputed part by part, each part at its offset."""
    g = em.Graph("rope")
    x = g.input("X", (8, 32), "float32")
    cos, sin = g.input("C", (8, 32), "float32"), g.input("S", (8, 32), "float32")
    g.output(x * cos + em.concat([-x[:, 16:], x[:, :16]], axis=1) * sin, "Y")
    mg = em.MuGraph("rope_tiled")
    for name in ("X", "C", "S"):
        mg.input(name, (8, 32), "float32")
    k = mg.custom_kernel(grid=(2,), name="rope")
    xt, ct, st = (k.input(n, imap={0: 0}) for n in ("X", "C", "S"))
    k.output(xt * ct + em.concat([-xt[:, 16:], xt[:, :16]], axis=1) * st, "Y", omap={0: 0})
    mg.output("Y")
    src = triton_source(mg)
    assert "kept as its 2 parts" in src and "at offset 16 of axis 1" in src
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal((8, 32)) for n in ("X", "C", "S")}
    fn = compile_mugraph(mg)
    got = fn(**{n: torch.tensor(v, dtype=torch.float32) for n, v in feed.items()})["Y"]
    np.testing.assert_allclose(got.double().numpy(), em.evaluate(g, feed)["Y"], rtol=1e-5,
                               atol=1e-5)


def test_reshape_of_unpadded_tiles():
    g = em.Graph("rs")
    x = g.input("X", (8, 32), "float32")
    g.output(em.exp(x.reshape(8, 4, 8)).sum(axis=2), "Y")
    mg = em.MuGraph("rs_tiled")
    mg.input("X", (8, 32), "float32")
    k = mg.custom_kernel(grid=(2,), name="rs", source=g)
    tile = em.exp(k.input("X", imap={0: 0}).reshape(4, 4, 8))
    k.output(tile.sum(axis=2), "Y", omap={0: 0})
    mg.output("Y")
    fn = check_compiled(mg, g)
    assert "tl.reshape(X, (BLOCK_4, BLOCK_4, BLOCK_8))" in fn.source


# -- the emitted source ----------------------------------------------------------------------


def snapshot_programs():
    _, tiled = tiled_matmul()
    _, fused = rmsnorm_linear()
    return {"from_graph_many_ops": em.from_graph(many_ops()), "tiled_matmul_padded": tiled,
            "rmsnorm_linear_fused": fused}


@pytest.mark.parametrize("name", sorted(snapshot_programs()))
def test_snapshot(name):
    source = triton_source(snapshot_programs()[name], header="predicted cost: (snapshot)")
    path = SNAPSHOTS / f"{name}.py.txt"
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(source)
    assert path.exists(), f"missing snapshot {path}; run with UPDATE_SNAPSHOTS=1 to write it"
    assert source == path.read_text(), f"{name}: emitted source differs from {path} " \
                                        "(review the diff; UPDATE_SNAPSHOTS=1 rewrites it)"


def test_header_lists_program_and_cost():
    _, mg = rmsnorm_linear()
    src = triton_source(mg, header="predicted cost: 1.50 us (baseline 4.00 us) on h100")
    head = src.split("\nimport ")[0]
    assert "# predicted cost: 1.50 us (baseline 4.00 us) on h100" in head
    assert all(f"# {line}" in head for line in str(mg).splitlines())
    assert "BLOCK_16: tl.constexpr" in src and "pid_x = tl.program_id(0)" in src


# -- random programs (the hypothesis harness) -------------------------------------------------

RANDOM = settings(max_examples=int(os.environ.get("CODEGEN_EXAMPLES", "30")), deadline=None,
                  derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def check_random(g, mg):
    """Compiled ``mg`` against float64 ``g``, allowing 10x the error of native-dtype rounding."""
    try:
        triton_source(mg)
    except CodegenError as exc:  # refused: a reshape of padded dims, a concat's odd reader
        assert "padded" in str(exc) or "concat of tiles" in str(exc), exc
        assume(False)
    fn = compile_mugraph(mg)
    check_triton_api(fn.source)
    inputs = torch_inputs(g, seed=1, scale=1.0)
    arrays = {n: t.double().numpy() for n, t in inputs.items()}
    want, native = em.evaluate(g, arrays), em.evaluate(mg, arrays, dtype="native")
    assume(all(np.all(np.isfinite(v)) for v in list(want.values()) + list(native.values())))
    got = fn(**inputs)
    casts = {n.arg for n in g.nodes() if n.op is em.Op.CAST}  # a cast rounds in between
    for name, spec in mg.outputs.items():
        out = got[name].double().numpy()
        rtol = max(TOL[dt] for dt in casts | {spec.dtype})
        tol = rtol * max(1.0, float(np.abs(want[name]).max()))
        err = float(np.abs(native[name] - want[name]).max())
        np.testing.assert_allclose(out, want[name], rtol=rtol, atol=tol + 10 * err,
                                   err_msg=f"output {name}\n{mg}")


@RANDOM
@given(programs(max_ops=6, max_dim=6))
def test_random_programs_from_graph(g):
    check_random(g, em.from_graph(g))


TILE_OPS = [op for op in em.Op if op not in (em.Op.INPUT, em.Op.WHERE, em.Op.MASK, em.Op.CAUSAL,
                                             em.Op.NOT, em.Op.AND, em.Op.OR,  # not generated
                                             em.Op.GATHER, em.Op.TAKE_ALONG_AXIS)  # yet
            # (tests/ir/test_logical_*, tests/semantics/test_gather.py, test_take_along_axis.py),
            and op not in COMPARE  # nor the comparisons (bool results: tests/ir/test_comparisons)
            and op not in (em.Op.BITAND, em.Op.SHR)]  # nor bit ops (tests/ir/test_int4_weights)


def uses_all_inputs(g):  # index_fragment raises KeyError on an unused input (schedule.py)
    used = {id(n) for n in g.nodes()}
    return all(id(n) in used for n in g.inputs.values())


@RANDOM
@given(programs(max_ops=6, max_dim=6, ops=TILE_OPS))
def test_random_programs_as_one_block(g):
    """The whole program in one custom kernel of one block: every tile op on odd shapes."""
    from eqsat_mirage.fusion.schedule import ScheduleError

    assume(uses_all_inputs(g))
    try:
        mg = lower(g, Schedule())
    except ScheduleError:
        assume(False)
    check_random(g, mg)


@RANDOM
@given(programs(max_ops=5, max_dim=8, ops=TILE_OPS))
def test_random_programs_tiled(g):
    """The first candidate schedules (grid, loop or split) of a random program."""
    from eqsat_mirage.fusion.schedule import ScheduleError

    assume(uses_all_inputs(g))
    try:
        cands = candidate_schedules(g, Strategy(min_blocks=1, max_blocks=8, loop_ranges=(2,),
                                                max_candidates=2, allow_split_reduction=True,
                                                min_tile=1))
    except ScheduleError:
        cands = []
    assume(cands)
    for s in cands:
        check_random(g, lower(g, s))


@settings(max_examples=int(os.environ.get("CODEGEN_OPT_EXAMPLES", "8")), deadline=None,
          derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(programs(max_ops=5, max_dim=6))
def test_random_programs_optimized(g):
    """em.optimize's MuGraph of a random program, compiled (custom kernels where it fuses)."""
    check_random(g, em.optimize(g, time_limit_s=2).program)


# -- Triton 3.6 compatibility (each test above checks the sources it compiles) ----------------


def test_source_uses_only_triton_3_6_apis():
    """The snapshot programs and a few lowered programs pass check_triton_api; the check
    itself refuses an API outside TRITON_API, and every TRITON_API name exists in Triton."""
    g = attention()
    n = idx(g, "K", 2)
    made = [lower(g, Schedule(grid={idx(g, "Q", 0): 2, n: 4}, split=n)),
            lower(matmul(), Schedule(grid={"a": 2, "c": 3}, loop="b", forloop=4)),
            *snapshot_programs().values()]
    sources = [triton_source(mg) for mg in made]
    assert all("@triton.jit" in s for s in sources[:2])
    for src in sources:
        check_triton_api(src)
    for bad in ("\nx = tl.not_an_api(y)\n", "\nx = triton.cdiv(a, b)\n"):
        with pytest.raises(AssertionError):
            check_triton_api(sources[0] + bad)
    import triton.language as tl

    assert all(hasattr(tl, name) for name in TRITON_API)


def test_optimize_result_emits_and_compiles(tmp_path):
    """res.triton_source() / res.compile() / `optimize --emit` on an optimized program."""
    from eqsat_mirage.cli.main import main

    g = em.Graph("rms_small")
    x = g.input("X", (4, 64), dtype="float32")
    w = g.input("W", (64, 32), dtype="float32")
    g.output(em.rms_norm(x) @ w, "O")
    res = em.optimize(g, time_limit_s=10)
    src = res.triton_source()
    assert "@triton.jit" in src or "torch." in src
    assert "predicted" in src and "def run(" in src
    fn = res.compile()
    rng = np.random.default_rng(0)
    xs, ws = rng.standard_normal((4, 64)), rng.standard_normal((64, 32))
    got = fn(torch.tensor(xs, dtype=torch.float32), torch.tensor(ws, dtype=torch.float32))
    want = em.evaluate(g, {"X": xs, "W": ws})["O"]
    np.testing.assert_allclose(got["O"].numpy(), want, rtol=1e-4, atol=1e-4)
    prog = tmp_path / "p.py"
    prog.write_text("import eqsat_mirage as em\nprogram = em.Graph('p')\n"
                    "x = program.input('X', (4, 64), dtype='float32')\n"
                    "program.output(em.exp(x).sum(axis=1, keepdims=True), 'O')\n")
    out = tmp_path / "out.py"
    assert main(["optimize", str(prog), "--quiet", "--emit", str(out)]) == 0
    assert "def run(" in out.read_text()


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX owners and modes")
def test_generated_modules_only_go_to_private_folders(tmp_path):
    from eqsat_mirage.runtime.load import private_folder

    default = private_folder()
    st = default.stat()
    assert st.st_uid == os.getuid() and not st.st_mode & 0o077
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone could swap a module in
    with pytest.raises(CodegenError, match=r"refusing to write generated modules.*0o777"):
        compile_mugraph(tiled_matmul()[1], directory=shared)
    assert list(shared.iterdir()) == []
    own = tmp_path / "own"
    run = compile_mugraph(tiled_matmul()[1], directory=own)
    assert Path(run.path).parent == own


def test_a_fused_kernel_compiles_for_sm90a_without_a_gpu():
    from eqsat_mirage.codegen.compiled import compile_report

    g = em.Graph("rmslin")
    x = g.input("X", (4, 64), dtype="float16")
    w = g.input("W", (64, 32), dtype="float16")
    g.output(em.rms_norm(x) @ w, "Y")
    res = em.optimize(g, cache=False)
    assert any(k.kind == "custom" for k in res.program.kernels)
    (k, *_) = compile_report(res.triton_source(), "h100")
    assert 0 < k.registers <= 255 and k.spill_bytes >= 0
    assert 0 <= k.shared_bytes <= 227 * 1024 and k.num_warps == 4
    assert compile_report(res.triton_source(), "h100")[0] is k  # cached by source
    with pytest.raises(em.MirageError, match="no compute capability"):
        compile_report(res.triton_source(), "tpu")


@pytest.mark.parametrize("rows,cols,offset", [(16, 16, 0), (5, 12, 7), (1, 9, 8), (1, 1, 0)])
def test_a_causal_mask_inside_a_kernel_is_computed_from_positions(rows, cols, offset):
    """A causal mask fused into a kernel as a block op (its tile the whole mask, as the
    planner fuses a LLaMA layer's attention at sequence length 16) is built from positions
    in the kernel, not folded as a constant (issue 31: "cannot reshape array of size 256")."""
    g = em.Graph(f"causal_{rows}x{cols}")
    q = g.input("Q", (2, rows, 8))
    k = g.input("K", (2, 8, cols))
    v = g.input("V", (2, cols, 8))
    s = em.where(g.causal_mask(rows, cols, offset), (q @ k) * 0.3, float("-inf"))
    g.output(em.softmax(s, axis=-1) @ v, "O")
    for sched in (Schedule(), Schedule(grid={idx(g, "Q", 0): 2})):
        mg = lower(g, sched)
        assert [kk.kind for kk in mg.kernels] == ["custom"]
        fn = check_compiled(mg, g)
        assert rows * cols == 1 or " >= tl.arange(" in fn.source  # one element: a constant
