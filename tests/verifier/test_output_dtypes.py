"""Issue 51: an output's dtype is part of what a program computes. ``em.verify`` calls two
programs whose outputs differ in dtype not equivalent (the reason names the output and both
dtypes), so ``check_rules`` calls a rule whose sides differ in dtype unsound and
``em.optimize`` refuses it; a scalar computed from constants alone stays weak, as a
constant is, so ``x / c -> x * (1 / c)`` keeps a float16 program float16."""

from __future__ import annotations

import pytest

import eqsat_mirage as em
from eqsat_mirage.ir.node import Node, Op, make


def program(name: str, last_cast: bool) -> em.Graph:
    g = em.Graph(name)
    x = g.input("x", (4, 8), dtype="float16")
    y = em.exp(x.astype("float32"))
    g.output(y.astype("float16") if last_cast else y, "o")
    return g


@pytest.mark.parametrize("seed", [0, 1, None])
def test_outputs_of_another_dtype_are_not_equivalent(seed):
    res = em.verify(program("half", True), program("single", False), seed=seed)
    assert not res.equivalent and not res.inconclusive
    cex = res.counterexample  # the output itself, on every input: its dtype in each
    assert (cex.output, cex.value_a, cex.value_b) == ("o", "float16", "float32")
    assert res.reason == "output 'o' is float16 in 'half' but float32 in 'single'"
    assert "NOT equivalent: output 'o' is float16" in str(res)
    assert em.verify(program("a", True), program("b", True), seed=seed).equivalent


def test_a_rule_that_drops_a_cast_is_unsound(tmp_path):
    path = tmp_path / "cast.egg"
    path.write_text("(ruleset user)\n; drop a cast\n(rewrite (Cast t a) a :ruleset user)\n")
    (r,) = em.check_rules(str(path)).results
    assert r.status == "unsound" and r.verdict == "unsound"
    assert "the sides have different dtypes" in r.message
    with pytest.raises(em.RuleError, match="different dtypes"):
        em.optimize(program("half", True), rules=["rules", str(path)], cache=False)


def test_a_scalar_of_constants_does_not_widen_a_half_tensor():
    g = em.Graph("g")
    g.input("x", (4, 8), dtype="float16")
    x = g.inputs["x"]
    one, c = (Node(Op.CONST, (), v, (), "float32") for v in (1.0, 4.0))
    assert make(Op.MUL, (x, make(Op.DIV, (one, c)))).dtype == "float16"
    assert make(Op.MUL, (x, make(Op.CAST, (c,), "float32"))).dtype == "float32"  # cast: strong
    assert make(Op.DIV, (one, c)).dtype == "float32"
