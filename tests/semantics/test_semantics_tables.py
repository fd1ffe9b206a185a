"""Every op has float semantics, field semantics and a degree rule; field.py's arithmetic is exact.

The float interpreter is checked op by op against NumPy; the finite-field
helpers against Python integers and ``galois``; ``evaluate(dtype="native")``
against the rounding each dtype implies.
"""

# Tensors are named like the inputs they stand for (X, W, Q, K, V), as in the math.
# ruff: noqa: N803, N806

from __future__ import annotations

import operator
from fractions import Fraction

import galois
import numpy as np
import pytest
import scipy.special

import eqsat_mirage as em
from eqsat_mirage.ir.ops import NAN_STRICT
from eqsat_mirage.semantics import field
from eqsat_mirage.semantics.field import (
    FIELD_SEMANTICS,
    FieldCtx,
    FieldZeroDivisionError,
    const_mod,
    evaluate_field,
    invmod,
    matmul_mod,
    powmod,
)
from eqsat_mirage.semantics.floating import FLOAT_SEMANTICS, float_ctx
from eqsat_mirage.semantics.interp import run
from eqsat_mirage.semantics.primes import field_primes
from eqsat_mirage.verifier.bound import Degree, node_degree

P, Q = field_primes()


@pytest.fixture(scope="module")
def gf():
    return galois.GF(P, verify=False)


# --- tiny programs, one per op ---------------------------------------------------------------

def _bytes(X):
    """The uint8 input ``B`` (2, 3) of ``X``'s graph (the bit ops' operand)."""
    return X.graph.input("B", (2, 3), "uint8")


