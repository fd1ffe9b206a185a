"""The interpreters' shortcuts give the same values as the plain walk.

- Field: a p part nobody reads is not computed (attention scores feed only exp, which
  reads the q part), and an accumulator that sums a matmul over the loop is one matmul
  over the joined tiles. Exact arithmetic: the values must be identical, and a broken
  tiling must still be caught.
- Float: a constant draw (every input one value, a broadcast view) is evaluated on one
  element per tensor; the values match the materialized evaluation.
"""

import numpy as np
import pytest
from mugraph_examples import flash_attention, rmsnorm_linear, tiled_matmul

import eqsat_mirage as em
from eqsat_mirage.mugraph import joins, parts, tiled
from eqsat_mirage.semantics import field as fieldsem
from eqsat_mirage.semantics.field import FieldCtx, evaluate_field
from eqsat_mirage.semantics.floating import evaluate, uniform
from eqsat_mirage.semantics.primes import field_primes

EXAMPLES = {"matmul": tiled_matmul, "rmsnorm_linear": rmsnorm_linear,
            "flash": flash_attention}


def _field_outputs(prog, graph, seed, monkeypatch=None, plain=False):
    p, q = field_primes()
    ctx = FieldCtx(p, q, np.random.default_rng(seed))
    ctx.inputs = ctx.random_inputs(graph)
    if not plain:
        return prog.evaluate_field(ctx) if hasattr(prog, "kernels") else evaluate_field(prog, ctx)
    with monkeypatch.context() as m:
        m.setattr(tiled, "_fuse_matmuls", lambda loop, lone: ({}, None))
        m.setattr(tiled, "needs_p", lambda mg, plans, q_ids: None)
        m.setattr(fieldsem, "p_needed", lambda program, q_ids: None)
        return prog.evaluate_field(ctx) if hasattr(prog, "kernels") else evaluate_field(prog, ctx)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_field_shortcuts_give_identical_values(name, monkeypatch):
    g, mg = EXAMPLES[name]()
    for prog in (g, mg):
        fast = _field_outputs(prog, g, 3)
        plain = _field_outputs(prog, g, 3, monkeypatch, plain=True)
        for out in g.outputs:
            np.testing.assert_array_equal(fast[out][0], plain[out][0])
            if fast[out][1] is not None:
                np.testing.assert_array_equal(fast[out][1], plain[out][1])


def test_loop_matmuls_are_joined_and_scores_skip_their_p_part():
    _, mg = flash_attention()
    plan = tiled.plans(mg)[0]
    assert set(plan.fused) == {"o"}  # s @ v is summed over the loop; the row sum is not a matmul
    scores = next(n for n in plan.fused_loop.nodes() if n.op is em.Op.MATMUL)
    q_ids = parts.needs_q(mg, [plan])
    p_ids = parts.needs_p(mg, [plan], q_ids)
    assert id(scores) in q_ids and id(scores) not in p_ids  # q @ k only feeds exp


@pytest.mark.parametrize("broken", [dict(drop_acc=True), dict(omap={0: 1, 1: 0}),
                                    dict(b_imap={0: 1}, b_fmap=1)])
def test_joined_loop_matmuls_still_catch_broken_tilings(broken):
    g, mg = tiled_matmul(**broken)
    assert not em.verify(g, mg, seed=0, float_check=False).equivalent


def test_flash_attention_without_its_sum_accumulator_is_still_rejected():
    g, mg = flash_attention(drop_sum_acc=True)
    assert not em.verify(g, mg, seed=0, float_check=False).equivalent


@pytest.mark.parametrize("name", sorted(EXAMPLES))
@pytest.mark.parametrize("value", [0.3, 1.7])
def test_constant_inputs_are_evaluated_on_one_element(name, value):
    g, mg = EXAMPLES[name]()
    views = {n: np.broadcast_to(np.float64(value), node.shape) for n, node in g.inputs.items()}
    full = {n: np.full(node.shape, value) for n, node in g.inputs.items()}
    for prog in (g, mg):
        for dtype in (None, "native"):
            fast, slow = evaluate(prog, views, dtype=dtype), evaluate(prog, full, dtype=dtype)
            for out in g.outputs:
                np.testing.assert_allclose(fast[out], slow[out], rtol=1e-6)


