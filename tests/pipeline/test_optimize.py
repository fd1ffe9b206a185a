"""``em.optimize``: known wins, user rule files, random programs, guards on and off.

Run with ``pytest -s`` to see the figures (costs, e-nodes with guards on/off).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

import eqsat_mirage as em
from bench.programs import program
from eqsat_mirage.cost.per_op import Hardware, graph_cost_us, node_cost_us
from eqsat_mirage.egraph.extract import _selected, _tree_best, decode
from eqsat_mirage.egraph.rulefiles import Schema, load_rules
from eqsat_mirage.egraph.saturate import DEFAULT_PHASES, Limits, Saturator
from eqsat_mirage.egraph.view import view
from eqsat_mirage.ir.node import Op
from eqsat_mirage.pipeline.options import DEFAULT_SPLITS
from eqsat_mirage.pipeline.search import candidate_splits
from eqsat_mirage.testing import programs

HW = Hardware.load("h100")


def ops(g: em.Graph) -> list[Op]:
    return [n.op for n in g.nodes()]


def assert_win(g: em.Graph, res: em.OptimizeResult) -> None:
    assert res.verified is not None and res.verified.equivalent, res.verified
    assert em.verify(g, res.program, trials=2, seed=7).equivalent
    assert res.cost_us < res.baseline_cost_us
    assert res.cost_us == pytest.approx(graph_cost_us(res.program, HW))
    assert res.baseline_cost_us == pytest.approx(graph_cost_us(g, HW))
    assert res.candidates and res.cost_us == pytest.approx(res.candidates[0].cost_us)
    print(f"\n{g.name}: {res.baseline_cost_us:.2f} us -> {res.cost_us:.2f} us, "
          f"{res.stats['enodes']} e-nodes")


def test_exported():
    assert em.optimize is not None and "optimize" in em.__all__
    assert "OptimizeResult" in em.__all__ and em.OptimizeResult is not None


# ---------------------------------------------------------------- matmul chains

N = 1024  # big enough for the association to matter, small enough to verify quickly


def test_reassociates_to_the_right():
    """(A@B)@C with a thin C: A@(B@C) never forms the N x N product."""
    g = em.Graph("left_written")
    a, b, c = g.input("A", (N, N)), g.input("B", (N, N)), g.input("C", (N, 16))
    g.output((a @ b) @ c, "O")
    res = em.optimize(g, level="kernel")
    assert_win(g, res)
    out = res.program.outputs["O"]
    assert out.op is Op.MATMUL and ops(res.program).count(Op.MATMUL) == 2
    assert out.srcs[0] is res.program.inputs["A"]
    inner = out.srcs[1]
    assert inner.op is Op.MATMUL and inner.shape == (N, 16)
    assert inner.srcs == (res.program.inputs["B"], res.program.inputs["C"])


def test_reassociates_to_the_left():
    """A@(B@C) with a thin A: (A@B)@C never forms the N x N product."""
    g = em.Graph("right_written")
    a, b, c = g.input("A", (16, N)), g.input("B", (N, N)), g.input("C", (N, N))
    g.output(a @ (b @ c), "O")
    res = em.optimize(g, level="kernel")
    assert_win(g, res)
    out = res.program.outputs["O"]
    assert out.op is Op.MATMUL and ops(res.program).count(Op.MATMUL) == 2
    assert out.srcs[1] is res.program.inputs["C"]
    inner = out.srcs[0]
    assert inner.op is Op.MATMUL and inner.shape == (16, N)
    assert inner.srcs == (res.program.inputs["A"], res.program.inputs["B"])


def test_cheap_association_is_kept():
    g = em.Graph("already_best")
    a, b, c = g.input("A", (N, N)), g.input("B", (N, N)), g.input("C", (N, 16))
    g.output(a @ (b @ c), "O")
    res = em.optimize(g, level="kernel")
    assert res.cost_us == pytest.approx(res.baseline_cost_us)
    assert res.verified.equivalent
    assert res.program.outputs["O"].srcs[1].op is Op.MATMUL


# ---------------------------------------------------------------- benchmarks

def test_gqa_division_moves_after_the_second_matmul(monkeypatch):
    import bench.programs

    monkeypatch.setattr(bench.programs, "DTYPE", "float32")  # float16: see the next test
    g = program("gqa", 1)
    res = em.optimize(g, level="kernel")
    assert_win(g, res)
    out = res.program.outputs["O"]
    # O = (A @ V) / sum(A): the division by the row sums happens on the small result
    assert out.op is Op.DIV
    num, den = out.srcs
    assert num.op is Op.MATMUL and num.srcs[1] is res.program.inputs["V"]
    assert den.op is Op.SUM and den.shape == (2, 256, 1)
    assert ops(res.program).count(Op.EXP) == 1  # exp(Q@K) is shared by both uses


def test_gqa_division_stays_before_the_matmul_in_float16():
    """(A @ V) / sum(A) overflows in float16 where the input does not: refused, reported."""
    g = program("gqa", 1)
    messages: list[str] = []
    res = em.optimize(g, level="kernel", progress=messages.append, cache=False)
    assert res.verified.equivalent
    assert res.program.outputs["O"].op is Op.MATMUL
    assert any("native dtype" in m and "non-finite" in m for m in messages), messages


def lora_concat_candidate(g: em.Graph):
    """Saturate LoRA and extract the cheapest program whose root is a matmul of concats."""
    rulesets, rules = load_rules(["rules"])
    sat = Saturator(g, rulesets, rules, guards=True, splits=candidate_splits(g, DEFAULT_SPLITS))
    sat.run_phase("algebraic", DEFAULT_PHASES[0][1], Limits())
    data = sat.serialize()
    roots = sat.root_classes(data)
    ev = view(data, Schema.load().constructors, g.inputs, HW)
    cat = {en.eclass for en in ev.nodes.values() if en.ctor == "Concat"}
    root = roots["O"]
    concat_form = [k for k in ev.classes[root] if ev.nodes[k].ctor == "MatMul"
                   and all(c in cat for c in ev.nodes[k].children)]
    assert concat_form, "the e-graph holds no matmul of concats for LoRA"
    banned = frozenset(k for k in ev.classes[root] if k not in concat_form)
    sel = _selected(ev, _tree_best(ev, banned), [root])
    assert sel is not None
    return decode(ev, sel, roots, g, "lora_concat"), sat


def test_lora_concat_form_is_in_the_egraph():
    g = program("lora", 1)
    prog, sat = lora_concat_candidate(g)
    assert Op.CONCAT in ops(prog)
    out = prog.outputs["O"]
    assert out.op is Op.MATMUL and all(s.op is Op.CONCAT for s in out.srcs)
    assert em.verify(g, prog, trials=3, seed=0).equivalent
    fired = sat.stats[-1].rules_fired
    assert any(name.startswith("LoRA:") for name in fired), fired
    res = em.optimize(g, level="kernel")
    assert res.verified.equivalent and res.cost_us <= res.baseline_cost_us
    concat_cost = graph_cost_us(prog, HW)
    print(f"\nlora: baseline {res.baseline_cost_us:.2f} us, chosen {res.cost_us:.2f} us "
          f"({ops(res.program).count(Op.MATMUL)} matmuls), concat form {concat_cost:.2f} us; "
          f"candidates: {[round(c.cost_us, 2) for c in res.candidates]}")
    print(prog)
    # the chosen program is the cheapest the model knows; the concat form is no cheaper
    assert res.cost_us <= concat_cost + 1e-9


def test_repeated_subexpression_is_paid_once():
    g = em.Graph("shared")
    x, w = g.input("X", (64, 2048)), g.input("W", (2048, 2048))
    p = x @ w
    g.output(em.silu(p) * em.relu(p), "O")
    res = em.optimize(g, level="kernel")
    assert res.verified.equivalent
    assert ops(res.program).count(Op.MATMUL) == 1
    assert res.cost_us == pytest.approx(sum(node_cost_us(n, HW) for n in res.program.nodes()))
    assert res.cost_us <= res.baseline_cost_us + 1e-9


def test_non_lax_program_is_returned_unchanged():
    g = em.Graph("twice_exp")
    x = g.input("X", (4, 4))
    g.output(em.exp(em.exp(x)) @ x, "O")
    res = em.optimize(g, level="kernel", partition=False)  # searched as one piece
    assert res.verified is None and "not a Lax program" in res.stats["note"]
    assert res.cost_us == res.baseline_cost_us
    assert str(res.program).split("\n", 1)[1] == str(g).split("\n", 1)[1]
    res = em.optimize(g, level="kernel")  # partitioned: each piece is Lax
    assert [p["ops"] for p in res.stats["pieces"]] == [["exp"], ["exp", "matmul"]]
    assert res.cost_us <= res.baseline_cost_us
    if any(p["status"] == "optimized" for p in res.stats["pieces"]):
        assert res.verified.equivalent
    else:  # nothing cheaper: the input comes back, claiming no verdict, and says why
        assert res.verified is None and "no piece optimized" in res.stats["note"]


def test_unknown_target():
    g = em.Graph("g")
    g.output(em.exp(g.input("X", (2, 2))), "O")
    with pytest.raises(em.MirageError, match="unknown target 'tpu9'"):
        em.optimize(g, target="tpu9")


def test_stats_and_str():
    g = program("gqa", 1)
    res = em.optimize(g, level="kernel", k=2)
    st = res.stats
    for key in ("target", "guards", "rules", "saturate_seconds", "phases", "enodes",
                "candidates", "candidates_tried", "seconds", "tensor_enodes", "eclasses"):
        assert key in st, key
    assert [p["name"] for p in st["phases"]] == ["guards", "algebraic"]
    assert len(res.candidates) <= 2
    assert res.speedup == pytest.approx(res.baseline_cost_us / res.cost_us)
    text = str(res)
    assert "phase algebraic" in text and "us ->" in text


# ---------------------------------------------------------------- user rule files

def user_file(tmp_path, body: str, name: str = "mine.egg") -> str:
    path = tmp_path / name
    path.write_text("(ruleset user)\n" + body)
    return str(path)


def test_unsound_user_rule_is_refused(tmp_path):
    path = user_file(tmp_path, "; exp of a sum is a sum of exps\n"
                               "(rewrite (Exp (Add a b)) (Add (Exp a) (Exp b)) :ruleset user)\n")
    g = em.Graph("g")
    x, y = g.input("X", (2, 3)), g.input("Y", (2, 3))
    g.output(em.exp(x + y), "O")
    with pytest.raises(em.RuleError) as info:
        em.optimize(g, rules=["rules", path])
    msg = str(info.value)
    assert f"{path}:3" in msg and "exp of a sum is a sum of exps" in msg, msg
    assert "unsound" in msg


def test_sound_user_rule_is_accepted_and_fires(tmp_path):
    path = user_file(tmp_path, "; subtraction is addition of a negation\n"
                               "(rewrite (Sub a b) (Add a (Neg b)) :ruleset user)\n")
    g = em.Graph("g")
    x, y = g.input("X", (8, 16)), g.input("Y", (16, 4))
    g.output(x @ y - (x @ y) * 2.0, "O")
    res = em.optimize(g, level="kernel", rules=["rules", path])
    assert res.verified.equivalent
    phases = {p["name"]: p for p in res.stats["phases"]}
    assert "user" in phases, list(phases)
    fired = phases["user"]["rules_fired"]
    assert any("subtraction is addition of a negation [mine.egg:3]" == k for k in fired), fired
    assert res.stats["rules"] == len(load_rules(["rules"])[1]) + 1


def test_user_rules_alone(tmp_path):
    """Only the user's file: the algebraic phase has nothing to run."""
    path = user_file(tmp_path, "; double negation\n(rewrite (Neg (Neg a)) a :ruleset user)\n")
    g = em.Graph("g")
    x = g.input("X", (64, 64))
    neg = -x
    g.output(-neg + x, "O")
    res = em.optimize(g, level="kernel", rules=[path])
    assert [p["name"] for p in res.stats["phases"]] == ["guards", "user"]
    assert res.verified.equivalent
    assert Op.NEG not in ops(res.program)
    assert res.cost_us < res.baseline_cost_us


