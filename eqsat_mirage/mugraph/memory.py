"""What the tiled interpreter holds at its peak while it runs a MuGraph (the verifier's
memory estimate of a MuGraph: ``verifier/memory.py`` says what it counts; a MuGraph's
``memory_peak`` calls ``mugraph_peak`` here)."""

from __future__ import annotations

import math

from ..ir.node import Op, fmt_shape
from ..verifier.memory import WORD, Peak, matmul_scratch, pinned, size, walk
from .kernels import PredefinedKernel
from .parts import needs_p, needs_q
from .tiled import input_first_reads, tensor_last_reads, validated_plans


def mugraph_peak(mg, field: bool, lazy: bool = False) -> tuple[int, int, int, str]:
    """(inputs, outputs, peak above the inputs, what was computed at the peak) of one run of
    ``mg`` by the tiled interpreter (``mugraph/tiled.py``) over the field or float64.
    ``lazy``: inputs made as they are read (``floating.LazyInputs``), each held from the
    first kernel that reads it to the last (the peak then includes them)."""
    plans = validated_plans(mg)
    if field:
        nq = needs_q(mg, plans)
        npp = needs_p(mg, plans, nq)

        def parts(n):
            return (id(n) in npp) + (id(n) in nq)
    else:
        def parts(n):
            return 1

    def nbytes(n):
        return WORD * size(n) * parts(n)
    tparts: dict[str, int] = {}  # device tensor -> parts some reader uses
    for k, plan in zip(mg.kernels, plans):
        if isinstance(k, PredefinedKernel):
            for s in k.node.srcs:
                if s.op is Op.INPUT:
                    tparts[s.arg] = max(tparts.get(s.arg, 0), parts(s), 1)
            continue
        for stage in (plan.loop, plan.post, plan.fused_loop):
            for n in stage.nodes() if stage is not None else ():
                if n.op is Op.INPUT and n.arg in k.inputs:
                    t = k.inputs[n.arg].tensor
                    tparts[t] = max(tparts.get(t, 0), parts(n), 1)
    for t in mg.output_tensors.values():
        tparts[t] = max(tparts.get(t, 0), 1)
    specs = mg.tensors

    def tbytes(t):
        return WORD * math.prod(specs[t].shape) * tparts.get(t, 1)
    peak = Peak()
    inputs = sum(tbytes(t) for t in mg.inputs)
    if field:
        peak.hold(sum(pinned([k.node], lambda n: max(1, parts(n))) for k in mg.kernels
                      if isinstance(k, PredefinedKernel)), "cached conversions of the inputs")
    last = tensor_last_reads(mg)
    first = input_first_reads(mg) if lazy else {}
    for i, (k, plan) in enumerate(zip(mg.kernels, plans)):
        for t in first.get(i, ()):
            peak.hold(tbytes(t), f"input {t!r} read by kernel {k.name!r}")
        if isinstance(k, PredefinedKernel):
            walk(peak, plan.nodes(), [k.node], nbytes, field, f"kernel {k.name!r}: ")
        else:
            custom_peak(peak, k, plan, nbytes, tbytes, field)
        for t in last.get(i, ()):
            if t not in mg.inputs or lazy:
                peak.live -= tbytes(t)
    out = sum(tbytes(t) for t in set(mg.output_tensors.values()))
    return inputs, out, peak.peak, peak.at


def custom_peak(peak: Peak, k, plan, nbytes, tbytes, field: bool) -> None:
    """A custom kernel run by ``tiled._run_custom`` (its outputs stay held)."""
    where = f"kernel {k.name!r}: "
    blocks, f_range = math.prod(k.grid), k.forloop
    start = peak.live
    # the tiles cut from its inputs hold nothing of their own: ``tiled.cut`` splits the
    # device tensor's axes (never merges two), moves them, adds axes of size 1 and
    # broadcasts, views of any strided array (tests/mugraph/test_tile_views.py). Over
    # the field their bytes stay counted, as the margin for what an exact product over
    # the joined loop holds besides the operands counted below (the whole operand's
    # float64 copy, the digits of each part: gqa at batch 8's estimate 0.95x its traced
    # peak with it, 0.76x without; in float64 it is exact without, bench/RESULTS.md)
    if field:
        peak.hold(sum(tbytes(bi.tensor) for bi in k.inputs.values()),
                  f"{where}tiles cut from its inputs (the margin of an exact product)")
    fused = plan.fused if field and f_range > 1 and plan.online is None else {}
    loop = plan.fused_loop if fused else plan.loop
    accs = sum(nbytes(plan.loop.outputs[a]) for a in k.accumulators if a not in fused)
    peak.hold(accs, f"{where}accumulators")
    loop_outs = [t for t, bo in k.outputs.items() if bo.stage == "loop"]
    per_iter = [nbytes(loop.outputs[f"{a}\0lhs"]) + nbytes(loop.outputs[f"{a}\0rhs"])
                for a in fused]
    written = sum(nbytes(plan.loop.outputs[t]) * (f_range if k.outputs[t].fmap is not None
                                                  else 1) for t in loop_outs)
    # one iteration's values (the last one, with every earlier one's kept operands held)
    before = peak.live
    peak.hold((f_range - 1) * sum(per_iter) + written, f"{where}{f_range} iterations' kept "
              "values")
    kept = walk(peak, loop.nodes(), list(loop.outputs.values()), nbytes, field,
                f"{where}loop (x {blocks} blocks): ")
    peak.live -= kept
    peak.live = before + f_range * sum(per_iter) + written
    for m in fused.values():  # the joined operands, then their one matmul
        joined = sum(per_iter)
        mm = nbytes(m)
        peak.spike(joined + mm + matmul_scratch(m, 1), f"{where}matmul {fmt_shape(m.shape)} "
                   f"over {f_range} iterations x {blocks} blocks (joined operands)")
        peak.hold(mm)
    peak.live -= f_range * sum(per_iter)
    if k.post.outputs:
        walk(peak, plan.post.nodes(), list(plan.post.outputs.values()), nbytes, field,
             f"{where}epilogue (x {blocks} blocks): ")
    out = sum(tbytes(t) for t in k.outputs)
    # an output written over the loop is stacked from its iterations' tiles (a copy, while
    # they are still held), then placed (another); natively a third, rounded to its dtype,
    # which the 8 bytes counted per float32 value cover
    stacked = sum(nbytes(plan.loop.outputs[t]) * f_range for t in loop_outs
                  if k.outputs[t].fmap is not None)
    peak.spike(out + stacked, f"{where}writing its outputs")
    peak.live = start + out  # the tiles, accumulators and stage values are dropped
