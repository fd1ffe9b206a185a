"""Verification of programs with large inputs (a 7B layer's weights): a search's memo draws
a trial's inputs again instead of keeping them (``memory.MEMO_INPUTS``), and keeps the
rounded float draws in the inputs' 2-byte formats (``packing.pack``). Both give the values,
verdicts and bounds of keeping everything."""

from __future__ import annotations

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.semantics import modular
from eqsat_mirage.semantics.field import FieldCtx
from eqsat_mirage.semantics.floating import round_to
from eqsat_mirage.semantics.primes import draw_primes
from eqsat_mirage.verifier import memory, sampling
from eqsat_mirage.verifier.packing import pack, unpack


def attention(wrong: bool = False, dtype: str = "float32") -> em.Graph:
    """Softmax attention (exp: the q parts of Q and K are drawn); ``wrong`` divides by the
    row sum of the wrong rows (only the last query row differs)."""
    g = em.Graph("att_wrong" if wrong else "att")
    q, k, v = (g.input(n, s, dtype) for n, s in (("Q", (2, 8, 4)), ("K", (2, 4, 16)),
                                                 ("V", (2, 16, 4))))
    a = em.exp(q @ k)
    s = a.sum(axis=-1, keepdims=True)
    if wrong:
        s = em.concat([s[:, :7], s[:, 6:7]], axis=1)
    g.output((a @ v) / s, "O")
    return g


def test_replay_draws_the_same_inputs_in_the_same_order():
    g = attention()
    rng = np.random.default_rng([5, 0, 0])
    p, q = draw_primes(rng, 30, set())
    first = FieldCtx(p, q, rng)
    first.inputs = first.random_inputs(g)
    values = {n: (x[0].copy(), x[1].copy()) for n, x in reversed(list(first.inputs.items()))}
    assert first.q_order == ["V", "K", "Q"]  # the order they were read in
    rng = np.random.default_rng([5, 0, 0])
    assert draw_primes(rng, 30, set()) == (p, q)
    again = FieldCtx(p, q, rng)
    again.replay(g, first.q_order)
    for n, (vp, vq) in values.items():
        np.testing.assert_array_equal(again.inputs[n][0], vp)
        np.testing.assert_array_equal(again.inputs[n][1], vq)


@pytest.mark.parametrize("limit", [memory.MEMO_INPUTS, 0])
def test_a_memo_that_draws_inputs_again_gives_the_same_verdicts(monkeypatch, limit):
    monkeypatch.setattr(memory, "MEMO_INPUTS", limit)
    a, good, bad = attention(), attention(), attention(wrong=True)
    memo: dict = {}
    results = [em.verify(a, b, seed=3, memo=memo, float_check=False) for b in
               (good, bad, good, bad)]
    kept = [v[0] for k, v in memo.items() if isinstance(k, tuple) and k[0] == "field"]
    assert kept and all(isinstance(x, FieldCtx) == bool(limit) for x in kept)
    assert [r.equivalent for r in results] == [True, False, True, False]
    assert results[0].false_positive_bound == results[2].false_positive_bound <= 1e-9
    assert results[0].primes == results[2].primes
    # the wrong row is found in the same trial and element either way
    assert results[1].counterexample.index == results[3].counterexample.index
    alone = em.verify(a, bad, seed=3, float_check=False)
    assert (alone.counterexample.trial, alone.counterexample.index) == (
        results[1].counterexample.trial, results[1].counterexample.index)


