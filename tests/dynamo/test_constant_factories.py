"""A 0-dim constant made by a torch factory (issue 31): transformers builds the additive
mask of eager attention as ``torch.where(mask, torch.zeros((), dtype=dtype),
torch.finfo(dtype).min)`` (masking_utils.py). ``torch.zeros``/``ones``/``full`` of size
() become a constant of the graph, so the mask joins the attention's partition instead of
staying eager (BERT with eager attention: 35 of 39 compute ops, under 90%, before)."""

import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")


def attention(dt, factory=torch.zeros):
    """Scores plus the additive mask transformers builds from a bool mask, in dtype ``dt``."""
    def fn(x, keep):
        zero = factory((), 0.0, dtype=dt) if factory is torch.full else factory((), dtype=dt)
        mask = torch.where(keep, zero * 2.0, torch.finfo(dt).min)
        return torch.softmax(x @ x.transpose(-1, -2) / 4.0 + mask, dim=-1) @ x
    return fn


@pytest.mark.parametrize("factory,dtype", [(torch.zeros, torch.float32),
                                           (torch.zeros, torch.float16),
                                           (torch.ones, torch.float32),
                                           (torch.full, torch.float32)])
def test_the_factory_joins_the_partition_through_the_backend(factory, dtype):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16, dtype=dtype)
    keep = torch.ones(2, 1, 8, dtype=torch.bool)
    keep[0, :, :3] = False
    be = em.backend(time_limit_s=60, warn=False, warmup=0, cache=False)
    with torch.no_grad():
        want = attention(x.dtype, factory)(x, keep)
        got = torch.compile(attention(x.dtype, factory), backend=be)(x, keep)
    s = be.summary()
    assert not [e for e in s["eager"] if factory.__name__ in e], s["eager"]
    assert s["optimized_compute_ops"] == s["compute_ops"], s
    tol = 2e-2 if dtype == torch.float16 else 1e-5
    assert float((got - want).float().abs().max() / want.float().abs().max()) <= tol


def test_a_constant_with_elements_is_folded_and_read_as_an_input():
    """``torch.zeros(3, 4)`` reads no graph input: computed when the graph compiles
    (``dynamo/folding.py``), the partition reads it as an input (the converter's own
    factories take only 0-dim constants); not counted among the graph's ops."""
    def f(x):
        return torch.softmax(x + torch.full((3, 4), 0.5), dim=-1) * 2.0

    be = em.backend(time_limit_s=30, warn=False, warmup=0, cache=False)
    x = torch.randn(3, 4)
    with torch.no_grad():
        got = torch.compile(f, backend=be)(x)
    s = be.summary()
    assert s["folded_ops"] == 1 and s["eager"] == [] and s["optimized_ops"] == s["ops"], s
    assert "torch.full" in s["graphs"][0]["folded"][0], s["graphs"]
    torch.testing.assert_close(got, f(x), rtol=1e-5, atol=1e-5)
