"""res.compile(cuda_graph=True): capture once per input signature, replay after (CPU: fake)."""

from __future__ import annotations

import pytest
import torch

import eqsat_mirage as em
from eqsat_mirage.runtime.graphs import CudaGraphs, GraphRunner


class FakeGraphs:
    """Capture = remember the call and its outputs; replay = recompute into those outputs."""

    def available(self, tensors):
        return True

    def capture(self, fn):
        fn()  # the warm-up the real backend does
        outputs = fn()
        return (fn, outputs), outputs

    def replay(self, graph):
        fn, outputs = graph  # a real replay writes the captured output buffers
        for name, value in fn().items():
            outputs[name].copy_(value)


def program():
    g = em.Graph("rmslin")
    x = g.input("X", (4, 64), dtype="float32")
    w = g.input("W", (64, 32), dtype="float32")
    g.output(em.rms_norm(x) @ w, "Y")
    return em.optimize(g, cache=False)


@pytest.fixture(scope="module")
def res():
    return program()


def test_replays_reuse_one_capture_per_signature(res):
    plain = res.compile()
    runner = GraphRunner(plain, ["X", "W"], backend=FakeGraphs())
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        x, w = torch.randn(4, 64, generator=gen), torch.randn(64, 32, generator=gen)
        got = runner(x, w)["Y"]
        torch.testing.assert_close(got, plain(x, w)["Y"], rtol=1e-5, atol=1e-5)
    assert (runner.captures, runner.replays) == (1, 3)
    x_t = torch.randn(64, 4).t()  # the same shape with other strides: a new signature
    torch.testing.assert_close(runner(X=x_t, W=w)["Y"], plain(x_t.contiguous(), w)["Y"],
                               rtol=1e-5, atol=1e-5)
    assert runner.captures == 2


def test_a_bad_call_raises_before_any_capture(res):
    runner = GraphRunner(res.compile(), ["X", "W"], backend=FakeGraphs())
    with pytest.raises(ValueError, match="expected dtype"):
        runner(torch.randn(4, 64).half(), torch.randn(64, 32))
    with pytest.raises(ValueError, match="missing input"):
        runner(X=torch.randn(4, 64))
    assert runner.captures == 0


def test_cpu_inputs_run_the_plain_launcher(res):
    fn = res.compile(cuda_graph=True)
    assert isinstance(fn, GraphRunner) and isinstance(fn.backend, CudaGraphs)
    x, w = torch.randn(4, 64), torch.randn(64, 32)
    torch.testing.assert_close(fn(x, w)["Y"], res.compile()(x, w)["Y"])
    assert fn.captures == 0 and fn.source == res.compile().source


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_replay_on_a_gpu(res):
    fn = res.compile(cuda_graph=True)
    x, w = torch.randn(4, 64, device="cuda"), torch.randn(64, 32, device="cuda")
    want = res.compile()(x, w)["Y"].clone()
    for _ in range(3):
        torch.testing.assert_close(fn(x, w)["Y"], want)
    assert (fn.captures, fn.replays) == (1, 3)
