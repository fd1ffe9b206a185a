"""The GPU cost model of a MuGraph: per-kernel cost, transfers per level, roofline.

Figures come from a profile (``profile.GPUProfile.load("h100")`` or a path; re-exported
here); its ``[calibration]`` table overrides ``[figures]`` key by key. Times in microseconds.
BW = dram_bandwidth_GBps, f_bw = dram_achievable_fraction, f_tc = tensor_achievable_fraction.

Compute time of some work (both kernel kinds)::

    compute = tensor_flops / (tensor peak of the dtype x f_tc)
              + max(cuda_flops / fp32 peak, sfu_ops / sfu peak)

Tensor cores take fp16/bf16 matmuls (fp32 matmuls go to the CUDA cores); the SFU takes one
op per element of exp, sqrt, rsqrt and division (silu: two), beside their CUDA-core FLOPs.
Tensor-core time and CUDA-core/SFU time add up, they do not overlap: the generated Triton
code runs a tile's exp in the same warps after the tile's MMA (no warp specialization).
Overlapping them takes explicit warp-specialized ping-pong scheduling (FlashAttention-3,
Shah et al. 2024, arXiv 2407.08608, which also notes H100 SXM5's 989 TFLOPS of FP16 matmul
against 3.9 TFLOPS of special functions); FlashAttention-2, without it, reaches ~35% of the
H100's matmul peak (PyTorch blog "FlashAttention-3", 2024). Calibration on a GPU decides.

Predefined kernel (a library kernel, assumed to fill the GPU: no wave model)::

    time = launch + max((reads + write) / (BW x f_bw), compute)

each distinct operand read once, the output written once; a reshape is a free view.

Custom kernel (B = prod(grid) blocks, F = forloop range, tiles as Triton holds them: every
dim padded to a power of two; a matmul's M and N padded to >= 16 with masks, its K not
padded: K < 16 is INFEASIBLE, since tensor-core tiles need K >= 16)::

    smem/block = sum(S x tile bytes of inputs with an fmap when F > 1; S = stages_for(k))
               + sum(tile bytes of loop-invariant inputs, loaded once before the loop)
               + sum(accumulators at 4 bytes) + sum(post-stage tiles, except thread-chain
                 interiors, which stay in registers); loop-stage values live in registers
    INFEASIBLE when smem/block > smem_per_block_KiB
    warps = tiles.warps_for(k): 4, 8 or 16 by the registers the live tiles take, or the
            count the compile check pinned; INFEASIBLE when none holds them (ptxas spills),
            or when the compile check refused the schedule (``refused``, tiles.refusal)
    bps   = min(smem_per_sm // smem/block, max_blocks_per_sm, max_threads_per_sm // T,
                registers_per_sm // (T x 128))   # T = 32 x warps, 128 registers per thread
    DRAM  = sum over inputs: tensor bytes x (1 + (R - 1) x r_f)
              R = tile bytes x B x (F if fmap else 1) / tensor bytes (the replication),
              r_f = replicated_read_dram_fraction if the tensor fits in L2, else 1
          + each output tensor written once
    L2    = sum over inputs that fit in L2: tensor bytes x (R - 1) x (1 - r_f)  (L2 hits)
    work  = loop-stage ops x B x F + accumulator adds x B x F + post-stage ops x B
            (a loop-stage op that reads no fmap tile, directly or not, counts x B: the
             Triton code hoists it before the loop, as ``codegen/kernel.py`` does)

The first read of every input tile comes from DRAM; re-reads of a tensor that fits in L2
(the same tile loaded by several blocks) hit L2 except a fraction r_f, and are paid at the
L2 bandwidth (l2_bandwidth_GBps): every load, hit or miss, passes through L2. A tensor
larger than L2 pays every re-read at DRAM. Waves: slots = SMs x bps, waves = ceil(B /
slots). A wave of n blocks costs max(memory, compute)::

    memory(n)  = max(n x DRAM/B / min(BW x f_bw, lat(n)), n x (DRAM + L2)/B / min(L2BW, cap(n)))
                 cap(n) = min(n, SMs) x min(sm_dram_bandwidth_GBps, ceil(n / SMs) x
                                  block_l2_bandwidth_GBps)   (what n SMs can keep in flight;
                          one block pulls at most block_l2_bandwidth_GBps through L2: at
                          least the per-SM figure, so off, in the datasheet profiles)
                 lat(n) = min(n, SMs) x min(sm_dram_bandwidth_GBps, ceil(n / SMs) x
                                  min(flight / dram_latency_ns, block_dram_bandwidth_GBps))
                 flight = in_flight_bytes(k): (stages - 1) loop iterations' tiles per block
                          (Little's law: latency and occupancy; a loop of small tiles on
                          few blocks waits a latency per iteration); one block streams at
                          most block_dram_bandwidth_GBps however large its tiles (its loads
                          in flight are bounded; equal to the per-SM figure, so off, in the
                          datasheet profiles)
    compute(n) = ceil(n / SMs) x c_b,  c_b = compute x SMs / B  (one block alone on an SM)
    time = launch + (B // slots) x (max(memory(slots), compute(slots)) + F x it)
                  + [B % slots > 0] x (max(memory(r), compute(r)) + F x it),  r = B % slots
    it = loop_iteration_us + iteration_latency_us / (stages - 1) (a block's iterations run
         one after another, each waiting the DRAM latency its stages - 1 iterations in
         flight do not hide; both 0 in the datasheet profiles), and memory(n) is multiplied
         by load_slowdown: the mean over the block inputs of (padded / loaded tile elements)
         ^ padded_load_exponent x (128 / bytes of a contiguous run of the tile) ^
         short_run_exponent x (16 / the alignment in bytes of its rows) ^
         unaligned_load_exponent x (1 + run_overhead_bytes / bytes of a contiguous run)
         (Triton holds a 172-wide chunk as 256 and loads its 344-byte rows in 8-byte
         vectors; a 16-wide fp16 tile uses a quarter of each line, and every run is a
         request of its own; all four 0, off, in the datasheet profiles)

so co-resident blocks share their SM, and a partial last wave costs a whole block time:
133 equal compute-bound blocks at 1 block/SM on 132 SMs take 2 block times, not 133/132.

``transfers(mg)`` counts bytes per level, hardware-free ("FlashAttention on a Napkin"
style): ``device`` (compulsory: each tensor a kernel reads, once, and each it writes),
``l2_reread`` (replicated tile loads beyond the first: L2 hits, or DRAM at r_f),
``shared`` (written into shared memory: loaded tiles, accumulator updates, post-stage
tiles), ``registers`` (values made and consumed in registers), and ``round_trips``: the
intermediate tensors that go through device memory. ``roofline_us`` is the roofline lower
bound: one launch + max(inputs read once and outputs written once at peak BW, the input
program's matmul FLOPs at tensor peak). Elementwise FLOPs are left out of it because
rewrites move them (the softmax division after the matmul), so it stays below any cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..frontend.graph import Graph
from ..ir.errors import MirageError
from ..ir.node import ELEMENTWISE, GATHERS, ITEMSIZE, LOGIC, REDUCE, Node, Op, numel
from ..ir.ops import SPECS
from ..mugraph.kernels import CustomKernel, Kernel, PredefinedKernel
from ..mugraph.online import causal_skip, kept_iterations
from ..mugraph.program import MuGraph
from .profile import GPUProfile
from .tiles import (
    MIN_MMA,
    REGISTER_BUDGET,
    iteration_bytes,
    kernel_pads,
    live_registers,
    pow2_ceil,
    refusal,
    stages_for,
    tile_key,
    warps_for,
)

__all__ = ["GPUProfile", "KernelCost", "MuGraphCost", "Work", "block_reads", "custom_floor_us",
           "kernel_cost", "kept_fraction", "mugraph_cost", "roofline_us", "smem_bytes",
           "tensor_bytes", "tile_key", "warps_for"]  # transfers: transfers.py

# per element of each elementwise op: (CUDA-core FLOPs, SFU ops), from its spec
ELEMENT_COST = {op: SPECS[op].cost for op in ELEMENTWISE | LOGIC}  # per element


# -- work: FLOPs by unit ----------------------------------------------------------------------


@dataclass
class Work:
    """FLOPs by execution unit: tensor cores (by dtype), CUDA cores, SFU."""

    tensor: dict[str, float] = field(default_factory=dict)
    cuda: float = 0.0
    sfu: float = 0.0

    @property
    def tensor_flops(self) -> float:
        return sum(self.tensor.values())

    def add_node(self, node: Node, times: float, shape=lambda n: n.shape) -> None:
        """Add ``times`` executions of ``node`` (shapes through ``shape``, e.g. padded)."""
        op = node.op
        if op is Op.MATMUL:
            a, b = (shape(s) for s in node.srcs)
            flops = 2.0 * numel(shape(node)) * a[-1] * times
            if node.dtype in ("float16", "bfloat16"):
                self.tensor[node.dtype] = self.tensor.get(node.dtype, 0.0) + flops
            else:
                self.cuda += flops
        elif op in ELEMENT_COST:
            c, s = ELEMENT_COST[op]
            self.cuda += c * numel(shape(node)) * times
            self.sfu += s * numel(shape(node)) * times
        elif op in REDUCE:
            self.cuda += (numel(shape(node.srcs[0])) + numel(shape(node)) * (op is Op.MEAN)) \
                * times

    def us(self, prof: GPUProfile, achievable: bool = True) -> float:
        """Time at the whole GPU's rate (``achievable``: tensor peak x its fraction)."""
        frac = prof.tensor_achievable_fraction if achievable else 1.0
        tc = sum(f / (prof.tensor_peak(dt) * frac) for dt, f in self.tensor.items())
        return tc + max(self.cuda / (prof.fp32_cuda_TFLOPs * 1e6), self.sfu / (prof.sfu_TOPs * 1e6))


