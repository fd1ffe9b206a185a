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
    "MirageError", "Node", "Op", "optimize", "OptimizeResult", "relu", "rms_norm", "rsqrt",
    "RuleCheck", "RuleCheckReport", "RuleError", "ShapeError", "silu", "sqrt", "Tensor",
    "transpose", "verify", "VerifyResult",
]
