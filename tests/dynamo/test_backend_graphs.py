"""em.backend(cuda_graph=...): a static partition's launches replayed as a CUDA graph.

On a CPU the capture and replay go through a fake graphs backend (as
tests/codegen/test_cuda_graphs.py does): a capture remembers the call and its outputs, a
replay recomputes into those outputs, so outputs are overwritten exactly as a real graph's
static buffers are. Under TRITON_INTERPRET=1 the partitions run as Triton programs, the
mode that is replayed."""

from __future__ import annotations

import os
import warnings

import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")
from torch_models import GatedMLP  # noqa: E402

from eqsat_mirage.dynamo.replay import Replay, copy_escaping  # noqa: E402

F = torch.nn.functional
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
FAST = dict(time_limit_s=60.0, iter_limit=4, warmup=0, warn=False)
triton_only = pytest.mark.skipif(not INTERPRET, reason="partitions run as Triton (replayed) "
                                 "on CPU only with TRITON_INTERPRET=1")


class FakeGraphs:
    """Capture = remember the call and its outputs; replay = recompute into those outputs."""

    def __init__(self, fail: bool = False) -> None:
        self.captures = self.replays = 0
        self.fail = fail

    def available(self, tensors):
        return True

    def capture(self, fn):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        fn()  # the warm-up the real backend does
        outputs = fn()
        self.captures += 1
        return (fn, outputs), outputs

    def replay(self, graph):
        fn, outputs = graph  # a real replay writes the captured output buffers
        for name, value in fn().items():
            outputs[name].copy_(value)
        self.replays += 1


def _compiled(graphs, **options):
    torch.manual_seed(0)
    model = GatedMLP().eval()
    be = em.backend(cuda_graph=graphs, **{**FAST, **options})
    return model, be, torch.compile(model, backend=be)


@triton_only
def test_a_static_partition_is_captured_once_and_replayed():
    graphs = FakeGraphs()
    model, be, fast = _compiled(graphs)
    with torch.no_grad():
        for seed in range(3):
            x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(seed))
            torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)
    (entry,) = be.report
    assert entry.status == "optimized" and entry.calls == 3
    assert (graphs.captures, graphs.replays) == (1, 3)
    s = be.summary()
    assert s["cuda_graphs"] == [entry.name]
    assert s["launches"] == {entry.name: "CUDA graph: 1 captured, 3 replays"}
    _, replay = entry.module.runner(torch.device("cpu"))
    ((free, _),) = replay.runners.values()  # one binding: the weights, read in place
    assert len(free) == 1 and "x" in free[0]  # only the activation is copied in


@triton_only
def test_outputs_returned_are_not_overwritten_by_the_next_call():
    graphs = FakeGraphs()
    model, be, fast = _compiled(graphs)
    x1, x2 = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    with torch.no_grad():
        y1 = fast(x1)
        kept = y1.clone()
        y2 = fast(x2)
        y3 = fast(x1)
    assert graphs.replays == 3  # every call replayed the graph, whose buffers it overwrote
    torch.testing.assert_close(y1, kept)  # ... but what the caller got is a copy
    torch.testing.assert_close(y2, model(x2), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(y3, kept)
    assert y1.data_ptr() != y2.data_ptr() != y3.data_ptr()
    buffers = be.report[0].module.buffers()
    assert buffers and not {y.untyped_storage().data_ptr() for y in (y1, y2, y3)} & buffers


def test_escaping_views_are_copied_once_per_storage_keeping_strides():
    base = torch.arange(12.0)
    other = torch.ones(3)
    a, b = base.view(3, 4).t(), base[2:8:2]
    got = copy_escaping((a, [b, other], 5), {base.untyped_storage().data_ptr()})
    a2, (b2, other2), five = got
    assert other2 is other and five == 5
    assert a2.stride() == a.stride() and b2.stride() == b.stride()
    assert a2.untyped_storage().data_ptr() == b2.untyped_storage().data_ptr() \
        != base.untyped_storage().data_ptr()
    base.zero_()  # the static buffer overwritten: the copies keep their values
    assert a2.sum() == 66 and b2.tolist() == [2.0, 4.0, 6.0]


@triton_only
def test_cuda_graph_false_launches_plainly():
    graphs = FakeGraphs()
    model, be, fast = _compiled(False)
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)
    (entry,) = be.report
    assert entry.calls == 2 and graphs.captures == 0
    assert be.summary()["launches"] == {entry.name: "plain launches: cuda_graph=False"}
    assert be.summary()["cuda_graphs"] == []


