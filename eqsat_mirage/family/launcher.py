"""One launcher for a whole shape family: grids, loop counts and shapes computed from L.

A family's kernels have the same source at every padded size (L, the strides of
tensors with a dynamic axis and the loop counts are runtime arguments, see
``codegen/kernel.py``). What changes with the padded size ``lp`` is host code: the grids,
``n_iter``, the shapes the launcher allocates and the contiguous strides it passes.

``family_source`` writes the family's module at several padded sizes
(``codegen.source.triton_source`` with the family's ``FamilyLayout``: the host reads
``seq_len`` from the inputs and rounds it up to ``lp`` itself) and ``merge`` checks
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
from collections.abc import Callable, Mapping
from fractions import Fraction

from ..codegen.concat import CodegenError
from ..codegen.family_layout import FamilyLayout
from ..codegen.source import triton_source
from ..mugraph.program import MuGraph

# padded sizes (in granules) the launcher is written at: fitted on the first three, checked
# at the others (64: a literal that is constant near the hint and changes far above it)
POINTS = (1, 2, 3, 4, 5, 64)
MAX_DIVISOR = 1 << 16  # a fitted literal's divisor: larger is refused (checked per residue)


class FamilyLaunchError(CodegenError):
    """The launcher of a family's plan changes with the padded size in a way ``merge``
    cannot express as integer polynomials of ``lp``."""


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


def family_source(at: Callable[[int], MuGraph], family: FamilyLayout, header: str = "",
                  reuse_outputs: bool = False, length_masks: frozenset[str] = frozenset()
                  ) -> str:
    """One module serving every size of a shape family: ``triton_source`` of the plan at
    several padded sizes (``at(lp)`` gives the MuGraph at padded size ``lp``), merged by
    ``merge`` so the launcher computes grids, loop counts and shapes from ``lp``.
    Raises ``FamilyLaunchError`` when the launcher cannot be written that way (build one
    module per padded size instead: ``family`` with ``padded`` set)."""
    base = -(-family.hint // family.granule) * family.granule
    note = (f"One module serves every {family.name}: the launcher computes grids, loop counts "
            f"and shapes from the padded size lp; the listing and comments show lp = {base}.")
    header = f"{header.rstrip()}\n{note}" if header.strip() else note
    texts = {}
    for lp in sorted({u * family.granule for u in POINTS} | {base}):
        try:  # sizes the family may never run at: a failure there is the merge's
            texts[lp] = triton_source(at(lp), header, reuse_outputs, length_masks, family)
        except CodegenError as exc:
            raise FamilyLaunchError(f"writing the launcher at padded size {lp}: {exc}") from None
    return merge(texts, family.granule, base)