# Each entry: op -> (builder over X(2,3), Y(3,2), Z(2,3) positive, numpy reference).
OP_CASES = {
    em.Op.INPUT: (lambda X, Y, Z: X, lambda x, y, z: x),
    em.Op.CONST: (lambda X, Y, Z: X * 2.5, lambda x, y, z: x * 2.5),
    em.Op.NEG: (lambda X, Y, Z: -X, lambda x, y, z: -x),
    em.Op.EXP: (lambda X, Y, Z: em.exp(X), lambda x, y, z: np.exp(x)),
    em.Op.SQRT: (lambda X, Y, Z: em.sqrt(Z), lambda x, y, z: np.sqrt(z)),
    em.Op.RSQRT: (lambda X, Y, Z: em.rsqrt(Z), lambda x, y, z: 1.0 / np.sqrt(z)),
    em.Op.SILU: (lambda X, Y, Z: em.silu(X), lambda x, y, z: x / (1.0 + np.exp(-x))),
    em.Op.RELU: (lambda X, Y, Z: em.relu(X), lambda x, y, z: np.maximum(x, 0.0)),
    em.Op.ADD: (lambda X, Y, Z: X + Z, lambda x, y, z: x + z),
    em.Op.SUB: (lambda X, Y, Z: X - Z, lambda x, y, z: x - z),
    em.Op.MUL: (lambda X, Y, Z: X * Z, lambda x, y, z: x * z),
    em.Op.DIV: (lambda X, Y, Z: X / Z, lambda x, y, z: x / z),
    em.Op.MATMUL: (lambda X, Y, Z: X @ Y, lambda x, y, z: x @ y),
    em.Op.SUM: (lambda X, Y, Z: X.sum(axis=1, keepdims=True),
                lambda x, y, z: x.sum(axis=1, keepdims=True)),
    em.Op.MEAN: (lambda X, Y, Z: X.mean(axis=0), lambda x, y, z: x.mean(axis=0)),
    em.Op.TRANSPOSE: (lambda X, Y, Z: X.T, lambda x, y, z: x.T),
    em.Op.RESHAPE: (lambda X, Y, Z: X.reshape(3, 2), lambda x, y, z: x.reshape(3, 2)),
    em.Op.CONCAT: (lambda X, Y, Z: em.concat([X, Z], 0),
                   lambda x, y, z: np.concatenate([x, z], 0)),
    em.Op.MAX: (lambda X, Y, Z: X.max(axis=1, keepdims=True),
                lambda x, y, z: x.max(axis=1, keepdims=True)),
    em.Op.CAUSAL: (lambda X, Y, Z: em.where(X.graph.causal_mask(2, 3), X, Z),
                   lambda x, y, z: np.where(np.tri(2, 3, 0, dtype=bool), x, z)),
    em.Op.WHERE: (lambda X, Y, Z: em.where(X.graph.causal_mask(2, 3, 1), X, Z),
                  lambda x, y, z: np.where(np.tri(2, 3, 1, dtype=bool), x, z)),
    em.Op.MASK: (lambda X, Y, Z: em.exp(em.where(X.graph.causal_mask(2, 3), X, float("-inf"))),
                 lambda x, y, z: np.exp(np.where(np.tri(2, 3, 0, dtype=bool), x, -np.inf))),
    em.Op.TANH: (lambda X, Y, Z: em.tanh(X), lambda x, y, z: np.tanh(x)),
    em.Op.COS: (lambda X, Y, Z: em.cos(X), lambda x, y, z: np.cos(x)),
    em.Op.SIN: (lambda X, Y, Z: em.sin(X), lambda x, y, z: np.sin(x)),
    em.Op.ERF: (lambda X, Y, Z: em.erf(X), lambda x, y, z: scipy.special.erf(x)),
    em.Op.CAST: (lambda X, Y, Z: X.astype("bfloat16" if X.dtype != "bfloat16" else "float32"),
                 lambda x, y, z: x),
    em.Op.SLICE: (lambda X, Y, Z: X[:, 1:3], lambda x, y, z: x[:, 1:3]),
    em.Op.SIGMOID: (lambda X, Y, Z: em.sigmoid(X), lambda x, y, z: 1.0 / (1.0 + np.exp(-x))),
    em.Op.NOT: (lambda X, Y, Z: em.where(~X.graph.causal_mask(2, 3), X, Z),
                lambda x, y, z: np.where(~np.tri(2, 3, 0, dtype=bool), x, z)),
    # rows of X.T (3, 2) at the index input I (tiny_inputs: IDX; the field draws its own)
    em.Op.GATHER: (lambda X, Y, Z: em.embedding(X.T, X.graph.input("I", (2, 2), "int64")),
                   lambda x, y, z: x.T[IDX]),
    # the comparisons (a bool mask) read by a where
    **{op: ((lambda f: lambda X, Y, Z: em.where(f(X, Z), X, Z))(fn),
            (lambda f: lambda x, y, z: np.where(f(x, z), x, z))(npf))
       for op, fn, npf in ((em.Op.GT, em.gt, np.greater), (em.Op.GE, em.ge, np.greater_equal),
                           (em.Op.LT, em.lt, np.less), (em.Op.LE, em.le, np.less_equal),
                           (em.Op.EQ, em.eq, np.equal), (em.Op.NE, em.ne, np.not_equal))},
    # the bit ops of a uint8 input B (tiny_inputs: BYTES), read through a cast
    em.Op.BITAND: (lambda X, Y, Z: (_bytes(X) & 0xF).astype(X.dtype),
                   lambda x, y, z: (BYTES & 0xF).astype(np.float64)),
    em.Op.SHR: (lambda X, Y, Z: (_bytes(X) >> 4).astype(X.dtype),
                lambda x, y, z: (BYTES >> 4).astype(np.float64)),
    # a comparison and a causal mask combined (issue 52), read by a where
    em.Op.AND: (lambda X, Y, Z: em.where((X > Z) & X.graph.causal_mask(2, 3), X, Z),
                lambda x, y, z: np.where((x > z) & np.tri(2, 3, 0, dtype=bool), x, z)),
    em.Op.OR: (lambda X, Y, Z: em.where((X > Z) | X.graph.causal_mask(2, 3), X, Z),
               lambda x, y, z: np.where((x > z) | np.tri(2, 3, 0, dtype=bool), x, z)),
    # X's elements along axis 1 at the same index input I (torch.gather)
    em.Op.TAKE_ALONG_AXIS: (lambda X, Y, Z: em.take_along_axis(
        X, X.graph.input("I", (2, 2), "int64"), 1),
        lambda x, y, z: np.take_along_axis(x, IDX, 1)),
}
IDX = np.array([[0, 2], [1, 0]])  # the gathers' indices: both extremes of [0, 3)
BYTES = np.array([[0, 255, 16], [15, 0xA5, 128]])  # the bit ops' bytes: both nibbles' ends
OPS = sorted(em.Op, key=lambda o: o.value)
IDS = [op.name.lower() for op in OPS]