# -- costs ------------------------------------------------------------------------------------


@dataclass
class KernelCost:
    """One kernel's predicted time and the figures behind it (``reason`` when infeasible)."""

    name: str
    kind: str
    time_us: float
    launch_us: float = 0.0
    memory_us: float = 0.0
    compute_us: float = 0.0
    dram_bytes: float = 0.0
    work: Work = field(default_factory=Work)
    blocks: int = 0
    blocks_per_sm: int = 0
    waves: int = 0
    smem_bytes: int = 0
    reason: str = ""
    l2_bytes: float = 0.0  # replicated re-reads served by L2 (custom kernels)

    @property
    def feasible(self) -> bool:
        return not self.reason

    @property
    def bound(self) -> str:
        """'infeasible', 'memory' or 'compute': what limits the kernel."""
        if self.reason:
            return "infeasible"
        return "memory" if self.memory_us >= self.compute_us else "compute"

    def __str__(self) -> str:
        if self.reason:
            return f"{self.name} ({self.kind}): INFEASIBLE: {self.reason}"
        grid = (f", {self.blocks} blocks, {self.blocks_per_sm}/SM, {self.waves} waves, "
                f"smem {self.smem_bytes / 1024:.1f} KiB") if self.kind == "custom" else ""
        return (f"{self.name} ({self.kind}): {self.time_us:.2f} us = launch {self.launch_us:.1f}"
                f" + {self.bound}-bound (memory {self.memory_us:.2f}, compute "
                f"{self.compute_us:.2f}); DRAM {self.dram_bytes / 1e6:.3f} MB"
                + (f", L2 hits {self.l2_bytes / 1e6:.3f} MB" if self.l2_bytes else "") + grid)


