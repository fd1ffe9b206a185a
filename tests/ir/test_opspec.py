"""Each op is declared once (ir/ops.py): every op has a spec, every spec the facets its group
needs, and every backend's table has an entry for every op it handles. Sigmoid, the op added
through its spec (docs/architecture.md, "Adding an op"), end to end."""

# Tensors are named like the inputs they stand for (X, W), as in the math.
# ruff: noqa: N806

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.codegen.tiles import triton_form
from eqsat_mirage.cost.gpucost import ELEMENT_COST
from eqsat_mirage.egraph.encode import CTOR_OP, REDUCE_CTOR_OP
from eqsat_mirage.egraph.rulefiles import builtin_rules_dir
from eqsat_mirage.egraph.saturate import ABSTRACT
from eqsat_mirage.family.padding import unary_state
from eqsat_mirage.ir import node as ir_node
from eqsat_mirage.ir.ops import (
    ANY,
    ARITY,
    BINARY,
    COMPARE,
    ELEMENTWISE,
    FINITE,
    GROUPS,
    KEYED,
    LOGIC,
    LOGIC_BINARY,
    NEG_INF,
    OPAQUE,
    REDUCE,
    SPECS,
    UNARY,
    ZERO,
    Op,
    Padding,
)
from eqsat_mirage.semantics.field import FIELD_SEMANTICS
from eqsat_mirage.semantics.floating import FLOAT_SEMANTICS

OPS = sorted(Op, key=lambda o: o.value)
IDS = [op.name.lower() for op in OPS]
STATES = (ZERO, NEG_INF, FINITE, ANY)


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_every_op_has_a_spec_with_every_facet_its_group_needs(op):
    s = SPECS[op]
    assert s.op is op and s.group in GROUPS and s.doc and s.name == op.name.lower()
    assert ARITY[op] == s.arity
    assert s.egglog and re.fullmatch(r"[A-Z][A-Za-z]*", s.egglog)
    assert s.guard or op is Op.INPUT  # an input's abstract expression is its own variable
    assert (s.torch and s.torch.startswith("torch.")) or s.group == "leaf"
    assert len(s.cost) == 2 and all(isinstance(c, int) and c >= 0 for c in s.cost)
    assert all(m in SPECS and SPECS[m].arity == s.arity for m in s.mutants)
    if op in ELEMENTWISE:
        assert callable(s.floats)
        assert s.cost[0] >= 1  # one CUDA-core op at least
    if op in UNARY:
        assert isinstance(s.padding, Padding) and s.padding.zero in STATES \
            and s.padding.neg_inf in STATES
        assert s.triton or op is Op.CAST  # a cast rounds by code (tiles compute in fp32)
    if op in BINARY:
        assert s.symbol in ("+", "-", "*", "/") and s.field in ("add", "sub", "mul", "div")
    if op in COMPARE:  # a bool mask of float operands: an infix operator, no field form
        assert s.symbol in (">", ">=", "<", "<=", "==", "!=") and s.field is None
        assert callable(s.floats) and s.guard == f'(AFn "{s.name}" (AAdd {{0}} {{1}}))'
        assert SPECS[s.mutants[0]].group == "compare"
    if op in LOGIC:  # bool masks to a bool mask: an exact field form (1 - c, a * b, ...)
        assert callable(s.floats) and s.field == s.name and s.arity == (
            2 if op in LOGIC_BINARY else 1)
        assert s.symbol == {Op.AND: "&", Op.OR: "|"}.get(op)  # and, or: an infix operator
        assert not s.mutants or SPECS[s.mutants[0]].group == "logic"
    if s.opaque:  # a random function in the field, a function of one argument
        assert op in UNARY and s.field is None and s.guard == f'(AFn "{s.name}" {{0}})'
    if s.reciprocal_of is not None:
        assert s.opaque and SPECS[s.reciprocal_of].opaque


def test_groups_are_derived_from_the_specs():
    assert set(Op) == set(SPECS)
    assert UNARY == {op for op, s in SPECS.items() if s.group == "unary"}
    assert OPAQUE == {op for op, s in SPECS.items() if s.opaque}
    # a comparison: a keyed bit of a - b; a bit op: a nibble keyed on x
    assert KEYED == OPAQUE | {Op.MAX} | COMPARE | {Op.BITAND, Op.SHR}
    assert COMPARE == {Op.GT, Op.GE, Op.LT, Op.LE, Op.EQ, Op.NE}
    assert ir_node.UNARY is UNARY and ir_node.Op is Op  # node.py re-exports, never redeclares
    assert {Op.SILU, Op.SIGMOID, Op.TANH, Op.ERF, Op.COS, Op.SIN, Op.SQRT, Op.RSQRT} <= OPAQUE
    # a new op goes last (field keys)
    assert Op.TAKE_ALONG_AXIS.value == max(op.value for op in Op)
    assert LOGIC == {Op.NOT, Op.AND, Op.OR} and LOGIC_BINARY == {Op.AND, Op.OR}


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_every_backend_table_has_an_entry(op):
    s = SPECS[op]
    assert callable(FLOAT_SEMANTICS[op]) and callable(FIELD_SEMANTICS[op])
    assert op is Op.INPUT or ABSTRACT[s.egglog] == s.guard  # an input: its own variable
    if s.arg is None and s.group in ("unary", "logic", "binary", "compare", "matmul",
                                     "select"):
        assert CTOR_OP[s.egglog] is op  # decoded by its constructor name
    if op in REDUCE:
        assert REDUCE_CTOR_OP[s.egglog] is op
    if op in ELEMENTWISE | LOGIC:
        assert ELEMENT_COST[op] == s.cost
        assert callable(s.torch_callable())  # the torch reference's function
    if op in UNARY and op is not Op.CAST:
        assert "{x}" in s.triton and triton_form(s.triton, "v0").count("v0") >= 1
        assert all(unary_state(op, st) in STATES + (None,) for st in STATES + (None,))


