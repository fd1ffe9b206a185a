"""The GPU cost model (eqsat_mirage/gpucost.py) and the hardware profiles in extract/."""

import math
import re
import shutil
import tomllib

import pytest

import eqsat_mirage as em
from eqsat_mirage.cost.gpucost import kernel_cost, mugraph_cost, roofline_us
from eqsat_mirage.cost.per_op import Hardware
from eqsat_mirage.cost.profile import NON_NEGATIVE, GPUProfile, profiles_dir
from eqsat_mirage.cost.transfers import transfers
from eqsat_mirage.ir.errors import MirageError
from eqsat_mirage.mugraph.program import from_graph

TARGETS = ("h100", "a100", "h200")
EPS = 1e-6
SOURCE = re.compile(r"datasheet|whitepaper|guide|specifications|measured|assumption|derived|"
                    r"\[[A-Z0-9-]+\]", re.IGNORECASE)


# -- profiles -------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_profiles_load_with_every_figure_and_its_source(target):
    prof = GPUProfile.load(target, measured=False)  # the datasheet (a GPU's fit: below)
    raw = tomllib.loads((profiles_dir() / f"{target}.toml").read_text())
    assert set(GPUProfile.keys()) <= set(raw["figures"])
    for key in GPUProfile.keys():  # the effects a fit sets may be 0 (off) in a datasheet
        assert getattr(prof, key) >= 0 if key in NON_NEGATIVE else getattr(prof, key) > 0
        assert SOURCE.search(prof.sources.get(key, "")), f"{target}: {key} has no source"
    assert prof.name == target and prof.calibrated == () and raw["calibration"] == {}
    assert 0 < prof.dram_achievable_fraction <= 1
    assert prof.smem_per_block_KiB <= prof.smem_per_sm_KiB
    Hardware.load(target)  # the keys cost.py reads are still there


def test_profile_figures_relate_as_the_datasheets_say():
    h100, a100, h200 = (GPUProfile.load(t) for t in TARGETS)
    assert h200.dram_bandwidth_GBps > h100.dram_bandwidth_GBps > a100.dram_bandwidth_GBps
    assert h200.fp16_tensor_TFLOPs == h100.fp16_tensor_TFLOPs > a100.fp16_tensor_TFLOPs
    assert (h100.sms, a100.sms, h200.sms) == (132, 108, 132)
    # the SFU rate is derived: 16 results/clock/SM x SMs x boost clock
    for p in (h100, a100, h200):
        assert p.sfu_TOPs == pytest.approx(16 * p.sms * p.boost_clock_MHz * 1e6 / 1e12, rel=0.01)


def test_calibration_overrides_figures_and_path_loading(tmp_path):
    path = tmp_path / "mygpu.toml"
    text = (profiles_dir() / "h100.toml").read_text()
    path.write_text(text + "dram_bandwidth_GBps = 3010.0\nlaunch_overhead_us = 2\n")
    prof = GPUProfile.load(path)
    assert prof.dram_bandwidth_GBps == 3010.0 and prof.launch_overhead_us == 2.0
    assert set(prof.calibrated) == {"dram_bandwidth_GBps", "launch_overhead_us"}
    assert GPUProfile.load(str(path)).path == str(path)
    assert GPUProfile.load(prof) is prof


def test_unknown_target_is_a_project_error():
    with pytest.raises(MirageError, match=r"unknown target 'b300'.*h100"):
        GPUProfile.load("b300")
    with pytest.raises(ValueError, match="unknown target"):
        mugraph_cost(from_graph(rms_linear_graph(1)), "nonexistent.toml")


@pytest.mark.parametrize("edit,match", [
    (lambda t: t.replace("sms = 132\n", ""), r"lacks key 'sms'"),
    (lambda t: t.replace("sms = 132", "sms = 13.5"), r"\[figures\] key 'sms' = 13.5"),
    (lambda t: t.replace("l2_MiB = 50.0", "l2_MiB = -1"), r"key 'l2_MiB' = -1"),
    (lambda t: t.replace("dram_achievable_fraction = 0.9", "dram_achievable_fraction = 9"),
     r"'dram_achievable_fraction' = 9 is not a fraction"),
    (lambda t: t + "dram_bandwith_GBps = 1.0\n", r"\[calibration\] key 'dram_bandwith_GBps'"),
    (lambda t: t + "sms = 'many'\n", r"\[calibration\] key 'sms' = 'many'"),
    (lambda t: t.replace("[figures]", "[figures"), r"malformed hardware profile"),
    (lambda t: t.replace("[figures]", "[figs]"), r"needs a \[figures\] table"),
], ids=["missing", "non-int", "negative", "fraction", "typo-in-calibration", "string",
        "bad-toml", "no-figures"])
