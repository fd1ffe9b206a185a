"""Float safety as part of "verified" (docs/verifier.md, section 5): attacks that are equal
over the reals and unsafe in floating point, each refused with the reason in the result,
by the static checks and, with those off, by the exponent-range draws alone."""

import attention_graphs
import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.verifier.floatcheck import STATIC, float_checks
from eqsat_mirage.verifier.floatsafe import guarded


def add(mod=None, shape=(4, 8)) -> em.Graph:
    g = em.Graph("add")
    x, y = g.input("x", shape, "float32"), g.input("y", shape, "float32")
    if mod == "f16":  # a float16 round trip of x scaled up: inf from |x| = 4
        x = (x * 2.0**14).astype("float16").astype("float32") * 2.0**-14
    elif mod == "bf16":  # a bfloat16 round trip: relative error 4e-3
        x = x.astype("bfloat16").astype("float32")
    g.output(x + y, "out")
    return g


def attention(safe: bool, dtype: str, b=2, m=16, d=64, n=128) -> em.Graph:
    """The shared attention, scores scaled by 1/8 (head dim 64)."""
    return attention_graphs.attention(safe, dtype, b, m, d, n, scale=1.0 / 8.0)


def rmsnorm(upcast: bool, n=64) -> em.Graph:
    g = em.Graph("rms")
    x = g.input("x", (2, n), "float16")
    if upcast:
        xf = x.astype("float32")
        sq = xf * xf
    else:  # squared in float16, then upcast: inf from |x| = 256
        sq = (x * x).astype("float32")
    y = x.astype("float32") * em.rsqrt(sq.mean(axis=-1, keepdims=True) + 1e-6)
    g.output(y.astype("float16"), "y")
    return g


