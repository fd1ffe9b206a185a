"""``em.backend``'s options, checked when the backend is built, not inside ``torch.compile``.

A backend takes its own options (``BACKEND_OPTIONS``: ``target``, ``time_limit_s``,
``min_ops``, ``warn``, ``warmup``, ``size_hint``, ``size_max``, ``cuda_graph``) and every
keyword of
``em.optimize`` (``level``, ``node_limit``, ``rules``, ...). ``check_options`` raises a
``MirageError`` for an unknown keyword (naming it and listing the valid ones) and for a
bad value (naming the option): a misspelt option is found when ``em.backend(...)`` is
called, not inside the first compiled graph.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..ir.errors import MirageError
from ..ir.limits import check_time_limit
from ..pipeline.optimize import optimize
from ..pipeline.options import split_options

BACKEND_OPTIONS = ("target", "time_limit_s", "min_ops", "warn", "warmup", "size_hint",
                   "size_max", "cuda_graph")
GRAPHS_METHODS = ("available", "capture", "replay")  # a graphs backend object's (cuda_graph=)


def optimize_keywords() -> tuple[str, ...]:
    """The keywords of ``em.optimize`` (every one a backend passes on)."""
    params = inspect.signature(optimize).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


def _count(name: str, value: Any, least: int, what: str, none_ok: bool = True) -> None:
    if value is None and none_ok:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise MirageError(f"em.backend({name}=...) takes {what}"
                          f"{' or None' if none_ok else ''}, got {value!r}")


def check_options(options: dict[str, Any]) -> None:
    """Raise a ``MirageError`` unless every keyword in ``options`` is a backend option or an
    ``em.optimize`` keyword with a valid value (module docstring)."""
    search = optimize_keywords()
    valid = BACKEND_OPTIONS + tuple(n for n in search if n not in BACKEND_OPTIONS)
    unknown = [name for name in options if name not in valid]
    if unknown:
        raise MirageError(f"em.backend: unknown option(s) {', '.join(map(repr, unknown))}; "
                          f"valid options: {', '.join(valid)}")
    _count("warmup", options.get("warmup"), 0, "a count of calls >= 0")
    if "time_limit_s" in options:
        check_time_limit(options["time_limit_s"])
    for name in ("size_hint", "size_max"):
        _count(name, options.get(name), 1, "a size >= 1")
    _count("min_ops", options.get("min_ops", 1), 1, "a count of ops >= 1", none_ok=False)
    if not isinstance(options.get("warn", True), bool):
        raise MirageError(f"em.backend(warn=...) takes True or False, got {options['warn']!r}")
    graphs = options.get("cuda_graph", True)
    if not isinstance(graphs, bool) and not all(callable(getattr(graphs, m, None))
                                                for m in GRAPHS_METHODS):
        raise MirageError("em.backend(cuda_graph=...) takes True (replay static partitions as "
                          "CUDA graphs on CUDA inputs), False (plain launches) or a graphs "
                          f"backend object with {', '.join(GRAPHS_METHODS)} methods, got "
                          f"{graphs!r}")
    split_options({n: v for n, v in options.items() if n in search})  # checked as optimize does
