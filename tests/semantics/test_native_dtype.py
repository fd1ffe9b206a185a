"""Native-dtype semantics against eager torch on the CPU (issue 31).

``em.evaluate(..., dtype="native")`` computes matmul, sum and mean as torch does in
float16 and bfloat16: the operands as stored, a float32 accumulator, the result rounded
once (``OpSpec.accumulates``); elementwise ops round per op. softmax through the torch
frontend computes in float32 and rounds once, as torch's softmax kernel does.
"""

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.ir.node import Op
from eqsat_mirage.ir.ops import SPECS
from eqsat_mirage.semantics.floating import FloatCtx, accumulator, neighbour, round_to

torch = pytest.importorskip("torch")

DTYPES = ("float16", "bfloat16")


def _ulps(got: np.ndarray, want: torch.Tensor, dtype: str) -> int:
    """The largest distance in units in the last place of ``dtype`` between ``got`` (values
    of the dtype, as float32) and ``want`` (a torch tensor of that dtype)."""
    tdt = getattr(torch, dtype)
    exact = torch.tensor(np.asarray(got, dtype=np.float32))
    mine = exact.to(tdt)
    assert torch.equal(mine.float(), exact), \
        "em.evaluate's native values must be values of the dtype"

    def ordered(t):  # sign-magnitude bits to a monotone integer line
        i = t.reshape(-1).view(torch.int16).int()
        return torch.where(i < 0, -32768 - i, i)
    return int((ordered(mine) - ordered(want.to(tdt))).abs().max())


def _run(graph, tensors: dict) -> np.ndarray:
    got = em.evaluate(graph, {k: v.float().numpy() for k, v in tensors.items()},
                      dtype="native")
    return next(iter(got.values()))


