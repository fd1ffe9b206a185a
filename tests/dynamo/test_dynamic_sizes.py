"""Dynamo's symbolic sizes as shape families: dynamic=True and automatic dynamic shapes."""

import os
import warnings

import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")
F = torch.nn.functional

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def decode_step(q, k, v, wo):
    """One decode step: 8 query heads over 2 KV heads (GQA), then the output projection."""
    o = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # (1, 8, 1, 64)
    return o.reshape(1, 512) @ wo


def _runners(be):
    """The FamilyRunner of each optimized family partition (its builds per padded size)."""
    out = []
    for e in be.report:
        if getattr(e.result, "scaling", None) is not None and e.status == "optimized":
            out.append(e)
    return out


LENGTHS = sorted({*range(128, 192, 5), 160, 191})  # 128, 133, ..., 188, and 160, 191


@pytest.mark.slow  # 15 decode steps through torch.compile (64 took about 110 s each here)
@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic=True", "automatic"])
def test_a_decode_loop_over_many_cache_lengths_through_torch_compile(dynamic):
    """The KV cache grows from 128 to 191 tokens, five per step, with 160 and 191 too
    (15 lengths, across the tile sizes' multiples and between them). dynamic=True: one
    family search (from the first call). Dynamo's defaults: the first length compiles
    static and runs eagerly (the backend's warmup), the second recompiles with the
    length symbolic; that family, found by the one search, serves every later step."""
    dt = torch.float16 if INTERPRET else torch.float32
    gen = torch.Generator().manual_seed(0)
    kc = torch.randn(1, 2, 192, 64, generator=gen).to(dt)
    vc = torch.randn(1, 2, 192, 64, generator=gen).to(dt)
    wo = (torch.randn(512, 512, generator=gen) / 20).to(dt)
    be = em.backend(time_limit_s=30, warn=False)
    fast = torch.compile(decode_step, backend=be, dynamic=dynamic)
    with torch.no_grad():
        for n in LENGTHS:
            q = torch.randn(1, 8, 1, 64, generator=gen).to(dt)
            k, v = kc[:, :, :n], vc[:, :, :n]
            got = fast(q, k, v, wo)
            want = decode_step(q.float(), k.float(), v.float(), wo.float())
            eager = decode_step(q, k, v, wo).float()
            tol = 2 * (eager - want).abs().max().item() + 1e-5  # eager's own rounding, twice
            assert (got.float() - want).abs().max().item() <= tol, n
    searches = [e for e in be.report if e.status == "optimized"]
    fams = _runners(be)
    assert len(fams) == 1 and fams[0].result.stats["family"]["verified_sizes"]
    assert all(fams[0].result.stats["family"]["verified_sizes"].values())
    # the projection after the attention is a static program of its own; with the
    # defaults, the first length's static graph runs its one call eagerly (warmup) and is
    # never searched: Dynamo replaces it by the symbolic graph before a second call. That
    # projection is one matmul, already one kernel: searched, and honestly left unchanged
    assert len(searches) == 1
    rest = [e for e in be.report if e.status != "optimized"]
    assert [e.status for e in rest] == ["unchanged"] and \
        rest[0].reason == "no candidate cheaper than one kernel per op", rest
    steps = len(LENGTHS)
    assert fams[0].calls == (steps if dynamic else steps - 1) and fams[0].eager_calls == 0
    sizes = [g["sizes"] for g in be.summary()["graphs"]]
    assert len(sizes) == 1 and sizes[0].startswith("symbolic size s")
    assert be.summary()["eager_only"] == ([] if dynamic else [1])


def test_a_batch_that_moves_a_specialized_size_searches_once_more():
    """dynamic=True makes every size of f(x, w) symbolic; the largest (w's columns) is
    planned as the family and the batch specialized. A call with another batch searches
    once more with the batch symbolic; every later batch is served by that family."""

    def f(x, w):
        return F.silu(x @ w) * 2.0

    be = em.backend(time_limit_s=10, warn=False)
    w = torch.randn(32, 64)
    fast = torch.compile(f, backend=be, dynamic=True)
    with torch.no_grad():
        for n in (4, 5, 9, 16, 3):
            x = torch.randn(n, 32)
            torch.testing.assert_close(fast(x, w), f(x, w), rtol=1e-4, atol=1e-4)
    (entry,) = be.report
    assert entry.status == "optimized" and entry.eager_calls == 0
    assert entry.replan.startswith("symbolic s")  # the batch's symbol
    assert entry.graph.is_family and entry.calls == 5
    assert entry.share_s is not None and 0 < entry.share_s <= 10 and entry.weight > 0  # kept


def test_a_call_moving_two_specialized_sizes_runs_eagerly_with_a_warning():
    def f(x, w):
        return F.silu(x @ w) * 2.0

    be = em.backend(time_limit_s=10, warn=False)
    fast = torch.compile(f, backend=be, dynamic=True)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x, w = torch.randn(4, 32), torch.randn(32, 64)
        torch.testing.assert_close(fast(x, w), f(x, w), rtol=1e-4, atol=1e-4)
        x, w = torch.randn(6, 48), torch.randn(48, 64)  # batch and inner size both move
        torch.testing.assert_close(fast(x, w), f(x, w), rtol=1e-4, atol=1e-4)
    (entry,) = be.report
    assert entry.eager_calls == 1 and entry.calls == 1
    msgs = [str(c.message) for c in caught if "calls it does not serve" in str(c.message)]
    assert len(msgs) == 1 and "shape [6, 48]" in msgs[0]


