"""Whole programs: cut into Lax pieces, and the pieces' programs stitched back.

``pieces.py``: ``partition`` cuts a program by exp layers and by size at the cheapest
places. ``mincut.py``: the minimum cut over tensor bytes behind it. ``stitch.py``: the
programs chosen for the pieces renamed and joined into one MuGraph. ``contexts.py``: which
pieces repeat in the same surroundings, and the prefix the end-to-end check runs on.

Takes: a kernel-level ``Graph`` (any program, Lax or not).
Gives: ``Piece``s (each a Lax ``Graph`` with canonical names), and one ``MuGraph`` from
the pieces' programs.
May import: ir, frontend, semantics, verifier, mugraph.
"""

from .pieces import DEFAULT_PIECE_OPS, Piece, needs_partition, partition
from .stitch import stitch

__all__ = ["DEFAULT_PIECE_OPS", "Piece", "needs_partition", "partition", "stitch"]
