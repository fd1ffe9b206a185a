"""Tiles as Triton holds them, the registers they take, and the warps a block needs.

``padded_shapes`` pads every tile dim to a power of two (a matmul's M and N to at least 16),
``kernel_pads`` as a kernel's code holds them (a size one ``tl.dot`` pads, padded everywhere);
``live_registers`` counts the 32-bit registers one block's live tiles take; ``warps_for``
picks 4, 8 or 16 warps from that (or the count the compile check pinned), or None when no
count holds them without spilling (``fma_k``: a crowded float32 dot over a long K).
``refusal`` reads the compile check's refusals (``codegen.tune``), keyed by ``tile_key``,
``tiles_key`` or ``structure_key``, from the mapping the caller passes (the refusals the
kernel planner keeps; not a context variable).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

from ..frontend.graph import Graph
from ..ir.node import ITEMSIZE, Op, numel
from ..ir.ops import REDUCE
from ..mugraph.dots import matmul_dims, merges_batch, uses_dot
from ..mugraph.kernels import CustomKernel
from .profile import NUM_STAGES

MIN_MMA = 16  # tensor-core tile dims (tl.dot) are at least 16
DEEP_STAGES = 4  # pipelining depth for loops of small tiles (stages_for)
SMALL_ITERATION_BYTES = 16 * 1024


def pow2_ceil(d: int) -> int:
    """The smallest power of two at least ``d`` (1 for ``d <= 1``): a tile dim as Triton
    holds it."""
    return 1 << max(0, int(d) - 1).bit_length()


def padded_shapes(graph: Graph) -> dict[int, tuple[int, ...]]:
    """Tile shapes as Triton holds them: dims to powers of two, matmul M and N to >= 16 (a
    merged dot's M kept: its batch fills the rows; ``kernel_pads`` pads every dim of a
    size that a dot pads, as the code does).
    Kept with the graph while its outputs are the same (``Graph.derived``): a kernel's
    price reads them three times. Read-only."""
    return graph.derived("padded shapes", _padded)


def _padded(graph: Graph) -> dict[int, tuple[int, ...]]:
    pad = {id(n): tuple([pow2_ceil(d) for d in n.shape]) for n in graph.nodes()}
    for n in graph.nodes():
        if n.op is Op.MATMUL:
            # a merged dot (``merges_batch``) keeps its M: the batch fills the 16 rows
            rows = () if merges_batch(n) else ((n.srcs[0], -2), (n, -2))
            for node, dim in (*rows, (n.srcs[1], -1), (n, -1)):
                s = list(pad[id(node)])
                s[dim] = max(MIN_MMA, s[dim])
                pad[id(node)] = tuple(s)
    return pad


# 32-bit registers per thread that a block's live tiles may take at each warp count: ptxas
# allows 255 registers per thread up to 8 warps and 128 at 16 (65536 per SM); the rest holds
# addresses, offsets, masks and layout conversions. Fitted on sm_90a builds (triton 3.8) of
# attention kernels with 16 to 128 query rows and 64 to 256 keys per block at 4, 8 and 16
# warps: it keeps the counts that built cleanly for the 128 x 128 tiles and refuses 128 x 256
# at every count, as ptxas does. It is a prior, not the truth: 64 x 256 fits it and spills,
# which the compile check (``codegen.tune``) catches and refuses.
REGISTER_BUDGET = {4: 150, 8: 170, 16: 72}
MAX_TILE_PER_THREAD = 64  # values of one computed tile per thread past which ptxas spills
# the longest K (padded) of a crowded float32 tl.dot (``fma_k``) that builds without spills at
# sm_90a: the float32 LLaMA MLP's K=256 tiles spilled 892-8316 B at 4, 8 and 16 warps on 14
# tile shapes, where K=128 built cleanly (bench/history/2026-12-03_session39.md)
MAX_FMA_K = 128
WGMMA_M = 64  # Hopper's warpgroup MMA: M >= 64 rows, operand B (and a loaded A) from shared
              # memory; smaller dots run as mma.sync with both operands in registers


def _dot_sizes(n) -> tuple[int, ...]:
    """The dim sizes a tile matmul's ``tl.dot`` pads to 16 (none for a broadcast product)."""
    if n.op is not Op.MATMUL:
        return ()
    _, m, kk, nn = matmul_dims(n)
    return (m, kk, nn) if uses_dot(n) else (kk, nn) if merges_batch(n) else ()