def test_a_cache_concat_stays_eager_and_attention_is_a_family_at_its_length():
    """torch.cat of the cache and the new token gives length s + 1, a formula of the
    symbolic size: the cat runs eagerly (with that reason) and the attention after it is
    a family at s + 1."""

    def step(q, kc, vc, kn, vn, wo):
        k, v = torch.cat([kc, kn], 2), torch.cat([vc, vn], 2)
        return decode_step(q, k, v, wo)

    gen = torch.Generator().manual_seed(1)
    wo = torch.randn(512, 512, generator=gen) / 20
    be = em.backend(time_limit_s=30)
    fast = torch.compile(step, backend=be)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (100, 101, 102, 140):
            shapes = [(1, 8, 1, 64), (1, 2, n, 64), (1, 2, n, 64), (1, 2, 1, 64), (1, 2, 1, 64)]
            args = (*(torch.randn(s, generator=gen) for s in shapes), wo)
            torch.testing.assert_close(fast(*args), step(*args), rtol=1e-4, atol=1e-4)
    text = " ".join(str(c.message) for c in caught)
    assert "is computed from the symbolic size" in text and "torch.cat" in text
    fams = _runners(be)
    assert len(fams) == 1 and fams[0].graph.dims  # the family at s + 1
    assert "plus_1" in next(iter(fams[0].graph.dims)) and fams[0].calls == 3


def test_a_second_search_that_would_not_serve_the_call_keeps_the_first_program():
    """x (b, 32) @ y (32, n) with dynamic=True: n (the largest) is the family, b
    specialized. A call moving b and n at once searches with b symbolic, holding n at its
    first value; that program would not serve the call, so the first one stays: the call
    runs eagerly and later calls with the first batch are served again."""

    def f(x, y):
        return F.silu(x @ y) * 2.0

    be = em.backend(time_limit_s=10, warn=False)
    fast = torch.compile(f, backend=be, dynamic=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for b, n in ((4, 64), (4, 80), (5, 80), (4, 80), (4, 96)):
            x, y = torch.randn(b, 32), torch.randn(32, n)
            torch.testing.assert_close(fast(x, y), f(x, y), rtol=1e-4, atol=1e-4)
    (entry,) = be.report
    assert entry.status == "optimized" and (entry.calls, entry.eager_calls) == (4, 1)
    assert "does not serve" in entry.replan


def test_a_float_dynamo_made_symbolic_is_a_constant_checked_at_every_call():
    """dynamic=True turns a module's float attribute (an RMSNorm's eps) into a tensor read
    with .item(): the program holds it at its value, and a call with another value runs
    eagerly (still correct)."""

    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.eps, self.w = 1e-6, torch.nn.Parameter(torch.rand(64) + 0.5)

        def forward(self, x):
            v = x.pow(2).mean(-1, keepdim=True)
            return x * torch.rsqrt(v + self.eps) * self.w

    m = Norm().eval()
    be = em.backend(time_limit_s=10, warn=False)
    fast = torch.compile(m, backend=be, dynamic=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n, eps in ((4, 1e-6), (6, 1e-6), (6, 0.5)):
            m.eps = eps
            x = torch.randn(n, 64)
            torch.testing.assert_close(fast(x), m(x), rtol=1e-4, atol=1e-4)
    (entry,) = be.report  # one graph, no recompile: eps is an input of it
    assert entry.status == "optimized" and (entry.calls, entry.eager_calls) == (2, 1)
    assert len(be.summary()["graphs"]) == 1


def test_a_planning_hint_and_maximum_for_dynamo_families():
    """em.backend(size_hint=, size_max=): a loop that starts short is planned and verified
    for the lengths it grows to; a call past the maximum runs eagerly, with a warning.
    (Dynamo's defaults: the length that changed is the one symbolic size.)"""
    dt = torch.float16 if INTERPRET else torch.float32
    gen = torch.Generator().manual_seed(1)
    kc = torch.randn(1, 2, 400, 64, generator=gen).to(dt)
    vc = torch.randn(1, 2, 400, 64, generator=gen).to(dt)
    wo = (torch.randn(512, 512, generator=gen) / 20).to(dt)
    be = em.backend(time_limit_s=30, size_hint=256, size_max=300)
    fast = torch.compile(decode_step, backend=be)  # defaults: the second length is symbolic
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (40, 41, 299, 301):
            q = torch.randn(1, 8, 1, 64, generator=gen).to(dt)
            k, v = kc[:, :, :n], vc[:, :, :n]
            want = decode_step(q.float(), k.float(), v.float(), wo.float())
            torch.testing.assert_close(fast(q, k, v, wo).float(), want, rtol=2e-2, atol=2e-2)
    (fam,) = _runners(be)
    stats = fam.result.stats["family"]
    assert "hint=256" in stats["dim"] and "max=300" in stats["dim"], stats["dim"]
    assert 256 in stats["verified_sizes"] and max(stats["verified_sizes"]) <= 300
    assert fam.calls == 2 and fam.eager_calls == 1  # 40: the warmup call; 301: past the max
    assert any("outside the range" in str(w.message) for w in caught)
    with pytest.raises(em.MirageError, match="size_hint"):
        em.backend(size_hint=0)
