"""Shape families: em.Dim, the padded masked program, scaling, verification at sizes, and
running any size through Triton (CPU interpreter)."""

import re

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.family.padding import dynamic_axes, padded_graph, plan_masks
from eqsat_mirage.family.runner import EVERY
from eqsat_mirage.family.scale import FamilyMember, NotScalableError, scaling
from eqsat_mirage.ir.node import Op
from eqsat_mirage.mugraph.program import from_graph


def attention(hint=256, safe=True, name="attn"):
    g = em.Graph(name)
    q = g.input("Q", (2, 32, 64))
    k = g.input("K", (2, 64, em.Dim("L", hint=hint)))
    v = g.input("V", (2, "L", 64))
    if safe:
        p = em.softmax(q @ k, axis=-1)
    else:
        a = em.exp(q @ k)
        p = a / a.sum(axis=2, keepdims=True)
    g.output(p @ v, "O")
    return g


def test_dim_declares_a_family_built_at_the_hint():
    g = attention(300)
    assert g.is_family and g.dims["L"].hint == 300
    assert g.dynamic == {"K": {2: "L"}, "V": {1: "L"}}
    assert g.inputs["K"].shape == (2, 64, 300)
    at = g.at({"L": 7})
    assert not at.is_family and at.inputs["V"].shape == (2, 7, 64)
    assert at.outputs["O"].shape == (2, 32, 64)


def test_dim_errors_name_the_problem():
    with pytest.raises(em.ShapeError, match="min <= hint <= max"):
        em.Dim("L", hint=10, max=5)
    g = em.Graph("g")
    g.input("A", (em.Dim("L", hint=8),))
    with pytest.raises(em.ShapeError, match="differs"):
        g.input("B", (em.Dim("L", hint=9),))
    with pytest.raises(em.DynamicShapeError, match="outside the range"):
        em.Dim("B", hint=4, max=8).check(9)
    fam = attention()
    with pytest.raises(em.DynamicShapeError, match="no symbolic size named"):
        fam.at({"N": 3})


def test_a_size_derived_from_the_dim_is_refused():
    g = em.Graph("cat")
    x = g.input("X", (4, em.Dim("L", hint=16)))
    y = g.input("Y", (4, 1))
    g.output(em.concat([x, y], axis=1), "O")
    with pytest.raises(em.DynamicShapeError, match="derived"):
        dynamic_axes(g)


def test_a_mean_over_the_dynamic_size_is_refused():
    g = em.Graph("mean")
    x = g.input("X", (4, em.Dim("L", hint=16)))
    g.output(x.mean(axis=1), "O")
    with pytest.raises(em.DynamicShapeError, match="mean over the dynamic size"):
        plan_masks(g)


@pytest.mark.parametrize("safe", [True, False])
def test_masks_go_on_the_scores_and_the_padded_program_is_exact(safe):
    g = attention(safe=safe)
    plan = plan_masks(g)
    assert len(plan.masks) == 1  # Q @ K, to -inf: max, exp, sum and @ V then see nothing
    padded = padded_graph(plan, {"L": 320}, {"L": 300})
    causal = [n for n in padded.nodes() if n.op is Op.CAUSAL]
    assert [n.arg for n in causal] == [(1, 320, 299)]
    rng = np.random.default_rng(0)
    ins = {"Q": rng.normal(size=(2, 32, 64)), "K": rng.normal(size=(2, 64, 300)),
           "V": rng.normal(size=(2, 300, 64))}
    want = em.evaluate(g.at({"L": 300}), ins)["O"]
    pad = {"Q": ins["Q"], "K": np.pad(ins["K"], [(0, 0), (0, 0), (0, 20)]),
           "V": np.pad(ins["V"], [(0, 0), (0, 20), (0, 0)])}
    np.testing.assert_allclose(em.evaluate(padded, pad)["O"], want, rtol=1e-10)


@pytest.fixture(scope="module")
def family_result():
    return em.optimize(attention(256), cache=False, time_limit_s=60)


