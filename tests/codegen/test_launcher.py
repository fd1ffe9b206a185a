"""The generated launcher's host side (issue 17): constexpr strides, the per-signature cache,
outputs allocated from the first input, and ``reuse_outputs``.

Run under ``TRITON_INTERPRET=1`` (set here before triton is imported).
"""

# ruff: noqa: E402 (TRITON_INTERPRET is set before anything can import triton)
import os

os.environ["TRITON_INTERPRET"] = "1"

import ast
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from mugraph_examples import matmul_graph

import eqsat_mirage as em
from eqsat_mirage.codegen.host import contiguous_strides
from eqsat_mirage.codegen.source import compile_mugraph, triton_source
from eqsat_mirage.fusion.lower import add_kernel, lower
from eqsat_mirage.fusion.schedule import Schedule
from eqsat_mirage.runtime.graphs import GraphRunner


def matmul():
    return matmul_graph(32, 64, 48)


def matmul_mg():
    return lower(matmul(), Schedule(grid={"a": 2, "c": 3}, loop="b", forloop=4))


def chain_mg():
    """C = A @ B (custom), then D = exp(C) * 2 (a second custom kernel reading C)."""
    mg = em.MuGraph("chain")
    mg.input("A", (32, 64), "float32")
    mg.input("B", (64, 48), "float32")
    add_kernel(mg, matmul(), Schedule(grid={"a": 2, "c": 3}, loop="b", forloop=4), name="mm")
    g = em.Graph("ex")
    c = g.input("C", (32, 48), "float32")
    g.output(em.exp(c) * 2.0, "D")
    add_kernel(mg, g, Schedule(grid={"a": 2}), name="ex")
    mg.output("D")
    return mg


# Per test: a compiled module keeps state across calls (its per-signature _CHECKED cache and,
# with reuse_outputs, its buffers), which a module-scoped one would carry from test to test.
@pytest.fixture
def fn():
    return compile_mugraph(matmul_mg())


@pytest.fixture
def reused():
    return compile_mugraph(chain_mg(), reuse_outputs=True)


def test_contiguous_strides():
    assert contiguous_strides((8, 32)) == (32, 1)
    assert contiguous_strides((2, 1, 3)) == torch.empty(2, 1, 3).stride()
    assert contiguous_strides((5,)) == (1,) and contiguous_strides(()) == ()


def test_strides_are_constexpr_literals_or_cached(fn):
    src = fn.source
    for t in ("A", "B", "C"):
        for d in (0, 1):
            assert f"stride_{t}_{d}: tl.constexpr" in src
    body = src[src.index("def run("):]
    assert ".stride(" not in body  # no stride() call per call and dimension
    assert "(A, B), (device, A_s0, A_s1, B_s0, B_s1) = _bind(args, kwargs)" in body
    assert "A_s0, A_s1, B_s0, B_s1, 48, 1," in body  # C (32, 48) is allocated contiguous
    assert "C = A.new_empty((32, 48))" in body and "torch.empty" not in body
    assert "REUSE_OUTPUTS = False" in src
    ast.parse(src)


def test_non_contiguous_inputs_are_right_and_cached_per_signature(fn):
    a, b = torch.randn(32, 64), torch.randn(64, 48)
    at, bt = torch.randn(64, 32).T, torch.randn(48, 64).T  # column-major views
    assert not at.is_contiguous() and not bt.is_contiguous()
    cache = fn.module._CHECKED
    assert not cache  # a fresh module
    for x, y in ((a, b), (at, bt), (a, bt), (at, b)):
        np.testing.assert_allclose(fn(x, y)["C"].numpy(), (x @ y).numpy(), rtol=1e-4, atol=1e-4)
    assert len(cache) == 4  # one signature per stride combination
    for key, (device, *strides) in cache.items():
        assert device == torch.device("cpu")
        assert tuple(strides) == key[4] + key[9]  # each input's stride() is in its key
    np.testing.assert_allclose(fn(at, bt)["C"].numpy(), (at @ bt).numpy(), rtol=1e-4, atol=1e-4)
    assert len(cache) == 4
    row = torch.randn(1, 48).expand(64, 48)  # stride 0 along the rows
    np.testing.assert_allclose(fn(a, row)["C"].numpy(), (a @ row).numpy(), rtol=1e-4, atol=1e-4)
    assert len(cache) == 5


def test_a_signature_seen_once_still_refuses_another_shape(fn):
    a, b = torch.randn(32, 64), torch.randn(64, 48)
    fn(a, b)
    with pytest.raises(ValueError, match=r"input 'A': expected shape \(32, 64\), got \(16, 64\)"):
        fn(a[:16], b)
    with pytest.raises(ValueError, match=r"input 'B': expected dtype torch.float32, got "
                                         r"torch.float16"):
        fn(a, b.half())
    with pytest.raises(ValueError, match=r"expected a torch.Tensor"):
        fn(a, b.numpy())


def test_without_reuse_every_call_returns_new_outputs(fn):
    a, b = torch.randn(32, 64), torch.randn(64, 48)
    first, second = fn(a, b)["C"], fn(a, b)["C"]
    assert first is not second and first.data_ptr() != second.data_ptr()


