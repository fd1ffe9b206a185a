"""torch.compile(model, backend=em.backend): partitions optimized, the rest eager, same results."""

import os
import warnings

import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")
from torch_models import Attention, GatedMLP, LoRALinear  # noqa: E402

nn = torch.nn

from eqsat_mirage.dynamo import backend as torch_backend  # noqa: E402
from eqsat_mirage.dynamo.backend import Backend  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# searched at compile time; a search ends when it is done (4 iterations), the time limit
# only says how long a loaded machine may take (1 s was not enough on a busy 2-core machine)
FAST = dict(time_limit_s=60.0, iter_limit=4, warmup=0)




class SortInTheMiddle(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.proj, self.out = nn.Linear(d, d), nn.Linear(d, d, bias=False)

    def forward(self, x):
        y = torch.softmax(self.proj(x), dim=-1)
        z = torch.sort(y, dim=-1).values
        return self.out(torch.relu(z) * y), (y * y).mean(-1, keepdim=True)


def _run(model, *xs, backend=None, rtol=1e-4, atol=1e-5):
    """Compile ``model`` with ``backend``, check it against eager; returns the backend."""
    be = backend if backend is not None else em.backend(**FAST)
    torch.manual_seed(0)
    with torch.no_grad():
        want = model(*xs)
        got = torch.compile(model, backend=be)(*xs)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol)
    return be


@pytest.mark.parametrize("cls", [Attention, GatedMLP, LoRALinear])
def test_blocks_match_eager(cls):
    torch.manual_seed(0)
    be = _run(cls().eval(), torch.randn(1, 4, 8),
              backend=em.backend(warmup=0, time_limit_s=20.0))
    assert [r.status for r in be.report] == ["optimized"]
    entry = be.report[0]
    assert entry.result is not None and entry.result.verified.equivalent
    assert entry.graph is not None and entry.calls == 1
    assert entry.mode == ("triton" if INTERPRET else "torch")
    assert any("linear" in op for op in entry.ops)


@pytest.mark.parametrize("norm", [nn.RMSNorm, nn.LayerNorm])
def test_norm_modules_convert_as_in_from_torch(norm):
    """Dynamo inlines F.rms_norm/F.layer_norm into torch.rms_norm/torch.layer_norm: the
    backend converts those as from_torch converts the modules."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), norm(64), nn.Linear(64, 32)).eval()
    x = torch.randn(8, 64)
    em.from_torch(model, x)  # converts
    be = _run(model, x, backend=em.backend(warmup=0, time_limit_s=10.0))
    s = be.summary()
    assert s["optimized_ops"] == s["ops"] == 3 and not be.unsupported, s


def test_empty_cache_and_split_do_not_break_the_partitioner():
    """An empty KV cache concatenated to (zero-size tensors) stays eager with its reason;
    split's tuple of tensors joins a partition; the rest is optimized and equals eager."""
    def step(x, w, cache):
        k = torch.cat([cache, x @ w], dim=-2)  # cache: (1, 0, 16)
        a, b = (k * 2.0).split(8, dim=-1)
        return torch.softmax(a @ b.transpose(-1, -2), dim=-1) @ b

    x, w = torch.randn(1, 6, 16), torch.randn(16, 16)
    be = _run(step, x, w, torch.zeros(1, 0, 16),
              backend=em.backend(warmup=0, time_limit_s=10.0))
    s = be.summary()
    # everything after the cat: the mul, split and its two halves, attention (8 of 10 ops)
    assert s["optimized_partitions"] == 1 and s["optimized_ops"] == 8, s
    assert any("torch.cat" in e and "zero-size" in e for e in s["eager"]), s["eager"]


def test_cpu_without_interpreter_runs_torch_program(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    be = _run(GatedMLP().eval(), torch.randn(4, 8))
    assert [(r.status, r.mode) for r in be.report] == [("optimized", "torch")]


def test_float16_block():
    torch.manual_seed(0)
    m = LoRALinear().eval().half()
    _run(m, torch.randn(2, 8).half(), rtol=2e-2, atol=2e-2)


def test_unsupported_op_in_the_middle_is_partitioned():
    torch.manual_seed(0)
    be = _run(SortInTheMiddle().eval(), torch.randn(3, 8))
    assert len(be.report) == 2 and all(r.status == "optimized" for r in be.report)
    assert any(u.startswith("torch.sort at test_torch_backend.py:") for u in be.unsupported)
    assert sum(r.calls for r in be.report) == 2


def test_optimize_failure_falls_back_with_warning(monkeypatch):
    def boom(*args, **kwargs):
        raise em.MirageError("forced failure for the test")

    monkeypatch.setattr(torch_backend, "optimize", boom)
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match=r"partition eqsat_mirage_part_\w+ .*forced failure"):
        be = _run(GatedMLP().eval(), torch.randn(2, 8))
    assert [r.status for r in be.report] == ["fallback"]
    assert "MirageError: forced failure" in be.report[0].reason


