"""The float checks' deterministic corners (docs/verifier.md, section 5): which inputs go
large together, and the common offsets that make inputs nearly equal.

Whether a random draw makes ``A`` large while ``A - B`` stays small is luck; these points
are chosen from the program's inputs alone, the same for every seed:

- **pairs at their peak** (``peakset`` draws, one value per input, cheap): each pair of
  float inputs at the largest value for which the first program stays finite, the others
  1 (``exp(A - B)`` against ``exp(A) / exp(B)``: A = B there, the candidate inf); with
  the per-input peaks and every input at once, every input and pair at its largest
  finite scale;
- **a tie at the peak** (``peaktie`` draws, one value per input, programs with an exp):
  each ordered pair of float inputs, the first at its largest value keeping the first
  program finite and the second at half the first's last place, the others 1; their sum
  is a tie wherever it is formed in their dtype, half a unit off, and an exp of it is
  off by that much relatively (``exp(a) * exp(b)`` against ``exp(a + b)`` in bfloat16:
  28% at ``a`` = 76); judged for accuracy where both programs are finite;
- **a common offset** (``offset`` draws, N(0, 1) plus ``offset``): each float input that
  an addition or subtraction of either program sets against itself (activations with a
  large mean, as LayerNorm inputs have: ``(x - mean) @ W``), and each pair of inputs that
  one sets against each other (``opposed``: x and y nearly equal, ``(x - y) @ W``), the offset
  ``2^OFFSET_EXP`` of the narrowest dtype among them: large against the noise (the
  draws keep ``p - OFFSET_EXP`` of the dtype's ``p`` significand bits of it, at least
  2), small enough that a sum of a few thousand such values stays finite in float16.
  There the accuracy test is relative (``accuracy.bits_lost``).
"""

from __future__ import annotations

import itertools
import math

from ..ir.node import Op
from .floatsafe import input_deps, is_graph

OFFSET_EXP = {"float16": 8, "bfloat16": 8, "float32": 16}  # log2 of the common offset
# the ``peaktie`` draws (``tie_draws``): significand bits of the dtypes whose last place
# they halve
SIGNIFICAND = {"float16": 11, "bfloat16": 8, "float32": 24}
TIE = "peaktie"
# the pairs' other forms (``pair_draws``): the second input's factor against the first, and
# whether the other float inputs sit large (``REST_BELOW`` under their own largest) or at 1
PAIR_FORMS = {"peakneg": (-1.0, "one"), "peakrest": (0.5, "large"), "peakinv": (None, "small")}
REST_BELOW = 4.0
MAX_OPPOSED = 8  # pairs of opposed inputs given an offset draw (the first found)


def float_inputs(program) -> list[int]:
    """The positions (in ``program.inputs``) of its float inputs (a bool mask is none)."""
    return [i for i, n in enumerate(program.inputs.values()) if n.dtype != "bool"]


def pairs(program) -> list[tuple[int, ...]]:
    """The input sets of the ``peakset`` draws, by position: every pair of float inputs
    (one input alone is the ``peak`` draws'). Not three or more at once: equal inputs make
    their differences exactly 0, and with three at their peak a lerp's ``H + a (N - H)``
    is finite only through that exact 0, a cancellation no real input has, where
    ``(1 - a) H + a N`` overflows."""
    return [tuple(p) for p in itertools.combinations(float_inputs(program), 2)]


def pair_draws(program, peaked) -> list[tuple[str, int]]:
    """The draws of the pairs' other forms, ``(kind, j)`` with ``j`` an index into
    ``pairs(program)`` (those whose inputs are all in ``peaked``; None: every pair):

    - ``peakneg``: the pair at opposite values, ``(P, -P)``, the others 1: a sum of the
      two is exactly 0, where ``exp(a + b)`` is 1 and ``exp(a) * exp(b)`` is inf * 0;
    - ``peakrest`` (with a third float input): the pair at ``(P, P / 2)`` and the other
      float inputs at ``REST_BELOW`` under the largest value they keep the first program
      finite at together, so that a product with them that the candidate forms and the
      first program does not is found where it overflows (``(x / s) @ w`` against
      ``(x @ w) / s``: with ``w`` at 1 and ``x``, ``s`` large, ``x @ w`` overflows only
      past the headroom). Not equal: equal inputs make their difference exactly 0, and a
      lerp's ``H + a (N - H)`` is then finite through that 0 however large ``a`` is.

    ``P``, as for ``peakset``, is the largest value keeping the first program finite,
    every value then over the headroom (``draws.Draws.pair_values``).

    Not in the end-to-end check of a whole program (``floatcheck.float_checks``'
    ``pair_forms``): its pieces were each checked with these forms, and over a whole
    layer's inputs the pairs times three forms made that check 11x dearer (1.1 to 12.8
    CPU s on the tiny LLaMA layer)."""
    js = chosen(pairs(program), peaked)
    rest = len(float_inputs(program)) > 2
    return [(kind, j) for kind, (_, others) in PAIR_FORMS.items() if rest or others == "one"
            for j in js]


