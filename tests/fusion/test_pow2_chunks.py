"""A matmul's loop cuts its contraction into chunks Triton holds unpadded (issue 32).

On an H100 the 7B layer's down projection (contraction 11008 = 43 x 256) ran with Mirage's
loop ranges {4, 16, 64}, whose chunks (2752, 688, 172) Triton pads to the next power of
two: 170 us against 84 for chunks of 256 and 63 for chunks of 64 on a finer grid
(bench/history/2026-11-27_gpu-h100.md). The block rules now add loop ranges that cut a
contraction into chunks of 64 and 256 (``loop-tile`` facts, rules/block.egg), and of the
schedules the e-graph permits the planner drops loops over a contraction in padded chunks
where an aligned loop over it is permitted (``strategy.prefer_pow2_chunks``).
"""

from __future__ import annotations

import eqsat_mirage as em
from eqsat_mirage.fusion.schedule import index_fragment
from eqsat_mirage.fusion.strategy import Strategy, candidate_schedules, prefer_pow2_chunks
from eqsat_mirage.mugraph.kernels import CustomKernel


def projection(k: int, rows: int = 128, n: int = 2048) -> em.Graph:
    g = em.Graph("down")
    x = g.input("x", (1, rows, k), dtype="float16")
    w = g.input("w", (n, k), dtype="float16")
    g.output(x @ w.T, "y")
    return g


def contraction(ix) -> str:
    (idx,) = [i for i in ix.reduced if i in ix.matmul]
    return idx


def test_padded_chunks_are_dropped_only_beside_an_aligned_loop_of_the_same_index():
    ix = index_fragment(projection(2752))  # 2752 = 43 x 64
    k = contraction(ix)
    scheds = candidate_schedules(ix, Strategy(loop_ranges=(4, 16, 43, 64)))
    loops = {s.forloop for s in scheds if s.loop == k}
    assert loops == {4, 16, 43, 64}  # the candidates keep every dividing range
    kept = prefer_pow2_chunks(ix, scheds)
    assert {s.forloop for s in kept if s.loop == k} == {43}  # chunks of 64
    assert [s for s in scheds if s.loop != k] == [s for s in kept if s.loop != k]
    # no aligned loop among those a caller may use (the e-graph permits only F = 16):
    # the padded loop stays, so a fused loop is never traded for none
    only16 = [s for s in scheds if s.loop != k or s.forloop == 16]
    assert prefer_pow2_chunks(ix, only16) == only16


def test_attention_over_a_key_length_that_is_no_power_of_two_keeps_its_fused_loop():
    # keys 960 = 15 x 64: the loop-tile rule gives the P @ V contraction F = 15, which the
    # max and the sum over the keys do not have; the loop of F = 16 (chunks of 60) must
    # stay (a review found it dropped for the refused F = 15: two kernels, 7.64 us)
    g = em.Graph("attn960")
    q = g.input("Q", (2, 256, 64), dtype="float16")
    k = g.input("K", (2, 64, 960), dtype="float16")
    v = g.input("V", (2, 960, 64), dtype="float16")
    g.output(em.softmax(q @ k, axis=-1) @ v, "O")
    res = em.optimize(g, time_limit_s=300, cache=False)
    assert res.verified is not None and res.verified.equivalent
    custom = [x for x in res.program.kernels if isinstance(x, CustomKernel)]
    assert len(res.program.kernels) == 1 and custom and custom[0].forloop > 1, res.program


def test_optimize_loops_over_power_of_two_chunks_of_an_odd_contraction():
    res = em.optimize(projection(2752), time_limit_s=300)
    assert res.verified is not None and res.verified.equivalent
    loops = [(k.forloop, k) for k in res.program.kernels
             if isinstance(k, CustomKernel) and k.forloop > 1]
    assert loops, res.program  # the search tiles it (a loop over the contraction)
    for f, k in loops:
        chunk = 2752 // f
        assert chunk & (chunk - 1) == 0, (f, k)