def test_runtime_failure_falls_back_with_warning(monkeypatch):
    monkeypatch.setenv("EQSAT_MIRAGE_STRICT", "0")  # the fallback is for users; strict raises
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the torch program runs at call time

    def broken(program):
        def fn(**tensors):
            raise RuntimeError("kernel exploded")
        return fn

    from eqsat_mirage.dynamo import runtime

    monkeypatch.setattr(runtime, "torch_reference", broken)
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="kernel exploded"):
        be = _run(LoRALinear().eval(), torch.randn(2, 8))
    assert be.report[0].status == "fallback" and "RuntimeError" in be.report[0].reason


@pytest.mark.skipif(not INTERPRET, reason="compiles Triton on CPU only with TRITON_INTERPRET=1")
def test_compile_failure_falls_back_with_warning(monkeypatch):
    monkeypatch.setenv("EQSAT_MIRAGE_STRICT", "0")  # the fallback is for users; strict raises
    from eqsat_mirage.pipeline.result import OptimizeResult

    def broken(self):
        raise RuntimeError("triton compilation failed (forced)")

    monkeypatch.setattr(OptimizeResult, "compile", broken)
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match=r"triton compilation failed \(forced\)"):
        be = _run(GatedMLP().eval(), torch.randn(2, 8))
    assert [r.status for r in be.report] == ["fallback"]


def test_autograd_runs_eagerly_with_a_warning():
    torch.manual_seed(0)
    m, x = GatedMLP(), torch.randn(2, 8)
    be = em.backend(**FAST)
    with pytest.warns(UserWarning, match="no backward"):
        got = torch.compile(m, backend=be)(x)
    got.sum().backward()
    assert m.w1.weight.grad is not None
    torch.testing.assert_close(got, m(x))
    (entry,) = be.report  # the whole graph, eager, with why
    assert entry.status == "eager" and "no backward" in entry.reason
    assert be.summary()["graphs"][0]["outcome"] == "eager"


def test_backend_factory_and_direct_call():
    assert isinstance(em.backend, Backend)
    be = em.backend(target="a100", time_limit_s=0.5, node_limit=1000, warmup=0)
    assert be is not em.backend and be.options["target"] == "a100"
    assert be.options["node_limit"] == 1000 and be.options["time_limit_s"] == 0.5
    with pytest.raises(em.MirageError, match="keyword options only"):
        em.backend("h100")
    # a plain fx graph (no Dynamo metadata; nn.Linear as call_module) works too
    torch.manual_seed(0)
    m, x = LoRALinear().eval(), torch.randn(2, 8)
    gm = torch.fx.symbolic_trace(m)
    be = em.backend(**FAST)
    with torch.no_grad():
        fn = be(gm, [x])
        torch.testing.assert_close(fn(x), m(x))
    assert [r.status for r in be.report] == ["optimized"]


def test_nothing_supported_returns_eager():
    be = em.backend(**FAST)
    with torch.no_grad(), pytest.warns(UserWarning) as caught:
        got = torch.compile(lambda x: torch.sort(x).values.tanh(), backend=be)(torch.ones(3))
    torch.testing.assert_close(got, torch.ones(3).tanh())
    assert [(r.name, r.status) for r in be.report] == [("graph_1", "eager")] and be.unsupported
    (w,) = [str(w.message) for w in caught if "eqsat-mirage" in str(w.message)]  # one
    assert w.startswith("eqsat-mirage: 0 of 3 ops in 0 optimized partitions (not priced")
    assert "eager: torch.sort at test_torch_backend.py:" in w and "(unsupported op)" in w
    assert be.summary()["ops"] == 3 and be.summary()["optimized_ops"] == 0
    with torch.no_grad(), warnings.catch_warnings():  # warn=False: silent
        warnings.simplefilter("error")
        torch._dynamo.reset()
        torch.compile(lambda x: torch.sort(x).values.tanh(), backend=em.backend(
            warn=False))(torch.ones(3))


