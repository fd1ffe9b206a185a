"""Issue 32, through torch.compile: one compiled graph's partitions share ``time_limit_s``
(the compile call holds it, not each partition), pieces cut by the time limit are named in
the graph's warning and run as they were, and the pieces that verified run optimized.
Time limits are cut by hand; the tests assert invariants, not speed."""

from __future__ import annotations

import warnings

import pytest

import eqsat_mirage as em
from eqsat_mirage.pipeline import whole

torch = pytest.importorskip("torch")
from bench.whole_programs import decoder_stack  # noqa: E402
from eqsat_mirage.dynamo import backend as torch_backend  # noqa: E402
from eqsat_mirage.dynamo.report import ran_out_of_time  # noqa: E402

nn = torch.nn


class SortInTheMiddle(nn.Module):
    """Two partitions: the sort between them is not supported."""

    def __init__(self, d=8):
        super().__init__()
        self.proj, self.out = nn.Linear(d, d), nn.Linear(d, d, bias=False)

    def forward(self, x):
        y = torch.softmax(self.proj(x), dim=-1)
        z = torch.sort(y, dim=-1).values
        return self.out(torch.relu(z) * y)


def test_the_partitions_of_a_graph_share_its_time_limit(monkeypatch):
    real, limits = torch_backend.optimize, []

    def recorded(graph, **options):
        limits.append(options["time_limit_s"])
        return real(graph, **options)

    monkeypatch.setattr(torch_backend, "optimize", recorded)
    torch.manual_seed(0)
    m, x = SortInTheMiddle().eval(), torch.randn(3, 8)
    be = em.backend(time_limit_s=60.0, iter_limit=4, warmup=0, warn=False)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(m, backend=be)(x), m(x))
    assert len(be.report) == 2 and len(limits) == 2
    assert all(0 < s < 60.0 for s in limits)
    weights = [e.weight for e in be.report]  # expected search costs (limits.search_weight)
    assert all(w >= len(e.ops) for w, e in zip(weights, be.report))
    assert limits[0] <= 60.0 * weights[0] / sum(weights) + 1e-6  # a share by its weight
    # the second partition gets at most what the first left of the whole limit
    assert limits[1] <= 60.0 - be.report[0].seconds + 1e-6


def test_a_piece_cut_by_the_time_limit_is_named_and_the_others_run_optimized(monkeypatch):
    real, calls = whole.search, []

    def later_pieces_have_no_time(graph, options, **kwargs):
        calls.append(graph)
        if len(calls) > 1:
            options = options.replace(time_limit_s=0.001)
        return real(graph, options, **kwargs)

    monkeypatch.setattr(whole, "search", later_pieces_have_no_time)
    model, x = decoder_stack(1, d=64, heads=2, f=128, seq=16)
    be = em.backend(warmup=0, time_limit_s=120)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(model, backend=be)(x)
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    (entry,) = be.report
    pieces = entry.result.stats["pieces"]
    late = [p for p in pieces if p["time_limited"]]
    assert entry.status == "optimized" and late
    assert any(p["status"] == "optimized" for p in pieces)
    assert all(p["status"] == "unchanged" for p in late)
    (said,) = [str(w.message) for w in caught if str(w.message).startswith("eqsat-mirage: ")]
    assert "ran out of time" in said
    for p in late:  # each searched piece by name; one equal to it is named beside it
        if p["same_as"] is None:
            assert f"{entry.name} piece {p['index']} ({len(p['ops'])} ops" in said, said
        else:
            assert "equal piece(s)" in said and str(p["index"]) in said, said
    s = be.summary()
    assert 0 < s["optimized_ops"] < s["ops"]
    assert s["graphs"][0]["time_limited"] == ran_out_of_time(entry)
    assert all(", spent " in t and "share" in t for t in ran_out_of_time(entry))
    # the time-limited ops counted in the graph's own compute ops, as the coverage is (not
    # the pieces' program ops): exactly those the optimized pieces leave out here
    late_ops = s["time_limited_compute_ops"]
    assert late_ops == entry.time_limited_compute_ops == s["graphs"][0][
        "time_limited_compute_ops"]
    assert 0 < late_ops == s["compute_ops"] - s["optimized_compute_ops"], s


# -- time_limit_s="auto" (the default): the limit grows with the program's work ------------


