"""The float checks' packed draws (eqsat_mirage/verifier/packing.py): a 0-d input stays a
0-d array through the headroom scaling, so ``read_only`` can flag it (before, a 0-d
float32 input times a NumPy scalar came back a NumPy scalar and every verification of a
program with such an input raised "Cannot set flags on array scalars": T5's float16
clamp value, a 0-d float32 tensor, sent its partitions back to eager)."""

from __future__ import annotations

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.verifier.packing import read_only, scaled_up


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_0d_input_scaled_up_is_an_array_that_read_only_flags(dtype):
    x = np.asarray(np.float32(1.5)).reshape(())
    out = scaled_up({"c": x}, {"c": dtype}, 4.0, "c")
    assert isinstance(out, np.ndarray) and out.shape == () and float(out) == 6.0
    assert not read_only(out).flags.writeable


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_a_program_with_a_0d_float32_input_verifies(dtype):
    g = em.Graph("scalar_input")
    h = g.input("h", (4, 8), dtype=dtype)
    c = g.input("c", (), dtype="float32")
    g.output(h * c, "out")
    assert em.verify(g, g, trials=2, seed=0).equivalent


def test_read_only_makes_a_numpy_scalar_a_read_only_0d_array():
    for x in (np.float32(1.0), np.float64(2.0), np.bool_(True)):
        out = read_only(x)
        assert isinstance(out, np.ndarray) and out.shape == () and out == x
        assert not out.flags.writeable


def test_a_program_of_a_0d_bool_mask_verifies():
    """T5's float16 clamp: ``where(isinf(h).any(), max - 1000, max)`` and its negation,
    one piece whose only input is a 0-d bool."""
    g = em.Graph("scalar_mask")
    m = g.input("m", (), dtype="bool")
    w = em.where(m, 64504.0, 65504.0)
    g.output(w, "out0")
    g.output(-w, "out1")
    assert em.verify(g, g, trials=2, seed=0).equivalent
