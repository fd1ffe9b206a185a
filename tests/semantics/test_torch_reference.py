"""``torch_reference`` on MuGraphs: kernels with a source run as that fragment, kernels
without one (a split reduction's partials and their combination) run by their block
graph, tiled, and give what ``em.evaluate`` gives (the tiled interpreter)."""

from __future__ import annotations

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.mugraph.kernels import MuGraphError
from eqsat_mirage.semantics.torch_reference import torch_reference

torch = pytest.importorskip("torch")
from mugraph_examples import (  # noqa: E402
    flash_attention,
    online_attention,
    rmsnorm_linear,
    safe_attention_graph,
    tiled_matmul,
)


def _inputs(program, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {n: (torch.randn(v.shape, generator=gen) * 0.5).to(getattr(torch, v.dtype))
            for n, v in program.inputs.items()}


def _numpy(tensors: dict) -> dict:
    return {n: t.float().numpy() for n, t in tensors.items()}


def _sourceless(mg: em.MuGraph) -> em.MuGraph:
    """``mg`` with every custom kernel's source dropped: only its block graph is left."""
    for k in mg.kernels:
        if k.kind == "custom":
            k.source = None
    return mg.validate()


def _close(got: dict, want: dict, rtol: float, atol: float) -> None:
    assert set(got) == set(want)
    for name, w in want.items():
        np.testing.assert_allclose(got[name].double().numpy(), w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("example", [tiled_matmul, flash_attention, online_attention])
def test_block_graph_runs_tiled_without_a_source(example):
    """No source, and (for the last two) a block graph that is not the untiled program: the
    kernel runs by its tiles (grid, loop, accumulators, running maxima)."""
    g, mg = example()
    mg = _sourceless(mg)
    x = _inputs(g)
    got = torch_reference(mg)(**x)
    _close(got, em.evaluate(g, _numpy(x)), rtol=1e-4, atol=1e-5)
    _close(got, em.evaluate(mg, _numpy(x)), rtol=1e-4, atol=1e-5)
    assert got["O" if "O" in got else "C"].dtype == torch.float32


def test_float16_kernel_computes_in_float32_and_writes_float16():
    g, mg = rmsnorm_linear()
    mg = _sourceless(mg)
    x = _inputs(g)
    got = torch_reference(mg)(**x)
    assert got["Y"].dtype == torch.float16
    _close(got, em.evaluate(mg, _numpy(x), dtype="native"), rtol=2e-3, atol=2e-3)


def test_a_wrong_tiling_gives_its_own_wrong_values():
    """The tiles are really run: a per-tile maximum that is never rescaled (a mistake)
    computes what the tiled interpreter says, not the program the kernel claims."""
    g, mg = online_attention(mistake="no-max")
    mg = _sourceless(mg)
    x = _inputs(g, seed=1)
    x["Q"] = x["Q"] * 8  # spread the logits: tiles with different maxima weigh differently
    got = torch_reference(mg)(**x)
    _close(got, em.evaluate(mg, _numpy(x)), rtol=1e-4, atol=1e-5)
    right = em.evaluate(g, _numpy(x))["O"]
    assert np.abs(got["O"].double().numpy() - right).max() > 1e-2


def test_split_attention_program_runs_on_torch():
    """A decode-like attention (few query rows, many keys): the planner splits the key loop
    into a kernel writing float32 partials and one combining them, neither with a source
    (their block graphs do not untile), so ``reference()`` cannot give a kernel-level
    Graph; ``torch_reference`` runs them by their tiles and equals the program."""
    g = safe_attention_graph(b=1, m=32, d=64, n=4096)
    res = em.optimize(g, time_limit_s=20)
    mg = res.program
    assert isinstance(mg, em.MuGraph) and res.verified.equivalent
    split = [k for k in mg.kernels if k.kind == "custom" and k.source is None]
    assert split, f"expected a split reduction in the chosen program:\n{mg}"
    with pytest.raises(MuGraphError, match="no source"):
        mg.reference()
    x = _inputs(g)
    got = torch_reference(mg)(**x)
    _close(got, em.evaluate(g, _numpy(x)), rtol=1e-4, atol=1e-5)
    eager = torch.softmax(x["Q"] @ x["K"], dim=-1) @ x["V"]
    torch.testing.assert_close(got["O"], eager, rtol=1e-4, atol=1e-5)
