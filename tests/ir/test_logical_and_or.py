"""The logical and / or of bool masks (``Op.AND``, ``Op.OR``, issue 52), in every table: their
shape rule (broadcasting), the builder's ``&`` / ``|`` (the int8 bit op kept), the float
interpreter, the finite field (a * b, a + b - a * b), the degree bound, torch, the generated
torch and Triton source, egglog, the mutation table and the verifier."""

# Tensors are named like the inputs they stand for (S, M), as in the math.
# ruff: noqa: N806

from __future__ import annotations

import os
import random

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.cost.gpucost import ELEMENT_COST
from eqsat_mirage.egraph.op_rules import rules_of
from eqsat_mirage.egraph.rulefiles import builtin_rules_dir
from eqsat_mirage.ir.node import Op, make
from eqsat_mirage.ir.ops import LOGIC, LOGIC_BINARY, SPECS
from eqsat_mirage.semantics.field import FIELD_SEMANTICS, FieldCtx, evaluate_field
from eqsat_mirage.semantics.primes import field_primes
from eqsat_mirage.testing import mutate
from eqsat_mirage.verifier.bound import Degree, node_degree

P, Q = field_primes()


def masked(combine, n: int = 6) -> em.Graph:
    """softmax(where(combine(M, N), S, -inf)) of a (n, n) and a (n,) bool mask input."""
    g = em.Graph("combined")
    S = g.input("S", (2, n, n), "float32")
    M, N = g.input("M", (n, n), "bool"), g.input("N", (n,), "bool")
    g.output(em.softmax(em.where(combine(M, N), S, float("-inf"))), "O")
    return g


