"""The project's error types: every user-facing failure is a ``MirageError``.

All of them subclass ``ValueError`` so callers that already catch bad-input
errors keep working; the message always names the culprit (node, operands and
their shapes, or file and line).

Strict mode (``EQSAT_MIRAGE_STRICT=1``, on in the test suite): the few places that keep
going after any failure so that one bad candidate or partition never sinks the rest
(the ``torch.compile`` backend, extraction's reading of the e-graph) re-raise every error
that is not a ``MirageError``, so that a bug is seen as a bug, not as "no speedup".
"""

from __future__ import annotations

import os

STRICT_ENV = "EQSAT_MIRAGE_STRICT"


class MirageError(ValueError):
    """Base class of every error eqsat-mirage raises on bad input."""


class ShapeError(MirageError):
    """Operands whose shapes do not fit the op (names node, operands, shapes)."""


class DTypeError(MirageError):
    """An unknown or unsupported dtype."""


class GraphError(MirageError):
    """A malformed graph: duplicate names, foreign tensors, missing outputs."""


class InputError(MirageError):
    """Inputs handed to an interpreter that do not match the program."""


class LaxError(MirageError):
    """A program outside the Lax fragment was given to the verifier."""


class RuleError(MirageError):
    """A malformed or unsound rewrite rule (names file and line)."""


class UnsupportedOpError(MirageError):
    """A torch op (or module) with no eqsat-mirage form (names the op and the source line)."""


class BudgetError(MirageError):
    """A program whose checking would exceed the memory budget (names the tensor and size)."""


class TimeLimitError(MirageError):
    """A step that could not finish within its time limit (names the step)."""


def strict() -> bool:
    """Whether strict mode is on: the environment variable ``EQSAT_MIRAGE_STRICT`` is "1"."""
    return os.environ.get(STRICT_ENV) == "1"


def unexpected(exc: BaseException) -> bool:
    """Whether a broad ``except`` must re-raise ``exc``: in strict mode, anything that is not
    one of the project's errors (``MirageError``); outside it, nothing (the failure is
    recorded with its type and message, and the search goes on)."""
    return strict() and not isinstance(exc, MirageError)
