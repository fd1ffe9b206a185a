"""A streamed weight is read in long chunks of its contraction (issue 50).

On an H200 (2026-12-04, bench/gemv_probe.py) one matrix-vector kernel read a 90 MB float16
weight at 3.1 TB/s in chunks of 512-1024 values, while the 7B layer's plans at sequence 1,
in chunks of 64, read theirs at 2.0 TB/s; the model priced both the same. Of the schedules
a caller may use, the planner drops loops over a streamed weight's contraction in chunks
under 512 bytes a row where a longer loop over it is there (``prefer_long_chunks``).
"""

from __future__ import annotations

import eqsat_mirage as em
from eqsat_mirage.fusion.schedule import index_fragment
from eqsat_mirage.fusion.strategy import (
    GEMV_ROWS,
    Strategy,
    block_counts,
    candidate_schedules,
    gemv_rows,
    loop_chunk,
    prefer_long_chunks,
    streamed,
)
from eqsat_mirage.mugraph.kernels import CustomKernel


def projection(rows: int, k: int = 4096, n: int = 1024, dtype: str = "float16") -> em.Graph:
    g = em.Graph("proj")
    x = g.input("x", (1, rows, k), dtype="float16")
    w = g.input("w", (n, k), dtype=dtype)
    g.output(x @ w.astype("float16").T if dtype != "float16" else x @ w.T, "y")
    return g


def test_short_chunks_are_dropped_only_for_a_streamed_weight_beside_a_longer_loop():
    ix = index_fragment(projection(1))
    (k,) = streamed(ix)
    scheds = candidate_schedules(ix, Strategy())
    assert {loop_chunk(ix, s) for s in scheds if s.loop == k} == {1024, 256, 64}
    kept = prefer_long_chunks(ix, scheds)
    assert {loop_chunk(ix, s) for s in kept if s.loop == k} == {1024, 256}
    assert [s for s in scheds if s.loop != k] == [s for s in kept if s.loop != k]
    only64 = [s for s in scheds if s.loop != k or s.forloop == 64]  # nothing longer allowed
    assert prefer_long_chunks(ix, only64) == only64
    # 128 rows: a matmul of tiles, not a weight stream; its K chunks are the tensor cores'
    wide = index_fragment(projection(128))
    assert streamed(wide) == {}
    assert prefer_long_chunks(wide, candidate_schedules(wide, Strategy())) == \
        candidate_schedules(wide, Strategy())


def test_int8_weights_count_their_own_bytes():
    ix = index_fragment(projection(1, dtype="int8"))
    assert set(streamed(ix).values()) <= {1, 2}
    kept = prefer_long_chunks(ix, candidate_schedules(ix, Strategy()))
    k = next(iter(streamed(ix)))
    assert min(loop_chunk(ix, s) for s in kept if s.loop == k) * streamed(ix)[k] >= 512


def test_a_decode_projection_is_planned_in_long_chunks():
    res = em.optimize(projection(1), target="h200", cache=False, time_limit_s=300)
    assert res.verified is not None and res.verified.equivalent
    (kern,) = [x for x in res.program.kernels if isinstance(x, CustomKernel)]
    assert kern.forloop in (4, 16)  # chunks of 1024 or 256, not 64


def test_a_matrix_vector_product_may_take_8_weight_rows_a_block():
    """At one row (decode's batch of 1) a block's tile product is a broadcast product, not a
    tl.dot, so the weight's rows may come 8 to a block (``gemv_rows``): twice the blocks
    of the 16-row floor (the probe's fastest down projection on an H200); at two rows the
    floor stays."""
    one, two = index_fragment(projection(1)), index_fragment(projection(2))
    (n,) = gemv_rows(one)
    assert GEMV_ROWS == 8 and max(block_counts(one, n, Strategy())) == 1024 // 8
    assert gemv_rows(two) == frozenset()
    assert all(two.sizes[i] // b >= 16 for i in two.sizes if i in two.matmul
               for b in block_counts(two, i, Strategy()))


def test_an_8_row_block_plan_runs_and_matches_torch():
    import torch

    from bench.gpu_tuning import KeepingSearch
    from eqsat_mirage.codegen.source import compile_mugraph

    search = KeepingSearch(projection(1, k=512, n=256), "h200", 300, top=12)
    search.run()
    kept = [plan.mugraph for _, plan in search.kept]
    eight = [mg for mg in kept if "in  w: f16[8, " in str(mg)]  # 8 rows of w a block
    assert eight, [str(mg) for mg in kept]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 512, generator=gen).half()
    w = torch.randn(256, 512, generator=gen).half()
    got = compile_mugraph(eight[0])(x, w)
    got = got["y"] if isinstance(got, dict) else got
    want = (x.float() @ w.float().T)
    assert torch.allclose(got.float(), want, rtol=1e-2, atol=1e-2)
