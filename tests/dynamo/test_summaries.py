"""Issue 52 (part B): ``be.summary()`` and ``be.report`` hold every graph the backend saw,
with its outcome and reason (a graph run eagerly as a whole, a partition that falls back at
its first call); ``min_ops`` is the same rule for static graphs and shape families; a gain
within ``MIN_GAIN`` is not "optimized"; a graph nothing was priced in says "not priced";
a graph's time limit is shared by expected search cost, and time unused passes on."""

from __future__ import annotations

import time
import warnings
from types import SimpleNamespace

import pytest

import eqsat_mirage as em
from eqsat_mirage.ir.limits import (
    MATMUL_SEARCH_WEIGHT,
    REDUCE_SEARCH_WEIGHT,
    Shares,
    search_weight,
)
from eqsat_mirage.pipeline import whole

torch = pytest.importorskip("torch")
from torch_models import GatedMLP  # noqa: E402

from eqsat_mirage.dynamo import backend as torch_backend  # noqa: E402
from eqsat_mirage.dynamo import runtime  # noqa: E402
from eqsat_mirage.dynamo.report import PartitionReport, ran_out_of_time  # noqa: E402

nn, F = torch.nn, torch.nn.functional
FAST = dict(time_limit_s=60.0, iter_limit=4, warmup=0)


def test_a_graph_run_eagerly_as_a_whole_is_in_the_summary_with_its_reason():
    torch.manual_seed(0)
    m, x = GatedMLP(), torch.randn(2, 8)  # parameters require grad: the graph is refused
    be = em.backend(warn=False, **FAST)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warn=False: silent, the summary still says it
        got = torch.compile(m, backend=be)(x)
    torch.testing.assert_close(got, m(x))
    s = be.summary()
    (g,) = s["graphs"]
    calls = sum(n.op.startswith("call") for n in torch.fx.symbolic_trace(m).graph.nodes)
    assert g["outcome"] == "eager" and "no backward" in g["reason"]
    assert s["ops"] == g["ops"] == calls > 0 and s["optimized_ops"] == 0
    assert g["predicted_us"] is None and s["predicted_us"] is None
    (entry,) = be.report
    assert entry.name == "graph_1" and entry.status == "eager" and "no backward" in entry.reason
    assert len(entry.ops) == calls


def test_a_partition_failing_at_its_first_call_is_counted_as_fallen_back(monkeypatch):
    monkeypatch.setenv("EQSAT_MIRAGE_STRICT", "0")  # the fallback is for users; strict raises

    def invalid_storage(**tensors):  # what torchao's int8 weights gave
        raise RuntimeError("Attempted to access the data pointer on an invalid python storage")

    monkeypatch.setattr(runtime.OptimizedPartition, "runner",
                        lambda self, device: ("triton", invalid_storage))
    torch.manual_seed(0)
    m, x = GatedMLP().eval(), torch.randn(2, 8)
    be = em.backend(warn=False, **FAST)
    with torch.no_grad(), pytest.warns(UserWarning, match="invalid python storage"):
        got = torch.compile(m, backend=be)(x)
        torch.testing.assert_close(got, m(x))
    (entry,) = be.report
    assert entry.status == "fallback" and "invalid python storage" in entry.reason
    s = be.summary()
    (g,) = s["graphs"]
    assert s["optimized_ops"] == s["optimized_partitions"] == 0 and s["ops"] > 0
    assert g["outcome"] == "eager" and "fallback" in g["reason"]
    assert any(entry.name in e and "invalid python storage" in e for e in s["eager"])
    assert s["predicted_us"] is None and s["launches"] == {}


