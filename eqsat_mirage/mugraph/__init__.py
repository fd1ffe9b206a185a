"""The multi-level program: kernel graph, block graphs, thread graphs (Mirage's muGraphs).

``kernels.py``: device tensor specs and the predefined/custom kernels; ``validate.py``:
their checks; ``tiled.py``: the interpreter that executes the tiling for real (floats and
field); ``parts.py``: which parts of a field value it needs; ``memory.py``: what a run of
it holds; ``facts.py``: the reference graph, the Lax check and degrees; ``io.py``: the
listing and JSON; ``program.py``: the ``MuGraph`` class, ``from_graph`` and ``from_dict``;
``dots.py``: which tile matmuls the Triton backend emits as ``tl.dot`` (read by the cost
model and the code generator).

Takes: kernels built by hand or by the fusion planner, or a ``Graph`` (``from_graph``).
Gives: a validated ``MuGraph`` that the verifier, cost model and code generator read.
May import: ir, frontend, semantics, verifier.
"""
