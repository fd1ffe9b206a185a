"""Automatic custom kernels: index naming, schedule legality, lowering and candidate strategy.

Every candidate schedule of each fragment must lower to a MuGraph that em.verify accepts
against the fragment and that em.evaluate matches in float64.
"""

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.fusion.lower import add_kernel, lower
from eqsat_mirage.fusion.schedule import Schedule, ScheduleError, check_schedule, index_fragment
from eqsat_mirage.fusion.strategy import Strategy, candidate_schedules

RNG = np.random.default_rng(0)
EPS = 1e-6


def matmul():
    g = em.Graph("matmul")
    a = g.input("A", (64, 128), "float32")
    b = g.input("B", (128, 256), "float32")
    g.output(a @ b, "C")
    return g


def rmsnorm_linear():
    g = em.Graph("rmsnorm_linear")
    x = g.input("X", (16, 256), "float16")
    w = g.input("W", (256, 512), "float16")
    g.output((x @ w) * em.rsqrt((x * x).mean(axis=-1, keepdims=True) + EPS), "Y")
    return g


def gated_mlp():
    g = em.Graph("gated_mlp")
    x = g.input("X", (16, 256), "float16")
    w1 = g.input("W1", (256, 512), "float16")
    w2 = g.input("W2", (256, 512), "float16")
    g.output(em.silu(x @ w1) * (x @ w2), "Y")
    return g


def attention(pre_division=False):
    g = em.Graph("attention")
    q = g.input("Q", (2, 64, 32), "float32")
    k = g.input("K", (2, 32, 256), "float32")
    v = g.input("V", (2, 256, 32), "float32")
    a = em.exp(q @ k)
    s = a.sum(axis=-1, keepdims=True)
    g.output((a / s) @ v if pre_division else (a @ v) / s, "O")
    return g


FRAGMENTS = [matmul, rmsnorm_linear, gated_mlp, attention]


def assert_lowers(g, schedule):
    mg = lower(g, schedule)
    inputs = {n: RNG.standard_normal(v.shape) for n, v in g.inputs.items()}
    want, got = em.evaluate(g, inputs), em.evaluate(mg, inputs)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-9, atol=1e-12)
    res = em.verify(g, mg, seed=0)
    assert res.equivalent, (str(schedule), str(res))
    return mg


# -- every candidate lowers and verifies ----------------------------------------------------


@pytest.mark.parametrize("make", FRAGMENTS, ids=lambda f: f.__name__)
def test_every_candidate_lowers_and_verifies(make):
    g = make()
    cands = candidate_schedules(g)
    assert cands
    for s in cands:
        mg = assert_lowers(g, s)
        assert len(mg.kernels) == 1 and mg.kernels[0].kind == "custom"


@pytest.mark.parametrize("make", FRAGMENTS, ids=lambda f: f.__name__)
def test_split_reduction_candidates_verify(make):
    g = make()
    cands = candidate_schedules(g, Strategy(allow_split_reduction=True, max_candidates=5))
    splits = [s for s in cands if s.split is not None]
    assert splits
    for s in cands:
        mg = assert_lowers(g, s)
        assert len(mg.kernels) == (2 if s.split else 1)


# -- the kernels have the expected structure ------------------------------------------------


def test_matmul_indices_and_kernel():
    g = matmul()
    ix = index_fragment(g)
    assert (ix.einsum(g.inputs["A"]), ix.einsum(g.inputs["B"])) == ("a,b", "b,c")
    assert set(ix.reduced) == {"b"} and ix.sizes == {"a": 64, "b": 128, "c": 256}
    mg = assert_lowers(g, Schedule(grid={"a": 4, "c": 8}, loop="b", forloop=4))
    k = mg.kernels[0]
    assert k.grid == (4, 8) and k.forloop == 4 and k.accumulators == ["acc0"]
    assert (k.inputs["A"].imap, k.inputs["A"].fmap) == ({0: 0}, 1)
    assert (k.inputs["B"].imap, k.inputs["B"].fmap) == ({1: 1}, 0)
    assert k.outputs["C"].omap == {0: 0, 1: 1}
    assert em.verify(g, mg.reference(), seed=0).equivalent
    assert em.MuGraph.from_json(mg.to_json()) == mg


