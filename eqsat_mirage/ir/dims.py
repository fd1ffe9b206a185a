"""Symbolic sizes: ``Dim`` (a named size with a hint) and the errors of dynamic shapes.

A program whose inputs carry a ``Dim`` is a *shape family*: one program for every
value of the size. Its nodes are built at the hint (every shape rule runs on ints);
``frontend/family.py`` rebuilds the program at any other value (``Graph.at``); the
``family`` stage finds which axes follow the size, pads, scales, verifies and runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

from .errors import ShapeError

DEFAULT_HINT = 1024  # the hint of a size named by a bare string, g.input("K", (2, 64, "L"))


class DynamicShapeError(ShapeError):
    """A dynamic (symbolic) size used where one search cannot serve every value of it."""


@dataclass(frozen=True)
class Dim:
    """A symbolic size: ``em.Dim("L", hint=4096, max=8192)``.

    ``hint`` is the size the search prices and plans at (the common case); ``min`` and
    ``max`` bound the sizes the result serves (``max`` None: unbounded). One search
    serves every size in [min, max].
    """

    name: str
    hint: int = DEFAULT_HINT
    min: int = 1
    max: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ShapeError(f"Dim name {self.name!r} must be a Python identifier")
        for what in ("hint", "min") + (("max",) if self.max is not None else ()):
            v = getattr(self, what)
            if not isinstance(v, Integral) or isinstance(v, bool) or v < 1:
                raise ShapeError(f"Dim {self.name!r}: {what} must be a positive int, got {v!r}")
        if self.hint < self.min or (self.max is not None and not self.min <= self.hint
                                    <= self.max):
            raise ShapeError(f"Dim {self.name!r}: need min <= hint <= max, got min={self.min}, "
                             f"hint={self.hint}, max={self.max}")

    def check(self, value: int, where: str = "") -> int:
        """``value`` if this size may take it, else a ``DynamicShapeError`` naming the range."""
        ok = isinstance(value, Integral) and not isinstance(value, bool) and (
            self.min <= value and (self.max is None or value <= self.max))
        if not ok:
            top = "" if self.max is None else f"..{self.max}"
            raise DynamicShapeError(f"{where}size {self.name} = {value!r} is outside the range "
                                    f"this program family serves ({self.min}{top or '..'})")
        return int(value)

    def __str__(self) -> str:
        top = f", max={self.max}" if self.max is not None else ""
        low = f", min={self.min}" if self.min != 1 else ""
        return f"{self.name}(hint={self.hint}{low}{top})"