ATTACKS = {
    "f16 round trip in a float32 sum": (add(), add("f16")),
    "bf16 round trip in a float32 sum": (add(), add("bf16")),
    "softmax without its max, float32": (attention(True, "float32"), attention(False, "float32")),
    "softmax without its max, float16": (attention(True, "float16"), attention(False, "float16")),
    "square in float16 where the input upcasts": (rmsnorm(True), rmsnorm(False)),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_is_refused_with_the_reason(name):
    a, b = ATTACKS[name]
    res = em.verify(a, b, seed=0)
    assert not res.equivalent and not res.inconclusive, res
    assert res.counterexample.domain == STATIC, res
    assert "float safety" in res.reason and "computed in" in res.reason or "max" in res.reason


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_is_refused_by_the_draws_alone(name):
    a, b = ATTACKS[name]
    cex, _ = float_checks(a, b, np.random.default_rng(0), 1e-7, True, static=False)
    assert cex is not None and cex.domain == "native dtype", cex


def test_the_attacks_really_are_unsafe():
    x = {"x": np.full((4, 8), 5.0), "y": np.ones((4, 8))}
    assert np.isinf(em.evaluate(add("f16"), x, dtype="native")["out"]).all()
    assert np.isfinite(em.evaluate(add(), x, dtype="native")["out"]).all()
    rng = np.random.default_rng(0)
    qkv = {"Q": rng.normal(0, 10, (2, 16, 64)), "K": rng.normal(0, 10, (2, 64, 128)),
           "V": rng.normal(0, 10, (2, 128, 64))}
    for dt in ("float32", "float16"):
        assert np.isfinite(em.evaluate(attention(True, dt), qkv, dtype="native")["O"]).all()
        assert np.isnan(em.evaluate(attention(False, dt), qkv, dtype="native")["O"]).all()
    big = {"x": np.full((2, 64), 300.0)}
    assert np.isfinite(em.evaluate(rmsnorm(True), big, dtype="native")["y"]).all()
    assert not np.allclose(em.evaluate(rmsnorm(False), big, dtype="native")["y"], 1.0)


def test_the_safe_direction_still_verifies():
    # the candidate may be safer than the input: max-subtracted for bare, upcast for float16
    assert em.verify(attention(False, "float16"), attention(True, "float16"), seed=0)
    assert em.verify(rmsnorm(False), rmsnorm(True), seed=0)
    assert em.verify(add("bf16"), add(), seed=0)


def test_tolerance_comes_from_the_input_program_only():
    # the bf16 round trip is within bfloat16's tolerance but not float32's
    cex, _ = float_checks(add(), add("bf16"), np.random.default_rng(1), 1e-7, True,
                          static=False)
    assert cex is not None and "relative tolerance 0.0001" in cex.detail, cex


def test_guarded_sees_max_subtraction_through_scaling_and_masks():
    g = em.Graph("g")
    s = g.input("s", (2, 8), "float32")
    c = g.input("c", (2, 8), "bool")
    m = em.where(c, s * 0.125, -np.inf)
    e = em.exp(m - m.max(axis=-1, keepdims=True))
    e2 = em.exp(s * 0.125)
    g.output(e + e2, "out")
    exps = [n for n in g.nodes() if n.op.name == "EXP"]
    assert sorted(guarded(n.srcs[0]) for n in exps) == [False, True]


def test_adding_the_negated_max_is_max_subtraction():
    # found by hypothesis: exp(x - max x) against exp(x + (-max x)) was refused statically
    g, h = em.Graph("sub"), em.Graph("addneg")
    for graph in (g, h):
        x = graph.input("x", (3, 8), "float32")
        m = x.max(axis=-1, keepdims=True)
        graph.output(em.exp(x - m) if graph is g else em.exp((-m) + x), "O")
    assert [guarded(n.srcs[0]) for n in h.nodes() if n.op.name == "EXP"] == [True]
    res = em.verify(g, h, seed=0)
    assert res.equivalent, res
    plain = em.Graph("plain")  # adding something that is not a negated max is not
    x = plain.input("x", (3, 8), "float32")
    plain.output(em.exp(x + x.max(axis=-1, keepdims=True)), "O")
    assert [guarded(n.srcs[0]) for n in plain.nodes() if n.op.name == "EXP"] == [False]


@pytest.mark.parametrize("form,want", [
    (lambda x, m: x - (-m), False), (lambda x, m: x + (-m.__neg__()), False),
    (lambda x, m: x - m * (-1.0), False), (lambda x, m: x + (-(m * -1.0)), False),
    (lambda x, m: (x - m) * 0.0, False), (lambda x, m: -(m - x), True),
    (lambda x, m: x + m * (-0.125), True), (lambda x, m: (-m) + x, True),
    (lambda x, m: (x - m) * 0.5, True)])
def test_a_max_added_back_is_no_max_subtraction(form, want):
    """Signs count: s - (-max), s + (-(-max)) and s - max * (-1) are s + max, which
    overflows where s - max cannot; -(max - s) and s + max * (-c) subtract it."""
    g = em.Graph("g")
    x = g.input("x", (3, 8), "float32")
    g.output(em.exp(form(x, x.max(axis=-1, keepdims=True))), "O")
    assert [guarded(n.srcs[0]) for n in g.nodes() if n.op.name == "EXP"] == [want]


def test_exp_of_a_difference_is_not_split_in_float16():
    g, h = em.Graph("sub"), em.Graph("split")
    for graph in (g, h):
        a, b = graph.input("A", (3, 4), "float16"), graph.input("B", (1, 4), "float16")
        graph.output(em.exp(a - b) if graph is g else em.exp(a) / em.exp(b), "O")
    res = em.verify(g, h, seed=0)
    assert not res.equivalent and res.counterexample.domain == "native dtype", res
    assert em.verify(h, g, seed=0)


def test_optimize_refuses_a_float_unsafe_user_rule(tmp_path):
    path = tmp_path / "narrow.egg"
    path.write_text("(ruleset user)\n; narrow\n(rewrite (Mul (Cast t a) (Cast t a)) "
                    "(Cast t (Mul a a)) :ruleset user)\n")
    with pytest.raises(em.RuleError, match="(?s)float-unsafe.*allow_float_unsafe_rules"):
        em.optimize(rmsnorm(True), rules=["rules", str(path)], level="kernel", cache=False,
                    compile_check=False, time_limit_s=30)


def test_a_mugraphs_unused_narrow_input_is_not_a_narrowing():
    """A MuGraph's input tensors are given, not computed: an unused float16 input beside a
    bfloat16 computation is no narrowing (found by the planner's random programs)."""
    from eqsat_mirage.fusion.planner import plan

    g = em.Graph("prog")
    g.input("X0", (1,), "float16")
    x2 = g.input("X2", (1,), "bfloat16")
    g.output(x2 @ x2, "O0")
    assert em.verify(g, plan(g).mugraph, trials=2, seed=1).equivalent


NOMAX = ("(ruleset user)\n; nomax\n(rewrite (Div (Exp (Sub a (Max i a))) "
         "(Sum i (Exp (Sub a (Max i a))))) (Div (Exp a) (Sum i (Exp a))) :ruleset user)\n")


@pytest.mark.parametrize("level", ["kernel", "mugraph"])
def test_optimize_with_a_max_dropping_rule_never_returns_the_unsafe_softmax(tmp_path, level):
    """A user rule that drops softmax's max, allowed with ``allow_float_unsafe_rules`` and the
    built-in guards off: the unsafe softmax is the cheapest candidate (no max, no sub), the
    verifier refuses it (a Graph's exp, or a custom kernel's block exp, is not
    max-subtracted where the input's is) and the result says why; the program returned stays
    finite where the input is. Small sizes: seconds unloaded; the time limit is only a bound."""
    path = tmp_path / "nomax.egg"
    path.write_text(NOMAX)
    g = attention(True, "float32", b=1, m=8, d=16, n=32)
    res = em.optimize(g, rules=["rules", str(path)], guards=False, level=level, cache=False,
                      allow_float_unsafe_rules=True, compile_check=False, time_limit_s=600)
    fired = {r for ph in res.stats["phases"] for r in ph["rules_fired"]}
    assert any(r.startswith("nomax") for r in fired), fired  # the unsafe form was in the e-graph
    assert res.stats.get("rejected"), res.stats
    assert any("not max-subtracted" in why for why in res.stats["rejected"]), res.stats["rejected"]
    assert "rejected by the verifier" in str(res) and "not max-subtracted" in str(res)
    rng = np.random.default_rng(0)
    big = {"Q": rng.normal(0, 10, (1, 8, 16)), "K": rng.normal(0, 10, (1, 16, 32)),
           "V": rng.normal(0, 1, (1, 32, 16))}
    assert np.isfinite(em.evaluate(g, big, dtype="native")["O"]).all()
    unsafe = attention(False, "float32", b=1, m=8, d=16, n=32)
    assert np.isnan(em.evaluate(unsafe, big, dtype="native")["O"]).any()
    assert np.isfinite(em.evaluate(res.program, big, dtype="native")["O"]).all(), res.program


def test_optimize_refuses_a_max_dropping_user_rule_up_front(tmp_path):
    path = tmp_path / "nomax.egg"
    path.write_text(NOMAX)
    with pytest.raises(em.RuleError, match="(?s)nomax.*float-unsafe.*allow_float_unsafe_rules"):
        em.optimize(attention(True, "float32", b=1, m=8, d=16, n=32),
                    rules=["rules", str(path)], guards=False, cache=False,
                    compile_check=False, time_limit_s=600)


def test_the_float64_check_reads_the_static_checks_runs_of_the_same_draw(monkeypatch):
    """The static checks run both programs in float64 on the draw the strict float64 check
    uses (N(0, 1)); that check reads those outputs instead of running them again, and the
    verdicts stay as they were."""
    from eqsat_mirage.verifier import floatcheck

    g, h = em.Graph("a"), em.Graph("b")
    for graph in (g, h):
        x, w = graph.input("x", (4, 8), "float16"), graph.input("w", (8, 3), "float16")
        graph.output(x @ w + 1.0 if graph is g else 1.0 + x @ w, "y")
    seen = []
    real = floatcheck.evaluate
    monkeypatch.setattr(floatcheck, "evaluate",
                        lambda p, inputs, **kw: seen.append((p.name, kw.get("dtype")))
                        or real(p, inputs, **kw))
    cex, native = float_checks(g, h, np.random.default_rng(0), 1e-7, True)
    assert cex is None and native
    float64_runs = [name for name, dtype in seen if dtype is None]
    assert float64_runs.count("b") == len(floatcheck.FLOAT64_SCALES) - 1  # not the first
    bad = em.Graph("b")
    x, w = bad.input("x", (4, 8), "float16"), bad.input("w", (8, 3), "float16")
    bad.output(x @ w + 1.001, "y")
    cex, _ = float_checks(g, bad, np.random.default_rng(0), 1e-7, True)
    assert cex is not None and cex.domain == "float64", cex


def test_a_view_of_a_narrow_value_is_not_a_narrowing():
    """A transpose of a value the input program computes in bfloat16 holds that value: it
    is not refused because its samples, by position, match the float16 input's (found by
    the equivalent-pairs property: (m @ t) against ((t.T @ m.T).T))."""
    g, h = em.Graph("a"), em.Graph("b")
    for graph in (g, h):
        x = graph.input("X0", (2, 2), "float16")
        t = x.T.astype("bfloat16")
        m = -t.max(axis=0, keepdims=True)
        graph.output(-(m @ t) if graph is g else -((t.T @ m.T).T), "O")
    res = em.verify(g, h, trials=2, seed=1)
    assert res.equivalent, res
    plain, narrowed = em.Graph("p"), em.Graph("n")  # a narrowing seen through views: refused
    for graph in (plain, narrowed):
        x = graph.input("X0", (2, 2), "float16")
        y = x if graph is plain else x.astype("bfloat16").T.T.astype("float16")
        graph.output(x.max(axis=0, keepdims=True) @ y, "O")
    bad = em.verify(plain, narrowed, trials=2, seed=1)
    assert not bad.equivalent and "bfloat16" in str(bad), bad


def test_an_exp_of_a_product_of_constants_is_checked_without_error():
    """``guarded`` on exp(c1 * c2) (found by the random-program property of em.optimize:
    stripping a scaling by a constant looked for a non-constant operand that is not
    there): a constant is not a max-subtracted argument, and the check goes on."""
    from eqsat_mirage.ir.node import Node, Op

    c = Node(Op.CONST, (), 0.5, (), "float32")
    prod = Node(Op.MUL, (c, c), None, (), "float32")
    assert guarded(prod) is False
    assert guarded(Node(Op.DIV, (c, c), None, (), "float32")) is False