def test_summary_warning_counts_optimized_and_eager_ops():
    """One warning per graph: ops in optimized partitions, the predicted time, and each
    eager op with its place and reason; a partition whose search found nothing better
    is not labelled optimized and runs eagerly."""
    m, x = SortInTheMiddle().eval(), torch.randn(2, 8)
    be = em.backend(warmup=0, time_limit_s=20.0)
    with torch.no_grad(), pytest.warns(UserWarning) as caught:
        torch.testing.assert_close(torch.compile(m, backend=be)(x), m(x))
    (w,) = [str(w.message) for w in caught if str(w.message).startswith("eqsat-mirage: ")]
    s = be.summary()
    done = [r for r in be.report if r.status == "optimized"]
    assert s["optimized_ops"] == sum(len(r.ops) for r in done) and s["ops"] > s["optimized_ops"]
    assert w.startswith(f"eqsat-mirage: {s['optimized_ops']} of {s['ops']} ops in {len(done)} "
                        "optimized partitions (predicted ")
    assert "torch.sort at test_torch_backend.py:" in w
    before, after = s["predicted_us"]
    assert after < before and f"{before:.2f} us -> {after:.2f} us" in w
    for r in be.report:
        assert r.status in ("optimized", "unchanged", "fallback")
        if r.status == "optimized":
            assert r.result.verified.equivalent and r.result.cost_us < r.result.baseline_cost_us
        else:
            assert r.reason and f"partition {r.name} of {len(r.ops)} ops ({r.reason})" in w


def test_in_place_mutation_keeps_the_graph_eager():
    def mutating(x, y):
        z = torch.exp(x) * 2
        y.add_(1.0)
        return z + y * y

    be = em.backend(**FAST)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    want = mutating(x, y.clone())
    with torch.no_grad(), pytest.warns(UserWarning, match=r"mutates a tensor in place \(Tensor"
                                                          r"\.add_ at test_torch_backend\.py"):
        got = torch.compile(mutating, backend=be)(x, y)
    torch.testing.assert_close(got, want)
    assert [(r.name, r.status) for r in be.report] == [("graph_1", "eager")]  # the whole graph


def test_operator_and_is_not_in_place():
    """transformers' mask code uses operator.and_ on bool tensors: a pure op (its name ends
    in "_"), so the graph is partitioned as usual; x &= m (operator.iand) mutates."""
    import operator

    def masked(x, m1, m2):
        keep = operator.and_(m1, m2)
        s = torch.exp(x) * 2.0 + x
        return torch.where(keep, s, 0.0) + s * s

    from torch import fx

    gm = fx.symbolic_trace(masked)
    assert torch_backend.mutation(gm) is None
    graph = fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    graph.output(graph.call_function(operator.iand, (a, b)))
    assert torch_backend.mutation(fx.GraphModule(torch.nn.Module(), graph)) is not None
    x, m1, m2 = torch.randn(3, 4), torch.rand(3, 4) > 0.3, torch.rand(3, 4) > 0.3
    be = _run(masked, x, m1, m2, backend=em.backend(warmup=0, time_limit_s=10.0))
    s = be.summary()
    assert s["optimized_partitions"] >= 1 and s["optimized_ops"] >= 4, s


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_runs_the_triton_program():
    torch.manual_seed(0)
    be = _run(GatedMLP().eval().cuda().half(), torch.randn(4, 8, device="cuda").half(),
              rtol=2e-2, atol=2e-2)
    assert [(r.status, r.mode) for r in be.report] == [("optimized", "triton")]


def test_aten_graphs_from_aot_autograd():
    from torch._dynamo.backends.common import aot_autograd

    torch.manual_seed(0)
    be = em.backend(**FAST)
    m, x = GatedMLP().eval(), torch.randn(2, 3, 8)
    with torch.no_grad():
        got = torch.compile(m, backend=aot_autograd(fw_compiler=be))(x)
        torch.testing.assert_close(got, m(x), rtol=1e-4, atol=1e-5)
    assert [r.status for r in be.report] == ["optimized"], [r.reason for r in be.report]
    assert "aten.mm.default" in be.report[0].ops and be.report[0].calls == 1


def test_a_search_cut_by_its_time_limit_says_so():
    """A search the time limit cuts short leaves its partition eager, and the reason and the
    graph's warning say the time limit was reached (not "no candidate cheaper than one
    kernel per op"): what a test that asserts "optimized" sees on a machine too slow."""
    torch.manual_seed(0)
    m, x = GatedMLP().eval(), torch.randn(2, 3, 8)
    be = em.backend(time_limit_s=0.01, iter_limit=4, warmup=0)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(torch.compile(m, backend=be)(x), m(x))
    (entry,) = be.report
    assert entry.status == "unchanged" and "time limit" in entry.reason, entry.reason
    assert "no candidate cheaper" not in entry.reason
    said = [str(w.message) for w in caught if str(w.message).startswith("eqsat-mirage: ")]
    assert len(said) == 1 and "time limit reached" in said[0], said


