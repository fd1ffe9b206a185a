"""Bytes each kernel moves at every memory level (device memory, L2, shared memory,
registers), and the device-memory round trips a fusion saves: ``transfers(mugraph)``.

The cost model's own prices are in ``gpucost.py``; this is the accounting the fusion
reports and tests read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir.node import Op, numel
from ..mugraph.kernels import PredefinedKernel
from ..mugraph.program import MuGraph
from .gpucost import Kernel, block_reads, kept_fraction, tensor_bytes


@dataclass
class KernelTransfers:
    """Bytes one kernel moves at each level of the memory hierarchy."""

    name: str
    device_read: float  # compulsory: each tensor element read once
    device_write: float
    l2_reread: float  # replicated tile reads beyond the first (L2 hits, or DRAM if evicted)
    shared: float
    registers: float

    @property
    def device(self) -> float:
        return self.device_read + self.device_write


@dataclass
class Transfers:
    """Bytes moved per level by each kernel, and device-memory round trips of intermediates."""

    kernels: list[KernelTransfers]
    round_trips: dict[str, float]  # intermediate tensor -> bytes written + bytes read back

    @property
    def device(self) -> float:
        return sum(k.device for k in self.kernels)

    @property
    def l2_reread(self) -> float:
        return sum(k.l2_reread for k in self.kernels)

    @property
    def shared(self) -> float:
        return sum(k.shared for k in self.kernels)

    @property
    def registers(self) -> float:
        return sum(k.registers for k in self.kernels)

    def __str__(self) -> str:
        rows = [f"{'MB':<12} {'device':>9} {'L2 reread':>9} {'shared':>9} {'registers':>9}"]
        for k in [*self.kernels, self]:
            rows.append(f"{getattr(k, 'name', 'total'):<12} {k.device / 1e6:>9.3f} "
                        f"{k.l2_reread / 1e6:>9.3f} {k.shared / 1e6:>9.3f} "
                        f"{k.registers / 1e6:>9.3f}")
        rows += [f"round trip {t}: {b / 1e6:.3f} MB" for t, b in self.round_trips.items()]
        return "\n".join(rows)


def _kernel_transfers(k: Kernel, mg: MuGraph) -> KernelTransfers:
    if isinstance(k, PredefinedKernel):
        if k.node.op is Op.RESHAPE:
            return KernelTransfers(k.name, 0, 0, 0, 0, 0)
        reads = sum(tensor_bytes(s.shape, s.dtype) for s in {s.arg: s for s in k.node.srcs
                                                         if s.op is Op.INPUT}.values())
        shared = reads if k.node.op is Op.MATMUL else 0  # GEMMs stage operand tiles
        written = tensor_bytes(k.node.shape, k.node.dtype)
        return KernelTransfers(k.name, reads, written, 0, shared, 0)
    frac = kept_fraction(k, mg)  # a causal mask's empty tiles are skipped
    blocks, f_range = math.prod(k.grid), k.forloop * frac
    loads = block_reads(k, mg, frac)
    reads, issued = sum(w for w, _ in loads), sum(w * rep for w, rep in loads)
    writes = sum(tensor_bytes(s.shape, s.dtype) for s in k.output_specs().values())
    shared = issued + sum(numel(k.loop.outputs[a].shape) * 4 * blocks * f_range
                         for a in k.accumulators)
    inner = k.thread_interiors()
    registers, variant = 0.0, k.per_iteration()
    for n in k.loop.nodes():
        if n.op not in (Op.INPUT, Op.CONST, Op.RESHAPE):
            registers += tensor_bytes(n.shape, n.dtype) * blocks * (f_range if id(n) in variant
                                                              else 1)
    for n in k.post.nodes():
        if n.op not in (Op.INPUT, Op.CONST, Op.RESHAPE):
            b = tensor_bytes(n.shape, n.dtype) * blocks
            registers, shared = (registers + b, shared) if id(n) in inner else (registers,
                                                                                shared + b)
    return KernelTransfers(k.name, reads, writes, issued - reads, shared, registers)


def transfers(mugraph: MuGraph) -> Transfers:
    """Bytes each kernel moves through device memory, shared memory and registers."""
    mugraph.validate()
    specs, outs = mugraph.tensors, set(mugraph.output_tensors.values())
    trips: dict[str, float] = {}
    for k in mugraph.kernels:
        for t in k.reads():
            if specs[t].producer != "input" and t not in outs:
                size = tensor_bytes(specs[t].shape, specs[t].dtype)
                trips[t] = trips.get(t, size) + size
    return Transfers([_kernel_transfers(k, mugraph) for k in mugraph.kernels], trips)