def test_the_automatic_limit_grows_with_the_work_and_is_capped():
    from eqsat_mirage.ir.limits import AUTO_EVALS, AUTO_MAX_S, auto_time_limit

    assert AUTO_MAX_S > 900.0  # a 7B layer's search (140-200 s here) far from its cap

    assert auto_time_limit(0.0, 30.0, 50.0) == 30.0
    seven_b = 45.6e9  # a LLaMA-7B layer's matmuls at sequence 128
    assert auto_time_limit(seven_b, 30.0, 57.0) == pytest.approx(
        30.0 + AUTO_EVALS * seven_b / 57e9, abs=0.1)
    assert auto_time_limit(1e15, 30.0, 57.0) == AUTO_MAX_S  # capped
    assert auto_time_limit(1e15, 2000.0, 57.0) == 2000.0  # never below the base
    assert auto_time_limit(seven_b, 30.0, 100.0) < auto_time_limit(seven_b, 30.0, 50.0)


def test_a_time_limit_that_is_neither_seconds_nor_auto_is_refused():
    g = em.Graph("t")
    g.output(g.input("x", (4, 8)) @ g.input("w", (8, 4)), "y")
    with pytest.raises(ValueError, match="'auto'"):
        em.optimize(g, time_limit_s="soon", cache=None)


def test_optimize_reports_the_limit_it_used():
    g = em.Graph("t")
    g.output(g.input("x", (4, 8)) @ g.input("w", (8, 4)), "y")
    res = em.optimize(g, cache=None, iter_limit=2)
    assert res.stats["time_limit_auto"] is True
    assert 600.0 <= res.stats["time_limit_s"] < 600.5  # a toy program: the base (a cap)
    res = em.optimize(g, cache=None, iter_limit=2, time_limit_s=20)
    assert res.stats["time_limit_s"] == 20 and res.stats["time_limit_auto"] is False


def test_fx_matmul_flops_count_linear_matmul_and_attention():
    from eqsat_mirage.dynamo.specs import input_elements, matmul_flops

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 32, bias=False)

        def forward(self, q, k, v, x):
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v)  # (1, 2, 8, 4)
            return self.proj(x), a, x @ x.transpose(0, 1)

    counted = []

    def be(gm, example):
        calls = [n for n in gm.graph.nodes if n.op.startswith("call")]
        counted.append(matmul_flops(calls))
        counted.append(input_elements(calls))
        return gm.forward

    q, k, v = torch.randn(1, 2, 8, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    x = torch.randn(5, 16)
    torch._dynamo.reset()
    torch.compile(Block(), backend=be)(q, k, v, x)
    want = (2 * 5 * 32 * 16            # linear: 5 x 32 outputs of 16 products
            + 2 * 6 * (1 * 2 * 8 * 4) * 2  # attention: q k^T and p v, 6 keys
            + 2 * 5 * 5 * 16)          # x @ x^T
    drawn = q.numel() + k.numel() + v.numel() + x.numel() + 32 * 16  # inputs and weight
    assert counted == [want, drawn]


def test_the_backend_reports_each_graphs_limit():
    torch.manual_seed(0)
    m, x = SortInTheMiddle().eval(), torch.randn(3, 8)
    be = em.backend(iter_limit=2, warmup=0, warn=False)
    with torch.no_grad():
        torch.compile(m, backend=be)(x)
    (graph,) = be.summary()["graphs"]
    assert 300.0 <= graph["time_limit_s"] < 300.5  # a toy graph: the base (a cap)


def test_the_cache_key_keeps_auto_not_the_measured_limit(monkeypatch):
    """"auto" resolves through a timing of this machine; the results cache keys on "auto"
    itself, so two processes (two measured speeds) share their entries."""
    from eqsat_mirage.pipeline.cache import make_key
    from eqsat_mirage.pipeline.options import SearchOptions
    from eqsat_mirage.verifier import blas

    g = em.Graph("big")
    g.output(g.input("x", (64, 1024)) @ g.input("w", (1024, 1024)), "y")
    opts = SearchOptions()
    assert opts.time_limit_s == "auto"
    keys, limits = [], []
    for rate in (40.0, 90.0):
        monkeypatch.setattr(blas, "gflops", lambda rate=rate: rate)
        limits.append(opts.limit_for(g))
        keys.append(make_key(g, opts.resolved().key_data()))
    assert limits[0] > limits[1] > 60.0  # a slower machine gets more time
    assert keys[0] == keys[1]


def test_bad_time_limits_are_refused_where_they_are_given():
    with pytest.raises(ValueError, match="'auto'"):
        em.backend(time_limit_s="soon")
    g = em.Graph("t")
    g.output(g.input("x", (4, 8)) @ g.input("w", (8, 4)), "y")
    with pytest.raises(ValueError, match="number of seconds"):
        em.verify(g, g, time_limit_s="auto")