# ---------------------------------------------------------------- random programs

PROPS = settings(max_examples=25, deadline=None, derandomize=True,
                 suppress_health_check=list(HealthCheck))


@PROPS
@given(programs(max_ops=6))
def test_optimize_random_programs(g):
    on = em.optimize(g, level="kernel", time_limit_s=5, iter_limit=6)
    off = em.optimize(g, level="kernel", guards=False, time_limit_s=5, iter_limit=6)
    for res in (on, off):
        assert res.verified is not None and res.verified.equivalent, (str(g), str(res.program))
        assert em.verify(g, res.program, trials=2, seed=3).equivalent
        assert res.cost_us <= res.baseline_cost_us + 1e-9
        assert res.cost_us == pytest.approx(graph_cost_us(res.program, HW))
    # guards only prune: without them the search space is a superset (within the limits)
    assert off.cost_us <= on.cost_us + 1e-9, (str(g), off.cost_us, on.cost_us)


# ---------------------------------------------------------------- guards

def test_guards_on_and_off_gqa(monkeypatch):
    import bench.programs

    monkeypatch.setattr(bench.programs, "DTYPE", "float32")  # float16: nothing safe is cheaper
    g = program("gqa", 1)
    on = em.optimize(g, level="kernel", guards=True)
    off = em.optimize(g, level="kernel", guards=False)
    for res in (on, off):
        assert res.verified.equivalent
        assert res.cost_us < res.baseline_cost_us
    print(f"\ngqa b=1 guards on : {on.stats['enodes']} e-nodes, "
          f"saturate {on.stats['saturate_seconds']:.2f} s, cost {on.cost_us:.2f} us, "
          f"phases {[(p['name'], p['iterations'], p['stop']) for p in on.stats['phases']]}")
    print(f"gqa b=1 guards off: {off.stats['enodes']} e-nodes, "
          f"saturate {off.stats['saturate_seconds']:.2f} s, cost {off.cost_us:.2f} us, "
          f"phases {[(p['name'], p['iterations'], p['stop']) for p in off.stats['phases']]}")


def test_sum_of_low_rank_products_becomes_one_concat_matmul():
    """W@X + B@Y's kin: two thin products summed into a big output are cheaper as one
    matmul of concatenations (the output is written once instead of three times)."""
    g = em.Graph("lowrank_sum")
    X = g.input("X", (1024, 32), dtype="float16")  # noqa: N806
    W = g.input("W", (32, 1024), dtype="float16")  # noqa: N806
    Y = g.input("Y", (1024, 16), dtype="float16")  # noqa: N806
    B = g.input("B", (16, 1024), dtype="float16")  # noqa: N806
    g.output(X @ W + Y @ B, "O")
    res = em.optimize(g, level="kernel")
    ops = [n.op for n in res.program.nodes()]
    assert ops.count(em.Op.CONCAT) == 2 and ops.count(em.Op.MATMUL) == 1
    assert em.Op.ADD not in ops
    assert res.cost_us < res.baseline_cost_us
    assert res.verified.equivalent
