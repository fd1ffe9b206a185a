"""A shape family's one module: its launcher computes the padded size, grids, loop counts
and shapes from L (checked against a module written for one padded size), a length mask a
torch op reads follows L, the fallback to one module per padded size, reused outputs.

Runs under ``TRITON_INTERPRET=1`` (set here before triton is imported).
"""

# ruff: noqa: E402 (TRITON_INTERPRET is set before anything can import triton)
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import eqsat_mirage as em
from eqsat_mirage.codegen.compiled import record_launches
from eqsat_mirage.codegen.source import load_source
from eqsat_mirage.family.launcher import FamilyLaunchError
from eqsat_mirage.family.padding import padded_graph, plan_masks
from eqsat_mirage.family.runner import EVERY, FamilyRunner
from eqsat_mirage.family.scale import scaling
from eqsat_mirage.mugraph.program import from_graph


def decode(hint=256, name="dec"):
    g = em.Graph(name)  # one query token per head, 4 query heads per KV head
    q = g.input("Q", (2, 4, 64))
    k = g.input("K", (2, 64, em.Dim("L", hint=hint)))
    v = g.input("V", (2, "L", 64))
    g.output(em.softmax(q @ k, axis=-1) @ v, "O")
    return g


# slow: the split family's search (a 4096-key GQA decode) is most of this file's time
@pytest.fixture(scope="module", params=["loop", pytest.param("split", marks=pytest.mark.slow)])
def family(request):
    """A family whose loop grows with L (decode at L ~ 256), and one whose split grid grows
    (the GPU bundle's GQA decode at L ~ 4096: FlashDecoding parts of 1024)."""
    if request.param == "loop":
        return em.optimize(decode(), cache=False, time_limit_s=60)
    from bench.gpu_bundle import decode_family

    res = em.optimize(decode_family(4, 4, 64, 4096), cache=False, time_limit_s=60)
    assert any(res.scaling.grid.values()), res.scaling  # the split's grid grows with L
    return res


def launches(run, tensors: dict) -> list:
    """(kernel, grid, arguments with tensors as shapes, options) of each launch of
    generated module ``run`` on ``tensors`` (the kernels are recorded, not run)."""
    return [(name, grid, tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a
                               for a in args), kw)
            for name, _, grid, args, kw in record_launches(run.module, tensors)]


def inputs(run, n: int) -> dict:
    """Random inputs of module ``run`` with its family's axes of length ``n``."""
    gen = torch.Generator().manual_seed(n)
    return {name: torch.randn(tuple(n if isinstance(d, str) else d for d in shape),
                              generator=gen).to(dtype)
            for name, (shape, dtype) in run.module.INPUTS.items()}


