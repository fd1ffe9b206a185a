"""The GPU cost model: hardware profiles and the prices of programs.

``profile.py``: ``GPUProfile`` (extract/*.toml, every figure with its source, calibration).
``per_op.py``: one kernel per kernel-level op (used by extraction). ``gpucost.py``: a
MuGraph's kernels, transfers at every memory level, waves, the roofline.

Takes: a target name or .toml path, and a ``Graph`` or ``MuGraph``.
Gives: times in microseconds with their breakdown.
May import: ir, frontend, mugraph.
"""