def test_the_accumulating_ops_are_declared_once():
    assert {op for op, s in SPECS.items() if s.accumulates} == {Op.MATMUL, Op.SUM, Op.MEAN}
    g = em.Graph("acc")
    x = g.input("x", (4, 8), dtype="float16")
    g.output(x.sum(axis=-1), "out")
    node = g.outputs["out"]
    assert accumulator(FloatCtx({}, "native"), node) is np.float32
    assert accumulator(FloatCtx({}, None), node) is np.float64  # the reference
    assert accumulator(FloatCtx({}, "native"), node.srcs[0]) is np.float64  # not accumulating


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("what", ["matmul", "batched_matmul", "sum", "mean", "sum_all"])
def test_accumulations_are_bit_equal_to_eager_torch(dtype, what):
    tdt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(4, 16, 512, generator=gen) * 3).to(tdt)
    w = torch.randn(512, 96, generator=gen).to(tdt)
    g = em.Graph(what)
    gx = g.input("x", tuple(x.shape), dtype=dtype)
    inputs = {"x": x}
    if what.endswith("matmul"):
        gw = g.input("w", (4, 512, 96) if what == "batched_matmul" else (512, 96), dtype=dtype)
        inputs["w"] = w.expand(4, 512, 96).contiguous() if what == "batched_matmul" else w
        g.output(gx @ gw, "out")
        want = x @ inputs["w"]
    elif what == "sum":
        g.output(gx.sum(axis=-1, keepdims=True), "out")
        want = x.sum(-1, keepdim=True)
    elif what == "mean":
        g.output(gx.mean(axis=(0, 2)), "out")
        want = x.mean((0, 2))
    else:
        g.output(gx.sum(), "out")
        want = x.sum()
    got = _run(g, inputs)
    if dtype in ("bfloat16", "float16") and what.endswith("matmul"):
        # torch's CPU half-precision GEMM sums the same float32 products in another order
        # (bfloat16 everywhere; float16 on CPUs without native float16 arithmetic, such as
        # AMD EPYC): equal up to that order's float32 rounding, then rounded once
        bound = 2 * 512 * 2.0 ** -24 * (x.double().abs() @ inputs["w"].double().abs())
        mantissa = 7 if dtype == "bfloat16" else 10
        ulp = 2.0 ** (torch.floor(torch.log2(want.double().abs().clamp_min(1e-30))) - mantissa)
        assert torch.all((torch.from_numpy(got) - want.double()).abs() <= ulp + bound)
        assert (torch.from_numpy(got) == want.double()).double().mean() > 0.99
    else:
        assert _ulps(got, want, dtype) == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_ops_round_per_op_as_torch(dtype):
    tdt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(3)
    x, y = (torch.randn(64, 64, generator=gen).to(tdt) for _ in range(2))
    g = em.Graph("ew")
    gx, gy = (g.input(n, (64, 64), dtype=dtype) for n in ("x", "y"))
    g.output(em.exp(gx * gy + gx) / (gy * gy + 1.0), "out")
    want = torch.exp(x * y + x) / (y * y + 1.0)
    assert _ulps(_run(g, {"x": x, "y": y}), want, dtype) <= 1  # exp's last bit may differ


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 8.0])
def test_softmax_from_torch_within_one_ulp_of_eager(dtype, scale):
    tdt = getattr(torch, dtype)
    x = (torch.randn(8, 512, generator=torch.Generator().manual_seed(1)) * 3).to(tdt)

    def fn(t):
        return torch.softmax(t * scale, dim=-1)
    g = em.from_torch(fn, x)
    assert _ulps(_run(g, {name: x for name in g.inputs}), fn(x), dtype) <= 1


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_neighbour_is_one_unit_in_the_last_place(dtype):
    x = round_to(np.array([1.0, -1.0, 0.0, 3.3, -2.5e-3, 1e-7, np.inf, np.nan]), dtype)
    up = neighbour(x, dtype, np.ones(x.shape, bool))
    down = neighbour(x, dtype, np.zeros(x.shape, bool))
    if dtype != "bfloat16":
        store = np.float16 if dtype == "float16" else np.float32
        xs = x.astype(store)
        away = np.nextafter(xs, np.copysign(np.inf, xs)).astype(np.float32)
        toward = np.nextafter(xs, np.zeros_like(xs)).astype(np.float32)
        fin = np.isfinite(x) & (x != 0)
        assert np.array_equal(up[fin], away[fin]) and np.array_equal(down[fin], toward[fin])
    for moved in (up, down):  # values of the dtype
        assert np.array_equal(round_to(moved, dtype), moved, equal_nan=True)
    fin = np.isfinite(x)
    assert np.all(np.abs(up[fin]) > np.abs(x[fin]))
    assert np.all(np.abs(down[fin][x[fin] != 0]) < np.abs(x[fin][x[fin] != 0]))
    assert down[2] != 0  # 0 can only move away
    assert np.isinf(up[6]) and np.isnan(up[7])
    with pytest.raises(ValueError, match="bool"):
        neighbour(x, "bool", up > 0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_float16_rounding_paths_agree_bit_for_bit(dtype, monkeypatch):
    """torch's conversion (float32 arrays, where torch is installed), NumPy 2's cast and the
    bit arithmetic kept for older NumPy and subnormal-heavy arrays round the same, across
    the exponent range, at the overflow threshold, ties, subnormals, signed zeros, inf and
    nan, to float32 (``round_to``) and to float16 (``to_half``)."""
    from eqsat_mirage.semantics import floating, half

    rng = np.random.default_rng(3)
    x = rng.standard_normal(200_000) * 2.0 ** rng.integers(-40, 40, 200_000)
    ties = (np.arange(1, 2001) * 2 + 1) * 2.0**-11  # halfway between float16 neighbours
    x = np.concatenate([x, ties, -ties * 2.0**-14, [
        0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0, -65520.0, 2.0**-25,
        2.0**-24, 3 * 2.0**-26, 1e-30]]).astype(dtype)
    results = {}
    for path in ("torch", "chosen", "bits", "cast"):
        monkeypatch.setattr(half, "_TORCH", [] if path == "torch" else [None])
        monkeypatch.setattr(half, "_NUMPY_CASTS", path != "bits")
        if path == "cast":
            monkeypatch.setattr(half, "_subnormal_heavy", lambda x: False)
        else:  # a third of these values are below 2^-14: the bit arithmetic for NumPy
            assert half._subnormal_heavy(x)
        results[path] = floating.round_to(x, "float16"), half.to_half(x)
    bits = results["bits"][0]
    assert bits.dtype == np.float32
    for path, (rounded, as_half) in results.items():
        assert rounded.dtype == np.float32 and as_half.dtype == np.float16, path
        for other in (rounded, as_half.astype(np.float32)):
            assert np.array_equal(other.view(np.uint32), bits.view(np.uint32)), path


def test_torch_rounds_large_float32_arrays_in_chunks():
    """A float32 array of ``TORCH_FROM`` elements or more, read-only or strided too, is
    rounded by torch, in chunks no longer than torch's parallel grain (so it starts no
    thread of its own beside the verifier's); a smaller one, or a float64 one, by NumPy."""
    from eqsat_mirage.semantics import half

    big = np.random.default_rng(0).standard_normal((300, 1000)).astype(np.float32) * 300
    big.flags.writeable = False
    for x in (big, big.T, big[:, ::3]):
        assert x.size >= half.TORCH_FROM
        with np.errstate(over="ignore"):
            want = x.astype(np.float16)
        for dtype in (np.float32, np.float16):
            got = half._by_torch(x, dtype)
            assert got.dtype == dtype and got.shape == x.shape
            assert np.array_equal(got, want.astype(dtype), equal_nan=True)
    assert half._by_torch(big[:2, :100], np.float32) is None  # under TORCH_FROM
    assert half._by_torch(big.astype(np.float64), np.float32) is None  # (double rounding)
    assert half._TORCH_CHUNK <= 32768  # torch's GRAIN_SIZE


def test_only_subnormal_heavy_arrays_take_the_bit_arithmetic():
    """NumPy's cast is about 20x slower per subnormal element: arrays with more than 1 in
    20 values in float16's subnormal range are rounded by the bit arithmetic instead."""
    from eqsat_mirage.semantics import half

    z = np.random.default_rng(0).standard_normal(100_000)
    assert not half._subnormal_heavy(z)
    assert half._subnormal_heavy(z * 2.0**-15)  # most below 2^-14
    assert not half._subnormal_heavy(z[:1000] * 2.0**-15)  # too small to matter
    assert not half._subnormal_heavy(np.zeros(100_000))  # zeros are not subnormal


def test_the_subnormal_sample_copies_no_transposed_array():
    """``_subnormal_heavy`` picks its sample by position: a transposed or strided array is
    not copied whole to be sampled (``reshape(-1)`` would), and it decides as for the
    same values laid out contiguously."""
    import tracemalloc

    from eqsat_mirage.semantics import half

    x = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32) * 2.0**-15
    for view in (x.T, x[:, ::2], x[::-1]):
        tracemalloc.start()
        heavy = half._subnormal_heavy(view)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert heavy == half._subnormal_heavy(np.ascontiguousarray(view)) is True
        assert peak < view.size * view.itemsize // 8, peak