def offset_sets(program) -> list[tuple[int, ...]]:
    """The input sets an ``offset`` draw may have, by position: each float input alone,
    then each pair of them (the draw's ``s`` is an index into this list, a function of
    the first program alone, so that a search's memo means the same draw by it)."""
    ins = float_inputs(program)
    return [(i,) for i in ins] + [tuple(p) for p in itertools.combinations(ins, 2)]


def opposed(a, b) -> list[tuple[int, ...]]:
    """The float inputs (positions, in ``a.inputs``' order) that an addition or subtraction
    of ``a`` (and of ``b``, where it is a Graph) sets against each other: each input that
    both operands depend on (``x - mean(x)``: one alone), and each pair where one operand
    depends on the first and not the second, the other on the second and not the first
    (``x - y``; ``x @ W - y @ W``); the pairs at most ``MAX_OPPOSED``, in the order found."""
    ins = float_inputs(a)
    pos = {name: i for i, name in enumerate(a.inputs) if i in ins}
    alone: set[tuple[int, ...]] = set()
    found: list[tuple[int, ...]] = []
    for prog in (a, b) if is_graph(b) else (a,):
        if not is_graph(prog):
            continue
        deps = input_deps(prog)
        for n in prog.nodes():
            if n.op not in (Op.ADD, Op.SUB) or len(n.srcs) != 2:
                continue
            left, right = (deps[id(x)] for x in n.srcs)
            alone |= {(pos[x],) for x in left & right if x in pos}
            for x, y in itertools.product(sorted(left - right), sorted(right - left)):
                if x in pos and y in pos:
                    pair = tuple(sorted((pos[x], pos[y])))
                    if pair not in found:
                        found.append(pair)
    return sorted(alone) + found[:MAX_OPPOSED]


def offset_draws(a, b, peaked, pairs: bool = True) -> list[int]:
    """The ``offset`` draws ``b`` is checked on against ``a``, as indices into
    ``offset_sets(a)``: the ``opposed`` inputs alone and in pairs (those whose inputs are
    all in ``peaked``, positions; None: every input); alone only with ``pairs=False``."""
    sets, want = offset_sets(a), opposed(a, b)
    return [j for j in chosen(sets, peaked) if sets[j] in want and (pairs or len(sets[j]) == 1)]


def chosen(sets: list[tuple[int, ...]], peaked) -> list[int]:
    """The indices of ``sets`` whose inputs are all in ``peaked`` (positions; None: all)."""
    if peaked is None:
        return list(range(len(sets)))
    keep = set(peaked)
    return [j for j, s in enumerate(sets) if set(s) <= keep]


def offset(dtypes) -> float:
    """The common offset of inputs of ``dtypes``: ``2^OFFSET_EXP`` of the narrowest."""
    return 2.0 ** min(OFFSET_EXP.get(d, OFFSET_EXP["float32"]) for d in dtypes)


def tie_pairs(program) -> list[tuple[int, int]]:
    """The inputs of the ``peaktie`` draws, by position: every ordered pair of the float
    inputs of ``SIGNIFICAND``'s dtypes (the first is set large, the second small)."""
    ins = [i for i, n in enumerate(program.inputs.values()) if n.dtype in SIGNIFICAND]
    return list(itertools.permutations(ins, 2))


def tie_draws(a, b, peaked) -> list[int]:
    """The ``peaktie`` draws ``b`` is checked on against ``a``, as indices into
    ``tie_pairs(a)`` (those whose inputs are all in ``peaked``; None: every pair): none
    unless either program (a Graph) takes an exp, the op whose relative error is its
    argument's absolute error, so that a sum rounded before it (``exp(a + b)`` for
    ``exp(a) * exp(b)``) loses ``|a + b|`` times the dtype's precision."""
    progs = [p for p in (a, b) if is_graph(p)]
    if not any(n.op is Op.EXP for p in progs for n in p.nodes()):
        return []
    return chosen(tie_pairs(a), peaked)


def half_ulp(x: float, dtype: str) -> float:
    """Half the unit in the last place of ``x`` (nonzero, finite) in ``dtype``: added to
    ``x`` it makes a tie, rounded half a unit away whatever the rounding."""
    bits = SIGNIFICAND.get(dtype, SIGNIFICAND["float32"])
    return 2.0 ** (math.floor(math.log2(abs(x))) - bits)
