"""Stage 7, lower: a ``MuGraph`` to a Python module of ``@triton.jit`` kernels and a launcher.

``source.py``: ``triton_source`` and ``compile_mugraph``. ``kernel.py``: one custom
kernel's body. ``tiles.py``: tile expressions (``tl.dot``, reductions, masks).
``concat.py``: concatenation and the code generator's errors.

Takes: a validated ``MuGraph``.
Gives: Triton source text and a callable on torch tensors.
May import: ir, frontend, semantics, mugraph.
"""