def test_one_search_serves_every_size(family_result):
    res = family_result
    fam = res.stats["family"]
    assert not fam["fallback"]
    sizes = fam["verified_sizes"]
    assert {256, 255, 257} <= set(sizes) and all(sizes.values())
    assert min(sizes) < fam["granule"]  # a size below one tile was verified
    assert max(fam["bounds"].values()) <= 1e-9
    assert res.verified.equivalent
    shown = str(res)  # the family's report first, then the plan at its padded size
    assert shown.startswith("family       L(hint=256): planned at L = 256") and \
        "the listing below is the plan at L = 256" in shown and "mugraph" in shown
    # the loop (or the split's grid) grows with L, tiles do not
    assert fam["grows"]
    for n in (1, 255, 257, 1000):
        mg = res.at(n)
        assert mg.inputs["K"].shape[2] % fam["granule"] == 0 and mg.inputs["K"].shape[2] >= n


def test_a_plan_without_its_length_mask_fails_verification(family_result):
    sc = family_result.scaling
    ref = attention(256).at({"L": 250})
    member = FamilyMember(sc, 250, ref.inputs, ref.outputs)
    assert em.verify(ref, member, trials=2, seed=1).equivalent
    for k in member.program.kernels:  # an adversary moves the mask to the padded end
        if k.kind == "predefined" and k.node.op is Op.CAUSAL:
            rows, cols, _ = k.node.arg
            k.node = type(k.node)(Op.CAUSAL, (), (rows, cols, cols - 1), k.node.shape, "bool")
    assert not em.verify(ref, member, trials=2, seed=1).equivalent


def test_a_plan_reading_the_dynamic_dim_whole_does_not_scale_and_the_search_avoids_it():
    from eqsat_mirage.cost.tiles import dynamic_dims
    from eqsat_mirage.fusion.planner import plan as fusion_plan

    # planned at L = 96, a size no static dim has, as the family's search picks it (the
    # padded size names the dynamic dims of intermediates too)
    g = attention(96)
    padded = padded_graph(plan_masks(g), {"L": 96}, {"L": 96})
    whole = fusion_plan(padded).mugraph  # unconstrained: a 96-long L fits one tile
    with pytest.raises(NotScalableError, match="whole"):
        scaling(whole, g.dynamic, "L", 96)
    with dynamic_dims({"K": {2}, "V": {1}}, 96):  # a family's search refuses such schedules
        tiled = fusion_plan(padded).mugraph
    assert scaling(tiled, g.dynamic, "L", 96).granule <= 96
    # one kernel per op always scales: predefined kernels run at any size
    assert scaling(from_graph(padded), g.dynamic, "L", 96).granule == 1


def _kernels(source: str) -> str:
    """The @triton.jit functions of a generated module (everything up to its launcher)."""
    start = source.index("@triton.jit")
    return source[start:source.index("\ndef _bind", start)]