def test_rmsnorm_linear_loop_carries_two_reductions():
    g = rmsnorm_linear()
    ix = index_fragment(g)
    h = ix.input_index("X", 1)
    assert ix.input_index("W", 0) == h and len(ix.reduced[h]) == 2  # matmul and mean
    mg = assert_lowers(g, Schedule(grid={ix.input_index("W", 1): 32}, loop=h, forloop=4))
    k = mg.kernels[0]
    assert len(k.accumulators) == 2
    post_ops = {n.op for n in k.post.nodes()}
    assert {em.Op.RSQRT, em.Op.DIV, em.Op.MUL} <= post_ops  # mean = acc / 256, after the loop
    assert em.Op.MEAN not in {n.op for n in k.loop.nodes()}


def test_gated_mlp_shares_x_and_fuses_post_ops():
    g = gated_mlp()
    (s, *_) = candidate_schedules(g)
    k = lower(g, s).kernels[0]
    assert list(k.inputs) == ["X", "W1", "W2"]  # X loaded once for both matmuls
    assert [n.op for n in k.loop.outputs.values()] == [em.Op.MATMUL, em.Op.MATMUL]
    assert {em.Op.SILU, em.Op.MUL} <= {n.op for n in k.post.nodes()}


def test_attention_two_accumulators_division_after_loop():
    g = attention()
    ix = index_fragment(g)
    n = ix.input_index("K", 2)
    s = Schedule(grid={ix.input_index("Q", 0): 2, ix.input_index("Q", 1): 4}, loop=n,
                 forloop=4)
    k = assert_lowers(g, s).kernels[0]
    assert sorted(x.op.name for x in k.loop.outputs.values()) == ["MATMUL", "SUM"]
    assert [x.op for x in k.post.outputs.values()] == [em.Op.DIV]
    assert k.inputs["Q"].fmap is None and k.inputs["K"].fmap == 2 and k.inputs["V"].fmap == 1


def test_flash_decoding_split_has_partial_and_reduce_kernels():
    g = attention()
    ix = index_fragment(g)
    n = ix.input_index("K", 2)
    mg = assert_lowers(g, Schedule(grid={ix.input_index("Q", 0): 2, n: 16}, split=n))
    part, red = mg.kernels
    assert part.grid == (2, 16) and red.grid == (2,) and red.forloop == 16
    assert len(red.accumulators) == 2
    assert all(bi.fmap == 0 for name, bi in red.inputs.items() if name not in g.inputs)


def test_split_kernels_run_as_torch_without_a_reference():
    """A split's part kernel has no kernel-level source: torch_reference (the backend's CPU
    path) runs the tiling for real instead, rounded to each tensor's dtype."""
    torch = pytest.importorskip("torch")
    from eqsat_mirage.semantics.torch_reference import torch_reference

    g = attention()
    ix = index_fragment(g)
    n = ix.input_index("K", 2)
    mg = lower(g, Schedule(grid={ix.input_index("Q", 0): 2, n: 16}, split=n))
    with pytest.raises(em.MuGraphError, match="has no source"):
        mg.reference()
    feed = {k: RNG.standard_normal(v.shape) * 0.3 for k, v in g.inputs.items()}
    got = torch_reference(mg)(**{k: torch.tensor(v, dtype=torch.float32) for k, v in
                                 feed.items()})
    for name, want in em.evaluate(g, feed).items():
        assert got[name].dtype == getattr(torch, mg.tensors[mg.output_tensors[name]].dtype)
        np.testing.assert_allclose(got[name].double().numpy(), want, rtol=1e-4, atol=1e-5)


