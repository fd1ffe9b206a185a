"""What verification holds in memory at its peak: the estimate the memory budget checks.

The interpreters drop every value once its last reader has run (``interp.run``, the tiled
interpreter's device tensors), so the estimate walks each program in the order they run,
holding what they hold and adding each op's transient scratch, and takes the peak:

- a field value holds 8 bytes per element for each part (Z_p, Z_q) the program uses
  (``field.q_needed``/``p_needed``; the tiled interpreter's ``needs_q``/``needs_p``);
- an exact field matmul adds, for the part it computes, the float64 digits of its smaller
  operand, a float64 copy of the other and one more result (``modular.matmul_mod``);
  conversions of the trial's inputs are cached for the whole trial;
- a custom kernel holds the tiles cut from its inputs (one copy of each), its accumulators,
  the per-iteration operands of a matmul summed over the loop (and their joined copy), the
  live values of one iteration and of its epilogue, and what it writes;
- one trial holds its inputs, the first program's outputs while the second runs, and the
  larger of the two programs' peaks; ``threads`` trials run at once;
- a search's ``memo`` keeps each trial's first-program outputs, its inputs up to
  ``MEMO_INPUTS`` (larger ones are drawn again), and the float checks' rounded draws
  (``DRAW_SETS`` copies of the inputs in their 2-byte formats, while they fit in
  ``MEMO_INPUTS``: ``keeps_draws``) and outputs.

``verify_parts`` gives (description, bytes) of each of these, which
``limits.check_bytes`` compares with the budget; ``threads_that_fit`` lowers the number of
trials run at once until they fit. Inside ``limits.programs_fixed`` (a verification, whose
programs do not change while it runs) each program's peaks are walked once, not for every
thread count and phase asked.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..ir.limits import fixed_fact
from ..ir.node import CODED_DTYPES, VIEWS, Op, fmt_shape
from ..semantics.field import p_needed, q_needed
from ..semantics.interp import last_reads
from ..semantics.modular import DRAW_CHUNK

# A search's memo keeps a trial's inputs up to this size; larger ones (a 7B layer's weights:
# 1.1 GB a trial) are drawn again from the trial's generator for each candidate
MEMO_INPUTS = 256 * 2**20
# rounded float draws of every input a search's memo keeps: signed, two folded, two
# exponent-range draws, the trough's, the logits draw, and one input at a time for the
# peakfold draws (the corners' offset draws are made again for each
# check, their first-program outputs held only while it runs: ``draws.UNKEPT``; the pairs'
# peaks are one value per input; the trough's bisection drops each draw once evaluated)
DRAW_SETS = 8
# first-program output sets a search's memo keeps: those of the draws above (natively,
# at the headroom, in float64, the truth), the trough's three (each op rounded once, in
# float64, the truth) among them, and the two ``apart`` draws' and the ``zeros`` draw's
# (natively; their draws are made input by input, kept by no memo)
OUTPUT_SETS = 18
BASE = 128 * 2**20  # what a process verifying anything holds besides (measured: 70-130 MB)
_BASE_PART = ("the interpreter itself (Python, NumPy, both programs)", BASE)
WORD = 8  # bytes of one part of a field value (int64) or of a float64 value

# transient arrays of an op's result size, per part, beside the result itself
_SCRATCH = {Op.EXP: 1}


class Peak:
    """Bytes held now, the most held at once, and what was being computed then (``spike``:
    a transient on top of what is held; ``hold``: held from now on)."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self.at = "nothing"

    def spike(self, extra: int, what: str) -> None:
        if self.live + extra > self.peak:
            self.peak, self.at = self.live + extra, what

    def hold(self, n: int, what: str = "") -> None:
        self.live += n
        self.spike(0, what)


def size(node) -> int:
    """Elements of ``node``'s value."""
    return math.prod(node.shape)


def _digits(k: int) -> int:
    """Float64 digits ``matmul_mod`` cuts a residue below 2**31 into for contraction ``k``."""
    w = 23 - (max(1, min(k, 1 << 15)) - 1).bit_length()
    return math.ceil(31 / w)