def tiny(op: em.Op, dtype: str = "float32") -> tuple[em.Graph, em.Node]:
    """A program whose output is one node of ``op``; returns the graph and that node."""
    if op not in OP_CASES:
        pytest.fail(f"no tiny program for {op}: add one to OP_CASES")
    g = em.Graph(f"tiny_{op.name.lower()}")
    X = g.input("X", (2, 3), dtype=dtype)
    Y = g.input("Y", (3, 2), dtype=dtype)
    Z = g.input("Z", (2, 3), dtype=dtype)
    out = OP_CASES[op][0](X, Y, Z)
    g.output(out if op is not em.Op.INPUT else X * 1.0, "O")
    node = out.node if out.node.op is op else next(n for n in g.nodes() if n.op is op)
    return g, node


def tiny_inputs(seed: int = 0, g: em.Graph | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {"X": rng.standard_normal((2, 3)), "Y": rng.standard_normal((3, 2)),
           "Z": rng.uniform(0.5, 2.0, (2, 3))}
    if g is not None and "I" in g.inputs:  # the gather's index input
        out["I"] = IDX
    if g is not None and "B" in g.inputs:  # the bit ops' bytes
        out["B"] = BYTES
    return out


# The value of the op's node where the tiny program's output is more than it (as OP_CASES).
INNER_NODES = {
    em.Op.CONST: (None, lambda x, y, z: 2.5),
    em.Op.BITAND: (None, lambda x, y, z: (BYTES & 0xF).astype(np.float64)),
    em.Op.SHR: (None, lambda x, y, z: (BYTES >> 4).astype(np.float64)),
    em.Op.CAUSAL: (None, lambda x, y, z: np.tri(2, 3, 0)),
    em.Op.NOT: (None, lambda x, y, z: 1.0 - np.tri(2, 3, 0)),
    em.Op.MASK: (None, lambda x, y, z: np.where(np.tri(2, 3, 0, dtype=bool), x, -np.inf)),
    em.Op.AND: (None, lambda x, y, z: ((x > z) & np.tri(2, 3, 0, dtype=bool)).astype(float)),
    em.Op.OR: (None, lambda x, y, z: ((x > z) | np.tri(2, 3, 0, dtype=bool)).astype(float)),
    **{op: (None, (lambda f: lambda x, y, z: f(x, z).astype(np.float64))(npf))
       for op, npf in ((em.Op.GT, np.greater), (em.Op.GE, np.greater_equal),
                       (em.Op.LT, np.less), (em.Op.LE, np.less_equal), (em.Op.EQ, np.equal),
                       (em.Op.NE, np.not_equal))},
}


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_op_has_float_semantics(op):
    """The table's entry, applied to the op's node and its operands' values, computes the op."""
    g, node = tiny(op)
    inputs = tiny_inputs(g=g)
    ctx = float_ctx(g, inputs, None, False)
    env = run(g, FLOAT_SEMANTICS, ctx, outputs=False)
    got = np.broadcast_to(FLOAT_SEMANTICS[op](ctx, node, *(env[id(s)] for s in node.srcs)),
                          node.shape)
    want = INNER_NODES.get(op, OP_CASES[op])[1]  # the node's value (an input's: x)
    np.testing.assert_allclose(got, want(inputs["X"], inputs["Y"], inputs["Z"]), rtol=1e-13,
                               atol=0)
    np.testing.assert_array_equal(got, np.broadcast_to(env[id(node)], node.shape))


# Ops whose Z_p image is the NumPy reference on the residues (integer arithmetic mod P).
EXACT_IN_FIELD = {em.Op.INPUT, em.Op.NEG, em.Op.ADD, em.Op.SUB, em.Op.MUL, em.Op.MATMUL,
                  em.Op.SUM, em.Op.TRANSPOSE, em.Op.RESHAPE, em.Op.CONCAT, em.Op.SLICE}


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_op_has_field_semantics(op):
    """Over Z_p the table's entry gives residues in [0, P) of the op's shape, a function of
    the inputs (one draw, two runs: the same values); ring ops are integer arithmetic mod P."""
    g, node = tiny(op)
    runs = []
    for _ in range(2):
        ctx = FieldCtx(P, Q, np.random.default_rng(5))
        ctx.inputs = ctx.random_inputs(g)
        runs.append((evaluate_field(g, ctx)["O"][0], ctx))
    (out, ctx), (again, _) = runs
    env = run(g, FIELD_SEMANTICS, ctx, outputs=False)  # the table's entry, applied directly
    direct = FIELD_SEMANTICS[op](ctx, node, *(env[id(s)] for s in node.srcs))
    np.testing.assert_array_equal(np.asarray(direct[0]), np.asarray(env[id(node)][0]))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(env[id(g.outputs["O"])][0]))
    out = np.broadcast_to(np.asarray(out), g.outputs["O"].shape)
    assert out.dtype == np.int64 and np.all((out >= 0) & (out < P))
    np.testing.assert_array_equal(out, np.broadcast_to(np.asarray(again), out.shape))
    if op in EXACT_IN_FIELD:
        x, y, z = (np.asarray(ctx.inputs[n][0]).astype(object) for n in ("X", "Y", "Z"))
        want = np.asarray(OP_CASES[op][1](x, y, z)) % P
        assert np.array_equal(out.astype(object), want)


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_op_has_degree_rule(op):
    _, node = tiny(op)
    d = node_degree(node, [Degree(1, 0, 0) for _ in node.srcs])
    assert isinstance(d, Degree)
    assert d.num >= 0 and d.den >= 0 and d.arg >= 0


