"""eqsat-mirage: a multi-level superoptimizer for small GPU tensor programs.

The public API (see DESIGN.md): build a program with ``Graph`` and the
NumPy-like functions, run it with ``evaluate``, compare two programs with
``verify``, superoptimize it with ``optimize``, check rule files with
``check_rules``.
"""

from .check import check, check_lax
from .check_rules import RuleCheck, RuleCheckReport, assert_sound, check_rules
from .errors import DTypeError, GraphError, InputError, LaxError, MirageError, RuleError, ShapeError
from .graph import Graph, Tensor, concat, exp, matmul, relu, rms_norm, rsqrt, silu, sqrt, transpose
from .ir import Node, Op
from .many import optimize_many
from .mugraph import (
    BlockInput,
    BlockOutput,
    CustomKernel,
    MuGraph,
    MuGraphError,
    PredefinedKernel,
    TensorSpec,
    TilingError,
    UnknownTensorError,
)
from .mugraph_facts import from_graph
from .optimize import OptimizeResult, optimize
from .semantics_float import evaluate
from .verify import Counterexample, VerifyResult, verify

__version__ = "0.1.0"

__all__ = [
    "assert_sound", "BlockInput", "BlockOutput", "check", "check_lax", "check_rules", "concat",
    "Counterexample", "CustomKernel", "from_graph", "MuGraph", "MuGraphError", "PredefinedKernel",
    "TensorSpec", "TilingError", "UnknownTensorError",
    "DTypeError", "evaluate", "exp", "Graph", "GraphError", "InputError", "LaxError", "matmul",
    "MirageError", "Node", "Op", "optimize", "optimize_many", "OptimizeResult", "relu",
    "rms_norm", "rsqrt", "RuleCheck", "RuleCheckReport", "RuleError", "ShapeError", "silu",
    "sqrt", "Tensor", "transpose", "verify", "VerifyResult",
]

# The torch front end and torch.compile backend load on first use: torch stays optional.
from .errors import UnsupportedOpError  # noqa: E402

__all__ += ["backend", "from_torch", "UnsupportedOpError"]


def __getattr__(name: str):
    """``from_torch`` and ``backend``, imported (with torch) on first access."""
    if name == "from_torch":
        from .torch_frontend import from_torch
        return from_torch
    if name == "backend":
        from .torch_backend import backend
        return backend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