@dataclass
class MuGraphCost:
    """A MuGraph's predicted time: the sum of its kernels' (infinite if one is infeasible)."""

    name: str
    target: str
    kernels: list[KernelCost]

    @property
    def total_us(self) -> float:
        return sum(k.time_us for k in self.kernels)

    @property
    def feasible(self) -> bool:
        return all(k.feasible for k in self.kernels)

    @property
    def reasons(self) -> list[str]:
        return [f"{k.name}: {k.reason}" for k in self.kernels if k.reason]

    def __str__(self) -> str:
        head = f"{self.name} on {self.target}: {self.total_us:.2f} us, {len(self.kernels)} kernels"
        return "\n".join([head] + [f"  {k}" for k in self.kernels])


def tensor_bytes(shape, dtype: str) -> int:
    """Bytes a tensor of ``shape`` and ``dtype`` takes."""
    return numel(shape) * ITEMSIZE[dtype]


def op_cost(node: Node, prof: GPUProfile, name: str = "", kind: str = "predefined"
            ) -> KernelCost:
    """One kernel-level op run as its own library kernel: launch + max(memory, compute).

    The only price of a lone op: extraction (``per_op.node_cost_us``), the fusion
    planner and the one-kernel-per-op baseline all read it. Inputs, constants and
    reshapes are free; every distinct non-constant operand is read once from DRAM.
    """
    if node.op in (Op.INPUT, Op.CONST, Op.RESHAPE):
        return KernelCost(name, kind, 0.0)
    reads = {id(s): s for s in node.srcs if s.op is not Op.CONST}.values()
    moved = sum(tensor_bytes(s.shape, s.dtype) for s in reads) + tensor_bytes(node.shape,
                                                                              node.dtype)
    if node.op in GATHERS:  # the gathered rows or elements (at most the table: a repeated
        table, idx = node.srcs  # one is read once), the indices and the result; not the table
        out = tensor_bytes(node.shape, node.dtype)
        moved = min(out, tensor_bytes(table.shape, table.dtype)) + tensor_bytes(
            idx.shape, idx.dtype) + out
    work = Work()
    work.add_node(node, 1)
    mem = moved / (prof.dram_bandwidth_GBps * 1e3 * prof.dram_achievable_fraction)
    comp = work.us(prof)
    launch = prof.launch_overhead_us
    return KernelCost(name, kind, launch + max(mem, comp), launch, mem, comp, moved, work)