def test_malformed_profile_names_file_and_key(tmp_path, edit, match):
    path = tmp_path / "bad.toml"
    shutil.copy(profiles_dir() / "h100.toml", path)
    path.write_text(edit(path.read_text()))
    with pytest.raises(MirageError, match=match) as info:
        GPUProfile.load(path)
    assert str(path) in str(info.value)


# -- predefined kernels ---------------------------------------------------------------------


def matmul_mugraph(m, k, n, dtype="float16"):
    mg = em.MuGraph(f"mm_{m}x{k}x{n}")
    mg.input("A", (m, k), dtype)
    mg.input("B", (k, n), dtype)
    mg.output(mg.predefined("matmul", "A", "B", out="C"))
    return mg


@pytest.mark.parametrize("target", TARGETS)
def test_predefined_matmul_compute_bound_when_square_memory_bound_when_skinny(target):
    big = matmul_mugraph(8192, 8192, 8192)
    cost = kernel_cost(big.kernels[0], big, target)
    assert cost.bound == "compute" and cost.compute_us > 5 * cost.memory_us
    prof = GPUProfile.load(target)
    want = 2 * 8192**3 / (prof.fp16_tensor_TFLOPs * 1e6 * prof.tensor_achievable_fraction)
    assert cost.time_us == pytest.approx(prof.launch_overhead_us + want)
    skinny = matmul_mugraph(2, 4096, 6144)
    cost = kernel_cost(skinny.kernels[0], skinny, target)
    assert cost.bound == "memory" and cost.memory_us > 20 * cost.compute_us
    assert cost.dram_bytes == 2 * (2 * 4096 + 4096 * 6144 + 2 * 6144)


def test_a_measured_calibration_overrides_figures_and_names_its_source():
    for target in TARGETS:
        prof = GPUProfile.load(target)
        for key in prof.calibrated:
            assert getattr(prof, key) > 0 and prof.sources[key], (target, key)
        if (profiles_dir() / f"{target}_measured.toml").is_file():
            assert prof.calibrated and all(prof.sources[k].startswith("measured")
                                           for k in prof.calibrated
                                           if k not in GPUProfile.load(target, False).calibrated)


def test_memory_bound_kernel_is_fastest_on_h200_slowest_on_a100():
    """By the datasheets (a measured calibration fits one GPU's figures, not the ratio)."""
    mg = matmul_mugraph(2, 4096, 6144)
    h100, a100, h200 = (mugraph_cost(mg, GPUProfile.load(t, measured=False)).total_us
                        for t in TARGETS)
    assert h200 < h100 < a100


# -- custom kernels: shared memory, padding, waves --------------------------------------------


def tile_matmul(blocks, tm=128, tk=128, tn=128, forloop=64, split_k=False, name="tiles",
                vary_b=False):
    """C = A @ B with a (blocks,) grid over A's rows; B read whole by every block.

    Without ``split_k`` the tiles are loop-invariant (A@B is computed once, before the loop,
    and added F times); with it, K is cut across the loop (tk = K / F). With ``vary_b``
    iteration f adds A @ B_f, B_f the f-th block of B's columns: a fresh matmul on a small
    tile every iteration, a compute-heavy kernel for the wave tests.
    """
    mg = em.MuGraph(name)
    mg.input("A", (blocks * tm, tk * (forloop if split_k else 1)))
    mg.input("B", (tk * (forloop if split_k else 1), tn * (forloop if vary_b else 1)))
    k = mg.custom_kernel(grid=(blocks,), forloop=forloop, name="mm")
    a = k.input("A", imap={0: 0}, fmap=1 if split_k else None)
    b = k.input("B", fmap=0 if split_k else 1 if vary_b else None)
    k.output(k.accumulate(a @ b, "acc"), "C", omap={0: 0})
    mg.output("C")
    return mg


