"""Comparisons of computed float tensors (``Op.GT`` ... ``Op.NE``, issue 52), in every table:
the spec and its generated egglog rules, the shape rule, the float and native
interpreters (ties exact), the finite field (a keyed bit of a - b), the bound, the torch
reference and generated torch, a fused Triton kernel (the bit in registers) and the
verifier (a wrong rewrite refused, the ``ties`` draw where the field cannot tell)."""

# Tensors are named like the inputs they stand for (S, X, Y), as in the math.
# ruff: noqa: N806

from __future__ import annotations

import os

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.egraph.op_rules import rules_of
from eqsat_mirage.egraph.rulefiles import builtin_rules_dir
from eqsat_mirage.ir.node import Op, make
from eqsat_mirage.ir.ops import COMPARE, SPECS
from eqsat_mirage.semantics.field import FieldCtx, evaluate_field
from eqsat_mirage.semantics.primes import field_primes
from eqsat_mirage.verifier.bound import COMPARE_CATCH, compared, per_trial_bound
from eqsat_mirage.verifier.floatcheck import float_checks
from eqsat_mirage.verifier.sampling import TIE_STEPS, ties

P, Q = field_primes()
NUMPY = {Op.GT: np.greater, Op.GE: np.greater_equal, Op.LT: np.less, Op.LE: np.less_equal,
         Op.EQ: np.equal, Op.NE: np.not_equal}
FNS = {Op.GT: em.gt, Op.GE: em.ge, Op.LT: em.lt, Op.LE: em.le, Op.EQ: em.eq, Op.NE: em.ne}


def leaky(dtype: str = "float32", swap: bool = False, op: Op = Op.GT) -> em.Graph:
    """where(s OP 0, s, 0.1 s): leaky ReLU by hand (``swap``: the branches exchanged)."""
    g = em.Graph("leaky")
    S = g.input("S", (4, 16), dtype)
    a, b = (S, S * 0.1) if not swap else (S * 0.1, S)
    g.output(em.where(FNS[op](S, 0.0), a, b), "O")
    return g


def gated(op: Op = Op.GT, dtype: str = "float32") -> em.Graph:
    """(x OP y).float() * x."""
    g = em.Graph("gated")
    X, Y = g.input("X", (8, 16), dtype), g.input("Y", (8, 16), dtype)
    g.output(FNS[op](X, Y).astype("float32") * X, "O")
    return g


def test_each_comparison_is_declared_once_with_its_facets():
    assert COMPARE == set(NUMPY)
    constructors = {SPECS[op].egglog: ("T", "T") for op in COMPARE}
    schema = (builtin_rules_dir() / "schema.egg").read_text()
    for op in COMPARE:
        s = SPECS[op]
        assert s.group == "compare" and s.arity == 2 and s.torch == f"torch.{s.name}"
        assert f"({s.egglog} T T)" in schema
        shape = rules_of("shape", s, constructors)  # broadcast, as a binary op's
        assert shape and all(f"({s.egglog} a b)" in r for r in shape)
        assert rules_of("absval", s, constructors) == [
            f"(rule ((= e ({s.egglog} a b)) (= va (absval a)) (= vb (absval b))) "
            f'((set (absval e) (AFn "{s.name}" (AAdd va vb)))) :ruleset absrules)']
        assert rules_of("reg", s, constructors) == []  # a bool mask: no thread-graph Reg


def test_a_comparison_is_a_bool_mask_of_the_broadcast_shape():
    g = em.Graph("g")
    X, R = g.input("X", (3, 4), "float16"), g.input("R", (3, 1), "float32")
    M = g.input("M", (3, 4), "bool")
    for op, fn in FNS.items():
        m = fn(X, R)
        assert m.node.op is op and m.shape == (3, 4) and m.dtype == "bool"
    assert (X > 0).node.op is Op.GT and (X <= 0.5).node.op is Op.LE
    assert (0.5 < X).node.op is Op.GT  # Python's reflected operator
    with pytest.raises(em.DTypeError, match="comparison's operands must be float"):
        make(Op.GT, (M.node, X.node))
    with pytest.raises(em.ShapeError, match="do not broadcast"):
        em.gt(X, g.input("Z", (2, 4), "float32"))
    with pytest.raises(em.DTypeError, match="bool mask"):
        em.exp(X > 0)
    as_float = (X > R).astype("float16")  # a mask as 0/1: where(m, 1, 0), cast
    assert as_float.dtype == "float16" and as_float.node.op is Op.CAST
    assert as_float.node.srcs[0].op is Op.WHERE