@pytest.mark.parametrize("factor", [1.0, 4.0, 2.0**27])
def test_from_half_is_the_cast_times_a_power_of_two(factor):
    """``from_half`` (a table of the 65536 float16 bit patterns) gives NumPy's float16 ->
    float32 cast bit for bit, subnormals, signed zeros, inf and nan included, and times a
    power of two: exact, or inf past float16's largest, as a float16 product would be."""
    from eqsat_mirage.semantics.half import from_half

    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    sub = (np.random.default_rng(0).standard_normal(100_000) * 2.0**-15).astype(np.float16)
    for x in (every, sub, sub.reshape(200, 500).T):
        want = x.astype(np.float32) * np.float32(factor)
        with np.errstate(invalid="ignore"):
            want[np.abs(want) > 65504] = np.copysign(np.inf, want[np.abs(want) > 65504])
        got = from_half(x, factor)
        assert got.dtype == np.float32 and got.shape == x.shape
        nan = np.isnan(want)  # (a product may quiet a nan's payload)
        assert np.array_equal(np.isnan(got), nan)
        assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_by_bits_looks_up_every_element_in_chunks():
    """``by_bits`` (the draws' and ``from_half``'s table look-up, chunk by chunk) gives
    ``table.take`` of the bit patterns bit for bit: one chunk, many with a short last one,
    a transposed (not contiguous) array, a float16 table; a table without one value per
    pattern is refused."""
    from eqsat_mirage.semantics import half

    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    with np.errstate(invalid="ignore"):
        tables = (every.astype(np.float64) * 3.0, every.astype(np.float32), every[::-1].copy())
    rng = np.random.default_rng(1)
    n = 3 * half._BITS_CHUNK + 17
    draws = (every, rng.integers(0, 1 << 16, n, dtype=np.uint16).view(np.float16),
             rng.integers(0, 1 << 16, (701, 300), dtype=np.uint16).view(np.float16).T,
             every[:10])
    for table in tables:
        for x in draws:
            got = half.by_bits(table, x)
            want = table.take(x.view(np.uint16))
            assert got.dtype == table.dtype and got.shape == x.shape
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    zero_d = half.by_bits(tables[1], np.array(1.5, np.float16))
    assert isinstance(zero_d, np.ndarray) and zero_d.shape == () and zero_d == 1.5
    with pytest.raises(ValueError, match="one per 16-bit pattern"):
        half.by_bits(np.zeros(10), every)


