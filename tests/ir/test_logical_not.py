"""The logical not of a bool mask (``Op.NOT``, issue 52), in every table: its shape rule, the
float interpreter, the finite field, torch, the generated torch and Triton source, egglog and
the verifier (a program whose not is dropped is refused)."""

# Tensors are named like the inputs they stand for (S, M), as in the math.
# ruff: noqa: N806

from __future__ import annotations

import os

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.codegen.tiles import triton_form
from eqsat_mirage.cost.gpucost import ELEMENT_COST
from eqsat_mirage.egraph.op_rules import rules_of
from eqsat_mirage.egraph.rulefiles import builtin_rules_dir
from eqsat_mirage.ir.node import Op, make
from eqsat_mirage.ir.ops import LOGIC, SPECS
from eqsat_mirage.semantics.field import FIELD_SEMANTICS, FieldCtx, evaluate_field
from eqsat_mirage.semantics.primes import field_primes
from eqsat_mirage.testing import rebuild
from eqsat_mirage.verifier.bound import Degree, node_degree

P, Q = field_primes()


def masked_softmax(negate: bool = True, n: int = 6) -> em.Graph:
    """softmax(where(~M, S, -inf)): nanoGPT's ``S.masked_fill(M, -inf)`` with M an input."""
    g = em.Graph("masked_fill")
    S = g.input("S", (2, n, n), "float32")
    M = g.input("M", (n, n), "bool")
    g.output(em.softmax(em.where(~M if negate else M, S, float("-inf"))), "O")
    return g


def test_not_is_declared_once_with_its_facets():
    s = SPECS[Op.NOT]
    assert Op.NOT in LOGIC and s.group == "logic" and s.arity == 1 and s.field == "not"
    assert s.egglog == "Not" and ELEMENT_COST[Op.NOT] == s.cost == (1, 0)
    assert triton_form(s.triton, "m") == "(m == 0)"
    constructors = {"Not": ("T",)}
    shape = rules_of("shape", s, constructors)
    assert len(shape) == 2 and all("(Not x)" in r and "ruleset shapes" in r for r in shape)
    assert rules_of("absval", s, constructors) == [
        '(rule ((= e (Not x)) (= vx (absval x))) ((set (absval e) (AFn "not" vx))) '
        ':ruleset absrules)']
    assert "(Not T)" in (builtin_rules_dir() / "schema.egg").read_text()


def test_not_takes_a_bool_mask_and_keeps_its_shape():
    g = em.Graph("g")
    M = g.input("M", (3, 4), "bool")
    X = g.input("X", (3, 4), "float32")
    assert (~M).node.op is Op.NOT and (~M).shape == (3, 4) and (~M).dtype == "bool"
    assert em.logical_not(M).node.op is Op.NOT
    with pytest.raises(em.DTypeError, match="operand must be a bool mask"):
        make(Op.NOT, (X.node,))
    with pytest.raises(em.GraphError, match="logical_not .*bool mask"):
        em.logical_not(X)
    with pytest.raises(em.DTypeError, match="bool mask"):
        em.exp(~M)


def test_not_evaluates_in_float_and_native_dtypes():
    g = em.Graph("sel")
    A, B = g.input("A", (3, 4), "float16"), g.input("B", (3, 4), "float16")
    M = g.input("M", (3, 4), "bool")
    g.output(em.where(~M, A, B), "O")
    rng = np.random.default_rng(0)
    a, b, m = rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), rng.random((3, 4)) < 0.5
    np.testing.assert_array_equal(em.evaluate(g, {"A": a, "B": b, "M": m})["O"],
                                  np.where(m, b, a))
    got = em.evaluate(g, {"A": a, "B": b, "M": m}, dtype="native")["O"]
    np.testing.assert_array_equal(got, np.where(m, b, a).astype(np.float16).astype(np.float64))