@pytest.mark.parametrize("op", sorted(COMPARE, key=lambda o: o.value), ids=lambda o: o.name)
def test_comparisons_evaluate_exactly_at_ties_in_float_and_native(op):
    g = gated(op, "float16")
    rng = np.random.default_rng(0)
    x = rng.integers(-2, 3, (8, 16)) * 0.5
    y = np.where(rng.random((8, 16)) < 0.5, x, rng.standard_normal((8, 16)))  # half ties
    y16 = y.astype(np.float16).astype(np.float64)
    want = NUMPY[op](x, y16) * x
    np.testing.assert_array_equal(em.evaluate(g, {"X": x, "Y": y16})["O"], want)
    native = em.evaluate(g, {"X": x, "Y": y}, dtype="native")["O"]  # y rounded first
    np.testing.assert_array_equal(native, want)


def test_the_field_bit_is_a_keyed_function_of_the_difference():
    g = em.Graph("f")
    X, Y = g.input("X", (64,), "float32"), g.input("Y", (64,), "float32")
    outs = {"gt": X > Y, "shifted": (X + 3.0) > (Y + 3.0), "ge": X >= Y, "lt": Y < X,
            "moved": (X - Y) > 0.0}
    for name, m in outs.items():
        g.output(em.where(m, X, Y), name)
    ctx = FieldCtx(P, Q, np.random.default_rng(5))
    ctx.inputs = ctx.random_inputs(g)
    out = evaluate_field(g, ctx)
    x, y = (np.asarray(ctx.inputs[n][0]).tolist() for n in ("X", "Y"))
    gt = out["gt"][0]
    # where(m, x, y) = y + m (x - y): m recovered from the output, a bit (both values drawn)
    m = [(int(o) - b) * pow(a - b, -1, P) % P for o, a, b in zip(gt.tolist(), x, y)]
    assert set(m) == {0, 1}
    # the same difference, the same bit: x + 3 - (y + 3) and (x - y) - 0 are x - y
    np.testing.assert_array_equal(out["shifted"][0], gt)
    np.testing.assert_array_equal(out["moved"][0], gt)
    # another op, or the operands the other way round: an unrelated bit
    assert not np.array_equal(out["ge"][0], gt) and not np.array_equal(out["lt"][0], gt)


def test_the_bound_counts_a_comparison_as_a_coin():
    assert compared(leaky()) == {"O"}
    eps = per_trial_bound(leaky(), leaky())
    assert eps.value >= 1.0 - COMPARE_CATCH
    g = em.Graph("plain")
    S = g.input("S", (4, 16), "float32")
    g.output(S * 0.1, "O")
    assert compared(g) == set() and per_trial_bound(g, g).value < 1e-4


def test_the_ties_draw_is_on_a_grid_and_the_same_for_every_seed():
    a = ties(0, (32, 32), 0.5)
    assert np.array_equal(a, ties(0, (32, 32), 0.5)) and not np.array_equal(a, ties(1, (32, 32),
                                                                                    0.5))
    assert set(np.unique(a * 2).tolist()) == set(range(-TIE_STEPS, TIE_STEPS + 1))


def step(op: Op) -> em.Graph:
    """where(s OP 0, s + 1, s): a step at exactly 0, which no random normal draw reaches."""
    g = em.Graph("step")
    S = g.input("S", (4, 16), "float16")
    g.output(em.where(FNS[op](S, 0.0), S + 1.0, S), "O")
    return g


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_ties_draw_refuses_greater_for_greater_equal(seed):
    """``x > y`` for ``x >= y`` differs only where x == y: the field refuses it (another
    op), and so do the float checks whatever the seed: the constant draws where both are
    inputs (every input the same value), the ties draw where one is a threshold at 0."""
    res = em.verify(gated(Op.GE), gated(Op.GT), seed=seed)
    assert not res.equivalent
    cex, _ = float_checks(gated(Op.GE), gated(Op.GT), np.random.default_rng(seed), 1e-7, True)
    assert cex is not None
    cex, _ = float_checks(step(Op.GE), step(Op.GT), np.random.default_rng(seed), 1e-7, True)
    assert cex is not None and "k * s" in cex.detail, cex
    cex, _ = float_checks(step(Op.GT), step(Op.GT), np.random.default_rng(seed), 1e-7, True)
    assert cex is None
    # the leaky ReLU is continuous at 0: > and >= agree in floats, the field cannot tell
    cex, _ = float_checks(leaky(op=Op.GE), leaky(), np.random.default_rng(seed), 1e-7, True)
    assert cex is None


