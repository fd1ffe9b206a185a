"""eqsat-mirage: a multi-level superoptimizer for small GPU tensor programs.

The public API (see DESIGN.md): build a program with ``Graph`` and the
NumPy-like functions, run it with ``evaluate``, compare two programs with
``verify``.
"""

from .check import check, check_lax
from .errors import DTypeError, GraphError, InputError, LaxError, MirageError, RuleError, ShapeError
from .graph import Graph, Tensor, concat, exp, matmul, relu, rms_norm, rsqrt, silu, sqrt, transpose
from .ir import Node, Op
from .semantics_float import evaluate
from .verify import Counterexample, VerifyResult, verify

__version__ = "0.1.0"

__all__ = [
    "Counterexample", "DTypeError", "Graph", "GraphError", "InputError", "LaxError",
    "MirageError", "Node", "Op", "RuleError", "ShapeError", "Tensor", "VerifyResult",
    "check", "check_lax", "concat", "evaluate", "exp", "matmul", "relu", "rms_norm", "rsqrt",
    "silu", "sqrt", "transpose", "verify",
]