def test_split_with_a_loop_inside_and_a_finer_reduce_grid():
    g = attention()
    ix = index_fragment(g)
    h, q, n = ix.input_index("Q", 0), ix.input_index("Q", 1), ix.input_index("K", 2)
    s = Schedule(grid={h: 2, n: 4}, loop=n, forloop=4, split=n, reduce_grid={h: 2, q: 8})
    assert s.parts(n) == 16 and s.second_grid == ((h, 2), (q, 8))
    assert str(s) == f"grid({h}=2, {n}=4) loop {n}/4 split {n} reduce grid({h}=2, {q}=8)"
    part, red = assert_lowers(g, s).kernels
    assert part.grid == (2, 4) and part.forloop == 4 and len(part.accumulators) == 2
    # K's 256 keys: 4 blocks of 64, each read in 4 iterations of 16
    assert (part.inputs["K"].imap, part.inputs["K"].fmap) == ({0: 0, 2: 1}, 2)
    assert part.loop.inputs["K"].shape == (1, 32, 16)
    assert red.grid == (2, 8) and red.forloop == 4
    assert red.loop.inputs[next(iter(red.inputs))].shape == (1, 1, 8, 32)
    # the default reduce grid is the first kernel's without the split axis
    assert assert_lowers(g, Schedule(grid={h: 2, n: 4}, loop=n, forloop=2,
                                     split=n)).kernels[1].grid == (2,)


def test_split_loop_and_reduce_grid_refusals():
    g = attention()
    ix = index_fragment(g)
    h, q, c, n = (ix.input_index("Q", 0), ix.input_index("Q", 1), ix.input_index("Q", 2),
                  ix.input_index("K", 2))
    e = ix.input_index("V", 2)
    cases = [
        (Schedule(grid={h: 2, n: 4}, loop=c, forloop=2, split=n), "loops over its split"),
        (Schedule(grid={h: 2, n: 4}, loop=n, forloop=128, split=n), "does not divide loop "
                                                                     "index .* split across"),
        (Schedule(grid={h: 2}, loop=n, forloop=4, reduce_grid={h: 2}), "needs a split"),
        (Schedule(grid={h: 2, n: 4}, split=n, reduce_grid={c: 2}), "must be a known, unred"),
        (Schedule(grid={h: 2, n: 4}, split=n, reduce_grid={q: 3}), "3 blocks do not divide"),
        # sum(A) does not carry V's column index: its parts hold one copy per column block
        (Schedule(grid={h: 2, e: 2, n: 4}, split=n, reduce_grid={h: 2}), f"keep {e}=2"),
    ]
    for schedule, match in cases:
        with pytest.raises(ScheduleError, match=match):
            check_schedule(ix, schedule)
    assert_lowers(g, Schedule(grid={h: 2, e: 2, n: 4}, split=n, reduce_grid={e: 2, q: 4}))
    # an output carrying the split index cannot be written from inside the loop
    g = em.Graph("stream")
    x = g.input("X", (32, 64), "float32")
    g.output(em.exp(x), "Y")
    g.output(x.sum(axis=1), "S")
    with pytest.raises(ScheduleError, match="output 'Y' carries the split index"):
        check_schedule(index_fragment(g), Schedule(grid={"b": 4}, loop="b", forloop=2,
                                                   split="b"))
    assert_lowers(g, Schedule(grid={"b": 4}, split="b"))


def test_split_candidates_with_loops_and_reduce_grids_verify():
    g = attention()
    ix = index_fragment(g)
    n = ix.input_index("K", 2)
    cands = candidate_schedules(g, Strategy(allow_split_reduction=True, max_candidates=400))
    splits = [s for s in cands if s.split]
    assert any(s.loop == n for s in splits) and any(s.reduce_grid for s in splits)
    assert any(s.loop is None and s.reduce_grid is None for s in splits)
    # a split grid whose parts allow a loop comes first with the shortest loop and a finer
    # reduce grid, then bare
    i = next(i for i, s in enumerate(splits) if s.loop)
    assert splits[i].forloop == 4 and splits[i].reduce_grid
    assert splits[i + 1] == Schedule(splits[i].grid, split=n)
    for s in splits[:6] + [s for s in splits if s.loop and s.reduce_grid][:3]:
        assert_lowers(g, s)
    plain = candidate_schedules(g, Strategy(allow_split_reduction=True, split_loops=False,
                                            reduce_grids=0, max_candidates=400))
    assert all(s.loop is None and s.reduce_grid is None for s in plain if s.split)