def test_degree_rules_on_known_nodes():
    one = Degree(1, 0, 0)

    def deg(op, *ds):  # (num, den, arg): the heights are checked in tests/verifier
        d = node_degree(tiny(op)[1], list(ds))
        return Degree(d.num, d.den, d.arg)

    assert deg(em.Op.INPUT) == one
    assert deg(em.Op.CONST) == Degree(0, 0, 0)
    assert deg(em.Op.MATMUL, one, one) == Degree(2, 0, 0)  # K=3, no den
    assert deg(em.Op.DIV, one, one) == Degree(1, 1, 0)
    assert deg(em.Op.EXP, one) == Degree(1, 0, 1)
    assert deg(em.Op.RSQRT, one) == Degree(0, 1, 0)
    # a & b is a * b, a | b is a + b - a * b: the degrees add (issue 52)
    assert deg(em.Op.AND, one, Degree(2, 0, 1)) == Degree(3, 0, 1)
    assert deg(em.Op.OR, one, Degree(2, 0, 1)) == Degree(3, 0, 1)
    # A sum of 3 fractions with distinct denominators: (num + 2*den) / (3*den).
    assert deg(em.Op.SUM, Degree(1, 1, 0)) == Degree(3, 3, 0)
    # ... and with one denominator along the summed axis: (sum of num) / den.
    assert deg(em.Op.SUM, Degree(1, 1, 0, inv=frozenset({0, 1}))) == Degree(1, 1, 0)


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_float_evaluate_matches_numpy(op):
    g, _ = tiny(op)
    inputs = tiny_inputs(g=g)
    got = em.evaluate(g, inputs)["O"]
    want = OP_CASES[op][1](inputs["X"], inputs["Y"], inputs["Z"])
    assert got.dtype == np.float64 and got.shape == g.outputs["O"].shape
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_float16_native_outputs_are_float16_values(op):
    g, _ = tiny(op, dtype="float16")
    inputs = tiny_inputs(1, g)
    got = em.evaluate(g, inputs, dtype="native")["O"]
    assert np.array_equal(got.astype(np.float16).astype(np.float64), got)
    ref = em.evaluate(g, inputs)["O"]
    np.testing.assert_allclose(got, ref, rtol=1e-2, atol=1e-2)


