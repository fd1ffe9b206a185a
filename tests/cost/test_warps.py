"""Warps per block: chosen from the largest tile, emitted by codegen and priced by the model."""

from __future__ import annotations

import eqsat_mirage as em
from eqsat_mirage.codegen.source import triton_source
from eqsat_mirage.cost.gpucost import kernel_cost, warps_for
from eqsat_mirage.cost.profile import GPUProfile


def test_large_tiles_get_more_warps_and_the_model_prices_them():
    from eqsat_mirage.fusion.lower import lower
    from eqsat_mirage.fusion.schedule import Schedule

    g = em.Graph("scores")  # GQA's score tile, 256 x 128 fp32 per block
    q = g.input("Q", (2, 256, 64), "float16")
    k = g.input("K", (2, 64, 4096), "float16")
    g.output(em.exp(q @ k), "A")
    mg = lower(g, Schedule(grid=(("a", 2), ("d", 32)), loop="c", forloop=4))
    prof = GPUProfile.load("h100")
    custom = [k for k in mg.kernels if k.kind == "custom"]
    warps = {k.name: warps_for(k) for k in custom}
    assert max(warps.values()) > 4  # the score tile would hold > 64 fp32 values per thread
    source = triton_source(mg)
    for k in custom:
        assert f"num_warps={warps[k.name]}" in source
        cost = kernel_cost(k, mg, prof)
        assert cost.blocks_per_sm <= prof.blocks_per_sm_cap(32 * warps[k.name])


def test_small_tiles_keep_four_warps():
    g = em.Graph("small")
    x = g.input("X", (4, 64), dtype="float16")
    w = g.input("W", (64, 32), dtype="float16")
    g.output(em.rms_norm(x) @ w, "Y")
    res = em.optimize(g, cache=False)
    assert all(warps_for(k) == 4 for k in res.program.kernels if k.kind == "custom")
