"""Warps per block: chosen from the tiles a block keeps live, emitted by codegen, priced by
the model, and a schedule no warp count holds without spilling is refused."""

from __future__ import annotations

import math

import pytest
from mugraph_examples import attention_tiles

import eqsat_mirage as em
from eqsat_mirage.codegen.source import triton_source
from eqsat_mirage.cost.gpucost import kernel_cost
from eqsat_mirage.cost.profile import GPUProfile
from eqsat_mirage.cost.tiles import REGISTER_BUDGET, live_registers, warps_for


@pytest.mark.parametrize("rows, keys, warps", [(16, 128, 4), (64, 128, 8), (128, 128, 8),
                                               (128, 256, None)])
def test_warps_grow_with_the_live_tiles_and_run_out(rows, keys, warps):
    # sm_90a builds at 4/8/16 warps: 128 x 128 spills at 4 and 16 warps, not at 8;
    # 128 x 256 spills at every count
    mg = attention_tiles(rows, keys)
    prof = GPUProfile.load("h100")
    (kern,) = [k for k in mg.kernels if k.kind == "custom"][:1]
    assert warps_for(kern) == warps
    cost = kernel_cost(kern, mg, prof)
    if warps is None:
        assert math.isinf(cost.time_us) and "ptxas would spill" in cost.reason
        assert live_registers(kern) > REGISTER_BUDGET[16] * 512
        assert "num_warps=16" in triton_source(mg)  # lowered anyway, if asked
    else:
        assert math.isfinite(cost.time_us)
        assert live_registers(kern) <= REGISTER_BUDGET[warps] * 32 * warps
        assert f"num_warps={warps}" in triton_source(mg)
        assert cost.blocks_per_sm <= prof.blocks_per_sm_cap(32 * warps)


def test_small_tiles_keep_four_warps():
    g = em.Graph("small")
    x = g.input("X", (4, 64), dtype="float16")
    w = g.input("W", (64, 32), dtype="float16")
    g.output(em.rms_norm(x) @ w, "Y")
    res = em.optimize(g, cache=False)
    assert all(warps_for(k) == 4 for k in res.program.kernels if k.kind == "custom")


def test_the_chosen_warps_compile_without_spills_for_sm90a():
    from eqsat_mirage.codegen.compiled import compile_report

    mg = attention_tiles(64)
    reports = compile_report(triton_source(mg), "h100")
    assert reports and reports[0].num_warps == 8
    assert all(r.spill_bytes == 0 for r in reports), [str(r) for r in reports]
