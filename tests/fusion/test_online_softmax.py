"""The fusion planner's online softmax: running maxima in a loop and across splits.

A max over the loop index becomes a running maximum; a split over it (FlashDecoding) keeps
one maximum per split and the reduce kernel combines the partials with exp(m_j - M),
itself a running maximum over the splits. Each lowering verifies against the input and
runs (Triton interpreter) finite on logits that overflow the unsafe form.
"""

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.fusion.lower import lower
from eqsat_mirage.fusion.schedule import Schedule, ScheduleError, check_schedule, index_fragment


def safe_late(n=512, dtype="float16", scale=None):
    """softmax attention with the division after the matmul (the form a loop fuses)."""
    g = em.Graph("safe_late")
    q = g.input("Q", (2, 64, 32), dtype)
    k = g.input("K", (2, 32, n), dtype)
    v = g.input("V", (2, n, 32), dtype)
    s = q @ k if scale is None else (q @ k) * scale
    e = em.exp(s - s.max(axis=-1, keepdims=True))
    g.output((e @ v) / e.sum(axis=-1, keepdims=True), "O")
    return g


SCHEDULES = {
    "loop": Schedule(grid=(("a", 2), ("b", 2)), loop="d", forloop=8),
    "split": Schedule(grid=(("a", 2), ("b", 2), ("d", 8)), split="d"),
    "split+loop": Schedule(grid=(("a", 2), ("b", 2), ("d", 4)), loop="d", forloop=4, split="d"),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_running_maximum_lowerings_verify(name):
    g = safe_late()
    mg = lower(g, SCHEDULES[name])
    assert any(k.maxima for k in mg.kernels if k.kind == "custom")
    res = em.verify(g, mg, seed=0)
    assert res.equivalent and res.false_positive_bound <= 1e-9, res


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_running_maximum_kernels_run_finite_on_large_logits(name):
    torch = pytest.importorskip("torch")
    from eqsat_mirage.codegen.source import compile_mugraph

    g = safe_late()
    mg = lower(g, SCHEDULES[name])
    rng = np.random.default_rng(1)
    x = {n: rng.standard_normal(node.shape) * (2.0 if n != "V" else 1.0)
         for n, node in g.inputs.items()}  # scores up to about 40: e^40 overflows float16
    t = {n: torch.tensor(v, dtype=torch.float16) for n, v in x.items()}
    out = compile_mugraph(mg)(**t)
    got = (out["O"] if isinstance(out, dict) else out).float().numpy()
    want = em.evaluate(g, {n: v.float().numpy() for n, v in t.items()})["O"]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=2e-2)


def test_only_exp_of_x_minus_max_may_be_summed():
    g = em.Graph("bad")
    q = g.input("Q", (2, 64, 32), "float32")
    k = g.input("K", (2, 32, 512), "float32")
    s = q @ k
    m = s.max(axis=-1, keepdims=True)
    g.output(em.exp(m - s).sum(axis=-1, keepdims=True), "L")  # exp(max - x): wrong sign
    with pytest.raises(ScheduleError, match="cannot rescale"):
        check_schedule(index_fragment(g), Schedule(grid=(("a", 2),), loop="d", forloop=8))


@pytest.mark.slow  # a search at two sizes
def test_search_picks_a_split_with_running_maxima_when_cheaper():
    from bench.programs import program

    res = em.optimize(program("qknorm_safe", 1), cache=None)
    assert res.verified is not None and res.verified.equivalent
    unsafe = em.optimize(program("qknorm", 1), cache=None)
    assert res.cost_us <= 1.15 * unsafe.cost_us, (res.cost_us, unsafe.cost_us)
    assert all(spec.shape != (2, 256, 4096) for spec in res.program.tensors.values())