def test_add_kernel_into_existing_mugraph():
    g = matmul()
    mg = em.MuGraph("two")
    mg.input("A", (64, 128), "float32")
    mg.input("B", (128, 256), "float32")
    (k,) = add_kernel(mg, g, Schedule(grid={"a": 2, "c": 16}, loop="b", forloop=16), name="mm")
    mg.predefined("mul", "C", 2.0, out="D")
    mg.output("D")
    x = {n: RNG.standard_normal(v.shape) for n, v in g.inputs.items()}
    np.testing.assert_allclose(em.evaluate(mg, x)["D"], 2 * x["A"] @ x["B"], rtol=1e-9)
    assert k.name == "mm"


def test_movement_ops_and_streamed_outputs():
    g = em.Graph("movement")
    x = g.input("X", (4, 8, 64), "float32")
    w = g.input("W", (64, 32), "float32")
    c = g.input("C", (32, 16), "float32")
    h = x.reshape(32, 64) @ w
    g.output((em.concat([h.T, c.T], axis=0).T * 3.0), "Z")
    ix = index_fragment(g)
    assert ix.input_index("X", 1) in ix.fixed and ix.input_index("W", 1) in ix.fixed
    # the merge's major dim (X dim 0) carries the merged dim's index: cut into parts that
    # divide both (4 and 32), each part whole rows of the minor dim
    a = ix.input_index("X", 0)
    assert a not in ix.fixed and ix.output_index("Z", 0) == a and ix.unit(a) == 4
    scheds = candidate_schedules(g, Strategy(min_blocks=1))
    assert any(dict(s.grid).get(a, 1) > 1 for s in scheds)
    for s in scheds:
        assert_lowers(g, s)
    with pytest.raises(ScheduleError, match="split or merged by reshape"):
        check_schedule(ix, Schedule(grid={ix.input_index("X", 1): 2}))
    with pytest.raises(ScheduleError, match="do not divide"):
        check_schedule(ix, Schedule(grid={a: 8}))
    # an output carrying the loop index is streamed from the loop stage by fmap
    g = em.Graph("stream")
    x = g.input("X", (32, 64), "float32")
    y = em.exp(x) * 2.0 + x
    g.output(y, "Y")
    g.output(y.sum(axis=1), "S")
    mg = assert_lowers(g, Schedule(grid={"a": 4}, loop="b", forloop=4))
    assert mg.kernels[0].outputs["Y"].fmap == 1 and mg.kernels[0].outputs["Y"].stage == "loop"


# -- refusals -------------------------------------------------------------------------------


def test_pre_division_softmax_refused():
    g = attention(pre_division=True)
    ix = index_fragment(g)
    n = ix.input_index("K", 2)
    s = Schedule(grid={ix.input_index("Q", 0): 2}, loop=n, forloop=4)
    msg = r"div .* combines values indexed by it with sum.*a reduction over it.*\(A @ V\) / sum"
    with pytest.raises(ScheduleError, match=msg):
        check_schedule(ix, s)
    with pytest.raises(em.MirageError, match="single loop pass"):
        lower(g, s)
    assert all(c.loop != n and c.split != n for c in
               candidate_schedules(g, Strategy(allow_split_reduction=True)))


@pytest.mark.parametrize("schedule, match", [
    (Schedule(grid={"b": 4}), r"grid index 'b' .* is reduced inside the fragment by matmul"),
    (Schedule(grid={"a": 4}, loop="c", forloop=4), "loop index 'c' .* is not reduced"),
    (Schedule(grid={"a": 3}, loop="b", forloop=4), "3 blocks do not divide"),
    (Schedule(loop="b", forloop=5), "forloop range 5 does not divide"),
    (Schedule(grid={"z": 2}), "unknown index 'z'"),
    (Schedule(grid={"a": 2, "c": 2}, loop="a", forloop=2), "scheduled twice"),
], ids=["grid-on-reduced", "loop-not-reduced", "blocks", "range", "unknown", "twice"])
def test_illegal_schedules_refused(schedule, match):
    with pytest.raises(ScheduleError, match=match):
        lower(matmul(), schedule)