def dot_rows(n, pad: Mapping[int, tuple[int, ...]]) -> int:
    """The rows (M) of tile matmul ``n``'s ``tl.dot`` as padded in ``pad``: a merged dot's
    (``merges_batch``) are its left operand's batch dims and M together."""
    if merges_batch(n):
        return numel(tuple(pow2_ceil(d) for d in n.srcs[0].shape[:-1] if d > 1))
    return pad[id(n)][-2]


def _small_dot_sizes(stage: Graph) -> frozenset[int]:
    """The dim sizes below 16 that a ``tl.dot`` of ``stage`` pads to 16."""
    return frozenset(d for n in stage.nodes() for d in _dot_sizes(n)
                     if 1 < d and pow2_ceil(d) < MIN_MMA)


def kernel_pads(k: CustomKernel) -> list[tuple[Graph, dict[int, tuple[int, ...]]]]:
    """Each stage of ``k`` with its tiles' shapes as the generated kernel holds them:
    ``padded_shapes``, and then every tile dim of a size that one of the kernel's
    ``tl.dot``s pads to 16 padded to 16 too, as the code does (its block sizes are one
    constexpr per size, ``codegen.tiles.TileOps.bumped``). A decode attention's batch of 2
    key heads took the 16 its 2 query rows a head need: tiles of 16 x 64 x 64 in float32,
    832 KiB of shared memory and 37,620 B spilled at sm_90a, priced as fitting before."""
    stages = (k.loop, k.post)
    bump = frozenset().union(*(stage.derived("small dot sizes", _small_dot_sizes)
                               for stage in stages))
    if not bump:
        return [(stage, padded_shapes(stage)) for stage in stages]
    # kept with the stage as ``padded_shapes`` is (a kernel's price reads them three times)
    return [(stage, stage.derived(f"kernel pads {sorted(bump)}",
                                  lambda g: _bumped(g, bump))) for stage in stages]


def _bumped(stage: Graph, bump: frozenset[int]) -> dict[int, tuple[int, ...]]:
    """``padded_shapes(stage)`` with every dim of a size in ``bump`` padded to 16."""
    pad = padded_shapes(stage)
    return {id(n): tuple(max(MIN_MMA, p) if d in bump else p
                         for d, p in zip(n.shape, pad[id(n)])) for n in stage.nodes()}


def live_registers(k: CustomKernel, pads=None) -> float:
    """32-bit registers the tiles of one block of ``k`` hold at its busiest point.

    The accumulators (fp32), plus, in the busier stage, every matmul operand and result
    tile (a ``tl.dot``'s operands and result are all live around it; 16-bit values pack two
    to a register, results are fp32; a loaded operand of a dot with M >= 64 stays in shared
    memory) and the largest other tile (fp32, as the generated code computes). ``pads``:
    each stage with its ``kernel_pads``, when the caller has them.
    """
    pads = pads or kernel_pads(k)
    pad_loop = pads[0][1]
    acc = sum(numel(pad_loop[id(k.loop.outputs[a])]) for a in k.accumulators)
    busiest = 0.0
    for stage, pad in pads:
        dots: dict[int, float] = {}
        for n in stage.nodes():
            if n.op is Op.MATMUL:
                dots[id(n)] = numel(pad[id(n)])
                wgmma = dot_rows(n, pad) >= WGMMA_M
                for m in n.srcs:  # wgmma reads a loaded operand from shared memory
                    held = not (wgmma and m.op is Op.INPUT)
                    dots[id(m)] = max(dots.get(id(m), 0.0),
                                      numel(pad[id(m)]) * ITEMSIZE[m.dtype] / 4 * held)
        other = max([numel(pad[id(n)]) for n in stage.nodes()
                     if id(n) not in dots and n.op is not Op.CONST], default=0)
        busiest = max(busiest, sum(dots.values()) + other)
    return acc + busiest


