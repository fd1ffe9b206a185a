"""A matmul's loop cuts its contraction into chunks Triton holds unpadded (issue 32).

On an H100 the 7B layer's down projection (contraction 11008 = 43 x 256) ran with Mirage's
loop ranges {4, 16, 64}, whose chunks (2752, 688, 172) Triton pads to the next power of
two: 170 us against 84 for chunks of 256 and 63 for chunks of 64 on a finer grid
(bench/RESULTS.md). The block rules now add loop ranges that cut a contraction into chunks
of 64 and 256 (``loop-tile`` facts, rules/block.egg), and the strategy keeps, of the
ranges that divide a contraction, those whose chunk is a power of two where any is.
"""

from __future__ import annotations

import eqsat_mirage as em
from eqsat_mirage.fusion.schedule import index_fragment
from eqsat_mirage.fusion.strategy import Strategy, loop_choices
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


def test_loop_choices_keep_power_of_two_chunks_where_some_range_gives_one():
    ix = index_fragment(projection(2752))  # 2752 = 43 x 64
    k = contraction(ix)
    chosen = {f for i, f in loop_choices(ix, Strategy(loop_ranges=(4, 16, 43, 64))) if i == k}
    assert chosen == {43}  # chunks of 64; not 688 (4), 172 (16) or 43 (64)
    # no range gives a power of two: the dividing ones stay as before
    mirage = {f for i, f in loop_choices(ix, Strategy(loop_ranges=(4, 16, 64))) if i == k}
    assert mirage == {4, 16, 64}
    # a power-of-two contraction keeps every range
    ix2 = index_fragment(projection(4096))
    assert {f for i, f in loop_choices(ix2, Strategy()) if i == contraction(ix2)} == \
        {4, 16, 64}


def test_optimize_loops_over_power_of_two_chunks_of_an_odd_contraction():
    res = em.optimize(projection(2752), time_limit_s=300)
    assert res.verified is not None and res.verified.equivalent
    loops = [(k.forloop, k) for k in res.program.kernels
             if isinstance(k, CustomKernel) and k.forloop > 1]
    assert loops, res.program  # the search tiles it (a loop over the contraction)
    for f, k in loops:
        chunk = 2752 // f
        assert chunk & (chunk - 1) == 0, (f, k)