def test_native_rounds_inputs_and_every_node():
    g = em.Graph("native")
    X = g.input("X", (4,), dtype="float16")
    W = g.input("W", (4, 4), dtype="float16")
    g.output(X * 1.0, "same")
    g.output(em.exp(X @ W) / 3.0, "O")
    x = np.array([0.1, 1 / 3, 1.06, -2.7182818])
    w = np.random.default_rng(0).standard_normal((4, 4)) / 4
    out = em.evaluate(g, {"X": x, "W": w}, dtype="native")
    np.testing.assert_array_equal(out["same"], x.astype(np.float16).astype(np.float64))
    assert np.array_equal(out["O"].astype(np.float16).astype(np.float64), out["O"])
    ref = em.evaluate(g, {"X": x, "W": w})
    assert not np.array_equal(out["O"], ref["O"])  # rounding happened...
    np.testing.assert_allclose(out["O"], ref["O"], rtol=5e-3)  # ...and only rounding


def test_native_mixed_dtypes_promote_to_float32():
    g = em.Graph("mixed")
    a = g.input("A", (3,), dtype="float16")
    b = g.input("B", (3,), dtype="float32")
    c = g.input("C", (3,), dtype="bfloat16")
    g.output(a * b, "AB")
    g.output(c * 1.0, "C1")
    assert g.outputs["AB"].dtype == "float32" and (a * c).dtype == "float32"
    vals = np.array([0.1, 1 / 3, 3.14159])
    out = em.evaluate(g, {"A": vals, "B": vals, "C": vals}, dtype="native")
    ab32 = (vals.astype(np.float16).astype(np.float32) * vals.astype(np.float32))
    np.testing.assert_array_equal(out["AB"], ab32.astype(np.float64))
    bits = out["C1"].astype(np.float32).view(np.uint32)
    assert np.all(bits & 0xFFFF == 0)  # bfloat16: only the top 16 bits of a float32
    np.testing.assert_allclose(out["C1"], vals, rtol=2**-8)


def test_evaluate_with_explicit_dtype_rounds_everything():
    g, _ = tiny(em.Op.MATMUL, dtype="float32")
    inputs = tiny_inputs(2)
    out = em.evaluate(g, inputs, dtype="float16")["O"]
    assert np.array_equal(out.astype(np.float16).astype(np.float64), out)
    out32 = em.evaluate(g, inputs, dtype="fp32")["O"]
    assert np.array_equal(out32.astype(np.float32).astype(np.float64), out32)


# --- field.py: primes, modular helpers, exact matmul -----------------------------------------


@pytest.mark.parametrize("bits", [8, 12, 16, 20, 24, 30])
def test_field_primes(bits):
    p, q = field_primes(bits)
    assert galois.is_prime(p) and galois.is_prime(q)
    assert (p - 1) % q == 0 and (p - 1) // q in (2, 4, 6)
    assert q < 2**bits and p < 2**31
    # q is the largest such prime: no bigger prime below 2**bits has a small k that works
    r = galois.next_prime(q)
    while r < 2**bits:
        assert not any(k * r + 1 < 2**31 and galois.is_prime(k * r + 1) for k in (2, 4, 6))
        r = galois.next_prime(r)