@pytest.mark.parametrize("mode", [None, "native"])
def test_a_matmul_with_one_uniform_operand_sums_the_other(mode):
    """A matmul one of whose operands is one value (the float checks' constant draws) is
    that value times the other's sums over the contraction: no GEMM of a broadcast weight,
    and the result agrees with the GEMM to the accumulator's rounding."""
    g = em.Graph("g")
    x, w = g.input("x", (2, 3, 64), "float16"), g.input("w", (64, 5), "float16")
    g.output(x @ w, "y")
    n = next(m for m in g.nodes() if m.op is Op.MATMUL)
    rng = np.random.default_rng(0)
    ctx = FloatCtx({}, mode)
    full_x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    full_w = rng.standard_normal((64, 5)).astype(np.float32)
    one_x = np.broadcast_to(np.float32(0.75), (2, 3, 64))
    one_w = np.broadcast_to(np.float32(-0.5), (64, 5))
    for a, b in ((full_x, one_w), (one_x, full_w)):
        from eqsat_mirage.semantics.floating import FLOAT_SEMANTICS

        got = FLOAT_SEMANTICS[Op.MATMUL](ctx, n, a, b)
        want = ctx.fix(n, np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64)))
        assert got.shape == (2, 3, 5) and got.flags.c_contiguous
        tol = 1e-12 if mode is None else 2e-3 * float(np.max(np.abs(want)))
        assert np.max(np.abs(got - want)) <= tol


@pytest.mark.parametrize("mode", [None, "native"])
def test_a_matmul_with_an_infinite_uniform_operand_is_the_gemms(mode):
    """An operand that is inf everywhere (a float16 draw at the headroom) times a row with
    a zero, or with both signs, is nan as the GEMM's terms are (0 * inf, inf - inf), not
    inf as inf times the row's sum would be: the first program's non-finite points are
    those the hardware gives."""
    from eqsat_mirage.semantics.floating import FLOAT_SEMANTICS

    g = em.Graph("g")
    x, w = g.input("x", (3, 2), "float32"), g.input("w", (2, 3), "float32")
    g.output(x @ w, "y")
    n = next(m for m in g.nodes() if m.op is Op.MATMUL)
    ctx = FloatCtx({}, mode)
    rows = np.array([[0.0, 1.0], [2.0, -1.0], [1.0, 2.0]], np.float32)
    for c in (np.inf, -np.inf):
        for a, b in ((rows, np.broadcast_to(np.float32(c), (2, 3))),
                     (np.broadcast_to(np.float32(c), (3, 2)), rows.T.copy())):
            with np.errstate(invalid="ignore"):  # as ``evaluate`` runs it
                got = FLOAT_SEMANTICS[Op.MATMUL](ctx, n, a, b)
                want = np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))
            assert np.array_equal(np.isnan(got), np.isnan(want)), (c, got)
            assert np.isnan(got).sum() == 6 and np.array_equal(got[~np.isnan(got)],
                                                              want[~np.isnan(want)])


def test_a_one_value_matmul_that_could_overflow_is_the_gemms():
    """Where a term could overflow the accumulator (float32 here), summing first and
    scaling after would differ from the GEMM ([[3e38, -3e38]] @ 4: nan, not 0): the GEMM
    runs."""
    g = em.Graph("g")
    x, w = g.input("x", (1, 2), "float32"), g.input("w", (2, 3), "float32")
    g.output(x @ w, "y")
    n = next(m for m in g.nodes() if m.op is Op.MATMUL)
    from eqsat_mirage.semantics.floating import FLOAT_SEMANTICS

    a = np.array([[3e38, -3e38]], dtype=np.float32)
    with np.errstate(all="ignore"):
        got = FLOAT_SEMANTICS[Op.MATMUL](FloatCtx({}, "native"), n, a,
                                         np.broadcast_to(np.float32(4.0), (2, 3)))
    assert np.all(np.isnan(got))


