"""The compile check (pipeline step 8 without a GPU): the chosen kernels built for the target.

``tune(mugraph, target)`` compiles every custom kernel of ``mugraph`` for the target's
architecture (``compiled.compile_report``: Triton with an explicit ``GPUTarget`` and the
ptxas in its wheel). A kernel that spills registers, or needs more shared memory than the
target allows, is compiled again at the other warp counts (4, 8, 16; the cost model's choice
first), unless its spills or shared memory are past what any warp count can hold
(``block_registers``); the
first clean build wins and is pinned on the kernel (``CustomKernel.num_warps``,
which codegen emits and the cost model prices). A kernel with no clean build is refused: its
tile key (``gpucost.tile_key``) and its tiles key (``tiles.tiles_key``: the same tiles at any
grid, with a loop or without one as built) go into ``TuneResult.refused`` with the reason, the
kernel planner keeps it among its facts (``fusion.forms.KernelPlanner.refuse``), and the
candidate planned again prices that schedule as infeasible (``gpucost.kernel_cost(...,
refused=)``) and picks smaller tiles. A refused kernel whose best build spills at most
``SMALL_SPILL`` bytes a thread within shared memory is named in ``TuneResult.spills`` with
that warp count: the search's last resort (``pipeline.build.Builder.last_resort``).

Every compile is cached by source (``compile_report``) and by Triton's own cache on disk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..cost.profile import GPUProfile
from ..cost.tiles import tile_key, tiles_key, warps_for
from ..ir.errors import TimeLimitError
from ..mugraph.kernels import CustomKernel
from ..mugraph.program import MuGraph
from .compiled import ARCH, KernelResources, compile_report
from .source import triton_source

WARPS = (4, 8, 16)
HOPELESS = 2.0  # a build wanting this many register files a block is not tried again
# a kernel whose best build spills at most this many bytes a thread (a few registers' worth,
# within shared memory) is refused, but may serve as a last resort (``TuneResult.spills``):
# Phi-3's float16 MLP piece had 4 plans refused for 76-236 B and stayed 18 kernels
SMALL_SPILL = 128


@dataclass
class TuneResult:
    """What the compile check found: each custom kernel's clean build, and what it refused."""

    target: str
    kernels: dict[str, KernelResources] = field(default_factory=dict)  # kernel name -> build
    refused: dict[tuple, str] = field(default_factory=dict)  # tile and tiles keys -> reason
    retuned: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (from, to) warps
    compiles: int = 0
    seconds: float = 0.0
    cut_short: bool = False  # the deadline ended the warp retries before a clean build
    failed: list[str] = field(default_factory=list)  # names of the kernels refused
    # refused kernels whose best build spilled at most SMALL_SPILL bytes: name -> (warps, bytes)
    spills: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def small_spills_only(self) -> bool:
        """Whether every refused kernel is one whose best build spilled a little
        (``SMALL_SPILL``): the plan may run as a last resort with those warps."""
        return bool(self.failed) and set(self.failed) <= set(self.spills)

    @property
    def ok(self) -> bool:
        """Every custom kernel built without spills and within shared memory."""
        return not self.refused

    def summary(self) -> str:
        """One line: kernels built, warps changed, refusals, seconds."""
        arch = f"sm_{ARCH[self.target]}" + ("a" if ARCH.get(self.target) == 90 else "")
        spills = ("not clean" if not self.ok
                  else "not built: the time limit came before the first build ended"
                  if self.cut_short and not self.compiles
                  else "a kernel spilled; its other warp counts were not tried in time"
                  if self.cut_short else "no spills, shared memory within the limit")
        parts = [f"{len(self.kernels)} kernel(s) built for {self.target} ({arch}): {spills} "
                 f"({self.compiles} builds, {self.seconds:.1f} s)"]
        parts += [f"{n}: {a} -> {b} warps (ptxas spilled at {a})"
                  for n, (a, b) in self.retuned.items()]
        parts += [f"refused: {why}" for why in dict.fromkeys(self.refused.values())]
        return "; ".join(parts)


def _problem(r: KernelResources, smem_limit: float) -> str:
    if r.spill_bytes:
        return f"{r.spill_bytes} B spilled at {r.num_warps} warps ({r.registers} registers)"
    if r.shared_bytes > smem_limit:
        return f"{r.shared_bytes / 1024:.1f} KiB of shared memory (limit {smem_limit / 1024:g})"
    return ""