def iteration_bytes(k: CustomKernel) -> int:
    """Bytes one block of ``k`` loads per loop iteration: its inputs with an fmap."""
    return sum([numel(node.shape) * ITEMSIZE[node.dtype] for node in
                [k.loop.inputs[bi.name] for bi in k.inputs.values() if bi.fmap is not None]])


def stages_for(k: CustomKernel) -> int:
    """Software-pipelining depth emitted for ``k`` (``num_stages``): ``NUM_STAGES`` (double
    buffering: one iteration's loads in flight), or ``DEEP_STAGES`` when the loop has at
    least that many iterations and one iteration loads at most ``SMALL_ITERATION_BYTES``:
    a loop of small tiles waits a memory latency per iteration, and three in flight cut
    that wait threefold for little shared memory."""
    if k.forloop < DEEP_STAGES:
        return NUM_STAGES
    return DEEP_STAGES if 0 < iteration_bytes(k) <= SMALL_ITERATION_BYTES else NUM_STAGES


def tile_key(k: CustomKernel) -> tuple:
    """What a compiled build of ``k`` depends on, without names: its grid, loop range, and
    each stage's ops, tile shapes and dtypes in order."""
    stages = tuple(tuple((n.op.name, n.shape, n.dtype, n.arg if n.op is not Op.INPUT else None)
                         for n in st.nodes()) for st in (k.loop, k.post))
    return (k.grid, k.forloop, stages)


def tiles_key(k: CustomKernel) -> tuple:
    """What a build's registers and shared memory depend on: ``tile_key`` without the grid
    and the loop range, with the pipelining depth (``stages_for``) and whether there is a
    loop (a range of 1 emits none). A kernel that spills at every warp count spills at
    every grid, and at every loop range past 1, of the same tiles: keyed by ``tile_key``
    alone, each re-plan tried the same tiles at another split (a float32 LLaMA MLP piece:
    7 plans refused with the same spills, then left one kernel per op)."""
    return ("tiles", stages_for(k), k.forloop > 1) + tile_key(k)[2:]


def structure_key(k: CustomKernel) -> tuple:
    """What a code-generation refusal of ``k`` depends on: its stages' ops and dtypes in
    order, without grid, loop range or tile shapes (the Triton backend refuses a structure,
    such as a matmul reading a concat split unequally along K, at every tile size; keyed by
    ``tile_key`` alone, the re-plan would try the same structure at the next tile size)."""
    return ("structure",) + tuple(tuple((n.op.name, n.dtype, len(n.srcs)) for n in st.nodes())
                                  for st in (k.loop, k.post))


# a shape family's search: (input -> dynamic axes, the padded size); None outside one
_DYNAMIC: ContextVar[tuple[dict, int] | None] = ContextVar("dynamic", default=None)


def refusal(k: CustomKernel, refused: Mapping[tuple, str] | None = None) -> str:
    """Why ``k``'s schedule is refused ("" when it is not): the compile check refused it
    (its ``tile_key``, ``tiles_key`` or ``structure_key`` in ``refused``, key -> reason), or
    it reads a dynamic (symbolic) dim whole, so its tile would grow with the size."""
    axes, size = _DYNAMIC.get() or ({}, None)
    for bi in k.inputs.values() if size is not None else ():
        tile = k.loop.inputs[bi.name].shape  # an intermediate's dim as long as the padded size
        derived = {d for d, n in enumerate(tile) if n == size}
        for d in sorted(set(axes.get(bi.tensor, ())) | derived):
            if d not in bi.imap and d != bi.fmap:
                return (f"it reads dim {d} of {bi.tensor!r} whole, and that dim is a dynamic "
                        "size: its tile would grow with it (one search serves every size)")
    if not refused:
        return ""
    return (refused.get(tile_key(k)) or refused.get(tiles_key(k))
            or refused.get(structure_key(k), ""))