def test_verify_refuses_swapped_branches_and_accepts_the_same_program():
    assert em.verify(leaky(), leaky(), seed=0).equivalent
    res = em.verify(leaky(), leaky(swap=True), seed=0)
    assert not res.equivalent and res.counterexample is not None


def test_comparisons_in_the_torch_reference_and_generated_torch_source():
    torch = pytest.importorskip("torch")
    from eqsat_mirage.codegen.source import compile_mugraph
    from eqsat_mirage.mugraph.program import from_graph
    from eqsat_mirage.semantics.torch_reference import torch_reference

    g = gated(Op.LE)
    torch.manual_seed(0)
    X = torch.randint(-2, 3, (8, 16)).float()
    Y = torch.where(torch.rand(8, 16) < 0.5, X, torch.randn(8, 16))
    want = (X <= Y).float() * X
    torch.testing.assert_close(torch_reference(g)(X=X, Y=Y)["O"], want)
    fn = compile_mugraph(from_graph(g))  # one library kernel per op
    assert " <= " in fn.source
    got = fn(X=X, Y=Y)
    torch.testing.assert_close(got["O"] if isinstance(got, dict) else got, want)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_fused_kernel_computes_the_comparison_in_registers(dtype):
    torch = pytest.importorskip("torch")
    g = em.Graph("thresh")
    Qm, K = g.input("Q", (8, 16), dtype), g.input("K", (16, 8), dtype)
    S = Qm @ K
    g.output(em.softmax(em.where(S >= -1.0, S, float("-inf"))), "O")
    res = em.optimize(g, cache=False, trials=1, time_limit_s=120)
    assert res.verified.equivalent
    src = res.triton_source()
    cmp_lines = [line for line in src.splitlines() if " >= -1.0" in line]
    assert cmp_lines and all("tl.store" not in line for line in cmp_lines)
    assert isinstance(res.program, em.MuGraph)
    assert all(t.dtype != "bool" for t in res.program.tensors.values())  # none stored
    torch.manual_seed(0)
    q, k = torch.randn(8, 16).to(getattr(torch, dtype)), torch.randn(16, 8).to(
        getattr(torch, dtype))
    out = res.compile()(Q=q, K=k)
    got = (out["O"] if isinstance(out, dict) else out).float()
    s = q.float() @ k.float()
    want = torch.softmax(s.masked_fill(s < -1.0, float("-inf")), -1)
    tol = 2e-3 if dtype == "float32" else 2e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_a_shape_family_masks_the_padding_a_comparison_may_keep():
    """A family's padded columns hold 0, and ``0 >= -1`` holds: a mask made by a comparison
    keeps them (not -inf), so the softmax over the dynamic axis needs a length mask."""
    from eqsat_mirage.family.padding import padded_graph, plan_masks

    g = em.Graph("thresh_family")
    Qm, K = g.input("Q", (4, 16), "float32"), g.input("K", (16, em.Dim("L", hint=64)), "float32")
    S = Qm @ K
    g.output(em.softmax(em.where(S >= -1.0, S, float("-inf"))), "O")
    plan = plan_masks(g)
    assert plan.masks  # a length mask hides the padding
    padded = padded_graph(plan, {"L": 64}, {"L": 40})
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((4, 16)), rng.standard_normal((16, 40))
    got = em.evaluate(padded, {"Q": q, "K": np.pad(k, ((0, 0), (0, 24)))})["O"][:, :40]
    s = q @ k
    e = np.exp(np.where(s >= -1.0, s, -np.inf) - s.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=-1, keepdims=True), rtol=1e-6)