def test_compiled_family_runs_every_size_through_triton(family_result):
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    fn = family_result.compile()
    g = torch.Generator().manual_seed(0)
    for n in (256, 257, 5, 300):
        q = torch.randn(2, 32, 64, generator=g)
        k = torch.randn(2, 64, n, generator=g)
        v = torch.randn(2, n, 64, generator=g)
        want = torch.softmax(q @ k, -1) @ v
        got = fn(q.half(), k.half(), v.half())["O"].float()
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=2e-2, rtol=2e-2), n
    # one module serves every length: L, strides and loop counts are kernel arguments, and
    # the launcher computes the padded size, grids, loop counts and shapes from L
    assert list(fn.modules) == [EVERY] and not fn.launcher
    source = fn.modules[EVERY].source
    assert "PADDED = None" in source and "lp = -(-seq_len // GRANULE) * GRANULE" in source
    granule = family_result.scaling.granule
    loop = family_result.scaling.loop
    assert not loop or re.search(rf"seq_len, \(?lp // {granule}\b", source), source
    kernels = {0: _kernels(source)}
    assert "n_iter" in kernels[0] or not loop
    # K and V go in as they are (no padding copy): their loads are masked at L
    assert fn.short == {"K", "V"}
    from eqsat_mirage.codegen.tune import can_tune

    if can_tune("h100"):  # the family's kernels (runtime strides, n_iter) build for sm_90a
        from eqsat_mirage.codegen.compiled import compile_report

        built = compile_report(next(iter(fn.modules.values())).source, "h100")
        assert built and all(k.spill_bytes == 0 for k in built), built
    assert re.search(r"tl\.load\(K_ptrs, mask=\(offs_K_\d+\[None, :\] \+ f \* \d+ < seq_len\)",
                     next(iter(kernels.values())))
    with pytest.raises(em.MirageError, match=r"input 'K': expected shape \(2, 64, L\), got"):
        fn(torch.randn(2, 32, 64).half(), torch.randn(64, 100).half(),
           torch.randn(2, 100, 64).half())
    with pytest.raises(em.MirageError, match="must be a torch.Tensor of shape"):
        fn(torch.randn(2, 32, 64).half(), np.zeros((2, 64, 9)), torch.randn(2, 9, 64).half())
    with pytest.raises(em.MirageError, match="expected dtype float16, got float32"):
        fn(torch.randn(2, 32, 64), torch.randn(2, 64, 9).half(), torch.randn(2, 9, 64).half())
    with pytest.raises(em.MirageError, match="requires grad"):  # no silent loss of grads
        fn(torch.randn(2, 32, 64).half().requires_grad_(), torch.randn(2, 64, 9).half(),
           torch.randn(2, 9, 64).half())
    with pytest.raises(em.DynamicShapeError, match="disagree"):
        fn(torch.randn(2, 32, 64).half(), torch.randn(2, 64, 9).half(),
           torch.randn(2, 8, 64).half())


def test_mlp_with_a_dynamic_batch_one_search_every_batch():
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    g = em.Graph("mlp")
    x = g.input("X", (em.Dim("B", hint=16, max=64), 64))
    w1 = g.input("W1", (64, 128))
    w2 = g.input("W2", (64, 128))
    g.output(em.silu(x @ w1) * (x @ w2), "O")
    res = em.optimize(g, cache=False, time_limit_s=60)
    fam = res.stats["family"]
    assert all(fam["verified_sizes"].values()) and 64 in fam["verified_sizes"]
    fn = res.compile()
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(64, 128, generator=gen), torch.randn(64, 128, generator=gen)
    for batch in (1, 7, 16, 17, 64):
        xs = torch.randn(batch, 64, generator=gen)
        want = torch.nn.functional.silu(xs @ a) * (xs @ b)
        got = fn(xs.half(), a.half(), b.half())["O"].float()
        assert got.shape == (batch, 128)
        assert (got - want).abs().max() <= 1e-2 * want.abs().max(), batch  # fp16 products
    with pytest.raises(em.DynamicShapeError, match="outside the range"):
        fn(torch.randn(65, 64).half(), a.half(), b.half())


@pytest.mark.slow  # 22 interpreted steps
def test_a_decode_loop_over_64_lengths_uses_one_search_and_matches_eager_every_step():
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    g = em.Graph("decode")  # one query token per head, 4 query heads per KV head (GQA)
    q = g.input("Q", (2, 4, 64))
    k = g.input("K", (2, 64, em.Dim("L", hint=256)))
    v = g.input("V", (2, "L", 64))
    g.output(em.softmax(q @ k, axis=-1) @ v, "O")
    res = em.optimize(g, cache=False, time_limit_s=60)
    assert all(res.stats["family"]["verified_sizes"].values())
    fn = res.compile()
    gen = torch.Generator().manual_seed(2)
    kc, vc = torch.randn(2, 64, 320, generator=gen), torch.randn(2, 320, 64, generator=gen)
    for n in range(256, 320, 3):  # the KV cache grows three tokens per step, 256 to 319
        qs = torch.randn(2, 4, 64, generator=gen).half()
        kk, vv = kc[:, :, :n].half().contiguous(), vc[:, :n].half().contiguous()
        want = torch.softmax(qs.float() @ kk.float(), -1) @ vv.float()
        got = fn(qs, kk, vv)["O"].float()
        assert (got - want).abs().max() <= 1e-2, n
    assert len(fn.modules) == 1  # one module for every length and padded size