def test_tiles_over_shared_memory_are_infeasible_with_a_reason():
    mg = tile_matmul(8, tm=128, tk=256, tn=128, forloop=4, split_k=True)  # 2 x (64+64) KiB
    cost = mugraph_cost(mg, "h100")
    assert cost.total_us == math.inf and not cost.feasible
    (reason,) = cost.reasons
    assert "shared memory" in reason and "227 KiB" in reason and "mm" in reason
    assert kernel_cost(mg.kernels[0], mg).bound == "infeasible"
    assert "INFEASIBLE" in str(cost)


def test_shared_memory_limit_depends_on_the_target():
    mg = tile_matmul(8, tm=128, tk=256, tn=128)  # 64 + 64 KiB inputs + 64 KiB fp32 acc
    assert mugraph_cost(mg, "h100").feasible and mugraph_cost(mg, "h200").feasible
    a100 = mugraph_cost(mg, "a100")
    assert not a100.feasible and "163 KiB" in a100.reasons[0]


def test_matmul_contraction_tile_under_16_is_infeasible_but_small_m_is_padded():
    split = tile_matmul(8, tm=16, tk=8, tn=64, forloop=8, split_k=True)
    cost = mugraph_cost(split)
    assert not cost.feasible and "K=8 < 16" in cost.reasons[0]
    skinny_m = tile_matmul(8, tm=2, tk=64, tn=64, forloop=8, split_k=True)
    cost = mugraph_cost(skinny_m)
    assert cost.feasible
    # M=2 runs as a 16-row tensor-core tile: padded FLOPs are paid
    assert cost.kernels[0].work.tensor_flops == 2 * 16 * 64 * 64 * 8 * 8


def test_wave_quantization_133_blocks_cost_two_waves_of_132():
    prof = GPUProfile.load("h100")
    one, two = (kernel_cost(m.kernels[0], m, prof) for m in (
        tile_matmul(132, tm=256, tn=64, vary_b=True), tile_matmul(133, tm=256, tn=64,
                                                                  vary_b=True)))
    # 64 KiB A + 2 x 16 KiB B (double-buffered) + 64 KiB fp32 accumulator a block
    assert one.blocks_per_sm == two.blocks_per_sm == 1
    assert (one.waves, two.waves) == (1, 2)
    assert one.bound == two.bound == "compute"
    body = [c.time_us - prof.launch_overhead_us for c in (one, two)]
    assert body[1] / body[0] == pytest.approx(2.0, rel=0.03)
    # with 2 blocks resident per SM, 264 blocks still fit one wave (each SM shared by two)
    small = tile_matmul(264, tm=64, tk=128, tn=64)
    assert kernel_cost(small.kernels[0], small, prof).waves == 1


# -- fusion: RMSNorm + Linear at the benchmark shapes ---------------------------------------


def rms_linear_graph(batch):
    g = em.Graph("rmsnorm")
    x = g.input("X", (2 * batch, 4096), "float16")
    w = g.input("W", (4096, 6144), "float16")
    g.output(em.rms_norm(x, eps=EPS) @ w, "O")
    return g


