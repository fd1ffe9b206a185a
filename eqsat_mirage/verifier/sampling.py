"""The float checks' raw draws (docs/verifier.md, sections 4 and 5): N(0, 1) values per
input, scaled; the comparisons' exact ``ties``; the integer index, int8 and fp8 inputs'
fixed values. ``draws.Draws`` makes every draw from these.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.node import FP8_DTYPES, INDEX_DTYPES, QUANT_DTYPES
from ..semantics.floating import draw_ints
from ..semantics.fp8 import draw_fp8
from ..semantics.gather import POSITIONS, draw_indices, index_bounds
from ..semantics.modular import DRAW_CHUNK, chunked

# the ``ties`` draw (comparisons): every float input k * step, k in [-TIE_STEPS, TIE_STEPS]
TIE_STEPS, TIES_SEED = 4, 0x71E5


def ties(position: int, shape: tuple[int, ...], step: float) -> np.ndarray:
    """The ``ties`` draw of the input at ``position``: ``k * step``, ``k`` a uniform integer
    in [-TIE_STEPS, TIE_STEPS] from a generator of its own, the same for every seed (the
    verdict on a comparison's corners must not hang on the seed). Small multiples of a
    power of two are exact in every dtype, and so are their sums and products of a few
    terms: inputs, differences and matmul rows are often exactly equal or exactly 0, where
    ``>`` and ``>=`` (``==`` and ``!=``, a strict and a loose threshold) part."""
    g = np.random.default_rng([TIES_SEED, position])
    return g.integers(-TIE_STEPS, TIE_STEPS + 1, shape).astype(np.float64) * step


def scaled(z: np.ndarray, factor: float) -> np.ndarray:
    """``z`` (the float32 draw) times ``factor``, in float64 where the factor or the
    product could leave float32's normal range (a per-input peak near float32's largest)."""
    if 2.0**-100 <= abs(factor) <= 2.0**100 or factor == 0.0:
        return z * np.float32(factor)
    return z.astype(np.float64) * factor


def standard_normal(rng: np.random.Generator, shape: tuple[int, ...],
                    half: bool = False, stop=None) -> np.ndarray:
    """N(0, 1) values of ``shape`` in float32 from ``rng``: drawn in float64 and rounded, as
    before, up to ``DRAW_CHUNK`` elements (every seed's draws of such inputs, and the
    generator's later ones, stay as they were); a larger input (a 7B layer's weight, 45M:
    1.1 s so) drawn in float32 chunk by chunk on one thread per core (``modular.chunked``,
    as a field trial's residues: 0.33 s), and kept in float16 where ``half`` (a float16
    input: its draws are rounded to float16 anyway, and 2 bytes an element held through
    the check is what lets a 7B-size stack's end-to-end check run two draws at once).
    ``stop`` (None, or a callable that raises to stop, the verifier's deadline check) is
    called before each chunk and before a small draw."""
    if stop is not None:
        stop()
    if math.prod(shape) <= DRAW_CHUNK:
        return rng.standard_normal(shape).astype(np.float32)

    def fill(g: np.random.Generator, out: np.ndarray) -> None:
        if half:
            out[...] = g.standard_normal(out.size, dtype=np.float32)
        else:
            g.standard_normal(out.size, dtype=np.float32, out=out)

    return chunked(rng, shape, np.float16 if half else np.float32, fill, stop)


def index_draws(a, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Each integer index input of ``a``: valid indices (``gather.draw_indices``, 0 and the
    largest among them) as exact float32 (float64 past 2^24 rows), from a generator
    seeded by ``rng``'s next draw."""
    g = np.random.default_rng(int(rng.integers(0, 2**62)))
    bounds = index_bounds(a)  # an integer input no gather reads: positions (``value_inputs``)
    rows = {n: bounds.get(n, POSITIONS) for n, node in a.inputs.items()
            if node.dtype in INDEX_DTYPES}
    out = {n: draw_indices(g, a.inputs[n].shape, r).astype(
        np.float32 if r <= 2**24 else np.float64) for n, r in rows.items()}
    # an int8/uint8 value input: integers of its range, every one where there is room
    # (``draw_ints``), held fixed as the indices are (docs/verifier.md, "Integer inputs")
    out.update({n: draw_ints(g, node.shape, node.dtype) for n, node in a.inputs.items()
                if node.dtype in QUANT_DTYPES})
    # an fp8 value input: values of its dtype, every finite code where there is room and the
    # extremes (``draw_fp8``), held fixed likewise (docs/verifier.md, "fp8 inputs")
    out.update({n: draw_fp8(g, node.shape, node.dtype) for n, node in a.inputs.items()
                if node.dtype in FP8_DTYPES})
    return out