def test_a_static_graph_warms_up_eagerly_and_is_searched_at_its_second_call():
    """torch.compile's defaults (automatic dynamic shapes): a static graph runs its first
    call eagerly and is searched at its second, so a graph Dynamo replaces by a symbolic one
    after one call is never searched; a direct call (no Dynamo) and warmup=0 search at once,
    warmup=2 after two eager calls."""
    torch.manual_seed(0)
    m, x = GatedMLP().eval(), torch.randn(2, 8)
    for warmup, eager_calls in ((None, 1), (2, 2), (0, 0)):
        torch._dynamo.reset()
        be = em.backend(time_limit_s=60.0, iter_limit=4, warn=False,
                        **({} if warmup is None else {"warmup": warmup}))
        fast = torch.compile(m, backend=be)
        with torch.no_grad():
            for call in range(eager_calls):
                torch.testing.assert_close(fast(x), m(x))
                assert be.report == [] and be.summary()["eager_only"] == [1], call
            torch.testing.assert_close(fast(x), m(x))
        assert [r.status for r in be.report] == ["optimized"], (warmup, be.report[0].reason)
        assert be.summary()["eager_only"] == [] and be.summary()["optimized_ops"] > 0
        assert be.report[0].calls == 1  # the call that searched ran the optimized program
    gm = torch.fx.symbolic_trace(m)
    be = em.backend(time_limit_s=60.0, iter_limit=4, warn=False)  # the default, called directly
    with torch.no_grad():
        be(gm, [x])
    assert [r.status for r in be.report] == ["optimized"]
    with pytest.raises(em.MirageError, match="warmup"):
        em.backend(warmup=-1)


def test_a_launch_that_disagrees_with_its_input_program_falls_back_to_eager(monkeypatch):
    """The checked first launch (runtime.check) in the backend: a planted bug in the
    code that runs (the generated module under the interpreter, the torch implementation
    otherwise) makes the partition run eagerly, with a warning naming the reason."""
    import re

    from eqsat_mirage.codegen import source as codegen_source
    from eqsat_mirage.dynamo import runtime

    real_source, real_torch = codegen_source.triton_source, runtime.torch_reference

    def wrong_source(*args, **kwargs):  # the launcher returns 1.01 x its output
        text = real_source(*args, **kwargs)
        return re.sub(r"return \{(.+?): (\w+)", r"return {\1: \2 * 1.01", text, count=1)

    def wrong_torch(program):
        fn = real_torch(program)
        return lambda **t: {k: v * 1.01 for k, v in fn(**t).items()}

    monkeypatch.setattr(codegen_source, "triton_source", wrong_source)
    monkeypatch.setattr(runtime, "torch_reference", wrong_torch)
    torch.manual_seed(0)
    m, x = GatedMLP().eval(), torch.randn(2, 3, 8)
    be = em.backend(time_limit_s=30.0, iter_limit=4, warmup=0)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = torch.compile(m, backend=be)
        torch.testing.assert_close(fast(x), m(x))  # eager: the right answer
        torch.testing.assert_close(fast(x), m(x))
    entry = be.report[0]
    assert entry.status == "fallback" and "checked first launch failed" in entry.reason
    assert "LaunchCheck" not in entry.reason and "output " in entry.reason
    assert any("runs eagerly: the checked first launch failed" in str(w.message)
               for w in caught)


def test_a_search_that_fails_after_the_warmup_leaves_the_graph_eager(monkeypatch):
    monkeypatch.setenv("EQSAT_MIRAGE_STRICT", "0")  # the fallback is for users; strict raises
    from eqsat_mirage.dynamo.backend import Backend as BackendClass

    calls = []

    def broken(self, gm, sizes, number):
        calls.append(number)
        raise RuntimeError("partitioner exploded (for the test)")

    monkeypatch.setattr(BackendClass, "build", broken)
    torch._dynamo.reset()
    m, x = GatedMLP().eval(), torch.randn(2, 8)
    be = em.backend(time_limit_s=1.0, iter_limit=4, warmup=1)
    fast = torch.compile(m, backend=be)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), m(x))  # the warmup call
        with pytest.warns(UserWarning, match="optimizing graph 1 failed.*for the test"):
            torch.testing.assert_close(fast(x), m(x))
        torch.testing.assert_close(fast(x), m(x))  # eager from now on, not searched again
    assert calls == [1] and be.summary()["eager_only"] == []
