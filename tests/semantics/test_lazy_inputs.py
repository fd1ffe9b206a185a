"""``floating.LazyInputs``: inputs made where an evaluation first reads them and dropped
after their last reader, in the Graph interpreter and the tiled one, with the memory
estimate walking them the same way (the float64 draws of a 7B-size stack)."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.mugraph.program import from_graph
from eqsat_mirage.semantics.floating import LazyInputs, evaluate
from eqsat_mirage.verifier import memory


def _chain(blocks: int = 4) -> em.Graph:
    """h <- silu(h @ w_i) for each block: block i alone reads w_i."""
    g = em.Graph("chain")
    h = g.input("x", (4, 64), dtype="float16")
    for i in range(blocks):
        h = em.silu(h @ g.input(f"w{i}", (64, 64), dtype="float16"))
    g.output(h, "out")
    return g


class _Watched:
    """A ``LazyInputs`` maker that counts the arrays it made that are still alive."""

    def __init__(self, values: dict) -> None:
        self.values, self.alive, self.most, self.made = values, 0, 0, []

    def make(self, name: str) -> np.ndarray:
        x = self.values[name].astype(np.float64)  # a fresh array, as Draws makes them
        self.made.append(name)
        self.alive += 1
        self.most = max(self.most, self.alive)
        weakref.finalize(x, self._gone)
        return x

    def _gone(self) -> None:
        self.alive -= 1


@pytest.mark.parametrize("tiled", [False, True])
def test_an_evaluation_holds_the_inputs_it_is_reading_not_every_input(tiled):
    g = _chain()
    rng = np.random.default_rng(0)
    values = {n: rng.standard_normal(v.shape).astype(np.float32) * 0.1
              for n, v in g.inputs.items()}
    program = from_graph(g) if tiled else g
    watched = _Watched(values)
    got = evaluate(program, LazyInputs(g.inputs, watched.make))
    want = evaluate(program, {n: v.astype(np.float64) for n, v in values.items()})
    np.testing.assert_array_equal(got["out"], want["out"])
    assert sorted(watched.made) == sorted(g.inputs)  # each made once
    assert watched.most <= 2 < len(g.inputs)  # the activation's input and one weight
    assert watched.alive == 0


@pytest.mark.parametrize("tiled", [False, True])
def test_the_estimate_walks_lazy_inputs_as_the_interpreter_reads_them(tiled):
    """``lazy``: the peak includes the inputs, but only those live at once (one weight of
    four here), so it is below every input plus the peak of an evaluation that holds them."""
    g = _chain()
    program = from_graph(g) if tiled else g
    inputs, _, peak, _ = memory.program_peak(program, False)
    _, _, lazy, at = memory.program_peak(program, False, lazy=True)
    weight = memory.WORD * 64 * 64
    assert lazy < inputs + peak and inputs + peak - lazy >= 2 * weight, (lazy, inputs, peak)
    assert lazy >= weight  # the weight being read is in it


def test_lazy_inputs_is_a_mapping_of_the_names_it_was_given():
    lazy = LazyInputs(["a", "b"], lambda n: np.full(2, ord(n), dtype=np.float64))
    assert list(lazy) == ["a", "b"] and len(lazy) == 2 and lazy["b"][0] == ord("b")
    with pytest.raises(KeyError):
        lazy["c"]
    assert set(lazy.held()) == {"a", "b"}


def test_the_ground_truth_reads_lazy_inputs_as_they_are_read():
    """``truth.truth`` on a float64 draw (``LazyInputs``) makes each input at its first
    reader, as the float64 run does, not every input at once."""
    from eqsat_mirage.verifier import truth

    g = _chain()
    if truth.precision(g) == "float64":
        pytest.skip("no wider float type here")
    rng = np.random.default_rng(0)
    values = {n: rng.standard_normal(v.shape).astype(np.float32) * 0.1
              for n, v in g.inputs.items()}
    f64 = evaluate(g, {n: v.astype(np.float64) for n, v in values.items()})
    watched = _Watched(values)
    got, _ = truth.truth(g, LazyInputs(g.inputs, watched.make), f64)
    np.testing.assert_allclose(got["out"], f64["out"], rtol=1e-12, atol=1e-15)
    assert sorted(watched.made) == sorted(g.inputs)
    assert watched.most <= 2 < len(g.inputs)


def test_a_counterexample_keeps_a_float64_draw_in_its_narrowest_form():
    """``held`` (what a counterexample keeps) reads ``keep``: the verifier's float64 draws
    keep their float32 values, the same numbers as the float64 arrays the evaluation read."""
    import eqsat_mirage as em
    from eqsat_mirage.verifier.draws import Draws

    g = em.Graph("g")
    x = g.input("x", (3, 4), dtype="float16")
    g.output(x * 2.0, "y")
    d = Draws(g, np.random.default_rng(0), {})
    lazy = d.inputs("signed", 30.0)
    kept = lazy.held()["x"]
    assert kept.dtype == np.float32 and lazy["x"].dtype == np.float64
    np.testing.assert_array_equal(kept.astype(np.float64), lazy["x"])


def _overflowing() -> em.Graph:
    """x @ w0 overflows float16 at x = 1e4 (float64 at 1e307), its RMS normalization is
    then inf * 0 = NaN everywhere, and the products after it read w1 and w2."""
    g = em.Graph("overflowing")
    x = g.input("x", (4, 64), dtype="float16")
    h = x @ g.input("w0", (64, 64), dtype="float16")
    n = h * em.rsqrt((h * h).mean(axis=-1, keepdims=True))
    n = em.silu(n @ g.input("w1", (64, 64), dtype="float16"))
    g.output(n @ g.input("w2", (64, 64), dtype="float16"), "out")
    return g


@pytest.mark.parametrize("dtype", ["native", None])
def test_inputs_that_only_nan_everywhere_meets_are_never_made(dtype):
    """An input is read where its first reader needs it (``interp.Later``): a NaN-strict op
    whose other operand is NaN everywhere is NaN without it, so a draw made as it is read
    (``Draws.rounded``) makes no weight of the layers after a float16 overflow."""
    g = _overflowing()
    big = 1e4 if dtype == "native" else 1e307  # past float16's largest, or float64's
    values = {n: np.full(v.shape, big if n == "x" else 1.0) for n, v in g.inputs.items()}
    watched = _Watched(values)
    got = evaluate(g, LazyInputs(g.inputs, watched.make), dtype=dtype,
                   rounded=dtype == "native")
    want = evaluate(g, {n: v.astype(np.float64) for n, v in values.items()}, dtype=dtype)
    assert watched.made == ["x", "w0"]
    assert np.isnan(got["out"]).all() and np.isnan(want["out"]).all()
    finite = {n: np.full(v.shape, 0.5, dtype=np.float32) for n, v in g.inputs.items()}
    watched = _Watched(finite)  # where nothing overflows, every input is read, once
    got = evaluate(g, LazyInputs(g.inputs, watched.make), dtype=dtype,
                   rounded=dtype == "native")
    want = evaluate(g, {n: v.astype(np.float64) for n, v in finite.items()}, dtype=dtype)
    assert sorted(watched.made) == sorted(g.inputs)
    np.testing.assert_array_equal(got["out"], want["out"])


def test_a_rounded_draw_makes_each_input_once_where_it_is_read():
    """``Draws.rounded``: each input rounded at its first read and kept while the draw is
    this thread's current one (up to four evaluations read it), the values of the packed
    draw (``_packed``, which rounds every input at once where a search's memo keeps it)."""
    from eqsat_mirage.verifier.draws import Draws

    g = _overflowing()
    d = Draws(g, np.random.default_rng(3), None)
    for kind, s in (("signed", 1.0), ("folded", 0.25), ("folded", 0.5), ("exponent", 0.0)):
        r = d.rounded(kind, s)
        assert isinstance(r, LazyInputs) and r["w1"] is r["w1"]
        eager = Draws(g, np.random.default_rng(3), {})  # a search's memo: kept, eager
        eager.keeps = True
        want = eager.rounded(kind, s)
        for n in g.inputs:
            np.testing.assert_array_equal(r[n], want[n])
        d.release(kind, s)


def test_a_transposed_weight_is_read_only_where_its_product_needs_it():
    """``x @ w.T`` (torch's linear): the transpose of an unread input is itself computed
    where it is read, so NaN everywhere in ``x`` leaves ``w`` unmade."""
    g = em.Graph("linear")
    x = g.input("x", (4, 64), dtype="float16")
    h = x @ g.input("w0", (64, 64), dtype="float16")
    n = h * em.rsqrt((h * h).mean(axis=-1, keepdims=True))
    g.output(n @ g.input("w1", (64, 64), dtype="float16").T, "out")
    values = {n: np.full(v.shape, 1e4 if n == "x" else 1.0) for n, v in g.inputs.items()}
    watched = _Watched(values)
    got = evaluate(g, LazyInputs(g.inputs, watched.make), dtype="native", rounded=True)
    assert watched.made == ["x", "w0"] and np.isnan(got["out"]).all()


def test_a_search_memo_keeps_no_draws_object_alive():
    """A search's memo outlives each candidate's ``Draws``: the draws it keeps for the next
    (the shared ones others are made from) are packed all at once, values only, so the old
    ``Draws`` (its N(0, 1) draw, its folded draw at the headroom) is freed."""
    import gc

    from eqsat_mirage.verifier.draws import Draws

    g = _overflowing()
    memo: dict = {}
    d = Draws(g, np.random.default_rng(3), memo)
    d.keeps = False  # as at real sizes (this one is small enough to keep every draw)
    for kind, s in (("folded", 0.5), ("signed", 1.0)):
        d.rounded(kind, s)["w2"]
        d.release(kind, s)
    assert all(isinstance(memo[("rounded", k, s)], dict) for k, s in (("folded", 0.5),
                                                                     ("signed", 1.0)))
    gone = weakref.ref(d)
    del d
    gc.collect()
    assert gone() is None


def test_a_draws_object_is_freed_without_the_cycle_collector():
    """What a ``Draws`` keeps that makes inputs as they are read (its own memo's packed
    draws, its folded draw at the headroom, this thread's current draw) holds it weakly:
    with the cycle collector off it is freed when its last user drops it, with what it
    drew, as a ``Draws`` of dicts of arrays was."""
    import gc

    from eqsat_mirage.verifier.draws import Draws

    g = _overflowing()
    gc.disable()
    try:
        for memo in (None, {}):
            d = Draws(g, np.random.default_rng(3), memo)
            d.keeps, d.headroom = False, 4.0
            d.out_a("native", "peakfold@h", 0.0, True)
            d.rounded("folded", 0.5)["w2"]  # kept as this thread's current draw
            d.rounded("peakfold", 1.0)["w1"]
            d.release("peakfold", 1.0)
            d.rounded("signed", 1.0)["x"]  # not released: still current
            gone = weakref.ref(d)
            del d
            assert gone() is None, memo
    finally:
        gc.enable()


def test_a_later_value_is_made_once_and_drops_its_maker():
    """``interp.Later``: made on the first call only (a maker that returns None included),
    the maker then dropped with what it read (a deferred cast keeps its value, not the
    input it was cast from)."""
    from eqsat_mirage.semantics.interp import Later

    calls = []
    source = np.ones(3)
    gone = weakref.ref(source) if hasattr(source, "__weakref__") else None
    later = Later(lambda s=source: calls.append(1) or s.astype(np.float16))
    del source
    assert later.value().dtype == np.float16 and later.value() is later.value()
    assert calls == [1] and later.make is None
    assert gone is None or gone() is None  # the cast's input is freed once it is made
    none = Later(lambda: calls.append(2))
    assert none.value() is None and none.value() is None and calls == [1, 2]
