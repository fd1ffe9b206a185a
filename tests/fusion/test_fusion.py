"""The block/thread level: ``fusion.plan`` and ``em.optimize(level="mugraph")``.

Benchmarks at batch 1 only (the verifier runs the tiled interpreter over the
finite field, which is what keeps this file to well under two minutes on two
cores); every chosen MuGraph must have passed ``em.verify`` against its input.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings

import eqsat_mirage as em
from bench.programs import program
from eqsat_mirage.cost.gpucost import mugraph_cost, roofline_us
from eqsat_mirage.cost.transfers import transfers
from eqsat_mirage.fusion import planner as planner_module
from eqsat_mirage.fusion.planner import DEFAULT_STRATEGY, FusionPlan, plan
from eqsat_mirage.ir.node import Op
from eqsat_mirage.mugraph.program import from_dict
from eqsat_mirage.testing import programs

TRIALS = 2


@pytest.fixture(scope="module")
def optimized():
    """em.optimize at the MuGraph level, once per benchmark (b = 1)."""
    cache: dict[str, em.OptimizeResult] = {}

    def get(name: str) -> em.OptimizeResult:
        if name not in cache:
            # the time the search needs on a loaded machine (a search ends when done)
            cache[name] = em.optimize(program(name, 1), trials=TRIALS, time_limit_s=600)
        return cache[name]
    return get


def custom_kernels(mg: em.MuGraph) -> list[em.CustomKernel]:
    return [k for k in mg.kernels if k.kind == "custom"]


def ops_of(k: em.CustomKernel) -> list[Op]:
    return [n.op for st in ("loop", "post") for n in k.stage(st).nodes()]


def assert_verified(name: str, res: em.OptimizeResult) -> None:
    assert isinstance(res.program, em.MuGraph), type(res.program)
    assert res.verified is not None and res.verified.equivalent, res.verified
    assert res.stats["level"] == "mugraph"
    assert res.cost_us == pytest.approx(mugraph_cost(res.program).total_us)
    assert res.baseline_cost_us == pytest.approx(
        mugraph_cost(em.from_graph(program(name, 1))).total_us)
    assert res.roofline_us == pytest.approx(roofline_us(program(name, 1)))
    assert res.roofline_us <= res.cost_us < res.baseline_cost_us
    print(f"\n{name}: {res.baseline_cost_us:.2f} us -> {res.cost_us:.2f} us (roofline "
          f"{res.roofline_us:.2f}), {len(res.program.kernels)} kernels")


# ---------------------------------------------------------------- the benchmarks


def test_gqa_scores_never_reach_device_memory_in_float32(monkeypatch):
    """In float32, (A @ V) / sum(A) cannot overflow where the input does not: one key pass."""
    import bench.programs

    monkeypatch.setattr(bench.programs, "DTYPE", "float32")
    res = em.optimize(program("gqa", 1), trials=TRIALS, cache=False)
    assert res.verified.equivalent and res.cost_us < res.baseline_cost_us
    shapes = {spec.shape for spec in res.program.tensors.values()}
    assert (2, 256, 4096) not in shapes, res.program
    assert all(size < 2 * 256 * 4096 * 4 for size in transfers(res.program).round_trips.values())
    assert all(k.kind == "custom" for k in res.program.kernels)


def test_gqa_split_partials_are_float32_so_the_cheapest_plan_verifies(optimized):
    """The split's partial sums of A @ V are written in float32: in float16 they overflowed
    where the input program is finite (exps just below 65504, summed over keys), and the
    native-dtype check refused the cheapest plan."""
    res = optimized("gqa")
    assert_verified("gqa", res)
    first = res.stats["plans"][0]
    assert first["verified"] is True and first["cost_us"] == res.cost_us, res.stats["plans"]
    parts = [s for s in res.program.tensors.values() if "_part" in s.name]
    assert parts and all(s.dtype == "float32" for s in parts)
    assert res.program.tensors["O"].dtype == "float16"


def test_rmsnorm_normalization_and_matmul_in_one_custom_kernel(optimized):
    res = optimized("rmsnorm")
    assert_verified("rmsnorm", res)
    assert len(res.program.kernels) == 1
    (k,) = custom_kernels(res.program)
    ops = ops_of(k)
    assert Op.MATMUL in ops and Op.RSQRT in ops and Op.SUM in ops
    # the division moved after the matmul: the scale is applied in the post stage
    assert any(n.op is Op.RSQRT for n in k.post.nodes())
    assert k.threads, "the post-stage elementwise chain is a thread graph"
    assert len(k.accumulators) == 2


@pytest.mark.slow  # its own em.optimize of gatedmlp
def test_gatedmlp_both_matmuls_silu_and_product_in_one_kernel(optimized):
    res = optimized("gatedmlp")
    assert_verified("gatedmlp", res)
    assert len(res.program.kernels) == 1
    (k,) = custom_kernels(res.program)
    ops = ops_of(k)
    assert ops.count(Op.MATMUL) == 2 and Op.SILU in ops and Op.MUL in ops
    # one block input (one load per iteration) of X feeds both matmuls
    assert [bi.tensor for bi in k.inputs.values()].count("X") == 1


def test_lora_keeps_x_at_a_on_chip(optimized):
    """The input form X@W + (X@A)@B plans into one kernel: X@A never goes to device memory,
    and the plan's report lists it among the tiles kept on chip."""
    g = program("lora", 1)
    p = plan(g, "h100")
    assert isinstance(p, FusionPlan) and len(p.mugraph.kernels) == 1
    assert not [t for t, s in p.mugraph.tensors.items() if s.shape == (16, 16)]
    assert "[16, 16]" in p.report() and "on chip" in p.report()
    assert em.verify(g, p.mugraph, trials=TRIALS, seed=0).equivalent
    res = optimized("lora")
    assert_verified("lora", res)
    assert len(res.program.kernels) == 1
    assert not [t for t, s in res.program.tensors.items() if s.shape == (16, 16)]