def test_a_family_is_cached_whole_and_a_hit_skips_search_and_verification(tmp_path):
    path = tmp_path / "c.sqlite"
    first = em.optimize(attention(name="cached"), cache=path)
    said = []
    again = em.optimize(attention(name="cached"), cache=path, progress=said.append)
    assert first.stats["cache"] == "miss" and again.stats["cache"] == "hit"
    assert any("cache hit" in m for m in said) and not any("iteration" in m for m in said)
    assert again.stats["family"]["verified_sizes"] == first.stats["family"]["verified_sizes"]
    assert again.scaling.granule == first.scaling.granule and again.cost_us == first.cost_us
    x = {n: np.random.default_rng(0).standard_normal(v.shape) for n, v in
         again.at(300).inputs.items()}
    np.testing.assert_allclose(em.evaluate(again.at(300), x)["O"],
                               em.evaluate(first.at(300), x)["O"])


def test_an_fp32_family_whose_plans_store_masked_scores_is_optimized():
    """fp32 attention at L hint 3000 (planned at 3008): the schedules left once L may not be
    read whole store the masked scores to device memory between kernels. The field
    interpreter keeps such a tensor masked (it used to drop the mask, so every correct plan
    was rejected), and plans whose loop or split part writes values relative to a partial
    maximum are refused by the planner (they used to be built, then rejected)."""
    g = em.Graph("a32")
    q = g.input("Q", (2, 8, 32), dtype="float32")
    k = g.input("K", (2, 32, em.Dim("L", hint=3000)), dtype="float32")
    v = g.input("V", (2, "L", 32), dtype="float32")
    g.output(em.softmax(q @ k, axis=-1) @ v, "O")
    res = em.optimize(g, time_limit_s=60, cache=False)
    assert res.verified.equivalent and res.cost_us < 0.8 * res.baseline_cost_us, res
    assert all(res.stats["family"]["verified_sizes"].values())


def test_a_family_that_is_not_one_lax_program_is_refused_before_any_search():
    g = em.Graph("two")
    h = g.input("X", (2, 16, 64))
    for i in range(2):  # exp feeding exp: a whole program would be cut into Lax pieces
        k, v = g.input(f"K{i}", (2, 64, em.Dim("L", hint=256))), g.input(f"V{i}", (2, "L", 64))
        h = em.softmax(h @ k, axis=-1) @ v
    g.output(h, "Y")
    said = []
    with pytest.raises(em.LaxError, match="not cut into pieces yet.*torch.compile"):
        em.optimize(g, cache=False, progress=said.append)
    assert said == []  # nothing was searched