@triton_only
def test_cpu_inputs_with_the_default_launch_plainly():
    model, be, fast = _compiled(True)  # torch's CUDA graphs: not for CPU tensors
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)
    assert list(be.summary()["launches"].values()) == ["plain launches: inputs not on a CUDA "
                                                       "device"]


@pytest.mark.parametrize("value", ["yes", 1, None, object()])
def test_the_option_is_checked(value):
    with pytest.raises(em.MirageError, match=r"cuda_graph=\.\.\.\) takes True"):
        em.backend(cuda_graph=value)
    with pytest.raises(em.MirageError, match="cuda_graph"):
        em.backend(warn=False)(cuda_graph=value)  # on a copy too
    assert em.backend(cuda_graph=False).cuda_graph is False
    assert em.backend(cuda_graph=FakeGraphs())(warn=False).cuda_graph is not True


@triton_only
def test_a_check_that_fails_before_capture_runs_eagerly(monkeypatch):
    """The checked first launch runs before any capture: a planted bug in the launcher
    makes the partition eager, with a warning, and nothing is captured."""
    import re

    from eqsat_mirage.codegen import source as codegen_source

    real_source = codegen_source.triton_source

    def wrong_source(*args, **kwargs):  # the launcher returns 1.01 x its output
        text = real_source(*args, **kwargs)
        return re.sub(r"return \{(.+?): (\w+)", r"return {\1: \2 * 1.01", text, count=1)

    monkeypatch.setattr(codegen_source, "triton_source", wrong_source)
    graphs = FakeGraphs()
    model, be, fast = _compiled(graphs, warn=True)
    x = torch.randn(2, 3, 8)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            torch.testing.assert_close(fast(x), model(x))
    (entry,) = be.report
    assert entry.status == "fallback" and "checked first launch failed" in entry.reason
    assert graphs.captures == 0 and any("checked first launch failed" in str(w.message)
                                        for w in caught)


@triton_only
def test_a_failed_capture_launches_plainly_with_a_warning():
    graphs = FakeGraphs(fail=True)
    model, be, fast = _compiled(graphs)
    x = torch.randn(2, 3, 8)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)
    (entry,) = be.report
    assert entry.status == "optimized" and entry.calls == 2
    assert be.summary()["launches"][entry.name].startswith(
        "plain launches: capturing a CUDA graph failed (RuntimeError: operation not permitted")
    assert sum("capturing a CUDA graph failed" in str(w.message) for w in caught) == 1


@triton_only
def test_a_family_partition_is_not_captured():
    def f(x, w):
        return F.silu(x @ w) * 2.0

    graphs = FakeGraphs()
    be = em.backend(cuda_graph=graphs, **FAST)
    fast = torch.compile(f, backend=be, dynamic=True)
    w = torch.randn(32, 64)
    with torch.no_grad():
        for n in (4, 4):
            x = torch.randn(n, 32)
            torch.testing.assert_close(fast(x, w), f(x, w), rtol=1e-4, atol=1e-4)
    (entry,) = be.report
    assert entry.status == "optimized" and entry.graph.is_family and entry.calls == 2
    assert graphs.captures == 0 and be.summary()["cuda_graphs"] == []
    assert be.summary()["launches"][entry.name] == \
        "plain launches: a shape family (its sizes vary per call)"


