"""Warps per block: chosen from the largest tile, emitted by codegen and priced by the model."""

from __future__ import annotations

import eqsat_mirage as em
from bench.programs import program
from eqsat_mirage.cost.gpucost import kernel_cost, warps_for
from eqsat_mirage.cost.profile import GPUProfile


def test_large_tiles_get_more_warps_and_the_model_prices_them():
    res = em.optimize(program("gqa", 1))
    prof = GPUProfile.load("h100")
    custom = [k for k in res.program.kernels if k.kind == "custom"]
    warps = {k.name: warps_for(k) for k in custom}
    assert max(warps.values()) > 4  # the score tile would hold > 64 fp32 values per thread
    source = res.triton_source()
    for k in custom:
        assert f"num_warps={warps[k.name]}" in source
        cost = kernel_cost(k, res.program, prof)
        assert cost.blocks_per_sm <= prof.blocks_per_sm_cap(32 * warps[k.name])


def test_small_tiles_keep_four_warps():
    g = em.Graph("small")
    x = g.input("X", (4, 64), dtype="float16")
    w = g.input("W", (64, 32), dtype="float16")
    g.output(em.rms_norm(x) @ w, "Y")
    res = em.optimize(g, cache=False)
    assert all(warps_for(k) == 4 for k in res.program.kernels if k.kind == "custom")
