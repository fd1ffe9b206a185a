"""The verdicts of ``em.check_rules``: one ``RuleCheck`` per directed rule, and the report.

A rule's ``status`` is one of ``STATUSES``; a sound rule also carries ``float_safe``
(False: "sound, float-unsafe"). ``RuleCheckReport`` collects them and prints as a
table, one row per rule, followed by the reasons for every verdict other than "sound"
and a count per status. The checking itself is ``check_rules.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..verifier.verify import Counterexample

__all__ = ["STATUSES", "RuleCheck", "RuleCheckReport", "printable"]

STATUSES = ("sound", "unsound", "not instantiated", "cannot check")


def printable(text: str) -> str:
    """``text`` as a report or a terminal shows it: every character that does not print
    (ESC, BEL, NUL, a newline, a carriage return, a bidirectional override, ...) written as
    its escape (``\\x1b``), so a rule's name (a comment in a user's file) or its file's
    name cannot move the cursor, rewrite a line or hide a verdict."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


@dataclass
class RuleCheck:
    """The verdict on one directed rule."""

    rule: str  # the rule's name (its comment)
    where: str  # "file:line"
    status: str  # one of STATUSES
    message: str = ""
    counterexample: Counterexample | None = None
    instances: int = 0  # instances verified numerically
    shape_instances: int = 0  # instances whose right side was type-checked
    path: str = ""
    line: int = 0
    float_safe: bool | None = None  # a sound rule: False when an instance is float-unsafe
    float_message: str = ""

    @property
    def verdict(self) -> str:
        """The status, with "float-unsafe" after "sound" for a rule unsafe in floating point."""
        return "sound, float-unsafe" if self.status == "sound" and self.float_safe is False \
            else self.status


@dataclass
class RuleCheckReport:
    """All verdicts of ``check_rules``; ``ok`` when every rule is sound."""

    results: list[RuleCheck] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every rule was checked and found sound."""
        return all(r.status == "sound" for r in self.results)

    @property
    def unsound(self) -> list[RuleCheck]:
        """The rules found unsound."""
        return [r for r in self.results if r.status == "unsound"]

    @property
    def float_unsafe(self) -> list[RuleCheck]:
        """The rules sound over the reals but unsafe in floating point."""
        return [r for r in self.results if r.status == "sound" and r.float_safe is False]

    def __str__(self) -> str:
        rows = [("status", "where", "inst", "rule")] + [
            (r.verdict, printable(r.where), f"{r.instances}/{r.shape_instances}",
             printable(r.rule)) for r in self.results]
        w = [max(len(row[i]) for row in rows) for i in range(3)]
        lines = ["  ".join(c.ljust(w[i]) if i < 3 else c for i, c in enumerate(row))
                 for row in rows]
        lines.insert(1, "-" * max(len(s) for s in lines))
        lines += [f"{printable(r.where)} {r.status}: {printable(r.message)}"
                  for r in self.results if r.status != "sound"]
        lines += [f"{printable(r.where)} sound, float-unsafe: {printable(r.float_message)}"
                  for r in self.float_unsafe]
        counts = {s: sum(r.status == s for r in self.results) for s in STATUSES}
        unsafe = f" ({len(self.float_unsafe)} of them float-unsafe)" if self.float_unsafe else ""
        lines.append(", ".join(f"{n} {s}" + (unsafe if s == "sound" else "")
                               for s, n in counts.items() if n)
                     + f" ({len(self.results)} rules, {self.seconds:.1f} s)")
        return "\n".join(lines)