def test_not_in_the_field_is_one_minus_the_mask():
    g = em.Graph("f")
    M = g.input("M", (4, 5), "bool")
    S = g.input("S", (4, 5), "float32")
    causal = g.causal_mask(4, 5)
    g.output(em.where(~M, S, S * 2.0) + em.where(~causal, S, 0.0), "O")
    ctx = FieldCtx(P, Q, np.random.default_rng(3))
    ctx.inputs = ctx.random_inputs(g)
    m = np.asarray(ctx.inputs["M"][0])
    not_m = next(n for n in g.nodes() if n.op is Op.NOT and n.srcs[0] is M.node)
    got = FIELD_SEMANTICS[Op.NOT](ctx, not_m, ctx.inputs["M"])
    np.testing.assert_array_equal(got[0], (1 - m) % P)  # exact: 1 - m, any residue m
    tri = np.tri(4, 5, dtype=np.int64)
    not_c = next(n for n in g.nodes() if n.op is Op.NOT and n.srcs[0] is causal.node)
    np.testing.assert_array_equal(FIELD_SEMANTICS[Op.NOT](ctx, not_c, (tri, tri))[0], 1 - tri)
    s = np.asarray(ctx.inputs["S"][0]).astype(object)
    out = evaluate_field(g, ctx)["O"][0]  # where(~m, s, 2s) = (1 - m) s + m 2s, mod P
    want = ((1 - m.astype(object)) * s + m.astype(object) * 2 * s + (1 - tri) * s) % P
    assert np.array_equal(np.asarray(out).astype(object), want)


def test_not_degree_is_its_masks():
    g = em.Graph("d")
    M = g.input("M", (2, 2), "bool")
    node = (~M).node
    d = node_degree(node, [Degree(1, 0, 0, nbits=0.0)])
    assert (d.num, d.den) == (1, 0) and d.nbits == 1.0  # 1 - m: two unit coefficients


def test_not_in_the_torch_reference_and_generated_torch_source():
    torch = pytest.importorskip("torch")
    from eqsat_mirage.codegen.source import compile_mugraph
    from eqsat_mirage.mugraph.program import from_graph
    from eqsat_mirage.semantics.torch_reference import torch_reference

    g = masked_softmax()
    torch.manual_seed(0)
    S, M = torch.randn(2, 6, 6), torch.rand(6, 6) < 0.4
    M[:, 0] = False  # every row keeps a score
    want = torch.softmax(S.masked_fill(M, float("-inf")), -1)
    torch.testing.assert_close(torch_reference(g)(S=S, M=M)["O"], want)
    fn = compile_mugraph(from_graph(g))  # one library kernel per op: torch.logical_not
    assert "torch.logical_not(" in fn.source
    got = fn(S=S, M=M)
    torch.testing.assert_close(got["O"] if isinstance(got, dict) else got, want)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_not_in_a_triton_kernel():
    torch = pytest.importorskip("torch")
    from eqsat_mirage.codegen.source import compile_mugraph
    from eqsat_mirage.fusion.lower import lower
    from eqsat_mirage.fusion.schedule import Schedule

    g = em.Graph("masked_fill_loop")
    q = g.input("Q", (2, 16, 16), "float32")
    k = g.input("K", (2, 16, 32), "float32")
    v = g.input("V", (2, 32, 16), "float32")
    m = g.input("M", (16, 32), "bool")
    s = em.where(~m, q @ k, float("-inf"))  # -inf where M holds
    e = em.exp(s - s.max(axis=-1, keepdims=True))
    g.output((e @ v) / e.sum(axis=-1, keepdims=True), "O")
    mg = lower(g, Schedule(grid=(("a", 2), ("b", 2)), loop="d", forloop=2))
    assert any(n.op is Op.NOT for k in mg.kernels if k.kind == "custom" for n in k.loop.nodes())
    fn = compile_mugraph(mg)
    assert "== 0)" in fn.source  # the spec's Triton form
    torch.manual_seed(0)
    x = {n: torch.randn(node.shape) for n, node in g.inputs.items() if n != "M"}
    mask = torch.rand(16, 32) < 0.5
    mask[:, 3] = False
    out = fn(**x, M=mask)
    got = out["O"] if isinstance(out, dict) else out
    want = torch.softmax((x["Q"] @ x["K"]).masked_fill(mask, float("-inf")), -1) @ x["V"]
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
    assert em.verify(g, mg, seed=0).equivalent


def test_verify_refuses_a_program_whose_not_is_dropped():
    g = masked_softmax()
    assert em.verify(g, masked_softmax(), seed=0).equivalent
    (neg,) = [n for n in g.nodes() if n.op is Op.NOT]
    dropped = rebuild(g, lambda o, n: n.srcs[0] if o is neg else n, name="dropped")
    assert not any(n.op is Op.NOT for n in dropped.nodes())
    res = em.verify(g, dropped, seed=0)
    assert not res.equivalent and res.counterexample is not None
    # and the other way round: a not added where the program has none
    assert not em.verify(masked_softmax(negate=False), g, seed=1).equivalent


def test_not_round_trips_through_egglog_and_optimizes():
    g = masked_softmax(n=8)
    res = em.optimize(g, cache=False, trials=1, time_limit_s=120, level="kernel")
    assert res.verified.equivalent
    assert any(n.op is Op.NOT for n in res.program.nodes())