def test_a_max_over_the_dynamic_size_as_an_output_verifies():
    """A bare max over L is an output: the padded program's masked max must equal the
    real max (the field semantics used to hash the padded columns' mask into it, so every
    plan, even one kernel per op, was rejected as NOT equivalent)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    g = em.Graph("rowmax")
    k = g.input("K", (4, em.Dim("L", hint=128, max=512)), dtype="float32")
    g.output(k.max(axis=1, keepdims=True), "m")
    res = em.optimize(g, cache=False, time_limit_s=30)
    fam = res.stats["family"]
    assert res.verified.equivalent and not fam["fallback"], fam
    assert all(fam["verified_sizes"].values()) and len(fam["verified_sizes"]) >= 5
    fn = res.compile()
    for n in (1, 100, 129, 512):  # all negative: a zero padding column would win the max
        x = -torch.rand(4, n) - 1.0
        torch.testing.assert_close(fn(x)["m"], x.amax(dim=1, keepdim=True))


def test_the_size_checks_stop_at_their_deadline_and_the_family_is_not_served(family_result):
    """Every verification is bounded: the checks at sizes have a deadline (the search's
    time limit again, in ``em.optimize``); one past it leaves the plan unverified, says
    where, and never falls back to a second, unbounded round of checks."""
    from eqsat_mirage.family.sizes import check_sizes, family_rows
    from eqsat_mirage.ir.limits import Deadline

    g = attention(256)
    (dim,) = g.dims.values()
    lp0 = family_result.stats["family"]["planned_at"]
    padded = padded_graph(plan_masks(g), {"L": lp0}, {"L": dim.hint})
    said = []
    gone = Deadline(1e-6, start=0.0)  # long past
    checked = check_sizes(g, padded, family_result.program, dim, lp0,
                          dict(trials=2, seed=0, max_bound=1e-9), said.append, gone)
    assert not checked.ok and not checked.fallback
    assert list(checked.verdicts) == [256]  # stopped at the first size
    assert checked.verdicts[256].inconclusive
    assert checked.timed_out == "the size checks' share of the time limit (0.0 s) ran out at L=256"
    assert said == [f"family 'attn': {checked.timed_out}; not served"]
    record = checked.record(dim, lp0, 1, {256: 1.0}, 0.0)
    assert record["timed_out"] == checked.timed_out
    assert f"  not verified: {checked.timed_out}" in family_rows(record)


@pytest.mark.parametrize("hint", [256, 100])
def test_the_pair_draws_run_at_the_hint_and_the_tightest_size(hint, monkeypatch):
    """The float checks' pair draws (quadratic in the inputs: 26 of 27 s a size on a
    19-input attention family) judge the algebraic form, the same at every size: they run
    at the hint, and at the size whose overflow headroom is tightest against the square of
    its longest reduction; every other size still gets the field trials and the per-input
    draws."""
    from eqsat_mirage.family import sizes
    from eqsat_mirage.family.sizes import check_sizes, test_sizes
    from eqsat_mirage.verifier.floatcheck import headroom_slack

    g = attention(hint)
    family_result = em.optimize(g, cache=False)

    (dim,) = g.dims.values()
    lp0 = family_result.stats["family"]["planned_at"]
    padded = padded_graph(plan_masks(g), {"L": lp0}, {"L": dim.hint})
    seen = {}

    def spy(real, pairs):
        def check(ref, member, **kw):
            res = real(ref, member, **kw)
            seen[ref.inputs["K"].shape[-1]] = (pairs, res.trials, res.float_checked)
            return res
        return check
    monkeypatch.setattr(sizes, "verify", spy(sizes.verify, True))
    monkeypatch.setattr(sizes, "verify_without_pairs", spy(sizes.verify_without_pairs, False))
    checked = check_sizes(g, padded, family_result.program, dim, lp0,
                          dict(trials=2, seed=0, max_bound=1e-9), lambda m: None)
    assert checked.ok and set(seen) == set(checked.verdicts)
    slack = {s: headroom_slack(g.at({"L": s})) for s in test_sizes(dim, checked.scaling.granule)}
    tight = min(slack, key=lambda s: (slack[s], s != hint))
    assert {s for s, (p, _, _) in seen.items() if p} == {hint, tight}
    assert (tight == hint) == (hint == 256)  # 256 squared is a power of two: slack 1
    assert all(t >= 2 and floats for _, t, floats in seen.values())


def test_when_the_budget_moves_the_largest_size_the_tightest_verified_gets_the_pairs(
        monkeypatch):
    """The memory budget refuses L = 1024 (the tightest headroom, planned for the pair
    draws) and moves it to 562: the tightest size then verified is 103, and it gets the
    pair draws (before, 562 kept them, the second loosest)."""
    from types import SimpleNamespace

    from eqsat_mirage.family import sizes
    from eqsat_mirage.ir.errors import BudgetError
    from eqsat_mirage.verifier.floatcheck import headroom_slack

    g = em.Graph("a")
    q = g.input("Q", (2, 32, 64))
    k = g.input("K", (2, 64, em.Dim("L", hint=100, max=1024)))
    v = g.input("V", (2, "L", 64))
    g.output(em.softmax(q @ k, axis=-1) @ v, "O")
    (dim,) = g.dims.values()
    runs = []

    def fake(pairs):
        def check(ref, member, time_limit_s=None, **opts):
            n = ref.inputs["K"].shape[2]
            if n > 600:
                raise BudgetError(f"L={n} does not fit")
            runs.append((n, pairs))
            return SimpleNamespace(equivalent=True)
        return check
    monkeypatch.setattr(sizes, "verify", fake(True))
    monkeypatch.setattr(sizes, "verify_without_pairs", fake(False))
    monkeypatch.setattr(sizes, "FamilyMember", lambda *a: None)
    refused = {}
    verdicts, _ = sizes.verify_sizes(g, SimpleNamespace(granule=128), dim, {}, refused)
    assert list(refused) == [1024] and 562 in verdicts
    slack = {n: headroom_slack(g.at({"L": n})) for n in verdicts}
    tight = min(slack, key=slack.get)
    assert tight == 103 and (103, True) in runs and (562, True) not in runs
    assert {n for n, p in runs if p} == {100, 103}


def _failing_plans(monkeypatch, how_many):
    """``verify_sizes`` made to fail at hint + 1 for the first ``how_many`` plans with a
    custom kernel (one kernel per op is checked for real); the plans it failed."""
    from eqsat_mirage.family import sizes
    from eqsat_mirage.verifier.verify import VerifyResult

    real, failed = sizes.verify_sizes, []

    def fake(graph, sc, dim, opts, refused, deadline=None):
        custom = any(k.kind == "custom" for k in sc.mg.kernels)
        if not custom or len(failed) >= how_many:
            return real(graph, sc, dim, opts, refused, deadline)
        failed.append(sc.mg)
        bad = VerifyResult(False, 1.0, reason="differs (planted)")
        return {dim.hint: real(graph, sc, dim, opts, refused, deadline)[0][dim.hint],
                dim.hint + 1: bad}, None
    monkeypatch.setattr(sizes, "verify_sizes", fake)
    return failed


def test_a_plan_failing_at_one_size_sends_the_search_to_its_next_plan(monkeypatch):
    """A family's plans are checked at its sizes inside the search (``SizeGate``): the
    first plan failing at L = 257 is refused like any unverified plan, and the search's
    next plan serves the family, not one kernel per op."""
    failed = _failing_plans(monkeypatch, 1)
    said = []
    res = em.optimize(attention(256), cache=False, time_limit_s=120, progress=said.append)
    fam = res.stats["family"]
    assert len(failed) == 1 and res.program is not failed[0]
    assert not fam["fallback"] and all(fam["verified_sizes"].values())
    assert any(k.kind == "custom" for k in res.program.kernels)
    assert res.verified.equivalent and res.cost_us < res.baseline_cost_us
    refused = [p for p in res.stats["plans"] if p.get("refused")]
    assert len(refused) == 1 and refused[0]["verified"]  # verified at the hint, not at 257
    assert refused[0]["refused"].startswith("the plan fails at L=257: ")
    assert "family 'attn': the plan fails at L=257" in "\n".join(said)


def test_when_every_plan_fails_at_sizes_one_kernel_per_op_serves_the_family(monkeypatch):
    """Every plan of this search (two) fails at a size: the family falls back to one kernel
    per op, and its report says the first plan's failure and counts the others."""
    failed = _failing_plans(monkeypatch, 99)
    res = em.optimize(attention(256), cache=False, time_limit_s=120)
    fam = res.stats["family"]
    assert len(failed) == 2 and len([p for p in res.stats["plans"] if p.get("refused")]) == 2
    assert fam["fallback"].startswith("the plan fails at L=257: ")
    assert fam["fallback"].endswith("(1 more plan(s) failed too)")
    assert all(k.kind == "predefined" for k in res.program.kernels)
    assert all(fam["verified_sizes"].values()) and res.verified.equivalent