def _predefined_cost(k: PredefinedKernel, prof: GPUProfile) -> KernelCost:
    return op_cost(k.node, prof, k.name, k.kind)


def _tile_node(k: CustomKernel, name: str) -> Node:
    return k.loop.inputs[name] if name in k.loop.inputs else k.post.inputs[name]


def smem_bytes(k: CustomKernel) -> int:
    """Shared memory one block of ``k`` holds (see the module docstring)."""
    (_, pad_loop), (_, pad_post) = kernel_pads(k)
    total, stages = 0, stages_for(k)
    for bi in k.inputs.values():
        node, post = _tile_node(k, bi.name), k.post.inputs.get(bi.name)
        pad = pad_loop.get(id(node)) or (post is not None and pad_post.get(id(post))) or \
            tuple(pow2_ceil(d) for d in node.shape)
        total += tensor_bytes(pad, node.dtype) * (stages if bi.fmap is not None and k.forloop > 1
                                             else 1)
    total += sum(numel(pad_loop[id(k.loop.outputs[a])]) * 4 for a in k.accumulators)
    inner = k.thread_interiors()
    for n in k.post.nodes():
        if n.op not in (Op.INPUT, Op.CONST, Op.RESHAPE) and id(n) not in inner:
            total += tensor_bytes(pad_post[id(n)], n.dtype)
    return total