@pytest.mark.parametrize("bits", [7, 31, 64])
def test_field_primes_rejects_bad_bits(bits):
    with pytest.raises(ValueError, match=r"prime_bits must be in \[8, 30\]"):
        field_primes(bits)


def _exact_matmul(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    return np.matmul(a.astype(object), b.astype(object)) % m


@pytest.mark.parametrize("shape_a, shape_b", [((3, 5), (5, 2)), ((1, 1), (1, 1)),
                                              ((2, 4, 7), (7, 3)), ((2, 1, 3, 4), (5, 4, 2)),
                                              ((6,), (6, 3)), ((4, 6), (6,)), ((9,), (9,))])
def test_matmul_mod_matches_python_ints(shape_a, shape_b):
    rng = np.random.default_rng(len(shape_a) * 10 + len(shape_b))
    a = rng.integers(0, P, shape_a, dtype=np.int64)
    b = rng.integers(0, P, shape_b, dtype=np.int64)
    got = matmul_mod(a, b, P)
    want = _exact_matmul(a, b, P)
    assert np.shape(got) == np.shape(want)
    assert np.array_equal(np.asarray(got, dtype=np.int64), np.asarray(want, dtype=np.int64))


def test_matmul_mod_matches_galois(gf):
    rng = np.random.default_rng(7)
    a = rng.integers(0, P, (4, 9), dtype=np.int64)
    b = rng.integers(0, P, (9, 5), dtype=np.int64)
    assert np.array_equal(matmul_mod(a, b, P), np.asarray(gf(a) @ gf(b), dtype=np.int64))


def test_matmul_mod_extreme_residues_at_exact_limit():
    k = field.EXACT_K  # the longest contraction done in one BLAS call
    a = np.full((1, k), P - 1, dtype=np.int64)
    b = np.full((k, 1), P - 1, dtype=np.int64)
    assert int(matmul_mod(a, b, P)[0, 0]) == (k * (P - 1) ** 2) % P


def test_matmul_mod_chunks_long_contractions(gf):
    k = 2**19 + 5
    assert k > field.EXACT_K
    rng = np.random.default_rng(3)
    a = rng.integers(P - 2**20, P, (1, k), dtype=np.int64)  # large residues stress exactness
    b = rng.integers(0, P, (k, 1), dtype=np.int64)
    want = sum(map(operator.mul, a[0].tolist(), b[:, 0].tolist())) % P
    got = matmul_mod(a, b, P)
    assert got.shape == (1, 1) and int(got[0, 0]) == want
    assert int(np.asarray(gf(a[:, :9]) @ gf(b[:9]))[0, 0]) == int(matmul_mod(a[:, :9], b[:9],
                                                                            P)[0, 0])
    # the 1-d right operand and the batched paths chunk too
    assert int(matmul_mod(a[0], b[:, 0], P)) == want
    a2 = np.stack([a, np.flip(a, axis=-1)])  # (2, 1, k)
    got2 = matmul_mod(a2, b, P)
    want2 = sum(map(operator.mul, a2[1, 0].tolist(), b[:, 0].tolist())) % P
    assert got2.shape == (2, 1, 1) and int(got2[0, 0, 0]) == want and int(got2[1, 0, 0]) == want2


def test_invmod():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.integers(1, P, 50), [1, 2, P - 1]]).astype(np.int64)
    inv = invmod(x, P)
    assert np.all((x * inv) % P == 1)
    assert [int(v) for v in inv[:5]] == [pow(int(v), -1, P) for v in x[:5]]
    with pytest.raises(FieldZeroDivisionError):
        invmod(np.array([3, 0, 5], dtype=np.int64), P)
    with pytest.raises(FieldZeroDivisionError):
        invmod(np.array([P], dtype=np.int64), P)


@pytest.mark.parametrize("e", [0, 1, 2, 3, 17, 2**20 + 3, P - 2, P - 1])
def test_powmod(e):
    x = np.random.default_rng(e % 1000).integers(0, P, 20, dtype=np.int64)
    got = powmod(x, e, P)
    assert [int(v) for v in got] == [pow(int(v), e, P) for v in x]


