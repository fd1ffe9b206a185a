"""``semantics/gemm.py``: a batched matmul with an operand broadcast over the batch, run as
one GEMM, gives NumPy's values (the tiled interpreter's products of a replicated tile)."""

from __future__ import annotations

import numpy as np
import pytest

from eqsat_mirage.semantics.gemm import batch_broadcast, matmul, one_gemm
from eqsat_mirage.semantics.modular import matmul_mod

CASES = [  # (a shape, a broadcast to, b shape, b broadcast to): None keeps the array whole
    ((1, 5, 7), (6, 5, 7), (6, 7, 3), None),          # a tile replicated over 6 blocks
    ((5, 7), None, (6, 7, 3), None),                  # a 2-D operand against a batch
    ((6, 5, 7), None, (1, 7, 3), (6, 7, 3)),          # the other side replicated
    ((6, 5, 7), None, (7, 3), None),                  # rows of every batch element stacked
    ((1, 1, 5, 7), (4, 3, 5, 7), (4, 3, 7, 2), None),  # two batch axes
    ((1, 5, 7), (6, 5, 7), (1, 7, 3), (6, 7, 3)),     # both replicated: one product
]


def operand(rng, shape, to, dtype):
    x = rng.integers(-50, 50, shape).astype(dtype)
    return x if to is None else np.broadcast_to(x, to)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("sa,ta,sb,tb", CASES)
def test_one_gemm_gives_numpys_values(sa, ta, sb, tb, dtype):
    rng = np.random.default_rng(0)
    a, b = operand(rng, sa, ta, dtype), operand(rng, sb, tb, dtype)
    want = np.matmul(a, b)
    got = matmul(a, b)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)  # small integers: every sum is exact
    assert got.flags.c_contiguous
    assert one_gemm(a, b) is not None  # every case here is rewritten


def test_random_floats_agree_to_rounding():
    rng = np.random.default_rng(1)
    a = np.broadcast_to(rng.standard_normal((1, 16, 64)), (40, 16, 64))
    b = rng.standard_normal((40, 64, 8)).transpose(0, 2, 1).copy().transpose(0, 2, 1)
    np.testing.assert_allclose(matmul(a, b), np.matmul(a, b), rtol=1e-12, atol=1e-12)


def test_products_numpy_runs_once_already_are_left_alone():
    rng = np.random.default_rng(2)
    assert one_gemm(rng.standard_normal((5, 7)), rng.standard_normal((7, 3))) is None
    assert one_gemm(rng.standard_normal((1, 5, 7)), rng.standard_normal((1, 7, 3))) is None
    assert one_gemm(rng.standard_normal((7,)), rng.standard_normal((4, 7, 3))) is None
    both = rng.standard_normal((4, 5, 7)), rng.standard_normal((4, 7, 3))
    assert one_gemm(*both) is None  # no operand shared by the batch
    assert batch_broadcast(np.broadcast_to(both[0][:1], (4, 5, 7)))
    assert not batch_broadcast(both[0])


def test_the_exact_field_product_of_a_replicated_tile_is_unchanged():
    rng = np.random.default_rng(3)
    m = 2147483647
    a = np.broadcast_to(rng.integers(0, m, (1, 8, 300)), (12, 8, 300))
    b = rng.integers(0, m, (12, 300, 5))
    want = np.array([[[sum(int(x) * int(y) for x, y in zip(a[i, r], b[i, :, c])) % m
                       for c in range(5)] for r in range(8)] for i in range(12)])
    np.testing.assert_array_equal(matmul_mod(a, b, m), want)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_weights_tiles_side_by_side_are_read_in_place(transposed):
    """The tiles a grid cuts from a weight's columns (its rows cut by the loop) are, side by
    side, a slice of the weight: one GEMM reads it without a copy, row-major or, for
    ``x @ W.T``, column-major, and gives NumPy's batched values."""
    rng = np.random.default_rng(0)
    w = rng.integers(-50, 50, (24, 40) if not transposed else (40, 24)).astype(np.float32)
    w = w.T if transposed else w  # (24, 40) either way
    tiles = w.reshape(3, 8, 5, 8).transpose(0, 2, 1, 3)  # (loop 3, grid 5, k 8, n 8)
    x = np.broadcast_to(rng.integers(-50, 50, (6, 8)).astype(np.float32), (5, 6, 8))
    for f in range(3):
        a2, b2, finish = one_gemm(x, tiles[f])
        assert np.shares_memory(b2, w) and b2.shape == (8, 40)
        np.testing.assert_array_equal(finish(a2 @ b2), np.matmul(x, tiles[f]))
    # the field's float64 operand of an int64 weight is converted: a copy, the same values
    wi = w.astype(np.int64)
    ti = wi.reshape(3, 8, 5, 8).transpose(0, 2, 1, 3)
    _, b2, _ = one_gemm(np.broadcast_to(x[0].astype(np.int64), x.shape), ti[0], np.float64)
    assert b2.dtype == np.float64 and not np.shares_memory(b2, wi)
    np.testing.assert_array_equal(b2, wi[:8].astype(np.float64))


def test_large_inputs_draw_their_residues_in_chunks_the_same_for_the_same_state(monkeypatch):
    """``modular.residues``: an input above ``DRAW_CHUNK`` elements is drawn chunk by chunk
    on threads, each chunk from its own generator seeded by the trial's, so the values
    depend only on the generator's state (a memo's replay draws them again exactly), are
    uniform in [0, 2**k) (2**k the largest power of two below m: the sampling set the
    bound counts, ``bound.per_trial_bound``), cover that range and leave the generator where
    a replay expects it; a small input is drawn as NumPy draws it, in [0, m)."""
    from eqsat_mirage.semantics import modular

    m = (1 << 31) - 1
    small = modular.residues(np.random.default_rng(5), m, (3, 4))
    assert np.array_equal(small, np.random.default_rng(5).integers(0, m, (3, 4)))
    monkeypatch.setattr(modular, "DRAW_CHUNK", 1000)
    draws = []
    for seed in (7, 7, 8):
        rng = np.random.default_rng(seed)
        x = modular.residues(rng, m, (51, 131))  # odd: a chunk of an odd size at the end
        draws.append((x, rng.integers(0, 2**62)))
        assert x.shape == (51, 131) and x.dtype == np.int64
        assert x.min() >= 0 and x.max() < 2**30 and x.max() > 0.99 * 2**30
        assert 0.45 * 2**30 < x.mean() < 0.55 * 2**30
    assert np.array_equal(draws[0][0], draws[1][0]) and draws[0][1] == draws[1][1]
    assert not np.array_equal(draws[0][0], draws[2][0])
    flat = draws[0][0].reshape(-1)  # chunks are not copies of each other, nor halves
    assert not np.array_equal(flat[:100], flat[1000:1100])
    assert not np.array_equal(flat[:100], flat[500:600])
    q = (1 << 29) + 11  # a q: [0, 2**29)
    x = modular.residues(np.random.default_rng(1), q, (3001,))
    assert x.max() < 2**29 and 0.45 * 2**29 < x.mean() < 0.55 * 2**29