def kept_fraction(k: CustomKernel, mg: MuGraph) -> float:
    """The share of ``k``'s loop iterations that run: 1, or less when a causal mask lets the
    loop stop at the last tile it keeps anything of (``online.causal_skip``)."""
    causal = {c.output: c.node.arg for c in mg.kernels
              if c.kind == "predefined" and c.node.op is Op.CAUSAL}
    skip = causal_skip(k, causal) if causal else None
    if skip is None:
        return 1.0
    bi, arg = skip
    rows = range(k.grid[bi.imap[0]]) if 0 in bi.imap else range(1)
    cols = range(k.grid[bi.imap[1]]) if 1 in bi.imap else range(1)
    kept = [kept_iterations(k, bi, arg, r, c) for r in rows for c in cols]
    return sum(kept) / (len(kept) * k.forloop)


def block_reads(k: CustomKernel, mg: MuGraph, frac: float = 1.0) -> list[tuple[int, float]]:
    """(tensor bytes, replication) of each block input (``frac``: the loop's kept share)."""
    specs, blocks, out = mg.tensors, math.prod(k.grid), []
    computed = {c.output for c in mg.kernels  # causal masks: computed from positions
                if c.kind == "predefined" and c.node.op is Op.CAUSAL}
    for bi in k.inputs.values():
        if bi.tensor in computed:
            continue
        spec = specs[bi.tensor]
        tile = _tile_node(k, bi.name).shape
        whole = tensor_bytes(spec.shape, spec.dtype)
        issued = tensor_bytes(tile, spec.dtype) * blocks * (k.forloop * frac if bi.fmap is not None
                                                      else 1)
        out.append((whole, issued / whole))
    return out


def in_flight_bytes(k: CustomKernel, mg: MuGraph) -> int:
    """Bytes one block of ``k`` keeps in flight from device memory: ``stages - 1`` loop
    iterations' tiles (a 2-stage pipeline loads iteration i + 1 during iteration i; see
    ``stages_for``), or every input tile for a kernel without a loop."""
    if any(bi.fmap is not None for bi in k.inputs.values()):
        return (stages_for(k) - 1) * iteration_bytes(k)
    specs = mg.tensors
    return sum(tensor_bytes(_tile_node(k, bi.name).shape, specs[bi.tensor].dtype)
               for bi in k.inputs.values() if bi.tensor in specs)


LINE_BYTES = 128  # a global-memory transaction: a tile row shorter than this wastes the rest


def contiguous_run(tile: tuple[int, ...], shape: tuple[int, ...]) -> int:
    """Elements a tile of ``tile`` reads from a row-major tensor of ``shape`` in one run:
    its last dim, times the dims before it while the tile spans the tensor's dims after."""
    run = 1
    for t, s in zip(reversed(tile), reversed(shape)):
        run *= t
        if t != s:
            break
    return run


def run_bytes(k: CustomKernel, bi, spec) -> int:
    """Bytes block input ``bi`` of ``k`` reads from its tensor (``spec``, a ``TensorSpec``
    or None when unknown) in one contiguous run (``contiguous_run`` of its tile);
    ``LINE_BYTES`` where the tile and the tensor differ in rank (a reshaped read: taken as
    whole lines)."""
    tile = _tile_node(k, bi.name)
    if spec is None or len(spec.shape) != len(tile.shape):
        return LINE_BYTES
    return contiguous_run(tile.shape, spec.shape) * ITEMSIZE[spec.dtype]


VECTOR_BYTES = 16  # the widest load one thread issues (128 bits)


def run_alignment(k: CustomKernel, bi, spec) -> int:
    """The alignment in bytes (a power of two, at most ``VECTOR_BYTES``) of the rows block
    input ``bi`` of ``k`` loads from its tensor (``spec``, or None when unknown): a tile row
    starts at a multiple of its width and of the tensor's row, so a 172-wide fp16 chunk
    (344 B) is 8-byte aligned and loads in 8-byte vectors; ``VECTOR_BYTES`` where the tile
    and the tensor differ in rank (a reshaped read)."""
    tile = _tile_node(k, bi.name)
    if spec is None or len(spec.shape) != len(tile.shape) or not tile.shape:
        return VECTOR_BYTES
    item = ITEMSIZE[spec.dtype]
    return math.gcd(int(tile.shape[-1]) * item, int(spec.shape[-1]) * item, VECTOR_BYTES)