def test_ntrans_fused_into_one_kernel(optimized):
    res = optimized("ntrans")
    assert_verified("ntrans", res)
    assert len(res.program.kernels) == 1 and custom_kernels(res.program)
    # 8 rows: 8 blocks, each with its 24 KiB in flight for one DRAM latency (the roofline
    # has no latency term)
    assert res.cost_us < 1.3 * res.roofline_us


# ---------------------------------------------------------------- broken tilings


def drop_accumulators(mg: em.MuGraph, kernel: str) -> dict:
    """The JSON of ``mg`` with ``kernel``'s accumulators dropped: the post stage moves into
    the loop, so its outputs keep the last iteration's values (well formed, wrong)."""
    d = mg.to_dict()
    k = next(x for x in d["kernels"] if x["name"] == kernel)
    loop, post = k["loop"], k["post"]
    nodes, where = loop["nodes"], {}
    for i, n in enumerate(post["nodes"]):
        if n["op"] == "input" and n["arg"] in k["accumulators"]:
            where[i] = loop["outputs"][n["arg"]]
        elif n["op"] == "input":
            found = [j for j, m in enumerate(nodes) if m["op"] == "input" and m["arg"] == n["arg"]]
            if not found:
                nodes.append(dict(n))
            where[i] = found[0] if found else len(nodes) - 1
        else:
            nodes.append({**n, "srcs": [where[s] for s in n["srcs"]]})
            where[i] = len(nodes) - 1
    loop["outputs"] = {t: where[i] for t, i in post["outputs"].items()}
    k["post"] = {"name": post["name"], "inputs": [], "nodes": [], "outputs": {}}
    k["accumulators"], k["threads"] = [], []
    for out in k["outputs"]:
        out["stage"] = "loop"
    return d


def test_dropped_accumulator_is_rejected_by_verify(optimized):
    res = optimized("rmsnorm")
    g = program("rmsnorm", 1)
    name = custom_kernels(res.program)[0].name
    broken = em.MuGraph.from_dict(drop_accumulators(res.program, name))
    assert not custom_kernels(broken)[0].accumulators
    verdict = em.verify(g, broken, trials=1, seed=0)
    assert not verdict.equivalent and verdict.counterexample is not None
    assert verdict.counterexample.output == "O"


def test_corrupted_omap_is_rejected_by_verify(optimized):
    res = optimized("gqa")
    d = res.program.to_dict()
    k = max((x for x in d["kernels"] if x["kind"] == "custom"),
            key=lambda x: len(x["outputs"][0]["omap"]))
    out = k["outputs"][0]
    assert len(out["omap"]) >= 2
    out["omap"] = out["omap"][:-1]  # one grid axis no longer places the tiles
    broken = from_dict(d)  # not validated: em.verify must catch it
    with pytest.raises(em.TilingError, match=rf"kernel {k['name']!r}.*omap"):
        em.verify(program("gqa", 1), broken, trials=1, seed=0)


# ---------------------------------------------------------------- reports and the pipeline


