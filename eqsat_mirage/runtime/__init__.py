"""Running an optimized module: what a deployment needs, without the search.

``load.py``: ``load_source``, a generated module's source (``codegen.source``'s
``triton_source`` or ``family_source``, made now or saved earlier) written to a private
folder (``private_folder``) and imported as a callable on torch tensors; ``CodegenError``.
``check.py``: the checked first launch (``checked``, ``CheckedLaunch``, ``compare``,
``tolerance``, ``LaunchCheckError``): the first call per input signature compared with a
reference callable that the search side builds from the input program. ``graphs.py``:
``GraphRunner``, CUDA-graph capture once per input signature and replay. ``timing.py``:
the device timer of the search's tuning pass (``CudaEventTimer``: CUDA-graph replays timed
by CUDA events; ``time_candidates``, ``fastest``; any object with the ``Timer`` shape
stands in for it in tests; ``RecordedTimer`` and ``plan_key``: times measured on a GPU
before, looked up by plan where the search runs on another machine).

This stage needs only torch, triton and NumPy (and the standard library); of the package
it imports ``ir.errors`` alone, so ``import eqsat_mirage.runtime`` loads neither egglog,
galois nor SciPy.

Takes: a generated module's source text; a reference callable for the launch check.
Gives: a callable on torch tensors (checked at its first launch, replayed as a CUDA graph).
May import: ir (its errors), version.
"""

from .check import CheckedLaunch, LaunchCheckError, checked, compare, tolerance
from .graphs import CudaGraphs, GraphRunner
from .load import CodegenError, load_source, private_folder

__all__ = ["CheckedLaunch", "CodegenError", "CudaGraphs", "GraphRunner", "LaunchCheckError",
           "checked", "compare", "load_source", "private_folder", "tolerance"]