def tune(mugraph: MuGraph, target: str = "h100", deadline=None) -> TuneResult:
    """Compile ``mugraph``'s custom kernels for ``target``; pin clean warp counts, refuse the
    rest (see the module docstring). ``target`` is a built-in profile name (``ARCH``).
    Past ``deadline`` (an ``ir.limits.Deadline``) no other warp count is tried, and a build
    under way stops between kernels (``compile_report``): a kernel not yet clean is left
    unpinned and the result is ``cut_short`` (nothing refused)."""
    t0 = time.perf_counter()
    out = TuneResult(target)
    prof = GPUProfile.load(target)
    limit, regfile = prof.smem_per_block_KiB * 1024, prof.registers_per_sm
    custom = [k for k in mugraph.kernels if isinstance(k, CustomKernel)]
    if not custom:
        return out
    try:
        builds = compile_report(triton_source(mugraph), target, deadline)
    except TimeLimitError:  # the deadline came during the first build: nothing known
        out.cut_short, out.seconds = True, time.perf_counter() - t0
        return out
    out.compiles += 1
    for k, r in zip(custom, builds):
        why = _problem(r, limit)
        if not why:
            out.kernels[k.name] = r
            continue
        first, tried = r.num_warps, [why]
        least = (r.spill_bytes, r.num_warps) if r.shared_bytes <= limit else None
        # twice the register file, or the shared memory: no warp count holds its tiles (a
        # margin for the per-thread overhead, which does not split)
        hopeless = block_registers(r) > HOPELESS * regfile or \
            r.shared_bytes > HOPELESS * limit
        if hopeless:
            tried.append(f"about {block_registers(r):,.0f} registers and "
                         f"{r.shared_bytes / 1024:.0f} KiB of shared memory a block where the "
                         f"target holds {regfile:,} and {limit / 1024:g} KiB: no other warp "
                         "count tried")
        for w in (w for w in WARPS if w != first and not hopeless):
            if deadline is not None and deadline.expired():
                k.num_warps, out.cut_short = None, True
                break
            k.num_warps = w
            try:
                again = compile_report(triton_source(mugraph), target, deadline)
            except TimeLimitError:
                k.num_warps, out.cut_short = None, True
                break
            out.compiles += 1
            r2 = again[custom.index(k)]
            problem = _problem(r2, limit)
            if not problem:
                out.kernels[k.name], out.retuned[k.name] = r2, (first, w)
                break
            tried.append(problem)
            if r2.shared_bytes <= limit and (least is None or r2.spill_bytes < least[0]):
                least = (r2.spill_bytes, w)
        else:
            k.num_warps = None
            if least is not None and 0 < least[0] <= SMALL_SPILL and not out.cut_short:
                out.spills[k.name] = (least[1], least[0])
            arch = f"sm_{ARCH[target]}" + ("a" if ARCH[target] == 90 else "")
            why = f"kernel {k.name} does not build cleanly for {target} ({arch}): " + \
                "; ".join(tried)
            out.refused[tile_key(k)] = out.refused[tiles_key(k)] = why
            out.failed.append(k.name)
    out.seconds = time.perf_counter() - t0
    return out


def block_registers(r: KernelResources) -> float:
    """32-bit registers one block of a build wants: each thread's registers and the words
    of its local stack frame (where ptxas spills), times its threads. More warps split the
    same tiles among more threads, so this stays about the same at any warp count; past the
    SM's register file no warp count builds cleanly (a float32 decode attention kernel:
    16,672 B of stack a thread at 8 warps, 5,864 at 16, about 1.1 and 0.8 million
    registers a block; with 832 KiB of shared memory: three builds of about 20 s each,
    all refused)."""
    return (r.registers + r.stack_bytes / 4) * 32 * r.num_warps


def can_tune(target: str) -> bool:
    """Whether ``tune`` can build for ``target``: a built-in architecture and a Triton whose
    compiler and NVIDIA backend (with ptxas) are installed."""
    if target not in ARCH:
        return False
    try:
        import triton.backends.nvidia as nv  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError:
        return False
    return True


__all__ = ["TuneResult", "block_registers", "can_tune", "tune", "warps_for"]
