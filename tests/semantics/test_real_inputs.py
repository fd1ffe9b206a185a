"""Issue 51: ``em.evaluate`` takes real inputs only. A complex input (array, list, scalar or
torch tensor; its imaginary part was dropped) or one of text or dates is an ``InputError``
naming the input, for a Graph and a MuGraph alike; bools, ints and floats are converted."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import eqsat_mirage as em
from eqsat_mirage.mugraph.program import from_graph


def program() -> em.Graph:
    g = em.Graph("p")
    x = g.input("x", (2,), dtype="float32")
    g.output(x * 2.0, "y")
    return g


COMPLEX = [np.array([1 + 2j, 3j]), np.array([1 + 0j, 2 + 0j]), [1 + 2j, 3j],
           torch.tensor([1 + 2j, 3j]), np.array([1 + 2j, 3j], dtype=np.complex64)]


@pytest.mark.parametrize("prog", [program, lambda: from_graph(program())], ids=["graph", "mugraph"])
@pytest.mark.parametrize("value", COMPLEX, ids=lambda v: type(v).__name__ + str(len(v)))
def test_a_complex_input_is_refused_by_name(prog, value):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ComplexWarning: nothing is cast
        with pytest.raises(em.InputError, match=r"input 'x': a complex (array|tensor)"):
            em.evaluate(prog(), {"x": value})


@pytest.mark.parametrize("value", [np.array(["1", "2"]), np.array(["2020-01-01"] * 2,
                                                                   dtype="datetime64[D]"),
                                   np.array([1, 2j], dtype=object)])
def test_other_non_real_inputs_are_refused_by_name(value):
    with pytest.raises(em.InputError, match=r"input 'x': cannot convert ndarray to an array "
                                            r"of real numbers"):
        em.evaluate(program(), {"x": value})


@pytest.mark.parametrize("value", [np.array([True, False]), np.array([1, 2]), [1.0, 2],
                                   np.array([1, 2], dtype=object), torch.tensor([1.0, 2.0]),
                                   np.array([1.0, 2.0], dtype=np.float16)])
def test_real_inputs_are_converted(value):
    want = np.asarray(np.asarray(value, dtype=np.float64) * 2.0)
    np.testing.assert_array_equal(em.evaluate(program(), {"x": value})["y"], want)