def test_plan_report_says_why_not():
    """Softmax before its division is moved cannot be one loop pass; RMSNorm before the
    division is moved needs the whole row of X and of W's columns in shared memory."""
    gqa = plan(program("gqa", 1), "h100")
    assert "a single loop pass cannot express that" in gqa.report()
    assert len(gqa.mugraph.kernels) > 1
    rms = plan(program("rmsnorm", 1), "h100")
    assert "shared memory" in rms.report() and "infeasible" in rms.report()
    assert rms.cost_us < rms.baseline_us
    for p in (gqa, rms):
        assert p.evaluations <= 400  # bounded by count (seconds depend on the machine)
        kinds = {r.kind for r in p.regions}
        assert kinds <= {"custom", "predefined"} and sum(len(r.ops) for r in p.regions) == len(
            p.ops)


def test_result_printout_stats_and_levels(optimized):
    res = optimized("ntrans")
    text = str(res)
    assert "roofline" in text and "kernel k0: custom" in text and "fusion:" in text
    st = res.stats
    assert set(st["phase_seconds"]) == {"saturate", "extract", "fusion", "verify"}
    assert st["kernels"] == len(res.program.kernels) and st["regions"] and st["plans"]
    assert st["plans"][0]["verified"] is True and res.plan is not None
    assert em.MuGraph.from_json(res.program.to_json()) == res.program  # threads included
    kernel = em.optimize(program("ntrans", 1), level="kernel", trials=1)
    assert isinstance(kernel.program, em.Graph) and kernel.roofline_us is None
    with pytest.raises(em.MirageError, match="level must be one of"):
        em.optimize(program("ntrans", 1), level="block")


def test_never_returns_an_unverified_program(monkeypatch):
    """If every planned MuGraph is wrong, the input (one kernel per op) is returned."""
    import eqsat_mirage.fusion.forms as fusion  # where each form is planned

    real = fusion.plan

    def broken_plan(graph, *args, **kwargs):  # every plan scales by 3 instead of 2
        p = real(graph, *args, **kwargs)
        text = p.mugraph.to_json()
        assert '"arg": 2.0' in text
        p.mugraph = em.MuGraph.from_json(text.replace('"arg": 2.0', '"arg": 3.0'))
        return p

    monkeypatch.setattr(fusion, "plan", broken_plan)
    g = em.Graph("small")
    x, w = g.input("X", (64, 256)), g.input("W", (256, 128))
    g.output(em.silu(x @ w) * 2.0, "O")
    res = em.optimize(g, trials=1, cache=False)
    assert res.stats["candidates_tried"] >= 1
    assert all(p["verified"] is False for p in res.stats["plans"])
    assert res.verified.equivalent and res.cost_us == res.baseline_cost_us
    assert all(k.kind == "predefined" for k in res.program.kernels)


def test_non_lax_program_returns_the_baseline():
    g = em.Graph("twice_exp")
    x = g.input("X", (4, 4))
    g.output(em.exp(em.exp(x)) @ x, "O")
    res = em.optimize(g, partition=False)  # as one piece: nothing can be verified
    assert res.verified is None and "not a Lax program" in res.stats["note"]
    assert res.cost_us == res.baseline_cost_us
    assert all(k.kind == "predefined" for k in res.program.kernels)
    res = em.optimize(g)  # partitioned: two Lax pieces, each verified or left as it was
    assert len(res.stats["pieces"]) == 2 and res.cost_us <= res.baseline_cost_us
    if any(p["status"] == "optimized" for p in res.stats["pieces"]):
        assert res.verified.equivalent
    else:  # nothing cheaper: the input comes back, claiming no verdict, and says why
        assert res.verified is None and "no piece optimized" in res.stats["note"]


def test_default_strategy_is_mirages_without_splits():
    # splits are priced only where rules/block.egg's SplitOver Kern nodes allow them
    # (egraph/kernels.py turns the switch on); no default turns them on
    s = DEFAULT_STRATEGY
    assert (s.min_blocks, s.max_blocks, s.loop_ranges) == (32, 4096, (4, 16, 64))
    assert not s.allow_split_reduction


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(programs(max_ops=8))
def test_random_programs_plan_into_verified_mugraphs(g):
    p = plan(g, "h100")
    assert p.cost_us <= p.baseline_us + 1e-9
    assert p.cost_us == pytest.approx(mugraph_cost(p.mugraph).total_us)
    assert em.verify(g, p.mugraph, trials=TRIALS, seed=1).equivalent, (str(g), str(p.mugraph))