def _mask_feed(n: int = 6, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of ``masked``: every row keeps column 0 under both and and or."""
    rng = np.random.default_rng(seed)
    m, k = rng.random((n, n)) < 0.6, rng.random(n) < 0.6
    m[:, 0] = k[0] = True
    return {"S": rng.standard_normal((2, n, n)), "M": m, "N": k}


def test_and_or_are_declared_once_with_their_facets():
    assert LOGIC_BINARY == {Op.AND, Op.OR} <= LOGIC
    constructors = {"And": ("T", "T"), "Or": ("T", "T")}
    schema = (builtin_rules_dir() / "schema.egg").read_text()
    for op, ctor, sym in ((Op.AND, "And", "&"), (Op.OR, "Or", "|")):
        s = SPECS[op]
        assert s.group == "logic" and s.arity == 2 and s.field == s.name and s.symbol == sym
        assert s.egglog == ctor and ELEMENT_COST[op] == s.cost == (1, 0)
        assert s.mutants == ({Op.AND: Op.OR, Op.OR: Op.AND}[op],)
        assert f"({ctor} T T)" in schema
        shape = rules_of("shape", s, constructors)  # broadcast: the rank, each operand's dims
        assert len(shape) == 3 and "(max ra rb)" in shape[0]
        assert all(f"({ctor} a b)" in r and "ruleset shapes" in r for r in shape)
        assert rules_of("absval", s, constructors) == [
            f'(rule ((= e ({ctor} a b)) (= va (absval a)) (= vb (absval b))) '
            f'((set (absval e) (AFn "{s.name}" (AAdd va vb)))) :ruleset absrules)']


def test_and_or_take_bool_masks_and_broadcast():
    g = em.Graph("g")
    M, N = g.input("M", (3, 4), "bool"), g.input("N", (4,), "bool")
    X = g.input("X", (3, 4), "float32")
    W = g.input("W", (3, 4), "uint8")
    for t, op in ((M & N, Op.AND), (M | N, Op.OR), (em.logical_and(N, M), Op.AND),
                  (em.logical_or(M, N), Op.OR), ((X > 0) & M, Op.AND)):
        assert t.node.op is op and t.shape == (3, 4) and t.dtype == "bool"
    assert (W & 0xF).node.op is Op.BITAND and (0xF & W).node.op is Op.BITAND  # still a bit op
    with pytest.raises(em.DTypeError, match="operands must be bool masks, got bool, float32"):
        make(Op.AND, (M.node, X.node))
    # the builder names the op, both operands and their shapes
    with pytest.raises(em.DTypeError, match=r"& .*bool masks.*'M'.*bool \(3, 4\).*'X'.*"
                                            r"float32 \(3, 4\)"):
        M & X  # noqa: B018
    with pytest.raises(em.DTypeError, match=r"\| .*'X'.*float32 \(3, 4\).*'M'"):
        X | M  # noqa: B018
    with pytest.raises(em.DTypeError, match="logical_or .*int 1"):
        em.logical_or(M, 1)
    with pytest.raises(em.DTypeError, match="& .*uint8"):
        W & M  # noqa: B018
    with pytest.raises(em.ShapeError, match="do not broadcast"):
        M & g.input("K", (3,), "bool")  # noqa: B018
    with pytest.raises(em.DTypeError, match="bool mask"):
        em.exp(M & N)


def test_and_or_evaluate_in_float_and_native_dtypes():
    g = em.Graph("sel")
    A, B = g.input("A", (3, 4), "float16"), g.input("B", (3, 4), "float16")
    M, N = g.input("M", (3, 4), "bool"), g.input("N", (4,), "bool")
    g.output(em.where(M & N, A, B), "AND")
    g.output(em.where(M | (A > B), A, B), "OR")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    m, k = rng.random((3, 4)) < 0.5, rng.random(4) < 0.5
    feed = {"A": a, "B": b, "M": m, "N": k}
    want = {"AND": np.where(m & k, a, b), "OR": np.where(m | (a > b), a, b)}
    for dtype in (None, "native"):
        out = em.evaluate(g, feed, dtype=dtype)
        for name, w in want.items():
            np.testing.assert_array_equal(out[name], w.astype(np.float16).astype(np.float64)
                                          if dtype else w)


def test_and_or_in_the_field_are_multilinear():
    g = em.Graph("f")
    M, N = g.input("M", (4, 5), "bool"), g.input("N", (5,), "bool")
    S = g.input("S", (4, 5), "float32")
    causal = g.causal_mask(4, 5)
    g.output(em.where(M & N, S, 0.0) + em.where(M | causal, S, 0.0), "O")
    ctx = FieldCtx(P, Q, np.random.default_rng(3))
    ctx.inputs = ctx.random_inputs(g)
    m, k = (np.asarray(ctx.inputs[n][0]).astype(object) for n in ("M", "N"))
    tri = np.tri(4, 5, dtype=np.int64).astype(object)
    and_node = next(n for n in g.nodes() if n.op is Op.AND)
    got = FIELD_SEMANTICS[Op.AND](ctx, and_node, ctx.inputs["M"], ctx.inputs["N"])[0]
    assert np.array_equal(np.asarray(got).astype(object), (m * k) % P)  # any residues
    s = np.asarray(ctx.inputs["S"][0]).astype(object)
    want = ((m * k) * s + (m + tri - m * tri) * s) % P
    assert np.array_equal(np.asarray(evaluate_field(g, ctx)["O"][0]).astype(object), want)
    # on 0/1 values (comparisons' bits, causal masks) they are and / or exactly
    a, b = np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])
    ctx = FieldCtx(P, Q, np.random.default_rng(4))
    causal = make(Op.CAUSAL, (), (2, 2, 0))
    for op, table in ((Op.AND, [0, 0, 0, 1]), (Op.OR, [0, 1, 1, 1])):
        out = FIELD_SEMANTICS[op](ctx, make(op, (causal, causal)), (a, a), (b, b))
        np.testing.assert_array_equal(out[0], table)


def test_and_or_degrees_add():
    g = em.Graph("d")
    M, N = g.input("M", (2, 2), "bool"), g.input("N", (2, 2), "bool")
    one = Degree(1, 0, 0, nbits=0.0)
    d_and = node_degree((M & N).node, [one, one])
    d_or = node_degree((M | N).node, [one, Degree(2, 0, 0, nbits=1.0)])
    assert (d_and.num, d_and.den, d_and.nbits) == (2, 0, 0.0)  # a * b
    assert (d_or.num, d_or.den) == (3, 0) and d_or.nbits >= np.log2(4.0)  # a + b - a * b


def test_and_or_in_the_torch_reference_and_generated_torch_source():
    torch = pytest.importorskip("torch")
    from eqsat_mirage.codegen.source import compile_mugraph
    from eqsat_mirage.mugraph.program import from_graph
    from eqsat_mirage.semantics.torch_reference import torch_reference

    feed = _mask_feed()
    S, M, N = (torch.from_numpy(feed[k]) for k in ("S", "M", "N"))
    S = S.float()
    for combine, tfn in ((lambda a, b: a & b, torch.logical_and),
                         (lambda a, b: a | b, torch.logical_or)):
        g = masked(combine)
        want = torch.softmax(S.masked_fill(~tfn(M, N), float("-inf")), -1)
        torch.testing.assert_close(torch_reference(g)(S=S, M=M, N=N)["O"], want)
        fn = compile_mugraph(from_graph(g))  # one library kernel per op: torch.logical_*
        assert f"{tfn.__name__}(" in fn.source
        got = fn(S=S, M=M, N=N)
        torch.testing.assert_close(got["O"] if isinstance(got, dict) else got, want)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_and_or_in_a_triton_kernel():
    torch = pytest.importorskip("torch")
    from eqsat_mirage.codegen.source import compile_mugraph
    from eqsat_mirage.fusion.lower import lower
    from eqsat_mirage.fusion.schedule import Schedule

    g = em.Graph("combined_loop")
    q = g.input("Q", (2, 16, 16), "float32")
    k = g.input("K", (2, 16, 32), "float32")
    v = g.input("V", (2, 32, 16), "float32")
    m, n = g.input("M", (16, 32), "bool"), g.input("N", (32,), "bool")
    s0 = q @ k
    s = em.where((m & n) | (s0 > 2.0), s0, float("-inf"))
    e = em.exp(s - s.max(axis=-1, keepdims=True))
    g.output((e @ v) / e.sum(axis=-1, keepdims=True), "O")
    mg = lower(g, Schedule(grid=(("a", 2), ("b", 2)), loop="d", forloop=2))
    ops = {n.op for k in mg.kernels if k.kind == "custom" for n in k.loop.nodes()}
    assert {Op.AND, Op.OR} <= ops
    fn = compile_mugraph(mg)
    assert " & " in fn.source and " | " in fn.source  # on int1 blocks
    torch.manual_seed(0)
    x = {name: torch.randn(node.shape) for name, node in g.inputs.items() if name in "QKV"}
    mask, keys = torch.rand(16, 32) < 0.5, torch.rand(32) < 0.5
    mask[:, 3] = keys[3] = True
    out = fn(**x, M=mask, N=keys)
    got = out["O"] if isinstance(out, dict) else out
    s0 = x["Q"] @ x["K"]
    want = torch.softmax(s0.masked_fill(~((mask & keys) | (s0 > 2.0)), float("-inf")), -1) \
        @ x["V"]
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
    assert em.verify(g, mg, seed=0).equivalent


def test_verify_tells_and_from_or_and_knows_de_morgan():
    # a & b against a | b: refused, with a counterexample
    res = em.verify(masked(lambda a, b: a & b), masked(lambda a, b: a | b), seed=0)
    assert not res.equivalent and res.counterexample is not None
    # commutativity and De Morgan's laws hold as polynomials: accepted
    assert em.verify(masked(lambda a, b: a & b), masked(lambda a, b: b & a), seed=0).equivalent
    assert em.verify(masked(lambda a, b: ~(a & b)), masked(lambda a, b: ~a | ~b),
                     seed=1).equivalent
    assert em.verify(masked(lambda a, b: ~(a | b)), masked(lambda a, b: ~a & ~b),
                     seed=2).equivalent


def test_check_rules_reads_and_or_operands_as_masks(tmp_path):
    rules = tmp_path / "masks.egg"
    rules.write_text("(ruleset masks)\n"
                     "; and commutes\n(rewrite (And a b) (And b a) :ruleset masks)\n"
                     "; De Morgan\n(rewrite (Not (And a b)) (Or (Not a) (Not b)) :ruleset masks)\n"
                     "; and for or\n(rewrite (And a b) (Or a b) :ruleset masks)\n")
    report = em.check_rules(str(rules))
    assert [c.status for c in report.results] == ["sound", "sound", "unsound"]
    assert "a: " in str(report) and "bool" in str(report)  # the masks drawn as bool inputs


def test_a_mutant_swaps_and_for_or():
    g = em.Graph("sel")
    S = g.input("S", (4, 6), "float32")
    M, N = g.input("M", (4, 6), "bool"), g.input("N", (6,), "bool")
    g.output(em.where(M & N, S, S * 2.0), "O")
    seen = set()
    for seed in range(12):
        mutant = mutate(g, random.Random(seed))
        if mutant is not None:
            seen |= {n.op for n in mutant.nodes()}
            assert not em.verify(g, mutant, seed=seed, trials=2).equivalent
    assert Op.OR in seen


def test_and_or_round_trip_through_egglog_and_optimize():
    g = masked(lambda a, b: ~a | b, n=8)
    res = em.optimize(g, cache=False, trials=1, time_limit_s=120, level="kernel")
    assert res.verified.equivalent
    assert any(n.op is Op.OR for n in res.program.nodes())
    feed = _mask_feed(8)
    np.testing.assert_allclose(em.evaluate(res.program, feed)["O"], em.evaluate(g, feed)["O"])
