"""One launcher for a whole shape family: grids, loop counts and shapes computed from L.

A family's kernels have the same source at every padded size (L, the strides of
tensors with a dynamic axis and the loop counts are runtime arguments, see
``kernel.py``). What changes with the padded size ``lp`` is host code: the grids,
``n_iter``, the shapes the launcher allocates and the contiguous strides it passes.

``merge`` takes the family's module written at several padded sizes (the host
reads ``seq_len`` from the inputs and rounds it up to ``lp`` itself) and checks
that the texts differ only in integer literals inside the launcher's functions.
Each literal that changes becomes the polynomial in ``lp`` (degree at most 2, an
exact integer division) fitted at three sizes, checked at every other size written (up
to 64 granules) and for every residue of its divisor: exact at every multiple of the
granule for a literal that is such a polynomial. ``Scaling``'s grids, loop counts,
shapes and contiguous strides are (a size times a ratio of padded sizes, or a product of
two); one that is not shows at the sizes written. Anything else that changes (a float,
a string, a statement, a literal outside the launcher) raises ``FamilyLaunchError``:
the caller then builds one module per padded size, each refusing any other.
"""

from __future__ import annotations

import io
import math
import tokenize
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from .concat import CodegenError

# padded sizes (in granules) the launcher is written at: fitted on the first three, checked
# at the others (64: a literal that is constant near the hint and changes far above it)
POINTS = (1, 2, 3, 4, 5, 64)
MAX_DIVISOR = 1 << 16  # a fitted literal's divisor: larger is refused (checked per residue)


class FamilyLaunchError(CodegenError):
    """The launcher of a family's plan changes with the padded size in a way ``merge``
    cannot express as integer polynomials of ``lp``."""


@dataclass(frozen=True)
class FamilyLayout:
    """What a shape family's module needs besides its plan.

    ``name``: the size (e.g. ``"L"``); ``granule``: padded sizes are its multiples;
    ``low``/``high``: L's range (``high`` None: unbounded); ``hint``; ``inputs``: input ->
    its axes of size L; ``tensors``: device tensor -> its axes that grow with ``lp``;
    ``loop``: kernels whose loop count grows; ``short``: inputs the kernels read unpadded
    (loads masked at L; the others are zero-padded to ``lp`` by the launcher);
    ``launch``: kernel -> (num_warps, num_stages), the hint's, at every padded size (one
    binary per kernel); ``padded``: a module serving that one padded size only (``merge``'s
    fallback).
    """

    name: str
    granule: int
    low: int
    high: int | None
    hint: int
    inputs: Mapping[str, tuple[int, ...]]
    tensors: Mapping[str, frozenset[int]] = field(default_factory=dict)
    loop: frozenset[str] = frozenset()
    short: frozenset[str] = frozenset()
    launch: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    padded: int | None = None


def _fit(values: Mapping[int, int], granule: int) -> tuple[int, int, int, int]:
    """(A, B, C, D) with ``(A + B*lp + C*lp*lp) // D == values[lp]`` at every size written,
    exact at every multiple of ``granule``; a ``FamilyLaunchError`` otherwise."""
    pts = sorted(values)[:3]
    coef = [Fraction(0)] * 3
    for i, xi in enumerate(pts):  # Lagrange: the quadratic through the first three points
        basis, denom = [Fraction(1)], Fraction(1)
        for j, xj in enumerate(pts):
            if j != i:
                basis = [a - xj * b for a, b in zip([Fraction(0)] + basis, basis + [Fraction(0)])]
                denom *= xi - xj
        for d in range(3):
            coef[d] += Fraction(values[xi]) * basis[d] / denom
    div = math.lcm(*(c.denominator for c in coef))
    a, b, c = (int(x * div) for x in coef)
    if div > MAX_DIVISOR:
        raise FamilyLaunchError(f"a launch literal {dict(values)} needs the divisor {div}")
    for lp, want in values.items():
        if (a + b * lp + c * lp * lp) != want * div:
            raise FamilyLaunchError(f"a launch literal is not a polynomial of degree <= 2 in "
                                    f"the padded size: {dict(values)}")
    for u in range(1, div + 1):  # the numerator modulo div is periodic in u with period div
        lp = u * granule
        if (a + b * lp + c * lp * lp) % div:
            raise FamilyLaunchError(f"a launch literal {dict(values)} is not an integer at "
                                    f"padded size {lp}")
    return a, b, c, div


def render(a: int, b: int, c: int, div: int, bare: bool) -> str:
    """``(a + b*lp + c*lp*lp) // div`` as Python; ``bare``: no parentheses needed around it
    (a tuple item or call argument)."""
    terms = [(c, "lp * lp"), (b, "lp"), (a, "")]
    text = ""
    for coef, var in terms:
        if coef == 0:
            continue
        mag = abs(coef)
        piece = var if mag == 1 and var else (f"{mag} * {var}" if var else str(mag))
        if not text:
            text = ("-" if coef < 0 else "") + piece
        else:
            text += (" - " if coef < 0 else " + ") + piece
    text = text or "0"
    if div != 1:
        text = f"({text}) // {div}" if (b and a) or c else f"{text} // {div}"
    simple = text.isidentifier() or text.lstrip("-").isdigit()
    return text if bare or simple else f"({text})"


def merge(texts: Mapping[int, str], granule: int, base: int) -> str:
    """One module from the module ``texts`` written at each padded size (a key): every
    integer literal inside the launcher's functions that changes with the size becomes its
    polynomial in ``lp``; comments and line breaks are ``base``'s. ``FamilyLaunchError`` when
    anything else changes."""
    streams = {}  # line breaks inside brackets and comments move with literals' widths
    for lp, text in texts.items():
        try:
            compile(text, f"<launcher at padded size {lp}>", "exec")  # parsed, not run
            tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
        except (SyntaxError, tokenize.TokenError) as exc:
            raise FamilyLaunchError(f"the module written at padded size {lp} is not valid "
                                    f"Python: {exc}") from None
        streams[lp] = [t for t in tokens if t.type not in (tokenize.NL, tokenize.COMMENT)]
    lps = sorted(texts)
    ref = streams[base]
    if len({len(s) for s in streams.values()}) != 1:
        raise FamilyLaunchError("the launcher's statements change with the padded size")
    lines = texts[base].splitlines(keepends=True)
    starts = [i + 1 for i, line in enumerate(lines)
              if line.startswith(("def _buffers(", "def run("))]
    if not starts:
        raise FamilyLaunchError("the module has no launcher")
    first = min(starts)
    edits = []
    for i, tok in enumerate(ref):
        toks = [streams[lp][i] for lp in lps]
        if all((t.type, t.string) == (tok.type, tok.string) for t in toks):
            continue
        if not all(t.type == tokenize.NUMBER and t.string.isdigit() for t in toks) \
                or tok.start[0] < first:
            raise FamilyLaunchError(
                f"line {tok.start[0]} of the launcher changes with the padded size other than "
                f"by an integer literal: {[t.string for t in toks]}")
        a, b, c, div = _fit({lp: int(t.string) for lp, t in zip(lps, toks)}, granule)
        bare = ref[i - 1].string in ("(", ",", "[", "=") and ref[i + 1].string in (")", ",", "]")
        edits.append((tok.start, tok.end, render(a, b, c, div, bare)))
    for (row, col), (_, end), text in reversed(edits):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + text + line[end:]
    return "".join(lines)