@pytest.mark.parametrize("c", [np.inf, -np.inf, np.nan])
def test_a_matmul_with_a_nonfinite_one_value_operand_is_the_gemms_without_one(c):
    """Every term is inf or nan: the sum IEEE arithmetic gives in any order (nan where a
    term is nan or both signs meet, else inf of their sign) equals NumPy's GEMM, on
    either side, without running one (a float16 draw at the headroom is inf)."""
    from eqsat_mirage.semantics.floating import FLOAT_SEMANTICS

    rng = np.random.default_rng(1)
    x = rng.choice(np.array([0.0, 1.5, -2.0, 3.0, np.inf, -np.inf, np.nan], np.float32),
                   size=(3, 5, 4), p=[0.05, 0.4, 0.1, 0.35, 0.04, 0.03, 0.03])
    x[0, 0] = [1.0, 2.0, 3.0, 4.0]  # one all-positive row, one all-negative row
    x[0, 1] = [-1.0, -2.0, -3.0, -4.0]
    for mode in (None, "native"):
        ctx = FloatCtx({}, mode)
        g = em.Graph("g")
        a, w = g.input("a", (3, 5, 4), "float32"), g.input("w", (4, 6), "float32")
        g.output(a @ w, "y")
        n = next(m for m in g.nodes() if m.op is Op.MATMUL)
        one = np.broadcast_to(np.float32(c), (4, 6))
        with np.errstate(all="ignore"):
            got = FLOAT_SEMANTICS[Op.MATMUL](ctx, n, x, one)
            want = ctx.fix(n, np.matmul(x, np.full((4, 6), c, np.float32)))
        assert np.array_equal(got, want, equal_nan=True), (mode, got, want)
        assert got[0, 0, 0] == np.sign(c) * np.inf if not np.isnan(c) else np.isnan(got[0, 0, 0])
    g = em.Graph("h")  # the one-value operand on the left
    w, b = g.input("w", (6, 4), "float32"), g.input("b", (3, 4, 5), "float32")
    g.output(w @ b, "y")
    n = next(m for m in g.nodes() if m.op is Op.MATMUL)
    xb = np.swapaxes(x, -1, -2).copy()
    with np.errstate(all="ignore"):
        got = FLOAT_SEMANTICS[Op.MATMUL](FloatCtx({}, None), n,
                                         np.broadcast_to(np.float64(c), (6, 4)), xb)
        want = np.matmul(np.full((6, 4), c), xb.astype(np.float64))
    assert np.array_equal(got, want, equal_nan=True)


def test_exact_evaluation_does_not_depend_on_the_summation_order():
    """``dtype="exact"`` (the offset draws' evaluation): each matmul and sum exact, rounded
    once to its dtype, so another order of the contraction gives the same bits, where the
    float32 GEMM's own order moves the last bits of some outputs (and with it, on an
    ill-conditioned draw, a verdict: another CPU's BLAS kernel sums in another order)."""
    rng = np.random.default_rng(0)
    g = em.Graph("order")
    xt, wt = g.input("X", (16, 512), "float32"), g.input("W", (512, 32), "float32")
    g.output((xt @ wt).sum(axis=1, keepdims=True) * 3.0 + xt.sum(axis=1, keepdims=True), "O")
    x = rng.standard_normal((16, 512)).astype(np.float32) + 100.0
    w = rng.standard_normal((512, 32)).astype(np.float32)
    perm = rng.permutation(512)
    moved = {"X": np.ascontiguousarray(x[:, perm]), "W": np.ascontiguousarray(w[perm])}
    exact = [em.evaluate(g, ins, dtype="exact")["O"] for ins in ({"X": x, "W": w}, moved)]
    assert np.array_equal(exact[0], exact[1])
    assert np.array_equal(exact[0], round_to(exact[0], "float32"))  # values of the dtype
    native = [em.evaluate(g, ins, dtype="native")["O"] for ins in ({"X": x, "W": w}, moved)]
    assert not np.array_equal(native[0], native[1])  # float32 accumulation: order shows


@pytest.mark.parametrize("target", ["float16", "bfloat16", "float32"])
def test_a_cast_of_int8_values_rounds_nothing(target, monkeypatch):
    """A cast of an int8 or uint8 tensor to float16, bfloat16 or float32 is exact
    (``floating._HOLDS_BYTES``: no rounding pass): natively and in a MuGraph's float32
    tiles, the values equal those of the rounding path bit for bit."""
    from eqsat_mirage.mugraph.program import from_graph
    from eqsat_mirage.semantics import floating

    g = em.Graph("deq")
    q = g.input("q", (64, 32), dtype="int8")
    u = g.input("u", (64, 32), dtype="uint8")
    s = g.input("s", (64, 1), dtype=target)
    g.output((q.astype(target) + u.astype(target)) * s, "y")
    rng = np.random.default_rng(0)
    inputs = {"q": rng.integers(-128, 128, (64, 32)).astype(np.float64),
              "u": rng.integers(0, 256, (64, 32)).astype(np.float64),
              "s": rng.standard_normal((64, 1)) * 1e-3}
    for program in (g, from_graph(g)):
        fast = em.evaluate(program, inputs, dtype="native")["y"]
        monkeypatch.setattr(floating, "_HOLDS_BYTES", ())
        slow = em.evaluate(program, inputs, dtype="native")["y"]
        monkeypatch.undo()
        assert np.array_equal(np.asarray(fast), np.asarray(slow))