@pytest.mark.parametrize("dynamic", [False, True])
def test_min_ops_is_the_same_rule_for_static_graphs_and_shape_families(monkeypatch, dynamic):
    searched = []
    monkeypatch.setattr(torch_backend, "optimize",
                        lambda graph, **options: searched.append(graph))
    be = em.backend(min_ops=2, **FAST)
    x = torch.randn(6, 8)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(F.silu, backend=be, dynamic=dynamic)(x)
    torch.testing.assert_close(got, F.silu(x))
    assert searched == [] and [(r.name, r.status) for r in be.report] == [("graph_1", "eager")]
    (g,) = be.summary()["graphs"]
    assert g["sizes"] == "static" if not dynamic else g["sizes"] != "static"
    assert g["outcome"] == "eager" and g["partitions"] == 0
    assert any("below min_ops=2" in e for e in g["eager"]), g["eager"]
    (said,) = [str(w.message) for w in caught if str(w.message).startswith("eqsat-mirage: ")]
    assert "not priced" in said and "0.00 us -> 0.00 us" not in said


def test_a_graph_nothing_was_priced_in_says_so():
    be = em.backend(**FAST)
    with torch.no_grad(), pytest.warns(UserWarning) as caught:
        torch.compile(lambda x: torch.sort(x).values.tanh(), backend=be)(torch.ones(3))
    (said,) = [str(w.message) for w in caught if str(w.message).startswith("eqsat-mirage: ")]
    assert said.startswith("eqsat-mirage: 0 of 3 ops in 0 optimized partitions (not priced")
    assert "0.00 us" not in said


def _result(before: float, after: float) -> SimpleNamespace:
    return SimpleNamespace(stats={}, verified=SimpleNamespace(equivalent=True),
                           cost_us=after, baseline_cost_us=before)


def test_a_gain_within_min_gain_is_not_optimized():
    tiny = _result(3.02, 3.01)  # a lone silu's prediction
    assert 0 < (3.02 - 3.01) / 3.02 < whole.MIN_GAIN
    assert not whole.changed(tiny) and not whole.improved(tiny)
    why = whole.unchanged_reason(tiny)
    assert "below MIN_GAIN" in why and "3.02 -> 3.01 us" in why
    assert whole.changed(_result(3.02, 3.02 * (1 - 2 * whole.MIN_GAIN)))


def test_unused_share_passes_on_and_shares_follow_the_weights():
    now = time.perf_counter()
    shares = Shares(12.0, [1.0, 2.0, 3.0], start=now)
    first = shares.share(0)
    assert first == pytest.approx(12.0 * 1 / 6, abs=0.05)
    # the first job used 1 s of its 2: the other two split the 11 s left as 2 : 3
    later = Shares(12.0, [1.0, 2.0, 3.0], start=now - 1.0)
    assert later.share(1) == pytest.approx(11.0 * 2 / 5, abs=0.05)
    # the second used all of its share at once: the third gets everything left
    last = Shares(12.0, [1.0, 2.0, 3.0], start=now - 12.0 + 3.0)
    assert last.share(2) == pytest.approx(3.0, abs=0.05)


def test_search_weight_counts_matmuls_and_reductions():
    g = em.Graph("attn")
    q, k, v = (g.input(n, (4, 8)) for n in "qkv")
    s = q @ k.T
    p = em.exp(s - s.max(-1, keepdims=True))
    out = (p / p.sum(-1, keepdims=True)) @ v
    g.output(out)
    h = em.Graph("ew")
    y = h.input("y", (4, 8))
    h.output(-em.exp(em.tanh(y * 2.0 + 1.0)))
    attention, elementwise = search_weight(g.nodes()), search_weight(h.nodes())
    ops = sum(n.op.name not in ("INPUT", "CONST") for n in g.nodes())
    assert attention == ops + 2 * MATMUL_SEARCH_WEIGHT + 2 * REDUCE_SEARCH_WEIGHT
    assert elementwise == sum(n.op.name not in ("INPUT", "CONST") for n in h.nodes())
    assert attention > 2 * elementwise  # more ops on one side, and the costly ones


class AttentionThenElementwise(nn.Module):
    """Two partitions (the sort between them is not supported): one SDPA call, then four
    elementwise ops; by op count the SDPA would get a fifth of the time."""

    def forward(self, q, k, v):
        a = F.scaled_dot_product_attention(q, k, v)
        z = torch.sort(a, dim=-1).values
        return torch.tanh(z * 2.0 + 1.0).neg()