def test_a_deep_copy_of_a_kernel_prices_as_the_kernel():
    """A graph's derived facts (its node order, the padded tile shapes keyed by node ids)
    are not copied: a shape family deep-copies its plan's MuGraph and prices the copy."""
    import copy

    res = em.optimize(program("lora", 1), cache=False, time_limit_s=600)
    before = mugraph_cost(res.program).total_us
    assert mugraph_cost(copy.deepcopy(res.program)).total_us == before


def test_plans_sharing_a_search_dict_find_what_a_fresh_planner_finds():
    # ``shared`` keeps, across the plans of one search, each fragment's best schedule and its
    # candidate list (keyed by its structure, inputs' order, strategies and permit): a plan
    # made after others with the same dict is the one a planner with none makes
    g = program("rmsnorm", 1)
    fresh = plan(g)
    shared: dict = {}
    for _ in range(2):
        again = plan(g, shared=shared)
        assert str(again.mugraph) == str(fresh.mugraph)
        assert again.cost_us == fresh.cost_us
    assert any(isinstance(k, tuple) and k[0] == "candidates" for k in shared)


def test_kernel_costs_kept_across_plans_are_bounded(monkeypatch):
    # ``Planner._cost`` keeps each schedule's kernel costs in ``shared`` (another plan of the
    # search prices none of the same schedules again), at most COSTS_KEPT of them: a plan
    # with the oldest dropped is the same plan
    g = program("rmsnorm", 1)
    fresh = plan(g)
    shared: dict = {}
    plan(g, shared=shared)
    kept = len(shared["kernel costs"])
    again = plan(g, shared=shared)
    assert len(shared["kernel costs"]) == kept > 0
    assert str(again.mugraph) == str(fresh.mugraph) and again.cost_us == fresh.cost_us
    monkeypatch.setattr(planner_module, "COSTS_KEPT", 3)
    small: dict = {}
    bounded = plan(g, shared=small)
    assert len(small["kernel costs"]) == 3
    assert str(bounded.mugraph) == str(fresh.mugraph) and bounded.cost_us == fresh.cost_us


def _tiny(name: str) -> em.Graph:
    """An attention and an RMS-norm + matmul small enough that launches weigh (the tiny
    LLaMA layer's sizes): split schedules there are dearer than one kernel by their floor."""
    g = em.Graph(f"tiny_{name}")
    if name == "attention":
        q, k = g.input("Q", (2, 16, 64), "float32"), g.input("K", (2, 64, 128), "float32")
        v = g.input("V", (2, 128, 64), "float32")
        a = em.exp(q @ k)
        g.output((a / a.sum(axis=2, keepdims=True)) @ v, "O")
    else:
        x, w = g.input("X", (4, 256), "float32"), g.input("W", (256, 256), "float32")
        g.output((x / em.sqrt((x * x).mean(axis=1, keepdims=True))) @ w, "O")
    return g


@pytest.mark.parametrize("name", ["attention", "rms"])
def test_schedule_floor_is_below_every_cost_and_keeps_the_plan(name, monkeypatch):
    # ``Planner._floor`` (a launch per kernel, the fragment's bytes at the rate its blocks'
    # loads in flight allow) is at most the cost of every schedule worked out, splits
    # included; a schedule
    # whose floor is not below the best so far is skipped, and the plan is the one every
    # schedule worked out gives
    g, strategy = _tiny(name), replace(DEFAULT_STRATEGY, allow_split_reduction=True)
    seen: list[tuple[float, float]] = []
    cost = planner_module.Planner._cost

    def checked(self, frag, s, ix, origin):
        total, costs = cost(self, frag, s, ix, origin)
        seen.append((total, self._floor(frag, s, ix)))
        return total, costs

    monkeypatch.setattr(planner_module.Planner, "_cost", checked)
    pruned = plan(g, strategy=strategy)
    assert seen and all(total >= floor * planner_module.FLOOR_MARGIN for total, floor in seen)
    worked = len(seen)
    monkeypatch.setattr(planner_module.Planner, "_floor", lambda *args: 0.0)
    seen.clear()
    full = plan(g, strategy=strategy)
    assert str(pruned.mugraph) == str(full.mugraph) and pruned.cost_us == full.cost_us
    assert [r.why_not for r in pruned.regions] == [r.why_not for r in full.regions]
    assert all(total >= floor * planner_module.FLOOR_MARGIN for total, floor in seen)
    assert worked < len(seen)  # 17 of 63 and 38 of 670 schedules worked out
