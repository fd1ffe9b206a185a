"""What a shape family's generated module needs besides its plan: ``FamilyLayout``.

The code generator writes a family's module at one padded size from it (the kernels'
runtime strides and loop counts: ``kernel.py``; the launcher's lines that read L:
``family_launch.py``); the family stage builds it from a plan's ``Scaling``
(``family/runner.py``) and merges the modules written at several padded sizes into one
(``family/launcher.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["FamilyLayout"]


@dataclass(frozen=True)
class FamilyLayout:
    """What a shape family's module needs besides its plan.

    ``name``: the size (e.g. ``"L"``); ``granule``: padded sizes are its multiples;
    ``low``/``high``: L's range (``high`` None: unbounded); ``hint``; ``inputs``: input ->
    its axes of size L; ``tensors``: device tensor -> its axes that grow with ``lp``;
    ``loop``: kernels whose loop count grows; ``short``: inputs the kernels read unpadded
    (loads masked at L; the others are zero-padded to ``lp`` by the launcher);
    ``launch``: kernel -> (num_warps, num_stages), the hint's, at every padded size (one
    binary per kernel); ``padded``: a module serving that one padded size only (``merge``'s
    fallback).
    """

    name: str
    granule: int
    low: int
    high: int | None
    hint: int
    inputs: Mapping[str, tuple[int, ...]]
    tensors: Mapping[str, frozenset[int]] = field(default_factory=dict)
    loop: frozenset[str] = frozenset()
    short: frozenset[str] = frozenset()
    launch: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    padded: int | None = None