def test_the_checks_at_sizes_stop_after_their_number_of_plans(monkeypatch):
    """At most ``SizeGate.TRIES`` plans are checked at sizes (six verifications each): the
    plans after them are not even verified at the hint."""
    from eqsat_mirage.family.sizes import SizeGate

    monkeypatch.setattr(SizeGate, "TRIES", 1)
    failed = _failing_plans(monkeypatch, 99)
    res = em.optimize(attention(256), cache=False, time_limit_s=120)
    plans = res.stats["plans"]
    assert len(failed) == 1 and len(plans) >= 2
    assert plans[0]["refused"] and all(p["verified"] is None for p in plans[1:])
    assert res.stats["family"]["fallback"].startswith("the plan fails at L=257: ")
    assert all(k.kind == "predefined" for k in res.program.kernels)


@pytest.mark.slow
def test_the_checks_at_sizes_do_not_spend_the_searchs_time(monkeypatch):
    """The gate's checks have their own deadline (the time limit again): the time they take
    moves the search's shares later, so a slow check of the first plan leaves the next
    plan its verification (without it, the search ran out of time on row 48's 64-op
    decode piece and the family went to one kernel per op)."""
    import time

    from eqsat_mirage.family import sizes
    from eqsat_mirage.ir.limits import Deadline
    from eqsat_mirage.verifier.verify import VerifyResult

    real, calls = sizes.verify_sizes, []

    def slow(graph, sc, dim, opts, refused, deadline=None):
        custom = any(k.kind == "custom" for k in sc.mg.kernels)
        if custom and not calls:  # the first plan: its checks outlast the search's limit
            calls.append(sc.mg)
            time.sleep(20.0)
            bad = VerifyResult(False, 1.0, reason="differs (planted)")
            return {dim.hint: bad}, bad
        return real(graph, sc, dim, opts, refused, deadline)

    monkeypatch.setattr(sizes, "verify_sizes", slow)
    monkeypatch.setattr(sizes.SizeGate, "clock", lambda self: Deadline(None))
    res = em.optimize(attention(256), cache=False, time_limit_s=20)
    fam = res.stats["family"]
    assert len(calls) == 1 and res.program is not calls[0]
    assert not fam["fallback"] and all(fam["verified_sizes"].values()), fam
    assert any(k.kind == "custom" for k in res.program.kernels)