def test_egglog_schema_declares_every_constructor():
    schema = (builtin_rules_dir() / "schema.egg").read_text()
    for s in SPECS.values():
        assert re.search(rf"\({s.egglog}\b", schema), s.egglog


def test_elementwise_costs_are_unchanged():
    """The cost table the specs replaced, entry for entry (cost/gpucost.py's _ELEM)."""
    old = {Op.EXP: (1, 1), Op.SQRT: (1, 1), Op.RSQRT: (1, 1), Op.DIV: (1, 1), Op.SILU: (3, 2),
           Op.TANH: (4, 2), Op.ERF: (8, 1), Op.COS: (2, 1), Op.SIN: (2, 1)}
    for op in ELEMENTWISE - {Op.SIGMOID}:
        assert ELEMENT_COST[op] == old.get(op, (1, 0)), op


def test_triton_forms_are_the_handwritten_ones():
    """The forms the tile codegen wrote by hand before the specs, byte for byte."""
    a, e = "v3", "tl.exp2({} * 1.4426950408889634)"
    want = {Op.NEG: "-v3", Op.EXP: e.format("v3"), Op.SQRT: "tl.sqrt(v3)",
            Op.RSQRT: "tl.rsqrt(v3)", Op.SILU: f"v3 / (1.0 + {e.format('-v3')})",
            # relu keeps NaN as torch does (issue 51: the hand-written form gave 0 there)
            Op.RELU: "tl.maximum(v3, 0.0, propagate_nan=tl.PropagateNan.ALL)",
            Op.ERF: "tl.erf(v3)", Op.COS: "tl.cos(v3)",
            Op.SIN: "tl.sin(v3)",
            # tanh near 0 by its series (issue 51: the quotient form lost 3e-2 at 1e-7)
            Op.TANH: "tl.where(tl.abs(v3) < 0.05, v3 * (1.0 - v3 * v3 * (1.0 / 3.0 - v3 * v3 "
                     f"* (2.0 / 15.0))), 1.0 - 2.0 / ({e.format('(2.0 * v3)')} + 1.0))",
            Op.SIGMOID: f"1.0 / (1.0 + {e.format('-v3')})"}
    for op, text in want.items():
        assert triton_form(SPECS[op].triton, a) == text, op


# -- sigmoid, the worked example --------------------------------------------------------------


def gate(n: int = 16) -> em.Graph:
    """x * sigmoid(1.702 x) (GELU's sigmoid approximation) feeding a matmul."""
    g = em.Graph("gate")
    X, W = g.input("X", (n, 32), "float32"), g.input("W", (32, 24), "float32")
    g.output((X * em.sigmoid(X * 1.702)) @ W, "O")
    return g


def test_sigmoid_evaluates_like_numpy():
    g = em.Graph("sig")
    X = g.input("X", (3, 5))
    g.output(em.sigmoid(X), "O")
    x = np.linspace(-50.0, 50.0, 15).reshape(3, 5)
    np.testing.assert_allclose(em.evaluate(g, {"X": x})["O"], 1.0 / (1.0 + np.exp(-x)),
                               rtol=1e-12)


def test_sigmoid_is_opaque_and_verifies():
    g = gate()
    assert em.verify(g, gate()).equivalent
    h = em.Graph("gate_silu")  # sigmoid(x) != silu(x): a sound verifier tells them apart
    X, W = h.input("X", (16, 32), "float32"), h.input("W", (32, 24), "float32")
    h.output((X * em.silu(X * 1.702)) @ W, "O")
    assert not em.verify(g, h).equivalent


def test_sigmoid_padding_and_triton_never_overflow_to_nan():
    assert unary_state(Op.SIGMOID, ZERO) == FINITE  # sigmoid(0) = 1/2: padding is not 0
    assert unary_state(Op.SIGMOID, NEG_INF) == ZERO
    x = np.array([-1e4, -100.0, 0.0, 100.0, 1e4], dtype=np.float32)
    with np.errstate(over="ignore"):  # exp2 overflows to inf at -1e4: 1 / inf = 0, not nan
        got = 1.0 / (1.0 + np.exp2(-x * np.float32(1.4426950408889634)))
    np.testing.assert_array_equal(got, [0.0, 0.0, 0.5, 1.0, 1.0])


def test_sigmoid_from_torch():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    for fn in (lambda x: torch.sigmoid(x), lambda x: F.sigmoid(x), lambda x: x.sigmoid(),
               torch.nn.Sigmoid()):
        g = em.from_torch(fn, torch.zeros(2, 3))
        assert {n.op for n in g.nodes()} == {Op.INPUT, Op.SIGMOID}


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_sigmoid_optimized_and_compiled_matches_torch():
    torch = pytest.importorskip("torch")
    g = gate()
    res = em.optimize(g, cache=False, trials=1, time_limit_s=60)
    assert res.verified.equivalent
    fn = res.compile()
    assert "tl.exp2(" in fn.source or "torch.sigmoid(" in fn.source
    gen = torch.Generator().manual_seed(0)
    X, W = torch.randn(16, 32, generator=gen), torch.randn(32, 24, generator=gen) * 0.2
    want = (X * torch.sigmoid(X * 1.702)) @ W
    torch.testing.assert_close(fn(X=X, W=W)["O"], want, rtol=1e-4, atol=1e-5)
