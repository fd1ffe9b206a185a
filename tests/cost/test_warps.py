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



def _fp32_kernel(form: str, forloop: int, dtype: str = "float32"):
    """X (64, 256) against W, U (512, 256) as one kernel of ``rows`` x 32 output blocks, K
    cut in ``forloop`` iterations: ``plain`` X @ W.T, ``prologue`` (X * S) @ W.T, ``norm``
    rms_norm(X) @ W.T, ``two`` silu(X @ W.T) * (X @ U.T)."""
    from eqsat_mirage.fusion.lower import lower
    from eqsat_mirage.fusion.schedule import Schedule

    dtype, _, rows = dtype.partition("/")  # "float32/32": blocks of 32 x 32, not 16 x 32
    rows = int(rows or 16)
    g = em.Graph(form)
    x = g.input("X", (64, 256), dtype)
    w = g.input("W", (512, 256), dtype)
    y = {"plain": lambda: x @ w.T,
         "prologue": lambda: (x * g.input("S", (1, 256), dtype)) @ w.T,
         "norm": lambda: em.rms_norm(x) @ w.T,
         "two": lambda: em.silu(x @ w.T) * (x @ g.input("U", (512, 256), dtype).T)}[form]()
    g.output(y, "Y")
    mg = lower(g, Schedule(grid={"a": 64 // rows, "c": 16}, loop="b" if forloop > 1 else None,
                           forloop=forloop))
    (kern,) = [k for k in mg.kernels if k.kind == "custom"]
    return kern, mg


# (form, forloop, dtype, fma_k, whether a warp count holds it): each as ptxas built it for
# sm_90a (``test_the_fma_limit_matches_the_compiler`` builds them)
FMA_CASES = [("plain", 1, "float32", 0, True), ("prologue", 1, "float32", 0, True),
             ("norm", 1, "float32", 256, False), ("two", 1, "float32", 256, False),
             ("two", 2, "float32", 128, True), ("norm", 1, "float32/32", 0, True),
             ("two", 4, "float32", 64, True), ("two", 1, "float16", 0, True)]


@pytest.mark.parametrize("form, forloop, dtype, k_dim, holds", FMA_CASES)
def test_a_crowded_float32_dot_over_a_long_k_has_no_warp_count(form, forloop, dtype, k_dim,
                                                                holds):
    """A float32 ``tl.dot`` runs on FMAs (``input_precision="ieee"``), each thread holding
    its operand rows and columns whole along K. At K = 256 it builds cleanly alone or after
    an elementwise prologue, and spills at every warp count when crowded: two dots reading
    one operand (the LLaMA MLP's gate and up projections), or a row reduction before it
    (RMSNorm) on a block wider than tall (16 x 32; 32 x 32 builds). The compile check
    refused 14 such tile shapes of the float32 LLaMA MLP piece, one by one, and the piece
    was left one kernel per op; the model now refuses them before building, and the
    planner takes a loop over K."""
    from eqsat_mirage.cost.tiles import MAX_FMA_K, fma_k

    kern, mg = _fp32_kernel(form, forloop, dtype)
    assert fma_k(kern) == k_dim
    assert (warps_for(kern) is not None) == holds == (k_dim <= MAX_FMA_K)
    assert math.isinf(kernel_cost(kern, mg).time_us) != holds


@pytest.mark.slow
@pytest.mark.parametrize("form, forloop, dtype, k_dim, holds", FMA_CASES[:6])
def test_the_fma_limit_matches_the_compiler(form, forloop, dtype, k_dim, holds):
    """The float32 cases above built for sm_90a at 4, 8 and 16 warps: clean where the model
    finds a warp count, spilling at every count where it refuses."""
    from eqsat_mirage.codegen.tune import can_tune, tune

    if not can_tune("h100"):
        pytest.skip("no Triton NVIDIA compiler")
    kern, mg = _fp32_kernel(form, forloop, dtype)
    kern.num_warps = None
    result = tune(mg, "h100")
    assert result.ok == holds, result.summary()


@pytest.mark.parametrize("heads", [2, 4])
@pytest.mark.parametrize("on_grid", [False, True])
def test_the_model_pads_tiles_as_the_code_holds_them(heads, on_grid):
    """The generated kernel has one block size per dim size (``BLOCK_n``): where a
    ``tl.dot`` pads a dim of 2 rows to 16, a batch of 2 heads beside it is padded to 16 too.
    The model (``kernel_pads``) holds every tile as the code does. A float32 decode
    attention with 2 key heads of 2 query rows, priced as fitting, was 16 x 64 x 64 tiles
    in the code: 832 KiB of shared memory and 37,620 B spilled at sm_90a."""
    import re

    from eqsat_mirage.cost.tiles import kernel_pads
    from eqsat_mirage.fusion.lower import lower
    from eqsat_mirage.fusion.schedule import Schedule

    g = em.Graph("decode")
    q = g.input("Q", (heads, 2, 64), "float32")
    k = g.input("K", (heads, 64, 192), "float32")
    g.output(q @ k, "S")
    mg = lower(g, Schedule(grid={"a": heads} if on_grid else {}, loop="c", forloop=4))
    (kern,) = [k for k in mg.kernels if k.kind == "custom"]
    blocks = {int(n): int(b) for n, b in re.findall(r"BLOCK_(\d+)=(\d+)", triton_source(mg))}
    for stage, pad in kernel_pads(kern):
        for n in stage.nodes():
            assert all(p == blocks[d] for d, p in zip(n.shape, pad[id(n)]) if d > 1), \
                (n.describe(), pad[id(n)], blocks)
    tile = kernel_pads(kern)[0][1][id(kern.loop.inputs["Q"])]
    assert tile[0] == (1 if on_grid else 16 if heads == 2 else heads)


def test_a_merged_dot_keeps_its_rows_in_the_model_as_in_the_code():
    """A query-head group against one shared key tile is one ``tl.dot`` whose rows are the
    heads times the query rows (``merges_batch``): the code pads K and N to 16, not each
    head's 2 rows. The model held them as 16 (8 x 16 x 256 scores, 8 times the code's)."""
    import re

    from eqsat_mirage.cost.tiles import kernel_pads
    from eqsat_mirage.fusion.lower import lower
    from eqsat_mirage.fusion.schedule import Schedule

    g = em.Graph("group")
    q = g.input("Q", (8, 2, 64), "float16")
    g.output(q @ g.input("K", (64, 192), "float16"), "S")
    mg = lower(g, Schedule())
    (kern,) = [k for k in mg.kernels if k.kind == "custom"]
    blocks = {int(n): int(b) for n, b in re.findall(r"BLOCK_(\d+)=(\d+)", triton_source(mg))}
    shapes = [pad[id(n)] for stage, pad in kernel_pads(kern) for n in stage.nodes()
              if n.op.name == "MATMUL"]
    assert blocks[2] == 2 and shapes == [(8, 2, 256)]


def test_a_merged_dot_counts_its_merged_rows_where_rows_matter():
    """A merged dot's rows are its batch times M (16 here, from 16 heads of one row): a
    float32 one after a row reduction is not "wider than tall" (``fma_k``), as it would be
    read from the unmerged M of 1."""
    from eqsat_mirage.cost.tiles import dot_rows, fma_k, kernel_pads
    from eqsat_mirage.fusion.lower import lower
    from eqsat_mirage.fusion.schedule import Schedule

    g = em.Graph("rows")
    s = g.input("S", (16, 1, 256), "float32")
    p = em.exp(s - em.max(s, axis=-1, keepdims=True))
    g.output(p @ g.input("V", (256, 16), "float32"), "O")
    (kern,) = [k for k in lower(g, Schedule()).kernels if k.kind == "custom"]
    (n,) = [n for st in (kern.loop, kern.post) for n in st.nodes() if n.op.name == "MATMUL"]
    pad = {**kernel_pads(kern)[0][1], **kernel_pads(kern)[1][1]}
    assert dot_rows(n, pad) == 16 and fma_k(kern) == 0