def test_parameters_are_read_in_place_and_a_moved_one_captures_again():
    """Replay on its own: a parameter is not copied (the graph reads it where it is), an
    activation is; a new parameter tensor is a new binding, captured again."""
    graphs = FakeGraphs()
    copies = []

    def run(**t):
        copies.append({n: v.data_ptr() for n, v in t.items()})
        return {"Y": t["X"] @ t["W"]}

    replay = Replay(run, fixed=[], graphs=graphs, name="p")
    w = torch.nn.Parameter(torch.randn(4, 3), requires_grad=False)
    x = torch.randn(2, 4)
    torch.testing.assert_close(replay(X=x, W=w)["Y"], x @ w)
    assert all(c["W"] == w.data_ptr() for c in copies)  # captured with w itself
    assert copies[-1]["X"] != x.data_ptr()  # ... and with x's static copy
    x2 = torch.randn(2, 4)
    torch.testing.assert_close(replay(X=x2, W=w)["Y"], x2 @ w)
    assert replay.counts() == (1, 2)
    w2 = torch.nn.Parameter(torch.randn(4, 3), requires_grad=False)
    torch.testing.assert_close(replay(X=x2, W=w2)["Y"], x2 @ w2)
    assert replay.counts() == (2, 3) and replay.how() == "CUDA graph: 2 captured, 3 replays"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_llama_layer_replays_as_cuda_graphs_on_a_gpu():
    pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama as ml

    from bench.hf_models import llama_config

    torch.manual_seed(0)
    cfg = llama_config("sdpa")
    layer = ml.LlamaDecoderLayer(cfg, 0).eval().cuda().half()
    seq = 16
    pos = torch.arange(seq, device="cuda")[None]
    xs = [torch.randn(1, seq, cfg.hidden_size, device="cuda", dtype=torch.float16)
          for _ in range(3)]
    cos, sin = ml.LlamaRotaryEmbedding(cfg).to("cuda")(xs[0], pos)

    def step(h):
        out = layer(h, attention_mask=None, position_embeddings=(cos, sin), position_ids=pos)
        return out[0] if isinstance(out, tuple) else out

    be = em.backend(warmup=0, warn=False, time_limit_s=120.0, tune="model")
    fast = torch.compile(step, backend=be)
    with torch.no_grad():
        want = [step(x) for x in xs]
        got = [fast(x) for x in xs] + [fast(xs[0])]
        torch.cuda.synchronize()
    for g, w in zip(got, want + want[:1]):
        err = float((g.float() - w.float()).abs().max() / w.float().abs().max())
        assert err <= 2e-2, err
    s = be.summary()
    assert s["cuda_graphs"], s["launches"]
    assert all(how.startswith("CUDA graph") for how in s["launches"].values()), s["launches"]
    torch.testing.assert_close(got[0], got[3])  # not overwritten by the calls after it


@pytest.mark.parametrize("cuda_graph, launch", [(True, "graph"), (False, "plain")])
def test_the_search_prices_the_launch_that_will_run(cuda_graph, launch):
    """A static partition replayed as a CUDA graph is searched with launch="graph" (each
    kernel at the profile's replay cost), one launched plainly with launch="plain"; a
    launch= given to the backend wins."""
    model, be, fast = _compiled(cuda_graph)
    with torch.no_grad():
        fast(torch.randn(4, 8))
    (entry,) = [e for e in be.report if e.result is not None]
    assert entry.result.stats["launch"] == launch
    model, be, fast = _compiled(cuda_graph, launch="plain")
    with torch.no_grad():
        fast(torch.randn(4, 8))
    assert all(e.result.stats["launch"] == "plain" for e in be.report if e.result is not None)


def test_a_family_is_priced_at_plain_launches():
    from eqsat_mirage.dynamo.backend import launch_mode

    g = em.Graph("f")
    n = em.Dim("n", hint=16)
    g.output(g.input("x", (n, 8)) @ g.input("w", (8, 4)), "y")
    assert launch_mode(g, True) == "plain"
    s = em.Graph("s")
    s.output(s.input("x", (16, 8)) @ s.input("w", (8, 4)), "y")
    assert (launch_mode(s, True), launch_mode(s, False)) == ("graph", "plain")
