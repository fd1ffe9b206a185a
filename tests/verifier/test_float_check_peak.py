"""``memory.float_check_peak`` against what a native draw's check holds: the rounded draw
(float32) while the first program runs in float64 on it (``Draws.truth``'s float64
outputs, ``conditioning``), each rounded input converted to float64 where it is read."""

from __future__ import annotations

import tracemalloc

import numpy as np

import eqsat_mirage as em
from eqsat_mirage.verifier import memory
from eqsat_mirage.verifier.draws import Draws


def _chain(blocks: int = 4, n: int = 512) -> em.Graph:
    g = em.Graph("chain")
    h = g.input("x", (8, n), dtype="float16")
    for i in range(blocks):
        h = em.silu(h @ g.input(f"w{i}", (n, n), dtype="float16"))
    g.output(h, "out")
    return g


def test_the_estimate_holds_the_float64_run_on_the_rounded_draw():
    g = _chain()
    estimate, _ = memory.float_check_peak(g, g)
    d = Draws(g, np.random.default_rng(0), {})
    tracemalloc.start()
    try:
        d.rounded("folded", 0.5)  # the thread's float32 rounded draw (and the memo's packed)
        packed = sum(x.nbytes for x in d.memo[("rounded", "folded", 0.5)].values())
        tracemalloc.reset_peak()
        d.out_a(None, "folded", 0.5, True)  # the first program in float64 on it
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the packed draw is the memo's (``verify_parts`` counts it apart); 64 KiB for the
    # interpreter's own objects and an op's temporaries (the float64 run of one weight
    # is 2 MiB: the estimate without it is that much short)
    assert peak - packed <= estimate + 2**16, (peak - packed, estimate)
