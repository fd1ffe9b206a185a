"""The float checks' draws against what the memory estimate counts for them
(``memory.draw_bytes``, ``packed_signed``, ``keeps_folded``): a packed signed draw that is a
view of the normal draw costs nothing, and a large folded draw at the headroom is not kept."""

from __future__ import annotations

import tracemalloc

import numpy as np

import eqsat_mirage as em
from eqsat_mirage.semantics import modular
from eqsat_mirage.verifier import draws, memory, sampling
from eqsat_mirage.verifier.floatcheck import float_checks


def prog(name: str = "a", unsafe: bool = False) -> em.Graph:
    """x and w (64 x 64, drawn in float16 once ``DRAW_CHUNK`` is 1000) and a small bias c;
    the unsafe one squares x before it scales (overflows where the safe one does not)."""
    g = em.Graph(name)
    x = g.input("x", (64, 64), dtype="float16")
    w = g.input("w", (64, 64), dtype="float16")
    c = g.input("c", (64,), dtype="float16")
    y = ((x * x) * (1.0 / 65536.0)) if unsafe else ((x * (1.0 / 256.0)) * (x * (1.0 / 256.0)))
    g.output(y * w + c, "out")
    return g


def small_chunks(monkeypatch) -> None:
    """Inputs above 1000 elements drawn in float16, as a 7B layer's weights are."""
    for mod in (sampling, modular, memory):
        monkeypatch.setattr(mod, "DRAW_CHUNK", 1000)


def test_the_packed_signed_draw_of_a_half_drawn_input_is_a_view_and_counted_so(monkeypatch):
    """The signed draw packed (``Draws._packed``) allocates what ``packed_signed`` counts: no
    bytes for x and w (views of their float16 normal draws), 2 an element for c; the
    estimate of the end-to-end check's draws counts it so, beside a whole packed folded
    draw."""
    small_chunks(monkeypatch)
    a = prog()
    assert memory.packed_signed(a) == 2 * 64
    assert memory.packed_inputs(a) == 2 * (2 * 64 * 64 + 64)
    d = draws.Draws(a, np.random.default_rng(0), {})
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        packed = {n: d._packed("signed", 1.0)[n] for n in a.inputs}
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert np.shares_memory(packed["x"], d.normal["x"])
    assert np.shares_memory(packed["w"], d.normal["w"])
    assert not np.shares_memory(packed["c"], d.normal["c"])
    assert memory.packed_signed(a) <= grown <= memory.packed_signed(a) + 4096, grown
    parts = dict(memory.float_parts(a, a, 1))
    drawn = [n for what, n in parts.items() if what.startswith("the draws")]
    assert drawn == [memory.draw_bytes(a) + memory.packed_inputs(a) + memory.packed_signed(a)]


def test_a_large_folded_draw_at_the_headroom_is_made_again_where_read(monkeypatch):
    """Above ``MEMO_INPUTS`` (float32) the folded draw at the headroom is not kept: each read
    makes the input again, with the values the kept draw has; the estimate leaves its 4
    bytes an element out and says so; the float checks' verdicts are the same."""
    small_chunks(monkeypatch)
    a, b = prog(), prog("b", unsafe=True)
    kept_bytes = memory.draw_bytes(a)
    kept = draws.Draws(a, np.random.default_rng(0), None, 65504.0)
    kept.headroom = 2.0**6
    assert kept._folded_at_headroom()["x"] is kept._folded_at_headroom()["x"]
    monkeypatch.setattr(memory, "MEMO_INPUTS", 4 * 64 * 64)  # x alone fits, x and w do not
    assert not memory.keeps_folded(a)
    assert memory.draw_bytes(a) == kept_bytes - 4 * (2 * 64 * 64 + 64)
    parts = dict(memory.float_parts(a, a, 1))
    assert any("made again where read" in what for what in parts)
    d = draws.Draws(a, np.random.default_rng(0), None, 65504.0)
    d.headroom = 2.0**6
    first, second = d._folded_at_headroom()["x"], d._folded_at_headroom()["x"]
    assert first is not second
    for name in a.inputs:
        want = kept._folded_at_headroom()[name]
        assert np.array_equal(d._folded_at_headroom()[name], want, equal_nan=True), name
    for i in (0, 1):  # the per-input draws at the headroom read it: the same values
        got, want = d._rounded("peakfold@h", float(i)), kept._rounded("peakfold@h", float(i))
        for name in a.inputs:
            assert np.array_equal(got[name], want[name], equal_nan=True), (i, name)
    for seed in (0, 1):
        cex, native = float_checks(a, b, np.random.default_rng(seed), 1e-7, True)
        assert native and cex is not None and cex.domain == "native dtype", cex
        assert float_checks(a, a, np.random.default_rng(seed), 1e-7, True)[0] is None


def test_a_search_memo_keeps_the_first_calls_signed_draw_and_the_estimate_counts_it(
        monkeypatch):
    """In a search's memo the packed signed draw is the first ``Draws``' (a view of its normal
    draw), kept beside each later call's own normal draw: ``verify_parts`` counts it whole,
    where the end-to-end check (no shared memo) counts it as the view it is."""
    small_chunks(monkeypatch)
    a = prog()
    memo: dict = {}
    first = draws.Draws(a, np.random.default_rng(0), memo)
    first.keeps = False  # as at real sizes
    first._packed("signed", 1.0)
    kept = memo[("rounded", "signed", 1.0)]["x"]
    assert np.shares_memory(kept, first.normal["x"])
    del first
    second = draws.Draws(a, np.random.default_rng(0), memo)
    assert not np.shares_memory(kept, second.normal["x"])  # two normal draws of x held
    parts = dict(memory.verify_parts(a, a, 1, 1))
    drawn = [n for what, n in parts.items() if what.startswith("the float checks' draws")]
    outputs = memory.OUTPUT_SETS * 8 * 64 * 64
    assert drawn == [memory.draw_bytes(a) + memory.DRAW_SETS * memory.packed_inputs(a) + outputs]
