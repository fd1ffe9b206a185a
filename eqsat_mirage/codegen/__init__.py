"""Stage 7, lower: a ``MuGraph`` to a Python module of ``@triton.jit`` kernels and a launcher.

``source.py``: ``triton_source`` (a shape family's module at one padded size too) and
``compile_mugraph``. ``family_layout.py``: ``FamilyLayout``, what a shape family's module
needs besides its plan; ``family_launch.py``: the lines its launcher adds (reading and
checking L, padding, cutting outputs); one module for every padded size is the
``family`` stage's. ``host.py``: the launcher's
input checks once per input signature, constexpr strides, output buffers
(``reuse_outputs``). ``kernel.py``: one custom kernel's body. ``tiles.py``: tile
expressions (``tl.dot``, reductions, masks; which tile matmuls become ``tl.dot`` is
``mugraph.dots``'s, the cost model reads it too). ``concat.py``: concatenation, and
the code generator's error ``CodegenError`` (defined with the loader, ``runtime.load``).
``compiled.py``: ``compile_report``, each generated kernel compiled for the real target
(sm_90a) without a GPU, with its registers, spills and shared memory. Loading a module,
the checked first launch and CUDA-graph replay are the ``runtime`` stage's
(``runtime.load``, ``runtime.check``, ``runtime.graphs``).

Takes: a validated ``MuGraph``.
Gives: Triton source text, a callable on torch tensors, compiled kernels' resources.
May import: ir, runtime (loading a module, ``CodegenError``), frontend, semantics, mugraph,
cost (the launch's warps and stages).
"""