def test_an_attention_partition_gets_the_larger_share(monkeypatch):
    limits = []

    def recorded(graph, **options):  # the searches themselves are not the point here
        limits.append(options["time_limit_s"])
        return _result(1.0, 1.0)

    monkeypatch.setattr(torch_backend, "optimize", recorded)
    be = em.backend(time_limit_s=100.0, warmup=0, warn=False, min_ops=1)
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    with torch.no_grad():
        torch.compile(AttentionThenElementwise(), backend=be)(q, k, v)
    sdpa, ew = be.report
    assert len(sdpa.ops) == 1 and len(ew.ops) == 4 and len(limits) == 2
    assert sdpa.weight > ew.weight and limits[0] > 50.0  # by op count it was 20 s
    assert sdpa.share_s == limits[0] and ew.share_s == limits[1]
    assert limits[1] > 100.0 - limits[0] - 1.0  # what the first left (all but its time)
    assert all(e.status == "unchanged" for e in be.report)


def test_a_partition_out_of_time_says_its_share_and_what_it_spent():
    entry = PartitionReport("part_1_0", ["mm", "silu"], status="unchanged", share_s=5.0,
                            seconds=5.2, result=SimpleNamespace(stats={"time_limited": True}))
    assert ran_out_of_time(entry) == ["part_1_0 (2 ops; share 5.0 s, spent 5.2 s)"]
    pieces = [{"index": 0, "ops": ["matmul", "exp"], "time_limited": True, "same_as": None,
               "share_s": 3.0, "seconds": 3.1}]
    entry.status, entry.result = "optimized", SimpleNamespace(stats={"pieces": pieces})
    (said,) = ran_out_of_time(entry)
    assert said == ("part_1_0 piece 0 (2 ops: matmul, exp; share 3.0 s of the partition's "
                    "5.0 s, spent 3.1 s)")


def test_a_call_that_returns_nothing_is_not_listed_as_eager():
    """A Python call Dynamo records that computes nothing (the usage logging that torchao
    and transformers call in forward) is not work left eager: the summary does not list it."""
    class Logged(torch.nn.Module):
        def forward(self, x):
            torch._C._log_api_usage_once("user.module")
            return torch.nn.functional.silu(x) * x + 1.0

    be = em.backend(warmup=0, cache=False, warn=False)
    with torch.no_grad():
        torch.compile(Logged(), backend=be)(torch.randn(4, 8))
    s = be.summary()
    assert s["eager"] == [] and s["optimized_compute_ops"] == s["compute_ops"] == 3, s


def test_a_partition_most_of_whose_calls_ran_eagerly_counts_as_eager():
    """A growing KV cache's partition optimized for its first length only (its search again
    found nothing: row 48's ``part_3_2``, 5 of 6 calls eager) counts as eager in the
    summary, with how many calls and why; one that ran eagerly once in two still counts."""
    from eqsat_mirage.dynamo.report import GraphRecord

    def entry(name, calls, eager):
        return PartitionReport(name, ["mm", "add", "exp"], status="optimized", calls=calls,
                               eager_calls=eager, eager_why="input 'k' has shape [1, 67]",
                               optimized_ops=3, optimized_compute_ops=3,
                               result=_result(10.0, 4.0))

    record = GraphRecord(3, 6, 6, [entry("part_3_0", 1, 1), entry("part_3_2", 1, 5)], [])
    s = record.summary()
    assert (s["optimized_ops"], s["optimized_compute_ops"]) == (3, 3)
    assert s["optimized_partitions"] == 1 and s["predicted_us"] == [10.0, 4.0]
    assert s["outcome"] == "partly optimized"
    assert s["eager"] == ["partition part_3_2 of 3 ops (5 of 6 calls ran eagerly: "
                          "input 'k' has shape [1, 67])"]
    alone = GraphRecord(4, 3, 3, [entry("part_4_0", 1, 5)], [])
    assert alone.outcome() == ("eager", "no partition optimized: part_4_0: 5 of 6 calls ran "
                                        "eagerly (input 'k' has shape [1, 67])")
