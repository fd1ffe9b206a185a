"""eqsat-mirage: a multi-level superoptimizer for small GPU tensor programs.

The public API (README.md and docs/api.md): build a program with ``Graph`` and the
NumPy-like functions, run it with ``evaluate``, compare two programs with
``verify``, superoptimize it with ``optimize``, check rule files with
``check_rules``.
"""

from .codegen.launchcheck import LaunchCheckError
from .egraph.check_rules import RuleCheck, RuleCheckReport, assert_sound, check_rules
from .frontend.functions import (
    amax,
    causal_mask,
    concat,
    cos,
    erf,
    exp,
    gelu,
    layer_norm,
    matmul,
    relu,
    rms_norm,
    rsqrt,
    sigmoid,
    silu,
    sin,
    softmax,
    sqrt,
    tanh,
    transpose,
    where,
)
from .frontend.graph import Graph, Tensor
from .ir.check import check, check_lax
from .ir.dims import Dim, DynamicShapeError
from .ir.errors import (
    BudgetError,
    DTypeError,
    GraphError,
    InputError,
    LaxError,
    MirageError,
    RuleError,
    ShapeError,
    TimeLimitError,
)
from .ir.node import Node, Op
from .mugraph.kernels import (
    BlockInput,
    BlockOutput,
    CustomKernel,
    MuGraphError,
    PredefinedKernel,
    TensorSpec,
    TilingError,
    UnknownTensorError,
)
from .mugraph.program import MuGraph, from_graph
from .pipeline.many import optimize_many
from .pipeline.result import OptimizeResult
from .pipeline.whole import optimize
from .semantics.floating import evaluate
from .verifier.verify import Counterexample, VerifyResult, verify
from .version import __version__  # noqa: E402, F401 - em.__version__

__all__ = [
    "amax", "assert_sound", "causal_mask", "BlockInput", "BudgetError", "BlockOutput",
    "check", "check_lax",
    "check_rules", "concat",
    "Counterexample", "CustomKernel", "from_graph", "MuGraph", "MuGraphError", "PredefinedKernel",
    "TensorSpec", "TilingError", "UnknownTensorError",
    "Dim", "DynamicShapeError", "DTypeError", "evaluate", "exp",
    "Graph", "GraphError", "InputError", "LaunchCheckError", "LaxError", "matmul",
    "max", "MirageError", "Node", "Op", "optimize", "optimize_many", "OptimizeResult", "relu",
    "rms_norm", "rsqrt", "RuleCheck", "RuleCheckReport", "RuleError", "ShapeError", "sigmoid",
    "silu", "softmax", "sqrt", "tanh", "erf", "cos", "sin", "gelu", "layer_norm", "Tensor",
    "TimeLimitError", "transpose", "verify", "VerifyResult", "where",
]

# The torch front end and torch.compile backend load on first use: torch stays optional.
from .ir.errors import UnsupportedOpError  # noqa: E402

max = amax  # em.max(x, axis, keepdims), NumPy's name; the builtin is untouched elsewhere

__all__ += ["backend", "from_torch", "UnsupportedOpError"]


def __getattr__(name: str):
    """``from_torch`` and ``backend``, imported (with torch) on first access."""
    if name == "from_torch":
        from .frontend.from_torch import from_torch
        return from_torch
    if name == "backend":
        from .dynamo.backend import backend
        return backend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
