"""eqsat-mirage: a multi-level superoptimizer for small GPU tensor programs.

The public API (README.md and docs/api.md): build a program with ``Graph`` and the
NumPy-like functions, run it with ``evaluate``, compare two programs with
``verify``, superoptimize it with ``optimize``, check rule files with
``check_rules``.

Every name is imported on first use (PEP 562): ``import eqsat_mirage`` loads none of the
stages, so ``import eqsat_mirage.runtime`` runs an optimized module without the search's
dependencies (egglog, galois, SciPy), and torch loads with ``em.from_torch`` or
``em.backend``. ``_FROM`` says where each name lives.
"""

from __future__ import annotations

import importlib

from .version import __version__  # noqa: F401 - em.__version__

# module (relative to this package) -> the public names it gives
_FROM = {
    "dynamo.backend": ("backend",),
    "dynamo.experts": ("use_experts",),
    "egraph.check_rules": ("RuleCheck", "RuleCheckReport", "assert_sound", "check_rules"),
    "frontend.from_torch": ("from_torch",),
    "frontend.functions": (
        "amax", "bitwise_and", "causal_mask", "concat", "cos", "eq", "erf", "exp", "ge",
        "gelu", "gt", "layer_norm", "le", "logical_and", "logical_not", "logical_or", "lt",
        "matmul", "ne", "relu",
        "right_shift", "rms_norm", "rsqrt", "sigmoid", "silu", "sin", "softmax", "sqrt",
        "tanh", "transpose", "where"),
    "frontend.gather": ("embedding", "index_select", "take_along_axis"),
    "frontend.graph": ("Graph", "Tensor"),
    "ir.check": ("check", "check_lax"),
    "ir.dims": ("Dim", "DynamicShapeError"),
    "ir.errors": ("BudgetError", "DTypeError", "GraphError", "InputError", "LaxError",
                  "MirageError", "RuleError", "ShapeError", "TimeLimitError",
                  "UnsupportedOpError"),
    "ir.node": ("Node", "Op"),
    "mugraph.kernels": ("BlockInput", "BlockOutput", "CustomKernel", "MuGraphError",
                        "PredefinedKernel", "TensorSpec", "TilingError", "UnknownTensorError"),
    "mugraph.program": ("MuGraph", "from_graph"),
    "pipeline.many": ("optimize_many",),
    "pipeline.optimize": ("optimize",),
    "pipeline.result": ("OptimizeResult",),
    "runtime.check": ("LaunchCheckError",),
    "semantics.floating": ("evaluate",),
    "verifier.verify": ("Counterexample", "VerifyResult", "verify"),
}
_ALIASES = {"max": "amax"}  # em.max(x, axis, keepdims), NumPy's name for frontend's amax
_WHERE = {name: module for module, names in _FROM.items() for name in names}

__all__ = [
    "amax", "assert_sound", "causal_mask", "BlockInput", "BudgetError", "BlockOutput",
    "check", "check_lax",
    "check_rules", "concat",
    "Counterexample", "CustomKernel", "from_graph", "MuGraph", "MuGraphError", "PredefinedKernel",
    "TensorSpec", "TilingError", "UnknownTensorError",
    "Dim", "DynamicShapeError", "DTypeError", "evaluate", "exp",
    "Graph", "GraphError", "InputError", "LaunchCheckError", "LaxError", "logical_not", "matmul",
    "max", "MirageError", "Node", "Op", "optimize", "optimize_many", "OptimizeResult", "relu",
    "rms_norm", "rsqrt", "RuleCheck", "RuleCheckReport", "RuleError", "ShapeError", "sigmoid",
    "silu", "softmax", "sqrt", "tanh", "erf", "cos", "sin", "gelu", "layer_norm", "Tensor",
    "TimeLimitError", "transpose", "verify", "VerifyResult", "where",
    "backend", "from_torch", "UnsupportedOpError", "use_experts",
    "embedding", "index_select", "take_along_axis", "gt", "ge", "lt", "le", "eq", "ne",
    "bitwise_and", "right_shift", "logical_and", "logical_or",
]


def __getattr__(name: str):
    """A public name, imported from its module (``_FROM``) on first access and kept; a
    subpackage (``em.semantics``) imported on first access."""
    real = _ALIASES.get(name, name)
    if real in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[real]}", __name__), real)
        globals()[name] = value
        return value
    if not name.startswith("_"):
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's attributes and every public name (imported or not)."""
    return sorted(set(globals()) | set(__all__))