def test_uniform_values_stay_views_through_the_float_table():
    g = em.Graph("u")
    x = g.input("X", (64, 128), "float16")
    w = g.input("W", (128, 256), "float16")
    y = em.exp(((x @ w) * 0.01).sum(axis=1, keepdims=True)) + x.mean(axis=1, keepdims=True)
    g.output(y, "Y")
    from eqsat_mirage.semantics.floating import FLOAT_SEMANTICS, float_ctx
    from eqsat_mirage.semantics.interp import run
    views = {n: np.broadcast_to(np.float32(0.5), node.shape) for n, node in g.inputs.items()}
    env = run(g, FLOAT_SEMANTICS, float_ctx(g, views, "native", True), outputs=False)
    assert all(uniform(v) for v in env.values())
    assert not uniform(np.arange(3.0)) and uniform(np.float64(2.0))


@pytest.mark.parametrize("shapes", [((4, 1, 5, 7), (1, 3, 7, 2)), ((2, 3, 5, 7), (7, 4)),
                                    ((5, 7), (2, 3, 7, 4))])
def test_matmul_mod_of_broadcast_operands_is_exact(shapes):
    from eqsat_mirage.semantics.modular import compact, matmul_mod
    p, _ = field_primes()
    rng = np.random.default_rng(1)
    sa, sb = shapes
    a0 = rng.integers(0, p, sa, dtype=np.int64)
    b0 = rng.integers(0, p, sb, dtype=np.int64)
    full = np.broadcast_shapes(sa[:-2], sb[:-2])
    a = np.broadcast_to(a0, full + sa[-2:]) if len(sa) > 2 else a0
    b = np.broadcast_to(b0, full + sb[-2:]) if len(sb) > 2 else b0
    got = matmul_mod(a, b, p)
    want = np.matmul(a.astype(object), b.astype(object)) % p
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want.astype(np.int64))
    assert compact(a).size <= a.size


def test_a_weights_loop_tiles_join_as_a_view_of_it():
    """The per-iteration tiles of a weight that the grid cuts by rows and the loop by
    columns are, side by side, a slice of the weight: joined without a copy, the same
    values as ``np.concatenate``; tiles that are not adjacent (another order, another
    array) are concatenated as before."""
    w = np.arange(12 * 32, dtype=np.int64).reshape(12, 32)
    tiles = tiled.cut(w, {0: 0}, 1, (3,), 4)  # (4 iterations, 3 blocks, 4, 8)
    per_iter = [np.swapaxes(tiles[f], -1, -2) for f in range(4)]  # (3, 8, 4) each
    joined = joins.adjacent(per_iter, -2)
    assert joined is not None and not joined.flags.writeable
    assert np.shares_memory(joined, w)
    assert np.array_equal(joined, np.concatenate(per_iter, axis=-2))
    assert joins.adjacent(per_iter[::-1], -2) is None
    assert joins.adjacent([per_iter[0], per_iter[1].copy()], -2) is None
    assert joins.adjacent(per_iter[:1], -2) is None


def test_a_view_of_a_trial_input_reads_one_float64_conversion_of_it():
    """A matmul operand that is a view of a trial input (a transposed weight, its loop
    tiles side by side) is read as a view of that input's float64 conversion, made once
    per trial and kept in the trial's cache; the exact products are the same."""
    from eqsat_mirage.semantics import modular

    rng = np.random.default_rng(0)
    m = (1 << 31) - 1
    w = rng.integers(0, m, (64, 48))
    x = rng.integers(0, m, (5, 48))
    cache = {modular.PINNED: {id(w)}}
    view = modular._input_float64(cache, w.T)
    assert view is not None and view.dtype == np.float64 and not view.flags.writeable
    assert np.array_equal(view, w.T.astype(np.float64))
    again = modular._input_float64(cache, w[:, 8:40].T)
    assert np.shares_memory(view, again)  # one conversion for both
    assert modular._input_float64(cache, x.T) is None  # not a trial input
    assert modular._input_float64(cache, w) is None  # the input itself: cached as before
    got = modular.matmul_mod(x, w.T, m, cache)
    assert np.array_equal(got, modular.matmul_mod(x, w.T.copy(), m))


def _step_by_step(monkeypatch) -> None:
    """Float64 loops summed product by product (the loop as written), for comparison."""
    monkeypatch.setattr(joins.FloatJoin, "take", lambda self, a, lhs, rhs: (
        self.spilled.add(a), self._sum(a, [(lhs, rhs)])))