def test_a_plan_whose_checks_cannot_run_or_are_cut_is_refused(family_result, monkeypatch):
    """A plan the checks at sizes cannot check (an error), or whose checks the clock cut,
    cannot serve the family: it is refused like a failing one (the search's next plan is
    tried), never kept unverified."""
    from eqsat_mirage.family import sizes
    from eqsat_mirage.ir.errors import BudgetError
    from eqsat_mirage.ir.limits import Deadline
    from eqsat_mirage.verifier.verify import VerifyResult

    g = attention(256)
    (dim,) = g.dims.values()
    plan = family_result.program

    def over_budget(*args, **kw):
        raise BudgetError("planted: over the memory budget")
    monkeypatch.setattr(sizes, "verify_sizes", over_budget)
    gate = sizes.SizeGate(g, dim, 256, dict(trials=2, seed=0), lambda m: None, 60.0)
    assert gate(plan) == ("not checked at the family's sizes: BudgetError: planted: over the "
                          "memory budget")
    assert gate.kept(plan) is None and gate.tried == 1

    def cut(graph, sc, dim, opts, refused, deadline=None):
        v = VerifyResult(False, 1.0, reason="stopped (planted)", inconclusive=True)
        return {dim.hint: v}, v
    monkeypatch.setattr(sizes, "verify_sizes", cut)
    monkeypatch.setattr(sizes.SizeGate, "clock", lambda self: Deadline(1e-6, start=0.0))
    assert gate(plan) == "the size checks' share of the time limit (0.0 s) ran out at L=256"
    assert gate.kept(plan) is None and len(gate.refusals) == 2


def test_the_number_of_plans_checked_counts_those_that_pass():
    """With tuning, every plan it times goes through the checks at sizes: at most
    ``SizeGate.TRIES`` plans are checked, passed or refused, so a family's search is
    bounded by that many time limits."""
    from eqsat_mirage.family import sizes

    gate = sizes.SizeGate(attention(256), em.Dim("L", hint=256), 256, {}, lambda m: None)
    gate.tried = sizes.SizeGate.TRIES
    assert gate.done and gate(object()).startswith("not checked at the family's sizes (3 ")