def rms_linear_fused(batch, grid=96, forloop=64):
    """The RMSNorm+Linear kernel of tests/test_mugraph.py at DESIGN.md's benchmark shapes."""
    g = rms_linear_graph(batch)
    mg = em.MuGraph("rmsnorm_fused")
    for name, node in g.inputs.items():
        mg.input(name, node.shape, node.dtype)
    k = mg.custom_kernel(grid=(grid,), forloop=forloop, name="rms_linear", source=g)
    x = k.input("X", fmap=1)
    w = k.input("W", imap={1: 0}, fmap=0)
    ss = k.accumulate((x * x).sum(axis=1, keepdims=True), "ss")
    xw = k.accumulate(x @ w, "xw")
    mean = ss / 4096
    shifted = mean + EPS
    r = em.rsqrt(shifted)
    y = xw * r
    k.fuse(mean, shifted, r, y)
    k.output(y, "O", omap={1: 0})
    mg.output("O")
    return g, mg


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("target", TARGETS)
def test_fused_rmsnorm_linear_beats_one_kernel_per_op(batch, target):
    g, fused = rms_linear_fused(batch)
    base = from_graph(g)
    assert len(base.kernels) > 1 and len(fused.kernels) == 1
    fc, bc = mugraph_cost(fused, target), mugraph_cost(base, target)
    assert fc.feasible and fc.total_us < bc.total_us
    assert len(bc.kernels) == len(base.kernels) and "rms_linear (custom)" in str(fc)
    ft, bt = transfers(fused), transfers(base)
    assert ft.device < bt.device
    # fusion saves the intermediates' round trips and the baseline's second read of X
    assert ft.round_trips == {} and bt.device - ft.device == pytest.approx(
        sum(bt.round_trips.values()) + 2 * batch * 4096 * 2)
    assert ft.registers > 0 and "rms_linear" in str(ft)
    roof = roofline_us(g, target)
    assert roof <= fc.total_us and roof <= bc.total_us
    assert roofline_us(fused, target) == pytest.approx(roof)


def test_cost_survives_json_round_trip():
    _, mg = rms_linear_fused(1)
    again = em.MuGraph.from_json(mg.to_json())
    assert mugraph_cost(again).total_us == pytest.approx(mugraph_cost(mg).total_us)


# -- attention: the S matrix stays on chip ---------------------------------------------------


def gqa_graph(batch):
    g = em.Graph("gqa")
    q = g.input("Q", (2 * batch, 256, 64), "float16")
    k = g.input("K", (2 * batch, 64, 4096), "float16")
    v = g.input("V", (2 * batch, 4096, 64), "float16")
    a = em.exp(q @ k)
    g.output((a / a.sum(axis=-1, keepdims=True)) @ v, "O")
    return g


def flash(batch, q_blocks=8, forloop=64):
    g = gqa_graph(batch)
    mg = em.MuGraph("flash")
    for name, node in g.inputs.items():
        mg.input(name, node.shape, node.dtype)
    k = mg.custom_kernel(grid=(2 * batch, q_blocks), forloop=forloop, name="attn")
    q = k.input("Q", imap={0: 0, 1: 1})
    kk = k.input("K", imap={0: 0}, fmap=2)
    v = k.input("V", imap={0: 0}, fmap=1)
    s = em.exp(q @ kk)
    o = k.accumulate(s @ v, "o")
    lse = k.accumulate(s.sum(axis=2, keepdims=True), "l")
    k.output(o / lse, "O", omap={0: 0, 1: 1})
    mg.output("O")
    return g, mg


@pytest.mark.parametrize("batch", [1, 8])
def test_fused_attention_keeps_scores_off_device_memory(batch):
    g, mg = flash(batch)
    base = from_graph(g)
    fc, bc = mugraph_cost(mg), mugraph_cost(base)
    assert fc.feasible and fc.total_us < bc.total_us
    ft, bt = transfers(mg), transfers(base)
    scores = 2 * batch * 256 * 4096 * 2  # the S x N matrix in fp16
    assert max(bt.round_trips.values()) >= 2 * scores and ft.round_trips == {}
    assert ft.device < bt.device and ft.l2_reread > 0  # K and V re-read by each query block
    for cost in (fc, bc):
        assert roofline_us(g) <= cost.total_us
    # the roofline counts the program's matmul FLOPs only, so moving the division after the
    # matmul (fewer SFU ops) cannot beat it; L2 credit (re-reads of K and V paid at the L2
    # bandwidth, the profiles' default) lowers the fused kernel's cost against paying every
    # re-read at DRAM (r_f = 1), once enough blocks run that the per-SM cap does not bind
    import dataclasses

    uncached = dataclasses.replace(GPUProfile.load("h100"), replicated_read_dram_fraction=1.0)
    _, wide = flash(batch, q_blocks=16)
    assert roofline_us(g) <= mugraph_cost(wide).total_us < mugraph_cost(wide, uncached).total_us