@pytest.mark.parametrize("value", [0.5, 1e-6, 0.0, 1.0, -3.0, 2.5, 1 / 3, -1e-6, 1.0000001,
                                   6.0])
@pytest.mark.parametrize("m", [P, Q])
def test_const_mod_is_the_exact_rational(value, m):
    frac = Fraction(value)
    got = const_mod(value, m)
    assert 0 <= got < m
    assert (got * frac.denominator) % m == frac.numerator % m


def test_const_mod_known_values():
    assert (const_mod(0.5, P) * 2) % P == 1
    assert const_mod(-1.0, P) == P - 1
    assert const_mod(3.0, Q) == 3
    # 1e-6 is not 10**-6 exactly; its image is that of the float, a dyadic rational
    assert const_mod(1e-6, P) != (pow(10**6, -1, P))


def test_exp_table_equals_pow():
    ctx = FieldCtx(P, Q, np.random.default_rng(11))
    omega = ctx.omega
    assert omega not in (0, 1) and pow(omega, Q, P) == 1
    edge = [0, 1, 2**15 - 1, 2**15, 2**15 + 1, Q - 1]
    x = np.concatenate([edge, np.random.default_rng(1).integers(0, Q, 200)]).astype(np.int64)
    assert [int(v) for v in ctx.exp(x)] == [pow(omega, int(v), P) for v in x]
    assert ctx.exp(x.reshape(2, -1)).shape == (2, x.size // 2)


def test_exp_table_small_field():
    p, q = field_primes(8)
    ctx = FieldCtx(p, q, np.random.default_rng(0))
    x = np.arange(q, dtype=np.int64)
    assert [int(v) for v in ctx.exp(x)] == [pow(ctx.omega, int(v), p) for v in x]
    assert len({int(v) for v in ctx.exp(x)}) == q  # omega has order exactly q


# --- field semantics of whole programs -------------------------------------------------------


def _field_run(build, shapes, seed=0):
    g = em.Graph("f")
    ts = [g.input(n, s, dtype="float32") for n, s in shapes.items()]
    for name, t in build(*ts).items():
        g.output(t, name)
    ctx = FieldCtx(P, Q, np.random.default_rng(seed))
    ctx.inputs = ctx.random_inputs(g)
    return evaluate_field(g, ctx), ctx


def test_field_arithmetic_matches_python_ints():
    out, ctx = _field_run(lambda a, b: {"div": a / b, "sub": a - b, "neg": -a,
                                        "mean": a.mean(axis=1), "half": a * 0.5,
                                        "cat": em.concat([a, b], 0).T.reshape(6, 2)},
                          {"A": (2, 3), "B": (2, 3)})
    a, b = ctx.inputs["A"][0], ctx.inputs["B"][0]
    ai, bi = a.astype(object), b.astype(object)
    assert np.array_equal(out["div"][0], (ai * np.vectorize(lambda v: pow(v, -1, P))(bi)) % P)
    assert np.array_equal(out["sub"][0], (ai - bi) % P)
    assert np.array_equal(out["neg"][0], (-ai) % P)
    assert np.array_equal(out["mean"][0], (ai.sum(axis=1) * pow(3, -1, P)) % P)
    assert np.array_equal(out["half"][0], (ai * pow(2, -1, P)) % P)
    assert np.array_equal(out["cat"][0], np.concatenate([a, b], 0).T.reshape(6, 2))
    assert all(v[1] is None for v in out.values())  # no exp: q parts are never computed


def test_field_exp_reads_the_q_part():
    out, ctx = _field_run(lambda x, y: {"E": em.exp(x @ y)}, {"X": (2, 3), "Y": (3, 2)})
    xq, yq = ctx.inputs["X"][1], ctx.inputs["Y"][1]
    arg = matmul_mod(xq, yq, Q)
    assert np.array_equal(out["E"][0], np.vectorize(lambda v: pow(ctx.omega, int(v), P))(arg))
    assert out["E"][1] is None


def test_field_opaque_functions_are_consistent():
    out, _ = _field_run(lambda x: {"one": em.rsqrt(x) * em.sqrt(x),
                                   "s1": em.silu(x), "s2": em.silu(x * 1.0),
                                   "r": em.relu(x), "e": em.exp(em.silu(x))},
                        {"X": (3, 4)})
    assert np.all(out["one"][0] == 1)
    assert np.array_equal(out["s1"][0], out["s2"][0])
    assert not np.array_equal(out["s1"][0], out["r"][0])


@pytest.mark.parametrize("op", sorted(NAN_STRICT, key=lambda o: o.value),
                         ids=lambda o: o.name.lower())
@pytest.mark.parametrize("mode", [None, "native"])
def test_a_nan_strict_op_is_nan_everywhere_on_an_operand_nan_everywhere(op, mode):
    """``ops.NAN_STRICT``, which ``evaluate`` does not compute on an all-NaN operand, holds
    of the float table itself: each operand in turn NaN everywhere, the op's value is NaN
    everywhere (float64 and the native dtypes), and ``evaluate`` gives the same."""
    from eqsat_mirage.semantics.floating import evaluate

    g, node = tiny(op, "float16")
    inputs = tiny_inputs(g=g)
    ctx = float_ctx(g, inputs, mode, False)
    env = run(g, FLOAT_SEMANTICS, ctx, outputs=False)
    operands = [env[id(s)] for s in node.srcs]
    for i, x in enumerate(operands):
        if np.asarray(x).dtype.kind != "f":
            continue
        nan = [np.full(np.shape(y), np.nan) if j == i else y for j, y in enumerate(operands)]
        with np.errstate(all="ignore"):
            got = np.asarray(FLOAT_SEMANTICS[op](ctx, node, *nan), dtype=np.float64)
        assert np.isnan(got).all(), (op, i, got)
    if op is not em.Op.INPUT and node is g.outputs["O"] and node.srcs[0].op is em.Op.INPUT:
        name = node.srcs[0].arg
        got = evaluate(g, {**inputs, name: np.full(g.inputs[name].shape, np.nan)}, dtype=mode)
        assert np.isnan(got["O"]).all() and got["O"].shape == node.shape


@pytest.mark.parametrize("mode", [None, "native"])
def test_a_matmul_whose_every_left_row_holds_a_nan_is_nan_and_not_computed(mode, monkeypatch):
    """One NaN in each row of the left operand (elsewhere finite) makes every sum of the
    product NaN: ``evaluate`` says so without the GEMM, as the table computes it; a row
    without a NaN leaves the GEMM to run."""
    from eqsat_mirage.semantics import floating

    g = em.Graph("rows")
    X = g.input("X", (3, 4), dtype="float16")
    W = g.input("W", (4, 5), dtype="float16")
    g.output(em.silu(X @ W), "O")
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    x[[0, 1, 2], [3, 0, 2]] = np.nan
    ran = []
    real = floating._matmul  # the GEMM behind both tables' matmul entries
    monkeypatch.setattr(floating, "_matmul", lambda *a: ran.append(1) or real(*a))
    table = run(g, floating.FLOAT_SEMANTICS, float_ctx(g, {"X": x, "W": w}, mode, False))
    assert ran == [1] and np.isnan(np.asarray(table["O"], dtype=float)).all()
    got = floating.evaluate(g, {"X": x, "W": w}, dtype=mode)
    assert np.isnan(got["O"]).all() and got["O"].shape == (3, 5) and ran == [1]
    x[1, 0] = 0.5  # row 1 finite: the GEMM runs, and rows 0 and 2 are NaN as it gives them
    got = floating.evaluate(g, {"X": x, "W": w}, dtype=mode)
    assert np.isnan(got["O"][[0, 2]]).all() and np.isfinite(got["O"][1]).all()
    assert ran == [1, 1]