def test_the_one_launcher_matches_a_launcher_written_for_each_padded_size(family):
    sc = family.scaling
    runner = FamilyRunner(family.family, sc)
    one = load_source(runner.source())
    assert "PADDED = None" in one.source
    g = sc.granule
    # padded sizes beyond those the launcher was fitted at (1..5 granules) and the hint's
    for lp in (g, 8 * g, 13 * g, sc.padded(family.family.dims["L"].hint)):
        single = load_source(runner.padded_source(lp))
        for n in {lp, lp - g // 2 if g > 1 else lp}:
            assert launches(one, inputs(one, n)) == launches(single, inputs(one, n)), (lp, n)
    assert launches(one, inputs(one, 8 * g)) != launches(one, inputs(one, g))


def test_a_length_mask_a_torch_op_reads_follows_the_length():
    """One kernel per op (every op a torch call) run at padded sizes of 64: the length mask
    is a torch op's input, and it must mask at L, not at the padded size (it used to be
    written with the padded size's offset: every padded column counted in the softmax)."""
    g = decode(64, "torch_mask")
    padded = padded_graph(plan_masks(g), {"L": 64}, {"L": 64})
    sc = scaling(from_graph(padded), g.dynamic, "L", 64)
    sc.granule = 64  # any granule serves a plan of predefined kernels only
    fn = FamilyRunner(g, sc)
    assert fn._masks() and "tril(seq_len - 1)" in fn.source()
    for n in (50, 64, 100):
        x = inputs(fn.module(n), n)
        want = torch.softmax(x["Q"].float() @ x["K"].float(), -1) @ x["V"].float()
        got = fn(**x)["O"].float()
        assert (got - want).abs().max() <= 1e-2, n
    assert list(fn.modules) == [EVERY]


def test_a_launcher_that_does_not_scale_falls_back_to_one_module_per_padded_size(
        family, monkeypatch):
    import eqsat_mirage.family.launcher as launcher

    def refuse(texts, granule, base):
        raise FamilyLaunchError("a literal that is no polynomial (for the test)")

    monkeypatch.setattr(launcher, "merge", refuse)
    fn = family.compile()
    g = fn.scaling.granule
    with pytest.warns(UserWarning, match="one module per padded size.*for the test"):
        fn.module(g + 1)
    assert "for the test" in fn.launcher
    for n in (g + 1, 2 * g + 3):
        x = inputs(fn.module(n), n)
        want = em.evaluate(family.family.at({"L": n}),
                           {k: v.double().numpy() for k, v in x.items()})["O"]
        got = fn(**x)["O"].double().numpy()
        assert abs(got - want).max() <= 2e-2 * abs(want).max(), n
    assert sorted(fn.modules) == [2 * g, 3 * g]
    run = fn.module(g + 1)  # a module of one padded size refuses the others
    assert f"PADDED = {2 * g}" in run.source
    with pytest.raises(ValueError, match=f"serves padded size {2 * g} only"):
        run(**inputs(run, 3 * g))


def reference(res, x: dict):
    """The family's program at the inputs' length, in float64 (numpy)."""
    n = x["V"].shape[-2]
    dims = res.family.dims
    return em.evaluate(res.family.at({next(iter(dims)): n}),
                       {k: v.double().numpy() for k, v in x.items()})["O"]


def test_reused_outputs_are_kept_per_padded_size(family):
    fn = family.compile(reuse_outputs=True)
    g = fn.scaling.granule
    x = inputs(fn.module(g), g)
    first = fn(**x)["O"]
    assert abs(first.double().numpy() - reference(family, x)).max() <= 2e-2
    y = inputs(fn.module(g - 1), g - 1)
    again = fn(**y)["O"]
    assert first.data_ptr() == again.data_ptr()  # the same buffer: overwritten
    assert abs(again.double().numpy() - reference(family, y)).max() <= 2e-2
    other = fn(**inputs(fn.module(3 * g), 3 * g))["O"]
    assert other.data_ptr() != again.data_ptr()  # another padded size: its own buffers
    assert fn(**x)["O"].data_ptr() == first.data_ptr()  # kept while 4 sizes or fewer


def test_a_family_of_torch_ops_with_long_names_and_reused_outputs():
    """Four inputs with long names and the length L (the launcher's length check spans
    lines), every op a torch call (no kernel writes a buffer), outputs reused."""
    g = em.Graph("long")
    q = g.input("query_states_of_this_layer", (2, 4, 64))
    k = g.input("key_states_of_this_layer", (2, 64, em.Dim("L", hint=64)))
    v = g.input("value_states_of_this_layer", (2, "L", 64))
    m = g.input("attention_bias_of_this_layer", (2, 4, "L"))
    g.output(em.softmax(q @ k + m, axis=-1) @ v, "O")
    padded = padded_graph(plan_masks(g), {"L": 64}, {"L": 64})
    sc = scaling(from_graph(padded), g.dynamic, "L", 64)
    sc.granule = 16
    fn = FamilyRunner(g, sc, reuse_outputs=True)
    text = fn.source()
    assert "    if (\n" in text and not fn.launcher, text
    gen = torch.Generator().manual_seed(3)
    for n in (20, 37):
        x = {name: (torch.randn(tuple(n if isinstance(d, str) else d for d in shape),
                                generator=gen) / 4).to(dt)
             for name, (shape, dt) in fn.module(n).module.INPUTS.items()}
        s = x["query_states_of_this_layer"].float() @ x["key_states_of_this_layer"].float()
        want = torch.softmax(s + x["attention_bias_of_this_layer"].float(), -1) @ \
            x["value_states_of_this_layer"].float()
        assert (fn(**x)["O"].float() - want).abs().max() <= 1e-2 * want.abs().max(), n
    bad = dict(x, value_states_of_this_layer=x["value_states_of_this_layer"][:, :5])
    with pytest.raises(em.DynamicShapeError, match="disagree"):
        fn(**bad)
    with pytest.raises(ValueError, match="disagree on the size L"):  # the module says so too
        fn.module(37)(**bad)
    with pytest.raises(ValueError, match=r"size L = 0 \(key_states_of_this_layer.shape\[2\]\) "
                       "is outside the range"):
        fn.module(37)(**dict(x, key_states_of_this_layer=x["key_states_of_this_layer"][..., :0],
                             value_states_of_this_layer=x["value_states_of_this_layer"][:, :0],
                             attention_bias_of_this_layer=x["attention_bias_of_this_layer"][
                                 ..., :0]))


def test_a_familys_first_launch_at_each_padded_size_is_checked(monkeypatch):
    """The checked first launch for a family: each new padded size runs the family's
    program at the call's size through torch; a planted bug in the module (its last matmul
    10 % off; in float16, 2 % is tolerated) raises LaunchCheckError at the first call,
    check=False skips it."""
    import eqsat_mirage.family.launcher as launcher

    g = decode(64, "checked")
    padded = padded_graph(plan_masks(g), {"L": 64}, {"L": 64})
    sc = scaling(from_graph(padded), g.dynamic, "L", 64)
    sc.granule = 64
    fn = FamilyRunner(g, sc)
    for n in (50, 64, 63, 100):
        fn(**inputs(fn.module(n), n))
    assert len(fn.checker.checked) == 2  # once per padded size (64, 128)
    real = launcher.family_source

    def wrong(*args, **kwargs):
        text = real(*args, **kwargs)
        at = text.rindex("torch.matmul(")
        return text[:at] + "1.1 * " + text[at:]

    monkeypatch.setattr(launcher, "family_source", wrong)
    bad = FamilyRunner(g, sc)
    x = inputs(bad.module(50), 50)
    with pytest.raises(em.LaunchCheckError, match="output 'O'"):
        bad(**x)
    FamilyRunner(g, sc, check=False)(**x)