def load_slowdown(k: CustomKernel, mg: MuGraph, prof: GPUProfile) -> float:
    """What the shape of ``k``'s tiles costs its loads, beside their bytes: the mean over
    its block inputs (weighted by the bytes each loads) of (padded / loaded tile elements)
    ^ ``padded_load_exponent`` x (128 / bytes of its contiguous runs, at least 1) ^
    ``short_run_exponent`` x (16 / its rows' alignment in bytes) ^
    ``unaligned_load_exponent`` x (1 + ``run_overhead_bytes`` / bytes of its contiguous
    runs); 1 when all four are 0 (the datasheet profiles). Triton holds a 172-wide chunk as
    256 (1.49x the elements) and loads its 344-byte rows in 8-byte vectors (measured
    2.2-2.5x slower on the H100); a tile 16 fp16 values wide uses a quarter of each 128-byte
    line it touches, and every run is a request of its own."""
    p, q = prof.padded_load_exponent, prof.short_run_exponent
    u, o = prof.unaligned_load_exponent, prof.run_overhead_bytes
    if not p and not q and not u and not o:
        return 1.0
    specs, total, weighted = mg.tensors, 0.0, 0.0
    for bi in k.inputs.values():
        tile = _tile_node(k, bi.name)
        spec = specs.get(bi.tensor)
        size = numel(tile.shape) * ITEMSIZE[tile.dtype] * (k.forloop if bi.fmap is not None
                                                          else 1)
        pad = numel(tuple(pow2_ceil(d) for d in tile.shape)) / max(numel(tile.shape), 1)
        run = max(run_bytes(k, bi, spec), 1)
        short = LINE_BYTES / min(LINE_BYTES, run)
        unaligned = VECTOR_BYTES / run_alignment(k, bi, spec)
        factor = math.exp(min(p * math.log(pad) + q * math.log(short)  # no overflow when
                              + u * math.log(unaligned), 50.0)) * (1.0 + o / run)  # fitting
        total, weighted = total + size, weighted + size * factor
    return weighted / total if total else 1.0


