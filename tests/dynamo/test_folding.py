"""Ops computed from no graph input are folded to constants when the backend compiles a
graph (``dynamo/folding.py``): T5's relative-position buckets, position math. Nothing random,
nothing read from an input, a parameter or a buffer, nothing symbolic and nothing returned."""

from __future__ import annotations

import warnings

import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")
from torch import fx, nn  # noqa: E402

from eqsat_mirage.dynamo.folding import fold_constants  # noqa: E402


class Buckets(nn.Module):
    """Scores plus a bias looked up by relative-position buckets built from ``arange``
    (T5's pattern): the bucket math reads no input."""

    def __init__(self, n: int = 16) -> None:
        super().__init__()
        self.n = n
        self.table = nn.Embedding(8, 1)
        self.proj = nn.Linear(n, n)

    def forward(self, x):
        pos = torch.arange(self.n)
        rel = pos[None, :] - pos[:, None]
        small = rel.abs() < 4
        far = (torch.log(rel.abs().float() + 1.0) * 2.0).to(torch.long)
        buckets = torch.where(small, rel.abs(), torch.clamp(far, max=7))
        bias = self.table(buckets).squeeze(-1)
        return torch.softmax(self.proj(x) + bias, dim=-1)


def dynamo_graph(mod: nn.Module, *args) -> tuple[fx.GraphModule, list]:
    """The graph Dynamo gives a backend for ``mod(*args)`` and its example inputs (fx's own
    tracer would run the position math in Python and record only its result)."""
    got = []

    def capture(gm, example_inputs):
        got.append((gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(mod, backend=capture)(*args)
    torch._dynamo.reset()
    return got[0]


def _ops(gm: fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op.startswith("call")]


def test_position_math_folds_and_the_rest_is_kept():
    gm, _ = dynamo_graph(Buckets(), torch.randn(16, 16))
    before = _ops(gm)
    folded = fold_constants(gm)
    after = _ops(gm)
    assert folded.ops and len(after) == len(before) - len(folded.ops)
    assert not any("arange" in t or "log" in t for t in after)  # the buckets: a buffer now
    assert any("embedding" in t for t in after) and any("linear" in t for t in after)
    (name,) = folded.buffers  # one value crosses to the ops kept: the buckets
    assert folded.buffers[name].dtype == torch.long and folded.buffers[name].shape == (16, 16)


def test_the_folded_graph_computes_what_eager_does():
    torch.manual_seed(0)
    mod = Buckets().eval()
    x = torch.randn(16, 16)
    gm, args = dynamo_graph(mod, x)
    fold_constants(gm)
    with torch.no_grad():
        (got,) = gm(*args)
        torch.testing.assert_close(got, mod(x), rtol=0, atol=0)


def test_random_input_and_parameter_reads_and_returned_values_do_not_fold():
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x):
            noise = torch.rand(4)  # random: made at each call
            scaled = self.w * 2.0  # reads a parameter: may change between calls
            fresh = torch.arange(4).float()  # returned: made at each call, as in eager
            return x + noise + scaled, fresh

    gm, args = dynamo_graph(Mixed(), torch.zeros(4))
    folded = fold_constants(gm)
    kept = _ops(gm)
    assert folded.ops == [] and not folded.buffers, folded
    assert any(getattr(n.target, "__name__", "") == "rand" for n in gm.graph.nodes), kept
    assert gm(*args)[1] is not gm(*args)[1]  # a fresh tensor at each call


@pytest.mark.slow
def test_the_backend_folds_t5_style_buckets_and_says_so():
    torch.manual_seed(0)
    mod = Buckets().eval()
    x = torch.randn(16, 16)
    torch._dynamo.reset()
    be = em.backend(warmup=0, time_limit_s=120)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(mod, backend=be)(x)
        want = mod(x)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    s = be.summary()
    assert s["folded_ops"] >= 8 and s["optimized_ops"] == s["ops"] > 0, s
    assert not any("arange" in e for e in s["eager"]), s["eager"]
    text = [str(w.message) for w in caught if str(w.message).startswith("eqsat-mirage: ")]
    assert len(text) == 1 and f"{s['folded_ops']} ops folded to constants" in text[0], text


def test_a_symbolic_size_keeps_the_position_math():
    """Under dynamic shapes ``arange(n)`` reads a size Dynamo made a graph input: nothing
    folds, and every call still equals eager."""
    class Positions(nn.Module):
        def forward(self, x):
            pos = torch.arange(x.shape[0]).float()
            return x * (pos[:, None] + 1.0)

    torch._dynamo.reset()
    be = em.backend(warmup=0, time_limit_s=60, warn=False)
    fn = torch.compile(Positions(), backend=be, dynamic=True)
    with torch.no_grad():
        for n in (5, 7):
            x = torch.randn(n, 3)
            torch.testing.assert_close(fn(x), Positions()(x))
    assert be.summary()["folded_ops"] == 0