def test_large_trial_inputs_are_not_kept():
    assert memory.keeps_inputs(memory.MEMO_INPUTS)
    assert not memory.keeps_inputs(memory.MEMO_INPUTS + 1)
    g = em.Graph("mlp")
    x, w = g.input("X", (4, 4096), "float16"), g.input("W", (4096, 11008), "float16")
    g.output(x @ w, "Y")
    parts = dict(memory.verify_parts(g, g, 1, 4))
    kept = [n for d, n in parts.items() if "trials'" in d]
    assert kept == [4 * 4 * 11008 * 8]  # the first program's outputs only
    assert "inputs drawn again" in next(d for d in parts if "trials'" in d)
    draws = next(n for d, n in parts.items() if d.startswith("the float checks"))
    elements = 4 * 4096 + 4096 * 11008
    # 7 rounded draws of 90 MB would pass MEMO_INPUTS: only the two others are made from
    assert not memory.keeps_draws(g)
    # the weight's normal draw in float16 (above DRAW_CHUNK), X's in float32; the folded
    # draw at the headroom in float32; the two packed draws (the signed one counted whole:
    # the memo keeps the first call's, a view of that call's normal draw)
    assert memory.keeps_folded(g)
    assert draws == (2 + 4) * 4096 * 11008 + 8 * 4 * 4096 + 2 * 2 * elements + \
        memory.OUTPUT_SETS * 4 * 11008 * 8
    small = em.Graph("small")
    x, w = small.input("X", (4, 64), "float16"), small.input("W", (64, 128), "float16")
    small.output(x @ w, "Y")
    parts = dict(memory.verify_parts(small, small, 1, 4))
    draws = next(n for d, n in parts.items() if d.startswith("the float checks"))
    elements = 4 * 64 + 64 * 128
    assert memory.keeps_draws(small)
    assert draws == (8 * elements + memory.DRAW_SETS * 2 * elements
                     + memory.OUTPUT_SETS * 4 * 128 * 8)