def matmul_scratch(node, parts: int = 1) -> int:
    """Bytes an exact field matmul needs beside its result (one part at a time)."""
    if not parts:
        return 0
    a, b = (math.prod(s.shape) for s in node.srcs)
    small, big = min(a, b), max(a, b)
    k = node.srcs[0].shape[-1] if node.srcs[0].shape else 1
    return WORD * (_digits(k) * small + small + big + size(node))


def _opaque(op) -> bool:
    from ..ir.ops import SPECS

    spec = SPECS.get(op)
    return bool(spec is not None and spec.opaque)


def _scratch(node, parts: int, field: bool) -> int:
    if node.op is Op.MATMUL:
        return matmul_scratch(node, 1) if field and parts else 0
    n = size(node)
    if not field:
        return 0
    if _opaque(node.op) or node.op is Op.MAX:
        return 3 * WORD * n
    if node.op is Op.DIV:  # the denominator's inverse by square-and-multiply, then a product
        return WORD * (3 * size(node.srcs[1]) + n)
    return WORD * n * _SCRATCH.get(node.op, 0)


def walk(peak: Peak, nodes: list, outputs, nbytes: Callable, field: bool,
         where: str, lazy: bool = False) -> int:
    """Hold ``nodes``' values in ``peak`` as an interpreter does (dropped after their last
    reader, INPUT leaves held by the caller; ``lazy``: made where they stand in ``nodes``, as
    ``floating.LazyInputs`` are read, and dropped as the others); returns the bytes of
    ``outputs`` still held."""
    done, root = _aliased(nodes, outputs)
    outs = {id(n) for n in outputs}
    held: dict[int, int] = {}
    for i, node in enumerate(nodes):
        if node.op is not Op.INPUT or lazy:
            # a view holds no bytes of its own; an output that views an input its caller
            # holds counts its own bytes, as every output does (the input is held anyway)
            view = id(node) in root and (id(node) not in outs or root[id(node)] in held)
            n = 0 if view else nbytes(node)
            what = f"{where}{node.op.name.lower()} {fmt_shape(node.shape)}"
            peak.spike(n + _scratch(node, n // max(1, WORD * size(node)), field), what)
            peak.hold(n, what)
            held[id(node)] = n
        for key in done.get(i, ()):
            peak.live -= held.pop(key, 0)
    # an output that is a view holds its whole operand (kept to the end, ``_aliased``)
    keys = {root[k] if k in root and root[k] in held else k for k in outs}
    out = sum(held.get(k, 0) for k in keys)
    peak.live -= sum(held.values()) - out
    return out


# ops whose value is a view of their operand in every table (NumPy's transpose and basic
# slicing never copy; a reshape may)
_ALIASING = frozenset({Op.TRANSPOSE, Op.SLICE})


def _aliased(nodes, outputs) -> tuple[dict[int, list[int]], dict[int, int]]:
    """``last_reads``, with a view's operand held (with its bytes) to the view's own last
    reader (the view keeps it alive: a transposed weight read by a later matmul), and to
    the end where an output is a view of it; and each view's root (the value it views)."""
    done = last_reads(nodes, outputs)
    drop = {key: i for i, keys in done.items() for key in keys}
    outs = {id(n) for n in outputs}
    root: dict[int, int] = {}
    for node in nodes:
        if node.op in _ALIASING:
            r = root.get(id(node.srcs[0]), id(node.srcs[0]))
            root[id(node)] = r
            if id(node) in outs:
                drop.pop(r, None)
            elif r in drop and id(node) in drop:
                drop[r] = max(drop[r], drop[id(node)])
    out: dict[int, list[int]] = {}
    for key, i in drop.items():
        out.setdefault(i, []).append(key)
    return out, root


def pinned(nodes, parts: Callable) -> int:
    """Bytes of the conversions of the trial's inputs that matmuls cache for a trial: the
    digits of an input a matmul reads directly, the float64 copy of one it reads whole,
    directly or through a view (``modular._input_float64``: a transposed weight)."""
    seen: dict[tuple, int] = {}
    for n in nodes:
        if n.op is not Op.MATMUL:
            continue
        k = n.srcs[0].shape[-1] if n.srcs[0].shape else 1
        sizes = [math.prod(s.shape) for s in n.srcs]
        for j, s in enumerate(n.srcs):
            split = sizes[j] <= sizes[1 - j]
            root = s
            while root.op in VIEWS:  # an input read through a view of it
                root = root.srcs[0]
            if s.op is Op.INPUT or (root.op is Op.INPUT and not split):
                seen[(root.arg, split)] = WORD * (size(root) if not split else sizes[j]) * (
                    _digits(k) if split else 1) * parts(n)
    return sum(seen.values())


def cached_conversions(program) -> int:
    """``pinned`` of a Graph (0 for a MuGraph, whose tiles read the same conversions):
    held from the first program's run to the end of the trial, through the second's."""
    program = getattr(program, "program", program)
    if hasattr(program, "memory_peak"):
        return 0
    nq = q_needed(program)
    npp = p_needed(program, nq)
    return pinned(program.nodes(), lambda n: (id(n) in npp) + (id(n) in nq))


# -- one evaluation of one program ----------------------------------------------------------


def graph_peak(g, field: bool, lazy: bool = False) -> tuple[int, int, int, str]:
    """(inputs, outputs, peak above the inputs, what was computed at the peak) of one
    evaluation of the Graph ``g`` over the field (``field``) or float64, in bytes
    (``lazy``: inputs made as they are read, ``floating.LazyInputs``; the peak then
    includes them)."""
    nodes = g.nodes()
    if field:
        nq = q_needed(g)
        npp = p_needed(g, nq)

        def parts(n):
            return (id(n) in npp) + (id(n) in nq)
    else:
        def parts(n):
            return 1
    peak = Peak()
    inputs = sum(WORD * size(n) * max(1, parts(n)) for n in g.inputs.values())
    if field:
        peak.hold(pinned(nodes, parts), "cached conversions of the inputs")
    out = walk(peak, nodes, list(g.outputs.values()),
               lambda n: WORD * size(n) * parts(n), field, f"{g.name!r}: ", lazy)
    return inputs, out, peak.peak, peak.at


def program_peak(program, field: bool, lazy: bool = False) -> tuple[int, int, int, str]:
    """``graph_peak``, or the program's own ``memory_peak`` (a MuGraph run by the tiled
    interpreter: ``mugraph/memory.py``; a family's program: its padded program); within
    ``limits.programs_fixed``, worked out once per program, ``field`` and ``lazy``."""
    def make():
        inner = getattr(program, "program", program)
        if hasattr(inner, "memory_peak"):
            return inner.memory_peak(field, lazy)
        return graph_peak(inner, field, lazy)
    return fixed_fact(program, ("memory peak", bool(field), bool(lazy)), make)


def float_check_peak(a, b) -> tuple[int, str]:
    """(bytes, what is computed then) of one float check of ``b`` against ``a`` at its
    peak: a native-dtype draw holds every input rounded, in float32 (``Draws.rounded``),
    while both programs run (the first program's outputs held through the second's run)
    and while the first runs in float64 on it for the ground truth (``Draws.truth``,
    ``conditioning``: each rounded input converted to float64 where it is first read,
    held to its last reader, as a lazy walk counts it); a float64 draw holds each input
    from its first reader to its last (``LazyInputs``). With int8 or fp8 inputs, one
    weight more in float64 (the weight a thread's ``semantics.coded.Coded.look_up`` holds
    for the second program while another evaluation runs)."""
    _, fa_out, fpa, at_a = program_peak(a, False)
    _, _, fpb, at_b = program_peak(b, False)
    _, _, lpa, lat_a = program_peak(a, False, lazy=True)
    _, _, lpb, lat_b = program_peak(b, False, lazy=True)
    native_a = max(fpa, lpa)  # natively, and in float64 on the rounded draw
    looked = max((size(n) * WORD for n in getattr(a, "program", a).inputs.values()
                  if n.dtype in CODED_DTYPES), default=0)
    native = rounded_inputs(a) + max(native_a, fpb + fa_out) + looked
    float64 = max(lpa, lpb + fa_out) + looked
    if native >= float64:
        if native_a < fpb + fa_out:
            return native, at_b
        return native, at_a if fpa >= lpa else f"{lat_a} (float64, on the rounded draw)"
    return float64, f"{lat_a if lpa >= lpb + fa_out else lat_b} (float64, inputs as read)"


def rounded_inputs(program) -> int:
    """Bytes of one draw of ``program``'s inputs rounded to their dtypes, as float32 arrays
    (a bool mask as float64)."""
    program = getattr(program, "program", program)
    return sum(size(n) * (WORD if n.dtype == "bool" else 4) for n in program.inputs.values())


# -- one verification -----------------------------------------------------------------------


def verify_parts(a, b, threads: int, trials: int, memo: bool = True,
                 phase: str | None = None) -> list[tuple[str, int]]:
    """(description, bytes) of what verifying ``b`` against ``a`` holds at its peak with
    ``threads`` trials (or float checks) at once and ``trials`` trials kept in a memo.
    ``phase``: "trials" or "floats", the peak of that phase alone (they run one after the
    other, each with the threads that fit it); None, of either."""
    ia, oa, pa, at_a = program_peak(a, True)
    ib, ob, pb, at_b = program_peak(b, True)
    _, fa_out, _, _ = program_peak(a, False)
    inputs = max(ia, ib)
    held = cached_conversions(a)  # the first program's input conversions, through the second
    trial = inputs + max(pa, held + oa + pb)
    at = at_a if pa >= held + oa + pb else at_b
    floats, at_f = float_check_peak(a, b)
    job = {"trials": trial, "floats": floats}.get(phase, max(trial, floats))
    if phase == "floats":
        at = f"{at_f} (float checks)"
    parts = [(f"{threads} {'float check' if phase == 'floats' else 'trial'}(s) at once, each "
              f"peaking at {at}", threads * job), _BASE_PART]
    if memo:
        kept = "inputs and first-program outputs" if keeps_inputs(ia) else \
            "first-program outputs (inputs drawn again)"
        parts.append((f"{trials} trials' {kept} kept for the next candidate",
                      trials * (ia * keeps_inputs(ia) + oa)))
        kept = DRAW_SETS if keeps_draws(a) else 2
        which = "the rounded draws kept" if kept > 2 else "two rounded draws others are made from"
        parts.append((f"the float checks' draws (a standard-normal draw per call, "
                      f"{which}, {_folded_what(a)}) and first-program outputs",
                      draw_bytes(a) + kept * packed_inputs(a) + OUTPUT_SETS * fa_out))
    return parts


def keeps_draws(program) -> bool:
    """Whether a search's memo keeps the float checks' rounded draws of ``program`` for the
    next candidate: all ``DRAW_SETS`` of them within ``MEMO_INPUTS``. Larger ones (a 7B
    MLP piece's: 1.9 GB) are made again for each candidate, and only the two that others
    are made from are held: what a worker verifying it then leaves of a shared budget is
    what another piece's verification needs beside it."""
    return keeps_inputs(DRAW_SETS * packed_inputs(program))


def draw_bytes(program) -> int:
    """Bytes of the standard-normal draw the float checks hold (``sampling.standard_normal``:
    float32, float16 for a float16 input above ``DRAW_CHUNK`` elements, a bool mask's bits
    in float64) and of the folded draw at the headroom (float32), where it is kept
    (``keeps_folded``)."""
    program = getattr(program, "program", program)
    folded = 4 if keeps_folded(program) else 0
    total = 0
    for n in program.inputs.values():
        k = size(n)
        total += WORD * k if n.dtype == "bool" else (
            (2 if _half_drawn(n) else 4) + folded) * k
    return total


def _half_drawn(n) -> bool:
    """Whether input ``n``'s standard-normal draw is held in float16 (a float16 input above
    ``DRAW_CHUNK`` elements: ``sampling.standard_normal``)."""
    return n.dtype == "float16" and size(n) > DRAW_CHUNK


def keeps_folded(program) -> bool:
    """Whether the float checks keep the folded draw at the headroom (float32, made once per
    ``Draws`` for all the per-input draws there): while it is within ``MEMO_INPUTS``. A
    larger one (a 7B layer's: 0.71 GB) is made input by input again where each per-input
    draw reads it (``from_half`` of the packed folded draw: one table look-up)."""
    program = getattr(program, "program", program)
    return keeps_inputs(4 * sum(size(n) for n in program.inputs.values()
                                if n.dtype != "bool"))


def packed_inputs(program) -> int:
    """Bytes of one rounded float draw of ``program``'s inputs as the memo keeps it
    (``packing.pack``: 2 bytes an element in float16 and bfloat16, else 4)."""
    program = getattr(program, "program", program)
    return sum(_packed_bytes(n) for n in program.inputs.values())


def _packed_bytes(n) -> int:
    """Bytes of input ``n`` in a packed draw: 2 an element in float16 and bfloat16, else 4."""
    return size(n) * (2 if n.dtype in ("float16", "bfloat16") else 4)


def packed_signed(program) -> int:
    """``packed_inputs`` of the signed draw (N(0, 1) itself): a float16 input drawn in float16
    (``_half_drawn``) packs as a view of its normal draw, no bytes of its own. Not so in a
    search's memo (``verify_parts``): the memo keeps the first call's packed draw, a view
    of that call's normal draw, beside each later call's own normal draw."""
    program = getattr(program, "program", program)
    return sum(_packed_bytes(n) for n in program.inputs.values() if not _half_drawn(n))


def keeps_inputs(nbytes: int) -> bool:
    """Whether a search's memo keeps a trial's inputs of ``nbytes`` (``MEMO_INPUTS``)."""
    return nbytes <= MEMO_INPUTS


def trial_inputs(program) -> int:
    """Bytes of one field trial's inputs of ``program`` (the parts it uses)."""
    return program_peak(program, True)[0]


def check_parts(program) -> list[tuple[str, int]]:
    """``verify_parts`` of one program checked against itself, one trial at a time: the
    least any verification of it needs."""
    return verify_parts(program, program, 1, 1, memo=False)


def float_parts(a, b, threads: int) -> list[tuple[str, int]]:
    """(description, bytes) of the float checks of ``b`` against ``a``, ``threads`` at once."""
    _, fa_out, _, _ = program_peak(a, False)
    each, at = float_check_peak(a, b)
    return [(f"{threads} float check(s) at once, each peaking at {at}", threads * each),
            (f"the draws the checks are made from (a standard-normal draw, two rounded "
             f"draws others are made from, {_folded_what(a)})",
             draw_bytes(a) + packed_inputs(a) + packed_signed(a)),
            ("the first program's outputs kept per draw (native, float64, at the headroom, "
             "its truth)", OUTPUT_SETS * fa_out), _BASE_PART]


def _folded_what(a) -> str:
    """The folded draw at the headroom in words (``keeps_folded``)."""
    return "the folded one at the headroom in float32" if keeps_folded(a) else \
        "the folded one at the headroom made again where read"


def threads_that_fit(parts_for: Callable[[int], list], most: int, what: str,
                     budget: int | None = None) -> int:
    """The most trials at once (``most`` at most, 1 at least) whose ``parts_for(threads)``
    fit the memory budget; ``BudgetError`` (``limits.check_bytes``) when not even one does."""
    from ..ir.limits import check_bytes, memory_budget

    budget = memory_budget() if budget is None else budget
    for threads in range(most, 1, -1):
        if sum(n for _, n in parts_for(threads)) <= budget:
            return threads
    check_bytes(parts_for(1), what, budget)
    return 1