def _custom_cost(k: CustomKernel, mg: MuGraph, prof: GPUProfile,
                 refused: Mapping[tuple, str] | None = None) -> KernelCost:
    frac = kept_fraction(k, mg)  # a causal mask's empty tiles are skipped
    blocks, f_range = math.prod(k.grid), k.forloop * frac
    launch = prof.launch_overhead_us
    smem = smem_bytes(k)
    reasons = [f"{stage}-stage matmul {n.describe()} contracts K={n.srcs[0].shape[-1]} < "
               f"{MIN_MMA}: tensor-core tiles need K >= {MIN_MMA} (M and N are padded with "
               "masks, K is not); split K fewer ways"
               for stage in ("loop", "post") for n in k.stage(stage).nodes()
               if n.op is Op.MATMUL and n.srcs[0].shape[-1] < MIN_MMA]
    if smem > prof.smem_per_block_KiB * 1024:
        reasons.append(f"needs {smem / 1024:.1f} KiB of shared memory per block, more than "
                       f"the {prof.smem_per_block_KiB:g} KiB {prof.name} allows (inputs with "
                       "an fmap count once per pipeline stage; accumulators at 4 bytes)")
    if why := refusal(k, refused):
        reasons.append(why)
    warps = warps_for(k)
    if warps is None:
        reasons.append(f"its tiles keep {live_registers(k):.0f} registers live per block, more "
                       f"than 16 warps hold ({REGISTER_BUDGET[16]} per thread): ptxas would "
                       "spill; smaller tiles")
    if reasons:
        return KernelCost(k.name, k.kind, math.inf, launch, blocks=blocks, smem_bytes=smem,
                          reason="; ".join(reasons))
    l2, fr = prof.l2_MiB * 2**20, prof.replicated_read_dram_fraction
    dram = hits = 0.0
    for w, rep in block_reads(k, mg, frac):
        again = w * max(rep - 1.0, 0.0)
        hit = again * (1.0 - fr) if w <= l2 else 0.0
        dram, hits = dram + w + again - hit, hits + hit
    dram += sum(tensor_bytes(s.shape, s.dtype) for s in k.output_specs().values())
    work = Work()
    (_, pad_loop), (_, pad_post) = kernel_pads(k)
    variant = k.per_iteration()
    for n in k.loop.nodes():
        work.add_node(n, blocks * (f_range if id(n) in variant else 1),
                      lambda m: pad_loop[id(m)])
    for a in k.accumulators:
        work.cuda += numel(pad_loop[id(k.loop.outputs[a])]) * blocks * f_range
    for a in k.rescaled():  # online softmax: acc * alpha every iteration
        work.cuda += numel(pad_loop[id(k.loop.outputs[a])]) * blocks * f_range
    for m in k.maxima:  # m_new = max(m, tile max); alpha = exp(m - m_new)
        size = numel(pad_loop[id(k.loop.outputs[m])]) * blocks * f_range
        work.cuda, work.sfu = work.cuda + 2 * size, work.sfu + size
    for n in k.post.nodes():
        work.add_node(n, blocks, lambda m: pad_post[id(m)])
    bps = prof.blocks_per_sm_cap(32 * warps)
    if smem:
        bps = min(bps, int(prof.smem_per_sm_KiB * 1024 // smem))
    slots = prof.sms * bps
    full, rest = divmod(blocks, slots)
    c_b = work.us(prof) * prof.sms / blocks
    bw_all = prof.dram_bandwidth_GBps * 1e3 * prof.dram_achievable_fraction

    flight = max(in_flight_bytes(k, mg), 1)  # a kernel that loads nothing waits on nothing
    slow = load_slowdown(k, mg, prof)
    # a block's iterations, one after another: each costs loop_iteration_us and waits the
    # DRAM latency its loads in flight (stages - 1 iterations ahead) do not hide
    per_wave = f_range * (prof.loop_iteration_us
                          + prof.iteration_latency_us / max(stages_for(k) - 1, 1))
    block_bw = prof.block_dram_bandwidth_GBps * 1e3  # what one block's loads pull at most
    block_l2 = prof.block_l2_bandwidth_GBps * 1e3  # and through L2, hits and misses

    def wave(n: int) -> tuple[float, float]:
        # what n blocks' SMs can keep in flight, each block at most block_l2_bandwidth_GBps
        cap = min(n, prof.sms) * min(prof.sm_dram_bandwidth_GBps * 1e3,
                                     math.ceil(n / prof.sms) * block_l2)
        # Little's law: an SM pulls at most its resident blocks' bytes in flight per latency
        per_sm = min(prof.sm_dram_bandwidth_GBps * 1e3, math.ceil(n / prof.sms) * min(
            flight / prof.dram_latency_ns * 1e3, block_bw))
        l2_bw = min(prof.l2_bandwidth_GBps * 1e3, cap)
        memory = max(n * dram / blocks / min(bw_all, min(n, prof.sms) * per_sm),
                     n * (dram + hits) / blocks / l2_bw)
        return memory * slow, math.ceil(n / prof.sms) * c_b

    mem = comp = body = 0.0
    for n, count in ((slots, full), (rest, int(rest > 0))):
        if count:
            m, c = wave(n)
            mem, comp = mem + count * m, comp + count * c
            body += count * (max(m, c) + per_wave)
    return KernelCost(k.name, k.kind, launch + body, launch, mem, comp, dram, work, blocks, bps,
                      full + int(rest > 0), smem, l2_bytes=hits)


def custom_floor_us(prof: GPUProfile, moved_bytes: float, kernels: int = 1,
                    blocks: int | None = None, flight: float | None = None) -> float:
    """A lower bound of the summed ``kernel_cost`` of ``kernels`` custom kernels that together
    read and write at least ``moved_bytes`` of device memory: a launch each, and the bytes at
    the achievable DRAM bandwidth (each wave's memory time is at least its blocks' share of
    its kernel's DRAM bytes at that rate, and ``load_slowdown`` is at least 1). For one
    kernel of ``blocks`` blocks each keeping at most ``flight`` bytes in flight
    (``in_flight_bytes``), the rate is the one ``_custom_cost``'s wave of ``blocks`` blocks
    gets at most (no wave has more, and a wave's rate grows with its blocks). Rounding
    aside: a caller comparing it with a cost leaves a margin."""
    rate = prof.dram_bandwidth_GBps * 1e3 * prof.dram_achievable_fraction
    if blocks is not None and flight is not None:
        per_sm = min(prof.sm_dram_bandwidth_GBps * 1e3, math.ceil(blocks / prof.sms) * min(
            max(flight, 1) / prof.dram_latency_ns * 1e3, prof.block_dram_bandwidth_GBps * 1e3))
        rate = min(rate, min(blocks, prof.sms) * per_sm)
    return kernels * prof.launch_overhead_us + moved_bytes / rate


def kernel_cost(kernel: Kernel, mugraph: MuGraph, profile: GPUProfile | str | Path = "h100",
                refused: Mapping[tuple, str] | None = None) -> KernelCost:
    """Predicted cost of one kernel of ``mugraph`` (``math.inf`` with a reason if infeasible;
    ``refused``: the compile check's refusals, tile or structure key -> reason)."""
    prof = GPUProfile.load(profile)
    if isinstance(kernel, PredefinedKernel):
        if kernel.node.op is Op.CAUSAL and kernel.output not in mugraph.materialized():
            return KernelCost(kernel.name, kernel.kind, 0.0)  # computed inside its readers
        return _predefined_cost(kernel, prof)
    return _custom_cost(kernel, mugraph, prof, refused)


def mugraph_cost(mugraph: MuGraph, profile: GPUProfile | str | Path = "h100") -> MuGraphCost:
    """Predicted cost of ``mugraph`` with a per-kernel breakdown (kernels run in order)."""
    prof = GPUProfile.load(profile)
    mugraph.validate()
    return MuGraphCost(mugraph.name, prof.name,
                       [kernel_cost(k, mugraph, prof) for k in mugraph.kernels])


# -- transfers and the roofline ---------------------------------------------------------------


def roofline_us(graph: Graph | MuGraph, profile: GPUProfile | str | Path = "h100",
                launch: bool = True) -> float:
    """The roofline lower bound: inputs read once, outputs written once at peak bandwidth, or
    the program's matmul FLOPs at peak if larger; plus one launch (``launch=False``: none)."""
    prof = GPUProfile.load(profile)
    ref: Graph | None = graph
    if isinstance(graph, MuGraph):
        graph.validate()
        moved = sum(tensor_bytes(n.shape, n.dtype) for n in graph.inputs.values())
        moved += sum(tensor_bytes(s.shape, s.dtype) for s in
                     {s.name: s for s in graph.outputs.values()}.values())
        try:
            ref = graph.reference()
        except MirageError:  # no source and no untiled form: bound by bytes only
            ref = None
    else:
        moved = sum(tensor_bytes(n.shape, n.dtype) for n in graph.inputs.values())
        moved += sum(tensor_bytes(n.shape, n.dtype) for n in
                     {id(n): n for n in graph.outputs.values()}.values())
    work = Work()
    for n in ref.nodes() if ref is not None else ():
        if n.op is Op.MATMUL:  # elementwise work is left out: rewrites move it (see docstring)
            work.add_node(n, 1)
    mem = moved / (prof.dram_bandwidth_GBps * 1e3)
    return (prof.launch_overhead_us if launch else 0.0) + max(mem, work.us(prof, False))