def test_reuse_outputs_returns_the_same_buffers(reused):
    assert "REUSE_OUTPUTS = True" in reused.source and "def _buffers(" in reused.source
    body = reused.source[reused.source.index("def run("):]
    assert "new_empty" not in body  # allocated by _buffers, once per signature
    a, b = torch.randn(32, 64), torch.randn(64, 48)
    first = reused(a, b)["D"]
    np.testing.assert_allclose(first.numpy(), (torch.exp(a @ b) * 2).numpy(), rtol=1e-4)
    a2 = torch.randn(32, 64)
    for call in (lambda: reused(a2, b), lambda: reused(A=a2, B=b), lambda: reused({"A": a2,
                                                                                   "B": b})):
        second = call()["D"]
        assert second is first  # the same tensor, overwritten
        np.testing.assert_allclose(second.numpy(), (torch.exp(a2 @ b) * 2).numpy(), rtol=1e-4)
    (entry,) = reused.module._CHECKED.values()
    assert entry[-2].shape == (32, 48) and entry[-1] is first  # C (intermediate) and D


def test_reuse_keeps_one_set_of_buffers_per_signature(reused):
    a, b = torch.randn(32, 64), torch.randn(64, 48)
    bt = torch.randn(48, 64).T
    d1, d2 = reused(a, b)["D"], reused(a, bt)["D"]
    assert d1 is not d2
    np.testing.assert_allclose(d2.numpy(), (torch.exp(a @ bt) * 2).numpy(), rtol=1e-4)
    assert reused(a, b)["D"] is d1


def test_the_flag_changes_the_source_and_the_file():
    mg = matmul_mg()
    assert triton_source(mg) != triton_source(mg, reuse_outputs=True)
    plain, reuse = compile_mugraph(mg), compile_mugraph(mg, reuse_outputs=True)
    assert plain.path != reuse.path
    a, b = torch.randn(32, 64), torch.randn(64, 48)
    np.testing.assert_allclose(reuse(a, b)["C"].numpy(), plain(a, b)["C"].numpy(), rtol=1e-5)


def test_a_torch_ops_result_passes_its_own_strides():
    """A transpose run by torch is a non-contiguous view; the kernel reading it gets its
    strides from the view (asked once per call), not from its shape."""
    mg = em.MuGraph("view")
    mg.input("AT", (64, 32), "float32")
    mg.input("B", (64, 48), "float32")
    mg.predefined("transpose", "AT", arg=(1, 0), out="A")
    add_kernel(mg, matmul(), Schedule(grid={"a": 2, "c": 3}, loop="b", forloop=4), name="mm")
    mg.output("C")
    run = compile_mugraph(mg)
    assert "A_s0, A_s1 = A.stride()" in run.source
    at, b = torch.randn(64, 32), torch.randn(64, 48)
    np.testing.assert_allclose(run(at, b)["C"].numpy(), (at.T @ b).numpy(), rtol=1e-4, atol=1e-4)


def test_a_program_without_inputs():
    mg = em.MuGraph("consts")
    mg.predefined("add", 1.0, 2.0, out="Y")
    mg.output("Y")
    run = compile_mugraph(mg)
    assert "_, (device,) = _bind(args, kwargs)" in run.source
    assert float(run()["Y"]) == 3.0 and float(run()["Y"]) == 3.0
    with pytest.raises(ValueError, match="takes 0 inputs"):
        run(torch.zeros(1))


def test_many_inputs_unpack_over_several_lines():
    g = em.Graph("wide")
    xs = [g.input(f"input_with_a_long_name_{i}", (4, 8, 16), "float32") for i in range(6)]
    total = xs[0]
    for x in xs[1:]:
        total = total + x
    g.output(total, "Y")
    run = compile_mugraph(lower(g, Schedule(grid={"a": 2})))
    host = run.source[run.source.index("_CHECKED = {}"):]
    assert max(len(line) for line in host.splitlines()) <= 100
    assert re.search(r"^    tensors, entry = _bind\(args, kwargs\)$", run.source, re.M)
    feed = [torch.randn(4, 8, 16) for _ in range(6)]
    np.testing.assert_allclose(run(*feed)["Y"].numpy(), sum(feed).numpy(), rtol=1e-5)
    np.testing.assert_allclose(run(*feed)["Y"].numpy(), sum(feed).numpy(), rtol=1e-5)


class FakeGraphs:
    """Capture = remember the call; replay = recompute (CPU stand-in for CUDA graphs)."""

    def available(self, tensors):
        return True

    def capture(self, fn):
        fn()
        outputs = fn()
        return (fn, outputs), outputs

    def replay(self, graph):
        fn, outputs = graph
        for name, value in fn().items():
            if value is not outputs[name]:
                outputs[name].copy_(value)


def test_cuda_graph_runner_over_reused_outputs(reused):
    runner = GraphRunner(reused, ["A", "B"], backend=FakeGraphs())
    a, b = torch.randn(32, 64), torch.randn(64, 48)
    out = runner(a, b)["D"]
    np.testing.assert_allclose(out.numpy(), (torch.exp(a @ b) * 2).numpy(), rtol=1e-4)
    a2 = torch.randn(32, 64)
    assert runner(a2, b)["D"] is out and runner.captures == 1
    np.testing.assert_allclose(out.numpy(), (torch.exp(a2 @ b) * 2).numpy(), rtol=1e-4)