def test_loop_invariant_ops_count_once_as_the_generated_code_hoists_them():
    prof = GPUProfile.load("h100")
    hoisted = tile_matmul(8)  # A @ B reads no fmap tile: computed once, added 64 times
    streamed = tile_matmul(8, vary_b=True)  # a fresh A @ B_f every iteration
    once, every = (kernel_cost(m.kernels[0], m, prof).work for m in (hoisted, streamed))
    assert once.tensor_flops == 2 * 128 * 128 * 128 * 8
    assert every.tensor_flops == 64 * once.tensor_flops
    assert once.cuda == every.cuda == 128 * 128 * 8 * 64  # the accumulator adds, every time
    assert transfers(hoisted).registers < transfers(streamed).registers


# -- attention at the benchmark shapes: split reductions against their structural floor --


def gqa_post_division(batch):
    """GQA with the softmax division after the second matmul (the optimizer's rewrite)."""
    g = em.Graph("gqa_post")
    q = g.input("Q", (2 * batch, 256, 64), "float16")
    k = g.input("K", (2 * batch, 64, 4096), "float16")
    v = g.input("V", (2 * batch, 4096, 64), "float16")
    a = em.exp(q @ k)
    g.output((a @ v) / a.sum(axis=-1, keepdims=True), "O")
    return g


@pytest.mark.parametrize("batch, want", [(1, 10.13), (8, 19.16)])
def test_gqa_plan_splits_the_keys_with_a_finer_reduce_kernel(batch, want):
    """The fusion plan of GQA (h100): 64 (b=1) or 256 (b=8) blocks, each reducing a part of
    the 4096 keys with a loop inside each part, then the parts (float32: 4 bytes each)
    summed by a reduce kernel on at least 32 blocks. (Before the register budget, the
    latency term and 4-stage reduce loops, the model priced 8.81 / 17.32 us with 128 x 256
    score tiles at b=8, which ptxas spills.)"""
    from dataclasses import replace

    from eqsat_mirage.cost.gpucost import Work
    from eqsat_mirage.fusion.planner import DEFAULT_STRATEGY, plan

    g = gqa_post_division(batch)
    # splits priced as rules/block.egg's SplitOver rules allow them in em.optimize (a bare
    # fusion.plan prices none by itself: the e-graph decides)
    mg = plan(g, strategy=replace(DEFAULT_STRATEGY, allow_split_reduction=True)).mugraph
    cost = mugraph_cost(mg)
    assert cost.total_us == pytest.approx(want, abs=0.01)
    part, red = mg.kernels
    assert math.prod(part.grid) == {1: 64, 8: 256}[batch] and math.prod(red.grid) >= 32
    assert red.forloop == part.grid[part.inputs["K"].imap[2]]  # one iteration per part
    assert part.forloop > 1 and part.inputs["K"].fmap == 2 and 2 in part.inputs["K"].imap
    assert all(spec.dtype == "float32" for t, spec in mg.tensors.items() if "_part" in t)
    # structural floor of any split design in this model: two launches, plus the matmuls
    # and exps at the whole GPU's rate (tensor cores and SFU do not overlap in the model)
    prof = GPUProfile.load("h100")
    work = Work()
    for n in g.nodes():
        if n.op in (em.Op.MATMUL, em.Op.EXP):
            work.add_node(n, 1)
    floor = 2 * prof.launch_overhead_us + work.us(prof)
    assert floor == pytest.approx({1: 7.18, 8: 15.44}[batch], abs=0.01)
    assert roofline_us(g) < floor <= cost.total_us


def test_datasheet_is_the_profile_without_its_measured_calibration():
    """``GPUProfile.datasheet()``: the H200's default holds fitted figures
    (``extract/h200_measured.toml``), its datasheet does not; a profile without a measured
    calibration (h100) is its own datasheet; the launch mode is kept."""
    h200 = GPUProfile.load("h200")
    sheet = h200.datasheet()
    assert sheet == GPUProfile.load("h200", measured=False) and sheet != h200
    assert not any(s.startswith("measured (") for s in sheet.sources.values())
    assert h200.measured.endswith("h200_measured.toml") and sheet.measured == ""
    graph = h200.for_launch("graph")
    assert graph.datasheet().launch_mode == "graph"
    assert graph.datasheet().graph_launch_us == sheet.graph_launch_us
    h100 = GPUProfile.load("h100")
    assert h100.datasheet() is h100
