"""Indexing with an index tensor (``w[i]``) where every user of ``w`` and of ``i`` indexes:
torch.fx's partitioner (torch 2.13) moves such a ``getitem`` between the two producers'
partitions forever, so the backend gives it another target first
(``support.retarget_tensor_indexing``). Each run is bounded: a child Python with a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

PROGRAM = """
def f(w, idx, x):
    i = idx.reshape(-1)  # every user of i indexes with it
    return (w[i] * x).sum(-1) + w[i].sum(-1) * 0.5  # every user of w is w[i]
"""


def _run(body: str, timeout: float = 240.0) -> str:
    code = textwrap.dedent(PROGRAM) + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_partitioner_returns_on_the_retargeted_graph():
    out = _run("""
        import torch
        from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
        from torch.fx.passes.operator_support import OperatorSupport
        from eqsat_mirage.dynamo.support import retarget_tensor_indexing

        class All(OperatorSupport):
            def is_node_supported(self, submodules, node):
                return node.op in ("call_function", "call_method")

        got = []
        def capture(gm, example_inputs):
            got.append(gm)
            return gm.forward

        args = (torch.randn(4, 8), torch.randint(0, 4, (2, 3)), torch.randn(6, 8))
        torch.compile(f, backend=capture)(*args)
        gm = got[0]
        print("retargeted", retarget_tensor_indexing(gm))
        parts = CapabilityBasedPartitioner(gm, All(), allows_single_node_partition=True)
        print("partitions", len(parts.propose_partitions()))
        """)
    assert "retargeted 2" in out and "partitions " in out, out


@pytest.mark.slow
def test_the_backend_compiles_it_and_equals_eager():
    out = _run("""
        import torch
        import eqsat_mirage as em

        torch.manual_seed(0)
        args = (torch.randn(4, 8), torch.randint(0, 4, (2, 3)), torch.randn(6, 8))
        be = em.backend(time_limit_s=60, warn=False, warmup=0)
        got = torch.compile(f, backend=be)(*args)
        print("error", float((got - f(*args)).abs().max()))
        print("ops", be.summary()["optimized_ops"], be.summary()["ops"])
        """)
    err = float(out.split("error ")[1].split()[0])
    assert err <= 1e-5, out
    optimized, ops = map(int, out.split("ops ")[1].split()[:2])
    assert 0 < optimized <= ops, out


def test_a_size_that_depends_on_data_is_reported_not_a_crash():
    """``x[x > 0]`` under ``capture_dynamic_output_shape_ops``: its size is unbacked (u0);
    counting compute ops asked ``numel() > 0`` of it and raised inside torch.compile. Now it
    is an op whose size depends on data, left eager with that reason."""
    import eqsat_mirage as em

    def f(x):
        y = x[x > 0]
        return (y * 2.0 + 1.0).exp().sum() + x.sum()

    x = torch.randn(64)
    torch._dynamo.reset()
    be = em.backend(warmup=0, time_limit_s=60, warn=False)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), torch.no_grad():
        got = torch.compile(f, backend=be)(x)
    torch._dynamo.reset()
    torch.testing.assert_close(got, f(x), rtol=1e-5, atol=1e-5)
    eager = be.summary()["eager"]
    assert any(e.startswith("operator.getitem ") and "depends on data" in e
               for e in eager), eager