@pytest.mark.parametrize("make", [tiled_matmul, rmsnorm_linear])
def test_float64_loop_matmuls_joined_agree_with_the_loop(make, monkeypatch):
    """In float64 a matmul accumulator whose operands are tiles of the kernel's inputs is
    one matmul over the joined tiles (views, ``FloatJoin``): the loop's sum in another
    order, equal to float64 rounding; natively the loop runs step by step, bit for bit
    as before."""
    g, mg = make()
    rng = np.random.default_rng(3)
    x = {n: rng.standard_normal(node.shape) for n, node in g.inputs.items()}
    joined = {d: evaluate(mg, x, dtype=d) for d in (None, "native")}
    sums: list = []
    real = joins.FloatJoin._sum
    monkeypatch.setattr(joins.FloatJoin, "_sum", lambda self, a, ops: (
        sums.append(len(ops)), real(self, a, ops)))
    evaluate(mg, x)
    assert sums == []  # every tile joined, nothing summed one by one
    _step_by_step(monkeypatch)
    for d in (None, "native"):
        loop = evaluate(mg, x, dtype=d)
        for out in g.outputs:
            if d is None:
                np.testing.assert_allclose(joined[d][out], loop[out], rtol=1e-13, atol=1e-13)
            else:
                np.testing.assert_array_equal(joined[d][out], loop[out])
    for out, want in evaluate(g, x).items():
        np.testing.assert_allclose(joined[None][out], want, rtol=1e-12)


def test_float64_loop_matmuls_of_computed_operands_are_summed_in_order():
    """A loop matmul whose operand is computed in the loop (here the tile of A scaled) is
    not held across iterations: its products are summed one by one, in the loop's order,
    and the result is the input program's."""
    g = em.Graph("scaled")
    a, b = g.input("A", (32, 48), "float32"), g.input("B", (48, 24), "float32")
    g.output((a * 2.0) @ b, "C")
    mg = em.MuGraph("scaled_tiled")
    mg.input("A", (32, 48), "float32")
    mg.input("B", (48, 24), "float32")
    k = mg.custom_kernel(grid=(4, 4), forloop=4, source=g)
    ta, tb = k.input("A", imap={0: 0}, fmap=1), k.input("B", imap={1: 1}, fmap=0)
    k.output(k.accumulate((ta * 2.0) @ tb, "acc"), "C", omap={0: 0, 1: 1})
    mg.output("C")
    rng = np.random.default_rng(4)
    x = {n: rng.standard_normal(node.shape) for n, node in g.inputs.items()}
    held: list = []
    real = joins.FloatJoin.take

    def take(self, a, lhs, rhs):
        real(self, a, lhs, rhs)
        held.append((a in self.spilled, len(self.held[a])))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(joins.FloatJoin, "take", take)
        got = evaluate(mg, x)["C"]
    assert held == [(True, 0)] * 4  # summed as it came, from the first iteration on
    np.testing.assert_allclose(got, evaluate(g, x)["C"], rtol=1e-12)
    assert em.verify(g, mg, seed=0).equivalent


def test_node_samples_read_a_joined_matmul_per_iteration():
    """``node_samples`` asks for a loop matmul's value (its first iteration): that kernel's
    loop runs step by step, so the sample is the first iteration's product, not the sum."""
    g, mg = tiled_matmul()
    plan = tiled.plans(mg)[0]
    m = next(n for n in plan.loop.nodes() if n.op is em.Op.MATMUL)
    block = next(old for old, new in plan.loop_map.items() if new is m)
    rng = np.random.default_rng(5)
    x = {n: rng.standard_normal(node.shape) for n, node in g.inputs.items()}
    got = tiled.node_samples(mg, x, {block}, lambda v: np.array(v, copy=True))
    first = np.matmul(tiled.cut(x["A"], {0: 0}, 1, (4, 4), 4)[0],
                      tiled.cut(x["B"], {1: 1}, 0, (4, 4), 4)[0])
    np.testing.assert_allclose(got[block], first, rtol=1e-12)


def test_gemm_copied_counts_the_operand_copies_one_gemm_makes():
    """``gemm.copied``: 0 for a weight's joined loop tiles (read in place), the batched
    operand's bytes where no view of it lays it out as one matrix."""
    from eqsat_mirage.semantics.gemm import copied

    w = np.arange(48.0 * 24).reshape(48, 24)
    tiles = tiled.cut(w, {1: 0}, 0, (4,), 4)  # (4 iterations, 4 blocks, 12, 6)
    rhs = joins.adjacent([tiles[f] for f in range(4)], -2)
    lhs = np.broadcast_to(np.ones((1, 5, 48)), (4, 5, 48))
    assert rhs is not None and np.shares_memory(rhs, w)
    assert copied(lhs, rhs) == 0
    scrambled = np.random.default_rng(0).standard_normal((4, 6, 48)).transpose(0, 2, 1)[:, ::2]
    assert copied(lhs[:, :, :24], scrambled) == 4 * 24 * 6 * 8
    assert copied(np.ones((5, 48)), w) == 0  # no batch: one GEMM
