"""The tiles a custom kernel cuts from its inputs (``tiled.cut``) are views of them, which
the memory estimate relies on (``mugraph/memory.py`` counts no bytes for them): for every
input of every custom kernel the planner makes for the benchmarks, contiguous or read
through a transpose."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from bench.programs import program
from eqsat_mirage.fusion.planner import plan
from eqsat_mirage.mugraph.tiled import cut


def _root(x: np.ndarray) -> np.ndarray:
    while isinstance(x.base, np.ndarray):
        x = x.base
    return x


@pytest.mark.parametrize("name", ["gqa", "qknorm", "rmsnorm", "lora", "gatedmlp", "ntrans"])
def test_every_tile_is_a_view_of_its_input(name):
    mg = plan(program(name, 1)).mugraph
    custom = [k for k in mg.kernels if k.kind == "custom"]
    assert custom
    for k in custom:
        for bi in k.inputs.values():
            shape = mg.tensors[bi.tensor].shape
            whole = np.zeros(shape, dtype=np.int8)  # only the layout matters
            flipped = np.zeros(shape[::-1], dtype=np.int8).T  # not contiguous
            for x in (whole, flipped):
                tracemalloc.start()
                try:
                    tiles = cut(x, bi.imap, bi.fmap, k.grid, k.forloop)
                    grown = tracemalloc.get_traced_memory()[1]
                finally:
                    tracemalloc.stop()
                assert _root(tiles) is _root(x), (name, k.name, bi.name)
                assert grown < 4096, (name, k.name, bi.name, grown)