def test_a_search_memo_keeps_the_rounded_draws_of_small_programs_only():
    """Draws of a large program are made again per candidate: its memo holds only the two
    rounded draws the others are made from, and the second call finds the same verdict."""
    from eqsat_mirage.verifier.draws import Draws

    for shape, kept in (((64, 128), True), ((4096, 11008), False)):
        g = em.Graph("g")
        x, w = g.input("X", (4, shape[0]), "float16"), g.input("W", shape, "float16")
        g.output(x @ w, "Y")
        memo: dict = {}
        draws = Draws(g, np.random.default_rng(0), memo)
        assert draws.keeps is kept
        for kind, s in (("signed", 1.0), ("folded", 0.5), ("folded", 0.25), ("exponent", 0.0)):
            draws.rounded(kind, s)
            draws.release(kind, s)
        rounded = {k[1:] for k in memo if k[0] == "rounded"}
        assert rounded == ({("signed", 1.0), ("folded", 0.5), ("folded", 0.25),
                            ("exponent", 0.0)} if kept else {("signed", 1.0), ("folded", 0.5)})


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_a_rounded_draw_made_straight_in_float32_is_the_packed_one(dtype, monkeypatch):
    """A rounded draw that no memo keeps and no other draw is made from is made straight
    in float32 (one look-up per large float16 input, no 2-byte copy held), and so is the
    same draw at the headroom: bit for bit the values of the packed path, for every dtype
    and kind it serves."""
    from eqsat_mirage.verifier.draws import Draws

    # W's normal draw in float16 (as above 4M elements) and looked up (above 2^18); the
    # first exponent draw below 1 (drawn input by input), the second above (from the
    # N(0, 1) draw: packed)
    monkeypatch.setattr(sampling, "DRAW_CHUNK", 1 << 16)
    monkeypatch.setattr(Draws, "_power", lambda self, j: -9 if j == 0 else 3)
    g = em.Graph("g")
    x, w = g.input("X", (4, 1024), dtype), g.input("W", (1024, 512), dtype)
    g.output(em.exp((x @ w) * 0.01).sum(axis=1, keepdims=True), "Y")
    direct = Draws(g, np.random.default_rng(0), None, 65504.0)
    packed = Draws(g, np.random.default_rng(0), None, 65504.0)
    assert (direct.normal["W"].dtype == np.float16) == (dtype == "float16")
    monkeypatch.setattr(packed, "_direct", lambda kind, s: False)
    draws = [("folded", 0.25), ("signed", 30.0), ("logits", 0.0), ("exponent", 0.0),
             ("exponent", 1.0)]
    for kind, s in draws:
        want = packed.rounded(kind, s)
        made = direct._direct(kind, s)
        got = direct.rounded(kind, s)
        assert made == (kind != "exponent" or direct._power(int(s)) < 0)
        assert ("rounded", kind, s) not in direct.memo or not made
        for n in want:
            assert got[n].dtype == want[n].dtype == np.float32 and not got[n].flags.writeable
            np.testing.assert_array_equal(got[n].view(np.uint32), want[n].view(np.uint32))
        fresh = Draws(g, np.random.default_rng(0), None, 65504.0)  # at the headroom first,
        at_h = fresh.rounded(kind + "@h", s)  # as a range draw's check reads it
        want_h = packed.rounded(kind + "@h", s)
        assert ("rounded", kind, s) not in fresh.memo or not made
        for n in want_h:
            np.testing.assert_array_equal(np.asarray(at_h[n], np.float32).view(np.uint32),
                                          np.asarray(want_h[n], np.float32).view(np.uint32))
        packed.release(kind, s)
        direct.release(kind, s)
    assert not direct._direct("folded", 0.5) and not direct._direct("signed", 1.0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_pack_keeps_every_rounded_value(dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(4000) * np.exp2(rng.integers(-30, 30, 4000))
    x[:4] = [np.inf, -np.inf, np.nan, -0.0]
    r = round_to(x, dtype)
    packed = pack(r, dtype)
    assert packed.itemsize == (4 if dtype == "float32" else 2)
    back = unpack(packed)
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back.view(np.uint32), r.view(np.uint32))  # bit for bit
    one = np.broadcast_to(np.float32(3.0), (5, 7))
    assert pack(one, dtype) is one and unpack(one) is one


def test_the_memo_keeps_rounded_draws_packed_and_not_the_headroom_ones():
    a, good, bad = attention(dtype="float16"), attention(dtype="float16"), \
        attention(wrong=True, dtype="float16")
    memo: dict = {}
    assert em.verify(a, good, seed=1, memo=memo).equivalent
    kept = {k: v for k, v in memo.items() if isinstance(k, tuple) and k[0] == "rounded"}
    assert kept and not any(k[1].endswith("@h") for k in kept)
    arrays = [x for d in kept.values() for x in d.values() if x.ndim and any(x.strides)]
    assert arrays and all(x.dtype == np.float16 for x in arrays)
    # the same verdicts as without a memo, the wrong program still refused
    assert em.verify(a, good, seed=1, memo=memo).equivalent
    assert not em.verify(a, bad, seed=1, memo=memo).equivalent
    assert em.verify(a, good, seed=1).equivalent


def test_the_piece_verification_bench_verifies_a_real_candidate_twice():
    pytest.importorskip("transformers")
    from bench import real_sizes

    r = real_sizes.verify_piece(3, 8, {"hidden": 64, "heads": 2, "kv_heads": 1,
                                       "intermediate": 128}, "float32")
    assert r["candidate"].endswith("_fused")  # the search's fusion plan, a MuGraph
    assert [run["equivalent"] for run in r["runs"]] == [True, True]
    assert r["estimate_bytes"][1] <= r["estimate_bytes"][2] and r["peak_bytes"] > 0


def test_draws_without_a_memo_keep_only_the_draws_others_are_made_from():
    """The end-to-end check (no search memo) keeps the rounded draws that others are made
    from, ("folded", 0.5) and ("signed", 1), and drops the rest once checked; a search's
    memo keeps them all. A draw is unpacked once per check and thread, read-only."""
    from eqsat_mirage.verifier.draws import Draws

    a = attention(dtype="float16")
    for memo in (None, {}):
        d = Draws(a, np.random.default_rng(0), memo, 65504.0)
        assert all(z.dtype == np.float32 for z in d.normal.values())
        for kind, s in (("folded", 0.25), ("folded", 0.5), ("signed", 1.0), ("exponent", 0.0),
                        ("peakfold", 1.0)):
            x = d.rounded(kind, s)
            assert d.rounded(kind, s) is x  # held for this check's further evaluations
            assert all(not v.flags.writeable for v in x.values())
            with pytest.raises(ValueError):
                x["Q"][0, 0, 0] = 1.0
            d.release(kind, s)
            assert d.rounded(kind, s) is not x
            d.release(kind, s)
        kept = {k[1:] for k in d.memo if isinstance(k, tuple) and k[0] == "rounded"}
        want = {("folded", 0.5), ("signed", 1.0)} if memo is None else \
            {("folded", 0.25), ("folded", 0.5), ("signed", 1.0), ("exponent", 0.0),
             ("peakfold", 1.0)}
        assert kept == want, kept


def test_a_peak_near_float32s_largest_is_drawn_in_float64():
    """The per-input draws scale the float32 normal draw by a factor up to a dtype's
    largest value over its largest |z|: past float32's range the product is float64."""
    from eqsat_mirage.verifier.sampling import scaled

    z = np.array([0.25, -0.5, 1.0], dtype=np.float32)
    big = scaled(z, 2.0**127)
    assert big.dtype == np.float64 and np.all(np.isfinite(big)) and big[2] == 2.0**127
    assert scaled(z, 0.5).dtype == np.float32 and scaled(z, 0.5)[1] == -0.25


def test_float32_inputs_give_the_float64_evaluation_of_their_values():
    """A float64 evaluation takes float32 inputs as given and converts each as it reads it:
    the values of converting them all first."""
    g = attention()
    rng = np.random.default_rng(2)
    x32 = {n: rng.standard_normal(v.shape).astype(np.float32) for n, v in g.inputs.items()}
    got = em.evaluate(g, x32)
    want = em.evaluate(g, {n: v.astype(np.float64) for n, v in x32.items()})
    assert all(got[k].dtype == np.float64 for k in got)
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_the_end_to_end_estimate_counts_the_draws():
    a = attention(dtype="float16")
    parts = dict(memory.float_parts(a, a, 1))
    draws = [n for what, n in parts.items() if what.startswith("the draws")]
    inputs = sum(int(np.prod(v.shape)) for v in a.inputs.values())
    # the float32 normal draw, two rounded, the folded one at the headroom in float32
    assert draws == [inputs * 4 + 2 * inputs * 2 + inputs * 4]
    outputs = sum(int(np.prod(v.shape)) for v in a.outputs.values())
    kept = [n for what, n in parts.items() if what.startswith("the first program's outputs")]
    assert kept == [memory.OUTPUT_SETS * 8 * outputs]
    assert parts[next(w for w in parts if "interpreter" in w)] == memory.BASE


def test_a_bool_mask_in_the_constant_draws_stays_one_value():
    """Every input of a constant or peak draw is one value (a read-only broadcast: no
    memory per element, evaluated on one element), a bool mask input too, rounded or not."""
    from eqsat_mirage.verifier.draws import Draws

    g = em.Graph("masked")
    x, m = g.input("X", (64, 64), "float16"), g.input("M", (64, 64), "bool")
    g.output(em.where(m, x * 2.0, x - 1.0), "Y")
    d = Draws(g, np.random.default_rng(0), None, 65504.0)
    for kind, s in (("constant", 0.5), ("peak", 0.0)):
        for x in d.rounded(kind, s).values():
            assert x.dtype == np.float32 and not any(x.strides), (kind, x.strides)
        packed = d.memo[("rounded", kind, s)]
        assert all(not any(x.strides) for x in packed.values())
    assert d.rounded("constant", 0.5)["M"][0, 0] == 1.0  # 0.5 holds as a mask


def test_the_float64_checks_scaled_draws_are_float64():
    """The float64 checks read the draws as drawn (``Draws.inputs``): N(0, 1) itself (the
    float32 normal draw, read-only), and a scaled draw in float64, which a float64
    evaluation reads as given: no float32 copy held beside the float64 one (a MuGraph's
    tiled interpreter converts every input as it starts)."""
    from eqsat_mirage.verifier.draws import Draws

    a = attention(dtype="float16")
    d = Draws(a, np.random.default_rng(0), None, 65504.0)
    one = d.inputs("signed", 1.0)
    assert all(x.dtype == np.float32 and not x.flags.writeable for x in one.values())
    for kind, s in (("signed", 30.0), ("signed", 1000.0), ("folded", 0.5)):
        got = d.inputs(kind, s)
        for n, x in got.items():
            assert x.dtype == np.float64, (kind, s, n)
            z = d.normal[n]
            want = (np.abs(z) if kind == "folded" else z) * np.float32(s)
            np.testing.assert_array_equal(x, want.astype(np.float64))


def test_the_per_input_draws_at_the_headroom_share_the_others_values():
    """A per-input draw at the headroom is ("folded", 0.5) at the headroom with one input
    changed: the others' values are made once per ``Draws`` and shared (read-only), and
    every value is what scaling that draw by the headroom gives."""
    from eqsat_mirage.verifier.draws import Draws

    g = em.Graph("mlp")
    x, w = g.input("X", (4, 64), "float16"), g.input("W", (64, 32), "float16")
    g.output(em.silu(x @ w), "Y")
    d = Draws(g, np.random.default_rng(0), None, 65504.0)
    d.headroom = 2.0**12
    h0, h1 = d._rounded("peakfold@h", 0.0), d._rounded("peakfold@h", 1.0)
    assert h0["W"] is d._folded_at_headroom()["W"]  # input 0 (X) changed, W shared
    assert h1["X"] is d._folded_at_headroom()["X"] and not h1["X"].flags.writeable
    for i, got in enumerate((h0, h1)):
        want = d._times(d._packed("peakfold", float(i)), d.headroom)
        for name in got:
            assert np.array_equal(got[name], want[name], equal_nan=True), (i, name)


def test_large_inputs_draw_their_normals_in_chunks_the_same_for_the_same_state(monkeypatch):
    """``sampling.standard_normal``: an input above ``DRAW_CHUNK`` elements is drawn in float32
    chunk by chunk from generators seeded by the draw's (the same values for the same
    state, N(0, 1) moments, chunks that are not copies); a small one as before, in
    float64 rounded to float32 (every seed's small draws unchanged)."""
    from eqsat_mirage.verifier import sampling

    small = sampling.standard_normal(np.random.default_rng(3), (5, 7))
    assert np.array_equal(small, np.random.default_rng(3).standard_normal((5, 7)).astype(
        np.float32))
    monkeypatch.setattr(sampling, "DRAW_CHUNK", 1000)
    monkeypatch.setattr(modular, "DRAW_CHUNK", 1000)  # the chunks themselves (``chunked``)
    got = []
    for seed in (4, 4, 5):
        rng = np.random.default_rng(seed)
        x = sampling.standard_normal(rng, (61, 97))
        got.append((x, rng.integers(0, 2**62)))
        assert x.dtype == np.float32 and x.shape == (61, 97)
        assert abs(float(x.mean())) < 0.05 and abs(float(x.std()) - 1.0) < 0.05
    assert np.array_equal(got[0][0], got[1][0]) and got[0][1] == got[1][1]
    assert not np.array_equal(got[0][0], got[2][0])
    flat = got[0][0].reshape(-1)
    assert not np.array_equal(flat[:100], flat[1000:1100])


def test_a_large_float16_inputs_normal_draw_is_kept_in_float16_and_still_catches(monkeypatch):
    """Above ``DRAW_CHUNK`` elements a float16 input's N(0, 1) draw is held in float16 (its
    draws are rounded to float16 anyway; the signed draw is packed as a view of it): the
    float checks still refuse an overflowing rewrite and pass the program itself, and the
    estimate counts 2 bytes an element for it."""
    from eqsat_mirage.verifier import draws
    from eqsat_mirage.verifier.floatcheck import float_checks

    def prog(name: str, unsafe: bool) -> em.Graph:
        g = em.Graph(name)
        x = g.input("x", (64, 64), dtype="float16")
        w = g.input("w", (64, 64), dtype="float16")
        g.output(((x * x) * (1.0 / 65536.0)) * w if unsafe else
                 ((x * (1.0 / 256.0)) * (x * (1.0 / 256.0))) * w, "out")
        return g

    a, b = prog("a", False), prog("b", True)
    before = memory.draw_bytes(a)
    monkeypatch.setattr(sampling, "DRAW_CHUNK", 1000)
    monkeypatch.setattr(modular, "DRAW_CHUNK", 1000)  # the chunks themselves (``chunked``)
    monkeypatch.setattr(memory, "DRAW_CHUNK", 1000)
    assert memory.draw_bytes(a) == before - 2 * 2 * 64 * 64
    d = draws.Draws(a, np.random.default_rng(0), {})
    assert all(z.dtype == np.float16 for z in d.normal.values())
    assert d._packed("signed", 1.0)["x"].base is not None  # a view of the draw
    for seed in (0, 1):
        cex, native = float_checks(a, b, np.random.default_rng(seed), 1e-7, True)
        assert native and cex is not None and cex.domain == "native dtype", cex
        cex, _ = float_checks(a, prog("c", False), np.random.default_rng(seed), 1e-7, True)
        assert cex is None, cex


def test_a_draw_at_the_headroom_is_scaled_in_float64():
    """``Draws.inputs(kind + "@h")``: a float16 input's draw (held in float16 above
    DRAW_CHUNK) times the headroom is computed in float64, not overflowed in float16."""
    from eqsat_mirage.verifier import draws

    g = em.Graph("g")
    x = g.input("x", (3, 4), dtype="float16")
    g.output(x * 2.0, "y")
    d = draws.Draws(g, np.random.default_rng(0), {})
    d.normal["x"] = d.normal["x"].astype(np.float16)  # as a large float16 input's is held
    d.headroom = 2.0**27
    got = d.inputs("signed@h", 1.0)["x"]
    assert got.dtype == np.float64 and np.isfinite(got).all()
    np.testing.assert_array_equal(got, d.normal["x"].astype(np.float64) * 2.0**27)


@pytest.mark.parametrize("kind,s", [("folded", 0.25), ("folded", 0.5), ("signed", 30.0),
                                    ("exponent", 0.0), ("exponent", 1.0), ("logits", 0.0),
                                    ("peakfold", 0.0), ("peakfold", 1.0)])
def test_a_large_float16_draw_looked_up_by_its_bits_gives_the_same_values(monkeypatch,
                                                                           kind, s):
    """``Draws._looked_up``: a large float16 input's scaled draw, in float64 and rounded to
    float16, is the elementwise one bit for bit (the exponent draws' small scales put
    values among float16's subnormals; a peak near float32's largest is drawn in float64),
    and a small input's is made elementwise as before."""
    from eqsat_mirage.verifier import draws

    g = em.Graph("g")  # x above 16 x 4096 elements: its draw's rounding may take the
    x = g.input("x", (256, 320), dtype="float16")  # subnormals' path, the table's not
    w = g.input("w", (320, 48), dtype="float16")
    g.output(em.exp((x @ w) * 0.125), "y")
    monkeypatch.setattr(sampling, "DRAW_CHUNK", 1000)
    monkeypatch.setattr(modular, "DRAW_CHUNK", 1000)
    d = draws.Draws(g, np.random.default_rng(7), {}, 65504.0)
    d.headroom = 2.0 ** 26
    assert all(z.dtype == np.float16 for z in d.normal.values())
    if kind == "exponent":  # both signs of the exponent: one below float16's normals
        monkeypatch.setattr(d, "_power", lambda j: (-13, 9)[j])
    for finish in (lambda v: np.asarray(v, dtype=np.float64), lambda v: d._round("x", v)):
        want = finish(d._draw(kind, s, "x"))
        monkeypatch.setattr(draws, "_LOOKUP_MIN", 1)
        got = d._looked_up(kind, s, "x", finish)
        monkeypatch.setattr(draws, "_LOOKUP_MIN", 1 << 30)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    monkeypatch.setattr(draws, "_LOOKUP_MIN", 1)  # and as the draws are made of it
    rounded = d._rounded(kind, s)["x"]  # (a float32 array where made otherwise: ``_times``)
    assert np.array_equal(np.asarray(rounded, dtype=np.float32),
                          d._round("x", d._draw(kind, s, "x")).astype(np.float32))
    assert np.array_equal(d._as_drawn(kind, s, "x"),
                          np.asarray(d._draw(kind, s, "x"), dtype=np.float64))