def test_output_not_carrying_grid_index_refused():
    g = em.Graph("two_outputs")
    x = g.input("X", (32, 64), "float32")
    w = g.input("W", (64, 128), "float32")
    g.output(x @ w, "Y")
    g.output((x * x).sum(axis=1, keepdims=True), "S")
    with pytest.raises(ScheduleError, match="output 'S' .* does not carry grid index 'c'"):
        check_schedule(index_fragment(g), Schedule(grid={"c": 4}, loop="b", forloop=4))
    assert all("c" not in dict(s.grid) for s in candidate_schedules(g))


def test_inconsistent_indexing_refused():
    g = em.Graph("gram")
    x = g.input("X", (32, 32), "float32")
    g.output(x @ x.T, "G")
    with pytest.raises(ScheduleError, match="cannot index matmul .* the same index"):
        index_fragment(g)
    assert issubclass(ScheduleError, em.MirageError)


# -- the strategy ---------------------------------------------------------------------------


def big_matmul():
    g = em.Graph("big")
    a = g.input("A", (512, 1024), "float16")
    b = g.input("B", (1024, 2048), "float16")
    g.output(a @ b, "C")
    return g


def test_candidates_bounded_deterministic_and_in_block_range():
    g = big_matmul()
    for strat in (Strategy(max_candidates=10), Strategy(min_blocks=64, max_blocks=256),
                  Strategy(allow_split_reduction=True, max_candidates=20)):
        cands = candidate_schedules(g, strat)
        assert 0 < len(cands) <= strat.max_candidates
        assert cands == candidate_schedules(g, strat)
        assert len(set(cands)) == len(cands)
        for s in cands:
            assert strat.min_blocks <= s.blocks <= strat.max_blocks, s
            assert s.forloop in strat.loop_ranges or s.split
            check_schedule(index_fragment(g), s)
            for idx, b in s.grid:  # matmul tiles stay >= 16
                assert index_fragment(g).sizes[idx] // b >= 16
    assert any(s.split for s in candidate_schedules(g, Strategy(allow_split_reduction=True)))


def test_candidates_when_shapes_allow_few_blocks():
    g = attention()  # at most 2 x 4 x 2 blocks keep the matmul tiles >= 16
    cands = candidate_schedules(g)
    assert cands and all(s.blocks == 16 for s in cands)
    assert {s.loop for s in cands} == {"c", "d"}  # head dim of Q@K, or the key length
    assert candidate_schedules(g, Strategy(loop_ranges=(8,)))[0].forloop == 8


def test_unused_input_gets_its_own_indices():
    g = em.Graph("unused")
    x = g.input("X", (4, 8), "float32")
    g.input("Y", (3,), "float32")
    g.output(x * 2.0, "Z")
    ix = index_fragment(g)
    assert ix.input_index("Y", 0) not in (ix.input_index("X", 0), ix.input_index("X", 1))


def test_check_schedule_verdicts_kept_per_indexing():
    # a schedule checked again against the same indexing: the same plan, or the same refusal
    g = attention(pre_division=True)
    ix = index_fragment(g)
    n = ix.input_index("K", 2)
    bad = Schedule(grid={ix.input_index("Q", 0): 2}, loop=n, forloop=4)
    messages = []
    for _ in range(2):
        with pytest.raises(ScheduleError) as err:
            check_schedule(ix, bad)
        messages.append(str(err.value))
    assert messages[0] == messages[1] and "single loop pass" in messages[0]
    good = candidate_schedules(ix)[0]
    first = check_schedule(ix, good)
    again = check_schedule(ix, good)
    assert again is first
    fresh = check_schedule(index_fragment(g), good)  # another indexing: worked out anew
    assert fresh is not first
    assert list(fresh.kind.values()) == list(first.kind.values())
    assert [fresh.tiles[id(a)] for a in fresh.indexing.nodes] == \
        [first.tiles[id(a)] for a in ix.nodes]