def dynamic_context() -> tuple[dict, int] | None:
    """The shape family search in progress: (input -> dynamic axes, the padded size), or
    None outside one (a results-cache key includes it: the same program searched as a
    family's part and on its own may be planned differently)."""
    return _DYNAMIC.get()


@contextmanager
def dynamic_dims(axes: dict[str, set[int]], size: int = 0) -> Iterator[None]:
    """Inside the block, refuse schedules that read a dynamic dim whole: ``axes`` maps
    input tensors to their dynamic axes (a shape family's search); an intermediate's dim
    of ``size`` (the padded size, chosen unlike every static dim) is dynamic too."""
    token = _DYNAMIC.set((dict(axes), size))
    try:
        yield
    finally:
        _DYNAMIC.reset(token)


def fma_k(k: CustomKernel, pads=None) -> int:
    """The largest K (padded) of ``k``'s crowded float32 ``tl.dot``s (0 when it has none).

    Triton runs a float32 dot (``input_precision="ieee"``) on FMAs, each thread holding its
    operand rows and columns whole along K. Built at sm_90a with K = 256 (X (64, 256)
    against (512, 256) weights): alone, or after an elementwise prologue, clean; two dots
    reading one operand (the LLaMA MLP's gate and up projections) spilled at every warp
    count on every block tried (16 x 16 to 64 x 16: 892-5956 B); a dot whose left operand
    comes from a reduction along K (a norm before the projection) spilled on blocks wider
    than tall (16 x 32, 16 x 64: 844-1852 B) and built cleanly on 16 x 16, 32 x 32 and
    64 x 16. Those are the crowded dots. A tile matmul counts where the backend emits it as
    a ``tl.dot`` (``mugraph.dots``: ``uses_dot``, ``merges_batch``); the others are
    broadcast products."""
    pads = pads or kernel_pads(k)
    worst = 0
    for stage, pad in pads:
        dots = [n for n in stage.nodes() if n.op is Op.MATMUL and n.dtype == "float32"
                and (uses_dot(n) or merges_batch(n))]
        for n in dots:
            a, b = (pad[id(m)] for m in n.srcs)
            shared = any(m is not n and set(map(id, m.srcs)) & set(map(id, n.srcs))
                         for m in dots)
            if shared or (b[-1] > dot_rows(n, pad) and _reduced_along_k(n.srcs[0])):
                worst = max(worst, a[-1])
    return worst


def _reduced_along_k(a) -> bool:
    """Whether tile ``a`` (a dot's left operand) depends on a reduction along its last axis
    (a row statistic: RMSNorm's mean of squares, a softmax's max and sum)."""
    seen, todo = set(), [a]
    while todo:
        n = todo.pop()
        if id(n) in seen or n.op is Op.INPUT:
            continue
        seen.add(id(n))
        if n.op in REDUCE and len(n.srcs[0].shape) - 1 in n.arg[0]:
            return True
        todo.extend(n.srcs)
    return False


def warps_for(k: CustomKernel) -> int | None:
    """Warps per block of custom kernel ``k`` (emitted by codegen, priced here).

    ``k.num_warps`` when the compile check set it; else the fewest of 4, 8 and 16 whose
    threads hold ``live_registers(k)`` within ``REGISTER_BUDGET`` and every tile within
    ``MAX_TILE_PER_THREAD`` values each; None when none does, or when a crowded float32
    dot's K is over ``MAX_FMA_K`` (ptxas would spill: the schedule is refused, and the
    planner looks for smaller tiles).
    """
    if k.num_warps:
        return k.num_warps
    pads = kernel_pads(k)
    if fma_k(k, pads) > MAX_FMA_K:
        return None
    live = live_registers(k, pads)
    tiles = max([numel(pad[id(n)]) for stage, pad in pads for n in stage.nodes()
                 if n.op is not Op.INPUT], default=0)  # computed tiles (loaded: in live)
    for warps in (4, 8, 16):
        threads = 32 * warps
        if live <= REGISTER_BUDGET[warps] * threads and tiles <= MAX_TILE_PER_THREAD * threads:
            return warps
    return None
